"""Data directories of a new incarnation on a real disk (dlm/node/runtime/incarnation.py):
a restored member's log starts above the backup's index plus the bump, its node.json names
the incarnation, and a recovered survivor keeps every entry its log held."""

from __future__ import annotations

import json
import os
from pathlib import Path

import cbor2
import pytest

from dlm.node import locks
from dlm.node.incarnation import IncarnationError, lock_machine_of
from dlm.node.runtime.config.node_config import NodeConfig, write_meta
from dlm.node.runtime.incarnation import recover_member, restore_member
from dlm.node.snapshots import NODE_IMAGE_FORMAT_V2
from dlm.records import ConfState, Entry, HardState
from dlm.store.backup import Backup, write_backup
from dlm.store.disk import DiskStorage

PEERS = "n1=127.0.0.1:17701,n2=127.0.0.1:17702,n3=127.0.0.1:17703"


def lock_image(*ttls: int) -> tuple[bytes, int]:
    machine = locks.LockStateMachine()
    index = 0
    commands: list[locks.Command] = [locks.ClusterVersionCommand(3, 1)]
    for n, ttl in enumerate(ttls):
        opening, taking = locks.Origin("c", 2 * n + 1), locks.Origin("c", 2 * n + 2)
        commands.append(locks.OpenLeaseCommand(f"l{n}", ttl, opening, 2))
        commands.append(locks.AcquireCommand(f"l{n}", f"k{n}", False, 1, {}, taking, 3))
    for cmd in commands:
        index += 1
        machine.apply(index, locks.encode_command(cmd))
    image = {"format": NODE_IMAGE_FORMAT_V2, "locks": machine.snapshot(), "members": {}}
    return bytes(cbor2.dumps({**image, "removed": []}, canonical=True)), index


def backup_file(tmp_path: Path) -> tuple[Path, int]:
    image, index = lock_image(15_000)
    path = tmp_path / "b.dlmbackup"
    write_backup(str(path), Backup("prod", index, 4, 0, ("n1", "n2", "n3"), (), image))
    return path, index


def config(tmp_path: Path, node: str, cluster: str = "prod") -> NodeConfig:
    return NodeConfig.from_flags(
        node_id=node, listen=None, peers=PEERS, data=str(tmp_path / node), cluster=cluster
    )


def test_a_restored_member_starts_its_log_above_the_backup_plus_the_bump(tmp_path: Path) -> None:
    path, index = backup_file(tmp_path)
    built = restore_member(str(path), config(tmp_path, "n2"), bump=1_000, quarantine_ms=None)
    assert built.incarnation.index == index + 1_000
    with DiskStorage.open(tmp_path / "n2") as storage:
        assert storage.first_index() == index + 1_001
        hard_state, conf = storage.initial_state()
        assert hard_state.term == 4 and conf.voters == ("n1", "n2", "n3")
        snap = storage.snapshot()
        assert snap is not None
        machine = lock_machine_of(snap.data)
    assert machine.quarantine == locks.Quarantine(30_000, index + 1_000)
    assert machine.holds("l0", "k0")
    meta = json.loads((tmp_path / "n2" / "node.json").read_text())
    assert (meta["format"], meta["incarnation"], meta["cluster"]) == (4, index + 1_000, "prod")
    assert not (tmp_path / "n2.building").exists()


def test_restore_refuses_a_data_directory_that_is_not_empty(tmp_path: Path) -> None:
    path, _ = backup_file(tmp_path)
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "something").write_text("x")
    with pytest.raises(IncarnationError, match="not empty"):
        restore_member(str(path), config(tmp_path, "n1"), bump=1, quarantine_ms=None)


def survivor(tmp_path: Path) -> tuple[Path, int]:
    """n3's data directory after the others were lost: a log of opens and grants, only part
    of it known to be committed."""
    directory = tmp_path / "n3"
    cfg = config(tmp_path, "n3", cluster="dlm")
    commands: list[locks.Command] = [
        locks.ClusterVersionCommand(3, 1),
        locks.OpenLeaseCommand("a", 60_000, locks.Origin("c", 1), 2),
        locks.AcquireCommand("a", "k", False, 1, {}, locks.Origin("c", 2), 3),
        locks.OpenLeaseCommand("b", 5_000, locks.Origin("c", 3), 4),
        locks.AcquireCommand("b", "j", False, 1, {}, locks.Origin("c", 4), 5),
    ]
    with DiskStorage.open(directory, bootstrap_conf=ConfState(("n1", "n2", "n3"))) as storage:
        entries = [Entry(i + 1, 2, locks.encode_command(cmd)) for i, cmd in enumerate(commands)]
        storage.append(entries)
        storage.set_hard_state(HardState(3, "n1", 3))  # entries 4 and 5 not known committed
    write_meta(cfg)
    return directory, len(commands)


def test_recover_keeps_every_entry_the_survivor_held_and_keeps_the_old_directory(
    tmp_path: Path,
) -> None:
    directory, last = survivor(tmp_path)
    built = recover_member(str(directory), bump=100, quarantine_ms=None)
    assert built.incarnation.index == last + 100 and built.term == 3
    assert built.members == ("n3",)
    assert Path(str(directory) + ".before-recover", "node.json").exists()
    with DiskStorage.open(directory) as storage:
        assert storage.first_index() == last + 101
        _, conf = storage.initial_state()
        assert conf.voters == ("n3",)
        snap = storage.snapshot()
        assert snap is not None
        machine = lock_machine_of(snap.data)
    assert machine.holds("a", "k") and machine.holds("b", "j")  # uncommitted too
    assert machine.quarantine == locks.Quarantine(60_000, last + 100)
    meta = json.loads((directory / "node.json").read_text())
    assert meta["peers"] == {"n3": "127.0.0.1:17703"} and meta["incarnation"] == last + 100


def test_a_second_recovery_waits_until_the_first_ones_copy_is_moved_away(tmp_path: Path) -> None:
    directory, _ = survivor(tmp_path)
    recover_member(str(directory), bump=1, quarantine_ms=0)
    with pytest.raises(IncarnationError, match="before-recover exists"):
        recover_member(str(directory), bump=1, quarantine_ms=0)


def test_recover_refuses_a_directory_that_is_not_a_data_directory(tmp_path: Path) -> None:
    with pytest.raises(IncarnationError, match="not a data directory"):
        recover_member(str(tmp_path), bump=1, quarantine_ms=None)


def partitioned_backup(tmp_path: Path, partitions: int) -> tuple[Path, dict[str, int], int]:
    """A backup of a cluster of ``partitions`` partitions, each holding its own keys with
    tokens of its own log; the keys' tokens, and the highest index of any partition."""
    from dlm.partitioning import partition_of
    from dlm.store.backup import write_backup_set

    parts = []
    tokens: dict[str, int] = {}
    top = 0
    for p in range(partitions):
        machine = locks.LockStateMachine()
        index = 0
        commands: list[locks.Command] = [locks.ClusterVersionCommand(4, 1)]
        commands.append(locks.OpenLeaseCommand("shared", 20_000, locks.Origin("c", 1), 2))
        mine = [k for k in (f"key-{n}" for n in range(40)) if partition_of(k, partitions) == p]
        for n, key in enumerate(mine):
            commands.append(
                locks.AcquireCommand("shared", key, False, 1, {}, locks.Origin("c", n + 2), 3)
            )
        # Partitions' logs have different lengths: their indexes differ.
        commands += [locks.ClusterVersionCommand(4, 4)] * (7 * p)
        for cmd in commands:
            index += 1
            outcome = machine.apply(index, locks.encode_command(cmd))
            if isinstance(cmd, locks.AcquireCommand):
                tokens[cmd.key] = outcome.index
        image = {"format": NODE_IMAGE_FORMAT_V2, "locks": machine.snapshot(), "members": {}}
        data = bytes(cbor2.dumps({**image, "removed": []}, canonical=True))
        parts.append(Backup("prod", index, 4, 0, ("n1", "n2", "n3"), (), data, "n1"))
        top = max(top, index)
    path = tmp_path / "p.dlmbackup"
    write_backup_set(str(path), parts, 0)
    return path, tokens, top


@pytest.mark.parametrize(("before", "after"), [(4, 2), (4, 1), (1, 3), (3, 3)])
def test_a_restore_with_another_partition_count_rehashes_every_key(
    tmp_path: Path, before: int, after: int
) -> None:
    from dlm.node.runtime.config.node_config import recorded_partitions
    from dlm.node.runtime.incarnation import restore_partitioned
    from dlm.partitioning import partition_of

    path, tokens, top = partitioned_backup(tmp_path, before)
    built = restore_partitioned(
        str(path), config(tmp_path, "n1"), partitions=after, bump=1_000, quarantine_ms=None
    )
    assert built.incarnation.index == top + 1_000
    assert (built.partitions, built.from_partitions) == (after, before)
    assert built.incarnation.counts.locks == len(tokens)
    data = tmp_path / "n1"
    assert recorded_partitions(data) == after
    dirs = [data] if after == 1 else [data / f"p{p}" for p in range(after)]
    found: dict[str, int] = {}
    for p, directory in enumerate(dirs):
        with DiskStorage.open(directory) as storage:
            # Every partition's log starts above every old partition's highest index.
            assert storage.first_index() == top + 1_001
            snap = storage.snapshot()
            assert snap is not None
            machine = lock_machine_of(snap.data)
        for view in machine.list_locks()[0]:
            assert partition_of(view.key, after) == p
            found[view.key] = view.holders[0].token
        meta = json.loads((directory / "node.json").read_text())
        assert meta["incarnation"] == top + 1_000
    assert found == tokens
    assert not (tmp_path / "n1.building").exists()


def test_dlm_node_restore_partitions_reports_and_refuses_a_bad_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlm.cli.main import run

    path, tokens, top = partitioned_backup(tmp_path, 4)
    common = ["node", "restore", str(path), "--id", "n1", "--peers", PEERS]
    data = str(tmp_path / "n1")
    assert run([*common, "--data", data, "--partitions", "0"]) == 2
    assert "--partitions: the partition count must be 1 to 64, not '0'" in capsys.readouterr().err
    assert run([*common, "--data", data, "--partitions", "two"]) == 2
    capsys.readouterr()
    assert run([*common, "--data", data, "--partitions", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["restored"]
    assert (report["partitions"], report["from_partitions"]) == (2, 4)
    assert report["locks"] == len(tokens) and report["first_index"] == top + 2**32 + 1
    # Without --partitions: the backup's count.
    assert run([*common, "--data", str(tmp_path / "n2")]) == 0
    out = capsys.readouterr().out
    assert "4 partition(s) from the backup's 4" in out
    assert sorted(os.listdir(tmp_path / "n2")) == ["p0", "p1", "p2", "p3", "partitions.json"]
