"""Who counts, and what they hold: the configuration in force, per-member progress, the vote tally.

The core asks this room every "is that a quorum?" question: which index a
quorum of voters holds, whether a campaign won or lost, whether enough voters
were heard from lately (check-quorum), whether a read's heartbeat answers
reach a quorum. It holds no term, role or log; the core tells it what changed
(a new configuration, a won election, a vote received). Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dlm.node.raft.progress import Progress
from dlm.node.raft.quorum import VoteResult, majority, quorum_index, vote_result
from dlm.records import ConfState, NodeId


class ProgressTracker:
    """Voters, learners and the quorum they make; a leader's progress per member; votes."""

    __slots__ = ("learners", "progress", "quorum", "voter_set", "voters", "votes")

    def __init__(self) -> None:
        self.voters: tuple[NodeId, ...] = ()
        self.voter_set: frozenset[NodeId] = frozenset()
        self.learners: tuple[NodeId, ...] = ()
        """Learners of the configuration that are not also voters."""
        self.quorum = 1
        self.progress: dict[NodeId, Progress] = {}
        """A leader's view of each member (itself, learners and departing members too)."""
        self.votes: dict[NodeId, bool] = {}

    def apply_conf(self, conf: ConfState) -> None:
        voter_set = frozenset(conf.voters)
        self.voters = tuple(conf.voters)
        self.voter_set = voter_set
        self.learners = tuple(n for n in conf.learners if n not in voter_set)
        self.quorum = majority(self.voters)

    def is_voter(self, node: NodeId) -> bool:
        return node in self.voter_set

    def members(self) -> tuple[NodeId, ...]:
        """Voters, then learners."""
        return (*self.voters, *self.learners)

    # -- votes --------------------------------------------------------------

    def record_vote(self, node: NodeId, granted: bool) -> VoteResult:
        """Note ``node``'s first answer (a repeated one changes nothing) and tally."""
        self.votes.setdefault(node, granted)
        return vote_result(self.voters, self.votes)

    # -- a leader's progress ------------------------------------------------

    def start_leading(self, next_index: int, max_inflight: int) -> None:
        """Fresh progress for every member."""
        voters = self.voter_set
        self.progress = {
            peer: Progress(next_index, max_inflight, is_learner=peer not in voters)
            for peer in self.members()
        }

    def track_members(self, next_index: int, max_inflight: int) -> None:
        """The configuration changed under a leader: track new members, re-mark learners.

        A member that left keeps its progress until the change that removed it commits.
        """
        progress = self.progress
        for peer in self.members():
            if peer not in progress:
                progress[peer] = Progress(next_index, max_inflight, is_learner=True)
        voters = self.voter_set
        for peer, pr in progress.items():
            pr.is_learner = peer not in voters

    def others(self, me: NodeId) -> Iterator[tuple[NodeId, Progress]]:
        """Every tracked member but ``me``, with its progress."""
        for peer, pr in self.progress.items():
            if peer != me:
                yield peer, pr

    def departed(self, me: NodeId) -> list[NodeId]:
        """Tracked members that are in the configuration no more (``me`` aside)."""
        members = self.voter_set.union(self.learners)
        return [p for p in self.progress if p != me and p not in members]

    def quorum_match_index(self) -> int:
        """The highest index a quorum of voters holds."""
        progress = self.progress
        return quorum_index(
            self.voters, {v: progress[v].match for v in self.voters if v in progress}
        )

    def quorum_active(self, me: NodeId) -> bool:
        """Whether a quorum of voters (``me`` always among the active) was heard from lately."""
        active = 0
        for voter in self.voters:
            if voter == me:
                active += 1
            else:
                pr = self.progress.get(voter)
                if pr is not None and pr.recent_active:
                    active += 1
        return active >= self.quorum

    def acks_reach_quorum(self, acks: Iterable[NodeId], me: NodeId) -> bool:
        """Whether these read acknowledgements, with ``me`` if a voter, make a quorum."""
        voters = self.voter_set
        count = sum(1 for v in acks if v in voters) + (1 if me in voters else 0)
        return count >= self.quorum

    def most_caught_up_voter(self) -> NodeId | None:
        progress = self.progress
        return max(
            (p for p in self.voters if p in progress),
            key=lambda p: progress[p].match,
            default=None,
        )
