"""The lock table itself: leases, holders and FIFO queues, changed only by ``apply``.

Every replica applies the same committed entries in the same order and must
end in the same state, so nothing here reads a clock or draws randomness:
time arrives inside commands as ``at_ms`` (the proposing leader's wall clock,
kept only for display) and the fencing token of a grant is the log index of
the entry that made it. Iteration over leases and keys happens either in
insertion order (which the log fixes) or sorted, never in an order that a
snapshot restore could change.

State invariants kept by every apply step:

* a key has at most ``limit`` holders;
* a key has waiters only while all its slots are taken, the cluster is quarantined or
  the key is in its lock-delay (so freeing a slot and granting the first waiter happen
  in the same step);
* a key with neither holders nor waiters does not exist (its limit is forgotten),
  unless it is in its lock-delay;
* a lease holds or waits for a key at most once, and ``_Lease.holding`` /
  ``_Lease.waiting`` mirror the key table exactly.

At most once (docs/PROTOCOL.md): each lease keeps, per client, the results of
that client's requests above its acknowledged floor, so a re-sent request is
answered from memory and a request at or below the floor is refused as stale.
A lease that ends leaves a tombstone, kept for ``TOMBSTONE_MS`` of log time
(at most ``TOMBSTONES`` of them), with the result of the request that ended
it: a re-sent ``open_lease`` cannot bring the lease back (clients re-send an
open for at most a minute, well inside that time), and a re-sent close still
gets its answer. Log time is the sum of the steps between consecutive
entries' ``at_ms`` stamps, each step counted at most ``MAX_STAMP_STEP_MS``
and never backwards: the stamps are the proposing leaders' wall clocks, and a
new leader whose clock runs hours ahead of the last one's must not age every
tombstone at once (it would let a re-sent open create its lease again). An
idle gap counts short too; tombstones then live longer, never shorter.
Leases have an incarnation (the index of the entry that created them); an
``Expire`` of another incarnation does nothing.

Lock-delay (cluster version 4): a lease opened with ``lock_delay_ms`` that expires or
is revoked while holding keys leaves each of them delayed: no grant of the key until
the leader's Expire of the pseudo-lease ``~delay:KEY`` (``commands.delay_lease``),
which ``leases()`` lists beside the real leases, so the leader's lease deadlines time
it exactly as they time the quarantine (a new leader counts it afresh, in full, from
its own election). A release or a close by the lease's own process delays nothing.

Versions: ``version`` is the cluster version the log has reached
(``ClusterVersionCommand``). At version 1 the machine keeps exactly what the
previous release kept (no tombstones, incarnation 0, the last 32 results per
lease) and its snapshot has the previous release's layout, so a member of
either release can restore it during a rolling upgrade.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

import cbor2

from dlm.node.locks.commands import (
    ELECTION_VALUE,
    QUARANTINE_LEASE,
    AcquireCommand,
    ClientCommand,
    CloseLeaseCommand,
    ClusterVersionCommand,
    Command,
    CommandError,
    ExpireCommand,
    IdentityCommand,
    OpenLeaseCommand,
    Origin,
    ProclaimCommand,
    QuarantineCommand,
    ReleaseCommand,
    SettingsCommand,
    UpdateLeaseCommand,
    decode_command,
    delay_lease,
    delayed_key,
    validate_command,
)
from dlm.node.locks.delays import LockDelay, LockDelays
from dlm.node.locks.identities import (
    ADMIN_ONLY,
    LEASE,
    LOCK,
    IdentityTable,
    Verifier,
    refusal,
)
from dlm.node.locks.ledger import COMMAND_META, RunLedger
from dlm.node.locks.results import (
    LEASE_CLOSED,
    LEASE_EXPIRED,
    LEASE_UNKNOWN,
    Denied,
    Granted,
    Holder,
    IdentityChanged,
    Invalid,
    LeaseClosed,
    LeaseGone,
    LeaseOpened,
    LeaseUpdated,
    Locked,
    NotHeld,
    Promotion,
    Queued,
    QuotaExceeded,
    Released,
    Result,
    SettingChanged,
    StaleRequest,
    Waiter,
    _Plain,
    result_from_dict,
    str_map,
)
from dlm.node.locks.settings import ClusterSettings

COMMAND_PERMISSIONS: dict[type, tuple[str, str]] = {
    OpenLeaseCommand: ("open_lease", LEASE),
    CloseLeaseCommand: ("close_lease", LEASE),
    AcquireCommand: ("acquire", LOCK),
    ReleaseCommand: ("release", LEASE),
    UpdateLeaseCommand: ("lease_update", LEASE),
    ProclaimCommand: ("proclaim", LEASE),
}
"""Each client command's action (its request kind) and permission, as wire.py's table has
them (tests/unit/node/locks/test_identities.py compares the two)."""

SNAPSHOT_V1 = 1
SNAPSHOT_V2 = 2
SNAPSHOT_V3 = 3
"""Version 3 adds each lease's owner (the identity that opened it), the longest TTL
given and the quarantine of a restored cluster."""
SNAPSHOT_V4 = 4
"""Version 4 (cluster version 4) adds each lease's lock-delay and the keys in their
lock-delay."""
LEGACY_RECENT = 32
"""Results a lease remembers for version-1 (random-seq) requests, as the previous release did."""
MAX_UNANSWERED = 1024
"""Results kept per client and lease above its floor; more unanswered requests are refused."""
TOMBSTONE_MS = 300_000
"""How long (ms of log time: see the module docstring) an ended lease is remembered."""
MAX_STAMP_STEP_MS = 10_000
"""The most that one entry's stamp moves log time forward."""
TOMBSTONES = 1_000_000
"""At most this many ended leases are remembered (a memory bound under extreme churn)."""
RETRY_AFTER_MAX_MS = 30_000
"""Cap on the LOCKED retry hint: a poller should not sleep longer than this."""


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """Everything one applied entry produced.

    ``result``: the reply for the client that proposed the entry (None for an
    empty payload, a leader's no-op, or a cluster version entry).
    ``promotions``: waiters that this step made holders, in grant order; the
    proposer's own immediate grant is in ``result``, not here.
    ``armed``: (lease, ttl_ms, incarnation) of leases whose clock restarts with a
    full TTL now: opened, joined or updated. The leader's lease tracker re-arms
    each.
    ``ended``: leases that ended (closed, expired, or released idle); the tracker
    disarms them. ``expired`` lists those ended by an Expire.
    """

    index: int
    result: Result | None
    command: Command | None = None
    promotions: tuple[Promotion, ...] = ()
    armed: tuple[tuple[str, int, int], ...] = ()
    ended: tuple[str, ...] = ()
    expired: tuple[str, ...] = ()
    quarantine_ended: bool = False
    before: tuple[tuple[str, KeyState | None], ...] = ()
    """Each key this entry may have changed, with its state before the entry (None: the
    key did not exist), in the order first touched: the watch hub (dlm/node/watches.py)
    compares each with ``key_state`` after it to say what changed."""
    delayed: tuple[str, ...] = ()
    """Keys that entered their lock-delay in this step (sorted)."""


class KeyState(NamedTuple):
    """A key's state as the watch hub compares it: holders in grant order as
    (lease, token, metadata), waiters in queue order."""

    holders: tuple[tuple[str, int, dict[str, str]], ...]
    waiters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LeaseTerms(_Plain):
    """A lease's TTL, incarnation, finished mark and owner (``LeaseView`` without its
    keys)."""

    lease: str
    ttl_ms: int
    incarnation: int
    finished_at_ms: int | None
    owner: str = ""
    lock_delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class KeyView(_Plain):
    """A key as ``get``/``list_locks`` show it: holders in grant order, waiters in queue order."""

    key: str
    limit: int
    holders: tuple[Holder, ...]
    waiters: tuple[Waiter, ...]
    lock_delay: LockDelay | None = None
    """Set while the key is in a lock-delay: granted to nobody until it ends."""


@dataclass(frozen=True, slots=True)
class LeaseView(_Plain):
    lease: str
    ttl_ms: int
    opened_at_ms: int
    incarnation: int
    ephemeral: bool
    meta: dict[str, str]
    finished_at_ms: int | None
    """When a minimum hold's command finished (``lease_update`` with finished), else None."""
    holding: tuple[str, ...]
    """Keys the lease holds, sorted."""
    waiting: tuple[str, ...]
    """Keys the lease waits for, sorted."""
    owner: str = ""
    """The identity that opened the lease ("" before cluster version 3)."""
    lock_delay_ms: int = 0
    """How long each key it holds stays ungranted after it expires or is revoked."""


class Counts(NamedTuple):
    sessions: int
    locks: int
    """Held slots (a semaphore with three holders counts three)."""
    waiters: int


class Usage(NamedTuple):
    """What one identity's leases take: the per-identity quotas count these."""

    leases: int = 0
    locks: int = 0
    """Held slots plus places in queues."""


class OwnerUsage:
    """What the leases of each owner take, kept up to date by every apply step (and
    rebuilt on restore): the per-identity quotas (dlm/node/quotas.py) read it."""

    __slots__ = ("_by_owner",)

    def __init__(self) -> None:
        self._by_owner: dict[str, list[int]] = {}
        """Per owner: [leases, held slots + places in queues]; no entry at zero."""

    def of(self, identity: str) -> Usage:
        used = self._by_owner.get(identity)
        return Usage() if used is None else Usage(used[0], used[1])

    def by_owner(self) -> dict[str, Usage]:
        """Every owner whose leases take something (for checkers)."""
        return {owner: Usage(used[0], used[1]) for owner, used in self._by_owner.items()}

    def add(self, owner: str, locks: int, leases: int = 0) -> None:
        used = self._by_owner.get(owner)
        if used is None:
            used = self._by_owner[owner] = [0, 0]
        used[0] += leases
        used[1] += locks
        if used == [0, 0]:
            del self._by_owner[owner]


@dataclass(slots=True)
class _Hold:
    token: int
    granted_at_ms: int
    meta: dict[str, str]


@dataclass(slots=True)
class _Wait:
    since_ms: int
    meta: dict[str, str]


@dataclass(slots=True)
class _Key:
    limit: int
    holders: dict[str, _Hold] = field(default_factory=dict)
    waiters: OrderedDict[str, _Wait] = field(default_factory=OrderedDict)


@dataclass(slots=True)
class _ClientRecord:
    """What one client asked of one lease: results above ``floor``, by seq (oldest first)."""

    floor: int = 0
    results: OrderedDict[int, Result] = field(default_factory=OrderedDict)


@dataclass(slots=True)
class _Lease:
    ttl_ms: int
    opened_at_ms: int
    incarnation: int = 0
    ephemeral: bool = False
    meta: dict[str, str] = field(default_factory=dict)
    finished_at_ms: int | None = None
    owner: str = ""
    lock_delay_ms: int = 0
    clients: dict[str, _ClientRecord] = field(default_factory=dict)
    holding: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Tombstone:
    """How a lease ended: the ending request's client, seq and result (client "" for Expire),
    and when (the log time of the ending entry)."""

    client: str
    seq: int
    result: Result
    ended_log_ms: int


@dataclass(slots=True)
class Quarantine:
    """A restored or recovered cluster grants nothing until its leader expires this."""

    ttl_ms: int
    incarnation: int
    """The index it was set at: its Expire names it, as a lease's does."""
    until_ms: int = 0
    """When the leader said it ends (wall clock, for display; 0: not said yet)."""


@dataclass(slots=True)
class _Step:
    """Side effects collected while one entry is applied."""

    index: int
    at_ms: int
    promotions: list[Promotion] = field(default_factory=list)
    armed: list[tuple[str, int, int]] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    quarantine_ended: bool = False
    before: dict[str, KeyState | None] = field(default_factory=dict)
    delayed: list[str] = field(default_factory=list)


class LockStateMachine:
    """The replicated lock table. Feed it committed entries in log order via ``apply``."""

    tombstone_capacity = TOMBSTONES
    ledger_class = RunLedger
    """The run ledger's class (a seam: the simulator's keeps every run, its mutants lose some)."""
    check_permissions = True
    """A seam: the simulator's mutant switches the apply-time permission check off."""
    tombstone_ms = TOMBSTONE_MS
    max_stamp_step_ms = MAX_STAMP_STEP_MS

    def __init__(self) -> None:
        self._applied = 0
        self._version = 1
        self.identities = IdentityTable()
        """Who may do what (identities.py); in the node's snapshot image, not this one's."""
        self.ledger = self.ledger_class()
        self.settings = ClusterSettings()
        """The cluster-wide settings (settings.py, cluster version 5 on); in the node's
        snapshot image, as the identities are. Read-only outside apply."""
        """What became of each `dlm exec` run (ledger.py, cluster version 4 on); in the
        node's snapshot image, as the identities are."""
        self._leases: dict[str, _Lease] = {}
        self._keys: dict[str, _Key] = {}
        self._tombstones: OrderedDict[str, _Tombstone] = OrderedDict()
        self._log_ms = 0
        """Log time (version 2 on): the sum of the bounded steps between entries' stamps."""
        self._last_stamp_ms = 0
        """The ``at_ms`` of the last entry applied at version 2 or later (whichever way it
        moved log time: forward, not at all, or by the bound)."""
        self.max_ttl_ms = 0
        """The longest TTL a lease was given since the cluster reached version 3 (opened,
        joined or updated: ``--min-hold`` holds included). Read-only outside this module."""
        self.quarantine: Quarantine | None = None
        """Set in a restored or recovered cluster until a leader ends it. Read-only."""
        self.delays = LockDelays()
        """Keys in their lock-delay (cluster version 4; delays.py). Read-only outside apply."""
        self._held = 0
        self._queued = 0
        self.usage = OwnerUsage()
        """What each owner's leases take (read-only outside apply)."""
        # Sorted views for paging, rebuilt only after a key or lease came or went.
        self._sorted_keys: list[str] | None = None
        self._sorted_leases: list[str] | None = None
        self._step: _Step | None = None
        """The step being applied: ``_touch`` records the keys it changes (and their
        state before it)."""

    # ------------------------------------------------------------------ apply

    @property
    def applied_index(self) -> int:
        return self._applied

    @property
    def version(self) -> int:
        """The cluster version this log has reached (1 until a ClusterVersionCommand)."""
        return self._version

    def apply(self, index: int, data: bytes) -> ApplyOutcome:
        """Apply the entry at ``index`` whose payload is ``data``.

        Indices must increase (gaps are fine: entries the runtime does not hand
        over, such as membership changes, are simply skipped). An empty payload
        is a no-op; a malformed one yields an Invalid result and changes
        nothing but ``applied_index``.
        """
        self._advance(index)
        if not data:
            return ApplyOutcome(index, None)
        try:
            cmd = decode_command(data)
        except CommandError as exc:
            return ApplyOutcome(index, Invalid(str(exc)))
        return self._execute(index, cmd)

    def apply_command(self, index: int, cmd: Command) -> ApplyOutcome:
        """``apply`` for an already decoded command (saves the leader decoding its own)."""
        self._advance(index)
        return self._execute(index, cmd)

    def skip(self, index: int) -> None:
        """Entry ``index`` is not ours (a membership change): only ``applied_index`` moves."""
        self._advance(index)

    def _advance(self, index: int) -> None:
        if index <= self._applied:
            raise ValueError(f"entry {index} applied after entry {self._applied}: out of order")
        self._applied = index

    def _execute(self, index: int, cmd: Command) -> ApplyOutcome:
        problem = validate_command(cmd)
        if problem is not None:
            return ApplyOutcome(index, Invalid(problem), cmd)
        if self._version >= 2:
            self._tick_log_clock(cmd.at_ms)
        if self._version < 3 and _needs_version_3(cmd):
            # A member of the previous release cannot read an owner or a quota: every
            # replica refuses them alike until the log reaches version 3 (the leader never
            # proposes one before).
            return ApplyOutcome(index, Invalid("a lease owner needs cluster version 3"), cmd)
        if self._version < 4 and _needs_version_4(cmd):
            # Older members cannot keep a lock-delay: refused alike everywhere until the
            # log reaches version 4 (the leader never proposes one before).
            return ApplyOutcome(index, Invalid("a lock-delay needs cluster version 4"), cmd)
        if isinstance(cmd, ClusterVersionCommand):
            # Versions only rise: a stale proposal of an older version changes nothing.
            self._version = max(self._version, cmd.version)
            return ApplyOutcome(index, None, cmd)
        if isinstance(cmd, QuarantineCommand):
            if self.quarantine is not None:
                self.quarantine.until_ms = cmd.until_ms
            return ApplyOutcome(index, None, cmd)
        if isinstance(cmd, IdentityCommand):
            return ApplyOutcome(index, _change_identities(self.identities, cmd, self._version), cmd)
        if isinstance(cmd, SettingsCommand):
            return ApplyOutcome(index, _change_settings(self, cmd), cmd)
        if self._version >= 5:
            # Under max-ttl, checked again here: a request the leader let through just
            # before a lower max-ttl committed is refused alike by every replica.
            problem = _ttl_refusal(self, cmd)
            if problem is not None:
                return ApplyOutcome(index, Invalid(problem), cmd)
        step = self._step = _Step(index, cmd.at_ms)
        try:
            result = self._dispatch(cmd, step)
        finally:
            self._step = None
        if self._version >= 3:
            for armed_lease, ttl_ms, _incarnation in step.armed:
                if delayed_key(armed_lease) is None:
                    self.max_ttl_ms = max(self.max_ttl_ms, ttl_ms)
        return ApplyOutcome(
            index,
            result,
            cmd,
            tuple(step.promotions),
            tuple(step.armed),
            tuple(step.ended),
            tuple(step.expired),
            step.quarantine_ended,
            tuple(step.before.items()),
            tuple(step.delayed),
        )

    def _tick_log_clock(self, at_ms: int) -> None:
        # Only from version 2 on, so that replicas that restored a version-1 image and
        # replicas that applied those entries one by one keep the same log time.
        stepped = at_ms - self._last_stamp_ms
        self._last_stamp_ms = at_ms
        if stepped > 0:
            self._log_ms += min(stepped, self.max_stamp_step_ms)

    def _dispatch(self, cmd: Command, step: _Step) -> Result:
        assert not isinstance(
            cmd, ClusterVersionCommand | QuarantineCommand | IdentityCommand | SettingsCommand
        )
        if isinstance(cmd, ExpireCommand):
            return self._expire(cmd, step)
        lease = self._leases.get(cmd.lease)
        denied = _denied(self.identities, cmd, lease) if self.check_permissions else None
        if denied is not None:
            return denied
        if lease is None:
            if isinstance(cmd, OpenLeaseCommand):
                return self._open_new(cmd, step)
            return self._after_end(cmd)
        if isinstance(cmd, OpenLeaseCommand) and cmd.origin.legacy:
            # Version 1: an open is idempotent by lease id alone and remembers nothing.
            step.armed.append((cmd.lease, lease.ttl_ms, lease.incarnation))
            return LeaseOpened(cmd.lease, lease.ttl_ms, lease.incarnation, joined=True)
        record, cached = self._recall(lease, cmd.origin)
        if cached is not None:
            return self._replay(cmd.lease, cached)
        self._executing(cmd)
        result: Result
        match cmd:
            case OpenLeaseCommand():
                # Joining a live lease: another process of the same owner, or a re-send
                # whose record was acknowledged away. Its clock restarts (never shortens).
                step.armed.append((cmd.lease, lease.ttl_ms, lease.incarnation))
                result = LeaseOpened(cmd.lease, lease.ttl_ms, lease.incarnation, joined=True)
            case CloseLeaseCommand():
                if cmd.report is not None and self._version >= 4:
                    self.ledger.ended(cmd.lease, cmd.at_ms, cmd.report)
                released = tuple(sorted(lease.holding))
                result = LeaseClosed(cmd.lease, released)
                if cmd.revoke:
                    _start_delays(self, cmd.lease, lease, step)
                ending = _Tombstone(cmd.origin.client, cmd.origin.seq, result, self._log_ms)
                self._end_lease(cmd.lease, step, ending)
                return result  # the lease and its records are gone; the tombstone answers
            case AcquireCommand():
                result = self._acquire(cmd, lease, step)
            case ReleaseCommand():
                result = self._release(cmd, lease, step)
                if isinstance(result, Released) and result.lease_ended:
                    ending = _Tombstone(cmd.origin.client, cmd.origin.seq, result, self._log_ms)
                    self._end_lease(cmd.lease, step, ending)
                    return result
            case ProclaimCommand():
                # The value changes in place: same grant, same token, no new election.
                entry = self._keys.get(cmd.key)
                hold = None if entry is None else entry.holders.get(cmd.lease)
                if hold is None or entry is None:
                    result = NotHeld(cmd.key, () if entry is None else self._holders(entry))
                else:
                    _touch(self, cmd.key)  # a watcher sees it as "proclaimed"
                    hold.meta = {**hold.meta, ELECTION_VALUE: cmd.value}
                    result = Granted(cmd.key, hold.token, cmd.lease)
            case UpdateLeaseCommand():
                lease.ttl_ms = cmd.ttl_ms
                if cmd.finished:
                    lease.finished_at_ms = cmd.at_ms
                    if cmd.report is not None and self._version >= 4:
                        self.ledger.ended(cmd.lease, cmd.at_ms, cmd.report)
                step.armed.append((cmd.lease, cmd.ttl_ms, lease.incarnation))
                result = LeaseUpdated(cmd.lease, cmd.ttl_ms)
        if record is not None:
            self._remember(record, cmd.origin, result)
        return result

    # -- at most once ---------------------------------------------------------

    def _recall(self, lease: _Lease, origin: Origin) -> tuple[_ClientRecord | None, Result | None]:
        """The client's record on ``lease`` and the remembered result of this request, if any.

        A request at or below the client's floor gets StaleRequest; too many
        unanswered requests get Invalid. Neither runs.
        """
        record = lease.clients.get(origin.client)
        if origin.legacy:
            if record is None:
                record = lease.clients[origin.client] = _ClientRecord()
            return record, record.results.get(origin.seq)
        if record is None:
            record = lease.clients[origin.client] = _ClientRecord(floor=origin.acked)
        elif origin.acked > record.floor:
            record.floor = origin.acked
            # All of them, not a prefix: results are kept in log order, which retries
            # and concurrent requests can make differ from seq order.
            results = record.results
            for seq in [seq for seq in results if seq <= origin.acked]:
                del results[seq]
        if origin.seq <= record.floor:
            return record, StaleRequest(origin.seq)
        cached = record.results.get(origin.seq)
        if cached is None and len(record.results) >= MAX_UNANSWERED:
            return record, Invalid(
                f"client {origin.client} has {MAX_UNANSWERED} unanswered requests on this lease: "
                "wait for some answers before sending more"
            )
        return record, cached

    def _remember(self, record: _ClientRecord, origin: Origin, result: Result) -> None:
        results = record.results
        results[origin.seq] = result
        if origin.legacy and len(results) > LEGACY_RECENT:
            results.popitem(last=False)

    def _replay(self, lease_id: str, cached: Result) -> Result:
        # A waiting client that lost its connection re-sends its acquire to
        # learn what became of it: answer with the present, not the past.
        if isinstance(cached, Queued):
            entry = self._keys.get(cached.key)
            if entry is not None:
                hold = entry.holders.get(lease_id)
                if hold is not None:
                    return Granted(cached.key, hold.token, lease_id)
                if lease_id in entry.waiters:
                    return Queued(cached.key, self._position(entry, lease_id))
        return cached

    def _after_end(self, cmd: ClientCommand) -> Result:
        """A request for a lease that does not exist: the answer its ending gave, or gone."""
        stone = self._tombstones.get(cmd.lease)
        origin = cmd.origin
        if (
            stone is not None
            and not origin.legacy
            and stone.client == origin.client
            and stone.seq == origin.seq
        ):
            return stone.result
        return LeaseGone(cmd.lease, self.lease_ending(cmd.lease))

    def lease_ending(self, lease_id: str) -> str:
        """How a lease that is not live ended, by its tombstone (results.LEASE_*): expired,
        closed, or unknown when there is none; "" at version 1, which keeps none."""
        stone = self._tombstones.get(lease_id)
        if stone is None:
            return LEASE_UNKNOWN if self._version >= 2 else ""
        # An Expire leaves LeaseGone as its ending; a close or a release leaves its answer.
        return LEASE_EXPIRED if isinstance(stone.result, LeaseGone) else LEASE_CLOSED

    # -- leases ---------------------------------------------------------------

    def _open_new(self, cmd: OpenLeaseCommand, step: _Step) -> Result:
        if cmd.lease in self._tombstones:
            return LeaseGone(cmd.lease, self.lease_ending(cmd.lease))
        quota = _quota(self.identities, cmd.owner, cmd.quota, 0)
        if quota and self.usage.of(cmd.owner).leases >= quota:
            # Decided from the replicated state and the quota in the entry, so every
            # replica refuses alike; remembered like any result, so a re-send is refused
            # again rather than run against a count that has moved.
            return QuotaExceeded(cmd.owner, "leases", quota)
        self._executing(cmd)
        incarnation = step.index if self._version >= 2 else 0
        lease = _Lease(
            ttl_ms=cmd.ttl_ms,
            opened_at_ms=cmd.at_ms,
            incarnation=incarnation,
            ephemeral=cmd.ephemeral,
            meta=dict(cmd.meta),
            owner=cmd.owner,
            lock_delay_ms=cmd.lock_delay_ms,
        )
        self._leases[cmd.lease] = lease
        self._sorted_leases = None
        self.usage.add(lease.owner, 0, 1)
        result = LeaseOpened(cmd.lease, cmd.ttl_ms, incarnation)
        origin = cmd.origin
        if not origin.legacy:
            record = lease.clients[origin.client] = _ClientRecord(floor=origin.acked)
            if origin.seq > record.floor:
                self._remember(record, origin, result)
        step.armed.append((cmd.lease, cmd.ttl_ms, incarnation))
        return result

    def _expire(self, cmd: ExpireCommand, step: _Step) -> Result:
        q = self.quarantine
        if cmd.lease == QUARANTINE_LEASE:
            if q is None or q.incarnation != cmd.incarnation:
                return LeaseGone(cmd.lease)
            self.quarantine = None
            step.quarantine_ended = True
            step.ended.append(QUARANTINE_LEASE)
            # Sorted, so every replica grants in the same order.
            for key in sorted(self._keys):
                self._grant_waiters(key, self._keys[key], step)
            return LeaseClosed(cmd.lease, ())
        delayed = delayed_key(cmd.lease)
        if delayed is not None:
            if not self.delays.end(delayed, cmd.incarnation):
                return LeaseGone(cmd.lease)
            step.ended.append(cmd.lease)
            entry = self._keys.get(delayed)
            if entry is not None:
                self._grant_waiters(delayed, entry, step)
                self._forget_if_idle(delayed, entry)
            return LeaseClosed(cmd.lease, ())
        lease = self._leases.get(cmd.lease)
        if lease is None or not self._is_incarnation(lease, cmd.incarnation):
            return LeaseGone(cmd.lease)
        result = LeaseClosed(cmd.lease, tuple(sorted(lease.holding)))
        _start_delays(self, cmd.lease, lease, step)
        self._end_lease(cmd.lease, step, _Tombstone("", 0, LeaseGone(cmd.lease), self._log_ms))
        step.expired.append(cmd.lease)
        return result

    def _end_lease(self, lease_id: str, step: _Step, ending: _Tombstone) -> None:
        lease = self._leases[lease_id]
        # Sorted, so a replica restored from a snapshot grants in the same order.
        for key in sorted(lease.waiting):
            self._drop_waiter(key, self._keys[key], lease_id, lease)
        for key in sorted(lease.holding):
            self._drop_holder(key, self._keys[key], lease_id, lease, step)
        del self._leases[lease_id]
        self._sorted_leases = None
        self.usage.add(lease.owner, 0, -1)
        step.ended.append(lease_id)
        if self._version >= 2:
            stones = self._tombstones
            stones.pop(lease_id, None)
            stones[lease_id] = ending
            horizon = ending.ended_log_ms - self.tombstone_ms
            # Oldest first: log time comes from the log, so every replica forgets the same ones.
            while stones and (
                len(stones) > self.tombstone_capacity
                or next(iter(stones.values())).ended_log_ms < horizon
            ):
                stones.popitem(last=False)

    # -- locks ----------------------------------------------------------------

    def _acquire(self, cmd: AcquireCommand, lease: _Lease, step: _Step) -> Result:
        entry = self._keys.get(cmd.key)
        if entry is not None:
            if entry.limit != cmd.limit:
                return Invalid(
                    f"key {cmd.key!r} is in use with limit={entry.limit}; acquire it with "
                    f"limit={entry.limit}, or wait until it has no holders and no waiters"
                )
            hold = entry.holders.get(cmd.lease)
            if hold is not None:
                return Granted(cmd.key, hold.token, cmd.lease)
            if cmd.lease in entry.waiters:
                return Queued(cmd.key, self._position(entry, cmd.lease))
        _touch(self, cmd.key)
        room = entry is None or self._has_room(entry)
        quota = _quota(self.identities, lease.owner, cmd.quota, 1)
        if (room or cmd.wait) and quota and self.usage.of(lease.owner).locks >= quota:
            return QuotaExceeded(lease.owner, "locks", quota)
        if entry is None:
            entry = _Key(limit=cmd.limit)
            self._keys[cmd.key] = entry
            self._sorted_keys = None
        quarantine = self.quarantine
        delay = self.delays.get(cmd.key)
        if quarantine is not None or delay is not None:
            # As if the key were held: no grant, a place in its queue under --wait.
            if cmd.wait:
                entry.waiters[cmd.lease] = _Wait(step.at_ms, dict(cmd.meta))
                lease.waiting.add(cmd.key)
                self._queued += 1
                self.usage.add(lease.owner, 1)
                return Queued(cmd.key, len(entry.waiters))
            blocked_ms = max(
                0 if quarantine is None else quarantine.ttl_ms, 0 if delay is None else delay.ms
            )
            retry = max(1, min(blocked_ms, RETRY_AFTER_MAX_MS))
            if entry.holders:
                retry = self._retry_after(entry)
                if self._version >= 4 and COMMAND_META in cmd.meta:
                    self.ledger.skipped(cmd.key, [h.token for h in entry.holders.values()])
            until_ms = 0 if quarantine is None else quarantine.until_ms
            if delay is not None:
                until_ms = max(until_ms, delay.since_ms + delay.ms)
            self._forget_if_idle(cmd.key, entry)
            return Locked(cmd.key, self._holders(entry), retry, until_ms)
        if room:
            entry.holders[cmd.lease] = _Hold(step.index, step.at_ms, dict(cmd.meta))
            lease.holding.add(cmd.key)
            self._held += 1
            self.usage.add(lease.owner, 1)
            if self._version >= 4:
                self.ledger.started(cmd.key, step.index, cmd.lease, cmd.meta, step.at_ms)
            return Granted(cmd.key, step.index, cmd.lease)
        if cmd.wait:
            entry.waiters[cmd.lease] = _Wait(step.at_ms, dict(cmd.meta))
            lease.waiting.add(cmd.key)
            self._queued += 1
            self.usage.add(lease.owner, 1)
            return Queued(cmd.key, len(entry.waiters))
        if self._version >= 4 and COMMAND_META in cmd.meta:
            self.ledger.skipped(cmd.key, [h.token for h in entry.holders.values()])
        return Locked(cmd.key, self._holders(entry), self._retry_after(entry))

    def _release(self, cmd: ReleaseCommand, lease: _Lease, step: _Step) -> Result:
        entry = self._keys.get(cmd.key)
        if entry is None:
            return NotHeld(cmd.key, ())
        _touch(self, cmd.key)
        hold = entry.holders.get(cmd.lease)
        if hold is not None:
            if cmd.token is not None and cmd.token != hold.token:
                # The grant this release names is gone; a newer one must not be freed by it.
                return NotHeld(cmd.key, self._holders(entry))
            token = hold.token
            self._drop_holder(cmd.key, entry, cmd.lease, lease, step)
            return Released(cmd.key, True, token, _idle_ephemeral(cmd, lease))
        if cmd.lease in entry.waiters and cmd.token is None:
            self._drop_waiter(cmd.key, entry, cmd.lease, lease)
            return Released(cmd.key, False, None, _idle_ephemeral(cmd, lease))
        return NotHeld(cmd.key, self._holders(entry))

    def _drop_holder(
        self, key: str, entry: _Key, lease_id: str, lease: _Lease, step: _Step
    ) -> None:
        _touch(self, key)
        del entry.holders[lease_id]
        lease.holding.discard(key)
        self._held -= 1
        if self._version >= 4:
            # A grant that ends before its run was reported ends it unreported.
            self.ledger.ended(lease_id, step.at_ms, None, key)
        self.usage.add(lease.owner, -1)  # a promoted waiter's owner counted its place already
        self._grant_waiters(key, entry, step)
        self._forget_if_idle(key, entry)

    def _grant_waiters(self, key: str, entry: _Key, step: _Step) -> None:
        if self.quarantine is not None or key in self.delays:
            return  # the quarantine's or the delay's end grants them
        if entry.waiters:
            _touch(self, key)
        while entry.waiters and self._has_room(entry):
            next_id = self._next_waiter(entry)
            wait = entry.waiters.pop(next_id)
            self._queued -= 1
            self._held += 1
            entry.holders[next_id] = _Hold(step.index, step.at_ms, wait.meta)
            if self._version >= 4:
                self.ledger.started(key, step.index, next_id, wait.meta, step.at_ms)
            waiter_lease = self._leases[next_id]
            waiter_lease.waiting.discard(key)
            waiter_lease.holding.add(key)
            step.promotions.append(Promotion(next_id, key, step.index, step.at_ms))

    def _drop_waiter(self, key: str, entry: _Key, lease_id: str, lease: _Lease) -> None:
        _touch(self, key)
        del entry.waiters[lease_id]
        lease.waiting.discard(key)
        self._queued -= 1
        self.usage.add(lease.owner, -1)
        self._forget_if_idle(key, entry)

    def _forget_if_idle(self, key: str, entry: _Key) -> None:
        # A key in its lock-delay stays, so that the delay keeps its limit and shows.
        if not entry.holders and not entry.waiters and key not in self.delays:
            del self._keys[key]
            self._sorted_keys = None

    # Small seams, overridden only by tests (the simulator counts executions through
    # ``_executing``; bug-injection tests override the others).

    def _executing(self, cmd: ClientCommand) -> None:
        """``cmd`` runs now (it is neither a replay of a remembered result nor refused)."""

    def _is_incarnation(self, lease: _Lease, incarnation: int) -> bool:
        """Whether an Expire of ``incarnation`` is for ``lease``.

        Incarnation 0 too names one lease: one opened at version 1. A lease opened under
        the same id after the switch to version 2 (no tombstone kept the id) is not its.
        """
        return incarnation == lease.incarnation

    def _has_room(self, entry: _Key) -> bool:
        return len(entry.holders) < entry.limit

    def _next_waiter(self, entry: _Key) -> str:
        return next(iter(entry.waiters))

    def _position(self, entry: _Key, lease_id: str) -> int:
        for position, waiting_id in enumerate(entry.waiters, start=1):
            if waiting_id == lease_id:
                return position
        raise KeyError(lease_id)

    def _holders(self, entry: _Key) -> tuple[Holder, ...]:
        return tuple(
            Holder(lease_id, h.token, h.granted_at_ms, dict(h.meta))
            for lease_id, h in entry.holders.items()
        )

    def _retry_after(self, entry: _Key) -> int:
        # A holder that vanishes is expired within its lease's TTL, so polling
        # more slowly than the shortest holder TTL only adds latency.
        shortest = min(self._leases[lease_id].ttl_ms for lease_id in entry.holders)
        return max(1, min(shortest, RETRY_AFTER_MAX_MS))

    # ---------------------------------------------------------------- queries

    def get(self, key: str) -> KeyView | None:
        entry = self._keys.get(key)
        if entry is None:
            return None
        return self._key_view(key, entry)

    def list_locks(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> tuple[list[KeyView], str | None]:
        """Keys that start with ``prefix``, sorted, after ``after``; and the next page's cursor."""
        if self._sorted_keys is None:
            self._sorted_keys = sorted(self._keys)
        names = self._sorted_keys
        start = bisect.bisect_left(names, prefix)
        if after is not None and after >= prefix:
            start = bisect.bisect_right(names, after)
        out: list[KeyView] = []
        for i in range(start, len(names)):
            key = names[i]
            if not key.startswith(prefix):
                return out, None
            if limit is not None and len(out) >= limit:
                return out, out[-1].key
            out.append(self._key_view(key, self._keys[key]))
        return out, None

    def leases(self) -> list[tuple[str, int, int]]:
        """(lease id, ttl_ms, incarnation) of every live lease, sorted by id, and last the
        quarantine while there is one (``QUARANTINE_LEASE``: the leader's lease deadlines
        end it as they end a lease, a full TTL after each new leader takes office)."""
        live = [
            (lease_id, self._leases[lease_id].ttl_ms, self._leases[lease_id].incarnation)
            for lease_id in sorted(self._leases)
        ]
        q = self.quarantine
        if q is not None:
            live.append((QUARANTINE_LEASE, q.ttl_ms, q.incarnation))
        live.extend(self.delays.pseudo_leases())
        return live

    def lease_owner(self, lease_id: str) -> str | None:
        """The identity that opened a live lease ("" before identities), None if none."""
        lease = self._leases.get(lease_id)
        return None if lease is None else lease.owner

    def lease(self, lease_id: str) -> LeaseView | None:
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        return _lease_view(lease_id, lease)

    def lease_terms(self, lease_id: str) -> LeaseTerms | None:
        """What the runtime asks about a lease on every request it serves, without the
        sorted copies of the keys ``lease`` makes (a lease may hold thousands)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        return LeaseTerms(
            lease_id,
            lease.ttl_ms,
            lease.incarnation,
            lease.finished_at_ms,
            lease.owner,
            lease.lock_delay_ms,
        )

    def holds(self, lease_id: str, key: str) -> bool:
        lease = self._leases.get(lease_id)
        return lease is not None and key in lease.holding

    def waits(self, lease_id: str, key: str) -> bool:
        lease = self._leases.get(lease_id)
        return lease is not None and key in lease.waiting

    def list_leases(
        self, *, after: str | None = None, limit: int | None = None
    ) -> tuple[list[LeaseView], str | None]:
        if self._sorted_leases is None:
            self._sorted_leases = sorted(self._leases)
        names = self._sorted_leases
        start = 0 if after is None else bisect.bisect_right(names, after)
        stop = len(names) if limit is None else min(len(names), start + limit)
        out = [_lease_view(name, self._leases[name]) for name in names[start:stop]]
        return out, (names[stop - 1] if stop < len(names) and out else None)

    def counts(self) -> Counts:
        return Counts(sessions=len(self._leases), locks=self._held, waiters=self._queued)

    def _key_view(self, key: str, entry: _Key) -> KeyView:
        return KeyView(
            key,
            entry.limit,
            self._holders(entry),
            tuple(
                Waiter(lease_id, w.since_ms, dict(w.meta)) for lease_id, w in entry.waiters.items()
            ),
            self.delays.get(key),
        )

    # --------------------------------------------------------------- snapshot

    def snapshot(self) -> bytes:
        """Canonical CBOR of the whole state: equal states give equal bytes.

        At cluster version 1 the layout is the previous release's, so its
        members can restore an image this release took.
        """
        keys = [
            [
                key,
                entry.limit,
                [[lid, h.token, h.granted_at_ms, h.meta] for lid, h in entry.holders.items()],
                [[lid, w.since_ms, w.meta] for lid, w in entry.waiters.items()],
            ]
            for key, entry in sorted(self._keys.items())
        ]
        if self._version < 2:
            leases_v1 = [
                [
                    lease_id,
                    lease.ttl_ms,
                    lease.opened_at_ms,
                    [
                        [seq, result.to_dict()]
                        for record in lease.clients.values()
                        for seq, result in record.results.items()
                    ],
                ]
                for lease_id, lease in sorted(self._leases.items())
            ]
            image: list[Any] = [SNAPSHOT_V1, self._applied, leases_v1, keys]
        else:
            # At version 2 the layout stays the one its members read (no lease has an
            # owner before version 3: apply refuses one); from version 3 on each lease
            # row ends with its owner.
            with_owner = self._version >= 3
            with_delay = self._version >= 4
            leases = [
                [
                    lease_id,
                    lease.ttl_ms,
                    lease.opened_at_ms,
                    lease.incarnation,
                    lease.ephemeral,
                    lease.meta,
                    lease.finished_at_ms,
                    [
                        [
                            client,
                            record.floor,
                            [[s, r.to_dict()] for s, r in record.results.items()],
                        ]
                        for client, record in sorted(lease.clients.items())
                    ],
                    *([lease.owner] if with_owner else []),
                    *([lease.lock_delay_ms] if with_delay else []),
                ]
                for lease_id, lease in sorted(self._leases.items())
            ]
            stones = [
                [lease_id, t.client, t.seq, t.result.to_dict(), t.ended_log_ms]
                for lease_id, t in self._tombstones.items()
            ]
            clock = [self._log_ms, self._last_stamp_ms]
            image = [SNAPSHOT_V2, self._applied, self._version, leases, keys, stones, clock]
            if with_owner:
                q = self.quarantine
                image[0] = SNAPSHOT_V3
                image.append(self.max_ttl_ms)
                image.append(None if q is None else [q.ttl_ms, q.incarnation, q.until_ms])
            if with_delay:
                image[0] = SNAPSHOT_V4
                image.append(self.delays.rows())
        return bytes(cbor2.dumps(image, canonical=True))

    @classmethod
    def restore(cls, data: bytes) -> Self:
        """Rebuild a machine from ``snapshot()`` bytes; ValueError if they are not such bytes."""
        try:
            return cls._restore(cbor2.loads(data))
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"lock snapshot is corrupt: {exc!r}") from None

    @classmethod
    def _restore(cls, item: Any) -> Self:
        if type(item) is not list or not item:
            raise ValueError("lock snapshot has an unknown layout")
        machine = cls()
        if item[0] == SNAPSHOT_V1 and len(item) == 4:
            _, applied, leases, keys = item
            for lease_id, ttl_ms, opened_at_ms, recent in leases:
                lease = _Lease(ttl_ms=_int(ttl_ms), opened_at_ms=_int(opened_at_ms))
                # As in apply, the record comes with its first result: an empty one would
                # show in this replica's version-2 snapshots and not in its peers'.
                if recent:
                    record = lease.clients[""] = _ClientRecord()
                    for seq, result in recent:
                        record.results[_int(seq)] = result_from_dict(result)
                machine._leases[_str(lease_id)] = lease
        elif (
            (item[0] == SNAPSHOT_V2 and len(item) == 7)
            or (item[0] == SNAPSHOT_V3 and len(item) == 9)
            or (item[0] == SNAPSHOT_V4 and len(item) == 10)
        ):
            # Layout 3 (cluster version 3) ends each lease's row with its owner and adds the
            # longest TTL given and the quarantine; a layout-2 image (from a member of the
            # previous release, or of a cluster at version 2) has no owners: they are "".
            layout, applied, version, leases, keys, stones, clock = item[:7]
            if layout >= SNAPSHOT_V3:
                machine.max_ttl_ms = _int(item[7])
                q = item[8]
                if q is not None:
                    ttl_ms, incarnation, until_ms = q
                    machine.quarantine = Quarantine(_int(ttl_ms), _int(incarnation))
                    machine.quarantine.until_ms = _int(until_ms)
            if layout == SNAPSHOT_V4:
                # Layout 4 (cluster version 4) ends each lease's row with its lock-delay and
                # adds the keys in their lock-delay.
                for key, ms, incarnation, by_lease, since_ms in item[9]:
                    machine.delays.restore_row(
                        _str(key), _int(ms), _int(incarnation), _str(by_lease), _int(since_ms)
                    )
            machine._version = _int(version)
            row_length = {SNAPSHOT_V2: 8, SNAPSHOT_V3: 9, SNAPSHOT_V4: 10}[layout]
            for row in leases:
                if type(row) is not list or len(row) != row_length:
                    raise ValueError("lock snapshot has a lease of an unknown layout")
                lease_id, ttl_ms, opened_at_ms, incarnation, ephemeral, meta, finished, clients = (
                    row[:8]
                )
                lease = _Lease(
                    ttl_ms=_int(ttl_ms),
                    opened_at_ms=_int(opened_at_ms),
                    incarnation=_int(incarnation),
                    ephemeral=bool(ephemeral),
                    meta=str_map(meta),
                    finished_at_ms=None if finished is None else _int(finished),
                    owner=_str(row[8]) if layout >= SNAPSHOT_V3 else "",
                    lock_delay_ms=_int(row[9]) if layout == SNAPSHOT_V4 else 0,
                )
                for client, floor, results in clients:
                    record = lease.clients[_str(client)] = _ClientRecord(floor=_int(floor))
                    for seq, result in results:
                        record.results[_int(seq)] = result_from_dict(result)
                machine._leases[_str(lease_id)] = lease
            for lease_id, client, seq, result, ended_log_ms in stones:
                machine._tombstones[_str(lease_id)] = _Tombstone(
                    _str(client), _int(seq), result_from_dict(result), _int(ended_log_ms)
                )
            log_ms, last_stamp_ms = clock
            machine._log_ms, machine._last_stamp_ms = _int(log_ms), _int(last_stamp_ms)
        else:
            raise ValueError("lock snapshot has an unknown layout or version")
        machine._applied = _int(applied)
        for key, limit, holders, waiters in keys:
            entry = _Key(limit=_int(limit))
            for lease_id, token, granted_at_ms, meta in holders:
                entry.holders[_str(lease_id)] = _Hold(
                    _int(token), _int(granted_at_ms), str_map(meta)
                )
                machine._leases[lease_id].holding.add(key)
            for lease_id, since_ms, meta in waiters:
                entry.waiters[_str(lease_id)] = _Wait(_int(since_ms), str_map(meta))
                machine._leases[lease_id].waiting.add(key)
            full = len(entry.holders) == entry.limit
            # While quarantined or delayed, a key's waiters wait for its end, free slots or
            # not; a delayed key may have neither holders nor waiters.
            delayed = _str(key) in machine.delays
            quarantined = machine.quarantine is not None or delayed
            if (
                (not entry.holders and not (quarantined and entry.waiters) and not delayed)
                or len(entry.holders) > entry.limit
                or (entry.waiters and not full and not quarantined)
            ):
                raise ValueError(f"lock snapshot has an impossible entry for key {key!r}")
            machine._keys[_str(key)] = entry
            machine._held += len(entry.holders)
            machine._queued += len(entry.waiters)
        for lease in machine._leases.values():
            machine.usage.add(lease.owner, len(lease.holding) + len(lease.waiting), 1)
        return machine


def _touch(machine: LockStateMachine, key: str) -> None:
    """``key`` is about to change in the step being applied: keep its state before the
    step (once). Every change to a key's holders, waiters or a holder's metadata comes
    through here first, so the watch hub (dlm/node/watches.py) sees every kind of change,
    new ones included."""
    step = machine._step
    if step is not None and key not in step.before:
        step.before[key] = key_state(machine, key)


def holder_meta(machine: LockStateMachine, lease_id: str, key: str) -> dict[str, str]:
    """A copy of the metadata ``lease_id`` holds ``key`` with ({} when it holds none): the
    audit's line for each grant, without a view of the whole key."""
    entry = machine._keys.get(key)
    hold = None if entry is None else entry.holders.get(lease_id)
    return {} if hold is None else dict(hold.meta)


def held_count(machine: LockStateMachine) -> int:
    """Holds in the table (``counts().locks`` without a Counts per applied entry)."""
    return machine._held


def key_state(machine: LockStateMachine, key: str) -> KeyState | None:
    """``key``'s holders and waiters as the watch hub compares them (None: no such key)."""
    entry = machine._keys.get(key)
    if entry is None:
        return None
    return KeyState(
        tuple((lid, h.token, dict(h.meta)) for lid, h in entry.holders.items()),
        tuple(entry.waiters),
    )


def _start_delays(machine: LockStateMachine, lease_id: str, lease: _Lease, step: _Step) -> None:
    """The lease expires or is revoked: each key it holds enters its lock-delay (before the
    holds are dropped, so that dropping them grants nobody)."""
    if not lease.lock_delay_ms or machine.version < 4:
        return
    started = machine.delays.start(
        lease_id, lease.lock_delay_ms, lease.holding, step.index, step.at_ms
    )
    for key in started:
        delay = machine.delays.get(key)
        assert delay is not None
        step.armed.append((delay_lease(key), delay.ms, step.index))
    step.delayed.extend(started)


def _idle_ephemeral(cmd: ReleaseCommand, lease: _Lease) -> bool:
    return lease.ephemeral and not cmd.keep_lease and not lease.holding and not lease.waiting


def longest_ttl_ms(machine: LockStateMachine) -> int:
    """The longest TTL the state records (``max_ttl_ms``) or any live lease has: what a
    quarantine must cover for every holder of the old incarnation to have lost its lock."""
    live = max((lease.ttl_ms for lease in machine._leases.values()), default=0)
    return max(machine.max_ttl_ms, live)


def start_incarnation(machine: LockStateMachine, index: int, quarantine_ms: int) -> None:
    """Make ``machine`` (restored from a backup's image or a survivor's state) the first
    state of a new incarnation (``dlm node restore`` and ``recover``): applied up to
    ``index``, at cluster version 3 at least, granting nothing until a leader has been in
    office for ``quarantine_ms`` (0: no quarantine), and remembering the longest live TTL."""
    if index < machine.applied_index or quarantine_ms < 0:
        raise ValueError("a new incarnation starts at or above the image's index")
    machine.max_ttl_ms = longest_ttl_ms(machine)
    machine._applied = index
    machine._version = max(machine._version, 3)
    machine.quarantine = Quarantine(quarantine_ms, index) if quarantine_ms else None


def _lease_view(lease_id: str, lease: _Lease) -> LeaseView:
    return LeaseView(
        lease_id,
        lease.ttl_ms,
        lease.opened_at_ms,
        lease.incarnation,
        lease.ephemeral,
        dict(lease.meta),
        lease.finished_at_ms,
        tuple(sorted(lease.holding)),
        tuple(sorted(lease.waiting)),
        lease.owner,
    )


# ---------------------------------------------------------------------------
# Who may (identities.py holds the table and the rule)
# ---------------------------------------------------------------------------


def _denied(table: IdentityTable, cmd: ClientCommand, lease: _Lease | None) -> Denied | None:
    """The refusal of a request whose identity lacks its permission, checked again at apply
    against the replicated table: an identity removed (or a lease that changed hands)
    between propose and apply is refused alike on every replica."""
    # An open's identity is the owner it names (the lease owner field, issue 23 item 3).
    by = cmd.owner if isinstance(cmd, OpenLeaseCommand) else cmd.by
    if not by:
        return None  # before cluster version 3: no identities
    action, permission = COMMAND_PERMISSIONS[type(cmd)]
    owner = None if lease is None else lease.owner
    key = cmd.key if isinstance(cmd, AcquireCommand) else None
    problem = refusal(table, by, action, permission, key=key, owner=owner)
    return None if problem is None else Denied(problem, by, action)


def _quota(table: IdentityTable, owner: str, in_entry: int, kind: int) -> int:
    """The quota an entry is held to: the owner's own setting in the replicated table
    (``dlm auth set``, identities.QUOTA_KINDS[kind]) when it has one, so a change binds
    every entry applied after it, even one proposed before; else the members' default the
    entry carries (0: none, an entry from before identities)."""
    if not in_entry:
        return 0
    return table.limits_of(owner)[kind] or in_entry


def _change_identities(table: IdentityTable, cmd: IdentityCommand, version: int) -> Result:
    action = "auth_set" if cmd.op == "limits" else f"auth_{cmd.op}"
    if version < 3:
        return Invalid("identities need cluster version 3: upgrade every member first")
    if version < 4 and cmd.needs_version_4:
        # A member of the previous release cannot read these: every replica refuses them
        # alike until the log reaches version 4 (the leader never proposes one before).
        return Invalid("per-identity limits need cluster version 4: upgrade every member first")
    problem = refusal(table, cmd.by, action, ADMIN_ONLY)
    if problem is not None:
        return Denied(problem, cmd.by, action)
    key = Verifier(cmd.key_id, cmd.stored_key, cmd.server_key)
    match cmd.op:
        case "add":
            problem = table.add(cmd.name, cmd.role, cmd.prefixes, key)
        case "remove":
            problem = table.remove(cmd.name, cmd.request, cmd.by)
        case "limits":
            problem = table.set_limits(cmd.name, cmd.limits)
        case "rotate":
            problem = table.rotate(cmd.name, key, cmd.at_ms)
        case _:
            problem = table.finish(cmd.name)
    if problem is not None:
        return Invalid(problem)
    return IdentityChanged(cmd.op, cmd.name)


def _change_settings(machine: LockStateMachine, cmd: SettingsCommand) -> Result:
    if machine.version < 5:
        # Older members cannot keep the settings: refused alike everywhere until the log
        # reaches version 5 (the leader never proposes one before).
        return Invalid("cluster settings need cluster version 5: upgrade every member first")
    problem = refusal(machine.identities, cmd.by, "config_set", ADMIN_ONLY)
    if problem is not None:
        return Denied(problem, cmd.by, "config_set")
    problem = machine.settings.set(cmd.setting, cmd.value_ms)
    if problem is not None:
        return Invalid(problem)
    return SettingChanged(cmd.setting, cmd.value_ms)


def _ttl_refusal(machine: LockStateMachine, cmd: Command) -> str | None:
    """Why ``cmd`` gives a lease a TTL above max-ttl, or None: a new lease's open (a lease
    already open keeps its TTL when joined) or a TTL update."""
    if isinstance(cmd, UpdateLeaseCommand) or (
        isinstance(cmd, OpenLeaseCommand) and cmd.lease not in machine._leases
    ):
        return machine.settings.ttl_problem(cmd.ttl_ms)
    return None


def _needs_version_4(cmd: Command) -> bool:
    if isinstance(cmd, OpenLeaseCommand):
        return cmd.lock_delay_ms > 0
    if isinstance(cmd, CloseLeaseCommand):
        return cmd.revoke
    if isinstance(cmd, ProclaimCommand):
        return True
    return isinstance(cmd, ExpireCommand) and delayed_key(cmd.lease) is not None


def _needs_version_3(cmd: Command) -> bool:
    if isinstance(cmd, OpenLeaseCommand):
        return bool(cmd.owner or cmd.quota)
    return isinstance(cmd, AcquireCommand) and cmd.quota > 0


def _int(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"lock snapshot: expected an integer, got {type(value).__name__}")
    return value


def _str(value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"lock snapshot: expected text, got {type(value).__name__}")
    return value
