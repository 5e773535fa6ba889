"""The run ledger (dlm/node/locks/ledger.py) as the lock machine drives it, and through the
whole node machine: runs start with the grant, end with the report on the close (or the
finishing update), end as ``supervisor_gone`` at expiry, count skips, stay bounded, survive
snapshot images (format 4, and format 3 still opens) and are gated on cluster version 4."""

from __future__ import annotations

import cbor2
import pytest

from dlm.node.locks import (
    AcquireCommand,
    CloseLeaseCommand,
    ClusterVersionCommand,
    ExpireCommand,
    LockStateMachine,
    OpenLeaseCommand,
    Origin,
    RunLedger,
    RunReport,
    UpdateLeaseCommand,
    decode_command,
    encode_command,
)
from dlm.node.locks.ledger import SUPERVISOR_GONE
from dlm.node.snapshots import (
    NODE_IMAGE_FORMAT,
    NODE_IMAGE_FORMAT_V3,
    identities_layout,
    image,
    restore_image,
)
from tests.unit.node.machine_driver import Cluster

EXEC_META = {"host": "h1", "user": "u", "pid": "1", "cmd": "backup.sh --full"}


class Log:
    """A lock machine fed commands one index at a time, as the log would."""

    def __init__(self, version: int = 4) -> None:
        self.machine = LockStateMachine()
        self.index = 0
        self.seq = 0
        self.apply(ClusterVersionCommand(version, 0))

    def apply(self, cmd: object) -> object:
        self.index += 1
        # Through the bytes, as a follower applies it.
        data = encode_command(cmd)  # type: ignore[arg-type]
        return self.machine.apply(self.index, data).result

    def origin(self) -> Origin:
        self.seq += 1
        return Origin("c1", self.seq)

    def open(self, lease: str, at_ms: int = 1000) -> None:
        self.apply(OpenLeaseCommand(lease, 10_000, self.origin(), at_ms))

    def acquire(self, lease: str, key: str, at_ms: int, meta: dict[str, str] | None = None) -> int:
        self.apply(AcquireCommand(lease, key, False, 1, meta or EXEC_META, self.origin(), at_ms))
        return self.index

    def close(self, lease: str, at_ms: int, report: RunReport | None) -> None:
        self.apply(CloseLeaseCommand(lease, self.origin(), at_ms, report=report))


def test_a_run_starts_with_its_grant_and_ends_with_the_report_on_the_close() -> None:
    log = Log()
    log.open("L1")
    token = log.acquire("L1", "job", 5_000)
    log.open("L2")
    log.acquire("L2", "job", 5_100)  # held: a skip
    log.open("L3")
    log.acquire("L3", "job", 5_200, {"host": "h3"})  # not an exec acquire: no skip
    log.close("L1", 9_000, RunReport("finished", 0))
    [run] = log.machine.ledger.runs_of("job")
    assert (run.token, run.host, run.user, run.command) == (token, "h1", "u", "backup.sh --full")
    assert (run.start_ms, run.end_ms, run.exit_code, run.outcome, run.skips) == (
        5_000,
        9_000,
        0,
        "finished",
        1,
    )
    [(key, totals)] = log.machine.ledger.totals("")
    assert key == "job" and totals.last_success_ms == 9_000 and totals.skips == 1


def test_a_grant_whose_lease_expires_unreported_ends_as_supervisor_gone() -> None:
    log = Log()
    log.open("L1")
    log.acquire("L1", "job", 5_000)
    incarnation = log.machine.lease_terms("L1")
    assert incarnation is not None
    log.apply(ExpireCommand("L1", incarnation.incarnation, 40_000))
    [run] = log.machine.ledger.runs_of("job")
    assert (run.outcome, run.end_ms, run.exit_code) == (SUPERVISOR_GONE, 40_000, None)


def test_a_min_hold_update_ends_the_run_and_the_expiry_after_changes_nothing() -> None:
    log = Log()
    log.open("L1")
    log.acquire("L1", "job", 5_000)
    log.apply(
        UpdateLeaseCommand(
            "L1", 3_000, True, log.origin(), 6_000, report=RunReport("finished", None, 9)
        )
    )
    terms = log.machine.lease_terms("L1")
    assert terms is not None
    log.apply(ExpireCommand("L1", terms.incarnation, 9_000))
    [run] = log.machine.ledger.runs_of("job")
    assert (run.outcome, run.end_ms, run.signal) == ("finished", 6_000, 9)


def test_before_version_4_nothing_is_recorded_and_the_report_is_refused_by_no_one() -> None:
    log = Log(version=3)
    log.open("L1")
    log.acquire("L1", "job", 5_000)
    log.close("L1", 9_000, RunReport("finished", 0))
    assert log.machine.ledger.runs_of("job") == []


def test_retention_keeps_the_newest_runs_per_key_and_a_bounded_number_of_keys() -> None:
    log = Log()
    ledger = log.machine.ledger
    ledger.runs_per_key = 3
    ledger.max_keys = 2
    for i in range(5):
        log.open(f"L{i}")
        log.acquire(f"L{i}", "job", 1_000 * i)
        log.close(f"L{i}", 1_000 * i + 10, RunReport("finished", i))
    assert [r.exit_code for r in ledger.runs_of("job")] == [4, 3, 2]
    for key in ("a", "b"):
        log.open(f"M{key}")
        log.acquire(f"M{key}", key, 10_000)
    assert len(ledger) == 2 and ledger.runs_of("job") == []  # the oldest key went first


def test_runs_older_than_the_age_go_when_the_key_runs_again() -> None:
    log = Log()
    ledger = log.machine.ledger
    ledger.max_age_ms = 60_000
    log.open("L1")
    log.acquire("L1", "job", 1_000)
    log.close("L1", 2_000, RunReport("finished", 0))
    log.open("L2")
    log.acquire("L2", "job", 100_000)
    assert [r.start_ms for r in ledger.runs_of("job")] == [100_000]


def test_the_ledger_image_round_trips_and_refuses_garbage() -> None:
    log = Log()
    log.open("L1")
    log.acquire("L1", "job", 5_000)
    log.open("L2")
    log.acquire("L2", "job", 5_100)
    rows = log.machine.ledger.image()
    again = RunLedger.restore(cbor2.loads(cbor2.dumps(rows)))
    assert again.image() == rows
    # The open run is still open after the restore: its close ends it.
    log.machine.ledger = again
    log.close("L1", 7_000, RunReport("killed"))
    assert again.runs_of("job")[0].outcome == "killed"
    for bad in ([["job", [[1]], [{}, 0, None, None]]], "x", [["job", [], [1, 2]]]):
        with pytest.raises(ValueError):
            RunLedger.restore(bad)


def test_close4_and_update4_round_trip_and_a_bad_report_is_not_a_command() -> None:
    close = CloseLeaseCommand("L", Origin("c", 2), 5, report=RunReport("finished", 1))
    assert decode_command(encode_command(close)) == close
    update = UpdateLeaseCommand("L", 9, True, Origin("c", 3), 5, "ci", RunReport("lock_lost"))
    assert decode_command(encode_command(update)) == update
    with pytest.raises(ValueError):
        decode_command(cbor2.dumps(["close4", "L", "c", 2, 0, 5, "", ["won", None, None]]))


def at_version_4() -> Cluster:
    cluster = Cluster(3, max_version=4, peer_version=4)
    cluster.elect("n1")
    leader = cluster["n1"]
    cluster.run_until(lambda: leader.machine.locks.version == 4, 5.0, "cluster version 4")
    return cluster


def test_through_the_node_a_run_is_recorded_read_back_and_kept_by_the_snapshot_image() -> None:
    cluster = at_version_4()
    client = cluster.connect("n1")
    assert client.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"
    assert client.call("acquire", lease="A", key="job", meta=EXEC_META)["t"] == "ok"
    assert client.call("open_lease", lease="B", ttl_ms=5_000)["t"] == "ok"
    assert client.call("acquire", lease="B", key="job", meta=EXEC_META)["code"] == "LOCKED"
    closed = client.call("close_lease", lease="A", outcome="finished", exit_code=2)
    assert closed["t"] == "ok"
    answer = client.call("runs", key="job")
    [run] = answer["runs"]
    assert (run["exit_code"], run["outcome"], run["skips"], run["host"]) == (
        2,
        "finished",
        1,
        "h1",
    )
    assert client.call("runs")["runs"][0]["key"] == "job"
    leader = cluster["n1"].machine
    data = image(leader.locks, leader.raft, leader.membership)
    assert cbor2.loads(data)["format"] == NODE_IMAGE_FORMAT == 4
    restored = restore_image(data, type(leader.locks), leader.membership)
    assert restored.ledger.image() == leader.locks.ledger.image()
    # A format-3 image (cluster version 3) still opens, with an empty ledger.
    old = cbor2.loads(data)
    del old["ledger"], old["identity_removals"]
    old.update(identities_layout(leader.locks.identities, 3))
    assert old["format"] == NODE_IMAGE_FORMAT_V3
    back = restore_image(cbor2.dumps(old), type(leader.locks), leader.membership)
    assert len(back.ledger) == 0 and back.identities.image() == leader.locks.identities.image()


def test_a_restore_or_recovery_keeps_the_ledger() -> None:
    """`dlm node restore`/`recover` (dlm/node/incarnation.py): the backup's ledger goes into
    the new incarnation's image, which members open with its runs."""
    from dlm.node.incarnation import lock_machine_of, new_incarnation

    cluster = at_version_4()
    client = cluster.connect("n1")
    assert client.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"
    assert client.call("acquire", lease="A", key="job", meta=EXEC_META)["t"] == "ok"
    assert client.call("close_lease", lease="A", outcome="finished", exit_code=0)["t"] == "ok"
    leader = cluster["n1"].machine
    backup = image(leader.locks, leader.raft, leader.membership)
    machine = lock_machine_of(backup)
    assert machine.ledger.image() == leader.locks.ledger.image()
    new = new_incarnation(
        machine, last_index=machine.applied_index, bump=1000, members={"n1": "h:1"}, quarantine_ms=0
    )
    assert cbor2.loads(new.image)["format"] == 4
    opened = restore_image(new.image, type(leader.locks), leader.membership)
    [run] = opened.ledger.runs_of("job")
    assert (run.outcome, run.exit_code, run.host) == ("finished", 0, "h1")
