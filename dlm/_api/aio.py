"""``dlm.AsyncClient`` and ``dlm.AsyncLock``: the anyio public API (asyncio or trio).

Private (import the names from ``dlm``). As dlm/_sync.py, a thin layer over the
internal client: requests, retries and the deadline rules are dlm.client.core's,
driven by dlm.client.aio, renewals by its ``keep_alive``.

What async code gets that blocking code cannot: ``async with client.lock(key)`` runs
its body in a cancel scope, and a guard task cancels that scope as soon as the lock is
lost, and at the latest ``cancel_margin`` before ``deadline`` (by default a tenth of
the TTL, at most 0.5 s: the guard reads the lease clock at least every 0.1 s and wakes
at that time exactly, so the body is cancelled well before the deadline unless the
event loop itself is blocked that long). The block then raises ``dlm.LockLost``.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from dlm._api import options as _options
from dlm._api.election import (
    Leader,
    campaign_meta,
    campaign_wait,
    leader_from_state,
    leader_from_watch,
    not_leading,
)
from dlm._api.fork import Owner
from dlm._api.held import HeldState
from dlm._api.options import Duration
from dlm.client import aio
from dlm.client.clock import RECHECK_S, lease_clock
from dlm.client.core import DEFAULT_OPEN_TTL_MS, min_hold_ttl_ms
from dlm.client.errors import DlmError, LeaseLost, LockHeld, LockLost

_IDLE_CONNECTIONS = 64
LOST_GIVE_BACK_S = 1.0
"""How long the end of an ``async with`` whose lock was lost tries to close its lease
before raising ``dlm.LockLost`` (the lease expires by itself anyway)."""
CANCEL_MARGIN_MAX_S = 0.5
"""The default ``cancel_margin`` is a tenth of the TTL, and at most this."""


class AsyncClient:
    """A connection to a dlm cluster for async code (anyio: asyncio or trio).

    Takes what ``dlm.Client`` takes. ``async with dlm.AsyncClient() as client:`` closes
    it at the end (releasing the locks still held), and lets ``await lock.acquire()``
    renew in the background (outside such a block, use ``async with lock:``). Safe to
    share between the tasks of one event loop; inert in a forked child.
    """

    def __init__(
        self,
        cluster: str | Sequence[str] | None = None,
        *,
        secret_file: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        timeout: Duration = "10s",
        dial_timeout: Duration = "2s",
    ) -> None:
        self._owner = Owner()
        members = _options.cluster(cluster)
        call_timeout = _options.seconds(timeout, "timeout", allow_zero=False)
        dial = _options.seconds(dial_timeout, "dial_timeout", allow_zero=False)
        secret, tls = _options.credentials(secret_file, tls_ca, tls_cert, tls_key)
        self._base = aio.AsyncClient(
            members, timeout=call_timeout, dial_timeout=dial, secret=secret, tls=tls
        )
        self._idle: list[aio.AsyncClient] = []
        self._closed = False
        self._locks: weakref.WeakSet[AsyncLock] = weakref.WeakSet()
        self._task_group: anyio.abc.TaskGroup | None = None

    @property
    def cluster(self) -> list[str]:
        """The members this client asks (HOST:PORT)."""
        return list(self._base.members)

    def lock(
        self,
        key: str | Sequence[str],
        *,
        ttl: Duration | None = None,
        wait: Duration | None = "10s",
        meta: Mapping[str, str] | None = None,
        min_hold: Duration | None = None,
        on_lost: Callable[[AsyncLock], object] | Callable[[], object] | None = None,
        cancel_margin: Duration | None = None,
        traceparent: str | None = None,
    ) -> AsyncLock:
        """A lock on ``key`` (or every key of a list, under one lease), not yet taken:
        ``async with client.lock("k") as lock:``. The arguments are ``dlm.Client.lock``'s
        (``on_lost(lock)`` is called in the event loop's thread, and must not block);
        ``cancel_margin``: how long before ``deadline`` the body of ``async with`` is
        cancelled at the latest (default: TTL/10, at most 0.5 s); ``traceparent``: as
        ``dlm.Client.lock``'s."""
        return AsyncLock(
            self,
            key,
            ttl=ttl,
            wait=wait,
            meta=meta,
            min_hold=min_hold,
            on_lost=on_lost,
            cancel_margin=cancel_margin,
            traceparent=traceparent,
        )

    def semaphore(
        self,
        key: str | Sequence[str],
        limit: int,
        *,
        ttl: Duration | None = None,
        wait: Duration | None = "10s",
        meta: Mapping[str, str] | None = None,
        min_hold: Duration | None = None,
        on_lost: Callable[[AsyncLock], object] | Callable[[], object] | None = None,
        cancel_margin: Duration | None = None,
        traceparent: str | None = None,
    ) -> AsyncLock:
        """As ``lock``, with up to ``limit`` holders at once (``dlm.Client.semaphore``)."""
        return AsyncLock(
            self,
            key,
            ttl=ttl,
            wait=wait,
            meta=meta,
            min_hold=min_hold,
            on_lost=on_lost,
            cancel_margin=cancel_margin,
            limit=limit,
            traceparent=traceparent,
        )

    def election(self, name: str) -> AsyncElection:
        """Election ``name`` (the lock key ``name``, as `dlm elect NAME`): ``await
        election.campaign(value)`` or ``async with election.campaign(value):`` to lead
        it, ``await election.leader()``, ``async for leader in election.observe():``."""
        return AsyncElection(self, name)

    async def aclose(self) -> None:
        """Releases the locks still held through this client (best effort), stops their
        renewals and closes the connections. Does nothing in a forked child."""
        if self._owner.inert or self._closed:
            return
        for held in list(self._locks):
            if held._holding:
                try:
                    await held.release()
                except (DlmError, RuntimeError):
                    pass  # the lease expires by itself: its renewals have stopped
        self._closed = True
        idle, self._idle = self._idle, []
        with anyio.CancelScope(shield=True):
            for inner in idle:
                await inner.aclose()
            await self._base.aclose()

    async def __aenter__(self) -> AsyncClient:
        self._owner.check("this dlm.AsyncClient")
        group = anyio.create_task_group()
        await group.__aenter__()
        self._task_group = group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._owner.inert:
            return None
        group, self._task_group = self._task_group, None
        try:
            with anyio.CancelScope(shield=True):
                await self.aclose()
        finally:
            if group is not None:
                group.cancel_scope.cancel()
                # Not handed the block's exception, which propagates as it is: anyio would
                # raise it wrapped in an ExceptionGroup.
                await group.__aexit__(None, None, None)
        return None

    def __repr__(self) -> str:
        return f"<dlm.AsyncClient cluster={','.join(self._base.members)!r}>"

    # -- private: connections ---------------------------------------------------

    def _borrow(self) -> aio.AsyncClient:
        self._owner.check("this dlm.AsyncClient")
        if self._closed:
            raise RuntimeError("the dlm.AsyncClient was closed")
        return self._idle.pop() if self._idle else self._base.spawn()

    async def _give_back(self, inner: aio.AsyncClient) -> None:
        inner.trace = None  # a trace context is one call's, not the pooled connection's
        if not self._closed and len(self._idle) < _IDLE_CONNECTIONS:
            self._idle.append(inner)
        else:
            with anyio.CancelScope(shield=True):
                await inner.aclose()


class AsyncLock(HeldState):
    """A lock (or semaphore) made by ``AsyncClient.lock`` or ``AsyncClient.semaphore``.

    ``async with lock:`` acquires (``dlm.LockHeld`` if not obtained within ``wait``),
    runs the body in a cancel scope that is cancelled as soon as the lock is lost (and
    ``cancel_margin`` before ``deadline`` at the latest), releases, and raises
    ``dlm.LockLost`` if it was lost. ``await lock.acquire()`` / ``await lock.release()``
    need the client's ``async with`` block (its task group renews the lease); nothing
    is cancelled then, but ``lost`` is set and ``on_lost`` called. Not reentrant;
    acquired again once released (a new lease, a higher token). One task at a time.
    """

    def __init__(
        self,
        client: AsyncClient,
        key: str | Sequence[str],
        *,
        ttl: Duration | None = None,
        wait: Duration | None = "10s",
        meta: Mapping[str, str] | None = None,
        min_hold: Duration | None = None,
        on_lost: Callable[[AsyncLock], object] | Callable[[], object] | None = None,
        cancel_margin: Duration | None = None,
        limit: int = 1,
        lock_delay: Duration | None = None,
        traceparent: str | None = None,
    ) -> None:
        ttl_ms = _options.optional_ttl_ms(ttl)
        super().__init__(
            _options.keys(key),
            ttl_ms=ttl_ms,
            wait_s=_options.optional_seconds(wait, "wait"),
            limit=_options.limit(limit),
            meta=_options.meta(meta),
            min_hold_s=_options.optional_seconds(min_hold, "min_hold"),
            on_lost=on_lost,
            lock_delay_ms=_options.lock_delay_ms(lock_delay),
            traceparent=_options.traceparent(traceparent),
        )
        self._owner = Owner()
        self._client = client
        self._lost: anyio.Event = anyio.Event()
        self._margin_given = _options.optional_seconds(cancel_margin, "cancel_margin")
        # Without a TTL (the cluster's default-ttl) the margin is set again once the lease
        # is open and its TTL known; 30 s until then.
        self._cancel_margin = self._margin_for(ttl_ms or DEFAULT_OPEN_TTL_MS)
        self._hold_scope: anyio.CancelScope | None = None
        self._body_scope: anyio.CancelScope | None = None
        self._own_group: anyio.abc.TaskGroup | None = None
        client._locks.add(self)

    @property
    def lost(self) -> anyio.Event:
        """Set when the current acquisition is lost (a new acquisition has a new event)."""
        return self._lost

    def _margin_for(self, ttl_ms: int) -> float:
        """The cancel margin with a lease of ``ttl_ms``: as given, else a tenth of the TTL
        up to CANCEL_MARGIN_MAX_S."""
        if self._margin_given is not None:
            return self._margin_given
        return min(CANCEL_MARGIN_MAX_S, ttl_ms / 10_000)

    @property
    def cancel_margin(self) -> float:
        """How long before ``deadline`` the body of ``async with`` is cancelled at the
        latest, in seconds."""
        return self._cancel_margin

    async def acquire(
        self,
        blocking: bool = True,
        timeout: Duration | None = None,
        *,
        traceparent: str | None = None,
    ) -> bool:
        """As ``dlm.Lock.acquire``. Renews in the client's task group: call it inside
        ``async with client:`` (RuntimeError otherwise; or use ``async with lock:``)."""
        group = self._client._task_group
        if group is None:
            self._owner.check("this dlm.AsyncLock")
            raise RuntimeError(
                "await lock.acquire() renews the lease in the client's task group: use it "
                "inside `async with dlm.AsyncClient(...) as client:`, or use `async with lock:`"
            )
        try:
            await self._acquire(group, blocking, timeout, _options.traceparent(traceparent))
        except LockHeld:
            return False
        return True

    async def release(self) -> None:
        """As ``dlm.Lock.release``."""
        self._owner.check("this dlm.AsyncLock")
        if not self._holding:
            raise RuntimeError(f"{self._describe()} is not held by this object")
        was_owned = self.owned()
        self._holding = False
        scope, self._hold_scope = self._hold_scope, None
        if scope is not None:
            scope.cancel()  # stops the renewals (the keeper's client closes)
        lease = self.lease
        if not was_owned:
            # Lost: nothing of ours is left to keep. Closing the lease frees the keys sooner
            # if it lives on; an unreachable cluster gets LOST_GIVE_BACK_S, not the timeout.
            self._client._owner.check("this dlm.AsyncClient")
            closer = self._client._base.spawn()
            try:
                with anyio.move_on_after(LOST_GIVE_BACK_S, shield=True):
                    await _close_quietly(closer, lease)
            finally:
                with anyio.CancelScope(shield=True):
                    await closer.aclose()
            return
        inner = self._client._borrow()
        try:
            with anyio.CancelScope(shield=True):
                await self._give_back_lease(inner, lease)
        finally:
            await self._client._give_back(inner)

    async def locked(self) -> bool:
        """Whether anyone (this object included) holds any of the lock's keys now."""
        self._owner.check("this dlm.AsyncLock")
        inner = self._client._borrow()
        try:
            for key in self._keys:
                if (await inner.get(key)).holders:
                    return True
            return False
        finally:
            await self._client._give_back(inner)

    async def extend(self, ttl: Duration | None = None) -> None:
        """As ``dlm.Lock.extend``."""
        self._owner.check("this dlm.AsyncLock")
        new_ttl_ms = None if ttl is None else _options.ttl_ms(ttl)
        self.check()
        keeper = self._keeper
        assert isinstance(keeper, aio.AsyncKeepAlive)
        inner = self._client._borrow()
        try:
            if new_ttl_ms is not None:
                # Spawned from the base client: the keeper hears of it before it is sent.
                await inner.update_lease(self.lease, new_ttl_ms)
            else:
                sent = lease_clock()
                keeper.confirmed(sent, await inner.keepalive(self.lease))
        except LeaseLost as exc:
            self._lost_now(exc.message)
        finally:
            await self._client._give_back(inner)
        self.check()

    async def __aenter__(self) -> AsyncLock:
        self._owner.check("this dlm.AsyncLock")
        group = anyio.create_task_group()
        await group.__aenter__()
        try:
            await self._acquire(group, True, None)
        except BaseException:
            group.cancel_scope.cancel()
            # Not handed the exception: anyio would raise it wrapped in an ExceptionGroup.
            await group.__aexit__(None, None, None)
            raise
        self._own_group = group
        body = anyio.CancelScope()
        body.__enter__()
        self._body_scope = body
        if self._lost.is_set():
            body.cancel()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._owner.inert:
            return None  # a forked child leaves its parent's lock alone
        body, self._body_scope = self._body_scope, None
        group, self._own_group = self._own_group, None
        swallowed = False
        try:
            if body is not None:
                # True when the exception is the cancellation the guard asked for.
                swallowed = bool(body.__exit__(exc_type, exc, tb))
        finally:
            try:
                if self._holding:
                    await self.release()
            finally:
                if group is not None:
                    group.cancel_scope.cancel()
                    await group.__aexit__(None, None, None)
        if self._lost.is_set() and (exc is None or swallowed):
            raise LockLost(self._lost_message()) from exc
        return None

    # -- private ------------------------------------------------------------------------

    async def _acquire(
        self,
        group: anyio.abc.TaskGroup,
        blocking: bool,
        timeout: Duration | None,
        traceparent: str | None = None,
    ) -> None:
        self._owner.check("this dlm.AsyncLock")
        if blocking:
            wait = self._wait_s if timeout is None else _options.seconds(timeout, "timeout")
        else:
            wait = None
        if self._holding:
            raise RuntimeError(f"{self._describe()} is already held by this object")
        self._lost = anyio.Event()
        self._lost_reason = None
        self._tokens = {}
        with self._trace_span(traceparent) as trace:
            inner = self._client._borrow()
            inner.trace = trace
            try:
                lease = await inner.open_lease(
                    self._ttl_ms, lock_delay_ms=self._lock_delay_ms, near=sorted(self._keys)
                )
                self._cancel_margin = self._margin_for(lease.ttl_ms)
                self._lease = lease.id
                scope = anyio.CancelScope()
                self._hold_scope = scope
                await group.start(self._hold, lease, scope, self._lost)
                try:
                    await self._take_keys(inner, lease.id, wait)
                except BaseException:
                    scope.cancel()
                    self._hold_scope = None
                    with anyio.CancelScope(shield=True), anyio.move_on_after(inner.timeout):
                        await _close_quietly(inner, lease.id)
                    raise
            finally:
                await self._client._give_back(inner)
        self._holding = True
        if not self.owned():
            await self.release()
            raise LockLost(self._lost_message())

    async def _take_keys(self, inner: aio.AsyncClient, lease: str, wait: float | None) -> None:
        # One global order (partitions ascending, keys sorted in each), all or nothing:
        # two holders of overlapping keys cannot deadlock, in one partition or several.
        grants = await inner.acquire_all(
            lease, sorted(self._keys), wait=wait or None, limit=self._limit, meta=self._meta
        )
        for grant in grants:
            self._tokens[grant.key] = grant.token
        self._granted_at = lease_clock()
        self._tokens = {key: self._tokens[key] for key in self._keys}

    async def _hold(
        self,
        lease: Any,
        scope: anyio.CancelScope,
        lost: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Renews ``lease`` until ``scope`` is cancelled, and declares the lock lost (which
        cancels the body) when the keeper does, or ``cancel_margin`` before its deadline."""
        with scope:
            on_lost = _lost_callback(self, lost)
            async with self._client._base.keep_alive(lease, on_lost=on_lost) as keeper:
                self._keeper = keeper
                task_status.started()
                while not lost.is_set():
                    left = keeper.deadline - self._cancel_margin - lease_clock()
                    if left <= 0:
                        on_lost(
                            f"{keeper.reason or 'no renewal was confirmed'}; its deadline was "
                            f"{self._cancel_margin:.3g}s away"
                        )
                        break
                    # Re-read at least every RECHECK_S: a TTL update or a suspend moves it.
                    with anyio.move_on_after(min(left, RECHECK_S)):
                        await lost.wait()
            await anyio.sleep_forever()  # lost: nothing to renew; released by the owner

    def _lost_now(self, reason: str) -> None:
        if self._lost.is_set():
            return
        self._lost_reason = reason
        body = self._body_scope
        if body is not None:
            body.cancel()
        if self._on_lost is not None:
            try:
                self._call_on_lost()
            except Exception:
                pass  # the callback's failure is the caller's; the loss stands
        self._lost.set()

    async def _give_back_lease(self, inner: aio.AsyncClient, lease: str) -> None:
        if self._min_hold_s is not None:
            hold_ms = min_hold_ttl_ms(self._granted_at, self._min_hold_s, lease_clock())
            if hold_ms > 0:
                try:
                    await inner.update_lease(lease, hold_ms, finished=True)
                except LeaseLost:
                    pass
                return
        await inner.close_lease(lease)


def _lost_callback(lock: AsyncLock, event: anyio.Event) -> Callable[[str], None]:
    ref = weakref.ref(lock)

    def lost(reason: str) -> None:
        target = ref()
        if target is not None and target._lost is event:
            target._lost_now(reason)

    return lost


async def _close_quietly(inner: aio.AsyncClient, lease: str) -> None:
    try:
        await inner.close_lease(lease)
    except DlmError:
        pass  # the lease expires by itself: its renewals have stopped


class AsyncLeadership(AsyncLock):
    """This task leading an election (``AsyncElection.campaign``): a ``dlm.AsyncLock`` on
    the election's key, plus ``value``, ``proclaim(value)`` and ``resign()``."""

    def __init__(self, election: AsyncElection, value: str, **terms: Any) -> None:
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

    async def proclaim(self, value: str) -> None:
        """As ``dlm.Leadership.proclaim``: ``dlm.NotHolder`` unless this still leads."""
        meta = campaign_meta(value)
        self._owner.check("this dlm.AsyncLeadership")
        if not self._holding or self._lost.is_set():
            raise not_leading(self.name)
        inner = self._client._borrow()
        try:
            await inner.proclaim(self.lease, self.name, value)
        finally:
            await self._client._give_back(inner)
        self._value = value
        self._meta = {**self._meta, **meta}

    async def resign(self) -> None:
        """Gives up leading (the next candidate is elected at once); quiet if this no
        longer leads."""
        self._owner.check("this dlm.AsyncLeadership")
        if self._holding:
            await self.release()

    def _describe(self) -> str:
        return f"leadership of {self.key!r}"


class Campaign:
    """What ``AsyncElection.campaign`` returns: ``await`` it (inside ``async with
    client:``, whose task group renews) for an ``AsyncLeadership``, or ``async with``
    it to lead for the block's length: the block is cancelled if leadership is lost,
    and resigns at its end."""

    def __init__(self, election: AsyncElection, leading: AsyncLeadership) -> None:
        self._election = election
        self._leading = leading

    def __await__(self) -> Generator[Any, None, AsyncLeadership]:
        return self._elected().__await__()

    async def _elected(self) -> AsyncLeadership:
        self._election._starting(self._leading)
        if not await self._leading.acquire():
            raise AssertionError("a blocking acquire returned without the key")
        return self._leading

    async def __aenter__(self) -> AsyncLeadership:
        self._election._starting(self._leading)
        await self._leading.__aenter__()
        return self._leading

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._leading.__aexit__(exc_type, exc, tb)


class AsyncElection:
    """An election, made by ``AsyncClient.election(name)``: as ``dlm.Election``, with
    ``campaign`` awaited or used as ``async with``, and ``observe()`` an async
    iterator."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        (self._name,) = _options.keys(name)
        self._client = client
        self._leading: AsyncLeadership | None = None

    @property
    def name(self) -> str:
        """The election's name: the lock key it is held on."""
        return self._name

    def campaign(
        self,
        value: str = "",
        *,
        ttl: Duration | None = None,
        wait: Duration | None = None,
        lock_delay: Duration | None = None,
        on_lost: Callable[[AsyncLeadership], object] | Callable[[], object] | None = None,
        cancel_margin: Duration | None = None,
    ) -> Campaign:
        """As ``dlm.Election.campaign``: ``leading = await election.campaign(...)`` or
        ``async with election.campaign(...) as leading:`` (whose body is cancelled when
        leadership is lost, ``cancel_margin`` before its deadline at the latest)."""
        leading = AsyncLeadership(
            self,
            value,
            ttl=ttl,
            wait=campaign_wait(wait),
            lock_delay=lock_delay,
            on_lost=on_lost,
            cancel_margin=cancel_margin,
        )
        return Campaign(self, leading)

    def _starting(self, leading: AsyncLeadership) -> None:
        if self._leading is not None and self._leading._holding:
            raise RuntimeError(f"already leading {self._name!r}: resign first")
        self._leading = leading

    async def resign(self) -> None:
        """Gives up leading, if this AsyncElection's last campaign leads (else nothing)."""
        leading = self._leading
        if leading is not None:
            await leading.resign()

    async def proclaim(self, value: str) -> None:
        """As ``dlm.Election.proclaim``."""
        leading = self._leading
        if leading is None:
            raise not_leading(self._name)
        await leading.proclaim(value)

    async def leader(self) -> Leader | None:
        """Who leads now, or None while nobody does."""
        inner = self._client._borrow()
        try:
            return leader_from_state(self._name, await inner.get(self._name))
        finally:
            await self._client._give_back(inner)

    async def observe(self, *, timeout: Duration | None = None) -> AsyncGenerator[Leader | None]:
        """As ``dlm.Election.observe``, as an async iterator (``async for``)."""
        seconds = _options.optional_seconds(timeout, "timeout")
        self._client._owner.check("this dlm.AsyncClient")
        inner = self._client._base.spawn()
        try:
            async for seen in inner.observe(self._name, timeout=seconds):
                yield leader_from_watch(seen)
        finally:
            with anyio.CancelScope(shield=True):
                await inner.aclose()

    def __repr__(self) -> str:
        return f"<dlm.AsyncElection {self._name!r}>"
