"""The member's disk worker: one thread that writes what the node machine asks to persist.

The event loop hands ``Persist`` and ``SaveSnapshot`` actions over in order; this
thread writes the jobs that queued up together with one fsync (group commit) and
reports each group back to the loop once it is durable. Nothing here decides what
to write: that is the machine's (machine.py); the adapter (server.py) only
forwards. Tested by tests/unit/node/test_persister.py and, end to end, by every
test that runs a member.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable

from dlm.node.machine import Persist, SaveSnapshot
from dlm.node.stats import DiskStats
from dlm.records import Entry, Storage


class Persister:
    """The one thread that touches the disk: jobs complete in the order they were queued.

    Group commit: the jobs that queued up while the disk was busy are written
    together, with one fsync (``merge_appends``), and reported together. Nothing is
    reported before it is durable, and each job still reaches the disk in
    order: a later job's entries replace what an earlier one wrote from their
    first index on, exactly as appending them one after the other would.
    """

    def __init__(
        self,
        storage: Storage,
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[list[Persist | SaveSnapshot], BaseException | None], None],
    ) -> None:
        """Starts the thread; construct it on the loop's thread, inside the loop."""
        self._storage = storage
        self._loop = loop
        self._on_done = on_done
        # Completions run in the loop's context, not in this thread's empty one: the loop
        # code they start (a pump, a peer link) calls anyio, which finds its event loop
        # through a context variable; without it a member add was lost half-way (a
        # NoEventLoopError in the middle of a batch of actions).
        self._context = contextvars.copy_context()
        # Test-only (tests/chaos): a slow disk, this many ms more for every write that
        # fsyncs: entries, and a term or vote (what a vote waits for).
        delay = os.environ.get("DLM_TEST_FSYNC_DELAY_MS", "").strip()
        self._test_delay_s = int(delay) / 1000.0 if delay.isdigit() else 0.0
        self._written_term_vote: tuple[int, str | None] | None = None
        self._queue: queue.SimpleQueue[Persist | SaveSnapshot | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dlm-persist", daemon=True)
        self._thread.start()
        self.failure: BaseException | None = None
        self.stats = DiskStats()
        self.snapshot_write_s: dict[int, float] = {}
        self.last_write_s = 0.0
        """Seconds the latest write of log entries or hard state took (on either thread)."""
        """Seconds each snapshot took to write and compact behind, by index (read once)."""

    @property
    def slowed(self) -> bool:
        """DLM_TEST_FSYNC_DELAY_MS is set (tests/chaos)."""
        return self._test_delay_s > 0

    def submit(self, job: Persist | SaveSnapshot) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        pending = self._queue
        while True:
            item = pending.get()
            queued: list[Persist | SaveSnapshot | None] = [item]
            while item is not None:
                try:
                    item = pending.get_nowait()
                except queue.Empty:
                    break
                queued.append(item)
            stop = queued[-1] is None
            jobs = [job for job in queued if job is not None]
            while jobs:
                group = persist_group(jobs)
                del jobs[: len(group)]
                try:
                    self._write(group)
                except BaseException as exc:  # the loop decides what a failed disk means
                    self.failure = exc
                    self._loop.call_soon_threadsafe(
                        self._on_done, group, exc, context=self._context
                    )
                    return
                self._loop.call_soon_threadsafe(self._on_done, group, None, context=self._context)
            if stop:
                return

    def write_now(self, job: Persist) -> None:
        """Writes ``job`` on the calling thread; only while no job is queued or running."""
        self._write([job])

    def _write(self, group: list[Persist | SaveSnapshot]) -> None:
        storage = self._storage
        started = time.perf_counter()
        job = group[0]
        if isinstance(job, SaveSnapshot):
            write_job(storage, job)
            self.snapshot_write_s[job.index] = time.perf_counter() - started
            return
        persists = [j for j in group if isinstance(j, Persist)]
        if job.snapshot is not None:
            storage.apply_snapshot(job.snapshot)
        entries = merge_appends(persists)
        hard_state = next(
            (j.hard_state for j in reversed(persists) if j.hard_state is not None), None
        )
        if self._test_delay_s:
            term_vote = None if hard_state is None else (hard_state.term, hard_state.vote)
            moved = term_vote is not None and term_vote != self._written_term_vote
            if entries or moved:
                time.sleep(self._test_delay_s)  # the slow disk itself, not synchronisation
            if moved:
                self._written_term_vote = term_vote
        if entries:
            storage.append(entries)
        if hard_state is not None:
            # A commit-only change costs no disk write (commit is advisory).
            storage.set_hard_state(hard_state)
        if entries or hard_state is not None:
            self.last_write_s = time.perf_counter() - started
        if entries:
            self.stats.fsync.observe(time.perf_counter() - started)
            self.stats.batch.observe(len(entries))


def write_job(storage: Storage, job: Persist | SaveSnapshot) -> None:
    """Makes one job durable, as the disk thread does (without grouping, timing or test
    delays); the unit tests' member driver writes with it too."""
    if isinstance(job, Persist):
        if job.snapshot is not None:
            storage.apply_snapshot(job.snapshot)
        if job.entries:
            storage.append(job.entries)
        if job.hard_state is not None:
            storage.set_hard_state(job.hard_state)
        return
    existing = storage.snapshot()
    if existing is None or existing.meta.index < job.index:
        storage.create_snapshot(job.index, job.conf, job.data)
    if job.compact_to > storage.first_index() - 1:
        storage.compact(min(job.compact_to, job.index))


def persist_group(jobs: list[Persist | SaveSnapshot]) -> list[Persist | SaveSnapshot]:
    """The first job of ``jobs`` and the Persist jobs after it that can share its fsync.

    A snapshot to install or to save is a group of its own (it rewrites the log
    in ways a merged append cannot express); a snapshot to install may lead a
    group, since the entries after it are appended to the log it leaves.
    """
    first = jobs[0]
    if isinstance(first, SaveSnapshot):
        return [first]
    group: list[Persist | SaveSnapshot] = [first]
    for job in jobs[1:]:
        if not isinstance(job, Persist) or job.snapshot is not None:
            break
        group.append(job)
    return group


def merge_appends(group: list[Persist]) -> list[Entry]:
    """The entries of ``group`` as one append: each job's entries replace the merged
    ones from their first index on, as a separate append would replace the stored ones."""
    merged: list[Entry] = []
    for job in group:
        entries = job.entries
        if not entries:
            continue
        if merged:
            keep = entries[0].index - merged[0].index
            if keep < len(merged):
                del merged[max(0, keep) :]
        merged.extend(entries)
    return merged
