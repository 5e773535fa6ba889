"""Proposals: what the leader puts in the log, and the clients waiting for it.

A client's change (open, close or update a lease, acquire, release) is checked
against the cluster's version and quotas, turned into a log command, proposed and
remembered by its log index; when the entry at that index is applied, the machine
answers the client if the payload is the one we proposed. On its own the leader
proposes the expiry of leases whose deadline passed (leases.py) and, once every
member speaks it, the next cluster version. Pending proposals time out, and are
answered NOT_LEADER when leadership is lost (the client re-sends with the same seq).
Pure: part of the node machine (machine.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlm.node import locks
from dlm.node.clients import ClientConn, Clients
from dlm.node.leases import LeaseTracker
from dlm.node.locks.identities import ADMIN
from dlm.node.locks.settings import DEFAULT_TTL, LOCK_DELAY, setting_problem
from dlm.node.outbox import Instant, NotLeaderReply, Outbox
from dlm.node.quotas import LimitsFor, limit_name, over_quota
from dlm.node.raft.core import RaftNode
from dlm.node.raft.types import NotLeader
from dlm.wire import (
    Acquire,
    AuthAdd,
    AuthChange,
    AuthFinish,
    AuthRemove,
    AuthRotate,
    AuthSet,
    ClientRequest,
    CloseLease,
    ConfigSet,
    ErrorCode,
    LockChange,
    OpenLease,
    Proclaim,
    Release,
    UpdateLease,
    error,
)

if TYPE_CHECKING:
    from dlm.node.machine_config import Quotas


@dataclass(slots=True)
class Proposal:
    conn: int
    request: ClientRequest
    data: bytes
    command: locks.Command
    started: float
    received_ms: int


class Refusal(Exception):
    """A request the leader refuses before proposing it."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra

    def reply(self, rid: int) -> dict[str, Any]:
        return error(rid, self.code, self.message, **self.extra)


class Proposals:
    """The leader's pending client proposals by log index, and its own proposals."""

    def __init__(
        self,
        out: Outbox,
        clients: Clients,
        not_leader: NotLeaderReply,
        quotas: Quotas,
        limits_for: LimitsFor | None = None,
    ) -> None:
        self._out = out
        self._clients = clients
        self._not_leader = not_leader
        self.quotas = quotas
        """The member's quotas (a reload replaces them: NodeMachine.member_connections)."""
        self._limits_for: LimitsFor = limits_for or default_limits(quotas)
        self.pending: dict[int, Proposal] = {}
        self._version_proposed_at = -1.0e9
        self._quarantine_said = False

    def propose(
        self,
        state: ClientConn,
        req: LockChange | AuthChange,
        now: Instant,
        *,
        raft: RaftNode,
        machine: locks.LockStateMachine,
        doomed: Callable[[str], bool],
    ) -> None:
        """The leader proposes a client's change (or says why it will not)."""
        conn = state.conn
        identity = state.identity or ADMIN
        try:
            if isinstance(req, ConfigSet):
                cmd: locks.Command = settings_command(req, identity, now, machine)
            elif isinstance(req, AuthAdd | AuthRemove | AuthRotate | AuthFinish | AuthSet):
                cmd = identity_command(req, identity, now, machine)
            else:
                cmd = command_for(
                    req,
                    now,
                    machine,
                    self.quotas,
                    doomed,
                    identity=identity,
                    limits_for=self._limits_for,
                )
        except Refusal as refusal:
            self._out.answer(conn, req.TYPE, refusal.reply(req.id))
            return
        problem = locks.validate_command(cmd)
        if problem is not None:
            self._clients.bad_request(
                state, req.TYPE, req.id, ErrorCode.BAD_REQUEST, problem, now=now, out=self._out
            )
            return
        data = locks.encode_command(cmd)
        result = raft.propose(data)
        if isinstance(result, NotLeader):
            self._not_leader(conn, req, result.leader)
            return
        self._out.stats.proposals += 1
        self.pending[result] = Proposal(conn, req, data, cmd, now.mono, now.wall_ms)

    def time_out(self, started_before: float) -> None:
        if not self.pending:
            return
        for index in [i for i, p in self.pending.items() if p.started < started_before]:
            p = self.pending.pop(index)
            self._out.answer(
                p.conn,
                p.request.TYPE,
                error(p.request.id, ErrorCode.TIMEOUT, "not committed in time; re-send"),
            )

    def fail_all(self) -> None:
        """Leadership is lost: no pending proposal will be answered by this member."""
        pending, self.pending = self.pending, {}
        for proposal in pending.values():
            self._not_leader(proposal.conn, proposal.request)

    def shut_down(self) -> None:
        pending, self.pending = self.pending, {}
        for proposal in pending.values():
            self._out.answer(
                proposal.conn,
                proposal.request.TYPE,
                error(proposal.request.id, ErrorCode.SHUTTING_DOWN, "member is shutting down"),
            )

    def took_office(self) -> None:
        self._version_proposed_at = -1.0e9
        self._quarantine_said = False

    def say_quarantine_end(
        self,
        tracker: LeaseTracker,
        machine: locks.LockStateMachine,
        raft: RaftNode,
        now: Instant,
    ) -> None:
        """A leader of a quarantined cluster says once, through the log, when by its clock
        the quarantine ends (for `dlm status` and the LOCKED reply; the end itself is the
        Expire of the quarantine's lease, proposed when its deadline passes)."""
        if self._quarantine_said or machine.quarantine is None:
            return
        remaining = tracker.remaining_ms(locks.QUARANTINE_LEASE, now.mono)
        if remaining is None:
            return
        cmd = locks.QuarantineCommand(now.wall_ms + remaining, now.wall_ms)
        if not isinstance(raft.propose(locks.encode_command(cmd)), NotLeader):
            self._quarantine_said = True
            self._out.log("info", "quarantine_until_proposed", until_ms=cmd.until_ms)

    def expire_due(self, tracker: LeaseTracker, raft: RaftNode, now: Instant) -> None:
        """The leader proposes the expiry of every lease whose deadline passed."""
        for lease, incarnation in tracker.due(now.mono):
            cmd = locks.ExpireCommand(lease, incarnation, now.wall_ms)
            result = raft.propose(locks.encode_command(cmd))
            if isinstance(result, NotLeader):
                return
            self._out.log("info", "lease_deadline_passed", lease=lease, index=result)

    def raise_version(
        self,
        *,
        version: int,
        max_version: int,
        versions_spoken: Iterable[int],
        raft: RaftNode,
        retry_after_s: float,
        now: Instant,
    ) -> None:
        """The leader moves the log to the highest version every member speaks, up to its
        own ``max_version`` (PROTOCOL.md); ``versions_spoken``: the highest version of each
        other member. (A cluster with a member of the previous release still reaches the
        version that member speaks.)"""
        if version >= max_version:
            return
        if now.mono - self._version_proposed_at < retry_after_s:
            return
        target = min((max_version, *versions_spoken))
        if target <= version:
            return
        cmd = locks.ClusterVersionCommand(target, now.wall_ms)
        if not isinstance(raft.propose(locks.encode_command(cmd)), NotLeader):
            self._version_proposed_at = now.mono
            self._out.log("info", "cluster_version_proposed", version=target)


def command_for(
    req: LockChange,
    now: Instant,
    machine: locks.LockStateMachine,
    quotas: Quotas,
    doomed: Callable[[str], bool],
    *,
    identity: str = "",
    limits_for: LimitsFor | None = None,
) -> locks.ClientCommand:
    """The log command for ``req``, in the form the cluster's version runs; ``identity``:
    who the requesting connection authenticated as (from version 3 a new lease's owner,
    and the identity each command names, which the state machine checks again), and
    ``limits_for`` the quotas of each identity (dlm/node/quotas.py)."""
    v3 = machine.version >= 3
    if limits_for is None:
        limits_for = default_limits(quotas)
    v2 = machine.version >= 2
    by = identity if machine.version >= 3 else ""
    if v2 and req.client:
        origin = locks.Origin(req.client, req.seq, req.acked)
    else:
        origin = locks.Origin(locks.LEGACY_CLIENT, req.seq)
    at_ms = now.wall_ms
    if isinstance(req, OpenLease | UpdateLease | Acquire) and doomed(req.lease):
        # Joining or updating a lease restarts its clock, and an acquire's grant would
        # last only until the Expire already in the log: none is worth proposing.
        # (Closing or releasing still is: that is what the client wants anyway.)
        raise being_expired(req.lease)
    if isinstance(req, OpenLease | UpdateLease) and machine.version >= 5:
        # The cluster's max-ttl (`dlm config set`): refused here with its name; apply
        # refuses the entry again should a lower max-ttl commit before it.
        problem = machine.settings.ttl_problem(_ttl_of(req, machine))
        if problem is not None:
            raise Refusal(ErrorCode.BAD_REQUEST, problem, limit="max_ttl")
    if isinstance(req, OpenLease):
        if machine.lease_terms(req.lease) is None:
            # The leader refuses early what it can see; the entry carries the identity's
            # limit so that apply decides alike everywhere, in-flight proposals included.
            if machine.counts().sessions >= quotas.max_leases:
                raise _quota(f"this cluster holds {quotas.max_leases} leases", "max_leases")
            max_leases = limits_for(identity).max_leases
            if machine.usage.of(identity).leases >= max_leases:
                raise _identity_quota(identity, "leases", max_leases)
            _check_meta_quota(req.meta, quotas)
        return locks.OpenLeaseCommand(
            lease=req.lease,
            ttl_ms=_ttl_of(req, machine),
            origin=origin,
            at_ms=at_ms,
            ephemeral=req.ephemeral and v2,
            meta=req.meta if v2 else {},
            owner=identity if v3 else "",
            quota=limits_for(identity).max_leases if v3 else 0,
            lock_delay_ms=_lock_delay(req, machine),
        )
    if isinstance(req, CloseLease):
        # Before version 4 a revocation is a plain close: no lease has a lock-delay then.
        revoke = bool(req.revoke) and machine.version >= 4
        return locks.CloseLeaseCommand(
            req.lease, origin, at_ms, by, run_report(req, machine), revoke=revoke
        )
    if isinstance(req, Acquire):
        # A re-sent or re-entrant acquire of a key the lease already holds or waits
        # for adds nothing, and must get its grant (or place) back, not a refusal.
        adds = not (machine.holds(req.lease, req.key) or machine.waits(req.lease, req.key))
        counts = machine.counts()
        # The lease's owner is counted (not the asking connection's identity: with
        # permissions, only the owner may use the lease).
        terms = machine.lease_terms(req.lease)
        owner = None if terms is None else terms.owner
        max_locks = 0 if owner is None else limits_for(owner).max_locks
        if adds and counts.locks + counts.waiters >= quotas.max_locks:
            raise _quota(f"this cluster holds {quotas.max_locks} locks and waiters", "max_locks")
        if adds and owner is not None and machine.usage.of(owner).locks >= max_locks:
            raise _identity_quota(owner, "locks", max_locks)
        _check_meta_quota(req.meta, quotas)
        return locks.AcquireCommand(
            req.lease,
            req.key,
            req.wait,
            req.limit,
            req.meta,
            origin,
            at_ms,
            by,
            quota=max_locks if v3 else 0,
        )
    if isinstance(req, Release):
        if not v2 and req.token is not None:
            raise upgrading("release with a fencing token")
        return locks.ReleaseCommand(
            req.lease, req.key, req.token, req.keep_lease or not v2, origin, at_ms, by
        )
    if isinstance(req, Proclaim):
        if machine.version < 4:
            raise upgrading("proclaim", 4)
        return locks.ProclaimCommand(req.lease, req.key, req.value, origin, at_ms, by)
    if not v2:
        raise upgrading("lease_update")
    report = run_report(req, machine) if req.finished else None
    return locks.UpdateLeaseCommand(req.lease, req.ttl_ms, req.finished, origin, at_ms, by, report)


def run_report(
    req: CloseLease | UpdateLease, machine: locks.LockStateMachine
) -> locks.RunReport | None:
    """How the run of the lease's grant ended, as the request says (dlm exec), in the log
    from cluster version 4 on; before, a member of the previous release could not read
    it, and the request goes in without it (the run ledger starts at version 4)."""
    if req.outcome is None or machine.version < 4:
        return None
    return locks.RunReport(req.outcome, req.exit_code, req.signal)


def _lock_delay(req: OpenLease, machine: locks.LockStateMachine) -> int:
    """The lease's lock-delay: the one it names, else the cluster's lock-delay setting."""
    if req.lock_delay_ms is None and machine.version >= 5:
        return machine.settings.get(LOCK_DELAY)
    if not req.lock_delay_ms:
        return 0
    if machine.version < 4:
        raise upgrading("--lock-delay", 4)
    return req.lock_delay_ms


def identity_command(
    req: AuthAdd | AuthRemove | AuthRotate | AuthFinish | AuthSet,
    identity: str,
    now: Instant,
    machine: locks.LockStateMachine,
) -> locks.IdentityCommand:
    """The log command of an identity change (cluster version 3 on; limits from 4 on)."""
    if machine.version < 3:
        raise upgrading("identities (dlm auth)", 3)
    if isinstance(req, AuthSet) and machine.version < 4:
        raise upgrading("per-identity limits (dlm auth set)", 4)
    # Before version 4 a removal goes without its request id (members of the previous
    # release cannot read it): a re-sent one may then be answered "no identity".
    request = req.request if isinstance(req, AuthRemove) and machine.version >= 4 else b""
    if isinstance(req, AuthSet):
        change = (req.max_leases, req.max_locks, req.max_connections, req.max_inflight)
        return locks.IdentityCommand(
            op="limits",
            name=req.name,
            role="",
            prefixes=(),
            key_id=b"",
            stored_key=b"",
            server_key=b"",
            by=identity,
            at_ms=now.wall_ms,
            limits=change,
        )
    role, prefixes = (req.role, tuple(req.prefixes)) if isinstance(req, AuthAdd) else ("", ())
    keys = (b"", b"", b"")
    if isinstance(req, AuthAdd | AuthRotate):
        keys = (req.key_id, req.stored_key, req.server_key)
    return locks.IdentityCommand(
        op=req.TYPE.removeprefix("auth_"),
        name=req.name,
        role=role,
        prefixes=prefixes,
        key_id=keys[0],
        stored_key=keys[1],
        server_key=keys[2],
        by=identity,
        at_ms=now.wall_ms,
        request=request,
    )


def being_expired(lease: str) -> Refusal:
    """The answer for a lease the leader has proposed to expire: it may not be counted on
    any longer, so nothing that would extend it or build on it is confirmed."""
    return Refusal(
        ErrorCode.SESSION_EXPIRED,
        f"lease {lease!r} is being expired: open a new lease",
        ended=locks.LEASE_EXPIRED,
    )


def _identity_quota(identity: str, kind: str, limit: int) -> Refusal:
    return Refusal(
        ErrorCode.QUOTA_EXCEEDED,
        over_quota(identity, kind, limit),
        limit=limit_name(kind),
        identity=identity,
    )


def _quota(what: str, limit: str) -> Refusal:
    return Refusal(
        ErrorCode.QUOTA_EXCEEDED,
        f"{what}, its limit (--{limit.replace('_', '-')}): release some, or raise the limit",
        limit=limit,
    )


def _ttl_of(req: OpenLease | UpdateLease, machine: locks.LockStateMachine) -> int:
    """The TTL the request asks for; an open that names none gets the cluster's
    default-ttl (`dlm config set`), else DEFAULT_TTL_MS."""
    if req.ttl_ms is not None:
        return req.ttl_ms
    return machine.settings.get(DEFAULT_TTL) or DEFAULT_TTL_MS


def settings_command(
    req: ConfigSet, identity: str, now: Instant, machine: locks.LockStateMachine
) -> locks.SettingsCommand:
    """The log command of `dlm config set` (cluster version 5 on)."""
    if machine.version < 5:
        raise upgrading("cluster settings (dlm config set)", 5)
    problem = setting_problem(req.setting, req.value_ms)
    if problem is not None:
        raise Refusal(ErrorCode.BAD_REQUEST, problem)
    return locks.SettingsCommand(req.setting, req.value_ms, identity, now.wall_ms)


DEFAULT_TTL_MS = 30_000
"""The TTL of a lease whose open names none, when the cluster sets no default-ttl (the
CLI's --ttl default)."""


def upgrading(what: str, version: int = 2) -> Refusal:
    return Refusal(
        ErrorCode.UNAVAILABLE,
        f"{what} needs every member on protocol version {version}, and an upgrade is in progress: "
        "retry once every member runs this release",
        retry_after_ms=1000,
    )


def _check_meta_quota(meta: Mapping[str, str], quotas: Quotas) -> None:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in meta.items())
    if size > quotas.max_meta_bytes:
        raise _quota(f"owner metadata of {size} bytes is over", "max_meta_bytes")


def default_limits(quotas: Quotas) -> LimitsFor:
    """The limits of each identity when nothing looks them up in the identity table: the
    built-in admin (the cluster's client secret, or no secret at all) and "" keep the
    cluster's and the member's own caps; any other identity the per-identity defaults."""
    named, anonymous = quotas.identity_defaults(), quotas.identity_defaults(anonymous=True)
    return lambda identity: anonymous if identity in ("", ADMIN) else named
