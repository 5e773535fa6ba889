"""Persistence jobs finish strictly in the order they were handed out."""

from __future__ import annotations

from dlm.node.persist_jobs import PersistJobs
from dlm.node.raft.types import Ready
from dlm.records import HardState


def _persisting(term: int) -> Ready:
    return Ready(hard_state=HardState(term=term, vote=None, commit=0))


def test_a_job_finishes_only_when_it_and_every_earlier_one_are_durable() -> None:
    jobs = PersistJobs()
    first, nothing, last = _persisting(1), Ready(), _persisting(2)
    a = jobs.hand_out(first, 1.0)
    assert jobs.hand_out(nothing, 1.5) is None  # nothing to persist: no Persist job, yet it waits
    c = jobs.hand_out(last, 2.0)
    assert a is not None and c is not None and a < c
    assert jobs.durable(c, 2.5)
    assert jobs.latency_s == 0.5  # from when it was handed out
    assert list(jobs.finished()) == []
    assert jobs
    assert jobs.durable(a, 3.0)
    assert jobs.latency_s == 2.0  # a slower write sets the estimate at once
    assert not jobs.durable(999, 3.0)
    assert list(jobs.finished()) == [first, nothing, last]
    assert not jobs


def test_a_ready_with_nothing_to_persist_finishes_at_once_when_alone() -> None:
    jobs = PersistJobs()
    ready = Ready()
    assert jobs.hand_out(ready, 0.0) is None
    assert list(jobs.finished()) == [ready]


def test_faster_writes_pull_the_latency_estimate_down_a_fifth_at_a_time() -> None:
    jobs = PersistJobs()
    slow = jobs.hand_out(_persisting(1), 0.0)
    assert slow is not None and jobs.durable(slow, 1.0)
    fast = jobs.hand_out(_persisting(2), 1.0)
    assert fast is not None and jobs.durable(fast, 1.0)
    assert jobs.latency_s == 0.8
