"""A kept-alive lease's rules, without IO: when it must be presumed lost, when it is
renewed, when its idle connection pings.

``LeaseClock`` holds the deadline (the send time of the last confirmed renewal plus the
TTL, less a margin for clock rates, and what TTL updates do to it); ``Renewer`` says what
a keeper does next: "renew at t", "ping at t" or "lost". The blocking KeepAlive
(sync.py), the async one (aio.py) and the whole-node simulator's keeper (tests/sim)
only sleep and perform what it says. Times are passed in (the client's lease clock,
dlm.client.clock, in seconds): nothing here reads a clock. dlm.client.core re-exports
every name.
"""

from __future__ import annotations

from dlm.limits import HOLD_MAX_MS
from dlm.wire import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Protocol

    class OpenedPart(Protocol):
        """What ``PartClocks`` reads of a part its lease's book knows (core.Lease)."""

        @property
        def confirmed_at(self) -> float: ...

        @property
        def ttl_ms(self) -> int: ...


_set = object.__setattr__

PING_EVERY_S = 30.0
"""An idle connection (waiting for a grant, or between long renewals) pings this often;
members close connections silent for two minutes."""


CLOCK_RATE_BOUND = 0.005
"""How far the rate of any clock, ours or the leader's, may stray from real time (±0.5%)."""
LEASE_SLACK_S = 0.05
"""What rates do not cover: timer and scheduling jitter, on the leader and here."""


def lease_deadline(sent: float, ttl_ms: int) -> float:
    """The last instant a lease last confirmed by a request sent at ``sent`` (our lease
    clock's seconds) may be counted on: the cluster gives its locks to no one else before it.

    The leader counts the TTL from when it *received* the request, after we sent it,
    so ``sent + TTL`` would do with perfect clocks. If each clock runs within
    ``CLOCK_RATE_BOUND`` of true time, the leader's TTL lasts at least
    TTL x 0.995 / 1.005 > TTL x (1 - 2 x CLOCK_RATE_BOUND) of ours; the slack covers
    jitter. (NTP keeps real clocks ten times tighter than the bound.)
    """
    ttl = ttl_ms / 1000.0
    return sent + ttl - (2 * CLOCK_RATE_BOUND * ttl + LEASE_SLACK_S)


def min_hold_ttl_ms(granted_by: float, hold_s: float, now: float) -> int:
    """The TTL to give a lease at ``now`` so that the cluster keeps it until at least
    ``hold_s`` after the grant; 0 when no time is left to hold.

    ``granted_by`` is a moment (our lease clock's seconds) at or after the grant: when
    the reply that reported it arrived. Counting from there, never from when the
    acquire was sent, is what keeps the hold from ending early. The leader counts
    the TTL from when the request reaches it, after ``now``, so every delay in
    between lengthens the hold. Clock rates are the remaining error: if ours runs
    ``CLOCK_RATE_BOUND`` fast we overstate the time already held, and if the
    leader's does, its TTL passes that much sooner; asking for (1 + bound) x
    ``hold_s`` less the time held by our clock covers both (the mirror image of
    ``lease_deadline``, which bounds a lease from above).
    """
    needed_s = (1 + CLOCK_RATE_BOUND) * hold_s - (now - granted_by)
    if needed_s <= 0:
        return 0
    needed_ms = needed_s * 1000
    whole_ms = int(needed_ms)
    return min(HOLD_MAX_MS, whole_ms + (whole_ms < needed_ms))  # rounded up


class LeaseClock:
    """When a held lease must be presumed lost, from this client's side.

    The deadline is the *send* time of the last confirmed renewal plus the TTL,
    less a margin for clock rates (``lease_deadline``): the leader started (or
    restarted) the lease's clock when the request reached it, later than we
    sent it, so our deadline passes first (ARCHITECTURE.md, invariant 4).
    Counting from the reply instead would let the server's deadline pass first.

    TTL updates. The leader's deadline moves *earlier* in one way: an entry
    that re-arms the lease (``update_lease``) restarts its clock at apply + the
    new TTL. So:

    * the deadline follows the latest confirmation by send time, not the
      latest deadline: a renewal (or update) sent at s and confirmed with TTL T
      sets it to ``lease_deadline(s, T)``, lower than before if T shrank;
    * an update counts from the moment it is sent (``update_sent``): it may be
      applied as soon as it arrives, so the deadline drops at once to
      ``lease_deadline(sent, new TTL)``;
    * a reply to anything sent before the last update moves nothing;
    * a renewal sent at s after an update p counts with at most p's TTL if p
      was not confirmed by s: the renewal may have been served before p was
      applied (its reply then carries the old TTL) and p re-armed the lease
      later. An update that got no answer may be applied still, by a later
      leader: it caps every renewal for good;
    * the renewal interval follows the shortest TTL the leader may be using,
      from the moment an update is sent.

    Once the deadline has passed the lease is lost for good: a confirmation
    that arrives later (a slow reply, a process that was paused) extends
    nothing, because the cluster may already have expired the lease and given
    its locks away. Times are the client's lease clock (dlm.client.clock), in seconds.
    """

    __slots__ = (
        "_deadline_of",
        "_tickets",
        "_updates",
        "deadline",
        "floor",
        "last_sent",
        "lost",
        "reported_ttl_ms",
    )

    def __init__(
        self,
        ttl_ms: int,
        confirmed_at: float,
        deadline_of: Callable[[float, int], float] = lease_deadline,
    ) -> None:
        self._deadline_of = deadline_of
        self.reported_ttl_ms = ttl_ms
        """The TTL the deadline counts with (what the last confirmation that counted
        reported, capped by the updates that could still re-arm the lease after it)."""
        self.last_sent = confirmed_at
        """When the confirmation the deadline counts from was sent."""
        self.floor = confirmed_at
        """Replies to requests sent before this count for nothing: the send time of the
        last update, or of the last confirmation that counted."""
        self._updates: dict[int, tuple[float, float, int]] = {}
        """ticket -> (sent, confirmed at or +inf while it may still be applied, ttl_ms)."""
        self._tickets = 0
        self.deadline = deadline_of(confirmed_at, ttl_ms)
        self.lost = False

    @property
    def ttl_ms(self) -> int:
        """The shortest TTL the leader may be counting this lease with: renewals pace by it."""
        pending = [ttl for _, settled, ttl in self._updates.values() if settled == _NEVER]
        return min([self.reported_ttl_ms, *pending])

    def expired(self, now: float) -> bool:
        """Whether the deadline has passed (and so the lease is lost for good)."""
        if now >= self.deadline:
            self.lost = True
        return self.lost

    def counts(self, sent_at: float) -> bool:
        """Whether a reply to a request sent at ``sent_at`` may still move the deadline."""
        return not self.lost and sent_at >= self.floor

    def _ttl_at(self, sent_at: float, ttl_ms: int) -> int:
        """The TTL a renewal sent at ``sent_at`` and answered with ``ttl_ms`` counts with:
        no more than any update sent before it and not yet confirmed when it was sent."""
        for sent, settled, asked_ms in self._updates.values():
            if sent <= sent_at < settled:
                ttl_ms = min(ttl_ms, asked_ms)
        return ttl_ms

    def _recount(self) -> float:
        """The deadline the last counted confirmation and the pending updates allow."""
        since = self.last_sent
        deadline = self._deadline_of(since, self.reported_ttl_ms)
        for sent, settled, ttl_ms in self._updates.values():
            if settled == _NEVER:
                # Applied at or after its send, and perhaps after the confirmation counted.
                deadline = min(deadline, self._deadline_of(max(since, sent), ttl_ms))
        return deadline

    def _counted(self, sent_at: float, ttl_ms: int) -> None:
        self.floor = self.last_sent = sent_at
        self.reported_ttl_ms = ttl_ms
        # A confirmed update matters to renewals sent before its confirmation; none
        # sent before this one will count again.
        for ticket, (_, settled, _) in list(self._updates.items()):
            if settled <= sent_at:
                del self._updates[ticket]
        self.deadline = self._recount()

    def confirmed(self, sent_at: float, ttl_ms: int, now: float) -> bool:
        """A renewal sent at ``sent_at`` was confirmed with ``ttl_ms``, and the answer
        arrived at ``now``. False when it came too late to count (the lease is lost);
        True otherwise, even when it moved nothing because it was sent before the
        last update or the last confirmation that counted (see ``counts``)."""
        if self.expired(now):
            return False
        if self.counts(sent_at):
            self._counted(sent_at, self._ttl_at(sent_at, ttl_ms))
        return True

    def update_sent(self, sent_at: float, ttl_ms: int) -> int:
        """A TTL update (``update_lease``) is sent at ``sent_at`` (call it before the
        first attempt): the deadline drops to what the new TTL allows, at once.
        Returns the ticket to settle it with."""
        self._tickets += 1
        ticket = self._tickets
        self._updates[ticket] = (sent_at, _NEVER, ttl_ms)
        self.floor = max(self.floor, sent_at)
        if not self.lost:
            self.deadline = min(self.deadline, self._deadline_of(sent_at, ttl_ms))
        return ticket

    def update_settled(
        self, ticket: int, ttl_ms: int | None, now: float, *, applied: bool | None
    ) -> bool:
        """What became of the update ``ticket``, learned at ``now``: ``applied`` True
        (confirmed with ``ttl_ms``), False (refused: it will never be applied), or None
        (no answer: it may be applied still, so it keeps capping). False when the lease
        is lost."""
        known = self._updates.get(ticket)
        if applied is None or known is None or known[1] != _NEVER:
            return not self.expired(now)
        sent, _, asked_ms = known
        if not applied:
            del self._updates[ticket]
            return not self.expired(now)
        confirmed_ms = asked_ms if ttl_ms is None else ttl_ms
        self._updates[ticket] = (sent, now, confirmed_ms)
        if self.expired(now):
            return False
        if self.counts(sent):
            # The update is itself a confirmation: the leader re-armed the lease after
            # ``sent`` with this TTL.
            self._counted(sent, self._ttl_at(sent, confirmed_ms))
        else:
            # Renewals sent after it counted already, capped by it while it was pending.
            self.deadline = min(self.deadline, self._recount())
        return True

    def interval(self) -> float:
        """Renew every third of the TTL: two renewals may fail before the deadline."""
        return self.ttl_ms / 3000.0

    def next_renewal(self) -> float:
        return self.last_sent + self.interval()


_NEVER = float("inf")


EVERY_PARTITION = -1
"""The part of ``PartClocks`` that stands for partitions not yet asked about a lease."""


class PartClocks:
    """The clocks of a lease with parts in several partitions (issue 25): one
    ``LeaseClock`` per part, and the lease's deadline is the EARLIEST of them. A lease
    is lost when any part is, since that part's keys may be given away then.

    It reads as one ``LeaseClock`` (``Renewer`` and the keepers use it unchanged):
    ``deadline``, ``last_sent`` (so the next renewal is due when the least recently
    confirmed part's is), ``ttl_ms`` and the interval are the parts' earliest or least.
    A confirmation of the whole lease (``confirmed``) and TTL updates apply to every
    part; ``confirmed_parts`` records a renewal round whose parts answered one by one.

    A part opened while the lease is kept (``add_part`` with its open's send time and
    TTL) starts its own clock there. A part found by a renewal round starts as a copy
    of ``base``: the lease as last confirmed as a whole (every part it had then, in one
    round), with every TTL update sent since; that is no later than the part's own last
    confirmation, so its deadline is never overstated. Until the parts are known
    (``known``), the partitions not yet asked count as one part (EVERY_PARTITION) that
    only a complete round confirms.

    ``opened`` (the lease's parts as its book knows them, core.LeaseBook.parts) lets a
    part join the moment its open is answered, whichever client opened it: every read
    of the clocks joins first. A part whose open took longer than its TTL (retried
    through another gateway or member) would otherwise go uncounted until the next
    renewal round while its own deadline, counted from the open's first send, passed.
    """

    __slots__ = ("_opened", "base", "parts")

    def __init__(
        self,
        ttl_ms: int,
        confirmed_at: float,
        deadline_of: Callable[[float, int], float] = lease_deadline,
        *,
        parts: Iterable[int] | None = None,
        opened: Callable[[], Mapping[int, OpenedPart] | None] | None = None,
    ) -> None:
        self.base = LeaseClock(ttl_ms, confirmed_at, deadline_of)
        self.parts: dict[int, LeaseClock] = {}
        self._opened = opened
        for partition in [EVERY_PARTITION] if parts is None else parts:
            self.add_part(partition)

    def join(self) -> None:
        """Every part the book knows (``opened``) has a clock: one it opened from that
        open's send time, one found elsewhere (no send time) as a copy of ``base``."""
        if self._opened is None:
            return
        for partition, part in (self._opened() or {}).items():
            if partition not in self.parts:
                opened_at = part.confirmed_at if part.confirmed_at > 0 else None
                self.add_part(partition, opened_at, part.ttl_ms)

    def add_part(
        self, partition: int, confirmed_at: float | None = None, ttl_ms: int | None = None
    ) -> LeaseClock:
        """The clock of ``partition``'s part. A new one starts at ``confirmed_at`` with
        ``ttl_ms`` (a part this client just opened), else as a copy of ``base``; TTL
        updates still pending cap it either way."""
        clock = self.parts.get(partition)
        if clock is None:
            clock = _copy_clock(self.base)
            if confirmed_at is not None and ttl_ms is not None:
                fresh = LeaseClock(ttl_ms, confirmed_at, self.base._deadline_of)
                fresh._tickets, fresh._updates = clock._tickets, clock._updates
                fresh.floor = max(fresh.floor, clock.floor)
                fresh.deadline = fresh._recount()
                clock = fresh
            self.parts[partition] = clock
        return clock

    @property
    def known(self) -> bool:
        """Whether the partitions that hold a part of the lease are known."""
        return EVERY_PARTITION not in self.parts

    def _clocks(self) -> list[LeaseClock]:
        self.join()
        return list(self.parts.values()) or [self.base]

    @property
    def deadline(self) -> float:
        return min(c.deadline for c in self._clocks())

    @property
    def last_sent(self) -> float:
        return min(c.last_sent for c in self._clocks())

    @property
    def floor(self) -> float:
        return min(c.floor for c in self._clocks())

    @property
    def lost(self) -> bool:
        return any(c.lost for c in self._clocks())

    @property
    def reported_ttl_ms(self) -> int:
        return min(c.reported_ttl_ms for c in self._clocks())

    @property
    def ttl_ms(self) -> int:
        return min(c.ttl_ms for c in self._clocks())

    def expired(self, now: float) -> bool:
        # Every clock looks, so each marks itself lost: none may count a late reply.
        expired = [c.expired(now) for c in self._clocks()]
        return any(expired)

    def counts(self, sent_at: float) -> bool:
        return not self.lost and any(c.counts(sent_at) for c in self._clocks())

    def confirmed(self, sent_at: float, ttl_ms: int, now: float) -> bool:
        """Every part was confirmed by requests sent at or after ``sent_at``."""
        if self.expired(now):  # (joins the parts opened since)
            return False
        for clock in [self.base, *self.parts.values()]:
            clock.confirmed(sent_at, ttl_ms, now)
        return True

    def confirmed_parts(
        self, sent_at: float, ttls: Mapping[int, int], now: float, *, complete: bool
    ) -> bool:
        """A renewal round sent at ``sent_at``: ``ttls`` is what each part that answered
        confirmed (a part not named got no answer and keeps its deadline). ``complete``:
        every partition that may hold a part was asked and answered, so the stand-in
        for the partitions not yet asked goes. False when the lease is lost."""
        if self.expired(now):  # (joins the parts opened since: a round that did not
            return False  # renew one is not whole)
        whole = set(self.parts) - {EVERY_PARTITION} <= set(ttls) and (complete or self.known)
        for partition, ttl_ms in ttls.items():
            self.add_part(partition).confirmed(sent_at, ttl_ms, now)
        if complete and ttls:
            self.parts.pop(EVERY_PARTITION, None)
        if whole and ttls:
            self.base.confirmed(sent_at, min(ttls.values()), now)
        return not self.expired(now)

    def update_sent(self, sent_at: float, ttl_ms: int) -> int:
        self.join()
        ticket = self.base.update_sent(sent_at, ttl_ms)
        for clock in self.parts.values():
            # The tickets of every clock advance together (each counts its own updates
            # from the same start, and a part's clock begins as a copy of base).
            clock.update_sent(sent_at, ttl_ms)
        return ticket

    def update_settled(
        self, ticket: int, ttl_ms: int | None, now: float, *, applied: bool | None
    ) -> bool:
        self.base.update_settled(ticket, ttl_ms, now, applied=applied)
        results = [
            c.update_settled(ticket, ttl_ms, now, applied=applied) for c in self.parts.values()
        ]
        return all(results) and not self.expired(now)

    def interval(self) -> float:
        return min(c.interval() for c in self._clocks())

    def next_renewal(self) -> float:
        return min(c.next_renewal() for c in self._clocks())


def _copy_clock(clock: LeaseClock) -> LeaseClock:
    copy = LeaseClock.__new__(LeaseClock)
    for name in LeaseClock.__slots__:
        setattr(copy, name, getattr(clock, name))
    copy._updates = dict(clock._updates)
    return copy


class RenewAt(Record):
    """Renew the lease at ``at`` (now or earlier: at once)."""

    __slots__ = ("at",)
    FIELDS = ("at",)
    at: float

    def __init__(self, at: float) -> None:
        _set(self, "at", at)


class PingAt(Record):
    """Ping the renewing connection at ``at``, unless something else is due first."""

    __slots__ = ("at",)
    FIELDS = ("at",)
    at: float

    def __init__(self, at: float) -> None:
        _set(self, "at", at)


class Lost(Record):
    """The lease can no longer be counted on: stop renewing."""

    __slots__ = ()
    FIELDS = ()


class Renewer:
    """What a kept-alive lease does next: renew at t, ping at t, or stop, it is lost.

    The drivers (sync.KeepAlive, aio.AsyncKeepAlive, the simulator's keeper) ask
    ``next_step(now)``, sleep until its time (waking early when a TTL update may have
    moved it), perform it and report back: ``renewed``, ``renewal_failed``, ``pinged``.
    The deadline rules are ``LeaseClock``'s (``clock``). Renewals come every
    ``interval`` (a third of the TTL) after the last one that counted; a failed one is
    retried no later than a quarter of that (250 ms at most) after it failed, which in
    practice is at once: the renewal it follows was due already (its own flow retried
    until its time ran out). Between renewals the connection
    pings every ``PING_EVERY_S`` (PROTOCOL.md: a member closes a connection silent for
    two minutes), so a lease whose TTL is longer does not reconnect at each renewal.
    Times are the lease clock's seconds.
    """

    __slots__ = ("_fixed_interval", "_idle_since", "_retry_at", "clock", "renewals")

    def __init__(
        self, clock: LeaseClock | PartClocks, now: float, *, interval: float | None = None
    ) -> None:
        self.clock = clock
        self._fixed_interval = interval
        self._retry_at: float | None = None
        self._idle_since = now
        """When the renewing connection last carried a request (or the keeper started)."""
        self.renewals = 0
        """Renewals that moved the deadline."""

    def interval(self) -> float:
        return self._fixed_interval or self.clock.interval()

    def next_step(self, now: float) -> RenewAt | PingAt | Lost:
        """The step due next. Asked again after every wake-up: a TTL update may have
        brought the renewal (or the deadline) forward."""
        if self.clock.lost or now >= self.clock.deadline:
            return Lost()
        renew_at = self.clock.last_sent + self.interval()
        if self._retry_at is not None:
            # After a failure the regular time is overdue: the retry waits its pause, or an
            # error that retrying cannot mend would have the loop send without a pause.
            renew_at = self._retry_at
        ping_at = self._idle_since + PING_EVERY_S
        if renew_at <= now:
            return RenewAt(renew_at)  # a ping due too would be redundant
        if ping_at <= now or ping_at < renew_at:
            return PingAt(ping_at)
        return RenewAt(renew_at)

    def pinged(self, now: float) -> None:
        self._idle_since = now

    def renewal_failed(self, now: float) -> None:
        """A renewal got no answer that counts (the cluster was unreachable, say): retry soon."""
        self._idle_since = now
        self._retry_at = now + min(self.interval() / 4, 0.25)

    def renewed(self, sent: float, ttl_ms: int, now: float) -> int | None:
        """A renewal sent at ``sent`` was answered at ``now`` with ``ttl_ms``. Returns the
        TTL it counts with (no more than an update it may predate), 0 when it moved
        nothing (it was sent before the last update or the last renewal that counted),
        None when it came too late: the lease is lost."""
        self._idle_since = now
        self._retry_at = None
        return self.confirmed(sent, ttl_ms, now)

    def renewed_parts(
        self, sent: float, ttls: Mapping[int, int], now: float, *, complete: bool, whole: bool
    ) -> int | None:
        """A renewal round of a lease with parts (``clock`` is a ``PartClocks``): ``ttls``
        is what each part that answered confirmed; ``whole``: every part it renewed
        answered (else the round is retried soon, as a failed renewal is);
        ``complete``: as ``PartClocks.confirmed_parts``. Returns as ``renewed``."""
        clock = self.clock
        if not isinstance(clock, PartClocks):
            raise TypeError("renewed_parts needs a PartClocks")
        self._idle_since = now
        self._retry_at = None if whole else now + min(self.interval() / 4, 0.25)
        counts = clock.counts(sent)
        if not clock.confirmed_parts(sent, ttls, now, complete=complete):
            return None
        if not counts or not ttls:
            return 0
        self.renewals += 1
        return clock.reported_ttl_ms

    def confirmed(self, sent: float, ttl_ms: int, now: float) -> int | None:
        """As ``renewed``, for a renewal made elsewhere (not on the renewing connection)."""
        counts = self.clock.counts(sent)
        if not self.clock.confirmed(sent, ttl_ms, now):
            return None
        if not counts:
            return 0
        self.renewals += 1
        return self.clock.reported_ttl_ms

    def lost_reason(self, lease: str) -> str:
        """Why the lease was given up when its deadline passed unconfirmed."""
        return (
            f"lease {lease} could not be renewed before its deadline "
            f"({self.clock.ttl_ms} ms after the last confirmed renewal)"
        )
