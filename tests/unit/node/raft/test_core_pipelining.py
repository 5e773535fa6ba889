"""Sending while persisting (Raft dissertation 10.2.1) and pipelined Readys, rule by rule.

Each test drives Readys by hand: what leaves in ``messages_now`` is delivered
before the Ready is persisted, and ``advance`` comes only when a test says
the write completed.
"""

from __future__ import annotations

import random

import pytest

from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.log import RaftLog
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    Ready,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import ConfState, Entry, HardState, Snapshot, SnapshotMeta

from .harness import Net, of_type

VOTERS = ("n1", "n2", "n3")


def write(storage: MemoryStorage, rd: Ready) -> None:
    """What a runtime's disk does with a Ready (the caller decides when it completes)."""
    if rd.snapshot is not None:
        storage.apply_snapshot(rd.snapshot)
    if rd.entries:
        storage.append(rd.entries)
    if rd.hard_state is not None:
        storage.set_hard_state(rd.hard_state)


def settled(n: int = 3) -> tuple[Net, RaftNode]:
    net = Net(n)
    leader = net.elect("n1")
    net.deliver()
    return net, leader


def test_leader_commits_on_two_follower_acks_while_its_own_write_is_outstanding() -> None:
    net, leader = settled()
    index = leader.propose(b"x")
    rd = leader.ready()  # the leader's own write of x starts ... and does not finish yet
    assert rd.entries[-1].index == index
    appends = of_type(rd.messages_now, AppendEntries)
    assert sorted(m.dst for m in appends) == ["n2", "n3"] and rd.messages == ()
    acks: list[Message] = []
    for m in appends:
        net[m.dst].step(m)
        acks += [a for r in net.persist(m.dst) for a in r.messages]
    assert [type(a) for a in acks] == [AppendEntriesResponse, AppendEntriesResponse]
    leader.step(acks[0])
    assert leader.commit_index < index  # one follower and a leader whose copy is not durable
    leader.step(acks[1])
    assert leader.commit_index == index  # two durable follower copies are a quorum
    assert leader.status().progress["n1"].match < index
    # Committed before it is durable here: it may already be applied (a quorum holds it).
    second = leader.ready()
    assert [e.data for e in second.committed] == [b"x"]
    write(net.storages["n1"], rd)
    leader.advance(rd)
    write(net.storages["n1"], second)
    leader.advance(second)
    assert leader.status().progress["n1"].match == index


def test_lone_voter_commits_only_after_its_write_is_advanced() -> None:
    net = Net(1)
    leader = net.elect("n1")
    index = leader.propose(b"x")
    assert isinstance(index, int), index
    rd = leader.ready()
    assert rd.committed == () and leader.commit_index < index
    for _ in range(5):
        leader.tick()
    more = leader.ready()  # ticks and readys go on while the write is outstanding
    assert leader.commit_index < index and more.committed == ()
    write(net.storages["n1"], rd)
    leader.advance(rd)
    assert leader.commit_index == index
    leader.advance(more)
    assert [e.data for e in leader.ready().committed] == [b"x"]


def test_a_new_leader_counts_only_what_advance_confirmed_durable() -> None:
    net = Net(3, pre_vote=False, check_quorum=False)
    leader = net.elect("n1")
    net.deliver()
    follower, storage = net["n2"], net.storages["n2"]
    leader.propose(b"y")
    y = next(m for m in of_type(leader.ready().messages_now, AppendEntries) if m.dst == "n2")
    follower.step(y)
    in_flight = follower.ready()
    durable = storage.last_index()
    write(storage, in_flight)  # on its disk, but the runtime has not called advance() yet
    for _ in range(40):
        follower.tick()
        if follower.role is Role.CANDIDATE:
            break
    campaign = follower.ready()
    write(storage, campaign)
    request = next(m for m in of_type(campaign.messages, VoteRequest) if m.dst == "n3")
    net["n3"].step(request)
    for rd in net.persist("n3"):
        for reply in rd.messages:
            follower.step(reply)
    assert follower.role is Role.LEADER
    assert follower.status().progress["n2"].match == durable
    follower.advance(in_flight)
    assert follower.status().progress["n2"].match == y.entries[-1].index
    follower.advance(campaign)
    no_op = follower.ready()
    write(storage, no_op)
    follower.advance(no_op)
    assert follower.status().progress["n2"].match == follower.last_index


def test_votes_and_vote_requests_never_leave_before_the_disk_has_the_term_and_vote() -> None:
    net = Net(3, pre_vote=False)
    node = net["n1"]
    for _ in range(40):
        node.tick()
        if node.role is Role.CANDIDATE:
            break
    rd = node.ready()
    assert rd.hard_state == HardState(1, "n1", 0)
    assert len(of_type(rd.messages, VoteRequest)) == 2 and rd.messages_now == ()
    request = of_type(rd.messages, VoteRequest)[0]
    voter = net[request.dst]
    voter.step(request)
    answer = voter.ready()
    assert of_type(answer.messages, VoteResponse)[0].granted
    assert answer.messages_now == ()


def test_a_refused_vote_at_a_durable_term_still_waits_for_the_disk() -> None:
    net, leader = settled()
    other = net["n3"]
    net["n2"].step(
        VoteRequest(
            group=0, term=leader.term, src="n3", dst="n2", last_log_index=99, last_log_term=99
        )
    )
    rd = net["n2"].ready()  # n2 already voted for n1 in this term: refused
    assert rd.messages_now == ()
    assert not of_type(rd.messages, VoteResponse)[0].granted
    assert other.term == leader.term


def test_pre_vote_answers_leave_at_once() -> None:
    net, leader = settled()
    for _ in range(leader._cfg.election_ticks):
        net["n2"].tick()  # its lease on n1 runs out: it answers pre-votes again
    net["n2"].ready()
    net["n2"].step(
        VoteRequest(
            group=0,
            term=leader.term + 1,
            src="n3",
            dst="n2",
            last_log_index=99,
            last_log_term=99,
            pre_vote=True,
        )
    )
    rd = net["n2"].ready()
    responses = of_type(rd.messages_now, VoteResponse)
    assert len(responses) == 1 and responses[0].pre_vote


def test_a_followers_append_ack_waits_for_its_write_and_heartbeat_answers_do_not() -> None:
    net, leader = settled()
    leader.propose(b"x")
    for _ in range(leader._cfg.heartbeat_ticks):
        leader.tick()
    rd = leader.ready()
    for m in rd.messages_now:
        if m.dst == "n2":
            net["n2"].step(m)
    answer = net["n2"].ready()
    assert of_type(answer.messages, AppendEntriesResponse)
    assert not of_type(answer.messages_now, AppendEntriesResponse)
    assert of_type(answer.messages_now, HeartbeatResponse)
    assert of_type(rd.messages_now, Heartbeat)


def test_nothing_leaves_at_once_while_a_new_term_is_not_durable() -> None:
    net, leader = settled()
    follower = net["n2"]
    # A heartbeat of a higher term: n2 adopts it, and must write it before answering.
    follower.step(Heartbeat(group=0, term=leader.term + 1, src="n3", dst="n2", commit=0))
    rd = follower.ready()
    assert rd.hard_state is not None and rd.hard_state.term == leader.term + 1
    assert rd.messages_now == () and of_type(rd.messages, HeartbeatResponse)
    follower.step(Heartbeat(group=0, term=leader.term + 1, src="n3", dst="n2", commit=0))
    second = follower.ready()  # taken while the first is still on its way to the disk
    assert second.messages_now == () and of_type(second.messages, HeartbeatResponse)
    write(net.storages["n2"], rd)
    follower.advance(rd)
    follower.advance(second)
    follower.step(Heartbeat(group=0, term=leader.term + 1, src="n3", dst="n2", commit=0))
    assert of_type(follower.ready().messages_now, HeartbeatResponse)


def test_a_new_leader_speaks_at_once_only_when_its_term_is_durable() -> None:
    net = Net(3, pre_vote=False)
    node = net["n1"]
    for _ in range(40):
        node.tick()
        if node.role is Role.CANDIDATE:
            break
    campaign = node.ready()  # term 1 and the self-vote: not written yet
    for request in of_type(campaign.messages, VoteRequest):
        net[request.dst].step(request)
        for rd in net.persist(request.dst):
            for reply in rd.messages:
                node.step(reply)
    assert node.role is Role.LEADER
    first = node.ready()
    assert first.messages_now == () and of_type(first.messages, AppendEntries)
    write(net.storages["n1"], campaign)
    node.advance(campaign)
    write(net.storages["n1"], first)
    node.advance(first)
    node.tick()
    assert of_type(node.ready().messages_now, Heartbeat)


def test_leader_messages_of_every_kind_leave_at_once() -> None:
    net, leader = settled()
    net.cut.add(("n1", "n3"))
    leader.transfer_leadership("n2")  # n2 is caught up: TimeoutNow at once
    leader.tick()
    rd = leader.ready()
    kinds = {type(m) for m in rd.messages_now}
    assert {TimeoutNow, Heartbeat} <= kinds and rd.messages == ()


def test_heartbeats_keep_flowing_while_readys_are_in_flight() -> None:
    net, leader = settled()
    outstanding = []
    for i in range(5):
        leader.propose(b"%d" % i)
        leader.tick()
        rd = leader.ready()
        assert {m.dst for m in of_type(rd.messages_now, Heartbeat)} == {"n2", "n3"}
        outstanding.append(rd)
    for rd in outstanding:
        write(net.storages["n1"], rd)
        leader.advance(rd)
    assert leader.status().progress["n1"].match == leader.last_index


def test_advance_must_follow_the_order_of_ready() -> None:
    _, leader = settled()
    leader.propose(b"a")
    first = leader.ready()
    leader.propose(b"b")
    second = leader.ready()
    with pytest.raises(ValueError, match="order"):
        leader.advance(second)
    leader.advance(first)
    leader.advance(second)
    with pytest.raises(ValueError, match="order"):
        leader.advance(second)
    leader.advance(Ready())  # nothing to persist: may be advanced (or not) at any time


# -- the log's bookkeeping under pipelining --------------------------------------------------


def follower_node() -> tuple[RaftNode, MemoryStorage]:
    storage = MemoryStorage(ConfState(VOTERS))
    return RaftNode(Config("n1", VOTERS), storage, random.Random(1)), storage


def append(node: RaftNode, term: int, prev: tuple[int, int], *entries: Entry) -> None:
    node.step(
        AppendEntries(
            group=0,
            term=term,
            src="n2",
            dst="n1",
            prev_index=prev[0],
            prev_term=prev[1],
            entries=entries,
            commit=0,
        )
    )


def test_an_entry_overwritten_and_then_restored_is_not_marked_stable_by_its_old_ack() -> None:
    """A, then B, then A again at index 2: the first write's ack must not stand for the last.

    The disk will hold B at index 2 once the second write completes, so reading
    index 2 from storage at that point would answer B's term.
    """
    storage = MemoryStorage()
    log = RaftLog(storage)
    log.truncate_and_append([Entry(1, 1), Entry(2, 1, b"A")])
    first = log.take_unstable()
    log.truncate_and_append([Entry(2, 2, b"B")])
    second = log.take_unstable()
    log.truncate_and_append([Entry(2, 1, b"A")])
    third = log.take_unstable()
    storage.append(first)
    log.stable_to(2, 1)  # the first write completed
    assert log.durable_index() == 1  # only index 1 is what the disk will keep
    storage.append(second)  # the disk now holds B at 2; the log must not look there
    assert log.term(2) == 1 and log.entries(2, 3)[0].data == b"A"
    log.stable_to(2, 2)  # overwritten since: nothing more is stable
    assert log.durable_index() == 1
    storage.append(third)
    log.stable_to(2, 1)
    assert log.durable_index() == 2 and not log.has_unstable()


def test_a_follower_overwritten_while_its_write_is_in_flight() -> None:
    node, storage = follower_node()
    append(node, 1, (0, 0), Entry(1, 1, b"a"), Entry(2, 1, b"b"), Entry(3, 1, b"c"))
    first = node.ready()
    append(node, 2, (1, 1), Entry(2, 2, b"B"))  # a new leader cuts 2..3 before the write ends
    second = node.ready()
    assert second.entries == (Entry(2, 2, b"B"),)
    write(storage, first)
    node.advance(first)
    assert node.last_index == 2 and node._log.term(2) == 2
    assert of_type(first.messages, AppendEntriesResponse)[0].index == 3  # acks what it wrote
    write(storage, second)
    node.advance(second)
    assert storage.last_index() == 2 and storage.term(2) == 2


def test_a_snapshot_installed_while_an_append_is_in_flight() -> None:
    node, storage = follower_node()
    append(node, 1, (0, 0), Entry(1, 1), Entry(2, 1))
    first = node.ready()
    meta = SnapshotMeta(10, 1, ConfState(VOTERS))
    node.step(
        InstallSnapshot(
            group=0, term=1, src="n2", dst="n1", meta=meta, offset=0, data=b"img", done=True
        )
    )
    second = node.ready()
    assert second.snapshot == Snapshot(meta, b"img")
    append(node, 1, (10, 1), Entry(11, 1))
    third = node.ready()
    write(storage, first)
    node.advance(first)  # the snapshot will replace what this wrote: nothing becomes stable
    assert node._log.durable_index() == 0
    assert (node._log.first_index(), node.last_index) == (11, 11)
    write(storage, second)
    node.advance(second)
    assert node._log.durable_index() == 10
    write(storage, third)
    node.advance(third)
    assert node._log.durable_index() == 11 and storage.last_index() == 11
