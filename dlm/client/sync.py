"""The blocking client: plain sockets and select, no event loop.

This is what the ``dlm`` command uses, so it imports neither asyncio nor
anyio (``import asyncio`` alone costs more than the rest of a ``dlm exec``
start-up). It drives the decision generators of core.py over one TCP
connection at a time; a lock serialises calls, so a Client may be shared by
threads. ``KeepAlive`` renews a lease from its own connection, so a renewal
never waits behind a long blocking acquire.

Sockets are created close-on-exec (Python's default, kept deliberately): a
child started by ``dlm exec`` inherits no descriptor of ours. They come from
``_socket``, the C module under ``socket``: the wrapper module's import (its
enums, selectors) costs ~2 ms of every run, and we use none of what it adds.
"""

from __future__ import annotations

import _socket
import select
import threading
import time
from collections import deque

from dlm.client import core
from dlm.client.core import (
    AwaitGrant,
    Failed,
    Grant,
    Lease,
    LeaseRef,
    Send,
    Sleep,
    lease_id,
    payload,
    reply_int,
    reply_list,
    without_id,
)
from dlm.client.errors import ClusterUnavailable, DlmError, LeaseLost
from dlm.wire import (
    PEER_FRAME_LIMIT,
    CloseLease,
    FrameDecoder,
    Get,
    Hello,
    LeaseInfo,
    ListLocks,
    OpenLease,
    ProtocolError,
    Role,
    Status,
    encode_frame,
    format_addr,
    parse_addr,
)
from dlm.wire import (
    KeepAlive as KeepAliveRequest,
)

# typing and random stay off the import path of `dlm acquire` (see wire.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Mapping, Sequence
    from types import TracebackType
    from typing import Any

    from dlm.client.core import Action, Outcome

# Replies (a long ``list``) may be bigger than the 64 KiB a client may send.
REPLY_FRAME_LIMIT = PEER_FRAME_LIMIT
_RECV_CHUNK = 65536


class _Broken(Exception):
    """The connection failed; the message says how."""


class _Connection:
    """One TCP connection to one member, after a completed hello."""

    def __init__(self, addr: str, sock: _socket.socket) -> None:
        self.addr = addr
        self.sock = sock
        self.node = ""
        self._framed = False  # a whole frame has come in: it is a dlm member at least
        self._decoder = FrameDecoder(REPLY_FRAME_LIMIT)
        self._frames: deque[Any] = deque()
        self._pushes: list[dict[Any, Any]] = []
        self._ids = core.RequestIds()

    @classmethod
    def open(cls, addr: str, deadline: float) -> tuple[_Connection, dict[Any, Any]]:
        """Connects and says hello; returns the connection and the member's greeting."""
        conn = cls.start(addr, deadline)
        try:
            greeting = conn.read(deadline)
        except BaseException:
            conn.close()
            raise
        if greeting is None:
            conn.close()
            raise _Broken("no greeting")
        conn.greeted(greeting)
        return conn, greeting

    @classmethod
    def start(cls, addr: str, deadline: float) -> _Connection:
        """Connects and sends the hello, without waiting for the greeting.

        A request may follow at once: the member reads frames in order, so it
        answers the hello first and the request after, and a run saves a round
        trip. If it refuses the hello, the refusal comes back as the reply.
        """
        host, port = parse_addr(addr)
        # getaddrinfo encodes a str host with the idna codec, whose import (with
        # stringprep and unicodedata) costs ~1 ms a run; an ASCII name needs no encoding.
        target: Any = host.encode("ascii") if host.isascii() else host
        try:
            sock = _connect(target, port, max(0.001, _left(deadline)))
        except TimeoutError:
            raise _Broken("connect timed out") from None
        except OSError as exc:
            raise _Broken(exc.strerror or str(exc)) from None
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        conn = cls(addr, sock)
        try:
            conn.send(Hello(role=Role.CLIENT).to_wire(), deadline)
        except BaseException:
            conn.close()
            raise
        return conn

    def greeted(self, greeting: dict[Any, Any]) -> None:
        node = greeting.get("node")
        self.node = node if isinstance(node, str) else ""

    def send(self, obj: Any, deadline: float) -> None:
        data = encode_frame(obj)
        try:
            self.sock.settimeout(max(0.001, _left(deadline)))
            self.sock.sendall(data)
        except TimeoutError:
            raise _Broken("send timed out") from None
        except OSError as exc:
            raise _Broken(exc.strerror or str(exc)) from None

    def read(self, deadline: float) -> dict[Any, Any] | None:
        """The next frame, or None at the deadline."""
        while not self._frames:
            left = _left(deadline)
            if left <= 0:
                return None
            try:
                readable, _, _ = select.select([self.sock], [], [], left)
                if not readable:
                    return None
                self.sock.settimeout(0.0)
                data = self.sock.recv(_RECV_CHUNK)
            except BlockingIOError:
                continue
            except (OSError, ValueError) as exc:  # ValueError: the fd was closed under us
                raise _Broken(str(exc) or "connection failed") from None
            if not data:
                raise _Broken("connection closed by the member")
            self._decoder.feed(data)
            try:
                self._frames.extend(self._decoder.frames())
            except ProtocolError as exc:
                if not self._framed:
                    # The first bytes are not a frame: some other server listens there
                    # (an HTTP server's "HTTP" reads as a length of 1213486160).
                    raise _Broken(
                        f"{self.addr} is not a dlm member (it answered something else); "
                        "check --cluster"
                    ) from None
                raise _Broken(f"bad frame: {exc}") from None
            self._framed = self._framed or bool(self._frames)
        frame = self._frames.popleft()
        if not isinstance(frame, dict):
            raise _Broken("frame is not a map")
        return frame

    def request(self, request: dict[str, Any], deadline: float) -> dict[Any, Any] | None:
        rid = self._ids.next()
        self.send({**request, "id": rid}, deadline)
        while True:
            frame = self.read(deadline)
            if frame is None:
                return None
            if frame.get("t") == "grant" and "id" not in frame:
                self._pushes.append(frame)
            elif core.is_reply_to(frame, rid):
                return frame
            elif frame.get("t") == "welcome" and "id" not in frame:
                self.greeted(frame)  # the greeting of a hello sent just before
            elif frame.get("t") == "error" and "id" not in frame:
                return frame  # the member is refusing the connection as a whole
            # Anything else is a reply to a request we gave up on: drop it.

    def drop_pushes(self, lease: str, key: str) -> None:
        self._pushes = [p for p in self._pushes if not _push_matches(p, lease, key)]

    def await_grant(self, lease: str, key: str, deadline: float) -> dict[Any, Any] | None:
        while True:
            for i, push in enumerate(self._pushes):
                if _push_matches(push, lease, key):
                    del self._pushes[i]
                    return push
            frame = self.read(deadline)
            if frame is None:
                return None
            if frame.get("t") == "grant" and "id" not in frame:
                self._pushes.append(frame)
            elif frame.get("t") == "error" and "id" not in frame:
                raise _Broken(f"member closed the connection: {frame.get('code')}")

    def interrupt(self) -> None:
        """Wakes a thread blocked on this connection (from any thread)."""
        try:
            self.sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _connect(host: str | bytes, port: int, timeout: float) -> _socket.socket:
    """As socket.create_connection: each address of ``host`` in turn, the first to connect."""
    last: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        return sock
    raise last or OSError(f"no address found for {host!r}")


def _push_matches(push: Mapping[Any, Any], lease: str, key: str) -> bool:
    return push.get("lease") == lease and push.get("key") == key


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


class Client:
    """A blocking dlm client; safe to share between threads (calls are serialised)."""

    def __init__(
        self,
        members: Sequence[str] | str,
        *,
        timeout: float = 10.0,
        rng: random.Random | None = None,
        attempt_timeout: float | None = None,
        dial_timeout: float | None = None,
    ) -> None:
        """``dial_timeout``: give a call up once this long has passed without any member
        answering at all (None: keep trying for the whole ``timeout``)."""
        self.members = core.parse_members(members)
        self.timeout = timeout
        self._rng = rng
        start = rng.randrange(len(self.members)) if rng is not None else 0
        self._settings = core.Settings(
            members=self.members,
            router=core.Router(self.members, start),
            backoff=core.Backoff(rng),
            clock=time.monotonic,
            timeout=timeout,
            attempt_timeout=attempt_timeout or core.default_attempt_timeout(timeout),
            dial_timeout=dial_timeout,
        )
        self._lock = threading.RLock()
        self._conn: _Connection | None = None
        self._closed = False
        self._wake = threading.Event()
        self._ttl_ms: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection; a call blocked in another thread fails promptly."""
        self._closed = True
        self._wake.set()
        conn = self._conn
        if conn is not None:
            conn.interrupt()
        if self._lock.acquire(timeout=5.0):
            try:
                self._drop_connection()
            finally:
                self._lock.release()

    @property
    def connected_to(self) -> str | None:
        conn = self._conn
        return conn.addr if conn is not None else None

    def spawn(self) -> Client:
        """A new client for the same cluster with its own connection (for background work)."""
        rng = None
        if self._rng is not None:
            import random  # already loaded by whoever made self._rng

            rng = random.Random(self._rng.getrandbits(64))
        child = Client(
            self.members,
            timeout=self.timeout,
            rng=rng,
            attempt_timeout=self._settings.attempt_timeout,
        )
        child._settings.router.preferred = self._settings.router.preferred
        child._ttl_ms = dict(self._ttl_ms)
        return child

    # -- leases ---------------------------------------------------------------

    def open_lease(self, ttl_ms: int, lease: str | None = None) -> Lease:
        """Opens a lease (a fresh random id unless ``lease`` is given)."""
        lid = lease or core.new_lease_id()
        with self._lock:
            sent = time.monotonic()
            _, reply = self._run(
                core.call(self._settings, without_id(OpenLease(id=0, lease=lid, ttl_ms=ttl_ms)))
            )
        ttl = reply_int(reply, "ttl_ms")
        self._ttl_ms[lid] = ttl
        return Lease(id=lid, ttl_ms=ttl, confirmed_at=sent)

    def keepalive(self, lease: LeaseRef, *, timeout: float | None = None) -> int:
        """Renews the lease; returns its TTL in ms. LeaseLost if it is gone."""
        lid = lease_id(lease)
        request = without_id(KeepAliveRequest(id=0, lease=lid))
        with self._lock:
            _, reply = self._run(core.call(self._settings, request, timeout=timeout))
        ttl = reply_int(reply, "ttl_ms")
        self._ttl_ms[lid] = ttl
        return ttl

    def close_lease(self, lease: LeaseRef) -> None:
        lid = lease_id(lease)
        request = without_id(CloseLease(id=0, lease=lid, seq=core.new_seq()))
        with self._lock:
            self._run(core.call(self._settings, request))
        self._ttl_ms.pop(lid, None)

    def lease_info(self, lease: LeaseRef) -> dict[str, Any]:
        request = without_id(LeaseInfo(id=0, lease=lease_id(lease)))
        with self._lock:
            _, reply = self._run(core.call(self._settings, request))
        return payload(reply)

    # -- locks ----------------------------------------------------------------

    def acquire(
        self,
        lease: LeaseRef,
        key: str,
        *,
        wait: float | None = None,
        limit: int = 1,
        meta: Mapping[str, str] | None = None,
    ) -> Grant:
        """Takes ``key``. ``wait=None``: try once (LockHeld if held). ``wait=seconds``: queue
        FIFO and block until granted, or leave the queue and raise LockHeld when it runs out."""
        lid = lease_id(lease)
        known_ttl = lease.ttl_ms if isinstance(lease, Lease) else self._ttl_ms.get(lid)
        flow = core.acquire_flow(
            self._settings, lid, key, wait=wait, limit=limit, meta=meta, known_ttl_ms=known_ttl
        )
        with self._lock:
            grant: Grant = self._run(flow)
        return grant

    def release(self, lease: LeaseRef, key: str) -> None:
        """Releases ``key`` (or leaves its queue). NotHolder if this lease has neither."""
        with self._lock:
            self._run(core.call(self._settings, core.release_request(lease_id(lease), key)))

    def get(self, key: str, *, stale: bool = False) -> dict[str, Any]:
        with self._lock:
            _, reply = self._run(
                core.call(self._settings, without_id(Get(id=0, key=key, stale=stale)))
            )
        return payload(reply)

    def list_locks(self, prefix: str = "", *, stale: bool = False) -> list[dict[str, Any]]:
        request = without_id(ListLocks(id=0, prefix=prefix, stale=stale))
        with self._lock:
            _, reply = self._run(core.call(self._settings, request))
        return [lock for lock in reply_list(reply, "locks") if isinstance(lock, dict)]

    # -- cluster --------------------------------------------------------------

    def status(self, *, stale: bool = False) -> dict[str, Any]:
        """The answering member's view of the cluster."""
        with self._lock:
            _, reply = self._run(core.call(self._settings, without_id(Status(id=0, stale=stale))))
        return payload(reply)

    def member_status(self, addr: str, timeout: float = 2.0) -> dict[str, Any] | None:
        """Asks one member directly for its own (stale) view; None if it does not answer."""
        deadline = time.monotonic() + timeout
        try:
            conn, greeting = _Connection.open(format_addr(*parse_addr(addr)), deadline)
        except (_Broken, ValueError):
            return None
        try:
            if greeting.get("t") != "welcome":
                return None
            reply = conn.request(without_id(Status(id=0, stale=True)), deadline)
        except _Broken:
            return None
        finally:
            conn.close()
        if reply is None or reply.get("t") != "ok":
            return None
        return payload(reply)

    # -- the driver -------------------------------------------------------------

    def _run(self, flow: core.Flow) -> Any:
        try:
            action: Action = next(flow)
            while True:
                action = flow.send(self._perform(action))
        except StopIteration as done:
            return done.value

    def _perform(self, action: Action) -> Outcome:
        if self._closed:
            raise ClusterUnavailable("the client was closed", code="CLOSED")
        if isinstance(action, Sleep):
            if action.seconds > 0:
                self._wake.wait(action.seconds)
            return None
        deadline = time.monotonic() + action.timeout
        if isinstance(action, AwaitGrant):
            conn = self._conn
            if conn is None or conn.addr != action.addr:
                return Failed("connection lost while waiting")
            try:
                return conn.await_grant(action.lease, action.key, deadline)
            except _Broken as exc:
                self._drop_connection()
                return Failed(str(exc))
        return self._send(action, deadline)

    def _send(self, action: Send, deadline: float) -> Outcome:
        conn = self._conn
        if conn is None or conn.addr != action.addr:
            self._drop_connection()
            try:
                conn = _Connection.start(action.addr, deadline)
            except _Broken as exc:
                return Failed(str(exc))
            self._conn = conn
        if action.drop_pushes_for is not None:
            conn.drop_pushes(*action.drop_pushes_for)
        try:
            reply = conn.request(action.request, deadline)
        except _Broken as exc:
            self._drop_connection()
            return Failed(str(exc))
        if reply is None:
            # A late reply would be confusing on a reused connection: start afresh.
            self._drop_connection()
            return Failed(f"no reply within {action.timeout:.3g}s")
        if reply.get("t") == "error" and "id" not in reply:
            self._drop_connection()
        return reply

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class KeepAlive:
    """Renews a lease in the background and says when it can no longer be trusted.

    The client-side deadline is (monotonic time the last *confirmed* renewal was
    sent) + TTL; the first one counts from ``confirmed_at``, when the
    open_lease or acquire was sent. A renewal is attempted about every TTL/3
    from a daemon thread with its own connection; a second thread watches the
    deadline with a timer, so a renewal that hangs (members SIGSTOPped) cannot
    delay the verdict. ``lost`` is set, and ``on_lost(reason)`` called once,
    on SESSION_EXPIRED or when the deadline passes unconfirmed.
    """

    def __init__(
        self,
        client: Client,
        lease: LeaseRef,
        *,
        confirmed_at: float | None = None,
        ttl_ms: int | None = None,
        on_lost: Callable[[str], None] | None = None,
        interval: float | None = None,
    ) -> None:
        if isinstance(lease, Lease):
            ttl_ms = lease.ttl_ms if ttl_ms is None else ttl_ms
            confirmed_at = lease.confirmed_at if confirmed_at is None else confirmed_at
        if ttl_ms is None or ttl_ms <= 0:
            raise ValueError("KeepAlive needs the lease's ttl_ms")
        if confirmed_at is None:
            raise ValueError("KeepAlive needs confirmed_at: when the lease was last confirmed")
        self.lease = lease_id(lease)
        self.ttl_ms = ttl_ms
        self.lost = threading.Event()
        self.reason: str | None = None
        self.renewals = 0
        self.last_error: BaseException | None = None
        self._client = client.spawn()
        self._on_lost = on_lost
        self._fixed_interval = interval
        self._confirmed_at = confirmed_at
        self._deadline = confirmed_at + ttl_ms / 1000.0
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._renew_loop, name=f"dlm-keepalive-{self.lease}", daemon=True
            ),
            threading.Thread(target=self._watch, name=f"dlm-deadline-{self.lease}", daemon=True),
        ]
        self._started = False
        self._lost_marked = False

    @property
    def deadline(self) -> float:
        """Monotonic time after which the lease must be presumed lost."""
        with self._cond:
            return self._deadline

    def _interval(self) -> float:
        return self._fixed_interval or self.ttl_ms / 3000.0

    def start(self) -> KeepAlive:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stops renewing (promptly: an in-flight renewal is interrupted)."""
        with self._cond:
            self._stopping.set()
            self._cond.notify_all()
        self._client.close()
        if self._started:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join(timeout)

    def __enter__(self) -> KeepAlive:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _mark_lost(self, reason: str) -> None:
        with self._cond:
            if self._lost_marked or self._stopping.is_set():
                return
            self._lost_marked = True
            self.reason = reason
            self._cond.notify_all()
        self._client.close()  # a hung renewal has nothing left to save
        # The callback runs before ``lost`` is set, so whoever waits on ``lost``
        # knows the callback (e.g. stopping the child) has already happened.
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception as exc:  # the callback's failure must not kill the watcher
                self.last_error = exc
        self.lost.set()

    def _watch(self) -> None:
        with self._cond:
            while not self._stopping.is_set() and not self._lost_marked:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._stopping.is_set() or self._lost_marked:
                return
        self._mark_lost(
            f"lease {self.lease} could not be renewed before its deadline "
            f"({self.ttl_ms} ms after the last confirmed renewal)"
        )

    def _renew_loop(self) -> None:
        next_at = self._confirmed_at + self._interval()
        while not self._stopping.is_set() and not self._lost_marked:
            wait = next_at - time.monotonic()
            if wait > 0 and self._stopping.wait(wait):
                return
            sent = time.monotonic()
            left = self.deadline - sent
            if left <= 0:
                return  # the watcher reports it
            try:
                ttl = self._client.keepalive(self.lease, timeout=left)
            except LeaseLost as exc:
                self._mark_lost(exc.message)
                return
            except (DlmError, ValueError) as exc:
                self.last_error = exc
                next_at = time.monotonic() + min(self._interval() / 4, 0.25)
                continue
            with self._cond:
                self.ttl_ms = ttl
                self._deadline = max(self._deadline, sent + ttl / 1000.0)
                self.renewals += 1
                self._cond.notify_all()
            next_at = sent + self._interval()
