"""The dlm_job_* metrics (issue 28): the run ledger of the keys under --job-metrics, from
the leader only, with a bounded label set."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.core import Metric

from dlm.node.runtime.metrics import job_metrics
from tests.unit.node.test_locks_ledger import EXEC_META, at_version_4


def samples(metrics: list[Metric]) -> dict[tuple[str, str, str], float]:
    """(name, key, outcome) -> value ("" where the sample has no such label)."""
    return {
        (s.name, s.labels.get("key", ""), s.labels.get("outcome", "")): s.value
        for family in metrics
        for s in family.samples
    }


def test_the_leader_exports_the_keys_under_the_prefix_and_a_follower_nothing() -> None:
    cluster = at_version_4()
    client = cluster.connect("n1")
    for lease, key in (("A", "jobs/backup"), ("B", "other/x")):
        assert client.call("open_lease", lease=lease, ttl_ms=5_000)["t"] == "ok"
        assert client.call("acquire", lease=lease, key=key, meta=EXEC_META)["t"] == "ok"
    assert client.call("open_lease", lease="C", ttl_ms=5_000)["t"] == "ok"
    assert client.call("acquire", lease="C", key="jobs/backup", meta=EXEC_META)["t"] == "error"
    assert client.call("close_lease", lease="A", outcome="finished", exit_code=0)["t"] == "ok"
    assert client.call("close_lease", lease="B", outcome="finished", exit_code=0)["t"] == "ok"
    leader: Any = SimpleNamespace(
        machine=cluster["n1"].machine, config=SimpleNamespace(job_metrics="jobs/")
    )
    got = samples(list(job_metrics(leader)))
    key = "jobs/backup"
    assert got[("dlm_job_runs_total", key, "finished")] == 1.0
    assert got[("dlm_job_skips_total", key, "")] == 1.0
    assert got[("dlm_job_last_success_timestamp_seconds", key, "")] > 0
    assert ("dlm_job_duration_seconds", key, "") in got
    assert not any(labelled == "other/x" for _, labelled, _ in got)
    cluster.run_until(
        lambda: (
            cluster["n2"].machine.locks.applied_index >= cluster["n1"].machine.locks.applied_index
        ),
        5.0,
        "n2 caught up",
    )
    follower: Any = SimpleNamespace(
        machine=cluster["n2"].machine, config=SimpleNamespace(job_metrics="jobs/")
    )
    assert samples(list(job_metrics(follower))) == {}
    off: Any = SimpleNamespace(
        machine=cluster["n1"].machine, config=SimpleNamespace(job_metrics=None)
    )
    assert samples(list(job_metrics(off))) == {}
