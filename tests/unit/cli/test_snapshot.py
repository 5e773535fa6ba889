"""`dlm snapshot save` and `dlm snapshot inspect` in-process: what a user sees, and exit codes."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from dlm.cli.main import run
from dlm.client.errors import ClusterUnavailable
from dlm.node import locks
from dlm.node.locks.commands import AcquireCommand, OpenLeaseCommand, Origin, encode_command
from dlm.store.backup import MAGIC, Backup, encode_backup, write_backup
from dlm.wire import SnapshotHeader
from tests.unit.cli.conftest import FakeClient

Capture = pytest.CaptureFixture[str]


def _image() -> tuple[bytes, int]:
    machine = locks.LockStateMachine()
    machine.apply(1, encode_command(OpenLeaseCommand("L1", 45_000, Origin("c", 1), 5)))
    machine.apply(2, encode_command(OpenLeaseCommand("L2", 90_000, Origin("c", 2), 5)))
    machine.apply(3, encode_command(AcquireCommand("L1", "a", False, 1, {}, Origin("c", 3), 6)))
    machine.apply(4, encode_command(AcquireCommand("L2", "a", True, 1, {}, Origin("c", 4), 7)))
    machine.apply(5, encode_command(AcquireCommand("L2", "b", False, 1, {}, Origin("c", 5), 8)))
    return machine.snapshot(), machine.applied_index


def _backup() -> Backup:
    image, index = _image()
    return Backup("prod", index, 3, 1_790_000_000_000, ("n1", "n2", "n3"), (), image, "n2")


def _one(out: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def test_inspect_says_what_an_intact_backup_holds(capsys: Capture, tmp_path: Path) -> None:
    path = str(tmp_path / "b.dlm")
    write_backup(path, _backup())
    assert run(["snapshot", "inspect", path, "--json"]) == 0
    report = _one(capsys.readouterr().out)
    assert report == {
        "file": path,
        "intact": True,
        "format": 1,
        "bytes": os.path.getsize(path),
        "cluster": "prod",
        "index": 5,
        "term": 3,
        "taken_at": "2026-09-21T14:13:20.000+00:00",
        "taken_at_ms": 1_790_000_000_000,
        "leader": "n2",
        "voters": ["n1", "n2", "n3"],
        "learners": [],
        "addresses": {},
        "cluster_version": 1,
        "leases": 2,
        "locks": 2,
        "waiters": 1,
        "highest_token": 5,
        "longest_ttl_ms": 90_000,
        "longest_ttl_source": "leases",
    }
    assert run(["snapshot", "inspect", path]) == 0
    text = capsys.readouterr().out
    assert f"backup {path}: intact" in text
    assert "2 held, 1 waiting" in text and "highest token  5" in text
    assert "longest TTL    90s (the longest TTL among the leases in the backup" in text


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda data: data[:-10], "truncated"),
        (lambda data: data[:-40] + bytes([data[-40] ^ 1]) + data[-39:], "checksum mismatch"),
        (
            lambda data: data[: len(MAGIC)] + struct.pack("<H", 9) + data[len(MAGIC) + 2 :],
            "unknown backup format 9",
        ),
        (lambda data: b"#!/bin/sh\necho not a backup\n", "not a dlm backup file"),
        (lambda data: b"", "truncated"),
    ],
)
def test_inspect_exits_1_naming_the_file_for_anything_not_intact(
    capsys: Capture, tmp_path: Path, damage: Any, says: str
) -> None:
    path = str(tmp_path / "bad.dlm")
    Path(path).write_bytes(damage(encode_backup(_backup())))
    assert run(["snapshot", "inspect", path]) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"dlm: not an intact backup: {path}: {says}")
    assert captured.out == "" and "Traceback" not in captured.err
    assert run(["snapshot", "inspect", path, "--json"]) == 1
    error = _one(capsys.readouterr().out)["error"]
    assert error["code"] == "BACKUP_DAMAGED" and error["intact"] is False
    assert error["file"] == path and says in error["message"]


def test_inspect_of_a_missing_file_exits_1(capsys: Capture, tmp_path: Path) -> None:
    assert run(["snapshot", "inspect", str(tmp_path / "nope")]) == 1
    assert "nope: no such file" in capsys.readouterr().err


class _Saver(FakeClient):
    def save_snapshot(self, *, image_timeout: float = 600.0) -> tuple[SnapshotHeader, bytes]:
        self._call("save_snapshot")
        backup = _backup()
        header = SnapshotHeader(
            cluster=backup.cluster,
            index=backup.index,
            term=backup.term,
            voters=list(backup.voters),
            learners=[],
            leader=backup.leader,
            taken_at_ms=backup.taken_at_ms,
        )
        return header, backup.image


@pytest.fixture
def saver(monkeypatch: pytest.MonkeyPatch, fake_cluster: Any) -> None:
    from dlm.cli.settings import Settings

    def connect(self: Settings) -> FakeClient:
        return _Saver(list(self.members), self.timeout, self.dial_timeout)

    monkeypatch.setattr(Settings, "connect", connect)


@pytest.mark.usefixtures("saver")
def test_save_writes_the_file_whole(capsys: Capture, tmp_path: Path) -> None:
    path = tmp_path / "b.dlm"
    assert run(["snapshot", "save", str(path), "--json"]) == 0
    report = _one(capsys.readouterr().out)
    assert report["index"] == 5 and report["bytes"] == path.stat().st_size
    assert path.read_bytes() == encode_backup(_backup())
    assert sorted(os.listdir(tmp_path)) == ["b.dlm"]
    assert run(["snapshot", "save", str(path)]) == 0
    assert "saved a backup of cluster prod at index 5 (term 3, from n2)" in capsys.readouterr().out


@pytest.mark.usefixtures("saver")
def test_save_refuses_a_path_it_cannot_write_before_asking_the_cluster(
    capsys: Capture, tmp_path: Path
) -> None:
    assert run(["snapshot", "save", str(tmp_path / "no" / "b.dlm")]) == 2
    err = capsys.readouterr().err
    assert "directory" in err and "does not exist" in err
    assert run(["snapshot", "save", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert not any(c.calls for c in FakeClient.instances)


def test_save_without_a_leader_exits_69(
    capsys: Capture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_cluster: Any
) -> None:
    from dlm.cli.settings import Settings

    class NoLeader(FakeClient):
        def save_snapshot(self, *, image_timeout: float = 600.0) -> Any:
            raise ClusterUnavailable("no leader within 10s")

    monkeypatch.setattr(
        Settings, "connect", lambda self: NoLeader(list(self.members), self.timeout)
    )
    path = tmp_path / "b.dlm"
    assert run(["snapshot", "save", str(path)]) == 69
    assert "no leader" in capsys.readouterr().err
    assert not path.exists()


def test_inspect_of_a_partitioned_backup_sums_its_partitions(
    capsys: Capture, tmp_path: Path
) -> None:
    from dlm.store.backup import write_backup_set

    image, index = _image()
    parts = [
        Backup("prod", index, 3 + p, 1_790_000_000_000 + p, ("n1", "n2"), (), image, f"n{p + 1}")
        for p in range(2)
    ]
    path = str(tmp_path / "b.dlm")
    write_backup_set(path, parts, 1_790_000_000_000)
    assert run(["snapshot", "inspect", path, "--json"]) == 0
    report = _one(capsys.readouterr().out)
    assert report["format"] == 2 and report["partitions"] == 2
    assert (report["index"], report["term"]) == (5, 4)
    assert (report["leases"], report["locks"], report["waiters"]) == (4, 4, 2)
    assert [(row["partition"], row["leader"], row["locks"]) for row in report["parts"]] == [
        (0, "n1", 2),
        (1, "n2", 2),
    ]
    assert run(["snapshot", "inspect", path]) == 0
    text = capsys.readouterr().out
    assert "intact (format 2" in text and "partitions     2" in text
    assert "4 held, 2 waiting" in text
    # A damaged partition is named.
    broken = Backup("prod", index + 1, 3, 0, ("n1",), (), image)
    write_backup_set(path, [parts[0], broken], 1)
    assert run(["snapshot", "inspect", path]) == 1
    assert "partition 1: corrupt: its image is at index 5" in capsys.readouterr().err


class _PartitionedSaver(_Saver):
    partitions = 3
    failing: int | None = None

    def save_snapshot(
        self, *, image_timeout: float = 600.0, partition: int = 0
    ) -> tuple[SnapshotHeader, bytes]:
        if partition == self.failing:
            raise ClusterUnavailable("no leader within 10s")
        backup = _backup()
        header = SnapshotHeader(
            cluster=backup.cluster,
            index=backup.index + partition,
            term=backup.term,
            voters=list(backup.voters),
            learners=[],
            leader=backup.leader,
            taken_at_ms=backup.taken_at_ms,
        )
        return header, backup.image


def test_save_of_a_partitioned_cluster_takes_every_partition(
    capsys: Capture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_cluster: Any
) -> None:
    from dlm.cli.settings import Settings
    from dlm.store.backup import read_backup_set

    monkeypatch.setattr(
        Settings, "connect", lambda self: _PartitionedSaver(list(self.members), self.timeout)
    )
    path = tmp_path / "b.dlm"
    assert run(["snapshot", "save", str(path), "--json"]) == 0
    report = _one(capsys.readouterr().out)
    assert report["partitions"] == 3 and report["index"] == 7
    assert [p["index"] for p in report["parts"]] == [5, 6, 7]
    saved = read_backup_set(str(path))
    assert saved.partitions == 3 and [p.index for p in saved.parts] == [5, 6, 7]
    assert report["bytes"] == path.stat().st_size
    # One partition without a leader: nothing is written, and the line names it.
    _PartitionedSaver.failing = 2
    other = tmp_path / "c.dlm"
    try:
        assert run(["snapshot", "save", str(other)]) == 69
    finally:
        _PartitionedSaver.failing = None
    assert "partition 2: no leader" in capsys.readouterr().err
    assert not other.exists()
