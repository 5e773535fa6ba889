"""``dlm.Client`` and ``dlm.Lock``: the blocking public API, a thin layer over dlm.client.

Private (import the names from ``dlm``). Every request, retry, renewal and
deadline rule is the internal client's (dlm.client.core through its blocking driver
dlm.client.sync, with ``KeepAlive`` for renewals): this module only names things as
Python lock libraries do and keeps the state of one lock object.

One lock object = one lease holding its keys: ``acquire`` opens the lease, starts its
keep-alive (two daemon threads and a connection of their own) and takes each key in
sorted order (two locks on the same keys given in another order cannot deadlock);
``release`` closes the lease, which gives back every key at once. Requests go over
connections borrowed from a small pool per client, so a lock waiting in a queue does
not hold up another thread's release on the same client.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

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
from dlm.client import sync
from dlm.client.clock import lease_clock
from dlm.client.core import min_hold_ttl_ms
from dlm.client.errors import DlmError, LeaseLost, LockHeld, LockLost

_IDLE_CONNECTIONS = 64
"""Connections a client keeps open between calls (more are opened while many wait)."""


class Client:
    """A connection to a dlm cluster for blocking code; share one per process.

    ``cluster`` is what ``dlm --cluster`` takes ("h1:7700,h2:7700" or a list of
    "HOST:PORT"), else $DLM_CLUSTER, else 127.0.0.1:7700. ``secret_file``, ``tls_ca``,
    ``tls_cert`` and ``tls_key`` are the command's --secret-file and --tls-* files
    (else $DLM_SECRET_FILE, $DLM_TLS_CA, $DLM_TLS_CERT, $DLM_TLS_KEY). ``timeout``: how
    long a call keeps trying to reach a quorum (``dlm.ClusterUnavailable`` after it);
    ``dial_timeout``: how long it waits for any member to answer at all. Durations are
    seconds or the command's strings ("30s", "1m30s"). Making a client connects to
    nothing: the first call does.

    Thread-safe: any number of threads may share a client and make locks from it. In a
    forked child the client and its locks are inert (``dlm.InertAfterFork``).
    ``with dlm.Client() as client:`` closes it at the end of the block.
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
        self._base = sync.Client(
            members, timeout=call_timeout, dial_timeout=dial, secret=secret, tls=tls
        )
        self._idle: list[sync.Client] = []
        self._mutex = threading.Lock()
        self._closed = False
        self._locks: weakref.WeakSet[Lock] = weakref.WeakSet()

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
        on_lost: Callable[[Lock], object] | Callable[[], object] | None = None,
        traceparent: str | None = None,
    ) -> Lock:
        """A lock on ``key`` (or on every key of a list, all under one lease), not yet
        taken: ``with client.lock("k") as lock:`` or ``lock.acquire()``.

        ``ttl``: the lease's lifetime, renewed every third of it in the background
        (None: the cluster's default-ttl, 30 s unless `dlm config set` changed it).
        ``wait``: how long ``with`` and ``acquire()`` wait in the key's FIFO queue
        (None or 0: try once). ``meta``: what to record with the grant (`dlm status
        KEY` shows it; host, user and pid are recorded anyway). ``min_hold``: the
        cluster keeps the lock at least this long after the grant, even when it is
        released sooner (`dlm exec --min-hold`). ``on_lost(lock)`` (or ``on_lost()``):
        called once, from a background thread, when the lock is lost while held.
        ``traceparent``: the W3C trace context its acquisitions belong to (default: the
        TRACEPARENT environment variable, if set), so a job's trace holds its lock
        (README, "Tracing")."""
        return Lock(
            self,
            key,
            ttl=ttl,
            wait=wait,
            meta=meta,
            min_hold=min_hold,
            on_lost=on_lost,
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
        on_lost: Callable[[Lock], object] | Callable[[], object] | None = None,
        traceparent: str | None = None,
    ) -> Lock:
        """As ``lock``, but up to ``limit`` holders at once (every holder of a key must
        ask with the same limit). ``lock.token`` is still a fencing token: distinct and
        rising per grant of the key."""
        return Lock(
            self,
            key,
            ttl=ttl,
            wait=wait,
            meta=meta,
            min_hold=min_hold,
            on_lost=on_lost,
            limit=limit,
            traceparent=traceparent,
        )

    def election(self, name: str) -> Election:
        """Election ``name`` (the lock key ``name``, as `dlm elect NAME`):
        ``election.campaign(value)`` to lead it, ``leader()``, ``observe()``."""
        return Election(self, name)

    def close(self) -> None:
        """Releases the locks still held through this client (best effort), stops their
        renewals and closes the connections. Does nothing in a forked child."""
        if self._owner.inert or self._closed:
            return
        for held in list(self._locks):
            if held._holding:
                try:
                    held.release()
                except (DlmError, RuntimeError):
                    pass  # the lease expires by itself: its renewals have stopped
        with self._mutex:
            self._closed = True
            idle, self._idle = self._idle, []
        for inner in idle:
            inner.close()
        self._base.close()

    def __enter__(self) -> Client:
        self._owner.check("this dlm.Client")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dlm.Client cluster={','.join(self._base.members)!r}>"

    # -- private: connections ---------------------------------------------------

    @contextmanager
    def _borrow(self) -> Iterator[sync.Client]:
        """A connection of this client's (a spawned internal client) for one call, so a
        call that blocks (a queued acquire) holds up no other thread's."""
        self._owner.check("this dlm.Client")
        with self._mutex:
            if self._closed:
                raise RuntimeError("the dlm.Client was closed")
            inner = self._idle.pop() if self._idle else self._base.spawn()
        try:
            yield inner
        finally:
            inner.trace = None  # a trace context is one call's, not the pooled connection's
            with self._mutex:
                keep = not self._closed and len(self._idle) < _IDLE_CONNECTIONS
                if keep:
                    self._idle.append(inner)
            if not keep:
                inner.close()


def _stop_keeper(keeper: sync.KeepAlive, owner: Owner) -> None:
    """A lock object was dropped while held: stop renewing (the lease then expires), unless
    this is a forked child, where the keeper is the parent's to stop."""
    if not owner.inert:
        keeper.stop(timeout=0.5)


class Lock(HeldState):
    """A lock (or semaphore) on one key or several, made by ``Client.lock`` or
    ``Client.semaphore``.

    ``with lock:`` acquires (raising ``dlm.LockHeld`` if it is not obtained within
    ``wait``) and releases; if the lock was lost meanwhile, the block's end raises
    ``dlm.LockLost``. Nothing can stop the block's code itself when the lock is lost:
    call ``check()`` before each step, and give ``token`` to what you write to.
    A lock object is not reentrant, and may be acquired again once released (a new
    lease, a new, higher token). Use one lock object per thread.
    """

    def __init__(
        self,
        client: Client,
        key: str | Sequence[str],
        *,
        ttl: Duration | None = None,
        wait: Duration | None = "10s",
        meta: Mapping[str, str] | None = None,
        min_hold: Duration | None = None,
        on_lost: Callable[[Lock], object] | Callable[[], object] | None = None,
        limit: int = 1,
        lock_delay: Duration | None = None,
        traceparent: str | None = None,
    ) -> None:
        super().__init__(
            _options.keys(key),
            ttl_ms=_options.optional_ttl_ms(ttl),
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
        self._lost: threading.Event = threading.Event()
        self._keeper_alive: sync.KeepAlive | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._mutex = threading.RLock()
        client._locks.add(self)

    @property
    def lost(self) -> threading.Event:
        """Set when the current acquisition is lost (a new acquisition has a new event)."""
        return self._lost

    # -- taking and giving back ------------------------------------------------------

    def acquire(
        self,
        blocking: bool = True,
        timeout: Duration | None = None,
        *,
        traceparent: str | None = None,
    ) -> bool:
        """Takes the lock: True once held; False if someone else still holds it (right
        away when not ``blocking``, else after ``timeout``, by default the lock's
        ``wait``). Other failures raise (``dlm.ClusterUnavailable``, ...).
        ``traceparent``: this acquisition's trace context (default: the lock's)."""
        try:
            self._acquire(blocking, timeout, _options.traceparent(traceparent))
        except LockHeld:
            return False
        return True

    def release(self) -> None:
        """Gives the lock back (all its keys; with ``min_hold``, the cluster keeps it until
        the hold is over). A lock already lost is given back quietly. RuntimeError if
        this object does not hold it."""
        self._owner.check("this dlm.Lock")
        with self._mutex:
            if not self._holding:
                raise RuntimeError(f"{self._describe()} is not held by this object")
            was_owned = self.owned()
            self._holding = False
            keeper, self._keeper_alive = self._keeper_alive, None
            if self._finalizer is not None:
                self._finalizer.detach()
            lease = self.lease
            if keeper is not None:
                keeper.stop()
            if not was_owned:
                # Lost: nothing of ours is left to keep. Closing the lease frees the keys
                # sooner if it lives on, but waits out the timeout if the cluster cannot be
                # reached: a daemon thread does it, and the caller hears of the loss at once.
                self._client._owner.check("this dlm.Client")
                closer = threading.Thread(
                    target=_give_back_quietly,
                    args=(self._client._base.spawn(), lease),
                    kwargs={"then_close": True},
                    name=f"dlm-give-back-{lease}",
                    daemon=True,
                )
                closer.start()
                return
            with self._client._borrow() as inner:
                if self._min_hold_s is not None:
                    hold_ms = min_hold_ttl_ms(self._granted_at, self._min_hold_s, lease_clock())
                    if hold_ms > 0:
                        try:
                            inner.update_lease(lease, hold_ms, finished=True)
                        except LeaseLost:
                            pass
                        return
                inner.close_lease(lease)

    def __enter__(self) -> Lock:
        self._acquire(True, None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owner.inert:
            return  # a forked child leaves its parent's lock alone
        lost = self._lost.is_set() or (self._holding and not self.owned())
        if self._holding:
            self.release()
        if lost and exc is None:
            raise LockLost(self._lost_message())

    def locked(self) -> bool:
        """Whether anyone (this object included) holds any of the lock's keys now."""
        self._owner.check("this dlm.Lock")
        with self._client._borrow() as inner:
            return any(inner.get(key).holders for key in self._keys)

    def extend(self, ttl: Duration | None = None) -> None:
        """Renews the lease now; given ``ttl``, sets its TTL to that from now on, shorter
        or longer. A shorter TTL lowers ``deadline`` before the request is sent, so the
        lock is never counted on past what the cluster may grant it to someone else;
        a longer one counts once the cluster confirms it. ``dlm.LockLost`` if the lock
        is not held any more."""
        self._owner.check("this dlm.Lock")
        new_ttl_ms = None if ttl is None else _options.ttl_ms(ttl)
        with self._mutex:
            self.check()
            keeper = self._keeper_alive
            assert keeper is not None
            try:
                with self._client._borrow() as inner:
                    if new_ttl_ms is not None:
                        # Through a client that shares the keeper's watchers: the keeper
                        # hears of the update before it is sent (sync.Client.update_lease).
                        inner.update_lease(self.lease, new_ttl_ms)
                    else:
                        sent = lease_clock()
                        keeper.confirmed(sent, inner.keepalive(self.lease))
            except LeaseLost as exc:
                self._lost_now(exc.message)
            self.check()

    # -- private ------------------------------------------------------------------------

    def _acquire(
        self, blocking: bool, timeout: Duration | None, traceparent: str | None = None
    ) -> None:
        self._owner.check("this dlm.Lock")
        if blocking:
            wait = self._wait_s if timeout is None else _options.seconds(timeout, "timeout")
        else:
            wait = None
        with self._mutex:
            if self._holding:
                raise RuntimeError(f"{self._describe()} is already held by this object")
            self._lost = threading.Event()
            self._lost_reason = None
            self._tokens = {}
            with self._client._borrow() as inner, self._trace_span(traceparent) as trace:
                inner.trace = trace
                lease = inner.open_lease(
                    self._ttl_ms, lock_delay_ms=self._lock_delay_ms, near=sorted(self._keys)
                )
                self._lease = lease.id
                keeper = sync.KeepAlive(
                    self._client._base, lease, on_lost=_lost_callback(self, self._lost)
                )
                self._keeper = self._keeper_alive = keeper
                keeper.start()
                try:
                    self._take_keys(inner, lease.id, wait)
                except BaseException:
                    keeper.stop()
                    self._keeper_alive = None
                    _give_back_quietly(inner, lease.id)
                    raise
            self._holding = True
            self._finalizer = weakref.finalize(self, _stop_keeper, keeper, self._owner)
            self._finalizer.atexit = False
            if not self.owned():
                self.release()
                raise LockLost(self._lost_message())

    def _take_keys(self, inner: sync.Client, lease: str, wait: float | None) -> None:
        # One global order (partitions ascending, keys sorted in each), all or nothing:
        # two holders of overlapping keys cannot deadlock, in one partition or several.
        grants = inner.acquire_all(
            lease, sorted(self._keys), wait=wait or None, limit=self._limit, meta=self._meta
        )
        for grant in grants:
            self._tokens[grant.key] = grant.token
        self._granted_at = lease_clock()
        self._tokens = {key: self._tokens[key] for key in self._keys}

    def _lost_now(self, reason: str) -> None:
        """The lease is gone (the keeper said so, or a request answered it)."""
        if self._lost.is_set():
            return
        self._lost_reason = reason
        if self._on_lost is not None:
            try:
                self._call_on_lost()
            except Exception:
                pass  # the callback's failure is the caller's; the loss stands
        self._lost.set()


def _lost_callback(lock: Lock, event: threading.Event) -> Callable[[str], None]:
    """The keeper's on_lost: tells the lock (if still alive, and still on this acquisition)
    without holding it alive."""
    ref = weakref.ref(lock)

    def lost(reason: str) -> None:
        target = ref()
        if target is not None and target._lost is event:
            target._lost_now(reason)

    return lost


def _give_back_quietly(inner: sync.Client, lease: str, *, then_close: bool = False) -> None:
    try:
        inner.close_lease(lease)
    except DlmError:
        pass  # the lease expires by itself: its renewals have stopped
    finally:
        if then_close:
            inner.close()


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
        ttl: Duration | None = None,
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
