"""The spans of traced requests (dlm/node/spans.py), through the whole machine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlm.node import spans as span_room
from dlm.node.outbox import ExportSpans, FinishedSpan
from dlm.node.spans import APPLY, FSYNC, PROPOSAL, REPLICATE, REQUEST, span_problems
from tests.unit.node.machine_driver import Cluster, Member

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def started(size: int) -> Cluster:
    cluster = Cluster(size)
    cluster.elect("n1")
    return cluster


def names(batch: ExportSpans) -> list[str]:
    return [s.name for s in batch.spans]


def test_a_traced_acquire_gives_request_proposal_fsync_replication_and_apply_spans() -> None:
    cluster = started(3)
    leader = cluster.leader
    client = cluster.connect(leader.id)
    client.call("open_lease", lease="L1", ttl_ms=10_000)
    assert leader.exported == []  # untraced: nothing recorded
    cluster.settle(leader)
    reply = client.call("acquire", lease="L1", key="k", trace=TRACE)
    assert reply["t"] == "ok"
    (batch,) = leader.exported
    assert span_problems(batch.spans) == []
    assert {s.traceparent for s in batch.spans} == {TRACE}
    assert names(batch)[:3] == [REQUEST, PROPOSAL, FSYNC]
    assert names(batch).count(APPLY) == 1
    # The quorum's round trips at least (the third member's may still be under way).
    peers = {dict(s.attributes)["dlm.peer"] for s in batch.spans if s.name == REPLICATE}
    assert peers and peers <= {"n2", "n3"}
    request = batch.spans[0]
    attributes = dict(request.attributes)
    assert (attributes["dlm.request"], attributes["dlm.key"], attributes["dlm.member"]) == (
        "acquire",
        "k",
        "n1",
    )
    assert request.parent is None
    proposal = batch.spans[1]
    assert dict(proposal.attributes)["dlm.committed"] is True
    # The recorder is idle again: untraced answers cost one test.
    assert leader.machine.spans.open == {} and leader.machine.out.on_traced_answer is None


def test_a_traced_request_a_follower_refuses_has_its_request_span_only() -> None:
    cluster = started(3)
    follower: Member = cluster["n2"]
    client = cluster.connect("n2")
    reply = client.call("open_lease", lease="L1", ttl_ms=10_000, trace=TRACE)
    assert reply["code"] == "NOT_LEADER"
    (batch,) = follower.exported
    assert names(batch) == [REQUEST] and span_problems(batch.spans) == []


def test_a_traced_request_whose_connection_closes_is_forgotten() -> None:
    cluster = started(1)
    leader = cluster.leader
    leader.hold_disk = True  # the proposal waits for its write
    client = cluster.connect(leader.id)
    client.send("open_lease", lease="L1", ttl_ms=10_000, trace=TRACE)
    assert len(leader.machine.spans.open) == 1
    client.close()
    assert leader.machine.spans.open == {}
    leader.hold_disk = False
    cluster.settle(leader)
    assert leader.exported == []


def test_at_most_max_traced_requests_are_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_room, "MAX_TRACED", 1)
    cluster = started(1)
    leader = cluster.leader
    leader.hold_disk = True
    client = cluster.connect(leader.id)
    client.send("open_lease", lease="L1", ttl_ms=10_000, trace=TRACE)
    client.send("open_lease", lease="L2", ttl_ms=10_000, trace=TRACE)
    assert leader.machine.spans.dropped == 1
    leader.hold_disk = False
    cluster.settle(leader)
    assert len(leader.exported) == 1 and span_problems(leader.exported[0].spans) == []


def _good_batch() -> list[FinishedSpan]:
    def span(name: str, local: int, parent: int | None, start: float, end: float) -> FinishedSpan:
        attributes: tuple[tuple[str, object], ...] = ()
        if name == PROPOSAL:
            attributes = (("dlm.committed", True),)
        return FinishedSpan(name, local, parent, TRACE, start, end, attributes)

    return [
        span(REQUEST, 1, None, 0.0, 10.0),
        span(PROPOSAL, 2, 1, 0.0, 6.0),
        span(FSYNC, 3, 2, 1.0, 4.0),
        span(REPLICATE, 4, 2, 1.0, 5.0),
        span(APPLY, 5, 1, 6.0, 6.0),
    ]


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda b: [s for s in b if s.name != FSYNC], "0 fsync and 1 apply"),
        (lambda b: [s for s in b if s.name != APPLY], "1 fsync and 0 apply"),
        (lambda b: [replace(s, end=7.0) if s.name == FSYNC else s for s in b], "after a commit"),
        (lambda b: [replace(s, start=5.0) if s.name == APPLY else s for s in b], "before the"),
        (lambda b: [b[1], b[0], *b[2:]], "one dlm.request span first"),
        (lambda b: [replace(s, end=11.0) if s.name == REPLICATE else s for s in b], "ends after"),
        (lambda b: [replace(s, start=11.0) if s.name == APPLY else s for s in b], "start within"),
        (lambda b: [replace(s, start=5.0, end=4.0) if s.name == FSYNC else s for s in b], "ends b"),
        (lambda b: [b[0], *b[2:], b[1]], "parent is not given before it"),
    ],
)
def test_span_problems_catches_a_dropped_or_misordered_span(damage: object, said: str) -> None:
    assert span_problems(_good_batch()) == []
    assert callable(damage)
    problems = span_problems(damage(_good_batch()))
    assert any(said in p for p in problems), problems


def test_an_fsync_may_end_after_a_commit_two_followers_made() -> None:
    batch = _good_batch()
    late = [replace(s, end=8.0) if s.name == FSYNC else s for s in batch]
    second = replace(batch[3], local_id=6, end=5.5)
    assert span_problems([*late, second]) == []  # two round trips ended by the commit
    assert span_problems(late) != []  # one: the leader's own write was needed
