"""Membership changes in the core, rule by rule: single-server changes with learners."""

from __future__ import annotations

import random
from typing import Unpack

import pytest

from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import (
    AppendEntries,
    ConfChangeRefused,
    HeartbeatResponse,
    InstallSnapshot,
    NotLeader,
    ReadState,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Snapshot,
    SnapshotMeta,
    encode_conf_change,
)

from .harness import Net, RaftOptions, of_type

ADD, PROMOTE, REMOVE = ConfChangeKind.ADD_LEARNER, ConfChangeKind.PROMOTE, ConfChangeKind.REMOVE


def change(net: Net, leader: str, kind: ConfChangeKind, node: str) -> int:
    index = net[leader].propose_conf_change(ConfChange(kind, node, node.encode()))
    assert isinstance(index, int), index
    return index


def settled(n: int = 3, **cfg: Unpack[RaftOptions]) -> tuple[Net, RaftNode]:
    net = Net(n, **cfg)
    leader = net.elect("n1")
    net.deliver()
    return net, leader


def test_add_a_learner_it_catches_up_then_promote_it() -> None:
    net, leader = settled()
    for i in range(5):
        leader.propose(b"%d" % i)
    net.deliver()
    index = change(net, "n1", ADD, "n4")
    assert leader.learners == ("n4",)  # in force on the leader as soon as it is appended
    assert leader.status().progress["n4"].is_learner
    net.add("n4")
    net.tick_all(3)
    learner = net["n4"]
    # A status() snapshot: mypy would keep learner.role narrowed past the promotion below.
    assert learner.status().role is Role.LEARNER and learner.learners == ("n4",)
    assert learner.last_index == leader.last_index and learner.commit_index >= index
    assert net.data("n4") == net.data("n1")
    status = leader.status()
    assert status.learners == ("n4",) and status.voters == ("n1", "n2", "n3")
    assert status.progress["n4"].match == leader.last_index
    # Committed CONF_CHANGE entries still reach the runtime, to log and learn addresses.
    applied = [e for e in net.applied["n2"] if e.kind is EntryKind.CONF_CHANGE]
    assert [e.index for e in applied] == [index]

    change(net, "n1", PROMOTE, "n4")
    net.tick_all(3)
    for n in ("n1", "n2", "n3", "n4"):
        assert net[n].voters == ("n1", "n2", "n3", "n4") and net[n].learners == ()
    assert learner.role is Role.FOLLOWER
    # Four voters: a quorum is three, so two followers cut off stop the commits.
    net.isolate("n3")
    net.isolate("n4")
    before = leader.commit_index
    leader.propose(b"needs three")
    net.tick_all(3)
    assert leader.commit_index == before


def test_remove_a_follower_it_learns_of_it_and_goes_quiet() -> None:
    net, leader = settled()
    index = change(net, "n1", REMOVE, "n3")
    assert leader.voters == ("n1", "n2")
    net.tick_all(3)
    removed = net["n3"]
    assert removed.commit_index >= index  # it kept receiving the log until the removal committed
    assert removed.removed and removed.role is Role.LEARNER
    assert "n3" not in leader.status().progress
    assert not net["n2"].removed and not leader.removed
    net.queue.clear()
    for _ in range(100):
        removed.tick()
    assert not of_type(net.take("n3"), VoteRequest)  # no longer a voter: never campaigns
    # Nor does it vote.
    removed.step(
        VoteRequest(
            group=0,
            term=removed.term + 1,
            src="n2",
            dst="n3",
            last_log_index=99,
            last_log_term=99,
        )
    )
    assert not of_type(net.take("n3"), VoteResponse)[0].granted


def test_remove_the_leader_it_leads_until_committed_then_hands_over() -> None:
    net, leader = settled()
    index = change(net, "n1", REMOVE, "n1")
    status = leader.status()
    assert status.role is Role.LEADER and status.voters == ("n2", "n3")
    assert status.progress["n1"].is_learner  # it no longer counts itself
    leader.propose(b"while leaving")  # it still takes proposals meanwhile
    net.persist("n1")
    sent = list(net.queue)
    net.deliver()
    assert leader.commit_index >= index
    assert leader.role is not Role.LEADER and leader.removed
    assert of_type(net.sent, TimeoutNow)  # to a caught-up voter, so no election timeout is lost
    assert sent  # (its appends went out before it stepped down)
    net.stop("n1")
    new = net.leader()
    assert new in ("n2", "n3")
    assert net[new].voters == ("n2", "n3")
    assert b"while leaving" in net.data(new)
    net[new].propose(b"after")
    net.deliver()
    assert b"after" in net.data("n2") and b"after" in net.data("n3")


def test_a_removed_leader_leads_on_until_the_new_configuration_commits_its_removal() -> None:
    net, leader = settled()
    change(net, "n1", REMOVE, "n1")
    net.isolate("n3")
    net.deliver()
    # The quorum of {n2, n3} is both of them; the leader's own copy no longer counts.
    status = leader.status()
    assert status.role is Role.LEADER and not status.removed
    net.heal()
    for _ in range(8):
        if leader.removed:
            break
        net.tick_all(1)
    assert leader.removed and leader.role is not Role.LEADER


def test_a_change_is_refused_while_another_is_uncommitted() -> None:
    net, leader = settled()
    assert not leader.status().conf_pending
    change(net, "n1", ADD, "n4")
    assert leader.status().conf_pending  # (the leader spread waits for it: spread.py)
    refused = leader.propose_conf_change(ConfChange(ADD, "n5"))
    assert isinstance(refused, ConfChangeRefused) and "not committed" in refused.reason
    net.deliver()
    assert not leader.status().conf_pending
    assert isinstance(leader.propose_conf_change(ConfChange(ADD, "n5")), int)


def test_refused_before_the_term_has_a_committed_entry() -> None:
    net = Net(3)
    leader = net["n1"]
    net.drop = lambda m: type(m).__name__ == "AppendEntriesResponse"
    net.campaign("n1")
    assert leader.role is Role.LEADER and leader.commit_index == 0
    refused = leader.propose_conf_change(ConfChange(ADD, "n4"))
    assert isinstance(refused, ConfChangeRefused)
    assert "no entry of this leader's term" in refused.reason
    net.heal()
    net.tick_all(2)
    assert isinstance(leader.propose_conf_change(ConfChange(ADD, "n4")), int)


@pytest.mark.parametrize(
    ("conf_change", "why"),
    [
        (ConfChange(ADD, "n2"), "already a member"),
        (ConfChange(PROMOTE, "n2"), "already a voter"),
        (ConfChange(PROMOTE, "zz"), "not a member"),
        (ConfChange(REMOVE, "zz"), "not a member"),
        (ConfChange(ADD, ""), "must not be empty"),
        (ConfChange(ADD, "x" * 300), "UTF-8 bytes"),
    ],
)
def test_changes_that_do_not_apply_are_refused(conf_change: ConfChange, why: str) -> None:
    _, leader = settled()
    refused = leader.propose_conf_change(conf_change)
    assert isinstance(refused, ConfChangeRefused) and why in refused.reason
    assert leader.voters == ("n1", "n2", "n3") and leader.learners == ()


def test_the_last_voter_cannot_be_removed_and_followers_redirect() -> None:
    net = Net(1)
    leader = net.elect("n1")
    net.deliver()
    refused = leader.propose_conf_change(ConfChange(REMOVE, "n1"))
    assert isinstance(refused, ConfChangeRefused) and "last voter" in refused.reason
    net3, leader3 = settled()
    assert net3["n2"].propose_conf_change(ConfChange(ADD, "n4")) == NotLeader("n1")
    leader3.transfer_leadership("n2")
    assert leader3.propose_conf_change(ConfChange(ADD, "n4")) == NotLeader("n2")


def test_a_learner_never_campaigns_and_never_counts() -> None:
    net, leader = settled()
    change(net, "n1", ADD, "n4")
    net.add("n4")
    net.tick_all(2)
    learner = net["n4"]
    net.queue.clear()
    for _ in range(100):
        learner.tick()
    assert not of_type(net.take("n4"), VoteRequest)
    # It answers a vote request (a candidate may know of a promotion it has not seen)...
    learner.step(
        VoteRequest(
            group=0,
            term=learner.term + 1,
            src="n2",
            dst="n4",
            last_log_index=99,
            last_log_term=99,
        )
    )
    assert of_type(net.take("n4"), VoteResponse)[0].granted
    # ... but a candidate asks, and counts, only the voters of its own configuration.
    net.isolate("n1")
    net.isolate("n3")
    net.cut -= {("n2", "n4"), ("n4", "n2")}
    for _ in range(60):
        net.tick_all(1)
    assert net["n2"].role is not Role.LEADER
    assert not [m for m in of_type(net.sent, VoteRequest) if m.dst == "n4"]
    net.heal()
    net.tick_all(5)
    new = net.leader()
    assert new is not None and new != "n4"
    # Transfer goes to voters only.
    net[new].transfer_leadership("n4")
    assert net[new].lead_transferee is None
    # Check-quorum counts voters only: with the other voters cut off, the learner's
    # answers do not keep the leader in office.
    for other in ("n1", "n2", "n3"):
        if other != new:
            net.isolate(other)
    # (Its rounds failed while the others were cut off: its window is widened that much.)
    for _ in range(3 * (leader._cfg.election_ticks << net[new].failed_rounds)):
        net[new].tick()
        net.deliver()
    assert net[new].role is not Role.LEADER


def test_read_index_counts_only_voters_of_the_configuration_in_force() -> None:
    net, leader = settled()
    change(net, "n1", ADD, "n4")
    net.add("n4")
    net.tick_all(2)
    net.isolate("n2")
    net.isolate("n3")
    leader.read_index(b"r")
    net.tick_all(3)  # only the learner answers the heartbeat round
    assert net.reads["n1"] == []
    net.heal()
    net.tick_all(2)
    assert [r.ctx for r in net.reads["n1"]] == [b"r"]
    # An answer from a member that is no longer a voter does not count either.
    change(net, "n1", REMOVE, "n3")
    net.tick_all(2)
    leader.read_index(b"r2")
    net.persist("n1")
    net.queue.clear()
    leader.step(HeartbeatResponse(group=0, term=leader.term, src="n3", dst="n1", ctx=b"r2"))
    net.persist("n1")
    assert ReadState(b"r2", leader.commit_index) not in net.reads["n1"]


THREE = ConfState(("n1", "n2", "n3"))


def follower(conf: ConfState = THREE) -> tuple[RaftNode, MemoryStorage]:
    storage = MemoryStorage(conf)
    return RaftNode(Config("n1", conf.voters), storage, random.Random(1)), storage


def conf_entry(index: int, term: int, kind: ConfChangeKind, node: str) -> Entry:
    return Entry(index, term, encode_conf_change(ConfChange(kind, node)), EntryKind.CONF_CHANGE)


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


def test_a_follower_follows_the_latest_configuration_and_reverts_it_on_truncation() -> None:
    node, _ = follower()
    append(node, 1, (0, 0), Entry(1, 1), conf_entry(2, 1, ADD, "n4"))
    assert node.learners == ("n4",)  # in force on append, committed or not
    append(node, 1, (2, 1), conf_entry(3, 1, PROMOTE, "n4"))
    assert node.conf_state == ConfState(("n1", "n2", "n3", "n4"))
    assert node.conf_state_at(1) == ConfState(("n1", "n2", "n3"))
    assert node.conf_state_at(2) == ConfState(("n1", "n2", "n3"), ("n4",))
    # A new leader of term 2 never had the promotion: the suffix goes, and with it the change.
    append(node, 2, (2, 1), Entry(3, 2))
    assert node.conf_state == ConfState(("n1", "n2", "n3"), ("n4",))
    append(node, 3, (1, 1), Entry(2, 3), conf_entry(3, 3, REMOVE, "n1"))
    assert node.conf_state == ConfState(("n2", "n3"))
    assert node.role is Role.LEARNER  # not a voter of its own configuration any more
    with pytest.raises(ValueError):
        node.conf_state_at(4)


def test_a_candidate_whose_configuration_drops_it_stops_campaigning() -> None:
    node, _ = follower()
    for _ in range(40):
        node.tick()
        if node.role is not Role.FOLLOWER:
            break
    assert node.status().role is Role.PRE_CANDIDATE
    append(node, 1, (0, 0), conf_entry(1, 1, REMOVE, "n1"))  # the leader's append makes it follow
    assert node.role is Role.LEARNER
    for _ in range(100):
        node.tick()
    assert node.role is Role.LEARNER


def test_undecodable_or_inapplicable_conf_entries_change_nothing() -> None:
    node, _ = follower()
    append(
        node,
        1,
        (0, 0),
        Entry(1, 1, b"\x09junk", EntryKind.CONF_CHANGE),
        conf_entry(2, 1, PROMOTE, "zz"),
    )
    assert node.conf_state == ConfState(("n1", "n2", "n3"))


def test_restart_rebuilds_the_configuration_from_snapshot_and_log() -> None:
    conf = ConfState(("n1", "n2", "n3"))
    storage = MemoryStorage(conf)
    storage.append(
        [
            Entry(1, 1),
            conf_entry(2, 1, ADD, "n9"),  # before the snapshot: already in its ConfState
            Entry(3, 1),
            conf_entry(4, 1, ADD, "n4"),
            conf_entry(5, 1, PROMOTE, "n4"),
            conf_entry(6, 1, ADD, "n5"),
        ]
    )
    storage.create_snapshot(3, ConfState(("n1", "n2", "n3"), ("n9",)), b"img")
    storage.set_hard_state(HardState(1, None, 5))
    node = RaftNode(Config("n1", ("n1", "n2", "n3")), storage, random.Random(1))
    assert node.voters == ("n1", "n2", "n3", "n4")
    assert node.learners == ("n9", "n5")
    assert node.conf_state_at(3) == ConfState(("n1", "n2", "n3"), ("n9",))
    assert node.conf_state_at(4) == ConfState(("n1", "n2", "n3"), ("n9", "n4"))
    with pytest.raises(ValueError, match="no longer known"):
        node.conf_state_at(2)


def test_restart_after_its_own_removal_knows_it_was_removed() -> None:
    conf = ConfState(("n1", "n2", "n3"))
    storage = MemoryStorage(conf)
    storage.append([Entry(1, 1), conf_entry(2, 1, REMOVE, "n1")])
    storage.set_hard_state(HardState(1, None, 2))
    node = RaftNode(Config("n1", conf.voters), storage, random.Random(1))
    assert node.removed and node.role is Role.LEARNER and node.status().removed
    storage.set_hard_state(HardState(1, None, 1))  # the removal not known committed: not yet
    node = RaftNode(Config("n1", conf.voters), storage, random.Random(1))
    assert not node.removed


def test_a_snapshot_brings_its_configuration() -> None:
    node, _ = follower()
    meta = SnapshotMeta(10, 1, ConfState(("n2", "n3", "n4"), ("n5",)))
    net_snapshot = Snapshot(meta, b"img")
    node.step(
        InstallSnapshot(
            group=0, term=1, src="n2", dst="n1", meta=meta, offset=0, data=b"img", done=True
        )
    )
    assert node.ready().snapshot == net_snapshot
    assert node.voters == ("n2", "n3", "n4") and node.learners == ("n5",)
    assert node.removed  # a committed configuration without it, after one with it
    assert node.conf_state_at(10) == meta.conf


def test_a_new_member_is_not_removed_before_it_is_added() -> None:
    net, _ = settled()
    newcomer = net.add("n4")  # started before its addition: the bootstrap voters, not it
    assert not newcomer.removed and newcomer.role is Role.LEARNER
    for _ in range(100):
        newcomer.tick()
    assert not of_type(net.take("n4"), VoteRequest)
    change(net, "n1", ADD, "n4")
    net.tick_all(2)
    assert not newcomer.removed and newcomer.learners == ("n4",)


def test_a_lone_voter_commits_its_change_when_its_disk_confirms_it() -> None:
    net = Net(1)
    leader = net.elect("n1")
    net.deliver()
    index = change(net, "n1", ADD, "n2")
    rd = leader.ready()
    assert leader.commit_index < index
    net.storages["n1"].append(rd.entries)
    leader.advance(rd)
    assert leader.commit_index == index
    assert isinstance(leader.propose_conf_change(ConfChange(PROMOTE, "n2")), int)


def test_removing_a_lagging_voter_can_commit_what_the_others_hold() -> None:
    net, leader = settled(4)
    net.isolate("n3")
    net.isolate("n4")
    index = leader.propose(b"x")
    assert isinstance(index, int), index
    net.deliver()
    assert leader.commit_index < index  # n1 and n2 are not three of four
    change(net, "n1", REMOVE, "n4")
    assert leader.commit_index == index  # but they are two of {n1, n2, n3}


def test_a_removed_member_far_behind_gets_no_farewell_from_a_compacted_log() -> None:
    net, leader = settled()
    net.isolate("n3")
    for i in range(6):
        leader.propose(b"%d" % i)
    net.deliver()
    storage = net.storages["n1"]
    storage.create_snapshot(leader.commit_index, leader.conf_state, b"img")
    storage.compact(leader.commit_index)
    index = change(net, "n1", REMOVE, "n3")
    net.deliver()
    assert leader.commit_index >= index and "n3" not in leader.status().progress
    farewells = [m for m in of_type(net.sent, AppendEntries) if m.dst == "n3" and m.commit >= index]
    assert farewells == []  # n3 needs entries the leader compacted: nothing to send


def test_a_removed_leader_sends_no_timeout_now_when_no_voter_is_caught_up() -> None:
    net, leader = settled()
    change(net, "n1", REMOVE, "n1")
    removal = net.take("n1")
    for m in removal:
        net[m.dst].step(m)
    acks = [m for n in ("n2", "n3") for rd in net.persist(n) for m in rd.messages]
    leader.propose(b"after the removal")  # not yet on the new voters when the removal commits
    net.persist("n1")
    net.queue.clear()
    net.sent.clear()
    for ack in acks:
        leader.step(ack)
    assert leader.removed and leader.role is not Role.LEADER
    net.persist("n1")
    assert not of_type(net.sent, TimeoutNow)


def test_restart_skips_conf_entries_that_change_nothing() -> None:
    storage = MemoryStorage(THREE)
    storage.append([Entry(1, 1, b"\x09junk", EntryKind.CONF_CHANGE), conf_entry(2, 1, ADD, "n4")])
    node = RaftNode(Config("n1", THREE.voters), storage, random.Random(1))
    assert node.conf_state == ConfState(THREE.voters, ("n4",))


def test_a_snapshot_installed_while_committed_entries_are_applied_keeps_their_configuration() -> (
    None
):
    """The runtime may still apply (and snapshot at) entries handed out before the snapshot."""
    node, _ = follower()
    node.step(
        AppendEntries(
            group=0,
            term=1,
            src="n2",
            dst="n1",
            prev_index=0,
            prev_term=0,
            entries=(Entry(1, 1), conf_entry(2, 1, ADD, "n4"), Entry(3, 1)),
            commit=3,
        )
    )
    applying = node.ready()
    assert [e.index for e in applying.committed] == [1, 2, 3]
    meta = SnapshotMeta(10, 1, ConfState(("n1", "n2", "n3", "n4")))
    node.step(
        InstallSnapshot(
            group=0, term=1, src="n2", dst="n1", meta=meta, offset=0, data=b"img", done=True
        )
    )
    assert node.conf_state_at(1) == THREE
    assert node.conf_state_at(3) == ConfState(THREE.voters, ("n4",))
    assert node.conf_state_at(10) == meta.conf == node.conf_state


def test_a_learner_promoted_without_knowing_it_still_votes() -> None:
    """The promotion commits on {n1, n2, n3}; n1 dies; the others need the unaware learner.

    Four voters make a quorum of three, and n4 still believes it is a learner.
    Refusing to vote would leave the cluster without a leader for good.
    """
    net, leader = settled()
    change(net, "n1", ADD, "n4")
    net.add("n4")
    net.tick_all(3)
    net.isolate("n4")
    promote = change(net, "n1", PROMOTE, "n4")
    net.deliver()
    assert leader.commit_index >= promote and net["n2"].voters == ("n1", "n2", "n3", "n4")
    assert net["n4"].status().role is Role.LEARNER
    net.stop("n1")
    net.heal()
    for _ in range(20):
        net.tick_all(5)
        if net.leader() is not None:
            break
    assert net.leader() in ("n2", "n3")
    net.tick_all(2)
    assert net["n4"].role is Role.FOLLOWER and net["n4"].voters == ("n1", "n2", "n3", "n4")
