"""The disk worker (runtime/persister.py): group commit keeps the meaning of separate appends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from dlm.node.machine import Persist, SaveSnapshot
from dlm.node.raft.memory import MemoryStorage
from dlm.node.runtime.persister import Persister, merge_appends, persist_group
from dlm.records import ConfState, Entry, HardState


def _entries(first: int, count: int, term: int) -> tuple[Entry, ...]:
    return tuple(Entry(index, term, b"x%d" % index) for index in range(first, first + count))


def _stored(storage: MemoryStorage) -> list[Entry]:
    return storage.entries(storage.first_index(), storage.last_index() + 1)


@st.composite
def _append_jobs(draw: st.DrawFn) -> list[Persist]:
    """Jobs as a follower receives them: each starts at or before the end of the log so far,
    often overwriting a suffix an earlier job wrote (a new leader's entries)."""
    jobs: list[Persist] = []
    last = 0
    for number in range(draw(st.integers(1, 8))):
        first = draw(st.integers(1, last + 1))
        count = draw(st.integers(0, 4))
        entries = _entries(first, count, term=number + 1)
        jobs.append(Persist(number, None, entries, None))
        if count:
            last = first + count - 1
    return jobs


@settings(max_examples=300, deadline=None)
@given(_append_jobs())
def test_one_merged_append_stores_what_the_separate_appends_would(jobs: list[Persist]) -> None:
    one_by_one = MemoryStorage()
    for job in jobs:
        if job.entries:
            one_by_one.append(job.entries)
    merged = MemoryStorage()
    entries = merge_appends(jobs)
    if entries:
        merged.append(entries)
    assert _stored(merged) == _stored(one_by_one)


def test_a_snapshot_to_save_is_a_group_of_its_own() -> None:
    save = SaveSnapshot(5, ConfState(), b"image", 0)
    after = Persist(2, None, _entries(6, 1, 1), None)
    assert persist_group([save, after]) == [save]
    before = Persist(1, None, _entries(5, 1, 1), None)
    assert persist_group([before, save, after]) == [before]


def test_a_snapshot_to_install_may_lead_a_group_but_never_join_one() -> None:
    from dlm.records import Snapshot, SnapshotMeta

    snapshot = Snapshot(SnapshotMeta(10, 1, ConfState()), b"image")
    install = Persist(1, snapshot, _entries(11, 1, 1), None)
    follow = Persist(2, None, _entries(12, 1, 1), None)
    assert persist_group([install, follow]) == [install, follow]
    assert persist_group([follow, install]) == [follow]


class _GatedStorage(MemoryStorage):
    """Holds its first append until the test opens the gate, so that later jobs queue up."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.appends: list[int] = []

    def append(self, entries: Sequence[Entry]) -> None:
        if not self.appends:
            self.entered.set()
            assert self.gate.wait(timeout=10), "the test never opened the gate"
        self.appends.append(len(entries))
        super().append(entries)


def test_jobs_that_queue_while_the_disk_is_busy_share_one_write_and_report_in_order() -> None:
    async def scenario() -> tuple[list[list[int]], _GatedStorage]:
        storage = _GatedStorage()
        loop = asyncio.get_running_loop()
        reports: list[list[int]] = []
        all_done = asyncio.Event()

        def on_done(group: list[Persist | SaveSnapshot], failure: BaseException | None) -> None:
            assert failure is None
            reports.append([job.job for job in group if isinstance(job, Persist)])
            if sum(len(r) for r in reports) == 4:
                all_done.set()

        persister = Persister(storage, loop, on_done)
        try:
            persister.submit(Persist(1, None, _entries(1, 2, 1), HardState(1, "n1", 0)))
            assert storage.entered.wait(timeout=10)
            # Job 1 is inside its write (held at the gate) while these queue behind it.
            for number, first in ((2, 3), (3, 4), (4, 5)):
                persister.submit(Persist(number, None, _entries(first, 1, 1), None))
            storage.gate.set()
            await asyncio.wait_for(all_done.wait(), timeout=10)
        finally:
            persister.stop()
        return reports, storage

    reports, storage = asyncio.run(scenario())
    assert reports == [[1], [2, 3, 4]]
    assert storage.appends == [2, 3]  # two writes (two fsyncs) for four jobs
    assert storage.last_index() == 5
    assert storage.hard_state.term == 1


def test_completions_run_in_the_loops_context_so_anyio_works_in_them() -> None:
    """The member runs under ``anyio.run``; what a completion starts (a pump that applies a
    member added, which opens a peer link) calls anyio, which finds its loop through a
    context variable. Reported from the disk thread's own empty context, that call raised
    half-way through a batch of actions and the member later stopped on a gap in its log."""

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        done = asyncio.Event()

        def on_done(group: list[Persist | SaveSnapshot], failure: BaseException | None) -> None:
            try:
                anyio.CancelScope()
                seen.append("anyio works")
            except Exception as exc:  # the bug: NoEventLoopError
                seen.append(type(exc).__name__)
            done.set()

        persister = Persister(MemoryStorage(), loop, on_done)
        try:
            persister.submit(Persist(1, None, _entries(1, 1, 1), None))
            await asyncio.wait_for(done.wait(), timeout=10)
        finally:
            persister.stop()
        return seen

    assert anyio.run(scenario, backend="asyncio") == ["anyio works"]
