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
* a key has waiters only while all its slots are taken (so freeing a slot and
  granting the first waiter happen in the same step);
* a key with neither holders nor waiters does not exist (its limit is forgotten);
* a lease holds or waits for a key at most once, and ``_Lease.holding`` /
  ``_Lease.waiting`` mirror the key table exactly.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

import cbor2

from dlm.node.locks.commands import (
    Acquire,
    CloseLease,
    Command,
    CommandError,
    Expire,
    OpenLease,
    Release,
    decode_command,
    validate_command,
)
from dlm.node.locks.results import (
    BadRequest,
    Grant,
    Granted,
    Holder,
    LeaseClosed,
    LeaseOpened,
    Locked,
    NotHolder,
    Queued,
    Released,
    Result,
    SessionExpired,
    Waiter,
    _Plain,
    result_from_dict,
    str_map,
)

SNAPSHOT_VERSION = 1
RECENT_RESULTS = 32
"""Results remembered per lease, keyed by request seq, for answering re-sent requests."""
RETRY_AFTER_MAX_MS = 30_000
"""Cap on the LOCKED retry hint: a poller should not sleep longer than this."""


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """Everything one applied entry produced.

    ``result``: the reply for the client that proposed the entry (None for an
    empty payload, i.e. a leader's no-op entry).
    ``grants``: waiters that this step made holders, in grant order; the
    proposer's own immediate grant is in ``result``, not here.
    ``opened``: (lease, ttl_ms) of leases opened or re-opened; the leader's
    lease tracker (re)arms each with a full TTL.
    ``closed``: leases ended by CloseLease; ``expired``: leases ended by Expire.
    The tracker disarms both.
    """

    index: int
    result: Result | None
    grants: tuple[Grant, ...] = ()
    opened: tuple[tuple[str, int], ...] = ()
    closed: tuple[str, ...] = ()
    expired: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KeyState(_Plain):
    """A key as ``get``/``list_locks`` show it: holders in grant order, waiters in queue order."""

    key: str
    limit: int
    holders: tuple[Holder, ...]
    waiters: tuple[Waiter, ...]


@dataclass(frozen=True, slots=True)
class LeaseInfo(_Plain):
    lease: str
    ttl_ms: int
    opened_at_ms: int
    last_seq: int | None
    """The seq of the latest request the lease made, if any."""
    holding: tuple[str, ...]
    """Keys the lease holds, sorted."""
    waiting: tuple[str, ...]
    """Keys the lease waits for, sorted."""


class Counts(NamedTuple):
    sessions: int
    locks: int
    """Held slots (a semaphore with three holders counts three)."""
    waiters: int


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
class _Lease:
    ttl_ms: int
    opened_at_ms: int
    recent: OrderedDict[int, Result] = field(default_factory=OrderedDict)
    """The last RECENT_RESULTS (seq, result) pairs, oldest first."""
    holding: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Step:
    """Side effects collected while one entry is applied."""

    index: int
    at_ms: int
    grants: list[Grant] = field(default_factory=list)
    opened: list[tuple[str, int]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)


class LockStateMachine:
    """The replicated lock table. Feed it committed entries in log order via ``apply``."""

    def __init__(self) -> None:
        self._applied = 0
        self._leases: dict[str, _Lease] = {}
        self._keys: dict[str, _Key] = {}

    # ------------------------------------------------------------------ apply

    @property
    def applied_index(self) -> int:
        return self._applied

    def apply(self, index: int, data: bytes) -> ApplyOutcome:
        """Apply the entry at ``index`` whose payload is ``data``.

        Indices must increase (gaps are fine: entries the runtime does not hand
        over, such as membership changes, are simply skipped). An empty payload
        is a no-op; a malformed one yields a BadRequest result and changes
        nothing but ``applied_index``.
        """
        self._advance(index)
        if not data:
            return ApplyOutcome(index, None)
        try:
            cmd = decode_command(data)
        except CommandError as exc:
            return ApplyOutcome(index, BadRequest(str(exc)))
        return self._execute(index, cmd)

    def apply_command(self, index: int, cmd: Command) -> ApplyOutcome:
        """``apply`` for an already decoded command (the simulator and tests use it)."""
        self._advance(index)
        return self._execute(index, cmd)

    def _advance(self, index: int) -> None:
        if index <= self._applied:
            raise ValueError(f"entry {index} applied after entry {self._applied}: out of order")
        self._applied = index

    def _execute(self, index: int, cmd: Command) -> ApplyOutcome:
        problem = validate_command(cmd)
        if problem is not None:
            return ApplyOutcome(index, BadRequest(problem))
        step = _Step(index, cmd.at_ms)
        result = self._dispatch(cmd, step)
        return ApplyOutcome(
            index,
            result,
            tuple(step.grants),
            tuple(step.opened),
            tuple(step.closed),
            tuple(step.expired),
        )

    def _dispatch(self, cmd: Command, step: _Step) -> Result:
        if isinstance(cmd, OpenLease):
            return self._open(cmd, step)
        lease = self._leases.get(cmd.lease)
        if lease is None:
            return SessionExpired(cmd.lease)
        if isinstance(cmd, Expire):
            self._end_lease(cmd.lease, step)
            step.expired.append(cmd.lease)
            return LeaseClosed(cmd.lease)
        cached = lease.recent.get(cmd.seq)
        if cached is not None:
            return self._replay(cmd.lease, lease, cached)
        result: Result
        match cmd:
            case CloseLease():
                self._end_lease(cmd.lease, step)
                step.closed.append(cmd.lease)
                # The lease is gone, so a retried close answers SESSION_EXPIRED.
                return LeaseClosed(cmd.lease)
            case Acquire():
                result = self._acquire(cmd, lease, step)
            case Release():
                result = self._release(cmd, lease, step)
        lease.recent[cmd.seq] = result
        if len(lease.recent) > RECENT_RESULTS:
            lease.recent.popitem(last=False)
        return result

    def _replay(self, lease_id: str, lease: _Lease, cached: Result) -> Result:
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

    def _open(self, cmd: OpenLease, step: _Step) -> Result:
        lease = self._leases.get(cmd.lease)
        if lease is None:
            lease = _Lease(ttl_ms=cmd.ttl_ms, opened_at_ms=cmd.at_ms)
            self._leases[cmd.lease] = lease
        step.opened.append((cmd.lease, lease.ttl_ms))
        return LeaseOpened(cmd.lease, lease.ttl_ms)

    def _acquire(self, cmd: Acquire, lease: _Lease, step: _Step) -> Result:
        entry = self._keys.get(cmd.key)
        if entry is not None:
            if entry.limit != cmd.limit:
                return BadRequest(
                    f"key {cmd.key!r} is in use with limit={entry.limit}; acquire it with "
                    f"limit={entry.limit}, or wait until it has no holders and no waiters"
                )
            hold = entry.holders.get(cmd.lease)
            if hold is not None:
                return Granted(cmd.key, hold.token, cmd.lease)
            if cmd.lease in entry.waiters:
                return Queued(cmd.key, self._position(entry, cmd.lease))
        else:
            entry = _Key(limit=cmd.limit)
            self._keys[cmd.key] = entry
        if self._has_room(entry):
            entry.holders[cmd.lease] = _Hold(step.index, step.at_ms, dict(cmd.meta))
            lease.holding.add(cmd.key)
            return Granted(cmd.key, step.index, cmd.lease)
        if cmd.wait:
            entry.waiters[cmd.lease] = _Wait(step.at_ms, dict(cmd.meta))
            lease.waiting.add(cmd.key)
            return Queued(cmd.key, len(entry.waiters))
        return Locked(cmd.key, self._holders(entry), self._retry_after(entry))

    def _release(self, cmd: Release, lease: _Lease, step: _Step) -> Result:
        entry = self._keys.get(cmd.key)
        if entry is None:
            return NotHolder(cmd.key, ())
        if cmd.lease in entry.holders:
            self._drop_holder(cmd.key, entry, cmd.lease, lease, step)
            return Released(cmd.key, held=True)
        if cmd.lease in entry.waiters:
            self._drop_waiter(cmd.key, entry, cmd.lease, lease)
            return Released(cmd.key, held=False)
        return NotHolder(cmd.key, self._holders(entry))

    def _end_lease(self, lease_id: str, step: _Step) -> None:
        lease = self._leases[lease_id]
        # Sorted, so a replica restored from a snapshot grants in the same order.
        for key in sorted(lease.waiting):
            self._drop_waiter(key, self._keys[key], lease_id, lease)
        for key in sorted(lease.holding):
            self._drop_holder(key, self._keys[key], lease_id, lease, step)
        del self._leases[lease_id]

    def _drop_holder(
        self, key: str, entry: _Key, lease_id: str, lease: _Lease, step: _Step
    ) -> None:
        del entry.holders[lease_id]
        lease.holding.discard(key)
        while entry.waiters and self._has_room(entry):
            next_id = self._next_waiter(entry)
            wait = entry.waiters.pop(next_id)
            entry.holders[next_id] = _Hold(step.index, step.at_ms, wait.meta)
            waiter_lease = self._leases[next_id]
            waiter_lease.waiting.discard(key)
            waiter_lease.holding.add(key)
            step.grants.append(Grant(next_id, key, step.index, step.at_ms))
        self._forget_if_idle(key, entry)

    def _drop_waiter(self, key: str, entry: _Key, lease_id: str, lease: _Lease) -> None:
        del entry.waiters[lease_id]
        lease.waiting.discard(key)
        self._forget_if_idle(key, entry)

    def _forget_if_idle(self, key: str, entry: _Key) -> None:
        if not entry.holders and not entry.waiters:
            del self._keys[key]

    # Small seams, overridden only by tests that check the checker catches bugs.

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
        return min(shortest, RETRY_AFTER_MAX_MS)

    # ---------------------------------------------------------------- queries

    def get(self, key: str) -> KeyState | None:
        entry = self._keys.get(key)
        if entry is None:
            return None
        return self._key_state(key, entry)

    def list_locks(self, prefix: str = "") -> list[KeyState]:
        """Keys that start with ``prefix``, sorted."""
        return [
            self._key_state(key, self._keys[key])
            for key in sorted(k for k in self._keys if k.startswith(prefix))
        ]

    def leases(self) -> list[tuple[str, int]]:
        """(lease id, ttl_ms) of every live lease, sorted by id."""
        return [(lease_id, self._leases[lease_id].ttl_ms) for lease_id in sorted(self._leases)]

    def lease(self, lease_id: str) -> LeaseInfo | None:
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        return LeaseInfo(
            lease_id,
            lease.ttl_ms,
            lease.opened_at_ms,
            next(reversed(lease.recent), None),
            tuple(sorted(lease.holding)),
            tuple(sorted(lease.waiting)),
        )

    def counts(self) -> Counts:
        return Counts(
            sessions=len(self._leases),
            locks=sum(len(e.holders) for e in self._keys.values()),
            waiters=sum(len(e.waiters) for e in self._keys.values()),
        )

    def _key_state(self, key: str, entry: _Key) -> KeyState:
        return KeyState(
            key,
            entry.limit,
            self._holders(entry),
            tuple(
                Waiter(lease_id, w.since_ms, dict(w.meta)) for lease_id, w in entry.waiters.items()
            ),
        )

    # --------------------------------------------------------------- snapshot

    def snapshot(self) -> bytes:
        """Canonical CBOR of the whole state: equal states give equal bytes."""
        leases = [
            [
                lease_id,
                lease.ttl_ms,
                lease.opened_at_ms,
                [[seq, result.to_dict()] for seq, result in lease.recent.items()],
            ]
            for lease_id, lease in sorted(self._leases.items())
        ]
        keys = [
            [
                key,
                entry.limit,
                [[lid, h.token, h.granted_at_ms, h.meta] for lid, h in entry.holders.items()],
                [[lid, w.since_ms, w.meta] for lid, w in entry.waiters.items()],
            ]
            for key, entry in sorted(self._keys.items())
        ]
        return bytes(cbor2.dumps([SNAPSHOT_VERSION, self._applied, leases, keys], canonical=True))

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
        if type(item) is not list or len(item) != 4 or item[0] != SNAPSHOT_VERSION:
            raise ValueError("lock snapshot has an unknown layout or version")
        _, applied, leases, keys = item
        machine = cls()
        machine._applied = _int(applied)
        for lease_id, ttl_ms, opened_at_ms, recent in leases:
            lease = _Lease(ttl_ms=_int(ttl_ms), opened_at_ms=_int(opened_at_ms))
            for seq, result in recent:
                lease.recent[_int(seq)] = result_from_dict(result)
            machine._leases[_str(lease_id)] = lease
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
            if (
                not entry.holders
                or len(entry.holders) > entry.limit
                or (entry.waiters and not full)
            ):
                raise ValueError(f"lock snapshot has an impossible entry for key {key!r}")
            machine._keys[_str(key)] = entry
        return machine


def _int(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"lock snapshot: expected an integer, got {type(value).__name__}")
    return value


def _str(value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"lock snapshot: expected text, got {type(value).__name__}")
    return value
