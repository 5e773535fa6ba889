"""The progress tracker: who counts towards a quorum, which index a quorum holds, the tally."""

from __future__ import annotations

from dlm.node.raft.quorum import VoteResult
from dlm.node.raft.roles import RULES
from dlm.node.raft.tracker import ProgressTracker
from dlm.node.raft.types import Role
from dlm.records import ConfState


def _tracker(voters: tuple[str, ...], learners: tuple[str, ...] = ()) -> ProgressTracker:
    tracker = ProgressTracker()
    tracker.apply_conf(ConfState(voters=voters, learners=learners))
    return tracker


def test_a_configuration_sets_voters_learners_and_quorum() -> None:
    tracker = _tracker(("a", "b", "c", "d"), ("d", "e"))
    assert tracker.voters == ("a", "b", "c", "d")
    assert tracker.learners == ("e",)  # a voter listed as learner too is a voter
    assert tracker.quorum == 3
    assert tracker.is_voter("d") and not tracker.is_voter("e")
    assert tracker.members() == ("a", "b", "c", "d", "e")


def test_the_quorum_index_counts_voters_only() -> None:
    tracker = _tracker(("a", "b", "c"), ("l",))
    tracker.start_leading(next_index=1, max_inflight=4)
    for peer, match in {"a": 7, "b": 5, "c": 2, "l": 9}.items():
        tracker.progress[peer].match = match
    assert tracker.quorum_match_index() == 5
    assert tracker.progress["l"].is_learner and not tracker.progress["a"].is_learner


def test_the_tally_counts_each_voter_once_and_ignores_others() -> None:
    tracker = _tracker(("a", "b", "c"))
    assert tracker.record_vote("a", True) is VoteResult.PENDING
    assert tracker.record_vote("x", True) is VoteResult.PENDING  # not a voter
    assert tracker.record_vote("b", False) is VoteResult.PENDING
    assert tracker.record_vote("b", True) is VoteResult.PENDING  # the first answer stands
    assert tracker.record_vote("c", False) is VoteResult.LOST


def test_check_quorum_and_read_acks_need_a_majority_of_voters() -> None:
    tracker = _tracker(("a", "b", "c"), ("l",))
    tracker.start_leading(next_index=1, max_inflight=4)
    tracker.progress["l"].recent_active = True
    assert not tracker.quorum_active("a")  # a learner's answers do not count
    tracker.progress["b"].recent_active = True
    assert tracker.quorum_active("a")
    assert not tracker.acks_reach_quorum(["l"], "a")
    assert tracker.acks_reach_quorum(["c"], "a")
    assert not tracker.acks_reach_quorum(["c"], "x")  # a leader that is no voter counts not


def test_a_changed_configuration_keeps_departing_members_until_told() -> None:
    tracker = _tracker(("a", "b", "c"))
    tracker.start_leading(next_index=4, max_inflight=4)
    tracker.apply_conf(ConfState(voters=("a", "b"), learners=("n",)))
    tracker.track_members(next_index=6, max_inflight=4)
    assert tracker.progress["n"].next == 6 and tracker.progress["n"].is_learner
    assert tracker.progress["c"].is_learner  # leaving: no longer counts, still tracked
    assert tracker.departed("a") == ["c"]


def test_every_role_has_its_rules() -> None:
    assert set(RULES) == set(Role)
