"""Known bugs, switched on through test seams, to prove the checkers can fail.

Raft bugs (subclasses of the core), and `dlm exec`'s hole 4 (subclasses of the
CLI's pure exec rules that start CMD without looking at the clock).
"""

from __future__ import annotations

from dlm.cli.exec_rules import GuardRules, StartGate
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


class SpawnsWithoutLooking(GuardRules):
    """A guard that starts CMD whenever told to, past its deadline too, and gives a CMD
    started late the usual SIGTERM and grace (hole 4 of issue 20)."""

    def may_spawn(self, now: float, deadline: float) -> bool:
        self.offer(deadline)
        return True

    def spawned(self, now: float) -> bool:
        return True


class OrdersSpawnWithoutLooking(StartGate):
    """A supervisor that orders the spawn without comparing its deadline with the clock
    after its confirmation (a pause in between goes unnoticed: hole 4 of issue 20)."""

    def may_order_spawn(self, now: float, deadline: float) -> bool:
        return True
