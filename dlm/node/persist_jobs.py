"""Persistence jobs: each Ready of the Raft core handed out as one job, finished in order.

Raft dissertation §10.2.1: the leader's appends and heartbeats leave at once, while
its own fsync runs; everything that promises something about this member's disk (the
Ready's other messages, and ``advance``, after which the core counts the leader's own
entries toward a commit) waits until its job, and every job before it, is durable. A
Ready with nothing to persist is a job that is done at once, so that it still waits for
the jobs before it. Pure: part of the node machine (machine.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from dlm.node.raft.types import Ready

LATENCY_DECAY = 0.2
"""How far each faster write pulls the write-latency estimate down (a slower one sets it)."""
LATENCY_MAX_S = 60.0
"""The most the estimate can say (election timeouts grow by twice it)."""


@dataclass(slots=True)
class _Job:
    ready: Ready
    done: bool
    handed_at: float
    """When it was handed to the disk (monotonic): how long a write takes is measured from it."""


class PersistJobs:
    """The Readies handed out and not yet finished, in order, by job number."""

    def __init__(self) -> None:
        self._jobs: deque[tuple[int, _Job]] = deque()
        self._next = 1
        self.latency_s = 0.0
        """How long a write takes here, from handing it out to hearing it is durable: a
        slower write sets it at once, faster ones pull it down a fifth of the way each."""

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def hand_out(self, ready: Ready, now: float) -> int | None:
        """Queues ``ready`` at monotonic time ``now``: the number of its Persist job, or None
        if it has nothing to persist (it is done, once the jobs before it are)."""
        persisting = bool(ready.entries) or ready.snapshot is not None
        persisting = persisting or ready.hard_state is not None
        number = self._next
        self._next += 1
        self._jobs.append((number, _Job(ready, done=not persisting, handed_at=now)))
        return number if persisting else None

    def durable(self, job: int, now: float) -> bool:
        """Marks ``job`` durable at monotonic time ``now`` and counts how long it took into
        ``latency_s``; False for a job that is not queued."""
        for number, entry in self._jobs:
            if number == job:
                entry.done = True
                self._measured(now - entry.handed_at)
                return True
        return False

    def _measured(self, seconds: float) -> None:
        seconds = min(max(0.0, seconds), LATENCY_MAX_S)
        if seconds >= self.latency_s:
            self.latency_s = seconds
        else:
            self.latency_s -= (self.latency_s - seconds) * LATENCY_DECAY

    def finished(self) -> Iterator[Ready]:
        """Takes out, in order, the Readies whose job and every job before it are durable."""
        jobs = self._jobs
        while jobs and jobs[0][1].done:
            yield jobs.popleft()[1].ready
