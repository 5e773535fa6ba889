"""One test (or more) per rule of Figure 2 of the Raft paper, named after the rule.

These run plain Raft (no pre-vote, no check-quorum) unless a rule needs more,
so that each test exercises the paper's sentence and nothing else.
"""

from __future__ import annotations

import random
from typing import Unpack

from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import ConfState, Entry, HardState, SnapshotMeta

from .harness import Net, RaftOptions, of_type

PLAIN: RaftOptions = {"pre_vote": False, "check_quorum": False}


def node_with_log(
    terms: list[int],
    *,
    term: int = 0,
    vote: str | None = None,
    node_id: str = "n1",
    **cfg: Unpack[RaftOptions],
) -> tuple[RaftNode, MemoryStorage]:
    """A follower n1 of {n1,n2,n3} whose log holds entries with ``terms`` (index 1..)."""
    storage = MemoryStorage(ConfState(("n1", "n2", "n3")))
    storage.append([Entry(i, t, b"e%d" % i) for i, t in enumerate(terms, start=1)])
    storage.set_hard_state(HardState(max([term, *terms]), vote, 0))
    options: RaftOptions = {**PLAIN, **cfg}
    node = RaftNode(Config(node_id, ("n1", "n2", "n3"), **options), storage, random.Random(7))
    return node, storage


def drain(node: RaftNode, storage: MemoryStorage | None = None) -> list[Message]:
    msgs: list[Message] = []
    while node.has_ready():
        rd = node.ready()
        msgs.extend(rd.messages_now)
        if storage is not None:
            if rd.snapshot is not None:
                storage.apply_snapshot(rd.snapshot)
            storage.append(rd.entries)
            if rd.hard_state is not None:
                storage.set_hard_state(rd.hard_state)
        msgs.extend(rd.messages)
        node.advance(rd)
    return msgs


def append(
    term: int, prev_index: int, prev_term: int, entries: list[Entry], commit: int = 0
) -> AppendEntries:
    return AppendEntries(
        group=0,
        term=term,
        src="n2",
        dst="n1",
        prev_index=prev_index,
        prev_term=prev_term,
        entries=tuple(entries),
        commit=commit,
    )


def vote_request(term: int, last_index: int, last_term: int, src: str = "n2") -> VoteRequest:
    return VoteRequest(
        group=0, term=term, src=src, dst="n1", last_log_index=last_index, last_log_term=last_term
    )


def log_terms(node: RaftNode, storage: MemoryStorage) -> list[int]:
    drain(node, storage)
    return [storage.term(i) for i in range(1, storage.last_index() + 1)]


# ---------------------------------------------------------------------------
# Persistent state on all servers
# ---------------------------------------------------------------------------


def test_persistent_state_vote_is_in_the_same_ready_as_the_granting_response() -> None:
    node, _ = node_with_log([1], term=1)
    node.step(vote_request(2, 1, 1))
    rd = node.ready()
    assert rd.hard_state == HardState(2, "n2", 0)
    assert of_type(rd.messages, VoteResponse)[0].granted


def test_persistent_state_survives_restart() -> None:
    net = Net(3, **PLAIN)
    net.elect("n1")
    net["n1"].propose(b"a")
    net.deliver()
    hard, _ = net.storages["n2"].initial_state()
    restarted = net.restart("n2")
    assert (restarted.term, restarted.vote, restarted.commit_index) == (
        hard.term,
        hard.vote,
        hard.commit,
    )
    # It replays committed entries after the (empty) snapshot.
    net.persist("n2")
    assert net.data("n2") == [b"a"]


# ---------------------------------------------------------------------------
# Rules for servers: all servers
# ---------------------------------------------------------------------------


def test_rules_for_servers_all_if_commit_index_greater_than_last_applied_apply_in_order() -> None:
    net = Net(3, **PLAIN)
    leader = net.elect("n1")
    indexes = [leader.propose(b"c%d" % i) for i in range(5)]
    net.deliver()
    net.tick_all(2)
    for n in net.nodes:
        applied = [e.index for e in net.applied[n]]
        assert applied == sorted(applied) == list(range(1, len(applied) + 1))
        assert net.data(n) == [b"c%d" % i for i in range(5)]
        assert net[n].applied_index == indexes[-1]


def test_rules_for_servers_all_if_rpc_term_greater_convert_to_follower() -> None:
    higher: list[Message] = [
        append(5, 0, 0, []),
        Heartbeat(group=0, term=5, src="n2", dst="n1", commit=0),
        vote_request(5, 0, 0),
        VoteResponse(group=0, term=5, src="n2", dst="n1", granted=False),
        AppendEntriesResponse(group=0, term=5, src="n2", dst="n1", reject=True, index=0),
        HeartbeatResponse(group=0, term=5, src="n2", dst="n1"),
    ]
    for role in (Role.FOLLOWER, Role.CANDIDATE, Role.LEADER):
        for msg in higher:
            net = Net(3, **PLAIN)
            if role is Role.LEADER:
                net.elect("n1")
            elif role is Role.CANDIDATE:
                net.cut.update({("n1", "n2"), ("n1", "n3")})
                net.campaign("n1")
            node = net["n1"]
            assert node.role is role
            node.step(msg)
            assert node.role is Role.FOLLOWER, (role, msg)
            assert node.term == 5
            expect_leader = "n2" if isinstance(msg, (AppendEntries, Heartbeat)) else None
            assert node.leader == expect_leader


def test_rules_for_servers_all_higher_term_is_persisted_before_the_reply() -> None:
    node, _ = node_with_log([1], term=1)
    node.step(append(3, 1, 1, []))
    rd = node.ready()
    assert rd.hard_state is not None and rd.hard_state.term == 3
    assert of_type(rd.messages, AppendEntriesResponse)[0].term == 3


# ---------------------------------------------------------------------------
# Rules for servers: followers
# ---------------------------------------------------------------------------


def test_rules_for_followers_respond_to_rpcs_from_candidates_and_leaders() -> None:
    node, _ = node_with_log([], term=1)
    node.step(Heartbeat(group=0, term=1, src="n2", dst="n1", commit=0))
    node.step(vote_request(2, 0, 0, src="n3"))
    msgs = drain(node)
    assert of_type(msgs, HeartbeatResponse)[0].dst == "n2"
    assert of_type(msgs, VoteResponse)[0].dst == "n3"


def test_rules_for_followers_election_timeout_without_leader_contact_converts_to_candidate() -> (
    None
):
    node, _ = node_with_log([], term=1)
    for _ in range(2 * 10):
        node.tick()
    assert node.role is Role.CANDIDATE
    assert node.term == 2


def test_rules_for_followers_leader_contact_resets_the_election_timer() -> None:
    node, _ = node_with_log([], term=1)
    for _ in range(100):
        node.tick()
        node.step(Heartbeat(group=0, term=1, src="n2", dst="n1", commit=0))
    assert node.role is Role.FOLLOWER
    assert node.leader == "n2"


def test_rules_for_followers_granting_a_vote_resets_the_election_timer() -> None:
    node, _ = node_with_log([], term=1)
    for _ in range(9):
        node.tick()
    node.step(vote_request(2, 0, 0))
    for _ in range(9):
        node.tick()
    assert node.role is Role.FOLLOWER


def test_election_timeout_is_randomized_between_one_and_two_election_timeouts() -> None:
    timeouts = set()
    for seed in range(60):
        storage = MemoryStorage(ConfState(("n1", "n2", "n3")))
        node = RaftNode(Config("n1", ("n1", "n2", "n3"), **PLAIN), storage, random.Random(seed))
        ticks = 0
        while node.role is Role.FOLLOWER:
            node.tick()
            ticks += 1
        timeouts.add(ticks)
    assert min(timeouts) >= 10
    assert max(timeouts) < 20
    assert len(timeouts) > 3


# ---------------------------------------------------------------------------
# Rules for servers: candidates
# ---------------------------------------------------------------------------


def test_rules_for_candidates_on_conversion_increment_term_vote_for_self_request_votes() -> None:
    node, _ = node_with_log([1, 1], term=1)
    for _ in range(20):
        node.tick()
    rd = node.ready()
    assert node.role is Role.CANDIDATE
    assert rd.hard_state == HardState(2, "n1", 0)
    requests = of_type(rd.messages, VoteRequest)
    assert sorted(r.dst for r in requests) == ["n2", "n3"]
    assert all((r.term, r.last_log_index, r.last_log_term) == (2, 2, 1) for r in requests)
    assert not any(r.pre_vote for r in requests)


def test_rules_for_candidates_votes_from_majority_become_leader() -> None:
    net = Net(5, **PLAIN)
    net.cut.update({("n1", "n4"), ("n1", "n5")})
    leader = net.elect("n1")
    assert leader.role is Role.LEADER
    assert {net[n].leader for n in ("n2", "n3")} == {"n1"}


def test_rules_for_candidates_majority_of_rejections_return_to_follower() -> None:
    node, _ = node_with_log([], term=1)
    for _ in range(20):
        node.tick()
    for src in ("n2", "n3"):
        node.step(VoteResponse(group=0, term=2, src=src, dst="n1", granted=False))
    assert node.role is Role.FOLLOWER
    assert node.term == 2


def test_rules_for_candidates_append_entries_from_new_leader_convert_to_follower() -> None:
    node, _ = node_with_log([], term=1)
    for _ in range(20):
        node.tick()
    # A status() snapshot: mypy would keep node.role narrowed past the step below.
    assert node.status().role is Role.CANDIDATE
    node.step(append(2, 0, 0, []))
    assert node.role is Role.FOLLOWER
    assert node.leader == "n2"
    assert node.term == 2


def test_rules_for_candidates_election_timeout_starts_new_election() -> None:
    node, _ = node_with_log([], term=1)
    for _ in range(20):
        node.tick()
    assert node.term == 2
    for _ in range(20):
        node.tick()
    assert node.role is Role.CANDIDATE
    assert node.term == 3


# ---------------------------------------------------------------------------
# Rules for servers: leaders
# ---------------------------------------------------------------------------


def test_rules_for_leaders_upon_election_send_append_entries_to_each_server() -> None:
    net = Net(3, **PLAIN)
    net.cut.update({("n1", "n2"), ("n1", "n3")})
    net.campaign("n1")  # its vote requests are lost
    net.cut.clear()
    node = net["n1"]
    for src in ("n2", "n3"):
        node.step(VoteResponse(group=0, term=node.term, src=src, dst="n1", granted=True))
    assert node.role is Role.LEADER
    msgs = net.take("n1")
    appends = of_type(msgs, AppendEntries)
    assert sorted(m.dst for m in appends) == ["n2", "n3"]
    # Raft 8: the new leader's first entry is an empty no-op of its own term.
    assert all(m.entries == (Entry(1, node.term, b""),) for m in appends)


def test_rules_for_leaders_repeat_heartbeats_during_idle_periods() -> None:
    net = Net(3, **PLAIN)
    net.elect("n1")
    for _ in range(5):
        net.tick("n1")
        beats = of_type(net.take("n1"), Heartbeat)
        assert sorted(m.dst for m in beats) == ["n2", "n3"]


def test_rules_for_leaders_client_command_appended_and_committed_after_majority() -> None:
    net = Net(3, **PLAIN)
    leader = net.elect("n1")
    net.cut.update({("n1", "n3")})
    index = leader.propose(b"cmd")
    assert index == 2
    assert leader.commit_index == 1
    net.deliver()
    assert leader.commit_index == 2
    assert net.data("n1") == [b"cmd"]


def test_rules_for_leaders_last_log_index_ge_next_index_send_entries_from_next_index() -> None:
    net = Net(3, **PLAIN)
    leader = net.elect("n1")
    leader.propose(b"a")
    leader.propose(b"b")
    msgs = of_type(net.take("n1"), AppendEntries)
    assert {m.dst for m in msgs} == {"n2", "n3"}
    for m in msgs:
        assert m.prev_index == 1
        assert [e.data for e in m.entries] == [b"a", b"b"]


def test_rules_for_leaders_successful_append_updates_next_index_and_match_index() -> None:
    net = Net(3, **PLAIN)
    leader = net.elect("n1")
    leader.propose(b"a")
    net.deliver()
    progress = leader.status().progress
    assert (progress["n2"].match, progress["n2"].next) == (2, 3)
    assert (progress["n3"].match, progress["n3"].next) == (2, 3)


def test_rules_for_leaders_failed_append_decrements_next_index_and_retries() -> None:
    # n2 holds entries of term 2 at indexes 3-4 that the leader's log (term 3 at 3) lacks.
    net = Net(3, **PLAIN)
    for n, terms in (("n1", [1, 1, 3]), ("n2", [1, 1, 2, 2]), ("n3", [1, 1, 3])):
        net.storages[n].append([Entry(i, t, b"%d" % t) for i, t in enumerate(terms, start=1)])
        net.storages[n].set_hard_state(HardState(3, None, 0))
        net.start(n)
    leader = net.elect("n1")
    leader.propose(b"x")
    net.deliver()
    terms = [net.storages["n2"].term(i) for i in range(1, net.storages["n2"].last_index() + 1)]
    assert terms == [1, 1, 3, 4, 4]
    rejection = next(
        m for m in net.sent if isinstance(m, AppendEntriesResponse) and m.src == "n2" and m.reject
    )
    assert (rejection.index, rejection.hint_index, rejection.hint_term) == (3, 3, 2)
    assert leader.status().progress["n2"].match == 5


def test_rules_for_leaders_commit_only_entries_of_the_current_term_by_counting() -> None:
    """Figure 8: a replicated entry of an earlier term must not commit by counting alone."""
    net = Net(3, **PLAIN)
    for n in ("n1", "n2"):
        net.storages[n].append([Entry(1, 1, b"a"), Entry(2, 2, b"old-term")])
        net.storages[n].set_hard_state(HardState(3, None, 1))
    net.storages["n3"].append([Entry(1, 1, b"a")])
    net.storages["n3"].set_hard_state(HardState(3, None, 1))
    for n in net.nodes:
        net.start(n)
    # n1 wins term 4 but its no-op never reaches anyone.
    net.drop = lambda m: isinstance(m, AppendEntries)
    leader = net.elect("n1")
    assert leader.term == 4
    # n2 already holds index 2 (term 2): simulate its ack of index 2 only.
    leader.step(AppendEntriesResponse(group=0, term=4, src="n2", dst="n1", reject=False, index=2))
    assert leader.commit_index == 1, "index 2 is from term 2: counting replicas must not commit it"
    leader.step(AppendEntriesResponse(group=0, term=4, src="n2", dst="n1", reject=False, index=3))
    assert leader.commit_index == 3, "the term-4 no-op commits, and index 2 with it"


# ---------------------------------------------------------------------------
# AppendEntries RPC, receiver implementation
# ---------------------------------------------------------------------------


def test_append_entries_reply_false_if_term_lt_current_term() -> None:
    node, _ = node_with_log([1, 2], term=3)
    node.step(append(2, 2, 2, [Entry(3, 2)]))
    msgs = drain(node)
    # The stale leader gets our term (and will step down); nothing was appended.
    assert [m.term for m in msgs] == [3]
    assert node.last_index == 2


def test_append_entries_reply_false_if_log_doesnt_contain_prev_index_with_prev_term() -> None:
    node, _ = node_with_log([1, 1, 2], term=2)
    node.step(append(3, 3, 3, [Entry(4, 3)]))
    node.step(append(3, 5, 3, [Entry(6, 3)]))
    replies = of_type(drain(node), AppendEntriesResponse)
    assert [(r.reject, r.index) for r in replies] == [(True, 3), (True, 5)]
    assert node.last_index == 3


def test_append_entries_conflicting_entry_deletes_it_and_all_that_follow() -> None:
    node, storage = node_with_log([1, 1, 2, 2, 2], term=2)
    node.step(append(3, 2, 1, [Entry(3, 3, b"new")]))
    assert log_terms(node, storage) == [1, 1, 3]
    assert storage.entries(3, 4)[0].data == b"new"


def test_append_entries_append_any_new_entries_not_already_in_the_log() -> None:
    node, storage = node_with_log([1, 1], term=1)
    node.step(append(1, 1, 1, [Entry(2, 1, b"e2"), Entry(3, 1, b"e3"), Entry(4, 1, b"e4")]))
    reply = of_type(drain(node, storage), AppendEntriesResponse)[0]
    assert (reply.reject, reply.index) == (False, 4)
    assert log_terms(node, storage) == [1, 1, 1, 1]


def test_append_entries_stale_message_does_not_truncate_matching_entries() -> None:
    node, storage = node_with_log([1, 1, 1, 1], term=1)
    node.step(append(1, 1, 1, [Entry(2, 1, b"e2")]))
    reply = of_type(drain(node, storage), AppendEntriesResponse)[0]
    assert reply.index == 2  # matches up to what the message proved
    assert storage.last_index() == 4


def test_append_entries_leader_commit_greater_sets_commit_to_min_of_it_and_last_new() -> None:
    node, _ = node_with_log([1, 1, 1, 1], term=1)
    node.step(append(1, 1, 1, [Entry(2, 1, b"e2")], commit=4))
    assert node.commit_index == 2  # last new entry of this message, not our longer log
    node.step(append(1, 2, 1, [], commit=3))
    assert node.commit_index == 2  # an empty append proves only prev_index
    node.step(append(1, 3, 1, [], commit=3))
    assert node.commit_index == 3
    rd = node.ready()
    assert [e.index for e in rd.committed] == [1, 2, 3]


def test_append_entries_below_commit_index_acknowledges_commit() -> None:
    node, storage = node_with_log([1, 1, 1], term=1)
    node.step(append(1, 3, 1, [], commit=3))
    drain(node, storage)
    node.step(append(1, 1, 1, [Entry(2, 1)]))
    reply = of_type(drain(node, storage), AppendEntriesResponse)[0]
    assert (reply.reject, reply.index) == (False, 3)


# ---------------------------------------------------------------------------
# RequestVote RPC, receiver implementation
# ---------------------------------------------------------------------------


def test_request_vote_reply_false_if_term_lt_current_term() -> None:
    node, _ = node_with_log([1], term=3)
    node.step(vote_request(2, 5, 2))
    assert drain(node) == []  # a plain stale vote request earns no answer
    assert node.vote is None
    node.step(
        VoteRequest(
            group=0, term=2, src="n2", dst="n1", last_log_index=5, last_log_term=2, pre_vote=True
        )
    )
    reply = of_type(drain(node), VoteResponse)[0]
    assert (reply.granted, reply.term, reply.pre_vote) == (False, 3, True)


def test_request_vote_grant_if_voted_for_is_null_and_log_at_least_as_up_to_date() -> None:
    node, _ = node_with_log([1, 2], term=2)
    node.step(vote_request(3, 2, 2))
    reply = of_type(drain(node), VoteResponse)[0]
    assert reply.granted and reply.term == 3
    assert node.vote == "n2"


def test_request_vote_grant_again_to_the_same_candidate() -> None:
    node, _ = node_with_log([1], term=2, vote="n2")
    node.step(vote_request(2, 1, 1))
    assert of_type(drain(node), VoteResponse)[0].granted


def test_request_vote_reject_if_already_voted_for_another_candidate_this_term() -> None:
    node, _ = node_with_log([1], term=1)
    node.step(vote_request(2, 1, 1, src="n2"))
    node.step(vote_request(2, 1, 1, src="n3"))
    replies = of_type(drain(node), VoteResponse)
    assert [(r.dst, r.granted) for r in replies] == [("n2", True), ("n3", False)]


def test_request_vote_reject_if_candidate_last_term_is_older() -> None:
    node, _ = node_with_log([1, 3], term=3)
    node.step(vote_request(4, 10, 2))
    reply = of_type(drain(node), VoteResponse)[0]
    assert not reply.granted
    assert node.term == 4  # the higher term is adopted even though the vote is refused
    assert node.vote is None


def test_request_vote_reject_if_same_last_term_but_shorter_log() -> None:
    node, _ = node_with_log([1, 2, 2], term=2)
    node.step(vote_request(3, 2, 2))
    assert not of_type(drain(node), VoteResponse)[0].granted


def test_log_is_up_to_date_seam_implements_section_5_4_1() -> None:
    node, _ = node_with_log([1, 2, 2])
    assert node._log_is_up_to_date(3, 2)
    assert node._log_is_up_to_date(1, 3)
    assert not node._log_is_up_to_date(2, 2)
    assert not node._log_is_up_to_date(9, 1)


# ---------------------------------------------------------------------------
# Safety properties (section 5.2 / 5.4)
# ---------------------------------------------------------------------------


def test_election_safety_only_one_leader_per_term_with_split_votes() -> None:
    for seed in range(20):
        net = Net(5, seed=seed, **PLAIN)
        leaders_by_term: dict[int, set[str]] = {}
        for _ in range(60):
            net.tick_all()
            for n, node in net.nodes.items():
                if node.role is Role.LEADER:
                    leaders_by_term.setdefault(node.term, set()).add(n)
        assert leaders_by_term
        assert all(len(ls) == 1 for ls in leaders_by_term.values())


def test_leader_append_only_never_overwrites_its_own_entries() -> None:
    net = Net(3, **PLAIN)
    leader = net.elect("n1")
    leader.propose(b"a")
    net.deliver()
    before = net.storages["n1"].entries(1, net.storages["n1"].last_index() + 1)
    # A lower-term AppendEntries with conflicting entries must not touch the leader's log.
    leader.step(append(leader.term - 1 if leader.term > 1 else 0, 0, 0, [Entry(1, 0, b"bad")]))
    net.persist("n1")
    assert net.storages["n1"].entries(1, net.storages["n1"].last_index() + 1) == before


def test_messages_for_another_group_or_member_are_ignored() -> None:
    node, _ = node_with_log([], term=1)
    node.step(
        Heartbeat(group=7, term=9, src="n2", dst="n1", commit=0)  # other group
    )
    node.step(Heartbeat(group=0, term=9, src="n2", dst="n3", commit=0))  # other member
    assert node.term == 1
    assert drain(node) == []


def test_install_snapshot_from_lower_term_gets_our_term() -> None:
    node, _ = node_with_log([1], term=5)
    node.step(
        InstallSnapshot(
            group=0,
            term=2,
            src="n2",
            dst="n1",
            meta=SnapshotMeta(9, 2),
            offset=0,
            data=b"",
            done=True,
        )
    )
    assert [m.term for m in drain(node)] == [5]


def test_timeout_now_at_higher_term_is_not_a_leader_claim() -> None:
    node, _ = node_with_log([], term=1)
    node.step(TimeoutNow(group=0, term=3, src="n2", dst="n1"))
    # It adopted term 3 and then campaigned at once for term 4.
    assert node.role is Role.CANDIDATE
    assert node.term == 4
