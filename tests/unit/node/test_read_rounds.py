"""Read rounds on their own: one leader round in flight, served once applied, timeouts."""

from __future__ import annotations

from typing import Any, cast

from dlm.node.outbox import Instant, Outbox, SendFrame
from dlm.node.raft.core import RaftNode
from dlm.node.raft.types import NotLeader, ReadState
from dlm.node.read_rounds import (
    BUSY_ROUND_GAP_S,
    BUSY_ROUND_READS,
    KEEPALIVE_ROUND_GAP_S,
    Read,
    ReadRounds,
)
from dlm.node.stats import Stats
from dlm.records import NodeId
from dlm.wire import ClientRequest, Get, Renew

NOW = Instant(10.0, 1_000)


class _Core:
    """The one call read rounds make to the Raft core: it records the contexts asked for."""

    def __init__(self, leader: NodeId | None = None) -> None:
        self.voters: tuple[str, ...] = ("n1", "n2", "n3")
        self.asked: list[bytes] = []
        self.leader = leader

    def read_index(self, ctx: bytes) -> NotLeader | None:
        self.asked.append(ctx)
        return None if self.leader is None else NotLeader(self.leader)


class _Room:
    def __init__(self) -> None:
        self.out = Outbox(Stats(), open_conns=range(100))
        self.not_leader: list[tuple[int, NodeId | None]] = []
        self.reads = ReadRounds(self.out, self._not_leader, b"n1/x")

    def _not_leader(self, conn: int, req: ClientRequest, leader: NodeId | None = None) -> None:
        self.not_leader.append((conn, leader))

    def frames(self) -> list[dict[str, Any]]:
        return [a.frame for a in self.out.take() if isinstance(a, SendFrame)]


def _read(conn: int, at: float = NOW.mono) -> Read:
    return Read(conn, Get(id=conn, key="k"), at)


def test_a_leader_keeps_one_round_in_flight_and_batches_what_arrives_meanwhile() -> None:
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    room.reads.queue(_read(1))
    room.reads.start_if_due(raft, True, NOW)
    room.reads.queue(_read(2))
    room.reads.queue(_read(3))
    room.reads.start_if_due(raft, True, NOW)
    assert len(core.asked) == 1  # the first round is not confirmed yet
    room.reads.confirmed([ReadState(core.asked[0], 5)])
    room.reads.start_if_due(raft, True, NOW)
    assert len(core.asked) == 2
    assert [r.conn for r in room.reads.rounds[core.asked[1]].reads] == [2, 3]


def test_a_follower_forwards_each_round_at_once() -> None:
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    for conn in (1, 2):
        room.reads.queue(_read(conn))
        room.reads.start_if_due(raft, False, NOW)
    assert len(core.asked) == 2


def test_a_confirmed_round_is_served_only_once_applied_to_its_read_point() -> None:
    room, core = _Room(), _Core()
    room.reads.queue(_read(1))
    room.reads.start_if_due(cast(RaftNode, core), True, NOW)
    assert room.reads.ready(applied=100) == []  # not confirmed: no read point yet
    room.reads.confirmed([ReadState(core.asked[0], 7)])
    assert room.reads.ready(applied=6) == []
    assert [r.conn for r in room.reads.ready(applied=7)] == [1]
    assert not room.reads.rounds


def test_a_core_that_is_not_the_leader_sends_the_reads_to_the_one_it_knows() -> None:
    room, core = _Room(), _Core(leader="n2")
    room.reads.queue(_read(1))
    room.reads.start_if_due(cast(RaftNode, core), False, NOW)
    assert room.not_leader == [(1, "n2")]
    assert not room.reads.rounds


def test_unconfirmed_rounds_time_out_by_who_started_them() -> None:
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    room.reads.queue(_read(1))
    room.reads.start_if_due(raft, True, NOW)
    room.reads.queue(_read(2))
    room.reads.start_if_due(raft, False, NOW)
    room.reads.time_out(started_before=NOW.mono + 1)
    assert sorted(f["code"] for f in room.frames()) == ["NO_QUORUM", "TIMEOUT"]
    assert not room.reads.rounds


def test_leadership_lost_sends_the_leaders_rounds_elsewhere_and_keeps_the_others() -> None:
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    room.reads.queue(_read(1))
    room.reads.start_if_due(raft, True, NOW)
    room.reads.queue(_read(2))
    room.reads.start_if_due(raft, False, NOW)
    room.reads.leadership_lost()
    assert room.not_leader == [(1, None)]
    assert [r.conn for rr in room.reads.rounds.values() for r in rr.reads] == [2]


def _keepalive(conn: int, at: float = NOW.mono) -> Read:
    return Read(conn, Renew(id=conn, lease="L"), at)


def _at(mono: float) -> Instant:
    return Instant(mono, NOW.wall_ms)


def test_a_leader_gathers_keepalives_alone_for_the_gap_after_its_last_round() -> None:
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    room.reads.queue(_keepalive(1))
    room.reads.start_if_due(raft, True, NOW)
    assert len(core.asked) == 1  # the first round after a quiet spell starts at once
    room.reads.confirmed([ReadState(core.asked[0], 5)])
    room.reads.queue(_keepalive(2))
    room.reads.queue(_keepalive(3))
    room.reads.start_if_due(raft, True, _at(NOW.mono + KEEPALIVE_ROUND_GAP_S / 2))
    assert len(core.asked) == 1  # keep-alives alone wait out the gap...
    room.reads.start_if_due(raft, True, _at(NOW.mono + KEEPALIVE_ROUND_GAP_S))
    assert len(core.asked) == 2  # ...and then share one round
    assert [r.conn for r in room.reads.rounds[core.asked[1]].reads] == [2, 3]


def test_after_a_busy_round_keepalives_wait_the_longer_gap_and_after_a_light_one_the_short() -> (
    None
):
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    for conn in range(BUSY_ROUND_READS):
        room.reads.queue(_keepalive(conn))
    room.reads.start_if_due(raft, True, NOW)
    room.reads.confirmed([ReadState(core.asked[0], 5)])
    room.reads.queue(_keepalive(90))
    assert room.reads.deferred_until(raft, True) == NOW.mono + BUSY_ROUND_GAP_S
    room.reads.start_if_due(raft, True, _at(NOW.mono + KEEPALIVE_ROUND_GAP_S))
    assert len(core.asked) == 1, "a busy round: the keep-alives wait the longer gap"
    second = NOW.mono + BUSY_ROUND_GAP_S
    room.reads.start_if_due(raft, True, _at(second))
    assert len(core.asked) == 2
    room.reads.confirmed([ReadState(core.asked[1], 5)])
    room.reads.queue(_keepalive(91))  # after a round of one: the short gap again
    assert room.reads.deferred_until(raft, True) == second + KEEPALIVE_ROUND_GAP_S


def test_any_other_read_starts_its_round_without_waiting_for_the_gap() -> None:
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    room.reads.queue(_keepalive(1))
    room.reads.start_if_due(raft, True, NOW)
    room.reads.confirmed([ReadState(core.asked[0], 5)])
    room.reads.queue(_keepalive(2))
    room.reads.queue(_read(3))
    room.reads.start_if_due(raft, True, _at(NOW.mono + KEEPALIVE_ROUND_GAP_S / 10))
    assert len(core.asked) == 2
    assert [r.conn for r in room.reads.rounds[core.asked[1]].reads] == [2, 3]


def test_a_keepalive_is_never_served_by_a_round_that_started_before_it_arrived() -> None:
    room, core = _Room(), _Core()
    raft = cast(RaftNode, core)
    room.reads.queue(_keepalive(1))
    room.reads.start_if_due(raft, True, NOW)
    room.reads.queue(_keepalive(2))  # arrives while the first round waits for its quorum
    room.reads.confirmed([ReadState(core.asked[0], 5)])
    assert [r.conn for r in room.reads.ready(applied=5)] == [1]
    room.reads.start_if_due(raft, True, _at(NOW.mono + KEEPALIVE_ROUND_GAP_S))
    room.reads.confirmed([ReadState(core.asked[1], 5)])
    assert [r.conn for r in room.reads.ready(applied=5)] == [2]


def test_a_leader_alone_does_not_wait_for_the_gap() -> None:
    room, core = _Room(), _Core()
    core.voters = ("n1",)
    raft = cast(RaftNode, core)
    for conn in (1, 2):
        room.reads.queue(_keepalive(conn))
        room.reads.start_if_due(raft, True, NOW)
        room.reads.confirmed([ReadState(core.asked[-1], 5)])
    assert len(core.asked) == 2
    assert room.reads.deferred_until(raft, True) == float("inf")
