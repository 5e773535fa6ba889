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
full jitter, keeping one ``seq`` for every retry of one request, building
each request and reading its reply, mapping error replies to exceptions -
lives here once, one ``*_flow`` per client method, and is tested with a fake
clock. The simulator (tests/sim) drives the same flows.

Request identity (docs/PROTOCOL.md): each client has a random ``client`` id
and a ``Sequencer`` whose numbers rise per request; a re-sent request keeps
its number, and every request says up to where the client has its answers
(``acked``), so the cluster can forget results nobody will ask for again.
"""

from __future__ import annotations

import os
import threading
import time

from dlm.client.errors import (
    AuthFailed,
    BadRequest,
    ChangeInProgress,
    ClusterUnavailable,
    DlmError,
    LeaseLost,
    LockHeld,
    NotHolder,
    PermissionDenied,
    QuotaExceeded,
    ServerError,
    UnsafeChange,
)

# The lease rules live in a pure room of their own; the client's users know them from here.
from dlm.client.renewal import (
    CLOCK_RATE_BOUND,
    LEASE_SLACK_S,
    PING_EVERY_S,
    LeaseClock,
    Lost,
    PartClocks,
    PingAt,
    RenewAt,
    Renewer,
    lease_deadline,
    min_hold_ttl_ms,
)
from dlm.wire import (
    BACKUP_MAX_BYTES,
    TRACED_REQUESTS,
    Acquire,
    CloseLease,
    ErrorCode,
    Get,
    LeaseEnded,
    LeaseInfo,
    LeaseOpened,
    LeaseTerms,
    ListLeases,
    ListLocks,
    LockGranted,
    LockReleased,
    MemberAdd,
    MemberPromote,
    MemberRemove,
    Members,
    OpenLease,
    Ping,
    Proclaim,
    ProtocolError,
    Record,
    Release,
    Renew,
    Runs,
    SnapshotChunk,
    SnapshotSave,
    Status,
    UpdateLease,
    format_addr,
    parse_addr,
)

# typing, dataclasses and random stay off the import path of `dlm acquire` (see wire.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
    from typing import Any, TypeVar

    from dlm.views import (
        LeasesPage,
        LeaseState,
        LeaseSummary,
        LocksPage,
        LockState,
        MembersView,
        StatusView,
    )
    from dlm.wire import Reply as ReplyRecord

    R = TypeVar("R", bound=ReplyRecord)
    P = TypeVar("P", LocksPage, LeasesPage)
    T = TypeVar("T")

    Clock = Callable[[], float]
    Reply = dict[Any, Any]

# Every public name, the lease rules re-exported from renewal.py among them.
__all__ = [
    "CLOCK_RATE_BOUND",
    "LEASE_ENDINGS",
    "LEASE_SLACK_S",
    "MAX_PARTITION_REROUTES",
    "MAX_REDIRECT_HOPS",
    "NOT_A_MEMBER",
    "OPEN_RETRY_MAX_S",
    "PING_EVERY_S",
    "RETRYABLE_CODES",
    "SECRET_HINT",
    "TLS_HINT",
    "AwaitGrant",
    "Backoff",
    "ConnectionBroken",
    "Context",
    "Failed",
    "Grant",
    "Lease",
    "LeaseBook",
    "LeaseClock",
    "LeaseParts",
    "LeaseRef",
    "LeaseWatchers",
    "Lost",
    "PartClocks",
    "PartsRenewed",
    "PingAt",
    "ReleaseOutcome",
    "RenewAt",
    "Renewer",
    "RequestIds",
    "Router",
    "Send",
    "Sequencer",
    "Sleep",
    "VoterRoll",
    "WrongPartition",
    "acquire_all_flow",
    "acquire_flow",
    "call",
    "change",
    "close_all_flow",
    "close_lease_flow",
    "close_parts_flow",
    "default_attempt_timeout",
    "describe_holders",
    "error_from_reply",
    "find_lease_flow",
    "get_flow",
    "grant_from_reply",
    "greeting_partitions",
    "is_reply_to",
    "keepalive_flow",
    "lease_acquire_flow",
    "lease_deadline",
    "lease_gone_text",
    "lease_id",
    "lease_info_flow",
    "lease_partitions",
    "list_leases_flow",
    "list_locks_flow",
    "member_change_flow",
    "members_flow",
    "merged_listing_flow",
    "min_hold_ttl_ms",
    "new_lease_id",
    "new_seq",
    "normalise_addr",
    "open_lease_flow",
    "open_near_flow",
    "own_view",
    "parse_members",
    "part_flow",
    "parts_ended_flow",
    "payload",
    "ping_request",
    "prefix_after_refused",
    "proof_failed",
    "read_flow",
    "read_reply",
    "release_flow",
    "renew_parts_flow",
    "request_partition",
    "status_flow",
    "tls_failed",
    "update_applied",
    "update_lease_flow",
    "update_parts_flow",
    "view_flow",
    "watch_partition",
    "without_id",
]

OPEN_RETRY_MAX_S = 60.0
"""An open_lease is re-sent for at most this long, whatever --timeout says (PROTOCOL.md)."""

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
    """An open lease. ``confirmed_at`` is the time (``s.clock``) the open_lease request was first
    sent: the client-side deadline ``confirmed_at + ttl_ms`` falls before the server's.
    ``incarnation`` tells this lease from a later one that reuses the id (0: unknown).
    Two leases are equal when their id and TTL are (``confirmed_at`` is not compared)."""

    __slots__ = ("confirmed_at", "id", "incarnation", "partition", "ttl_ms")
    FIELDS = ("id", "ttl_ms")
    __match_args__ = ("id", "ttl_ms", "confirmed_at")
    id: str
    ttl_ms: int
    confirmed_at: float
    incarnation: int
    partition: int  # the partition this part of the lease lives in (issue 25)

    def __init__(
        self,
        id: str,
        ttl_ms: int,
        confirmed_at: float = 0.0,
        incarnation: int = 0,
        partition: int = 0,
    ) -> None:
        _set(self, "id", id)
        _set(self, "ttl_ms", ttl_ms)
        _set(self, "confirmed_at", confirmed_at)
        _set(self, "incarnation", incarnation)
        _set(self, "partition", partition)

    def __repr__(self) -> str:
        return (
            f"Lease(id={self.id!r}, ttl_ms={self.ttl_ms!r}, confirmed_at={self.confirmed_at!r}, "
            f"incarnation={self.incarnation!r})"
        )


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
    """A random 63-bit request id: what a version-1 client sends as ``seq``."""
    return int.from_bytes(os.urandom(8), "big") >> 1


class Sequencer:
    """The rising request numbers of one client, and how far it has its answers.

    Numbers start at a random offset below 2**62 (from the OS, never from a
    seeded generator: two clients sharing a lease must not meet), so they
    never collide with another client's, and a member of the previous release,
    which knows requests only by their number, tells them apart too.
    ``acked`` is the highest number below which every request was answered or
    given up: neither will be re-sent.
    """

    __slots__ = ("_next", "_open")

    def __init__(self, start: int | None = None) -> None:
        if start is None:
            start = int.from_bytes(os.urandom(8), "big") >> 2
        self._next = start + 1
        self._open: set[int] = set()

    def issue(self) -> int:
        """The number of a new request; it counts as unanswered until ``done``."""
        seq = self._next
        self._next += 1
        self._open.add(seq)
        return seq

    def done(self, seq: int) -> None:
        """``seq`` was answered, or given up: it will never be sent again."""
        self._open.discard(seq)

    @property
    def acked(self) -> int:
        return min(self._open) - 1 if self._open else self._next - 1


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
    """Normalises "a:1,b:2" or ["a:1", "b:2"] to canonical HOST:PORT strings, in order.
    An entry ``gateway:HOST:PORT`` (a gateway, said explicitly) keeps its mark."""
    items = members.split(",") if isinstance(members, str) else list(members)
    out: list[str] = []
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            text = part.strip()
            marked = text.startswith(GATEWAY_MARK)
            addr = format_addr(*parse_addr(text[len(GATEWAY_MARK) :] if marked else text))
            if marked:
                addr = GATEWAY_MARK + addr
            if addr not in out:
                out.append(addr)
    if not out:
        raise ValueError("no cluster member given (set --cluster or DLM_CLUSTER)")
    return out


GATEWAY_MARK = "gateway:"
"""Marks a --cluster entry (and every route through it) as a gateway's (dlm gateway)."""
ROUTE_SEPARATOR = ">"


def gateway_route(gateway: str, member: str) -> str:
    """The address a router keeps for ``member`` reached through ``gateway`` (its HOST:PORT):
    ``gateway:G>M``. A driver dials G and sends the target preamble naming M."""
    return f"{GATEWAY_MARK}{gateway}{ROUTE_SEPARATOR}{member}"


def split_route(addr: str) -> tuple[str, str | None, bool]:
    """(the address to dial, the member to name in a target preamble or None, whether the
    address is marked as a gateway's) of a router's address: ``H:P``, ``gateway:H:P`` or
    ``gateway:H:P>M``."""
    if not addr.startswith(GATEWAY_MARK):
        return addr, None, False
    dial, separator, member = addr[len(GATEWAY_MARK) :].partition(ROUTE_SEPARATOR)
    return dial, (member if separator else None), True


def dial_plan(addr: str, partition: int) -> tuple[str, int, bytes, str]:
    """How a driver reaches ``partition`` at a router's address ``addr``: (host, port, the
    bytes to send first on the bare connection, the name to verify a TLS certificate
    against). The first bytes are the target preamble for a route through a gateway to a
    named member (whose name TLS then checks), the partition preamble otherwise."""
    from dlm.partitioning import preamble, target_preamble

    dial, member, _ = split_route(addr)
    host, port = parse_addr(dial)
    if member is None:
        return host, port, preamble(partition), host
    return host, port, target_preamble(partition, member), parse_addr(member)[0]


DEFAULT_OPEN_TTL_MS = 30_000
"""The TTL a lease is opened with when the caller names none and the member speaks a
protocol older than 5, which cannot leave it to the cluster's default-ttl (the
member's own DEFAULT_TTL_MS)."""

CLUSTER_TTL_VERSION = 5
"""The protocol version from which an open_lease may leave out ttl_ms (the cluster's
default-ttl then applies)."""


def greeting_version(greeting: Mapping[Any, Any]) -> int | None:
    """The protocol version a member's welcome negotiated (None: not a welcome, or a
    version that is not a small positive integer: bytes from outside are untrusted)."""
    if greeting.get("t") != "welcome":
        return None
    version = greeting.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= 1 << 16:
        return version
    return None


def leaves_ttl_to_cluster(request: Mapping[str, Any]) -> bool:
    """Is ``request`` an open_lease that names no TTL (the cluster's default-ttl)?"""
    return request.get("t") == "open_lease" and request.get("ttl_ms") is None


def for_member(request: dict[str, Any], version: int | None) -> dict[str, Any]:
    """``request`` as a member that negotiated protocol ``version`` takes it: an open_lease
    naming no TTL leaves ttl_ms out (version 5 on: the cluster's default-ttl applies), or
    names DEFAULT_OPEN_TTL_MS to an older member (or one whose version is unknown), which
    would refuse the missing field. Any other request goes as it is."""
    if not leaves_ttl_to_cluster(request):
        return request
    fitted = dict(request)
    if version is not None and version >= CLUSTER_TTL_VERSION:
        fitted.pop("ttl_ms", None)
    else:
        fitted["ttl_ms"] = DEFAULT_OPEN_TTL_MS
    return fitted


def is_gateway_notice(frame: object) -> bool:
    """Is ``frame`` the notice a gateway writes first (``{t: gateway, version: 1}``)?"""
    return isinstance(frame, dict) and frame.get("t") == "gateway" and "id" not in frame


def redial_through_gateway(reply: Mapping[Any, Any]) -> bool:
    """Should a connection through a gateway that brought ``reply`` be dropped? Yes when
    the member said it cannot serve (NOT_LEADER, SHUTTING_DOWN): the next connection
    lets the gateway choose again, or names the leader in a target preamble."""
    return reply.get("t") == "error" and reply.get("code") in (
        ErrorCode.NOT_LEADER.value,
        ErrorCode.SHUTTING_DOWN.value,
    )


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

    def redirect(self, addr: str, source: str | None = None) -> None:
        """``source`` (when given) named ``addr`` as the leader; if it was the member in
        turn, the turn moves past it, so that a dead end reached through it leads on."""
        if source is not None and self.members[self._turn] == source:
            self._turn = (self._turn + 1) % len(self.members)
        self.preferred = addr

    def answered(self, addr: str) -> None:
        self.preferred = addr

    def copy(self) -> Router:
        """An independent router of the same kind in the same state (a spawned client's)."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.members = list(self.members)
        return other

    def for_partition(self, partition: int) -> Router:
        """A router of the same kind for another partition's group: no leader known yet,
        and the turn starts ``partition`` members further on, since the partitions'
        leaders are spread over the members (partition i prefers the voters rotated by i).
        A subclass (a test's routing through a proxy) keeps its own settings."""
        other = self.copy()
        other.preferred = None
        other._turn = (self._turn + partition) % len(self.members)
        return other

    def failed(self, addr: str) -> None:
        """``addr`` is down or not useful: forget it and move on.

        The member in turn moves the turn on; a member reached through a redirect or
        an earlier answer is only forgotten, and the turn (already past whoever sent
        us there) stays. Restarting the turn after ``addr`` instead could lead back
        to the member that redirected us: a removed member that never learned of its
        removal names its old leader, and the two would be tried in a circle while
        the real leader is never asked.
        """
        if self.members[self._turn] == addr or self.preferred != addr:
            self._turn = (self._turn + 1) % len(self.members)
        if self.preferred == addr:
            self.preferred = None


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
    __slots__ = ("addr", "drop_pushes_for", "partition", "request", "timeout")
    FIELDS = ("addr", "request", "timeout", "drop_pushes_for", "partition")
    addr: str
    request: dict[str, Any]  # without "id": the driver assigns one per attempt
    timeout: float
    # A grant push for this (lease, key) that is already buffered is stale once we
    # send a new acquire for it; the driver drops it before sending.
    drop_pushes_for: tuple[str, str] | None
    # Which of the member's partitions (Raft groups) the request is for: the driver
    # keeps a connection per (address, partition) and dials partition i > 0 with
    # dlm.partitioning.preamble(i).
    partition: int

    def __init__(
        self,
        addr: str,
        request: dict[str, Any],
        timeout: float,
        drop_pushes_for: tuple[str, str] | None = None,
        partition: int = 0,
    ) -> None:
        _set(self, "addr", addr)
        _set(self, "request", request)
        _set(self, "timeout", timeout)
        _set(self, "drop_pushes_for", drop_pushes_for)
        _set(self, "partition", partition)


class Sleep(Record):
    __slots__ = ("seconds",)
    FIELDS = ("seconds",)
    seconds: float

    def __init__(self, seconds: float) -> None:
        _set(self, "seconds", seconds)


class AwaitGrant(Record):
    __slots__ = ("addr", "key", "lease", "partition", "timeout")
    FIELDS = ("addr", "lease", "key", "timeout", "partition")
    addr: str
    lease: str
    key: str
    timeout: float
    partition: int  # the connection (to ``addr``, for this partition) the push comes on

    def __init__(self, addr: str, lease: str, key: str, timeout: float, partition: int = 0) -> None:
        _set(self, "addr", addr)
        _set(self, "lease", lease)
        _set(self, "key", key)
        _set(self, "timeout", timeout)
        _set(self, "partition", partition)


class ConnectionBroken(Exception):
    """A driver's connection failed (refused, reset, timed out, garbled); the message says
    how. Drivers turn it into ``Failed`` for the flow."""


NOT_A_MEMBER = "did not answer as a dlm member"
"""A ``Failed`` reason (alone, or followed by a detail in parentheses): the address took
the connection but sent nothing a dlm member sends (a web server, say, or a stopped
member); ``call`` adds the time it had."""


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


class Context:
    """What every call of one client shares: members, routing, backoff, clock, identity.

    Partitions (issue 25): a cluster may run ``partitions`` Raft groups, each with its own
    leader, on the same members. The client learns the count from a member's greeting or
    a WRONG_PARTITION reply (it is 1 until then: a cluster of one partition is exactly the
    cluster of earlier releases), and keeps one Router per partition: ``router`` is
    partition 0's, ``router_for(p)`` any partition's.
    """

    __slots__ = (
        "attempt_timeout",
        "backoff",
        "client",
        "clock",
        "dial_timeout",
        "gateways",
        "members",
        "partitions",
        "reached",
        "router",
        "routers",
        "seqs",
        "timeout",
        "trace",
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
        client: str | None = None,
        seqs: Sequencer | None = None,
        dial_timeout: float | None = None,
    ) -> None:
        self.members = members
        self.router = router
        self.backoff = backoff
        self.clock = clock
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self.client = client or new_lease_id()
        self.seqs = seqs or Sequencer()
        # Until some member has answered (``reached``), a call gives up once this long
        # has passed with no answer at all (None: only ``timeout`` counts). After that,
        # a member that stops answering is an outage to ride out, not a wrong address.
        self.dial_timeout = dial_timeout
        self.reached = False
        self.partitions = 1
        # The routers of partitions other than 0, made on first use from ``router``.
        self.routers: dict[int, Router] = {}
        self.trace: str | None = None
        """The trace context (a W3C traceparent) the lock and lease requests carry (issue 30):
        the caller's span, so a member's spans join its trace; None: untraced."""
        # The addresses (HOST:PORT) known to be gateways: marked in --cluster, or whose
        # connection began with a gateway's notice (the driver adds those).
        self.gateways: set[str] = {
            split_route(member)[0] for member in members if member.startswith(GATEWAY_MARK)
        }

    def leader_route(self, addr: str, leader: str) -> str:
        """Where to go for ``leader``, named by the member reached at ``addr``: through the
        same gateway when ``addr`` is one (a client behind a gateway may not reach the
        members' own addresses), else ``leader`` itself."""
        dial, _, marked = split_route(addr)
        if marked or dial in self.gateways:
            return gateway_route(dial, leader)
        return leader

    def member_route(self, member: str) -> str:
        """Where to go for one member by its own address (a status view asks each): through
        the gateway partition 0 goes through, when it goes through one, else directly."""
        dial, _, marked = split_route(self.router.target())
        if marked or dial in self.gateways:
            return gateway_route(dial, member)
        if self.gateways:
            return gateway_route(min(self.gateways), member)
        return member

    def router_for(self, partition: int) -> Router:
        """The router of ``partition``'s group (``router`` itself for partition 0)."""
        if partition == 0:
            return self.router
        router = self.routers.get(partition)
        if router is None:
            router = self.routers[partition] = self.router.for_partition(partition)
        return router

    def learn_partitions(self, count: object) -> bool:
        """A member said the cluster has ``count`` partitions (its greeting, or a
        WRONG_PARTITION reply): True when that changed what this client knew. A count
        that is no valid partition count is ignored (bytes from outside are untrusted)."""
        if count == self.partitions or not isinstance(count, int):
            return False
        from dlm.partitioning import check_partitions

        if check_partitions(count) is not None:
            return False
        self.partitions = count
        return True

    def partition_of(self, key: str) -> int:
        """The partition that holds ``key``, as far as this client knows the cluster."""
        if self.partitions == 1:
            return 0  # without loading hashlib: `dlm acquire` on a one-partition cluster
        from dlm.partitioning import partition_of

        return partition_of(key, self.partitions)


def greeting_partitions(greeting: Mapping[Any, Any]) -> tuple[int | None, int | None]:
    """What a member's welcome says of partitions: (the cluster's count, the partition
    this connection reached). A welcome that names neither is from a cluster of one
    partition (or an earlier release): (1, 0). A value that is not a valid count or
    partition number reads as None (bytes from outside are untrusted)."""
    count = greeting.get("partitions", 1)
    partition = greeting.get("partition", 0)
    if count == 1 and partition == 0 and not isinstance(count, bool | float):
        return 1, 0  # the one-partition cluster's welcome, decided without more imports
    from dlm.partitioning import MAX_PARTITIONS, check_partitions

    if not isinstance(count, int) or check_partitions(count) is not None:
        count = None
    valid = isinstance(partition, int) and not isinstance(partition, bool)
    if not valid or not 0 <= partition < (count or MAX_PARTITIONS):
        partition = None
    return count, partition


def default_attempt_timeout(timeout: float) -> float:
    # Long enough for an fsync stall, short enough that a SIGSTOPped leader
    # costs a fraction of the budget before we try someone else.
    return max(0.5, min(3.0, timeout / 4))


# ---------------------------------------------------------------------------
# One request, retried until it is answered or the time is up
# ---------------------------------------------------------------------------


class WrongPartition(ServerError):
    """A member answered WRONG_PARTITION to a request sent to a partition the caller
    chose (``call(..., partition=p)``): the key is another partition's. ``partitions``
    is the count the member gave (the context has learned it): the caller plans again."""

    def __init__(self, message: str, partitions: int) -> None:
        super().__init__(ErrorCode.WRONG_PARTITION.value, message)
        self.partitions = partitions


MAX_PARTITION_REROUTES = 4
"""WRONG_PARTITION replies one call follows before it gives up: a cluster whose members
disagree about the count (mid-restore, say) must not send the client in circles."""


def request_partition(s: Context, request: Mapping[str, Any]) -> int:
    """The partition a request goes to when the caller names none: its key's, for a
    request that names one (acquire, release, get, proclaim, runs or watch of a key),
    else partition 0."""
    key = request.get("key")
    return s.partition_of(key) if isinstance(key, str) else 0


def watch_partition(s: Context, key: str | None, partition: int | None = None) -> int:
    """The partition a watch goes to: ``partition`` when given, else the watched key's
    (a prefix's watch: partition 0, unless the caller names another)."""
    if partition is not None:
        return partition
    return s.partition_of(key) if key is not None else 0


def call(
    s: Context,
    request: dict[str, Any],
    *,
    timeout: float | None = None,
    drop_pushes_for: tuple[str, str] | None = None,
    partition: int | None = None,
) -> Generator[Action, Outcome, tuple[str, Reply]]:
    """Sends ``request`` until some member answers it; returns (address, ok reply).

    Retryable failures are retried with the very same request (same ``seq``)
    until ``timeout`` (default: the client's) runs out, then ClusterUnavailable.
    Any other error reply is raised as its exception.

    ``partition``: the partition (Raft group) to ask. None routes by the request's
    key (``request_partition``), and a WRONG_PARTITION reply re-routes it by the count
    that reply gives (at most MAX_PARTITION_REROUTES times). A partition named here is
    kept: a WRONG_PARTITION reply raises WrongPartition, for the caller to plan again
    (a lease's part may have to be opened in the key's partition first).
    """
    if s.trace is not None and request.get("t") in TRACED_REQUESTS:
        request = {**request, "trace": s.trace}
    routed = partition is None
    target_partition = request_partition(s, request) if partition is None else partition
    reroutes = 0
    budget = s.timeout if timeout is None else timeout
    deadline = s.clock() + budget
    dial = None if s.reached else s.dial_timeout
    dial_deadline = None if dial is None else s.clock() + dial
    unanswered: dict[str, str] = {}  # address -> why it did not answer, while none has
    # First contact only: who answers without a leader, and what the others do, so a
    # cluster that cannot elect one is reported within the dial timeout, not the timeout.
    roll = VoterRoll(s.members) if dial is not None else None
    leaderless = False  # some member answered that it knows no leader
    failures = 0  # drives the backoff exponent
    misses_in_row = 0  # unreachable members in a row; back off after a full round
    hops = 0
    answered = False
    last_problem = "no attempt was made"
    while True:
        remaining = deadline - s.clock()
        if remaining <= 0:
            raise _unavailable(s.members, budget, answered, last_problem)
        router = s.router_for(target_partition)
        addr = router.target()
        attempt = min(remaining, s.attempt_timeout)
        if dial is not None and (not answered or leaderless):
            # An equal share each, so one silent address cannot use up the dial budget.
            attempt = min(attempt, dial / len(s.members))
        outcome = yield Send(
            addr, request, attempt, drop_pushes_for=drop_pushes_for, partition=target_partition
        )
        delay = 0.0
        if roll is not None:
            roll.saw(addr, outcome)
        if not isinstance(outcome, dict):
            reason = outcome.reason if isinstance(outcome, Failed) else "no reply"
            if reason.startswith(NOT_A_MEMBER):
                # Over the dial budget (or the whole budget), which is the time it had.
                waited = dial if dial is not None and not answered else budget
                detail = reason[len(NOT_A_MEMBER) :]
                last_problem = f"{addr} {NOT_A_MEMBER} within {waited:g}s{detail}"
            else:
                last_problem = reason if reason.startswith(addr) else f"{addr}: {reason}"
            router.failed(addr)
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
                router.answered(addr)
                return addr, outcome
            code = outcome.get("code")
            if kind != "error" or not isinstance(code, str):
                last_problem = f"{addr}: unexpected reply {kind!r}"
                router.failed(addr)
                delay = s.backoff.delay(failures)
                failures += 1
            elif code == ErrorCode.WRONG_PARTITION.value:
                # Not this partition's key: the member says how many there are. The
                # member answered, so the router keeps it; only the partition changes.
                count = outcome.get("partitions")
                s.learn_partitions(count)
                message = (
                    f"{addr} says the key is not partition {target_partition}'s "
                    f"(the cluster has {count!r} partitions)"
                )
                if not routed:
                    raise WrongPartition(message, s.partitions)
                moved = request_partition(s, request)
                reroutes += 1
                if moved == target_partition or reroutes > MAX_PARTITION_REROUTES:
                    raise ServerError(
                        ErrorCode.WRONG_PARTITION.value,
                        f"{message}; the members disagree about the partition count: "
                        "check that every member runs with the same --partitions",
                    )
                target_partition = moved
                continue
            elif code not in RETRYABLE_CODES:
                raise error_from_reply(outcome, request)
            else:
                last_problem = f"{code} from {addr}"
                leader = normalise_addr(outcome.get("leader_address"))
                if leader:
                    leader = s.leader_route(addr, leader)
                if code == ErrorCode.NOT_LEADER.value and leader and leader != addr:
                    if hops < MAX_REDIRECT_HOPS:
                        hops += 1
                        router.redirect(leader, addr)
                        continue
                    router.redirect(leader, addr)
                elif code in (ErrorCode.NOT_LEADER.value, ErrorCode.SHUTTING_DOWN.value):
                    router.failed(addr)
                if code in (ErrorCode.NOT_LEADER.value, ErrorCode.NO_QUORUM.value) and not (
                    leader and leader != addr
                ):
                    leaderless = True
                hops = 0
                delay = s.backoff.delay(failures, _opt_int(outcome, "retry_after_ms"))
                failures += 1
        if roll is not None and leaderless and dial_deadline is not None:
            now = s.clock()
            if now >= dial_deadline:
                hopeless = roll.hopeless()
                if hopeless is not None:
                    raise ClusterUnavailable(hopeless)
            else:
                delay = min(delay, dial_deadline - now)
        if delay > 0:
            yield Sleep(min(delay, max(0.0, deadline - s.clock())))


class VoterRoll:
    """What each voter did when first asked, while no leader answers: answered, refused
    the connection, or stayed silent; and whether that leaves a quorum that could elect.

    The voters come from the members' NOT_LEADER replies (``voters``: id -> address);
    from a member of the previous release, which does not send them, the addresses of
    --cluster stand in, named by address.
    """

    ANSWERS, REFUSED, SILENT = "answers", "refused", "did not answer"

    def __init__(self, members: Sequence[str]) -> None:
        self.members = list(members)
        self.outcomes: dict[str, str] = {}  # address -> ANSWERS, REFUSED, SILENT
        self.voters: dict[str, str] | None = None  # id -> address

    def saw(self, addr: str, outcome: Outcome) -> None:
        if isinstance(outcome, dict):
            self.outcomes[addr] = self.ANSWERS
            voters = outcome.get("voters")
            if isinstance(voters, dict) and voters:
                named = {
                    str(v): a
                    for v, raw in voters.items()
                    if isinstance(v, str) and (a := normalise_addr(raw)) is not None
                }
                if named:
                    self.voters = named
            return
        reason = outcome.reason if isinstance(outcome, Failed) else ""
        self.outcomes[addr] = self.REFUSED if "refused" in reason.lower() else self.SILENT

    def hopeless(self) -> str | None:
        """The failure to report when fewer than a quorum of voters answer and every voter
        we can ask has been asked; None while an election could still succeed."""
        voters = self.voters or {addr: addr for addr in self.members}
        quorum = len(voters) // 2 + 1
        answering = [v for v, a in voters.items() if self.outcomes.get(a) == self.ANSWERS]
        if len(answering) >= quorum:
            return None  # a quorum is up: an election is under way, worth waiting for
        groups: dict[str, list[str]] = {}
        not_asked = 0
        for voter, addr in voters.items():
            outcome = self.outcomes.get(addr)
            if outcome == self.ANSWERS:
                continue
            if outcome is None:
                if addr in self.members:
                    return None  # not asked yet
                outcome = "not asked (not in --cluster)"
                not_asked += 1
            groups.setdefault(outcome, []).append(voter)
        if len(answering) + not_asked >= quorum:
            return None  # the voters we cannot ask may be electing a leader right now
        others = "; ".join(f"{', '.join(ids)} {what}" for what, ids in groups.items())
        return (
            f"no leader: {len(answering)} of {len(voters)} voters answer; {others}: "
            f"electing a leader needs {quorum} of the {len(voters)}; start the members that "
            "are down (or check --cluster)"
        )


def _none_answered(dial_timeout: float, problems: Mapping[str, str]) -> ClusterUnavailable:
    if len(problems) == 1:
        (problem,) = problems.values()
        if NOT_A_MEMBER in problem:
            return ClusterUnavailable(f"{problem}: check --cluster (or DLM_CLUSTER)")
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
# The client's methods, one flow each
# ---------------------------------------------------------------------------


def change(
    s: Context,
    request: Any,
    *,
    timeout: float | None = None,
    drop_pushes_for: Any = None,
    partition: int | None = None,
) -> Generator[Action, Outcome, tuple[str, Reply]]:
    """``call`` for a request that changes state: it carries this client's identity.

    ``request`` is a wire request made with ``seq=0``; the flow fills in the
    client id, a fresh seq and the acknowledged floor, keeps them for every
    retry, and marks the seq done however the call ends.
    """
    seq = s.seqs.issue()
    wire = without_id(request)
    wire.update(client=s.client, seq=seq, acked=s.seqs.acked)
    try:
        return (
            yield from call(
                s, wire, timeout=timeout, drop_pushes_for=drop_pushes_for, partition=partition
            )
        )
    finally:
        s.seqs.done(seq)


def open_lease_flow(
    s: Context,
    ttl_ms: int | None,
    lease: str | None = None,
    *,
    ephemeral: bool = False,
    meta: Mapping[str, str] | None = None,
    lock_delay_ms: int = 0,
    partition: int | None = None,
) -> Generator[Action, Outcome, Lease]:
    """Opens a lease (a fresh random id unless ``lease`` is given).

    ``ttl_ms`` None: the cluster's default-ttl (the driver fits the request to the
    member's protocol version, ``for_member``); the lease's TTL is then the one the
    member's reply names, as it always is.
    ``lock_delay_ms`` (0 to 60000; cluster version 4): when the lease expires or is
    revoked while holding a key, the key is granted to nobody for that long.
    ``partition``: where to open it (a part of a lease with keys in several
    partitions); None: the lease id's own partition (``partition_of(id)``).

    The lease's client-side clock starts when the request was first *sent*:
    whatever the server did with it happened later, so our deadline passes first.
    """
    lid = lease or new_lease_id()
    where = s.partition_of(lid) if partition is None else partition
    sent = s.clock()
    # Re-sending an open is only safe while the cluster still remembers the leases that
    # ended (five minutes of its log time): stop well before.
    budget = min(s.timeout, OPEN_RETRY_MAX_S)
    request = OpenLease(
        id=0,
        lease=lid,
        ttl_ms=ttl_ms,
        ephemeral=ephemeral,
        meta=dict(meta or {}),
        lock_delay_ms=lock_delay_ms or None,
    )
    _, reply = yield from change(s, request, timeout=budget, partition=where)
    opened = read_reply(LeaseOpened, reply)
    return Lease(
        lid, opened.ttl_ms, confirmed_at=sent, incarnation=opened.incarnation, partition=where
    )


def open_near_flow(
    s: Context,
    ttl_ms: int | None,
    near: Sequence[str],
    *,
    ephemeral: bool = False,
    meta: Mapping[str, str] | None = None,
    lock_delay_ms: int = 0,
) -> Generator[Action, Outcome, Lease]:
    """Opens a lease with a fresh id in the partition of the first of the keys it is
    for (``near``, in the global acquire order), so that it has no part where it will
    hold nothing. A client that did not know the partition count yet learns it from
    this open's greeting; if the lease landed elsewhere, that empty lease is closed
    and one opened where the keys are (a fresh id again: the closed one's tombstone
    must not meet the new lease)."""
    for _ in range(2):
        home = _first_partition(s, near) if near else None
        known = s.partitions
        opened = yield from open_lease_flow(
            s,
            ttl_ms,
            ephemeral=ephemeral,
            meta=meta,
            lock_delay_ms=lock_delay_ms,
            partition=home,
        )
        if s.partitions == known or not near:
            return opened
        if _first_partition(s, near) == opened.partition:
            return opened
        try:
            yield from close_lease_flow(
                s, opened.id, partition=opened.partition, timeout=s.attempt_timeout
            )
        except DlmError:
            return opened  # kept: it is a part of the lease like any other
    return opened


def _first_partition(s: Context, keys: Sequence[str]) -> int:
    """The partition a multi-key acquire of ``keys`` starts in (the lowest of theirs)."""
    return min(s.partition_of(key) for key in keys)


def keepalive_flow(
    s: Context,
    lease: str,
    *,
    incarnation: int = 0,
    timeout: float | None = None,
    partition: int = 0,
) -> Generator[Action, Outcome, int]:
    """Renews the lease; returns its TTL in ms. LeaseLost if it is gone.

    ``incarnation`` (from ``Lease``; 0 when unknown) keeps a late copy of this
    request from renewing a later lease that reuses the id.
    """
    # A keep-alive is not in the log, so it takes no part in the acknowledged floor; its
    # number only lets the leader ignore a stale copy of an older one.
    seq = s.seqs.issue()
    s.seqs.done(seq)
    request = without_id(
        Renew(id=0, lease=lease, incarnation=incarnation, client=s.client, seq=seq)
    )
    _, reply = yield from call(s, request, timeout=timeout, partition=partition)
    return read_reply(LeaseTerms, reply).ttl_ms


def close_lease_flow(
    s: Context,
    lease: str,
    *,
    must_exist: bool = False,
    run: RunEnd | None = None,
    revoke: bool = False,
    partition: int = 0,
    timeout: float | None = None,
) -> Generator[Action, Outcome, list[str]]:
    """Ends the lease, releasing its locks; returns the keys it held.

    A lease that is already gone is what its owner wanted, so that is success,
    unless ``must_exist`` (an operator revoking a lease by id): then LeaseLost.
    ``run``: how the run of its grant ended, for the run ledger (see ``RunEnd``).
    ``revoke``: an operator ends someone else's lease, so its lock-delay applies to
    the keys it held (a close by the lease's own process is a release: no delay).
    """
    try:
        request = CloseLease(id=0, lease=lease, seq=0, revoke=revoke or None, **_run_fields(run))
        _, reply = yield from change(s, request, partition=partition, timeout=timeout)
    except LeaseLost:
        if must_exist:
            raise
        return []
    return read_reply(LeaseEnded, reply).released


def update_lease_flow(
    s: Context,
    lease: str,
    ttl_ms: int,
    *,
    finished: bool = False,
    timeout: float | None = None,
    run: RunEnd | None = None,
    partition: int = 0,
) -> Generator[Action, Outcome, int]:
    """Gives the lease a new TTL from now; returns it. ``timeout``: how long to keep
    re-sending it (default: the client's). ``run`` (with ``finished``): as on a close."""
    request = UpdateLease(
        id=0, lease=lease, ttl_ms=ttl_ms, finished=finished, seq=0, **_run_fields(run)
    )
    _, reply = yield from change(s, request, timeout=timeout, partition=partition)
    return read_reply(LeaseTerms, reply).ttl_ms


def acquire_flow(
    s: Context,
    lease: str,
    key: str,
    *,
    wait: float | None,
    limit: int,
    meta: Mapping[str, str] | None,
    known_ttl_ms: int | None,
    partition: int | None = None,
) -> Generator[Action, Outcome, Grant]:
    """Takes ``key``: once (LockHeld if held), or queued FIFO for up to ``wait`` seconds.
    ``partition``: as for ``call`` (None: the key's, re-routed on WRONG_PARTITION)."""
    waiting = wait is not None and wait > 0
    seq = s.seqs.issue()
    try:
        request = without_id(
            Acquire(
                id=0,
                lease=lease,
                seq=seq,
                key=key,
                wait=waiting,
                limit=limit,
                meta=dict(meta or {}),
                client=s.client,
                acked=s.seqs.acked,
            )
        )
        wait_s = wait if wait is not None and waiting else 0.0
        wait_deadline = s.clock() + wait_s
        while True:
            budget = max(0.0, wait_deadline - s.clock()) + s.timeout
            addr, reply = yield from call(
                s, request, timeout=budget, drop_pushes_for=(lease, key), partition=partition
            )
            result = reply.get("result")
            if result == "granted":
                return grant_from_reply(reply, lease, key)
            if result != "queued" or not waiting:
                raise ServerError("BAD_REPLY", f"unexpected acquire reply {result!r} from {addr}")
            # The push comes on the connection the acquire was answered on: its key's
            # partition's (``call`` routed it there).
            outcome = yield AwaitGrant(
                addr,
                lease,
                key,
                max(0.0, wait_deadline - s.clock()),
                s.partition_of(key) if partition is None else partition,
            )
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
            leave = Release(id=0, lease=lease, seq=0, key=key, keep_lease=True)
            yield from change(s, leave, partition=partition)
            raise LockHeld(
                f"lock {key!r} is still held by someone else after waiting {wait_s:g}s: "
                "try again later or wait longer (--wait)"
            )
    finally:
        s.seqs.done(seq)


class ReleaseOutcome(Record):
    """What a release did: ``held`` (a lock, with its ``token``) or a queue place, and
    whether the lease ended with it (an ephemeral lease left idle)."""

    __slots__ = ("held", "key", "lease_ended", "token")
    FIELDS = ("key", "held", "token", "lease_ended")
    key: str
    held: bool
    token: int | None
    lease_ended: bool

    def __init__(self, key: str, held: bool, token: int | None, lease_ended: bool) -> None:
        _set(self, "key", key)
        _set(self, "held", held)
        _set(self, "token", token)
        _set(self, "lease_ended", lease_ended)


def release_flow(
    s: Context, lease: str, key: str, *, token: int | None = None, keep_lease: bool = True
) -> Generator[Action, Outcome, ReleaseOutcome]:
    """Releases ``key`` (only the grant ``token`` names, if given), or leaves its queue."""
    request = Release(id=0, lease=lease, seq=0, key=key, token=token, keep_lease=keep_lease)
    _, reply = yield from change(s, request)
    answer = read_reply(LockReleased, reply)
    return ReleaseOutcome(key, answer.released == "lock", answer.token, answer.lease_ended)


RunEnd = tuple[str, int | None, int | None]
"""How a run ended, for the run ledger: (outcome, exit code, signal); outcome
``finished`` (CMD ended: its exit code, or the signal that ended it), ``killed``
(stopped at the lease's deadline) or ``lock_lost``."""


def _run_fields(run: RunEnd | None) -> dict[str, Any]:
    if run is None:
        return {}
    outcome, exit_code, signal = run
    return {"outcome": outcome, "exit_code": exit_code, "signal": signal}


def runs_flow(
    s: Context, key: str | None = None, *, prefix: str = "", stale: bool = False
) -> Generator[Action, Outcome, list[dict[str, Any]]]:
    """The run ledger: the runs of ``key`` newest first, or (no key) the last run of each
    key under ``prefix``, by key, every page (each run a map; times in ms)."""
    from dlm.client.fanout import run_key

    wire = without_id(Runs(id=0, key=key, prefix=prefix, stale=stale))
    if key is not None:  # one key's runs: its partition's (``call`` routes by the key)
        _, reply = yield from call(s, wire)
        return _run_rows(reply)[0]
    return (yield from merged_listing_flow(s, wire, _run_rows, run_key))


def _run_rows(reply: Reply) -> tuple[list[dict[str, Any]], str | None]:
    """A ``runs`` answer's rows (each a map) and its next page's cursor."""
    answer = payload(reply)
    rows = answer.get("runs")
    cursor = answer.get("next")
    return (
        [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else [],
        cursor if isinstance(cursor, str) else None,
    )


def proclaim_flow(s: Context, lease: str, name: str, value: str) -> Generator[Action, Outcome, int]:
    """Replaces election ``name``'s value, for ``lease`` only if it leads (NotHolder else);
    returns the leadership's token, unchanged (cluster version 4)."""
    request = Proclaim(id=0, lease=lease, seq=0, key=name, value=value)
    _, reply = yield from change(s, request)
    return read_reply(LockGranted, reply).token


def read_flow(
    s: Context, request: Any, *, timeout: float | None = None, partition: int | None = None
) -> Generator[Action, Outcome, dict[str, Any]]:
    """A request that changes nothing (status, members), or an admin's identity change:
    its ok payload. ``partition``: the partition's group to ask (None: as ``call``)."""
    _, reply = yield from call(s, without_id(request), timeout=timeout, partition=partition)
    return payload(reply)


def prefix_after_refused(after: int, partitions: int) -> BadRequest:
    """A prefix watch after a log index, in a cluster of several partitions: refused."""
    return BadRequest(
        f"after={after} is a log index of one partition, and the keys under a prefix are "
        f"in all {partitions} partitions, each with its own log: watch the prefix from "
        "now, or one key after an index"
    )


def view_flow(
    s: Context, request: Any, kind: type[R], *, partition: int | None = None
) -> Generator[Action, Outcome, R]:
    """A read answered with one record (dlm.views), read once, here; ``partition`` as
    for ``call``."""
    _, reply = yield from call(s, without_id(request), partition=partition)
    return read_reply(kind, payload(reply))


def get_flow(s: Context, key: str, *, stale: bool = False) -> Generator[Action, Outcome, LockState]:
    from dlm.views import LockState  # the reads' records stay off `dlm acquire`'s imports

    return (yield from view_flow(s, Get(id=0, key=key, stale=stale), LockState))


def lease_info_flow(
    s: Context, lease: str, book: LeaseBook | None = None
) -> Generator[Action, Outcome, LeaseState]:
    """The lease as one of its parts sees it (a cluster of several partitions: the first
    part the ``book`` knows, else the first partition that has the lease; its ``keys``
    are that part's)."""
    from dlm.views import LeaseState

    request = without_id(LeaseInfo(id=0, lease=lease))
    known = book.parts(lease) if book is not None else None
    if known:
        _, reply = yield from call(s, request, partition=min(known))
        return read_reply(LeaseState, payload(reply))
    missing: LeaseLost | None = None
    for partition in lease_partitions(s, None):
        try:
            _, reply = yield from call(s, request, partition=partition)
        except LeaseLost as exc:
            if s.partitions == 1:
                raise
            missing = missing if missing is not None and exc.ended == "unknown" else exc
            continue
        return read_reply(LeaseState, payload(reply))
    assert missing is not None  # the loop asks partition 0 at least
    raise missing


def status_flow(
    s: Context, *, stale: bool = False, partition: int = 0
) -> Generator[Action, Outcome, StatusView]:
    """``partition``'s view of its group (a cluster of P partitions has P groups, each with
    its own leader, term and log, on the same members)."""
    from dlm.views import StatusView

    request = Status(id=0, stale=stale)
    return (yield from view_flow(s, request, StatusView, partition=partition))


def own_view(reply: Reply | None) -> StatusView | None:
    """A member's answer to a direct (stale) ``status`` as its view; None for no answer, an
    error, or a reply that is no status (``member_status``: such a member does not answer)."""
    from dlm.views import StatusView

    if reply is None or reply.get("t") != "ok":
        return None
    try:
        return StatusView.from_wire(payload(reply))
    except ProtocolError:
        return None


def members_flow(
    s: Context, *, partition: int | None = None
) -> Generator[Action, Outcome, MembersView]:
    """The membership as ``partition``'s leader sees it (every partition's group has the
    same members, changed by the admin commands one group at a time)."""
    from dlm.views import MembersView

    return (yield from view_flow(s, Members(id=0), MembersView, partition=partition))


def snapshot_save_flow(
    s: Context, *, partition: int | None = None
) -> Generator[Action, Outcome, tuple[str, Reply]]:
    """The header of a backup from ``partition``'s leader (None: partition 0's): (address,
    the ok reply, its ``id`` kept so that the chunks that follow on the same connection
    can be told apart)."""
    return (yield from call(s, without_id(SnapshotSave(id=0)), partition=partition))


class ImageAssembly:
    """The chunks of one backup image, checked as they come: in order, bounded, ended."""

    def __init__(self, rid: int, limit: int = BACKUP_MAX_BYTES) -> None:
        self.rid = rid
        self.limit = limit
        self.parts: list[bytes] = []
        self.received = 0
        self.done = False

    def take(self, frame: Mapping[Any, Any]) -> bool:
        """Takes ``frame`` if it belongs to this image (True); raises ServerError for an
        error reply or a chunk out of order, and BAD_REPLY for a malformed one."""
        if not is_reply_to(frame, self.rid):
            return False
        kind = frame.get("t")
        if kind == "error":
            raise error_from_reply(frame)
        if kind != "chunk":
            raise ServerError("BAD_REPLY", f"expected an image chunk, got {str(kind)[:20]!r}")
        chunk = read_reply(SnapshotChunk, frame)
        if chunk.offset != self.received:
            raise ServerError(
                "BAD_REPLY", f"image chunk at byte {chunk.offset}, expected {self.received}"
            )
        if self.received + len(chunk.data) > self.limit:
            raise ServerError("BAD_REPLY", f"image larger than {self.limit} bytes")
        self.parts.append(chunk.data)
        self.received += len(chunk.data)
        self.done = chunk.last
        return True

    def image(self) -> bytes:
        return b"".join(self.parts)


def merged_listing_flow(
    s: Context,
    request: dict[str, Any],
    read_page: Callable[[Reply], tuple[Sequence[T], str | None]],
    key: Callable[[T], str],
) -> Generator[Action, Outcome, list[T]]:
    """Every page of a paged listing (``request``, without its ``after``) from every
    partition, as one listing by key (dlm.client.fanout.PageMerger): partition 0 first,
    whose greeting tells how many partitions there are, then each partition after its
    own cursor (the last key of its last page) whenever its page is used up. A cluster of
    one partition is asked exactly as before: page after page, each after the last."""
    from dlm.client.fanout import MAX_PAGES, PageMerger

    def page(after: str | None) -> dict[str, Any]:
        return request if after is None else {**request, "after": after}

    _, reply = yield from call(s, page(None), partition=0)
    merger: PageMerger[T] = PageMerger(s.partitions, key)
    merger.take(0, *read_page(reply))
    out = list(merger.ready())
    for _ in range(MAX_PAGES):  # bounded: each page moves its partition's cursor forward
        if merger.finished:
            break
        for partition in merger.wanted():
            _, reply = yield from call(s, page(merger.cursor(partition)), partition=partition)
            merger.take(partition, *read_page(reply))
        out.extend(merger.ready())
    return out


def _page_of(kind: type[P], items: Callable[[P], Sequence[T]]) -> Callable[[Reply], Any]:
    def read(reply: Reply) -> tuple[Sequence[T], str | None]:
        page = read_reply(kind, reply)
        return items(page), page.next

    return read


def list_locks_flow(
    s: Context, prefix: str = "", *, stale: bool = False
) -> Generator[Action, Outcome, list[LockState]]:
    """Every held lock under ``prefix``, by key, from every partition."""
    from dlm.views import LocksPage

    request = without_id(ListLocks(id=0, prefix=prefix, stale=stale))
    read = _page_of(LocksPage, lambda page: page.locks)
    return (yield from merged_listing_flow(s, request, read, _lock_key))


def _lock_key(lock: LockState) -> str:
    return lock.key or ""


def list_leases_flow(
    s: Context, *, stale: bool = False
) -> Generator[Action, Outcome, list[LeaseSummary]]:
    """Every live lease, by id, from every partition: a lease with parts in several
    partitions once, its keys from every part and its earliest deadline."""
    from dlm.client.fanout import join_leases, lease_key
    from dlm.views import LeasesPage

    request = without_id(ListLeases(id=0, stale=stale))
    read = _page_of(LeasesPage, lambda page: page.leases)
    parts = yield from merged_listing_flow(s, request, read, lease_key)
    return join_leases(parts)


def member_change_flow(
    s: Context, request: MemberAdd | MemberRemove | MemberPromote, *, partition: int | None = None
) -> Generator[Action, Outcome, MembersView]:
    """A membership change (in ``partition``'s group): the leader's view of the new
    membership."""
    from dlm.views import MembersView

    _, reply = yield from change(s, request, partition=partition)
    return read_reply(MembersView, payload(reply))


def ping_request() -> dict[str, Any]:
    """A ping's frame without its ``id`` (the connection numbers it)."""
    return without_id(Ping(id=0))


class LeaseWatchers:
    """The keep-alives of each lease in one family of clients (a client and those it
    spawned): a TTL update sent through any of them must reach them at once, before
    the first attempt is sent, or they would go on counting with the old TTL.

    A watcher has ``update_sent(ttl_ms) -> ticket`` (reading its own clock) and
    ``update_settled(ticket, ttl_ms, applied)``, as ``LeaseClock`` has.
    """

    __slots__ = ("_by_lease", "_lock")

    def __init__(self) -> None:
        self._by_lease: dict[str, tuple[Any, ...]] = {}
        self._lock = threading.Lock()  # KeepAlives start and stop from any thread

    def watch(self, lease: str, watcher: Any) -> None:
        with self._lock:
            self._by_lease[lease] = (*self._by_lease.get(lease, ()), watcher)

    def unwatch(self, lease: str, watcher: Any) -> None:
        with self._lock:
            left = tuple(w for w in self._by_lease.get(lease, ()) if w is not watcher)
            if left:
                self._by_lease[lease] = left
            else:
                self._by_lease.pop(lease, None)

    def of(self, lease: str) -> list[Any]:
        with self._lock:
            return list(self._by_lease.get(lease, ()))


# ---------------------------------------------------------------------------
# Leases with parts in several partitions (issue 25)
#
# A lease id names one lease however many partitions hold its keys: each partition that
# holds a key of it has a PART, an ordinary lease with the same id, TTL and metadata.
# The client opens a part the first time it takes a key of that partition with the
# lease; renewals, TTL updates and closes go to every part; the lease is lost when any
# part is (its keys there may be given away), and the other parts are closed then.
# ---------------------------------------------------------------------------


class LeaseParts:
    """What a client (and those it spawned) knows of one of its leases: the terms a
    new part is opened with, and each part it knows, by partition (a ``Lease`` each:
    when its open was sent, its incarnation)."""

    __slots__ = ("ephemeral", "lock_delay_ms", "meta", "parts", "ttl_ms")

    def __init__(
        self,
        ttl_ms: int,
        *,
        ephemeral: bool = False,
        meta: Mapping[str, str] | None = None,
        lock_delay_ms: int = 0,
    ) -> None:
        self.ttl_ms = ttl_ms
        self.ephemeral = ephemeral
        self.meta = dict(meta or {})
        self.lock_delay_ms = lock_delay_ms
        self.parts: dict[int, Lease] = {}


class LeaseBook:
    """The leases of one family of clients (a client and those it spawned), each with
    its parts: an acquire through one client opens a part that the KeepAlive renewing
    from another must renew too. Safe to use from any thread."""

    __slots__ = ("_leases", "_lock")

    def __init__(self) -> None:
        self._leases: dict[str, LeaseParts] = {}
        self._lock = threading.Lock()

    def get(self, lease: str) -> LeaseParts | None:
        with self._lock:
            return self._leases.get(lease)

    def opened(
        self,
        part: Lease,
        *,
        ephemeral: bool = False,
        meta: Mapping[str, str] | None = None,
        lock_delay_ms: int = 0,
    ) -> LeaseParts:
        """A part was opened (the first part: the lease, with these terms)."""
        with self._lock:
            entry = self._leases.get(part.id)
            if entry is None:
                entry = self._leases[part.id] = LeaseParts(
                    part.ttl_ms, ephemeral=ephemeral, meta=meta, lock_delay_ms=lock_delay_ms
                )
            entry.parts[part.partition] = part
            return entry

    def adopt(self, lease: str, ttl_ms: int, parts: Sequence[int]) -> LeaseParts:
        """A lease this family did not open (its id given by the user), found in ``parts``."""
        with self._lock:
            entry = self._leases.get(lease)
            if entry is None:
                entry = self._leases[lease] = LeaseParts(ttl_ms)
            for partition in parts:
                entry.parts.setdefault(partition, Lease(lease, ttl_ms, partition=partition))
            return entry

    def parts(self, lease: str) -> dict[int, Lease] | None:
        """The parts known of ``lease`` (None: the lease is not known here)."""
        with self._lock:
            entry = self._leases.get(lease)
            return None if entry is None else dict(entry.parts)

    def set_ttl(self, lease: str, ttl_ms: int) -> None:
        with self._lock:
            entry = self._leases.get(lease)
            if entry is not None:
                entry.ttl_ms = ttl_ms

    def forget(self, lease: str) -> None:
        with self._lock:
            self._leases.pop(lease, None)


def part_flow(
    s: Context, book: LeaseBook, lease: str, partition: int
) -> Generator[Action, Outcome, Lease | None]:
    """Opens ``lease``'s part in ``partition`` unless it has one (the lease known to the
    book: else None, and nothing is sent). Returns the part opened, if one was."""
    entry = book.get(lease)
    if entry is None or partition in entry.parts:
        return None
    part = yield from open_lease_flow(
        s,
        entry.ttl_ms,
        lease,
        ephemeral=entry.ephemeral,
        meta=entry.meta,
        lock_delay_ms=entry.lock_delay_ms,
        partition=partition,
    )
    book.opened(part)
    return part


def lease_acquire_flow(
    s: Context,
    book: LeaseBook,
    lease: str,
    key: str,
    *,
    wait: float | None,
    limit: int,
    meta: Mapping[str, str] | None,
    known_ttl_ms: int | None,
) -> Generator[Action, Outcome, Grant]:
    """``acquire_flow`` in the key's partition, after opening the lease's part there if
    it has none. A lease the book does not know (an id from elsewhere) that the key's
    partition does not know either is looked for in the other partitions, and its part
    opened here with the TTL found. Re-planned when a member says the key is another
    partition's (bounded)."""
    for attempt in range(MAX_PARTITION_REROUTES + 1):
        partition = s.partition_of(key)
        yield from part_flow(s, book, lease, partition)
        try:
            return (
                yield from acquire_flow(
                    s,
                    lease,
                    key,
                    wait=wait,
                    limit=limit,
                    meta=meta,
                    known_ttl_ms=known_ttl_ms,
                    partition=partition,
                )
            )
        except WrongPartition:
            if attempt == MAX_PARTITION_REROUTES:
                raise
        except LeaseLost as lost:
            if lost.ended != "unknown" or s.partitions == 1 or book.get(lease) is not None:
                raise
            found = yield from find_lease_flow(s, lease, skip=partition)
            if found is None:
                raise
            ttl_ms, where = found
            book.adopt(lease, ttl_ms, where)
    raise AssertionError("unreachable")  # the loop returns or raises


def acquire_all_flow(
    s: Context,
    book: LeaseBook,
    lease: str,
    keys: Sequence[str],
    *,
    wait: float | None,
    limit: int,
    meta: Mapping[str, str] | None,
    known_ttl_ms: int | None,
) -> Generator[Action, Outcome, list[Grant]]:
    """Takes every key of ``keys`` under ``lease``, in the one global order
    (dlm.partitioning.partition_order: partitions ascending, keys sorted within each),
    so that two clients after overlapping sets cannot each hold what the other waits
    for. ``wait`` is one budget for them all. When a key cannot be had (LockHeld:
    held, with no wait or after it), the keys already taken are released before the
    error is raised: all or nothing. Returns the grants in the order taken."""
    from dlm.partitioning import partition_order

    wanted = list(dict.fromkeys(keys))
    waiting = wait is not None and wait > 0
    wait_deadline = s.clock() + (wait or 0.0)
    grants: list[Grant] = []
    try:
        while len(grants) < len(wanted):
            taken = {g.key for g in grants}
            # Planned again after each key: the first reply may teach the partition count.
            _, group = partition_order([k for k in wanted if k not in taken], s.partitions)[0]
            left = max(0.0, wait_deadline - s.clock()) if waiting else None
            if waiting and left is not None and left <= 0:
                left = 0.001  # the wait is spent: one more try, then LockHeld
            grant = yield from lease_acquire_flow(
                s,
                book,
                lease,
                group[0],
                wait=left,
                limit=limit,
                meta=meta,
                known_ttl_ms=known_ttl_ms,
            )
            grants.append(grant)
    except LockHeld as held:
        if held.key is None:
            held.key = next(k for k in wanted if k not in {g.key for g in grants})
        for grant in reversed(grants):
            try:
                yield from release_flow(s, lease, grant.key, token=grant.token)
            except DlmError:
                pass  # the lease's end frees it, if this release could not
        raise
    return grants


def find_lease_flow(
    s: Context, lease: str, *, skip: int | None = None
) -> Generator[Action, Outcome, tuple[int, list[int]] | None]:
    """Where a lease lives: (its TTL, the partitions that have a live part), None when no
    partition does. Asks every partition (but ``skip``)."""
    ttl_ms: int | None = None
    where: list[int] = []
    for partition in lease_partitions(s, None):
        if partition == skip:
            continue
        try:
            _, reply = yield from call(
                s, without_id(LeaseInfo(id=0, lease=lease)), partition=partition
            )
        except LeaseLost:
            continue
        ttl = reply.get("ttl_ms")
        if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0:
            ttl_ms = ttl if ttl_ms is None else min(ttl_ms, ttl)
            where.append(partition)
    return None if ttl_ms is None else (ttl_ms, where)


def lease_partitions(s: Context, known: Mapping[int, Any] | None) -> Iterator[int]:
    """The partitions to send a lease's request to: its known parts, else every
    partition, counted as the client learns the count: partition 0 is asked first, and
    its greeting tells how many more there are (no extra round trip to learn it)."""
    if known is not None:
        yield from sorted(known)
        return
    partition = 0
    while partition < s.partitions:
        yield partition
        partition += 1


class PartsRenewed(Record):
    """A renewal round of a lease's parts: the TTL each part that answered confirmed,
    whether every part it asked answered (``whole``), and whether the partitions asked
    were every one that may hold a part (``complete``: the lease was not known, and
    every partition answered)."""

    __slots__ = ("complete", "ttls", "whole")
    FIELDS = ("ttls", "whole", "complete")
    ttls: dict[int, int]
    whole: bool
    complete: bool

    def __init__(self, ttls: dict[int, int], whole: bool, complete: bool) -> None:
        _set(self, "ttls", ttls)
        _set(self, "whole", whole)
        _set(self, "complete", complete)


def renew_parts_flow(
    s: Context, book: LeaseBook, lease: str, *, timeout: float | None = None
) -> Generator[Action, Outcome, PartsRenewed]:
    """Renews every part of ``lease`` (the book's; for a lease it does not know, every
    partition's, where one that never had it is passed over). LeaseLost when a part is
    gone (a known part the cluster no longer knows, or a tombstone that says it ended),
    after closing the others; a part that could not be reached is left out of ``ttls``.
    ``timeout`` is shared among the parts, so one unreachable partition cannot keep
    the others from being renewed."""
    known = book.parts(lease)
    budget = s.timeout if timeout is None else timeout
    deadline = s.clock() + budget
    ttls: dict[int, int] = {}
    unreached = 0
    lost: LeaseLost | None = None
    lost_in = -1
    unreachable: ClusterUnavailable | None = None
    for partition in lease_partitions(s, known):
        left = len(known) - len(ttls) - unreached if known is not None else s.partitions - partition
        share = max(0.0, deadline - s.clock()) / max(1, left)
        incarnation = known[partition].incarnation if known is not None else 0
        try:
            ttls[partition] = yield from keepalive_flow(
                s, lease, incarnation=incarnation, timeout=share, partition=partition
            )
        except LeaseLost as exc:
            if known is None and exc.ended == "unknown" and s.partitions > 1:
                lost = lost or exc
                continue  # this partition never had the lease (unless none has)
            lost, lost_in = exc, partition
            break
        except ClusterUnavailable as exc:
            unreached += 1
            unreachable = exc
            if known is None and s.partitions == 1:
                raise
    else:
        if ttls or unreached:
            lost = None  # some partition has it (or may): "never had it" was no loss
    if lost is not None:
        others = [p for p in (known if known is not None else ttls) if p != lost_in]
        yield from close_parts_flow(s, lease, others)
        book.forget(lease)
        raise lost
    if not ttls and unreachable is not None:
        raise unreachable  # no part answered: a failed renewal, as with one partition
    if known is None and ttls:
        book.adopt(lease, min(ttls.values()), sorted(ttls))
    return PartsRenewed(ttls, whole=unreached == 0, complete=known is None and unreached == 0)


def close_parts_flow(
    s: Context,
    lease: str,
    partitions: Sequence[int],
    *,
    run: RunEnd | None = None,
    revoke: bool = False,
) -> Generator[Action, Outcome, list[str]]:
    """Closes the parts in ``partitions``, best effort (one that is already gone or out of
    reach is passed over): what a client does with the rest of a lease it lost."""
    released: list[str] = []
    for partition in partitions:
        try:
            released += yield from close_lease_flow(
                s, lease, run=run, revoke=revoke, partition=partition, timeout=s.attempt_timeout
            )
        except DlmError:
            continue
    return released


def close_all_flow(
    s: Context,
    book: LeaseBook,
    lease: str,
    *,
    must_exist: bool = False,
    run: RunEnd | None = None,
    revoke: bool = False,
) -> Generator[Action, Outcome, list[str]]:
    """Ends every part of ``lease`` (the book's, or every partition's for a lease it does
    not know); returns the keys they held. A partition that never had the lease is no
    error; with ``must_exist`` (an operator revoking an id), LeaseLost when no partition
    had it live, naming how it ended where a tombstone says."""
    known = book.parts(lease)
    released: list[str] = []
    live = 0
    gone: LeaseLost | None = None
    for partition in lease_partitions(s, known):
        try:
            released += yield from close_lease_flow(
                s, lease, must_exist=True, run=run, revoke=revoke, partition=partition
            )
            live += 1
        except LeaseLost as exc:
            if gone is None or gone.ended == "unknown":
                gone = exc
    book.forget(lease)
    if must_exist and not live and gone is not None:
        raise gone
    return released


def parts_ended_flow(
    s: Context, book: LeaseBook, lease: str, key: str
) -> Generator[Action, Outcome, None]:
    """A release ended ``lease``'s part in ``key``'s partition (an ephemeral lease left
    idle): closes its other known parts, and forgets the lease."""
    known = book.parts(lease)
    ended = s.partition_of(key)
    # A lease known only by id may have parts anywhere: every other partition is asked.
    others = sorted(known) if known is not None else range(s.partitions)
    yield from close_parts_flow(s, lease, [p for p in others if p != ended])
    book.forget(lease)


def update_parts_flow(
    s: Context,
    book: LeaseBook,
    lease: str,
    ttl_ms: int,
    *,
    finished: bool = False,
    timeout: float | None = None,
    run: RunEnd | None = None,
) -> Generator[Action, Outcome, int]:
    """``update_lease_flow`` on every part (the book's, or every partition's that has the
    lease); returns the shortest TTL they confirmed. LeaseLost when a part is gone (the
    caller's clocks keep the update pending: it may have reached the other parts)."""
    known = book.parts(lease)
    confirmed: list[int] = []
    gone: LeaseLost | None = None
    for partition in lease_partitions(s, known):
        try:
            confirmed.append(
                (
                    yield from update_lease_flow(
                        s,
                        lease,
                        ttl_ms,
                        finished=finished,
                        timeout=timeout,
                        run=run,
                        partition=partition,
                    )
                )
            )
        except LeaseLost as exc:
            if known is None and exc.ended == "unknown":
                gone = exc
                continue  # this partition never had the lease (unless none has)
            exc.applied_elsewhere = bool(confirmed)
            raise
    if not confirmed:
        raise gone or LeaseLost(lease_gone_text(lease, "unknown"), "unknown")
    book.set_ttl(lease, ttl_ms)
    return min(confirmed)


def update_applied(error: BaseException) -> bool | None:
    """What an update_lease that raised ``error`` did: False when the cluster refused it
    (it will never be applied), None when it may have been applied, or may still be."""
    if isinstance(error, LeaseLost) and error.applied_elsewhere:
        return None  # some parts have it: it caps their deadlines as an unsettled update
    if isinstance(error, BadRequest | LeaseLost):
        return False
    return None


# ---------------------------------------------------------------------------
# Replies
# ---------------------------------------------------------------------------


def without_id(request: Any) -> dict[str, Any]:
    """A wire request's frame without its ``id``: the driver assigns one per attempt."""
    wire: dict[str, Any] = request.to_wire()
    del wire["id"]
    return wire


def _opt_int(reply: Mapping[Any, Any], name: str) -> int | None:
    value = reply.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def read_reply(kind: type[R], reply: Mapping[Any, Any]) -> R:
    """An ok reply as the record its request is answered with (dlm.wire's reply section);
    BAD_REPLY when it lacks a field this client acts on."""
    try:
        return kind.from_wire(reply)
    except ProtocolError as exc:
        raise ServerError("BAD_REPLY", str(exc)) from None


def payload(reply: Reply) -> dict[str, Any]:
    """The ok reply's fields without the envelope (type and request id)."""
    return {k: v for k, v in reply.items() if k not in ("t", "id")}


def is_reply_to(frame: Mapping[Any, Any], rid: int) -> bool:
    """Whether ``frame`` answers request ``rid``."""
    fid = frame.get("id")
    return isinstance(fid, int) and not isinstance(fid, bool) and fid == rid


def grant_from_reply(reply: Mapping[Any, Any], lease: str, key: str) -> Grant:
    # The key and lease are ours; the server's echo adds nothing we could trust more.
    granted = read_reply(LockGranted, reply)
    return Grant(key=key, token=granted.token, lease=lease, ttl_ms=granted.ttl_ms)


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


# ---------------------------------------------------------------------------
# Authentication and TLS failures, worded for the `dlm` command (the library's main user)
# ---------------------------------------------------------------------------

SECRET_HINT = "--secret-file/DLM_SECRET_FILE"
TLS_HINT = "--tls-ca/DLM_TLS_CA"


def proof_failed(addr: str, problem: str) -> AuthFailed:
    """The member's welcome did not prove it holds our secret."""
    return AuthFailed(
        f"{addr}: {_one_line(problem)}: set {SECRET_HINT} to the cluster's client secret "
        "file (the members' --client-secret-file)"
    )


def tls_failed(addr: str, problem: str, *, verifying: bool) -> AuthFailed:
    """The TLS handshake with ``addr`` failed: its certificate (``verifying``) or otherwise."""
    if verifying:
        return AuthFailed(
            f"TLS: cannot trust {addr} ({_one_line(problem)}): set {TLS_HINT} to the CA that "
            "signed the members' certificates, and dial them at a name or address their "
            "certificates hold"
        )
    return AuthFailed(
        f"TLS handshake with {addr} failed ({_one_line(problem)}): check that the member "
        f"serves TLS and {TLS_HINT} (and --tls-cert/DLM_TLS_CERT, --tls-key/DLM_TLS_KEY if "
        "you give a certificate)"
    )


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


LEASE_ENDINGS = ("expired", "closed", "unknown")
"""How a lease that is not live ended, as a SESSION_EXPIRED reply's ``ended`` says."""


def lease_gone_text(lease: str | None, ended: str | None) -> str:
    """What became of a lease that is not live, in the words its ``ended`` allows: the word
    "expired" only when the cluster's tombstone says so, "no such lease" when it has none."""
    which = f"lease {lease}" if lease else "the lease"
    if ended == "expired":
        return f"{which} has expired"
    if ended == "closed":
        return f"{which} was closed (released or revoked)"
    if ended == "unknown":
        return (
            f"no such lease{' ' + lease if lease else ''}: the cluster has no live lease "
            "with that id and remembers none that ended with it (never opened, or ended "
            "more than 5 minutes ago)"
        )
    return f"{which} is not live (ended, or never opened)"  # a member that does not say


def quarantined_until(until_ms: int) -> str:
    """``quarantined until 2026-11-27T18:30:05Z`` (a quarantine's end as its leader said;
    0: no leader has said yet)."""
    if until_ms <= 0:
        return "quarantined until a leader has been in office for the quarantine"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until_ms / 1000))
    return f"quarantined until {when}"


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
        until = _opt_int(reply, "quarantined_until_ms")
        if until is not None:
            return LockHeld(
                f"{what} is {quarantined_until(until)}: the cluster was restored or recovered "
                "and grants no lock before then; try again later, or wait for it (--wait)",
                holders=holders,
                retry_after_ms=_opt_int(reply, "retry_after_ms"),
                quarantined_until_ms=until,
            )
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
        ended = reply.get("ended")
        ended = ended if ended in LEASE_ENDINGS else None
        gone = lease_gone_text(lease if isinstance(lease, str) else None, ended)
        if ended == "unknown":
            return LeaseLost(f"{gone}: check the id (`dlm lease list` shows the live ones)", ended)
        return LeaseLost(
            f"{gone}, and its locks are gone: open a new lease (acquire without --lease)", ended
        )
    if code == ErrorCode.PERMISSION_DENIED.value:
        return PermissionDenied(f"not permitted: {server_says}")
    if code == ErrorCode.QUOTA_EXCEEDED.value:
        limit, who = reply.get("limit"), reply.get("identity")
        return QuotaExceeded(
            f"over quota: {server_says}",
            limit=limit if isinstance(limit, str) else None,
            identity=who if isinstance(who, str) else None,
        )
    if code == ErrorCode.CONFLICT.value:
        return ChangeInProgress(f"the cluster did not make the change: {server_says}")
    if code == ErrorCode.UNSAFE.value:
        return UnsafeChange(f"the cluster did not make the change: {server_says}")
    if code in (ErrorCode.BAD_REQUEST.value, ErrorCode.TOO_LARGE.value):
        return BadRequest(f"the cluster refused the request: {server_says}", code=code)
    if code == ErrorCode.AUTH_FAILED.value:
        return AuthFailed(
            f"the cluster refused the connection ({server_says}): set {SECRET_HINT} "
            "to the cluster's client secret file"
        )
    if code in RETRYABLE_CODES:
        return ClusterUnavailable(f"the cluster could not serve the request: {server_says}", code)
    return ServerError(code, f"the cluster answered {code}: {server_says}")


# ---------------------------------------------------------------------------
# Elections (issue 27): an election NAME is the lock key NAME; its leader is the key's
# holder, its value the grant's metadata entry ELECTION_VALUE, its epoch the token.
# ---------------------------------------------------------------------------

ELECTION_VALUE = "value"
"""The metadata entry of a grant that holds an election's value."""


def iso_utc(ms: int | None) -> str | None:
    """Milliseconds since the epoch as an RFC 3339 UTC time with milliseconds."""
    if ms is None:
        return None
    import datetime

    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def leadership(name: str, state: Any) -> dict[str, Any]:
    """Who leads election ``name``, from its key's state (a ``LockState``):
    ``{"name", "value", "token", "since", "index", "lease"}``, all but the name None while
    nobody leads. ``index`` is the log index of the entry that made this leadership (the
    token); ``since`` is when, as an RFC 3339 UTC time."""
    holders = state.holders
    if not holders:
        return {
            "name": name,
            "value": None,
            "token": None,
            "since": None,
            "index": None,
            "lease": None,
        }
    holder = holders[0]
    return {
        "name": name,
        "value": holder.meta.get(ELECTION_VALUE, ""),
        "token": holder.token,
        "since": iso_utc(holder.granted_at_ms),
        "index": holder.token,
        "lease": holder.lease,
    }
