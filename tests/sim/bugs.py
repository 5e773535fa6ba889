"""Known bugs, switched on through test seams, to prove the checkers can fail: the Raft
core's, LinkWatch's, the client library's lease clock, the node machine's answers, the
admission holes of issue 20 (driven by the whole-node simulator), and `dlm exec`'s hole 4
(subclasses of the CLI's pure exec rules that start CMD without looking at the clock)."""

from __future__ import annotations

import dataclasses
from typing import Any

from dlm.cli.exec_rules import GuardRules, StartGate
from dlm.client.core import LeaseClock, PartClocks, for_member, lease_deadline
from dlm.gateway.routing import GatewayRouter, canonical
from dlm.node import locks
from dlm.node.admission import (
    Acceptance,
    Ask,
    Connected,
    Dialing,
    Failed,
    Refuse,
    Refused,
    Send,
)
from dlm.node.clients import ClientConn
from dlm.node.leases import LeaseTracker
from dlm.node.linkwatch import LinkWatch
from dlm.node.locks.identities import NO_LIMITS, IdentityTable
from dlm.node.locks.machine import OwnerUsage, _Step, _Tombstone
from dlm.node.machine import NodeMachine
from dlm.node.membership import Membership
from dlm.node.outbox import Instant
from dlm.node.proposals import Proposal
from dlm.node.raft.core import RaftNode
from dlm.node.raft.membership import check_change
from dlm.node.raft.types import Role
from dlm.node.snapshots import BackupImage
from dlm.node.spans import SpanRecorder
from dlm.node.supervision import GiveUp, Restart, RestartPolicy, Verdict
from dlm.node.watches import Watches
from dlm.records import ConfChange, HardState, NodeId
from dlm.wire import ClientRequest, SnapshotSave, Watch, ok

from .ledgercheck import SimLedger


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


class NeverReplacesLinks(LinkWatch):
    """Watches a peer connection but never replaces it, however long it delivers nothing
    (a member waits out TCP's retransmission back-off, as before the fix)."""

    def observe(
        self,
        now: float,
        *,
        outstanding: bool,
        acknowledged: int,
        retransmit_after: float | None = None,
    ) -> bool:
        super().observe(
            now,
            outstanding=outstanding,
            acknowledged=acknowledged,
            retransmit_after=retransmit_after,
        )
        return False


class ReplacesLinksTcpWouldRetry(LinkWatch):
    """Replaces a connection after ``stall_after`` of silence even when TCP is about to
    retransmit on it (the rule before the lossy-link measurements): on lossy links the
    members replace their connections faster than a new one can carry anything."""

    def observe(
        self,
        now: float,
        *,
        outstanding: bool,
        acknowledged: int,
        retransmit_after: float | None = None,
    ) -> bool:
        return super().observe(now, outstanding=outstanding, acknowledged=acknowledged)


# ---------------------------------------------------------------------------
# Admission (dlm/node/admission.py): issue 20's holes 1 and 2, put back
# ---------------------------------------------------------------------------


class BelievesRefusalsBeforeTheProof(Dialing):
    """Hole 1: an ``error`` frame that arrives before the peer's proof counts as the peer's
    word, so "you were removed from this cluster" from anyone stops the member."""

    def reply(self, raw: Any) -> Connected | Failed | Refused:
        outcome = super().reply(raw)
        if isinstance(outcome, Refused):
            return Refused(outcome.message, authenticated=True)
        return outcome


class AsksTheMemberBeforeTheProof(Acceptance):
    """Hole 2: the member hears a peer's hello (its claimed id and address) before the peer
    proved anything; an unknown id's address lands among the unlisted peers."""

    def hello(self, raw: Any) -> Send | Ask | Refuse:
        outcome = super().hello(raw)
        if isinstance(outcome, Send) and self.hello_seen is not None:
            self._state = "verdict"
            return Ask(self.hello_seen)
        return outcome


class AdmitsClientsWithoutTheProof(Acceptance):
    """A client that sends anything where its proof belongs is admitted anyway, and what it
    sent reaches the machine as a request."""

    def proof(self, raw: Any) -> Ask | Refuse:
        outcome = super().proof(raw)
        hello = self.hello_seen
        if isinstance(outcome, Refuse) and hello is not None and hello.role.value == "client":
            self._state = "verdict"
            return Ask(hello)
        return outcome


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


class ConfirmsUpdatesOfDoomedLeases(NodeMachine):
    """Confirms a TTL update applied after the leader proposed the lease's Expire (the
    update was in the log first): the lease's clock did not restart, and it expires anyway
    right after, so ``dlm exec --min-hold`` reports a hold handed over that does not last."""

    def _answer(self, proposal: Proposal, result: locks.Result, now: Instant) -> None:
        if isinstance(result, locks.LeaseUpdated):
            reply = ok(proposal.request.id, lease=result.lease, ttl_ms=result.ttl_ms)
            self._answer_request(proposal.conn, proposal.request.TYPE, reply)
            return
        super()._answer(proposal, result, now)


class LabelsBackupsWithTheLastIndex(NodeMachine):
    """Labels a backup with the last index of its log (proposed, perhaps not committed)
    instead of the index its image was taken at."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        taken_at_applied = self.snapshots.backup

        def backup(
            machine: locks.LockStateMachine, raft: RaftNode, membership: Membership
        ) -> BackupImage | None:
            taken = taken_at_applied(machine, raft, membership)
            if taken is None:
                return None
            _, _, conf, image = taken
            last = raft.last_index
            return BackupImage((last, raft.term_at(last), conf, image))

        self.snapshots.backup = backup  # type: ignore[method-assign]


class ServesBackupsWithoutARound(NodeMachine):
    """Serves a backup from its own state at once, without a read round confirming that
    it still leads: a deposed leader cut off from the others hands out an old state."""

    def _handle_request(self, state: ClientConn, req: ClientRequest, now: Instant) -> None:
        if isinstance(req, SnapshotSave) and self.role is Role.LEADER:
            self._serve_backup(state.conn, req, now)
            return
        super()._handle_request(state, req, now)


class SkipsPermissionChecks(NodeMachine):
    """Issue 23: no permission check at the member that receives a request..."""

    check_permissions = False


class AppliesWithoutPermission(locks.LockStateMachine):
    """...and none when its entry is applied: a client identity's acquire of a key outside
    its prefixes, or its release of another identity's lease, takes effect."""

    check_permissions = False


class PromotesTheUnproved(NodeMachine):
    """Makes a learner a voter on an operator's request without asking whether it ever
    completed an authenticated link (issue 23, item 4): a member added at an address where
    only a stranger answers becomes a voter that never votes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        decide = self.membership.change_for

        def change_for(*call: Any, **named: Any) -> Any:
            named["proved"] = lambda member: True
            return decide(*call, **named)

        self.membership.change_for = change_for  # type: ignore[method-assign]


class FreesARemovedIdentitysLeases(locks.LockStateMachine):
    """Ends every lease of an identity the moment an admin removes it (issue 23): the keys
    go to the next waiters while the removed identity's holders still run, unfenced, up to
    their own deadlines."""

    def _execute(self, index: int, cmd: Any) -> locks.ApplyOutcome:
        outcome = super()._execute(index, cmd)
        if not (isinstance(cmd, locks.IdentityCommand) and cmd.op == "remove"):
            return outcome
        step = _Step(index, cmd.at_ms)
        for lease_id in [lid for lid, lease in self._leases.items() if lease.owner == cmd.name]:
            self._end_lease(lease_id, step, _Tombstone("", 0, locks.LeaseGone(lease_id), 0))
        return dataclasses.replace(
            outcome, promotions=tuple(step.promotions), ended=tuple(step.ended)
        )


class RestoresWithoutUsage(locks.LockStateMachine):
    """Forgets what each owner's leases take when it restores a snapshot: after a restart or
    an installed snapshot the per-identity quotas would count from zero."""

    @classmethod
    def _restore(cls, item: Any) -> Any:
        machine = super()._restore(item)
        machine.usage = OwnerUsage()
        return machine


class _BlindToMaxTtl(locks.ClusterSettings):
    """The same settings (its image is the same bytes) that never refuse a TTL."""

    __slots__ = ()

    def ttl_problem(self, ttl_ms: int) -> str | None:
        return None


class IgnoresMaxTtlAfterRestore(locks.LockStateMachine):
    """Issue 30: a replica restored from a snapshot image (a restart from its snapshot, or
    one a leader sent) keeps the cluster settings but no longer enforces the max-ttl: it
    applies a longer lease the others refuse, and as leader proposes one."""

    @classmethod
    def _restore(cls, item: Any) -> Any:
        machine = super()._restore(item)
        machine.__dict__["restored"] = True
        return machine

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "settings" and self.__dict__.get("restored"):
            blind = _BlindToMaxTtl()
            blind.values = value.values
            value = blind
        super().__setattr__(name, value)


class ForgetsSkips(SimLedger):
    """Issue 28: an exec acquire answered "held" is not counted on the run it found, so
    `dlm runs` shows no skips and the fleet's other hosts look absent."""

    def skipped(self, key: str, tokens: list[int]) -> None:
        return


class ImagesWithoutRuns(SimLedger):
    """Issue 28: the snapshot image leaves the runs out, so a member restarted from its
    snapshot, or sent one, has lost them (the ledger would not survive a restart)."""

    def image(self) -> list[Any]:
        return []


class ResumesFromNow(Watches):
    """Serves a resuming watch from now instead of after the index it names: whatever
    changed while the watcher was away is never pushed to it."""

    def request(self, conn: int, req: Watch, applied: int) -> None:
        super().request(conn, Watch(id=req.id, key=req.key, prefix=req.prefix), applied)


class _LimitsIgnored(IdentityTable):
    """An identity table that never has an identity's own quotas."""

    __slots__ = ()

    def limits_of(self, name: str) -> tuple[int, ...]:
        return NO_LIMITS


class IgnoresIdentityLimits(locks.LockStateMachine):
    """Never looks up an admin's per-identity quotas (``dlm auth set``), neither when the
    leader writes an entry's quota (the member's ``limits_for``) nor at apply: every
    identity keeps the members' defaults, whatever an admin set."""

    @property
    def identities(self) -> IdentityTable:
        return self._ignoring

    @identities.setter
    def identities(self, table: IdentityTable) -> None:
        table.__class__ = _LimitsIgnored  # the same table, read without its limits
        self._ignoring = table


class EndsLockDelaysOnFailover(LeaseTracker):
    """A new leader that does not count the lock-delays again from its election: it ends
    every one at once (as if the old leader's clock had already run them out)."""

    def take_office(self, now: float, leases: Any) -> None:
        leases = [
            (lease, 0 if locks.delayed_key(lease) is not None else ttl_ms, incarnation)
            for lease, ttl_ms, incarnation in leases
        ]
        super().take_office(now, leases)


class _IgnoredDelays(locks.LockDelays):
    def start(self, lease: str, delay_ms: int, keys: Any, index: int, at_ms: int) -> list[str]:
        return []


class ExpiresWithoutTheLockDelay(locks.LockStateMachine):
    """Hands a key on at once when its holder's lease expires, whatever its lock-delay."""

    def __init__(self) -> None:
        super().__init__()
        self.delays = _IgnoredDelays()


class SpreadsWithoutRotation(NodeMachine):
    """Issue 25, leader spread: every partition prefers the voters in the same order (no
    rotation by the partition), so one member ends up leading them all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spread.partition = 0


class NeverSpreads(NodeMachine):
    """Issue 25, leader spread: a leader never hands leadership over; whoever won the
    elections after the faults keeps what it leads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spread.partitions = 1


class ServesEveryPartitionsKeys(NodeMachine):
    """Issue 25: a partition's process serves a request about any key, its own partition's
    or not (no WRONG_PARTITION): a client that routed a key by a count it had not learned
    yet takes it in a group that does not own it, beside the group that does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The machine refuses another partition's key only when it knows of partitions;
        # its spread was set up already, and keeps spreading.
        self.config = dataclasses.replace(self.config, partitions=1)


class StopsTheMemberAtAnyCrash(RestartPolicy):
    """Issue 25, the supervisor: takes any exit of a partition's process but 0 as final, as
    it should only the codes no restart can fix: one partition's crash stops every partition
    of the member and the member exits, for good."""

    def exited(self, partition: int, code: int, now: float) -> Verdict:
        verdict = super().exited(partition, code, now)
        if isinstance(verdict, Restart):
            return GiveUp(1, f"partition {partition} stopped with exit code {code}")
        return verdict


class CountsOnTheLatestPart(PartClocks):
    """Issue 25, leases with parts: the client counts on its lease until the LATEST part's
    deadline, not the earliest; a part that was not renewed (its partition out of reach)
    expires, and its keys are given away, while the client still holds them."""

    @property
    def deadline(self) -> float:
        return max(c.deadline for c in self._clocks())


class _FsyncBlindRecorder(SpanRecorder):
    def durable(self, job: int, now: Instant) -> None:
        pass


class DropsTheFsyncSpan(NodeMachine):
    """Issue 30: the span recorder never hears that the leader's write was durable, so a
    traced request's spans leave without the fsync that its commit waited for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spans = _FsyncBlindRecorder(self.out, self.config.node_id)  # one partition


class _EarlyApplyRecorder(SpanRecorder):
    def applied(self, index: int, now: Instant) -> None:
        # Stamped with the time the entry was handed out, not the apply's.
        traced = self._by_index.get(index)
        if traced is not None:
            traced.applied = traced.fsync_start


class MisordersTheApplySpan(NodeMachine):
    """Issue 30: the apply is recorded at the time the entry was proposed, before the
    fsync its commit waited for ended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spans = _EarlyApplyRecorder(self.out, self.config.node_id)


class RelaysAnyTarget(GatewayRouter):
    """Issue 30, the gateway: honours a target preamble naming any address, member of its
    --cluster or not (an open relay)."""

    def plan(self, partition: int, target: str | None) -> list[str] | None:
        address = canonical(target) if target is not None else None
        if address is not None and address not in self.members:
            return [address]
        return super().plan(partition, target)


class PrefersItsHint(GatewayRouter):
    """Issue 30, the gateway: forwards to the member it cached as the partition's leader
    even when the client named another (the one that told it NOT_LEADER named it)."""

    def plan(self, partition: int, target: str | None) -> list[str] | None:
        hinted = self.hint(partition)
        if target is not None and hinted is not None and canonical(target) in self.members:
            return [hinted]
        return super().plan(partition, target)


def names_30s_to_every_member(request: dict[str, Any], version: int | None) -> dict[str, Any]:
    """Issue 30: the client fits an open naming no TTL as if every member were older than
    protocol 5, so `dlm acquire` without --ttl gets 30 s whatever the default-ttl says."""
    return for_member(request, 4)


class JoinsPartsAtRoundsOnly(PartClocks):
    """Issue 30 (seed 33 of the gateway runs): a part the book learned of (an acquire in
    a new partition, its open retried through another gateway past the part's TTL) joins
    the keeper's clocks only at its next renewal round, so until then the lease counts on
    its other parts' deadlines alone."""

    def join(self) -> None:
        pass
