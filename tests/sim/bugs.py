"""Known bugs (Raft's, and the client library's), switched on through test seams, to prove
the checkers can fail."""

from __future__ import annotations

from dlm.client.core import LeaseClock, lease_deadline
from dlm.node.raft.core import RaftNode
from dlm.node.raft.membership import check_change
from dlm.node.raft.types import ConfChange, HardState, NodeId, Role


class CommitsPreviousTermByCounting(RaftNode):
    """Commits whatever a quorum holds, even an entry of an earlier term (Raft figure 8)."""

    def _maybe_commit(self) -> bool:
        index = self._quorum_match_index()
        if index <= self._log.committed:
            return False
        return self._log.commit_to(index)


class ForgetsVote(RaftNode):
    """Never persists its vote, so a restart in the same term can vote again."""

    def _hard_state(self) -> HardState:
        real = super()._hard_state()
        return HardState(real.term, None, real.commit)


class VotesForStaleLogs(RaftNode):
    """Grants its vote (and pre-vote) whatever the candidate's log looks like."""

    def _log_is_up_to_date(self, last_index: int, last_term: int) -> bool:
        return True


class LeaderIgnoresHigherTerm(RaftNode):
    """A leader adopts a higher term it hears of but goes on leading in it."""

    def _on_higher_term(self, term: int, leader: NodeId | None) -> None:
        if self._role is Role.LEADER:
            self._term = term
            self._vote = None
            return
        super()._on_higher_term(term, leader)


class ChangesMembershipBeforeCommittingInTerm(RaftNode):
    """Takes a configuration change before an entry of its own term has committed.

    Single-server changes without the 2015 erratum: it still allows one
    uncommitted change at a time, but a new leader may start one at once.
    """

    def _refuse_conf_change(self, change: ConfChange) -> str | None:
        if self._conf_history.latest_index > self._log.committed:
            return "an earlier configuration change is not committed yet"
        return check_change(self._conf_history.latest, change)


class OutlivesShortenedLeases(LeaseClock):
    """Issue 20's hole 3 put back: the client's lease clock never hears of a TTL update,
    and a confirmation keeps the later of the old and the new deadline (max(old, new)),
    so a shortened lease goes on being counted on with the old TTL."""

    __slots__ = ()

    def update_sent(self, sent_at: float, ttl_ms: int) -> int:
        return 0

    def update_settled(
        self, ticket: int, ttl_ms: int | None, now: float, *, applied: bool | None
    ) -> bool:
        return not self.expired(now)

    def confirmed(self, sent_at: float, ttl_ms: int, now: float) -> bool:
        if self.expired(now):
            return False
        self.reported_ttl_ms = ttl_ms
        self.last_sent = max(self.last_sent, sent_at)
        self.deadline = max(self.deadline, lease_deadline(sent_at, ttl_ms))
        return True
