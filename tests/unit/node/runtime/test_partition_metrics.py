"""partition_metrics.py: every partition's samples labelled with it, each family once."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dlm.node.runtime.partition_metrics import labelled, merge

ONE = b"""# HELP dlm_raft_term This member's Raft term.
# TYPE dlm_raft_term gauge
dlm_raft_term 3.0
# HELP dlm_raft_role 1 for this member's current Raft role, 0 for the others.
# TYPE dlm_raft_role gauge
dlm_raft_role{role="leader"} 1.0
dlm_raft_role{role="follower"} 0.0
"""


def test_a_label_goes_first_whether_a_sample_has_labels_or_not() -> None:
    assert labelled("dlm_raft_term 3.0", 2) == 'dlm_raft_term{partition="2"} 3.0'
    assert labelled('x{role="a b"} 1.0', 1) == 'x{partition="1",role="a b"} 1.0'
    assert labelled("x{} 1.0", 0) == 'x{partition="0"} 1.0'


def test_merged_families_parse_and_keep_every_partitions_samples() -> None:
    text = "\n".join(merge([(0, ONE), (1, ONE.replace(b"3.0", b"5.0"))])) + "\n"
    families = {f.name: f for f in text_string_to_metric_families(text)}
    terms = {s.labels["partition"]: s.value for s in families["dlm_raft_term"].samples}
    assert terms == {"0": 3.0, "1": 5.0}
    roles = families["dlm_raft_role"].samples
    assert len(roles) == 4 and {s.labels["partition"] for s in roles} == {"0", "1"}
    assert text.count("# TYPE dlm_raft_role gauge") == 1
