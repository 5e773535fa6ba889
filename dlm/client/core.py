"""The client's decisions, without IO: whom to ask, when to retry, what a reply means.

Theory of operation
-------------------
A request is driven by a generator (``call`` or ``acquire_flow``) that yields
*actions* and receives their *outcomes*:

- ``Send(addr, request, timeout)``: connect to ``addr`` if not connected,
  send ``request`` with a fresh request id, and read its reply. The outcome
  is the reply map, or ``Failed(reason)`` if the connection could not be
  made, broke, or stayed silent past ``timeout``.
- ``Sleep(seconds)``: back off. The outcome is ignored.
- ``AwaitGrant(addr, lease, key, timeout)``: on the current connection, wait
  for the pushed ``grant`` of a queued acquire. The outcome is the push,
  ``None`` when the time ran out, or ``Failed`` when the connection broke.

The blocking client (sync.py) and the anyio client (aio.py) are drivers of
these generators; everything they would otherwise both have to get right -
following NOT_LEADER redirects, rotating through members, backing off with
full jitter, keeping one ``seq`` for every retry of one request, mapping error
replies to exceptions - lives here once, and is tested with a fake clock.
"""

from __future__ import annotations

import os

from dlm.client.errors import (
    BadRequest,
    ClusterUnavailable,
    DlmError,
    LeaseLost,
    LockHeld,
    NotHolder,
    ServerError,
)
from dlm.wire import (
    Acquire,
    ErrorCode,
    Record,
    Release,
    format_addr,
    parse_addr,
)

# typing, dataclasses and random stay off the import path of `dlm acquire` (see wire.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Generator, Mapping, Sequence
    from typing import Any

    Clock = Callable[[], float]
    Reply = dict[Any, Any]

# Redirects followed in a row before backing off: a cluster mid-election may
# point in circles for a moment, and we must not spin.
MAX_REDIRECT_HOPS = 8

# Codes after which the very same request (same seq) may simply be sent again.
RETRYABLE_CODES = frozenset(
    {
        ErrorCode.NOT_LEADER.value,
        ErrorCode.NO_QUORUM.value,
        ErrorCode.TIMEOUT.value,
        ErrorCode.SHUTTING_DOWN.value,
        ErrorCode.UNAVAILABLE.value,
    }
)

_LEASE_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


_set = object.__setattr__


class Lease(Record):
    """An open lease. ``confirmed_at`` is the monotonic time the open_lease request was first
    sent: the client-side deadline ``confirmed_at + ttl_ms`` falls before the server's.
    Two leases are equal when their id and TTL are (``confirmed_at`` is not compared)."""

    __slots__ = ("confirmed_at", "id", "ttl_ms")
    FIELDS = ("id", "ttl_ms")
    __match_args__ = ("id", "ttl_ms", "confirmed_at")
    id: str
    ttl_ms: int
    confirmed_at: float

    def __init__(self, id: str, ttl_ms: int, confirmed_at: float = 0.0) -> None:
        _set(self, "id", id)
        _set(self, "ttl_ms", ttl_ms)
        _set(self, "confirmed_at", confirmed_at)

    def __repr__(self) -> str:
        return f"Lease(id={self.id!r}, ttl_ms={self.ttl_ms!r}, confirmed_at={self.confirmed_at!r})"


class Grant(Record):
    """A held lock; ``token`` is the fencing token (the Raft index that granted it)."""

    __slots__ = ("key", "lease", "token", "ttl_ms")
    FIELDS = ("key", "token", "lease", "ttl_ms")
    __match_args__ = ("key", "token", "lease", "ttl_ms")
    key: str
    token: int
    lease: str
    ttl_ms: int

    def __init__(self, key: str, token: int, lease: str, ttl_ms: int) -> None:
        _set(self, "key", key)
        _set(self, "token", token)
        _set(self, "lease", lease)
        _set(self, "ttl_ms", ttl_ms)


LeaseRef = str | Lease


def lease_id(lease: LeaseRef) -> str:
    return lease.id if isinstance(lease, Lease) else lease


# ---------------------------------------------------------------------------
# Identifiers
# ---------------------------------------------------------------------------


def new_lease_id() -> str:
    """16 characters of [a-z0-9] from the OS's CSPRNG (rejection sampling keeps it uniform)."""
    out: list[str] = []
    while len(out) < 16:
        for byte in os.urandom(24):
            if byte < 252:  # 252 = 7 * 36
                out.append(_LEASE_ALPHABET[byte % 36])
                if len(out) == 16:
                    break
    return "".join(out)


def new_seq() -> int:
    """A fresh random 63-bit request sequence number.

    Always from the OS, never from an injected (maybe seeded) generator: two
    processes sharing a lease with equal seqs would get each other's results.
    """
    return int.from_bytes(os.urandom(8), "big") >> 1


class RequestIds:
    """Request ids for one connection: replies are matched to requests by them."""

    def __init__(self) -> None:
        self._next = 0

    def next(self) -> int:
        self._next += 1
        return self._next


# ---------------------------------------------------------------------------
# Members and routing
# ---------------------------------------------------------------------------


def parse_members(members: Sequence[str] | str) -> list[str]:
    """Normalises "a:1,b:2" or ["a:1", "b:2"] to canonical HOST:PORT strings, in order."""
    items = members.split(",") if isinstance(members, str) else list(members)
    out: list[str] = []
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            addr = format_addr(*parse_addr(part))
            if addr not in out:
                out.append(addr)
    if not out:
        raise ValueError("no cluster member given (set --cluster or DLM_CLUSTER)")
    return out


def normalise_addr(text: object) -> str | None:
    if not isinstance(text, str):
        return None
    try:
        return format_addr(*parse_addr(text))
    except ValueError:
        return None


class Router:
    """Chooses the member to talk to: the last one known to answer, else the next in turn."""

    def __init__(self, members: Sequence[str], start: int = 0) -> None:
        self.members = list(members)
        self._turn = start % len(self.members)
        self.preferred: str | None = None

    def target(self) -> str:
        return self.preferred or self.members[self._turn]

    def redirect(self, addr: str) -> None:
        self.preferred = addr

    def answered(self, addr: str) -> None:
        self.preferred = addr

    def failed(self, addr: str) -> None:
        """``addr`` is down or not useful: forget it and move on to the next member."""
        if self.preferred == addr:
            self.preferred = None
        if addr in self.members:
            self._turn = (self.members.index(addr) + 1) % len(self.members)
        else:
            self._turn = (self._turn + 1) % len(self.members)


# ---------------------------------------------------------------------------
# Backoff
# ---------------------------------------------------------------------------


class Backoff:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**attempt)).

    Full jitter spreads clients that failed together, so they do not retry in
    lockstep. A server's ``retry_after_ms`` is a floor.
    """

    def __init__(
        self, rng: random.Random | None = None, *, base: float = 0.025, cap: float = 1.0
    ) -> None:
        self._rng = rng
        self.base = base
        self.cap = cap

    def _random(self) -> random.Random:
        if self._rng is None:
            import random  # only a retry needs it: most runs never back off

            self._rng = random.Random()
        return self._rng

    def delay(self, attempt: int, retry_after_ms: int | None = None) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(attempt, 30)))
        jittered = self._random().uniform(0.0, ceiling)
        if retry_after_ms is not None and retry_after_ms > 0:
            return max(jittered, min(retry_after_ms / 1000.0, 10 * self.cap))
        return jittered


# ---------------------------------------------------------------------------
# Actions and outcomes
# ---------------------------------------------------------------------------


class Send(Record):
    __slots__ = ("addr", "drop_pushes_for", "request", "timeout")
    FIELDS = ("addr", "request", "timeout", "drop_pushes_for")
    addr: str
    request: dict[str, Any]  # without "id": the driver assigns one per attempt
    timeout: float
    # A grant push for this (lease, key) that is already buffered is stale once we
    # send a new acquire for it; the driver drops it before sending.
    drop_pushes_for: tuple[str, str] | None

    def __init__(
        self,
        addr: str,
        request: dict[str, Any],
        timeout: float,
        drop_pushes_for: tuple[str, str] | None = None,
    ) -> None:
        _set(self, "addr", addr)
        _set(self, "request", request)
        _set(self, "timeout", timeout)
        _set(self, "drop_pushes_for", drop_pushes_for)


class Sleep(Record):
    __slots__ = ("seconds",)
    FIELDS = ("seconds",)
    seconds: float

    def __init__(self, seconds: float) -> None:
        _set(self, "seconds", seconds)


class AwaitGrant(Record):
    __slots__ = ("addr", "key", "lease", "timeout")
    FIELDS = ("addr", "lease", "key", "timeout")
    addr: str
    lease: str
    key: str
    timeout: float

    def __init__(self, addr: str, lease: str, key: str, timeout: float) -> None:
        _set(self, "addr", addr)
        _set(self, "lease", lease)
        _set(self, "key", key)
        _set(self, "timeout", timeout)


class Failed(Record):
    __slots__ = ("reason",)
    FIELDS = ("reason",)
    reason: str

    def __init__(self, reason: str) -> None:
        _set(self, "reason", reason)


if TYPE_CHECKING:
    Action = Send | Sleep | AwaitGrant
    Outcome = Reply | Failed | None
    Flow = Generator[Action, Outcome, Any]


class Settings:
    """What every call of one client shares."""

    __slots__ = (
        "attempt_timeout",
        "backoff",
        "clock",
        "dial_timeout",
        "members",
        "reached",
        "router",
        "timeout",
    )

    def __init__(
        self,
        *,
        members: list[str],
        router: Router,
        backoff: Backoff,
        clock: Clock,
        timeout: float,
        attempt_timeout: float,
        dial_timeout: float | None = None,
    ) -> None:
        self.members = members
        self.router = router
        self.backoff = backoff
        self.clock = clock
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        # Until some member has answered (``reached``), a call gives up once this long
        # has passed with no answer at all (None: only ``timeout`` counts). After that,
        # a member that stops answering is an outage to ride out, not a wrong address.
        self.dial_timeout = dial_timeout
        self.reached = False


def default_attempt_timeout(timeout: float) -> float:
    # Long enough for an fsync stall, short enough that a SIGSTOPped leader
    # costs a fraction of the budget before we try someone else.
    return max(0.5, min(3.0, timeout / 4))


# ---------------------------------------------------------------------------
# One request, retried until it is answered or the time is up
# ---------------------------------------------------------------------------


def call(
    s: Settings,
    request: dict[str, Any],
    *,
    timeout: float | None = None,
    drop_pushes_for: tuple[str, str] | None = None,
) -> Generator[Action, Outcome, tuple[str, Reply]]:
    """Sends ``request`` until some member answers it; returns (address, ok reply).

    Retryable failures are retried with the very same request (same ``seq``)
    until ``timeout`` (default: the client's) runs out, then ClusterUnavailable.
    Any other error reply is raised as its exception.
    """
    budget = s.timeout if timeout is None else timeout
    deadline = s.clock() + budget
    dial = None if s.reached else s.dial_timeout
    dial_deadline = None if dial is None else s.clock() + dial
    unanswered: dict[str, str] = {}  # address -> why it did not answer, while none has
    failures = 0  # drives the backoff exponent
    misses_in_row = 0  # unreachable members in a row; back off after a full round
    hops = 0
    answered = False
    last_problem = "no attempt was made"
    while True:
        remaining = deadline - s.clock()
        if remaining <= 0:
            raise _unavailable(s.members, budget, answered, last_problem)
        addr = s.router.target()
        attempt = min(remaining, s.attempt_timeout)
        if dial is not None and not answered:
            # An equal share each, so one silent address cannot use up the dial budget.
            attempt = min(attempt, dial / len(s.members))
        outcome = yield Send(addr, request, attempt, drop_pushes_for=drop_pushes_for)
        delay = 0.0
        if not isinstance(outcome, dict):
            reason = outcome.reason if isinstance(outcome, Failed) else "no reply"
            last_problem = reason if reason.startswith(addr) else f"{addr}: {reason}"
            s.router.failed(addr)
            misses_in_row += 1
            hops = 0
            if misses_in_row % len(s.members) == 0:
                delay = s.backoff.delay(failures)
                failures += 1
            if dial is not None and dial_deadline is not None and not answered:
                unanswered[addr] = last_problem
                if s.clock() >= dial_deadline and set(s.members) <= set(unanswered):
                    raise _none_answered(dial, unanswered)
                delay = min(delay, max(0.0, dial_deadline - s.clock()))
        else:
            misses_in_row = 0
            answered = s.reached = True
            kind = outcome.get("t")
            if kind == "ok":
                s.router.answered(addr)
                return addr, outcome
            code = outcome.get("code")
            if kind != "error" or not isinstance(code, str):
                last_problem = f"{addr}: unexpected reply {kind!r}"
                s.router.failed(addr)
                delay = s.backoff.delay(failures)
                failures += 1
            elif code not in RETRYABLE_CODES:
                raise error_from_reply(outcome, request)
            else:
                last_problem = f"{code} from {addr}"
                leader = normalise_addr(outcome.get("leader_address"))
                if code == ErrorCode.NOT_LEADER.value and leader and leader != addr:
                    if hops < MAX_REDIRECT_HOPS:
                        hops += 1
                        s.router.redirect(leader)
                        continue
                    s.router.redirect(leader)
                elif code in (ErrorCode.NOT_LEADER.value, ErrorCode.SHUTTING_DOWN.value):
                    s.router.failed(addr)
                hops = 0
                delay = s.backoff.delay(failures, _opt_int(outcome, "retry_after_ms"))
                failures += 1
        if delay > 0:
            yield Sleep(min(delay, max(0.0, deadline - s.clock())))


def _none_answered(dial_timeout: float, problems: Mapping[str, str]) -> ClusterUnavailable:
    return ClusterUnavailable(
        f"no member answered within the dial timeout ({dial_timeout:g}s): "
        f"{'; '.join(problems.values())}; check --cluster (or DLM_CLUSTER) "
        "and that the members are running"
    )


def _unavailable(
    members: list[str], budget: float, answered: bool, last: str
) -> ClusterUnavailable:
    where = ",".join(members)
    if not answered:
        return ClusterUnavailable(
            f"no member of {where} answered within {budget:g}s ({last}): "
            "is the cluster running? (set --cluster or DLM_CLUSTER)"
        )
    return ClusterUnavailable(
        f"the cluster at {where} found no leader with a quorum within {budget:g}s "
        f"(last: {last}): check that a majority of members is running"
    )


# ---------------------------------------------------------------------------
# Acquire: try once, or queue and wait for the pushed grant
# ---------------------------------------------------------------------------


def acquire_flow(
    s: Settings,
    lease: str,
    key: str,
    *,
    wait: float | None,
    limit: int,
    meta: Mapping[str, str] | None,
    known_ttl_ms: int | None,
) -> Generator[Action, Outcome, Grant]:
    waiting = wait is not None and wait > 0
    seq = new_seq()
    request = without_id(
        Acquire(
            id=0,
            lease=lease,
            seq=seq,
            key=key,
            wait=waiting,
            limit=limit,
            meta=dict(meta or {}),
        )
    )
    wait_s = wait if wait is not None and waiting else 0.0
    wait_deadline = s.clock() + wait_s
    while True:
        budget = max(0.0, wait_deadline - s.clock()) + s.timeout
        addr, reply = yield from call(s, request, timeout=budget, drop_pushes_for=(lease, key))
        result = reply.get("result")
        if result == "granted":
            return grant_from_reply(reply, lease, key)
        if result != "queued" or not waiting:
            raise ServerError("BAD_REPLY", f"unexpected acquire reply {result!r} from {addr}")
        outcome = yield AwaitGrant(addr, lease, key, max(0.0, wait_deadline - s.clock()))
        if isinstance(outcome, dict):
            token = outcome.get("token")
            if not isinstance(token, int) or isinstance(token, bool):
                raise ServerError("BAD_REPLY", f"grant push without a token from {addr}")
            if known_ttl_ms is not None:
                return Grant(key=key, token=token, lease=lease, ttl_ms=known_ttl_ms)
            # The push carries no TTL; the re-sent acquire (same seq) is answered
            # "granted" from the state machine, with it.
            continue
        if isinstance(outcome, Failed):
            # Connection lost while queued: re-send the same acquire; the server
            # answers from its state (granted meanwhile, or still queued).
            continue
        # The wait ran out. Leave the queue; if the grant raced in, this releases it.
        yield from call(s, release_request(lease, key))
        raise LockHeld(
            f"lock {key!r} is still held by someone else after waiting {wait_s:g}s: "
            "try again later or wait longer (--wait)"
        )


def release_request(lease: str, key: str) -> dict[str, Any]:
    return without_id(Release(id=0, lease=lease, seq=new_seq(), key=key))


def without_id(request: Any) -> dict[str, Any]:
    wire: dict[str, Any] = request.to_wire()
    del wire["id"]
    return wire


# ---------------------------------------------------------------------------
# Replies
# ---------------------------------------------------------------------------


def _opt_int(reply: Mapping[Any, Any], name: str) -> int | None:
    value = reply.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def reply_int(reply: Mapping[Any, Any], name: str) -> int:
    value = _opt_int(reply, name)
    if value is None:
        raise ServerError("BAD_REPLY", f"reply field {name!r} is missing or not an integer")
    return value


def reply_str(reply: Mapping[Any, Any], name: str) -> str:
    value = reply.get(name)
    if not isinstance(value, str):
        raise ServerError("BAD_REPLY", f"reply field {name!r} is missing or not a string")
    return value


def reply_list(reply: Mapping[Any, Any], name: str) -> list[Any]:
    value = reply.get(name)
    if not isinstance(value, list):
        raise ServerError("BAD_REPLY", f"reply field {name!r} is missing or not a list")
    return value


def payload(reply: Reply) -> dict[str, Any]:
    """The ok reply's fields without the envelope (type and request id)."""
    return {k: v for k, v in reply.items() if k not in ("t", "id")}


def is_reply_to(frame: Mapping[Any, Any], rid: int) -> bool:
    """Whether ``frame`` answers request ``rid``."""
    fid = frame.get("id")
    return isinstance(fid, int) and not isinstance(fid, bool) and fid == rid


def grant_from_reply(reply: Mapping[Any, Any], lease: str, key: str) -> Grant:
    # The key and lease are ours; the server's echo adds nothing we could trust more.
    return Grant(
        key=key, token=reply_int(reply, "token"), lease=lease, ttl_ms=reply_int(reply, "ttl_ms")
    )


def _holders(reply: Mapping[Any, Any]) -> list[dict[str, Any]]:
    value = reply.get("holders")
    if not isinstance(value, list):
        return []
    return [h for h in value if isinstance(h, dict)]


def describe_holders(holders: list[dict[str, Any]]) -> str:
    if not holders:
        return "nobody holds it now"
    parts = []
    for h in holders[:3]:
        parts.append(f"lease {h.get('lease', '?')} (token {h.get('token', '?')})")
    more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
    return "held by " + ", ".join(parts) + more


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def error_from_reply(
    reply: Mapping[Any, Any], request: Mapping[str, Any] | None = None
) -> DlmError:
    """Maps an ``error`` reply to the exception a caller can act on; ``request`` adds context."""
    request = request or {}
    code = reply.get("code")
    code = code if isinstance(code, str) else "UNKNOWN"
    server_says = _one_line(reply.get("message", "")) or code
    key = request.get("key")
    what = f"lock {key!r}" if isinstance(key, str) else "the lock"
    lease = request.get("lease")
    which_lease = f"lease {lease}" if isinstance(lease, str) else "the lease"
    if code == ErrorCode.LOCKED.value:
        holders = _holders(reply)
        return LockHeld(
            f"{what} is {describe_holders(holders)}: try again later, or wait for it (--wait)",
            holders=holders,
            retry_after_ms=_opt_int(reply, "retry_after_ms"),
        )
    if code == ErrorCode.NOT_HOLDER.value:
        holders = _holders(reply)
        return NotHolder(
            f"{which_lease} does not hold {what}; {describe_holders(holders)}",
            holders=holders,
        )
    if code == ErrorCode.SESSION_EXPIRED.value:
        return LeaseLost(
            f"{which_lease} has expired or was closed, and its locks are gone: "
            "open a new lease (acquire without --lease)"
        )
    if code in (ErrorCode.BAD_REQUEST.value, ErrorCode.TOO_LARGE.value):
        return BadRequest(f"the cluster refused the request: {server_says}", code=code)
    if code in RETRYABLE_CODES:
        return ClusterUnavailable(f"the cluster could not serve the request: {server_says}", code)
    return ServerError(code, f"the cluster answered {code}: {server_says}")
