"""`make run`'s choices, without starting anything: which members it starts, where, and which
log lines it keeps off its console."""

from __future__ import annotations

import json
from pathlib import Path

from dlm.devcluster import DevCluster, Member, is_replayed


def write(data: Path, directory: str, **meta: object) -> None:
    (data / directory).mkdir(parents=True)
    (data / directory / "node.json").write_text(json.dumps(meta), encoding="utf-8")


def test_a_fresh_dev_cluster_starts_n1_to_n3_on_the_base_ports(tmp_path: Path) -> None:
    cluster = DevCluster(7700, tmp_path / "devcluster")
    assert cluster.members == [Member(f"n{i}", 7700 + i, first_start=True) for i in (1, 2, 3)]
    assert cluster.unusable == {}


def test_after_a_replacement_it_starts_the_members_the_data_holds(tmp_path: Path) -> None:
    first = {f"n{i}": f"127.0.0.1:{7700 + i}" for i in (1, 2, 3)}
    for node in first:
        write(tmp_path, node, format=2, node=node, cluster="devcluster", peers=first)
    # n4 joined (format 3 records where it listens); n5 never finished joining; a member of
    # another cluster, and a directory that is no member's, are left alone.
    write(tmp_path, "n4", format=3, node="n4", cluster="devcluster", peers=first,
          listen="127.0.0.1:7714")  # fmt: skip
    (tmp_path / "n5").mkdir()
    write(tmp_path, "n6", format=3, node="n6", cluster="other", listen="127.0.0.1:7716")
    (tmp_path / "notes").mkdir()
    cluster = DevCluster(7700, tmp_path)
    assert [(m.node, m.port, m.first_start) for m in cluster.members] == [
        ("n1", 7701, False),
        ("n2", 7702, False),
        ("n3", 7703, False),
        ("n4", 7714, False),
    ]
    assert list(cluster.unusable) == ["n5"] and "never finished joining" in cluster.unusable["n5"]
    assert "--id n6 " in cluster.join_command()  # the next free id


def test_replayed_events_are_recognised_as_json_and_as_text() -> None:
    assert is_replayed(b'{"event":"lock_granted","key":"k","index":2,"replayed":true}\n')
    assert is_replayed(b"2026-01-01T00:00:00.000+00:00 INFO  n1 lock_granted key=k replayed=true\n")
    assert not is_replayed(b'{"event":"lock_granted","key":"k","index":2}\n')
    # Metadata that says so is not the marker: the field comes last, and unquoted.
    assert not is_replayed(b'{"event":"lock_granted","owner":{"x":"replayed=true"}}\n')
