"""The parts of dlm's Raft beyond Figure 2: pre-vote, check-quorum, ReadIndex, leadership
transfer, fast backtracking, chunked snapshots, the in-flight window and batching."""

from __future__ import annotations

import functools
import random
from dataclasses import replace

import pytest

from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    NotLeader,
    ReadIndexRequest,
    ReadIndexResponse,
    ReadState,
    Role,
    SoftState,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import ConfState, Entry, HardState

from .harness import Net, of_type

# ---------------------------------------------------------------------------
# Single node
# ---------------------------------------------------------------------------


def test_single_node_cluster_elects_itself_and_commits() -> None:
    net = Net(1)
    leader = net.elect("n1")
    assert leader.term == 1
    index = leader.propose(b"only")
    rd = leader.ready()
    # A lone voter commits only what its own disk has confirmed: nothing yet.
    assert [e.index for e in rd.entries] == [index]
    assert rd.committed == ()
    assert rd.messages == rd.messages_now == ()
    net.storages["n1"].append(rd.entries)
    leader.advance(rd)
    assert leader.commit_index == index
    rd = leader.ready()
    assert rd.committed[-1].index == index
    assert rd.hard_state is not None and rd.hard_state.commit == index
    leader.advance(rd)
    assert not leader.has_ready()


def test_single_node_restart_replays_committed_entries_and_reelects() -> None:
    net = Net(1)
    leader = net.elect("n1")
    leader.propose(b"a")
    net.persist("n1")
    node = net.restart("n1")
    net.persist("n1")
    assert net.data("n1") == [b"a"]
    net.elect("n1")
    assert node.term == 2


# ---------------------------------------------------------------------------
# Pre-vote
# ---------------------------------------------------------------------------


def test_restart_applies_only_entries_after_the_snapshot_even_if_log_is_kept() -> None:
    net = Net(1)
    leader = net.elect("n1")
    for i in range(5):
        leader.propose(b"%d" % i)
    net.persist("n1")
    net.storages["n1"].create_snapshot(4, ConfState(net.voters), b"image@4")  # log not compacted
    node = net.restart("n1")
    assert node.applied_index == 4
    rd = node.ready()
    assert [e.index for e in rd.committed] == [5, 6]


def test_lost_timeout_now_is_resent_on_the_next_heartbeat_answer() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    leader.transfer_leadership("n2")
    assert of_type(net.take("n1"), TimeoutNow)
    net.tick_all(2)
    assert net.leader() == "n2"


def test_pre_vote_does_not_change_term_or_vote() -> None:
    net = Net(3)
    node = net["n1"]
    for _ in range(20):
        node.tick()
    assert node.role is Role.PRE_CANDIDATE
    rd = node.ready()
    assert rd.hard_state is None  # nothing to persist: term and vote unchanged
    assert rd.soft_state == SoftState(Role.PRE_CANDIDATE, None, 0)
    # Pre-vote promises nothing about the disk: it leaves at once.
    assert of_type(rd.messages, VoteRequest) == []
    requests = of_type(rd.messages_now, VoteRequest)
    assert {(r.term, r.pre_vote) for r in requests} == {(1, True)}


def test_pre_vote_isolated_node_does_not_inflate_its_term_or_disrupt_on_return() -> None:
    net = Net(3)
    net.elect("n1")
    term = net["n1"].term
    net.isolate("n3")
    net.tick_all(200)
    assert net["n3"].term == term
    assert net["n3"].role is Role.PRE_CANDIDATE
    net.heal()
    net.tick_all(5)
    assert net.leader() == "n1"
    assert net["n1"].term == term
    assert net["n3"].leader == "n1"


def test_pre_vote_granted_answer_carries_the_proposed_term() -> None:
    net = Net(3)
    net["n2"].step(
        VoteRequest(
            group=0, term=1, src="n1", dst="n2", last_log_index=0, last_log_term=0, pre_vote=True
        )
    )
    reply = of_type(net.take("n2"), VoteResponse)[0]
    assert (reply.granted, reply.term, reply.pre_vote) == (True, 1, True)
    assert net["n2"].term == 0  # a pre-vote changes nothing on the voter
    assert net["n2"].vote is None


def test_a_follower_that_grants_a_pre_vote_holds_its_own_campaign() -> None:
    """Granting a pre-vote restarts the voter's election timer and forgets the old leader.

    Without the hold, followers whose timers fire within one pre-vote round trip of
    each other all win their pre-votes and stand together; with four voters the
    real votes then split round after round (simulator seed 4997, before the fix).
    """
    net = Net(4)
    net.elect("n1")
    net.stop("n1")
    voter = net["n2"]
    voter.report_unreachable("n1", gone=True)  # out of the leader's lease, timer still running
    assert (voter.leader, voter.role) == ("n1", Role.FOLLOWER)
    request = functools.partial(
        VoteRequest,
        group=0,
        term=voter.term + 1,
        src="n3",
        dst="n2",
        last_log_index=voter.last_index,
        last_log_term=voter.term,
    )
    voter.step(request(pre_vote=True))
    assert [r.granted for r in of_type(net.take("n2"), VoteResponse)] == [True]
    assert voter.leader is None
    # A full election timeout passes without the voter standing itself ...
    for _ in range(net.config("n2").election_ticks - 1):
        voter.tick()
    assert voter.role is Role.FOLLOWER
    assert of_type(net.take("n2"), VoteRequest) == []
    # ... and the candidate's real request is answered, not taken for a live leader's lease.
    voter.step(request(pre_vote=False))
    assert [r.granted for r in of_type(net.take("n2"), VoteResponse)] == [True]
    assert voter.vote == "n3"


def test_a_pre_candidate_that_grants_a_pre_vote_keeps_its_own_campaign() -> None:
    """Only followers hold: a pre-candidate already asked the others, and its answers count."""
    net = Net(3)
    node = net["n1"]
    for _ in range(20):
        node.tick()
    assert {r.pre_vote for r in of_type(net.take("n1"), VoteRequest)} == {True}
    node.step(
        VoteRequest(
            group=0, term=1, src="n2", dst="n1", last_log_index=0, last_log_term=0, pre_vote=True
        )
    )
    assert [r.granted for r in of_type(net.take("n1"), VoteResponse)] == [True]
    node.step(VoteResponse(group=0, term=1, src="n3", dst="n1", granted=True, pre_vote=True))
    assert node.role is Role.CANDIDATE


def test_pre_vote_refused_to_a_less_up_to_date_log() -> None:
    net = Net(3)
    net.elect("n1")
    net["n1"].propose(b"a")
    net.deliver()
    net["n2"].step(
        VoteRequest(
            group=0,
            term=net["n2"].term + 1,
            src="n3",
            dst="n2",
            last_log_index=1,
            last_log_term=1,
            pre_vote=True,
        )
    )
    # n2 follows a live leader (in lease): it does not even answer.
    assert net.take("n2") == []


def test_pre_vote_win_leads_to_real_election() -> None:
    net = Net(3)
    net.campaign("n1")
    assert net["n1"].role is Role.LEADER
    kinds = [(m.pre_vote, m.term) for m in net.sent if isinstance(m, VoteRequest)]
    assert kinds == [(True, 1), (True, 1), (False, 1), (False, 1)]


def test_pre_vote_loss_returns_to_follower_at_same_term() -> None:
    net = Net(3)
    node = net["n1"]
    for _ in range(20):
        node.tick()
    for src in ("n2", "n3"):
        node.step(VoteResponse(group=0, term=0, src=src, dst="n1", granted=False, pre_vote=True))
    assert node.role is Role.FOLLOWER
    assert node.term == 0


def test_pre_vote_rejection_with_higher_term_makes_pre_candidate_follow() -> None:
    net = Net(3)
    node = net["n1"]
    for _ in range(20):
        node.tick()
    node.step(VoteResponse(group=0, term=5, src="n2", dst="n1", granted=False, pre_vote=True))
    assert (node.role, node.term) == (Role.FOLLOWER, 5)


def test_stale_vote_responses_are_ignored_by_other_roles() -> None:
    net = Net(3)
    leader = net.elect("n1")
    leader.step(VoteResponse(group=0, term=1, src="n2", dst="n1", granted=True))
    leader.step(VoteResponse(group=0, term=2, src="n2", dst="n1", granted=True, pre_vote=True))
    assert leader.role is Role.LEADER


# ---------------------------------------------------------------------------
# Check-quorum
# ---------------------------------------------------------------------------


def test_check_quorum_leader_steps_down_without_hearing_from_a_quorum() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.isolate("n1")
    for _ in range(2 * 10):
        net.tick("n1")
        net.deliver()
    assert leader.role is Role.FOLLOWER
    assert leader.leader is None
    assert leader.propose(b"x") == NotLeader(None)


def test_check_quorum_leader_stays_while_a_quorum_answers() -> None:
    net = Net(5)
    leader = net.elect("n1")
    net.isolate("n4")
    net.isolate("n5")
    for _ in range(50):
        net.tick("n1")
        net.deliver()
    assert leader.role is Role.LEADER


def test_check_quorum_followers_ignore_votes_while_leader_is_live() -> None:
    net = Net(3)
    net.elect("n1")
    follower = net["n2"]
    term = follower.term
    follower.step(
        VoteRequest(group=0, term=term + 5, src="n3", dst="n2", last_log_index=99, last_log_term=99)
    )
    assert follower.term == term
    assert net.take("n2") == []
    # Once the leader has been silent for an election timeout, the vote counts.
    for _ in range(10):
        follower.tick()
    follower.step(
        VoteRequest(group=0, term=term + 5, src="n3", dst="n2", last_log_index=99, last_log_term=99)
    )
    assert follower.term == term + 5
    assert of_type(net.take("n2"), VoteResponse)[0].granted


def test_check_quorum_transfer_flag_overrides_the_lease() -> None:
    net = Net(3)
    net.elect("n1")
    follower = net["n2"]
    follower.step(
        VoteRequest(
            group=0,
            term=follower.term + 1,
            src="n3",
            dst="n2",
            last_log_index=99,
            last_log_term=99,
            transfer=True,
        )
    )
    assert of_type(net.take("n2"), VoteResponse)[0].granted


def test_deposed_leader_steps_down_on_a_reply_from_a_higher_term() -> None:
    net = Net(3)
    old = net.elect("n1")
    net.isolate("n1")
    for _ in range(40):  # n1 is not ticked, so it cannot notice it lost its quorum
        net.tick("n2")
        net.tick("n3")
        net.deliver()
    assert net.leader() in ("n2", "n3") or net["n2"].role is Role.LEADER
    new = net["n2"] if net["n2"].role is Role.LEADER else net["n3"]
    assert old.status().role is Role.LEADER  # has not noticed yet
    net.heal()
    net.tick("n1")
    net.deliver()
    assert old.role is Role.FOLLOWER
    assert old.term == new.term


def test_without_check_quorum_leader_keeps_leading_alone() -> None:
    net = Net(3, check_quorum=False)
    leader = net.elect("n1")
    net.isolate("n1")
    for _ in range(50):
        net.tick("n1")
    assert leader.role is Role.LEADER


# ---------------------------------------------------------------------------
# ReadIndex
# ---------------------------------------------------------------------------


def test_read_index_single_voter_answers_at_once() -> None:
    net = Net(1)
    leader = net.elect("n1")
    leader.propose(b"a")  # not durable yet, so not committed: the read need not see it
    assert leader.read_index(b"r1") is None
    rd = leader.ready()
    assert rd.read_states == (ReadState(b"r1", 1),)


def test_read_index_single_voter_waits_until_its_no_op_is_durable() -> None:
    net = Net(1)
    net.elect("n1")
    net["n1"].propose(b"a")
    net.persist("n1")
    storage = net.storages["n1"]
    storage.set_hard_state(replace(storage.hard_state, commit=0))  # commit is persisted lazily
    node = net.restart("n1")
    for _ in range(40):
        node.tick()
        if node.role is Role.LEADER:
            break
    assert node.role is Role.LEADER and node.commit_index == 0
    node.read_index(b"r1")
    rd = node.ready()
    assert rd.read_states == ()  # its commit index may lag what was committed before
    storage.append(rd.entries)
    assert rd.hard_state is not None
    storage.set_hard_state(rd.hard_state)
    node.advance(rd)
    assert node.ready().read_states == (ReadState(b"r1", 3),)


def test_read_index_leader_confirms_with_a_quorum_heartbeat_round() -> None:
    net = Net(3)
    leader = net.elect("n1")
    leader.propose(b"a")
    net.deliver()
    net.cut.add(("n1", "n3"))
    assert leader.read_index(b"r1") is None
    beats = of_type(net.take("n1"), Heartbeat)
    assert {b.ctx for b in beats} == {b"r1"}
    assert net.reads["n1"] == []
    # n2's answer plus the leader itself make a quorum of 3.
    net.send(*[b for b in beats if b.dst == "n2"])
    net.deliver()
    assert net.reads["n1"] == [ReadState(b"r1", 2)]


def test_read_index_waits_until_leader_commits_an_entry_of_its_term() -> None:
    net = Net(3)
    net.drop = lambda m: isinstance(m, AppendEntries)
    leader = net.elect("n1")
    assert leader.read_index(b"r1") is None
    net.tick_all(3)
    assert net.reads["n1"] == []  # no-op of the new term not committed: commit may lag
    net.heal()
    net.tick_all(3)
    assert net.reads["n1"] == [ReadState(b"r1", 1)]


def test_read_index_follower_forwards_to_leader_and_gets_read_state() -> None:
    net = Net(3)
    net.elect("n1")
    net["n1"].propose(b"a")
    net.deliver()
    assert net["n2"].read_index(b"f1") is None
    request = of_type(net.take("n2"), ReadIndexRequest)[0]
    assert request.dst == "n1"
    net.send(request)
    net.deliver()
    assert net.reads["n2"] == [ReadState(b"f1", 2)]
    assert net.reads["n1"] == []


def test_read_index_without_known_leader_is_not_leader() -> None:
    net = Net(3)
    assert net["n2"].read_index(b"x") == NotLeader(None)


def test_read_index_request_to_non_leader_is_refused_and_refusal_is_silent() -> None:
    net = Net(3)
    net.elect("n1")
    net["n2"].step(ReadIndexRequest(group=0, term=1, src="n3", dst="n2", ctx=b"q"))
    reply = of_type(net.take("n2"), ReadIndexResponse)[0]
    assert reply.index == 0
    net.send(reply)
    assert net.reads["n3"] == []


def test_read_index_batches_reads_into_one_round_and_drops_duplicate_ctx() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    leader.read_index(b"a")
    leader.read_index(b"b")
    leader.read_index(b"b")
    beats = of_type(net.take("n1"), Heartbeat)
    assert len(beats) == 2
    assert {b.ctx for b in beats} == {b"b"}
    net.send(*beats)
    net.deliver()
    assert net.reads["n1"] == [ReadState(b"a", 1), ReadState(b"b", 1)]


def test_read_index_lost_round_is_retried_by_the_next_heartbeat() -> None:
    net = Net(3)
    leader = net.elect("n1")
    leader.read_index(b"r")
    net.take("n1")  # lose the round
    net.tick("n1")
    net.deliver()
    assert net.reads["n1"] == [ReadState(b"r", 1)]


def test_read_index_pending_reads_are_dropped_when_leader_steps_down() -> None:
    net = Net(3)
    leader = net.elect("n1")
    leader.read_index(b"r")
    net.take("n1")
    leader.step(Heartbeat(group=0, term=leader.term + 1, src="n2", dst="n1", commit=0))
    leader.step(HeartbeatResponse(group=0, term=leader.term, src="n2", dst="n1", ctx=b"r"))
    net.persist("n1")
    assert net.reads["n1"] == []


# ---------------------------------------------------------------------------
# Leadership transfer
# ---------------------------------------------------------------------------


def test_transfer_to_up_to_date_follower_sends_timeout_now_and_it_wins() -> None:
    net = Net(3)
    leader = net.elect("n1")
    term = leader.term
    assert leader.transfer_leadership("n2") is None
    assert of_type(net.take("n1"), TimeoutNow)[0].dst == "n2"
    net.send(TimeoutNow(group=0, term=term, src="n1", dst="n2"))
    net.deliver()
    assert net.leader() == "n2"
    assert net["n2"].term == term + 1
    votes = [m for m in net.sent if isinstance(m, VoteRequest) and m.src == "n2"]
    assert votes and all(v.transfer and not v.pre_vote for v in votes)


def test_transfer_to_lagging_follower_catches_it_up_first() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.cut.add(("n1", "n3"))
    for i in range(5):
        leader.propose(b"%d" % i)
    net.deliver()
    net.heal()
    leader.transfer_leadership("n3")
    net.tick_all(6)
    assert net.leader() == "n3"
    assert net.data("n3")[:5] == [b"%d" % i for i in range(5)]


def test_transfer_stops_proposals_and_is_abandoned_after_an_election_timeout() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.isolate("n3")
    leader.propose(b"x")
    net.deliver()
    leader.transfer_leadership("n3")
    transferee = leader.lead_transferee  # (so mypy does not keep the attribute narrowed)
    assert transferee == "n3"
    assert leader.propose(b"y") == NotLeader("n3")
    assert leader.transfer_leadership("n3") is None  # repeated: no change
    for _ in range(10):
        net.tick("n1")
        net.deliver()
    assert leader.lead_transferee is None
    assert leader.role is Role.LEADER
    assert isinstance(leader.propose(b"z"), int)


def test_transfer_requests_that_make_no_sense_are_ignored_or_refused() -> None:
    net = Net(3, learners=("l1",))
    leader = net.elect("n1")
    assert leader.transfer_leadership("n1") is None
    assert leader.transfer_leadership("l1") is None
    assert leader.transfer_leadership("nobody") is None
    assert leader.lead_transferee is None
    assert net["n2"].transfer_leadership("n3") == NotLeader("n1")


def test_timeout_now_is_ignored_by_learners_and_leaders() -> None:
    net = Net(3, learners=("l1",))
    leader = net.elect("n1")
    net["l1"].step(TimeoutNow(group=0, term=leader.term, src="n1", dst="l1"))
    leader.step(TimeoutNow(group=0, term=leader.term, src="n2", dst="n1"))
    assert net["l1"].role is Role.LEARNER
    assert leader.role is Role.LEADER


# ---------------------------------------------------------------------------
# Fast backtracking
# ---------------------------------------------------------------------------


def diverged_net(follower_terms: list[int], leader_terms: list[int]) -> Net:
    net = Net(3, check_quorum=False)
    top = max(follower_terms + leader_terms)
    for n, terms in (("n1", leader_terms), ("n2", follower_terms), ("n3", leader_terms)):
        net.storages[n].append([Entry(i, t, b"") for i, t in enumerate(terms, start=1)])
        net.storages[n].set_hard_state(HardState(top, None, 0))
        net.start(n)
    return net


def rejections_from(net: Net, n: str) -> list[AppendEntriesResponse]:
    return [m for m in net.sent if isinstance(m, AppendEntriesResponse) and m.src == n and m.reject]


def test_fast_backtracking_skips_a_whole_conflicting_term_in_one_round_trip() -> None:
    # n2 has 50 entries of term 2 the leader never had; the leader has 30 of term 3.
    net = diverged_net([1] * 5 + [2] * 50, [1] * 5 + [3] * 30)
    leader = net.elect("n1")
    leader.propose(b"x")
    net.deliver()
    assert len(rejections_from(net, "n2")) == 1
    assert net.storages["n2"].last_index() == leader.last_index
    assert net.storages["n2"].term(6) == 3


def test_fast_backtracking_shorter_follower_log_hints_its_last_index() -> None:
    net = diverged_net([1] * 3, [1] * 40)
    leader = net.elect("n1")
    net.deliver()
    rejections = rejections_from(net, "n2")
    assert [(r.hint_index, r.hint_term) for r in rejections] == [(3, 0)]
    assert net.storages["n2"].last_index() == leader.last_index


def test_fast_backtracking_leader_with_many_terms_converges_in_few_rounds() -> None:
    leader_terms = [1] * 5 + [2] * 5 + [4] * 5 + [6] * 5
    follower_terms = [1] * 5 + [2] * 3 + [3] * 10 + [5] * 10
    net = diverged_net(follower_terms, leader_terms)
    leader = net.elect("n1")
    net.deliver()
    # One round trip per term skipped on either side, not one per entry.
    assert len(rejections_from(net, "n2")) <= 3
    assert [net.storages["n2"].term(i) for i in range(1, leader.last_index + 1)] == [
        *leader_terms,
        leader.term,
    ]


def test_stale_rejections_are_ignored() -> None:
    net = Net(3)
    leader = net.elect("n1")
    leader.propose(b"a")
    net.deliver()
    before = leader.status().progress["n2"]
    leader.step(
        AppendEntriesResponse(
            group=0, term=leader.term, src="n2", dst="n1", reject=True, index=1, hint_index=0
        )
    )
    assert leader.status().progress["n2"] == before


# ---------------------------------------------------------------------------
# Snapshots in chunks
# ---------------------------------------------------------------------------


IMAGE = bytes(range(256)) * 40  # 10240 bytes


def compacted_net(chunk: int = 1000) -> Net:
    """n1 leads, n3 missed 10 entries that n1 has compacted into a snapshot."""
    net = Net(3, snapshot_chunk_bytes=chunk)
    leader = net.elect("n1")
    net.isolate("n3")
    for i in range(10):
        leader.propose(b"%d" % i)
    net.deliver()
    storage = net.storages["n1"]
    storage.create_snapshot(leader.commit_index, ConfState(net.voters), IMAGE)
    storage.compact(leader.commit_index)
    return net


def test_snapshot_sent_in_chunks_and_reassembled_on_follower() -> None:
    net = compacted_net()
    net.heal()
    net.tick_all(6)
    chunks = [m for m in net.sent if isinstance(m, InstallSnapshot)]
    assert len(chunks) == 11
    assert [c.offset for c in chunks] == list(range(0, 10240, 1000))
    assert [c.done for c in chunks] == [False] * 10 + [True]
    (snap,) = net.snapshots["n3"]
    assert snap.data == IMAGE
    assert snap.meta.index == 11
    assert net["n3"].commit_index == net["n1"].commit_index
    # Replication resumes after the snapshot.
    net["n1"].propose(b"after")
    net.tick_all(2)
    assert net.data("n3") == [b"after"]


def test_snapshot_transfer_keeps_heartbeats_flowing() -> None:
    net = compacted_net()
    net.heal()
    net.drop = lambda m: isinstance(m, InstallSnapshotResponse)  # stall the transfer
    for _ in range(30):
        net.tick_all()
    assert net["n1"].role is Role.LEADER
    assert net["n3"].role is Role.FOLLOWER and net["n3"].leader == "n1"
    assert net["n1"].status().progress["n3"].snapshot_pending
    net.heal()
    net.tick_all(20)
    assert net.snapshots["n3"][-1].data == IMAGE


def test_snapshot_chunk_at_unexpected_offset_is_rejected_and_restarts() -> None:
    net = compacted_net()
    net.heal()
    net.drop = lambda m: isinstance(m, InstallSnapshot) and m.offset == 2000 and m.dst == "n3"
    net.tick("n1")
    net.deliver()
    net.heal()
    # The lost chunk is noticed through stalled heartbeats and resent.
    net.tick_all(10)
    assert net.snapshots["n3"][-1].data == IMAGE


def test_snapshot_follower_answers_out_of_order_and_duplicate_chunks() -> None:
    net = Net(3)
    net.elect("n1")
    net.deliver()
    follower = net["n3"]
    term = follower.term
    meta = net.storages["n1"].create_snapshot(1, ConfState(net.voters), b"").meta
    from dlm.records import SnapshotMeta

    meta = SnapshotMeta(50, term, ConfState(net.voters))

    def chunk(offset: int, data: bytes, done: bool = False) -> InstallSnapshot:
        return InstallSnapshot(
            group=0, term=term, src="n1", dst="n3", meta=meta, offset=offset, data=data, done=done
        )

    def answer(msg: InstallSnapshot) -> InstallSnapshotResponse:
        follower.step(msg)
        return of_type(net.take("n3"), InstallSnapshotResponse)[-1]

    assert answer(chunk(4, b"xxxx")).reject  # nothing received yet
    assert answer(chunk(0, b"abcd")).next_offset == 4
    assert answer(chunk(0, b"abcd")).next_offset == 4  # duplicate first chunk
    assert answer(chunk(2, b"cd")).next_offset == 4  # duplicate tail
    assert answer(chunk(8, b"ijkl")).reject  # a gap: start again
    assert answer(chunk(0, b"abcd")).next_offset == 4
    done = answer(chunk(4, b"efgh", done=True))
    assert (done.next_offset, done.index, done.reject) == (8, 50, False)
    net.persist("n3")
    assert net.snapshots["n3"][-1].data == b"abcdefgh"
    assert follower.commit_index == 50
    # A retransmission after install is acknowledged as done.
    again = answer(chunk(4, b"efgh", done=True))
    assert (again.index, again.next_offset, again.reject) == (50, 8, False)


def test_snapshot_receiver_restart_loses_partial_and_transfer_restarts() -> None:
    net = compacted_net()
    net.heal()
    net.drop = lambda m: isinstance(m, InstallSnapshot) and m.offset >= 3000
    net.tick_all(6)
    assert net["n3"]._snap_receipt is not None and net["n3"]._snap_receipt.size == 3000
    net.restart("n3")
    net.heal()
    net.tick_all(12)
    assert net.snapshots["n3"][-1].data == IMAGE
    assert any(isinstance(m, InstallSnapshotResponse) and m.reject for m in net.sent), (
        "the restarted follower should have asked for a restart"
    )


def test_snapshot_whose_last_entry_we_hold_only_fast_forwards_commit() -> None:
    net = Net(3)
    net.elect("n1")
    net["n1"].propose(b"a")
    net.deliver()
    follower = net["n2"]
    follower.step(
        AppendEntries(
            group=0,
            term=follower.term,
            src="n1",
            dst="n2",
            prev_index=2,
            prev_term=follower.term,
            entries=(),
            commit=0,
        )
    )
    net.take("n2")
    hold = net.storages["n2"].entries(1, 3)
    meta = net.storages["n1"].create_snapshot(2, ConfState(net.voters), b"img").meta
    follower._log.committed = 1  # pretend it learnt only index 1 so far
    follower.step(
        InstallSnapshot(
            group=0,
            term=follower.term,
            src="n1",
            dst="n2",
            meta=meta,
            offset=0,
            data=b"img",
            done=True,
        )
    )
    net.persist("n2")
    assert follower.commit_index == 2
    assert net.snapshots["n2"] == []
    assert net.storages["n2"].entries(1, 3) == hold


def test_empty_snapshot_image_installs_in_one_empty_chunk() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.isolate("n3")
    leader.propose(b"x")
    net.deliver()
    net.storages["n1"].create_snapshot(2, ConfState(net.voters), b"")
    net.storages["n1"].compact(2)
    net.heal()
    net.tick_all(6)
    assert net.snapshots["n3"][-1].data == b""
    assert net["n3"].commit_index == 2


# ---------------------------------------------------------------------------
# In-flight window, probe mode, batching
# ---------------------------------------------------------------------------


def appends_to(msgs: list[Message], dst: str) -> list[AppendEntries]:
    return [m for m in of_type(msgs, AppendEntries) if m.dst == dst and m.entries]


def test_inflight_window_bounds_unacknowledged_appends_per_follower() -> None:
    net = Net(3, max_inflight=3)
    leader = net.elect("n1")
    held = []
    for i in range(10):
        leader.propose(b"%d" % i)
        held += appends_to(net.take("n1"), "n2")
    assert len(held) == 3  # the window is full; the rest waits for acks
    net.send(held[0])
    net.send(*of_type(net.take("n2"), AppendEntriesResponse))
    more = appends_to(net.take("n1"), "n2")
    assert len(more) == 1  # one ack frees one slot
    assert more[0].entries[0].data == b"3"


def test_probe_mode_sends_one_message_until_the_follower_answers() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    leader.report_unreachable("n2")
    sent = []
    for i in range(5):
        leader.propose(b"%d" % i)
        sent += appends_to(net.take("n1"), "n2")
    assert len(sent) == 1
    net.send(sent[0])
    net.send(*of_type(net.take("n2"), AppendEntriesResponse))
    # Acknowledged: back to streaming, the rest goes at once.
    rest = appends_to(net.take("n1"), "n2")
    assert len(rest) == 1 and len(rest[0].entries) == 4


def test_lost_appends_in_replicate_mode_are_recovered_by_heartbeats() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    leader.propose(b"lost")
    net.take("n1")
    for _ in range(6):
        net.tick("n1")
        net.deliver()
    assert net.data("n2") == [b"lost"]


def test_batching_proposals_between_two_readies_leave_as_one_message_per_follower() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    for i in range(100):
        leader.propose(b"%d" % i)
    rd = leader.ready()
    assert rd.messages == ()  # a leader's appends leave while it persists them itself
    appends = of_type(rd.messages_now, AppendEntries)
    assert sorted(m.dst for m in appends) == ["n2", "n3"]
    assert all(len(m.entries) == 100 for m in appends)
    assert len(rd.entries) == 100


def test_batching_respects_max_entries_bytes_and_pipelines_the_rest() -> None:
    net = Net(3, max_entries_bytes=1000)
    leader = net.elect("n1")
    net.deliver()
    for _ in range(10):
        leader.propose(b"x" * 300)
    rd = leader.ready()
    to_n2 = [m for m in of_type(rd.messages_now, AppendEntries) if m.dst == "n2"]
    assert [len(m.entries) for m in to_n2] == [3, 3, 3, 1]
    assert [m.prev_index for m in to_n2] == [1, 4, 7, 10]


def test_commit_advance_is_announced_to_followers() -> None:
    net = Net(3)
    leader = net.elect("n1")
    leader.propose(b"a")
    net.deliver()
    assert net["n2"].commit_index == leader.commit_index == 2


def test_heartbeat_carries_commit_capped_at_follower_match() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.cut.add(("n1", "n3"))
    leader.propose(b"a")
    net.deliver()
    net.heal()
    net.tick("n1")
    beats = {m.dst: m.commit for m in of_type(net.take("n1"), Heartbeat)}
    assert beats == {"n2": 2, "n3": 1}


# ---------------------------------------------------------------------------
# Learners, status, restart, Ready bookkeeping
# ---------------------------------------------------------------------------


def test_learner_receives_entries_but_never_votes_for_quorum_or_campaigns() -> None:
    net = Net(3, learners=("l1",))
    leader = net.elect("n1")
    assert net["l1"].role is Role.LEARNER
    net.isolate("n2")
    net.isolate("n3")
    leader.propose(b"a")
    net.tick_all(3)
    assert leader.commit_index == 1  # the learner's copy does not make a quorum
    assert net.storages["l1"].last_index() == 2
    for _ in range(100):
        net.tick("l1")
    assert net["l1"].role is Role.LEARNER


def test_empty_storage_bootstraps_membership_from_config() -> None:
    storages = {n: MemoryStorage() for n in ("a", "b", "c")}
    nodes = {
        n: RaftNode(Config(n, ("a", "b", "c")), storages[n], random.Random(n)) for n in storages
    }
    assert nodes["a"].voters == ("a", "b", "c")
    for _ in range(40):
        nodes["a"].tick()
        rd = nodes["a"].ready()
        pending = [*rd.messages_now, *rd.messages]
        while pending:
            m = pending.pop(0)
            nodes[m.dst].step(m)
            rd = nodes[m.dst].ready()
            pending += [*rd.messages_now, *rd.messages]
        if nodes["a"].role is Role.LEADER:
            break
    assert nodes["a"].role is Role.LEADER


def test_report_unreachable_moves_a_streaming_follower_to_probe_only_on_the_leader() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    net["n2"].report_unreachable("n1", gone=True)  # a follower: only brings its election closer
    leader.report_unreachable("n1")  # ourselves: nothing to do
    leader.report_unreachable("n2")
    leader.propose(b"a")
    leader.propose(b"b")
    net.deliver()
    assert leader.status().progress["n2"].match == 3


def test_followers_that_lost_their_link_to_a_dead_leader_elect_another_within_a_timeout() -> None:
    net = Net(3)
    old = net.elect("n1")
    net.deliver()
    term = old.term
    net.isolate("n1")  # killed: nothing more from it
    for follower in ("n2", "n3"):
        net[follower].report_unreachable("n1", gone=True)
    ticks = old._cfg.election_ticks
    new = []
    for _ in range(ticks):
        net.tick("n2")
        net.tick("n3")
        net.deliver()
        new = [n for n in ("n2", "n3") if net[n].role is Role.LEADER]
        if new:
            break
    assert new, f"no new leader within {ticks} ticks"
    assert net[new[0]].term == term + 1  # no split vote on the way


def test_a_follower_wrongly_told_its_live_leader_is_gone_disrupts_nothing() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    term = leader.term
    net["n2"].report_unreachable("n1", gone=True)
    net.cut.add(("n1", "n2"))  # n2 hears nothing from the leader; n3 still does
    net.tick_all(3 * leader._cfg.election_ticks)
    assert leader.role is Role.LEADER and leader.term == term
    assert net["n3"].term == term


def test_connections_that_all_break_while_the_leader_lives_depose_nobody() -> None:
    # A NAT or firewall drops its table: every follower's link to the leader breaks at
    # once and the leader is silent while the links redial (here: most of an election
    # timeout), but its process is alive, so nobody was told it is gone.
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    term = leader.term
    for follower in ("n2", "n3"):
        net[follower].report_unreachable("n1")
        net.cut.add(("n1", follower))
    for _ in range(leader._cfg.election_ticks - 1):
        net.tick_all()
        net.deliver()
    net.heal()
    net.tick_all(3 * leader._cfg.election_ticks)
    assert leader.role is Role.LEADER and leader.term == term
    assert {net["n2"].term, net["n3"].term} == {term}


def test_status_reports_progress_only_on_the_leader() -> None:
    net = Net(3)
    leader = net.elect("n1")
    net.deliver()
    status = leader.status()
    assert status.role is Role.LEADER and status.leader == "n1"
    assert status.voters == ("n1", "n2", "n3")
    assert set(status.progress) == {"n1", "n2", "n3"}
    assert (status.first_index, status.last_index, status.commit) == (1, 1, 1)
    assert net["n2"].status().progress == {}
    assert "leader" in repr(leader)


def test_ready_reports_soft_state_changes_once() -> None:
    net = Net(3)
    net.elect("n1")
    softs = [rd.soft_state for rd in net.readies["n1"] if rd.soft_state is not None]
    assert [s.role for s in softs] == [Role.PRE_CANDIDATE, Role.CANDIDATE, Role.LEADER]
    assert net["n1"].ready().soft_state is None


def test_step_and_ready_interleave_with_unadvanced_entries() -> None:
    """A runtime may keep stepping while a Ready is being persisted."""
    net = Net(1)
    leader = net.elect("n1")
    leader.propose(b"a")
    first = leader.ready()
    leader.propose(b"b")  # arrives before advance(first)
    net.storages["n1"].append(first.entries)
    leader.advance(first)
    second = leader.ready()
    assert [e.data for e in second.entries] == [b"b"]
    assert [e.data for e in second.committed] == [b"a"]
    net.storages["n1"].append(second.entries)
    leader.advance(second)
    assert [e.data for e in leader.ready().committed] == [b"b"]


def test_follower_entries_overwritten_before_advance_are_not_marked_stable() -> None:
    node = RaftNode(
        Config("n1", ("n1", "n2", "n3")),
        MemoryStorage(ConfState(("n1", "n2", "n3"))),
        random.Random(1),
    )

    def append(term: int, prev: tuple[int, int], entries: list[Entry]) -> None:
        node.step(
            AppendEntries(
                group=0,
                term=term,
                src="n2",
                dst="n1",
                prev_index=prev[0],
                prev_term=prev[1],
                entries=tuple(entries),
                commit=0,
            )
        )

    append(1, (0, 0), [Entry(1, 1), Entry(2, 1)])
    first = node.ready()
    append(2, (1, 1), [Entry(2, 2, b"new")])  # overwrites index 2 before advance
    node.advance(first)
    second = node.ready()
    assert second.entries == (Entry(2, 2, b"new"),)
    assert node.last_index == 2


def test_weird_but_typed_messages_do_not_raise() -> None:
    net = Net(3)
    leader = net.elect("n1")
    t = leader.term
    weird: list[Message] = [
        AppendEntriesResponse(group=0, term=t, src="n2", dst="n1", reject=False, index=999),
        AppendEntriesResponse(group=0, term=t, src="zz", dst="n1", reject=False, index=1),
        AppendEntriesResponse(
            group=0, term=t, src="n2", dst="n1", reject=True, index=0, hint_index=99, hint_term=9
        ),
        InstallSnapshotResponse(group=0, term=t, src="n2", dst="n1", index=5, next_offset=3),
        HeartbeatResponse(group=0, term=t, src="n1", dst="n1", ctx=b"??"),
        ReadIndexResponse(group=0, term=t, src="n2", dst="n1", ctx=b"x", index=3),
        Heartbeat(group=0, term=t, src="n2", dst="n1", commit=50),
        AppendEntries(
            group=0, term=t, src="n2", dst="n1", prev_index=0, prev_term=0, entries=(), commit=9
        ),
    ]
    for m in weird:
        leader.step(m)
    net.deliver()
    assert leader.role is Role.LEADER
    assert net.reads["n1"] == []
    follower = net["n2"]
    follower.step(HeartbeatResponse(group=0, term=t, src="n1", dst="n2"))
    follower.step(AppendEntriesResponse(group=0, term=t, src="n1", dst="n2", reject=False, index=1))
    follower.step(
        InstallSnapshotResponse(group=0, term=t, src="n1", dst="n2", index=1, next_offset=0)
    )
    follower.step(VoteResponse(group=0, term=t, src="n3", dst="n2", granted=True))
    net.deliver()
    assert net.leader() == "n1"


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        Config("n1", ("n1",), election_ticks=1, heartbeat_ticks=1).validate()
    with pytest.raises(ValueError):
        Config("n1", ("n1",), heartbeat_ticks=0).validate()
    with pytest.raises(ValueError):
        Config("n1", ("n1",), max_inflight=0).validate()
    with pytest.raises(ValueError):
        Config("n1", ("n1",), snapshot_chunk_bytes=0).validate()
