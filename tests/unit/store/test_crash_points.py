"""Crash after every filesystem operation the store makes, in every way a disk can.

For a seeded workload of appends (some replacing a conflicting suffix), hard
state changes, snapshots and compactions, we count the operations it makes
on a CrashableFS, then rerun it once per operation, crashing right there:
with that write landed whole, cut at a random byte, or followed by garbage or
zeros, and then restarting as a killed process, after a power loss, or with
torn unsynced tails. Each time the store must reopen, hold every acknowledged
entry in order, never move term or vote back, and keep working.

The same holds from a data dir written by dlm 0.1 (version 1 segments) through
its upgrade to the current format, and when the disk fills up at any write.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable

import pytest

from dlm.records import Entry, HardState
from dlm.store import StoreFull
from dlm.store.disk import WAL_DIR, DiskStorage
from dlm.store.fs import CrashableFS, CrashMode, SimulatedCrash, Tear
from dlm.store.wal import segment_name
from tests.unit.store import wal_v1
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


def _v1_entries(lo: int, hi: int) -> list[Entry]:
    return [Entry(i, 1, b"v1-%d" % i) for i in range(lo, hi)]


def plant_v1_store(fs: CrashableFS) -> Model:
    """Entries 1..12 in two dlm 0.1 segments; returns the model of what they hold."""
    fs.makedirs(os.path.join(ROOT, WAL_DIR))
    fs.makedirs(os.path.join(ROOT, "snap"))
    for seq, lo, hi in ((1, 1, 7), (2, 7, 13)):
        path = os.path.join(ROOT, WAL_DIR, segment_name(seq))
        fs.write_file(path, wal_v1.segment(seq, lo - 1, 1 if lo > 1 else 0, _v1_entries(lo, hi)))
    model = Model()
    acknowledge(model, Op("append", entries=tuple(_v1_entries(1, 13))))
    return model


UPGRADE_OPS = [
    Op("append", entries=(Entry(13, 1, b"a"), Entry(14, 1, b"b"))),
    Op("append", entries=(Entry(11, 2, b"replaces a 0.1 suffix"), Entry(12, 2, b"c"))),
    Op("hard_state", hard_state=HardState(2, "b", 10)),
    Op("append", entries=tuple(Entry(i, 2, b"x" * 90) for i in range(13, 19))),
    Op("append", entries=tuple(Entry(i, 2, b"y" * 30) for i in range(19, 22))),
    Op("create_snapshot", index=9),
    Op("compact", index=9),
    Op("append", entries=(Entry(22, 2, b"z"),)),
]


def run_ops_until_crash(
    fs: CrashableFS, model: Model, work: Iterable[Op]
) -> tuple[Model, Op | None, bool]:
    pending: Op | None = None
    try:
        store = DiskStorage.open(ROOT, fs=fs, segment_bytes=SEGMENT_BYTES)
        for op in work:
            pending = op
            run_op(store, op)
            acknowledge(model, op)
            pending = None
        store.close()
    except SimulatedCrash:
        return model, pending, True
    return model, None, False


def test_every_crash_point_of_an_upgrade_from_0_1_keeps_acknowledged_entries() -> None:
    counting = CrashableFS(random.Random(0))
    model, _, crashed = run_ops_until_crash(counting, plant_v1_store(counting), UPGRADE_OPS)
    assert not crashed
    assert model.last == 22
    total = counting.ops
    rng = random.Random(31)
    for op_number in range(total):
        for tear, mode in VARIANTS:
            fs = CrashableFS(random.Random(rng.getrandbits(32)))
            start = plant_v1_store(fs)
            fs.arm(op_number, tear)
            model, pending, crashed = run_ops_until_crash(fs, start, UPGRADE_OPS)
            assert crashed
            fs.crash(mode)
            try:
                reopen_and_check(fs, model, pending)
            except Exception as exc:
                raise AssertionError(
                    f"upgrade, crash at op {op_number}/{total}, {tear.name}/{mode.name}, "
                    f"pending {pending and pending.kind}: {exc!r}"
                ) from exc


def _used(fs: CrashableFS, root: str) -> int:
    total = 0
    for name in fs.listdir(root):
        path = os.path.join(root, name)
        total += _used(fs, path) if fs.isdir(path) else fs.size(path)
    return total


@pytest.mark.parametrize("seed", [5, 6])
def test_a_disk_filling_up_at_any_write_keeps_acknowledged_entries(seed: int) -> None:
    """Run the workload on a disk of every size it outgrows: whichever write fails
    (part of it landing), the member stops, space is freed, and it starts again."""
    fs = CrashableFS(random.Random(seed))
    run_until_crash(fs, seed, WORKLOAD_OPS)
    peak = _used(fs, ROOT)
    rng = random.Random(seed * 31)
    sizes = sorted({rng.randrange(0, peak) for _ in range(60)})
    stopped = 0
    for capacity in sizes:
        for mode in (CrashMode.PROCESS, CrashMode.POWER_LOSS, CrashMode.TORN):
            fs = CrashableFS(random.Random(rng.getrandbits(32)))
            fs.capacity = capacity
            model = Model()
            pending: Op | None = None
            try:
                store = DiskStorage.open(ROOT, fs=fs, segment_bytes=SEGMENT_BYTES)
                for op, model in ops(seed, WORKLOAD_OPS):
                    pending = op
                    run_op(store, op)
                    acknowledge(model, op)
                    pending = None
                store.close()
            except StoreFull as exc:
                assert exc.path == ROOT
                stopped += 1
            fs.crash(mode)
            fs.capacity = None
            try:
                reopen_and_check(fs, model, pending)
            except Exception as exc:
                raise AssertionError(
                    f"seed {seed}, capacity {capacity}/{peak}, {mode.name}, "
                    f"pending {pending and pending.kind}: {exc!r}"
                ) from exc
    assert stopped > len(sizes)  # the disk did fill up, at many different writes
