"""Persistence jobs finish strictly in the order they were handed out."""

from __future__ import annotations

from dlm.node.persist_jobs import PersistJobs
from dlm.node.raft.types import HardState, Ready


def _persisting(term: int) -> Ready:
    return Ready(hard_state=HardState(term=term, vote=None, commit=0))


def test_a_job_finishes_only_when_it_and_every_earlier_one_are_durable() -> None:
    jobs = PersistJobs()
    first, nothing, last = _persisting(1), Ready(), _persisting(2)
    a = jobs.hand_out(first)
    assert jobs.hand_out(nothing) is None  # nothing to persist: no Persist job, yet it waits
    c = jobs.hand_out(last)
    assert a is not None and c is not None and a < c
    jobs.durable(c)
    assert list(jobs.finished()) == []
    assert jobs
    jobs.durable(a)
    assert list(jobs.finished()) == [first, nothing, last]
    assert not jobs


def test_a_ready_with_nothing_to_persist_finishes_at_once_when_alone() -> None:
    jobs = PersistJobs()
    ready = Ready()
    assert jobs.hand_out(ready) is None
    assert list(jobs.finished()) == [ready]
