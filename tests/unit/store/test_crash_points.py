"""Crash after every filesystem operation the store makes, in every way a disk can.

For a seeded workload of appends (some replacing a conflicting suffix), hard
state changes, snapshots and compactions, we count the operations it makes
on a CrashableFS, then rerun it once per operation, crashing right there:
with that write landed whole, cut at a random byte, or followed by garbage or
zeros, and then restarting as a killed process, after a power loss, or with
torn unsynced tails. Each time the store must reopen, hold every acknowledged
entry in order, never move term or vote back, and keep working.
"""

from __future__ import annotations

import random

import pytest

from dlm.node.raft.types import Entry
from dlm.store.disk import DiskStorage
from dlm.store.fs import CrashableFS, CrashMode, SimulatedCrash, Tear
from tests.unit.store.workload import Model, Op, acknowledge, check_recovered, log_of, ops, run_op

ROOT = "/node"
SEGMENT_BYTES = 400
WORKLOAD_OPS = 60


def run_until_crash(fs: CrashableFS, seed: int, count: int) -> tuple[Model, Op | None, bool]:
    """Run the workload; return the acknowledged model, the interrupted op, and
    whether a crash happened."""
    model = Model()
    pending: Op | None = None
    try:
        store = DiskStorage.open(ROOT, fs=fs, segment_bytes=SEGMENT_BYTES)
        for op, model in ops(seed, count):
            pending = op
            run_op(store, op)
            acknowledge(model, op)
            pending = None
        store.close()
    except SimulatedCrash:
        return model, pending, True
    return model, None, False


def reopen_and_check(fs: CrashableFS, model: Model, pending: Op | None) -> None:
    store = DiskStorage.open(ROOT, fs=fs, segment_bytes=SEGMENT_BYTES)
    check_recovered(store, model, pending)
    # The repaired log must take new appends that survive another restart.
    before = log_of(store)
    term = max(store.term(store.last_index()), 1)
    extra = Entry(store.last_index() + 1, term, b"after-recovery")
    store.append([extra])
    store.close()
    store = DiskStorage.open(ROOT, fs=fs, segment_bytes=SEGMENT_BYTES)
    after = log_of(store)
    assert after == {**before, extra.index: extra}
    store.close()


def count_ops(seed: int) -> int:
    fs = CrashableFS(random.Random(seed))
    _, _, crashed = run_until_crash(fs, seed, WORKLOAD_OPS)
    assert not crashed
    return fs.ops


VARIANTS = [
    (Tear.WHOLE, CrashMode.PROCESS),
    (Tear.CUT, CrashMode.PROCESS),
    (Tear.GARBAGE, CrashMode.PROCESS),
    (Tear.ZEROS, CrashMode.PROCESS),
    (Tear.WHOLE, CrashMode.POWER_LOSS),
    (Tear.CUT, CrashMode.TORN),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_crash_point_keeps_acknowledged_entries(seed: int) -> None:
    total = count_ops(seed)
    assert total > 100  # the workload really does exercise the disk
    rng = random.Random(seed * 7919)
    for op_number in range(total):
        for tear, mode in VARIANTS:
            fs = CrashableFS(random.Random(rng.getrandbits(32)))
            fs.arm(op_number, tear)
            model, pending, crashed = run_until_crash(fs, seed, WORKLOAD_OPS)
            assert crashed
            fs.crash(mode)
            try:
                reopen_and_check(fs, model, pending)
            except Exception as exc:
                raise AssertionError(
                    f"seed {seed}, crash at op {op_number}/{total}, {tear.name}/{mode.name}, "
                    f"pending {pending and pending.kind}: {exc!r}"
                ) from exc


def test_crash_during_recovery_repair_is_also_safe() -> None:
    """Tear the tail, then crash the repairing open itself at each of its operations."""
    seed = 4
    total = count_ops(seed)
    rng = random.Random(99)
    for op_number in range(0, total, 3):
        fs = CrashableFS(random.Random(rng.getrandbits(32)))
        fs.arm(op_number, Tear.GARBAGE)
        model, pending, _ = run_until_crash(fs, seed, WORKLOAD_OPS)
        fs.crash(CrashMode.PROCESS)
        for repair_op in range(fs.ops, fs.ops + 4):
            fs.arm(repair_op, Tear.CUT)
            try:
                DiskStorage.open(ROOT, fs=fs, segment_bytes=SEGMENT_BYTES).close()
            except SimulatedCrash:
                fs.crash(CrashMode.TORN)
        fs.disarm()
        reopen_and_check(fs, model, pending)
