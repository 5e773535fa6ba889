"""``client.election(name)`` for blocking code: ``dlm.Election``, ``dlm.Leadership``,
``dlm.Leader``.

Private (import the names from ``dlm``). An election NAME is the lock key NAME, as for
`dlm elect`: a candidate campaigns by queueing for the key (FIFO), the holder leads,
its grant's token is the leadership epoch and the grant's metadata entry "value" is
what it proclaims. So a campaign is a ``dlm.Lock`` acquire with the value in its
metadata, and a ``Leadership`` *is* a ``dlm.Lock``: renewal, ``deadline``,
``check()``, ``lost``, ``on_lost`` and fork safety are the lock's. Election is not
fencing: pass ``token`` to what the leader writes to (README, "Elections").
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dlm._api import options as _options
from dlm._api.options import Duration
from dlm._api.sync import Lock
from dlm.client.errors import NotHolder, ServerError

if TYPE_CHECKING:
    from dlm._api.sync import Client
    from dlm.client.watching import Leadership as _Watched
    from dlm.views import LockState

ELECTION_VALUE = "value"
"""The grant's metadata entry that holds the leader's value (as `dlm elect --value`)."""
CAMPAIGN_WAIT_S = 7 * 24 * 3600.0
"""How long ``campaign(wait=None)`` stays in the queue: the longest wait there is."""


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads an election: ``value`` (what it proclaimed), ``token`` (the leadership
    epoch: the fencing token of its grant, higher for every new leader), ``since`` (when
    the cluster elected it, UTC; a proclaim does not move it), ``lease`` (its lease id)
    and ``index`` (the log index this was read or pushed at)."""

    name: str
    value: str
    token: int
    since: datetime | None
    lease: str
    index: int


def _utc(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def leader_from_state(name: str, state: LockState) -> Leader | None:
    """The leader a read of the key shows (None while nobody leads)."""
    if not state.holders:
        return None
    holder = state.holders[0]
    if holder.lease is None or holder.token is None:
        # Only a stale read leaves them out; leader() reads through the Raft leader.
        raise ServerError(
            "BAD_REPLY", "the cluster's answer names a holder without its lease or token"
        )
    return Leader(
        name,
        holder.meta.get(ELECTION_VALUE, ""),
        holder.token,
        _utc(holder.granted_at_ms),
        holder.lease,
        holder.token,
    )


def leader_from_watch(seen: _Watched) -> Leader | None:
    """The leader a change of the watched key says (None while nobody leads)."""
    if seen.lease is None or seen.token is None:
        return None
    return Leader(
        seen.name, seen.value or "", seen.token, _utc(seen.since_ms), seen.lease, seen.index
    )


def campaign_meta(value: str) -> dict[str, str]:
    """The metadata a campaign records with its grant; ValueError if ``value`` is bad."""
    if not isinstance(value, str):
        raise TypeError("an election's value is a str")
    return {ELECTION_VALUE: value}


def campaign_wait(wait: Duration | None) -> float:
    """``wait`` in seconds; None waits as long as it takes (a week)."""
    if wait is None:
        return CAMPAIGN_WAIT_S
    return _options.seconds(wait, "wait", allow_zero=False)


def not_leading(name: str) -> NotHolder:
    return NotHolder(
        f"this candidate does not lead {name!r}: only the leader may proclaim "
        "(campaign first, or it lost its lease)"
    )


class Leadership(Lock):
    """This process leading an election, returned by ``Election.campaign``: a
    ``dlm.Lock`` on the election's key (``token`` is the leadership epoch; ``lease``,
    ``deadline``, ``time_left()``, ``check()``, ``lost`` and ``on_lost`` as for a lock),
    plus ``value``, ``proclaim(value)`` and ``resign()``. ``with election.campaign():``
    resigns at the end of the block, and raises ``dlm.LockLost`` if leadership was lost
    meanwhile."""

    def __init__(self, election: Election, value: str, **terms: Any) -> None:
        super().__init__(election._client, election.name, meta=campaign_meta(value), **terms)
        self._election = election
        self._value = value

    @property
    def name(self) -> str:
        """The election's name (its lock key)."""
        return self.key

    @property
    def value(self) -> str:
        """What this leader proclaims (the campaign's value, then each ``proclaim``'s)."""
        return self._value

    def proclaim(self, value: str) -> None:
        """Changes the election's value without a new election (``token`` stays).
        ``dlm.NotHolder`` (the `dlm proclaim` exit 77) unless this still leads."""
        meta = campaign_meta(value)
        self._owner.check("this dlm.Leadership")
        with self._mutex:
            if not self._holding or self._lost.is_set():
                raise not_leading(self.name)
            with self._client._borrow() as inner:
                inner.proclaim(self.lease, self.name, value)
            self._value = value
            self._meta = {**self._meta, **meta}

    def resign(self) -> None:
        """Gives up leading: the next candidate in the queue is elected at once (no
        lock-delay). Quiet if this no longer leads."""
        self._owner.check("this dlm.Leadership")
        with self._mutex:
            if self._holding:
                self.release()

    def __enter__(self) -> Leadership:
        if self._holding:
            return self  # `with election.campaign():` already campaigned
        super().__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        super().__exit__(exc_type, exc, tb)

    def _describe(self) -> str:
        return f"leadership of {self.key!r}"


class Election:
    """An election, made by ``Client.election(name)``: ``campaign`` to lead it,
    ``leader()`` to read who leads, ``observe()`` to follow every change. Thread-safe for
    ``leader`` and ``observe``; one campaign at a time per Election object."""

    def __init__(self, client: Client, name: str) -> None:
        (self._name,) = _options.keys(name)
        self._client = client
        self._leading: Leadership | None = None

    @property
    def name(self) -> str:
        """The election's name: the lock key it is held on."""
        return self._name

    def campaign(
        self,
        value: str = "",
        *,
        ttl: Duration = "30s",
        wait: Duration | None = None,
        lock_delay: Duration | None = None,
        on_lost: Callable[[Leadership], object] | Callable[[], object] | None = None,
    ) -> Leadership:
        """Queues for the election (FIFO) and returns once this candidate leads, as a
        ``Leadership`` whose ``token`` is the leadership epoch. ``value``: what
        ``leader()`` and ``observe()`` show for it. ``ttl``: its lease's, renewed in the
        background. ``wait``: how long to stay in the queue (None: as long as it
        takes), then ``dlm.LockHeld``. ``lock_delay``: after this leader's lease
        expires or is revoked (not after a resign), nobody is elected for that long.
        ``on_lost``: as for ``Client.lock``. ``with election.campaign(...) as leading:``
        resigns at the end of the block."""
        if self._leading is not None and self._leading._holding:
            raise RuntimeError(f"already leading {self._name!r}: resign first")
        leading = Leadership(
            self,
            value,
            ttl=ttl,
            wait=campaign_wait(wait),
            lock_delay=lock_delay,
            on_lost=on_lost,
        )
        leading._acquire(True, None)
        self._leading = leading
        return leading

    def resign(self) -> None:
        """Gives up leading, if this Election's last campaign leads (else nothing)."""
        leading = self._leading
        if leading is not None:
            leading.resign()

    def proclaim(self, value: str) -> None:
        """Changes the election's value while this Election's campaign leads;
        ``dlm.NotHolder`` (exit 77's meaning) otherwise."""
        leading = self._leading
        if leading is None:
            raise not_leading(self._name)
        leading.proclaim(value)

    def leader(self) -> Leader | None:
        """Who leads now (a linearizable read), or None while nobody does."""
        with self._client._borrow() as inner:
            return leader_from_state(self._name, inner.get(self._name))

    def observe(self, *, timeout: Duration | None = None) -> Generator[Leader | None]:
        """The leader now, then each change (a new leader, nobody, a new value), pushed
        by the cluster and resumed across member failures without a gap (``dlm
        observe``). ``dlm.ClusterUnavailable`` once no member served it for ``timeout``
        (default: the client's). Uses a connection of its own; closing the iterator (or
        leaving the ``for`` loop) closes it."""
        seconds = _options.optional_seconds(timeout, "timeout")
        self._client._owner.check("this dlm.Client")
        inner = self._client._base.spawn()
        try:
            for seen in inner.observe(self._name, timeout=seconds):
                yield leader_from_watch(seen)
        finally:
            inner.close()

    def __repr__(self) -> str:
        return f"<dlm.Election {self._name!r}>"
