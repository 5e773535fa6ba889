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

With a ``secret``, each connection does the handshake of dlm/auth.py (the hello,
the member's proof checked, our proof) before its first request, and seals and
opens every frame after. With ``tls`` (an ssl.SSLContext, dlm/tls.py), the
socket is wrapped before the hello; ``socket`` and ``ssl`` are loaded then, and
only then. A failure of either raises AuthFailed (the `dlm` command's exit 78):
the configuration must change, so no other member is tried.
"""

from __future__ import annotations

import _socket
import select
import signal
import threading
import time
from collections import deque
from functools import partial

from dlm.client import core
from dlm.client.clock import RECHECK_S, lease_clock
from dlm.client.core import (
    AwaitGrant,
    ConnectionBroken,
    Failed,
    Grant,
    Lease,
    LeaseRef,
    ReleaseOutcome,
    Send,
    Sleep,
    lease_id,
    without_id,
)
from dlm.client.errors import AuthFailed, ClusterUnavailable, DlmError, LeaseLost, ServerError
from dlm.wire import (
    PEER_FRAME_LIMIT,
    AuthChange,
    AuthList,
    FrameDecoder,
    Hello,
    HelloRole,
    MemberAdd,
    MemberPromote,
    MemberRemove,
    Ping,
    ProtocolError,
    SnapshotHeader,
    Status,
    encode_frame,
    format_addr,
    parse_addr,
)

# typing and random stay off the import path of `dlm acquire` (see wire.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
    from types import TracebackType
    from typing import Any

    from dlm.client.core import Action, Outcome
    from dlm.client.watching import Leadership, WatchEvent, WatchStream
    from dlm.views import LeaseState, LeaseSummary, LockState, MembersView, StatusView

# Replies (a long ``list``) may be bigger than the 64 KiB a client may send.
REPLY_FRAME_LIMIT = PEER_FRAME_LIMIT
_RECV_CHUNK = 65536


_HANDLED_SIGNALS = frozenset(
    {
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGCHLD,
        signal.SIGALRM,
        signal.SIGUSR1,
        signal.SIGUSR2,
    }
)
"""Signals that only the main thread receives while a KeepAlive runs."""


class _Connection:
    """One TCP connection to one member, after a completed hello."""

    def __init__(self, addr: str, sock: _socket.socket, *, tls: bool = False) -> None:
        self.addr = addr
        self.sock = sock
        self.node = ""
        self.partitions: int | None = None  # as the greeting says (None: none yet, or garbled)
        self.partition: int | None = None  # the partition the greeting names (0 unnamed)
        self.version: int | None = None  # the protocol version the welcome negotiated
        self._tls = tls
        self.greeting: dict[Any, Any] | None = None
        """The member's welcome, when the handshake has already read it."""
        self._framed = False  # a whole frame has come in: it is a dlm member at least
        self.via_gateway = False  # the first frame was a gateway's notice (dlm gateway)
        self._decoder = FrameDecoder(REPLY_FRAME_LIMIT)
        self._sealer: Any = None
        self._frames: deque[Any] = deque()
        self._pushes: list[dict[Any, Any]] = []
        self._ids = core.RequestIds()

    @classmethod
    def open(
        cls,
        addr: str,
        deadline: float,
        secret: bytes | None = None,
        tls: Any = None,
        partition: int = 0,
        *,
        trace: str | None = None,
    ) -> tuple[_Connection, dict[Any, Any]]:
        """Connects and says hello; returns the connection and the member's greeting."""
        conn = cls.start(addr, deadline, secret, tls, partition, trace=trace)
        try:
            greeting = conn.greeting or conn.read(deadline)
        except BaseException:
            conn.close()
            raise
        if greeting is None:
            conn.close()
            raise ConnectionBroken("no greeting")
        conn.greeted(greeting)
        return conn, greeting

    @classmethod
    def start(
        cls,
        addr: str,
        deadline: float,
        secret: bytes | None = None,
        tls: Any = None,
        partition: int = 0,
        *,
        trace: str | None = None,
    ) -> _Connection:
        """Connects and sends the hello, without waiting for the greeting.

        ``trace``: the caller's trace context, sent in the hello (members ignore it; a
        gateway on the way makes its routing span a child of it).

        ``partition`` > 0: the connection is for that partition's group on the member;
        its preamble (dlm/partitioning.py) goes first, on the bare socket, before TLS
        and the hello, for the member's supervisor to hand the connection on.

        A request may follow at once: the member reads frames in order, so it
        answers the hello first and the request after, and a run saves a round
        trip. If it refuses the hello, the refusal comes back as the reply.
        With a secret the greeting is awaited (its proof comes first), and the
        request follows our proof; a refusal still comes back as the reply.
        """
        dial, member, _ = core.split_route(addr)
        host, port = parse_addr(dial)
        # getaddrinfo encodes a str host with the idna codec, whose import (with
        # stringprep and unicodedata) costs ~1 ms a run; an ASCII name needs no encoding.
        target: Any = host.encode("ascii") if host.isascii() else host
        try:
            sock = _connect(target, port, max(0.001, _left(deadline)))
        except TimeoutError:
            raise ConnectionBroken("connect timed out") from None
        except OSError as exc:
            raise ConnectionBroken(exc.strerror or str(exc)) from None
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        if partition or member is not None:
            _send_preamble(sock, partition, deadline, member)
        if tls is not None:
            # Through a gateway to a named member, that member's name is the one to verify.
            name = host if member is None else parse_addr(member)[0]
            sock = _wrap_tls(sock, tls, name, addr, deadline)
        conn = cls(addr, sock, tls=tls is not None)
        try:
            if secret is None:
                conn.send(Hello(role=HelloRole.CLIENT, trace=trace).to_wire(), deadline)
            else:
                conn._authenticate(secret, deadline, trace)
        except BaseException:
            conn.close()
            raise
        return conn

    def _authenticate(self, secret: bytes, deadline: float, trace: str | None = None) -> None:
        """The client's side of the handshake; AuthFailed if the member cannot prove the
        secret. A member's refusal (an error frame) is left to be read as the reply."""
        from dlm.auth import AuthError, client_initiator, new_nonce

        initiator = client_initiator(secret, new_nonce())
        hello = Hello(role=HelloRole.CLIENT, trace=trace).to_wire()
        self.send({**hello, **initiator.hello_fields()}, deadline)
        greeting = self.read(deadline)
        if greeting is None:
            raise ConnectionBroken("no greeting in time")
        if greeting.get("t") != "welcome":
            self._frames.appendleft(greeting)
            return
        try:
            auth_frame = initiator.check_welcome(greeting)
        except AuthError as exc:
            raise core.proof_failed(self.addr, str(exc)) from None
        if self._frames or self._decoder.pending:
            raise ConnectionBroken("the member sent frames before the handshake ended")
        self.greeted(greeting)
        self.greeting = greeting
        self.send(auth_frame, deadline)
        self._sealer, opener = initiator.keys()
        self._decoder = FrameDecoder(REPLY_FRAME_LIMIT, opener)

    @property
    def framed(self) -> bool:
        """Has the member sent a whole frame (a greeting at least) on this connection?"""
        return self._framed or self.greeting is not None

    def greeted(self, greeting: dict[Any, Any]) -> None:
        node = greeting.get("node")
        self.node = node if isinstance(node, str) else ""
        if greeting.get("t") == "welcome":
            self.partitions, self.partition = core.greeting_partitions(greeting)
            self.version = core.greeting_version(greeting)

    def await_greeting(self, deadline: float) -> None:
        """Reads the member's welcome when it has not come in yet (a request that depends
        on the negotiated version waits for it). Any other frame (a refusal of the hello)
        is kept to be read as the reply."""
        while self.version is None:
            frame = self.read(deadline)
            if frame is None:
                return
            if frame.get("t") == "welcome" and "id" not in frame:
                self.greeted(frame)
                if self.version is None:
                    return  # a garbled version: treated as an older member
            else:
                self._frames.appendleft(frame)
                return

    def send(self, obj: Any, deadline: float) -> None:
        data = encode_frame(obj, self._sealer)
        try:
            self.sock.settimeout(max(0.001, _left(deadline)))
            self.sock.sendall(data)
        except TimeoutError:
            raise ConnectionBroken("send timed out") from None
        except OSError as exc:
            raise ConnectionBroken(exc.strerror or str(exc)) from None

    def read(self, deadline: float) -> dict[Any, Any] | None:
        """The next frame, or None at the deadline."""
        while not self._frames:
            left = _left(deadline)
            if left <= 0:
                return None
            try:
                if self._tls:
                    # TLS may hold decrypted bytes the socket no longer shows as readable:
                    # a blocking read with a timeout, not select.
                    self.sock.settimeout(left)
                    data = self.sock.recv(_RECV_CHUNK)
                else:
                    readable, _, _ = select.select([self.sock], [], [], left)
                    if not readable:
                        return None
                    self.sock.settimeout(0.0)
                    data = self.sock.recv(_RECV_CHUNK)
            except (BlockingIOError, TimeoutError):
                continue
            except (OSError, ValueError) as exc:  # ValueError: the fd was closed under us
                raise ConnectionBroken(str(exc) or "connection failed") from None
            if not data:
                if not self._framed and not self._tls:
                    # A member serving TLS drops a plain hello without a word.
                    raise ConnectionBroken(
                        "connection closed by the member before it answered (if the cluster "
                        "serves TLS, set --tls-ca/DLM_TLS_CA)"
                    )
                raise ConnectionBroken("connection closed by the member")
            self._decoder.feed(data)
            try:
                self._frames.extend(self._decoder.frames())
                if not self._framed and self._frames and core.is_gateway_notice(self._frames[0]):
                    # A gateway's first frame, before any of the member's: not a reply.
                    self._frames.popleft()
                    self.via_gateway = self._framed = True
            except ProtocolError as exc:
                if not self._framed:
                    # The first bytes are not a frame: some other server listens there
                    # (an HTTP server's "HTTP" reads as a length of 1213486160).
                    raise ConnectionBroken(
                        f"{core.NOT_A_MEMBER} (it answered something else)"
                    ) from None
                raise ConnectionBroken(f"bad frame: {exc}") from None
            self._framed = self._framed or bool(self._frames)
        frame = self._frames.popleft()
        if not isinstance(frame, dict):
            raise ConnectionBroken("frame is not a map")
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
            # A member closes a connection that stays silent for two minutes: ping while
            # waiting (the answer is read, and dropped, like any reply nobody waits for).
            slice_end = min(deadline, time.monotonic() + core.PING_EVERY_S)
            frame = self.read(slice_end)
            if frame is None:
                if slice_end >= deadline:
                    return None
                self.send({**core.ping_request(), "id": self._ids.next()}, deadline)
                continue
            if frame.get("t") == "grant" and "id" not in frame:
                self._pushes.append(frame)
            elif frame.get("t") == "error" and "id" not in frame:
                raise ConnectionBroken(f"member closed the connection: {frame.get('code')}")

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


def _send_preamble(
    sock: _socket.socket, partition: int, deadline: float, member: str | None = None
) -> None:
    """The partition's preamble, or (through a gateway, to a named member) the target
    preamble (dlm/partitioning.py)."""
    from dlm.partitioning import preamble, target_preamble

    try:
        sock.settimeout(max(0.001, _left(deadline)))
        sock.sendall(preamble(partition) if member is None else target_preamble(partition, member))
    except TimeoutError:
        sock.close()
        raise ConnectionBroken("send timed out") from None
    except OSError as exc:
        sock.close()
        raise ConnectionBroken(exc.strerror or str(exc)) from None


def _wrap_tls(raw: _socket.socket, context: Any, host: str, addr: str, deadline: float) -> Any:
    """``raw`` after a TLS handshake that verified the member's certificate against the CA
    and ``host``; AuthFailed if it could not be verified or TLS failed, ConnectionBroken if the
    connection did."""
    import socket
    import ssl

    sock = socket.socket(raw.family, raw.type, raw.proto, fileno=raw.detach())
    sock.settimeout(max(0.001, _left(deadline)))
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise core.tls_failed(addr, exc.verify_message or str(exc), verifying=True) from None
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        sock.close()
        raise ConnectionBroken("connection closed during the TLS handshake") from None
    except ssl.SSLError as exc:
        sock.close()
        raise core.tls_failed(addr, _ssl_reason(exc), verifying=False) from None
    except TimeoutError:
        sock.close()
        raise ConnectionBroken("TLS handshake timed out") from None
    except OSError as exc:
        sock.close()
        raise ConnectionBroken(exc.strerror or str(exc)) from None


def _ssl_reason(exc: Any) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason).replace("_", " ").lower() if reason else str(exc)


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
        secret: bytes | None = None,
        tls: Any = None,
    ) -> None:
        """``dial_timeout``: give a call up once this long has passed without any member
        answering at all (None: keep trying for the whole ``timeout``). ``secret``: the
        cluster's client secret (dlm.auth.load_secret), when its members require one.
        ``tls``: an ssl.SSLContext (dlm.tls.client_context) to connect with TLS."""
        self.members = core.parse_members(members)
        self.timeout = timeout
        self._secret = secret
        self._tls = tls
        self._rng = rng
        start = rng.randrange(len(self.members)) if rng is not None else 0
        self._ctx = core.Context(
            members=self.members,
            router=core.Router(self.members, start),
            backoff=core.Backoff(rng),
            clock=lease_clock,
            timeout=timeout,
            attempt_timeout=attempt_timeout or core.default_attempt_timeout(timeout),
            dial_timeout=dial_timeout,
        )
        self._lock = threading.RLock()
        # One connection per partition, to the address its router chose last: a cluster
        # of P partitions has P leaders, often on different members.
        self._conns: dict[int, _Connection] = {}
        self._closed = False
        self._wake = threading.Event()
        self._ttl_ms: dict[str, int] = {}
        # Shared with the clients this one spawns: a KeepAlive renews from a spawned
        # client, and must hear of a TTL update sent through this one.
        self._watchers = core.LeaseWatchers()
        # The leases opened through this family of clients and their parts (one per
        # partition that holds a key of the lease), shared with spawned clients too.
        self._book = core.LeaseBook()

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
        """Closes the connections; a call blocked in another thread fails promptly."""
        self._closed = True
        self._wake.set()
        for conn in list(self._conns.values()):
            conn.interrupt()
        if self._lock.acquire(timeout=5.0):
            try:
                self._drop_connections()
            finally:
                self._lock.release()

    @property
    def _conn(self) -> _Connection | None:
        """Partition 0's connection (the only one in a cluster of one partition)."""
        return self._conns.get(0)

    @property
    def connected_to(self) -> str | None:
        conn = self._conn
        return conn.addr if conn is not None else None

    @property
    def partitions(self) -> int:
        """How many partitions the cluster has, as far as this client has learned (1
        until a member said otherwise)."""
        return self._ctx.partitions

    @property
    def client_id(self) -> str:
        """This client's id: the cluster tells its requests from other clients' by it."""
        return self._ctx.client

    @property
    def trace(self) -> str | None:
        """The trace context (W3C traceparent) its lock and lease requests carry, so that
        the members' spans of them join the caller's trace (dlm.tracing); None: none."""
        return self._ctx.trace

    @trace.setter
    def trace(self, traceparent: str | None) -> None:
        if traceparent is not None:
            from dlm.wire import traceparent_problem

            problem = traceparent_problem(traceparent)
            if problem is not None:
                raise ValueError(problem)
        self._ctx.trace = traceparent

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
            attempt_timeout=self._ctx.attempt_timeout,
            dial_timeout=self._ctx.dial_timeout,
            secret=self._secret,
            tls=self._tls,
        )
        child._ctx.router.preferred = self._ctx.router.preferred
        child._ctx.partitions = self._ctx.partitions
        child._ctx.trace = self._ctx.trace
        child._ctx.routers = {p: router.copy() for p, router in self._ctx.routers.items()}
        child._ttl_ms = dict(self._ttl_ms)
        child._watchers = self._watchers
        child._book = self._book
        return child

    # -- leases ---------------------------------------------------------------

    def open_lease(
        self,
        ttl_ms: int | None,
        lease: str | None = None,
        *,
        ephemeral: bool = False,
        meta: Mapping[str, str] | None = None,
        lock_delay_ms: int = 0,
        near: Sequence[str] = (),
    ) -> Lease:
        """Opens a lease (a fresh random id unless ``lease`` is given).

        ``ttl_ms`` None: the cluster's default-ttl (30 s unless `dlm config set
        default-ttl` changed it; 30 s from a member older than protocol version 5); the
        Lease returned names the TTL it got.
        ``ephemeral``: the lease is for one lock, and a release that leaves it
        idle ends it (what ``dlm acquire`` does). ``lock_delay_ms`` (0 to 60000): when
        the lease expires or is revoked while holding a key, the key is granted to nobody
        for that long (README, "Lock-delay"; cluster version 4). ``near``: the keys the
        new lease is for; it is opened in the partition of the first (in the global
        acquire order), so it has no part where it holds nothing (``core.open_near_flow``).
        """
        flow = (
            core.open_near_flow(
                self._ctx,
                ttl_ms,
                near,
                ephemeral=ephemeral,
                meta=meta,
                lock_delay_ms=lock_delay_ms,
            )
            if near and lease is None
            else core.open_lease_flow(
                self._ctx,
                ttl_ms,
                lease,
                ephemeral=ephemeral,
                meta=meta,
                lock_delay_ms=lock_delay_ms,
            )
        )
        opened: Lease = self._run(flow)
        self._ttl_ms[opened.id] = opened.ttl_ms
        self._book.opened(opened, ephemeral=ephemeral, meta=meta, lock_delay_ms=lock_delay_ms)
        return opened

    def keepalive(self, lease: LeaseRef, *, timeout: float | None = None) -> int:
        """Renews the lease (every part of it, in each partition that holds its keys);
        returns its TTL in ms (the shortest of the parts'). LeaseLost if it (any part of
        it) is gone, ClusterUnavailable if a part could not be reached."""
        lid = lease_id(lease)
        renewed = self.renew_parts(lease, timeout=timeout)
        if not renewed.whole:
            raise ClusterUnavailable(
                f"lease {lid}: a partition that holds part of it could not be reached "
                f"(renewed in partitions {sorted(renewed.ttls)} only)"
            )
        ttl = min(renewed.ttls.values())
        self._ttl_ms[lid] = ttl
        return ttl

    def renew_parts(self, lease: LeaseRef, *, timeout: float | None = None) -> core.PartsRenewed:
        """One renewal round of every part of the lease (``core.renew_parts_flow``): the
        TTL each part confirmed; a part out of reach is left out. LeaseLost if a part is
        gone (the others are closed first)."""
        lid = lease_id(lease)
        if isinstance(lease, Lease) and self._book.get(lid) is None:
            self._book.opened(lease)
        renewed: core.PartsRenewed = self._run(
            core.renew_parts_flow(self._ctx, self._book, lid, timeout=timeout)
        )
        return renewed

    def close_lease(
        self,
        lease: LeaseRef,
        *,
        must_exist: bool = False,
        run: core.RunEnd | None = None,
        revoke: bool = False,
    ) -> list[str]:
        """Ends the lease and releases its locks; returns the keys it held.

        A lease that is already gone counts as closed, unless ``must_exist``
        (revoking someone's lease by id): then LeaseLost. ``run``: how the run of its
        grant ended, for the run ledger (``core.RunEnd``).
        """
        lid = lease_id(lease)
        released: list[str] = self._run(
            core.close_all_flow(
                self._ctx, self._book, lid, must_exist=must_exist, run=run, revoke=revoke
            )
        )
        self._ttl_ms.pop(lid, None)
        return released

    def update_lease(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        *,
        finished: bool = False,
        timeout: float | None = None,
        run: core.RunEnd | None = None,
    ) -> int:
        """Gives the lease a new TTL, counted from now (``finished``: its command ended).
        ``timeout``: how long to keep trying (default: the client's).

        Every KeepAlive of this lease made from this client (or one it spawned) hears
        of it before it is sent: a shorter TTL lowers its deadline at once, whatever
        becomes of the update, and sets the pace of its renewals."""
        lid = lease_id(lease)
        flow = core.update_parts_flow(
            self._ctx, self._book, lid, ttl_ms, finished=finished, timeout=timeout, run=run
        )
        tickets = [(w, w.update_sent(ttl_ms)) for w in self._watchers.of(lid)]
        try:
            ttl: int = self._run(flow)
        except BaseException as exc:
            applied = core.update_applied(exc)
            for watcher, ticket in tickets:
                watcher.update_settled(ticket, None, applied=applied)
            raise
        for watcher, ticket in tickets:
            watcher.update_settled(ticket, ttl, applied=True)
        self._ttl_ms[lid] = ttl
        return ttl

    def lease_info(self, lease: LeaseRef) -> LeaseState:
        """The lease's TTL, the time left (the leader's count), and the keys it holds and
        waits for."""
        info: LeaseState = self._run(core.lease_info_flow(self._ctx, lease_id(lease), self._book))
        return info

    def list_leases(self, *, stale: bool = False) -> list[LeaseSummary]:
        """Every live lease (paged through, however many)."""
        leases: list[LeaseSummary] = self._run(core.list_leases_flow(self._ctx, stale=stale))
        return leases

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
        if isinstance(lease, Lease) and self._book.get(lid) is None:
            self._book.opened(lease)
        flow = core.lease_acquire_flow(
            self._ctx,
            self._book,
            lid,
            key,
            wait=wait,
            limit=limit,
            meta=meta,
            known_ttl_ms=known_ttl,
        )
        grant: Grant = self._run(flow)
        return grant

    def acquire_all(
        self,
        lease: LeaseRef,
        keys: Sequence[str],
        *,
        wait: float | None = None,
        limit: int = 1,
        meta: Mapping[str, str] | None = None,
    ) -> list[Grant]:
        """Takes every key of ``keys`` under ``lease``, all or nothing, in the one global
        order (partitions ascending, keys sorted in each: two clients after overlapping
        keys cannot deadlock); ``wait`` is one budget for them all. LockHeld (after
        releasing what it took) when a key cannot be had. Grants in the order taken."""
        lid = lease_id(lease)
        known_ttl = lease.ttl_ms if isinstance(lease, Lease) else self._ttl_ms.get(lid)
        if isinstance(lease, Lease) and self._book.get(lid) is None:
            self._book.opened(lease)
        flow = core.acquire_all_flow(
            self._ctx,
            self._book,
            lid,
            keys,
            wait=wait,
            limit=limit,
            meta=meta,
            known_ttl_ms=known_ttl,
        )
        grants: list[Grant] = self._run(flow)
        return grants

    def release(
        self,
        lease: LeaseRef,
        key: str,
        *,
        token: int | None = None,
        keep_lease: bool = True,
    ) -> ReleaseOutcome:
        """Releases ``key`` (or leaves its queue). NotHolder if this lease has neither, or
        holds it under another token than ``token``. ``keep_lease=False`` ends an
        ephemeral lease that the release leaves idle."""
        lid = lease_id(lease)
        flow = core.release_flow(self._ctx, lid, key, token=token, keep_lease=keep_lease)
        released: ReleaseOutcome = self._run(flow)
        if released.lease_ended:
            # The release ended the lease's part in the key's partition: end the rest.
            self._run(core.parts_ended_flow(self._ctx, self._book, lid, key))
        return released

    def campaign(
        self, lease: LeaseRef, name: str, value: str = "", *, wait: float | None = None
    ) -> Grant:
        """Campaigns for election ``name`` (the lock key ``name``) under ``lease``, which the
        caller keeps alive: queues FIFO (``wait`` as for ``acquire``) and returns the grant
        once it leads, its token the leadership epoch; ``value`` is what ``leader`` shows."""
        grant: Grant = self.acquire(lease, name, wait=wait, meta={core.ELECTION_VALUE: value})
        return grant

    def resign(self, lease: LeaseRef, name: str) -> None:
        """Gives up leading (or campaigning for) ``name``: a release, so the next candidate
        is elected at once (no lock-delay)."""
        self.release(lease, name, keep_lease=True)

    def proclaim(self, lease: LeaseRef, name: str, value: str) -> int:
        """Changes the value of election ``name`` without a new election, only while
        ``lease`` leads it (NotHolder otherwise); returns the unchanged token."""
        token: int = self._run(core.proclaim_flow(self._ctx, lease_id(lease), name, value))
        return token

    def leader(self, name: str) -> dict[str, Any]:
        """Who leads ``name`` now: ``{"name", "value", "token", "since", "index", "lease"}``
        (``value`` None while nobody leads; see ``core.leadership``)."""
        return core.leadership(name, self.get(name))

    def get(self, key: str, *, stale: bool = False) -> LockState:
        """Who holds ``key`` and who waits for it."""
        state: LockState = self._run(core.get_flow(self._ctx, key, stale=stale))
        return state

    def watch(
        self,
        key: str | None = None,
        *,
        prefix: str | None = None,
        after: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[WatchEvent]:
        """Every change of ``key`` (or of each key under ``prefix``), pushed by a member as
        it applies the log, in log order, from now (or after log index ``after``).

        Resumes on another member, after the last index it yielded, when the connection
        breaks or the member stops: nothing is lost or repeated within the members'
        window (else WatchCompacted: re-read, then watch from now). ClusterUnavailable
        once no member served it for ``timeout`` seconds (default: the client's). Uses
        a connection of its own; closing the iterator closes it.

        A prefix in a cluster of P > 1 partitions is watched in every partition (one
        watch each, on its own connection and thread), and their changes come as they
        arrive: in log order within a partition (and so for each key), with no order
        between partitions, whose logs are apart. ``after`` is one partition's log
        index, so it goes with a key only there."""
        from dlm.client.watching import WatchStream

        budget = self.timeout if timeout is None else timeout
        if key is None and prefix is not None and self._learn_partitions(budget) > 1:
            if after is not None:
                raise core.prefix_after_refused(after, self._ctx.partitions)
            yield from self._watch_partitions(prefix, budget)
            return
        stream = WatchStream(key, prefix, after, budget)
        for event in self._watch(stream):
            if event is not None:
                yield event

    def _learn_partitions(self, timeout: float) -> int:
        """How many partitions the cluster has: as learned, or (no member reached yet) as
        the greeting of a ping says."""
        if not self._ctx.reached:
            self._run(core.read_flow(self._ctx, Ping(id=0), timeout=timeout))
        return self._ctx.partitions

    def _watch_partitions(self, prefix: str, timeout: float) -> Generator[WatchEvent]:
        """``prefix``'s changes in every partition, merged as they come: a thread per
        partition follows its watch (``_watch``) and queues each change; closing this
        generator stops them (each connection is shut down, and one opened later is
        closed at once)."""
        import queue

        from dlm.client.watching import WatchStream

        arrived: queue.Queue[WatchEvent | BaseException] = queue.Queue()
        stopped = threading.Event()
        guard = threading.Lock()
        current: dict[int, _Connection] = {}

        def opened(partition: int, conn: _Connection) -> None:
            with guard:
                if stopped.is_set():
                    raise _WatchStopped
                current[partition] = conn

        def follow(partition: int) -> None:
            stream = WatchStream(None, prefix, None, timeout)
            try:
                for event in self._watch(stream, partition, opened):
                    if stopped.is_set():
                        return
                    if event is not None:
                        arrived.put(event)
            except _WatchStopped:
                return
            except BaseException as exc:  # the watch's end (COMPACTED, unavailable, refused)
                arrived.put(exc)

        for partition in range(self._ctx.partitions):
            threading.Thread(
                target=follow, args=(partition,), name=f"dlm-watch-{partition}", daemon=True
            ).start()
        try:
            while True:
                item = arrived.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            with guard:
                stopped.set()
                for conn in current.values():
                    conn.interrupt()

    def _watch(
        self,
        stream: WatchStream,
        partition: int | None = None,
        opened: Callable[[int, _Connection], None] | None = None,
    ) -> Generator[WatchEvent | None]:
        """``watch``'s changes, and None each time a member starts serving it.

        ``partition``: the partition whose changes to watch; None: the watched key's
        (partition 0 for a prefix: a prefix's keys are in every partition, and each
        partition's watch is a stream of its own). ``opened(partition, connection)``
        hears of each connection the watch opens (to shut it down from another thread;
        an exception it raises ends the watch)."""
        import itertools

        from dlm.client.watching import WatchBroken

        members = list(self.members)
        ctx = self._ctx
        preferred = ctx.router_for(core.watch_partition(ctx, stream.key, partition)).preferred
        first = members.index(preferred) if preferred in members else 0
        attempt = ctx.attempt_timeout
        for tried in itertools.count(first):
            addr = members[tried % len(members)]
            conn: _Connection | None = None
            try:
                conn, greeting = _Connection.open(
                    addr,
                    time.monotonic() + attempt,
                    self._secret,
                    self._tls,
                    core.watch_partition(ctx, stream.key, partition),
                )
                if opened is not None:
                    opened(core.watch_partition(ctx, stream.key, partition), conn)
                reply = None
                if greeting.get("t") != "error":
                    ctx.learn_partitions(conn.partitions)
                    reply = conn.request(stream.request(), time.monotonic() + attempt)
                    if reply is not None and reply.get("code") == "WRONG_PARTITION":
                        # The key is another partition's: the next try goes there.
                        ctx.learn_partitions(reply.get("partitions"))
                if reply is not None and stream.started(reply, conn.node or addr):
                    yield None
                    watch_id = int(reply.get("id", -1))
                    ping_at = time.monotonic() + core.PING_EVERY_S
                    while True:
                        frame = conn.read(ping_at)
                        if frame is None:
                            # The member closes a connection that stays silent too long.
                            conn.send({**core.ping_request(), "id": 0}, ping_at + attempt)
                            ping_at = time.monotonic() + core.PING_EVERY_S
                            continue
                        yield from stream.take(frame, watch_id)
            except (ConnectionBroken, WatchBroken):
                pass
            finally:
                if conn is not None:
                    conn.close()
            time.sleep(stream.failed(time.monotonic(), len(members)))

    def observe(self, name: str, *, timeout: float | None = None) -> Iterator[Leadership]:
        """The leader of election ``name`` (the holder of lock key ``name`` and its
        value) now, then each change: a new leader, none, or a new value. Reads again
        when the watch's window was passed. As ``watch`` for ``timeout``."""
        from dlm.client.watching import Observer, WatchCompacted, WatchStream, leader_of

        observer = Observer(name)
        while True:
            stream = WatchStream(name, None, None, self.timeout if timeout is None else timeout)
            events = self._watch(stream)
            try:
                for event in events:
                    if event is None:
                        if observer.now is None:
                            # The watch runs: a read now sees at least what it starts after.
                            yield observer.start(*leader_of(self.get(name)), stream.last or 0)
                        continue
                    said = observer.change(event)
                    if said is not None:
                        yield said
            except WatchCompacted:
                observer.now = None
            finally:
                events.close()

    def list_locks(self, prefix: str = "", *, stale: bool = False) -> list[LockState]:
        """Every held lock whose key starts with ``prefix`` (paged through, however many)."""
        locks: list[LockState] = self._run(core.list_locks_flow(self._ctx, prefix, stale=stale))
        return locks

    # -- cluster --------------------------------------------------------------

    def status(self, *, stale: bool = False, partition: int = 0) -> StatusView:
        """The answering member's view of the cluster: of ``partition``'s group (each
        partition of a partitioned cluster has its own leader, term and log)."""
        flow = core.status_flow(self._ctx, stale=stale, partition=partition)
        view: StatusView = self._run(flow)
        return view

    def members_view(self, *, partition: int = 0) -> MembersView:
        """The leader's view of the membership: ``members`` and ``leader`` (of ``partition``'s
        group, in a partitioned cluster)."""
        view: MembersView = self._run(core.members_flow(self._ctx, partition=partition))
        return view

    def add_member(self, member: str, address: str, *, partition: int = 0) -> MembersView:
        request = MemberAdd(id=0, member=member, address=address, seq=0)
        view: MembersView = self._run(
            core.member_change_flow(self._ctx, request, partition=partition)
        )
        return view

    def remove_member(self, member: str, *, force: bool = False, partition: int = 0) -> MembersView:
        request = MemberRemove(id=0, member=member, force=force, seq=0)
        view: MembersView = self._run(
            core.member_change_flow(self._ctx, request, partition=partition)
        )
        return view

    def auth_change(self, request: AuthChange, *, partition: int = 0) -> dict[str, Any]:
        """Adds, removes or rotates an identity (an admin's request; ``request`` is a wire
        ``auth_*`` request with id 0): the cluster's answer, ``op`` and ``name``. In a
        partitioned cluster each partition keeps its own copy: ``partition`` names the
        one to change (`dlm auth` changes every one in turn)."""
        answer: dict[str, Any] = self._run(core.read_flow(self._ctx, request, partition=partition))
        return answer

    def runs(
        self, key: str | None = None, *, prefix: str = "", stale: bool = False
    ) -> list[dict[str, Any]]:
        """The run ledger: ``key``'s runs newest first, or the last run of every key."""
        rows: list[dict[str, Any]] = self._run(
            core.runs_flow(self._ctx, key, prefix=prefix, stale=stale)
        )
        return rows

    def identities(self) -> list[dict[str, Any]]:
        """The cluster's identities (an admin's request): names, roles, prefixes, key ids."""
        answer = self._run(core.read_flow(self._ctx, AuthList(id=0)))
        rows = answer.get("identities")
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    def promote_member(self, member: str, *, partition: int = 0) -> MembersView:
        request = MemberPromote(id=0, member=member, seq=0)
        view: MembersView = self._run(
            core.member_change_flow(self._ctx, request, partition=partition)
        )
        return view

    def save_snapshot(
        self, *, image_timeout: float = 600.0, partition: int = 0
    ) -> tuple[SnapshotHeader, bytes]:
        """A backup from the leader (``dlm snapshot save``): the header, and the image of
        the replicated state at the header's committed index. The image arrives in chunks
        after the header; each must come within ``image_timeout`` of the last (the first
        waits for the leader to build the image). In a partitioned cluster, the image of
        ``partition`` from its leader."""
        reply = self._run(core.snapshot_save_flow(self._ctx, partition=partition))[1]
        header = core.read_reply(SnapshotHeader, reply)
        rid = reply.get("id")
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise ServerError("BAD_REPLY", "the backup header has no request id")
        assembly = core.ImageAssembly(rid)
        with self._lock:
            conn = self._conns.get(partition)
            if conn is None:
                raise ClusterUnavailable("the connection closed before the image came")
            try:
                while not assembly.done:
                    frame = conn.read(time.monotonic() + image_timeout)
                    if frame is None:
                        raise ClusterUnavailable(
                            f"no part of the image came within {image_timeout:g}s"
                        )
                    assembly.take(frame)  # a grant push or a late reply is passed over
            except ConnectionBroken as exc:
                self._drop_connection(partition)
                raise ClusterUnavailable(f"the connection broke during the image: {exc}") from None
            except BaseException:
                self._drop_connection(
                    partition
                )  # the rest of the image must not meet a later request
                raise
        return header, assembly.image()

    def ping(self) -> bool:
        """Tells the members these idle connections (one per partition) are still wanted;
        False if there is none, or one did not answer (nothing is opened for it)."""
        with self._lock:
            if not self._conns:
                return False
            answered = True
            for partition, conn in list(self._conns.items()):
                try:
                    reply = conn.request(core.ping_request(), time.monotonic() + 2.0)
                except ConnectionBroken:
                    reply = None
                if reply is None or reply.get("t") != "ok":
                    self._drop_connection(partition)
                    answered = False
            return answered

    def member_status(
        self, addr: str, timeout: float = 2.0, *, partition: int = 0
    ) -> StatusView | None:
        """Asks one member directly for its own (stale) view of ``partition``'s group; None
        if it does not answer (or answers with something that is not a status)."""
        deadline = time.monotonic() + timeout
        try:
            conn, greeting = _Connection.open(
                self._ctx.member_route(format_addr(*parse_addr(addr))),
                deadline,
                self._secret,
                self._tls,
                partition,
            )
        except (ConnectionBroken, ValueError, AuthFailed):
            return None
        try:
            if greeting.get("t") != "welcome":
                return None
            reply = conn.request(without_id(Status(id=0, stale=True)), deadline)
        except ConnectionBroken:
            return None
        finally:
            conn.close()
        return core.own_view(reply)

    # -- keeping a lease alive --------------------------------------------------

    def keep_alive(
        self,
        lease: LeaseRef,
        *,
        confirmed_at: float | None = None,
        ttl_ms: int | None = None,
        on_lost: Callable[[str], None] | None = None,
        interval: float | None = None,
        deadline_of: Callable[[float, int], float] | None = None,
        on_renewed: Callable[[float, int], None] | None = None,
    ) -> KeepAlive:
        """A KeepAlive of ``lease`` from this client, started by ``with`` (or ``start``):
        ``with client.keep_alive(lease) as keeper:``, as the async client's."""
        return KeepAlive(
            self,
            lease,
            confirmed_at=confirmed_at,
            ttl_ms=ttl_ms,
            on_lost=on_lost,
            interval=interval,
            deadline_of=deadline_of,
            on_renewed=on_renewed,
        )

    # -- the driver -------------------------------------------------------------

    def _run(self, flow: core.Flow) -> Any:
        with self._lock:
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
            conn = self._conns.get(action.partition)
            if conn is None or conn.addr != action.addr:
                return Failed("connection lost while waiting")
            try:
                return conn.await_grant(action.lease, action.key, deadline)
            except ConnectionBroken as exc:
                self._drop_connection(action.partition)
                return Failed(str(exc))
        return self._send(action, deadline)

    def _send(self, action: Send, deadline: float) -> Outcome:
        partition = action.partition
        conn = self._conns.get(partition)
        if conn is None or conn.addr != action.addr:
            self._drop_connection(partition)
            try:
                conn = _Connection.start(
                    action.addr, deadline, self._secret, self._tls, partition, trace=self._ctx.trace
                )
            except ConnectionBroken as exc:
                return Failed(str(exc))
            self._conns[partition] = conn
        if action.drop_pushes_for is not None:
            conn.drop_pushes(*action.drop_pushes_for)
        try:
            request = action.request
            if core.leaves_ttl_to_cluster(request):
                conn.await_greeting(deadline)
                request = core.for_member(request, conn.version)
            reply = conn.request(request, deadline)
        except ConnectionBroken as exc:
            self._drop_connection(partition)
            return Failed(str(exc))
        if reply is None:
            # A late reply would be confusing on a reused connection: start afresh.
            self._drop_connection(partition)
            if not conn.framed:
                return Failed(core.NOT_A_MEMBER)  # not even a greeting came back
            return Failed(f"no reply within {action.timeout:.3g}s")
        self._ctx.learn_partitions(conn.partitions)
        if conn.via_gateway:
            self._ctx.gateways.add(core.split_route(conn.addr)[0])
            if core.redial_through_gateway(reply):
                # The gateway chose that member: a new connection lets it choose again.
                self._drop_connection(partition)
        if conn.partition is not None and conn.partition != partition:
            # The member's supervisor handed us to another partition's group than the
            # preamble named: nothing it answers on this connection can be trusted.
            self._drop_connection(partition)
            return Failed(f"answered for partition {conn.partition}, not {partition}")
        if reply.get("t") == "error" and "id" not in reply:
            self._drop_connection(partition)
        return reply

    def _drop_connection(self, partition: int = 0) -> None:
        conn = self._conns.pop(partition, None)
        if conn is not None:
            conn.close()

    def _drop_connections(self) -> None:
        for partition in list(self._conns):
            self._drop_connection(partition)


class _WatchStopped(Exception):
    """A partition's watch of a prefix watched in every partition was closed."""


class KeepAlive:
    """Renews a lease in the background and says when it can no longer be trusted.

    The client-side deadline is (when the last *confirmed* renewal was sent, on
    ``dlm.client.clock.lease_clock``, which runs on while the host is suspended)
    + TTL, less a margin for clock rates (``core.lease_deadline``); the first one
    counts from ``confirmed_at``, when the open_lease or acquire was sent.
    ``deadline_of(sent, ttl_ms)`` may set it earlier (dlm exec gives up at the
    moment it must stop its command). The rules are ``core.LeaseClock``'s: a TTL
    update sent through ``client`` (or a client spawned from it) lowers the
    deadline the moment it is sent, and a reply to a renewal sent before it moves
    nothing. A renewal is attempted about every TTL/3 (of the shortest TTL the
    leader may be using) from a daemon thread with its own connection; a second
    thread watches the deadline with a timer (waking at least every ``RECHECK_S``),
    so a renewal that hangs (members SIGSTOPped) cannot delay the verdict.
    ``lost`` is set, and ``on_lost(reason)`` called once, on SESSION_EXPIRED or
    when the deadline passes unconfirmed. A renewal confirmed after the deadline
    counts for nothing. ``on_renewed(sent, ttl_ms)`` is called after each renewal
    that counted, from the renewing thread, with the TTL it counts with (capped
    by any update it may predate).
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
        deadline_of: Callable[[float, int], float] | None = None,
        on_renewed: Callable[[float, int], None] | None = None,
    ) -> None:
        if isinstance(lease, Lease):
            ttl_ms = lease.ttl_ms if ttl_ms is None else ttl_ms
            confirmed_at = lease.confirmed_at if confirmed_at is None else confirmed_at
        if ttl_ms is None or ttl_ms <= 0:
            raise ValueError("KeepAlive needs the lease's ttl_ms")
        if confirmed_at is None:
            raise ValueError("KeepAlive needs confirmed_at: when the lease was last confirmed")
        self.lease = lease_id(lease)
        self.lost = threading.Event()
        self.reason: str | None = None
        self.last_error: BaseException | None = None
        self._watchers = client._watchers
        if isinstance(lease, Lease) and client._book.get(lease.id) is None:
            client._book.opened(lease)
        self._book = client._book
        self._client = client.spawn()
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        # One clock per part of the lease (a partition that holds its keys); the lease's
        # deadline is the earliest. Parts opened later (by any client of the family) join
        # as soon as the book has them: their deadline counts from their open's send.
        known = self._book.parts(self.lease)
        self._clock = core.PartClocks(
            ttl_ms,
            confirmed_at,
            deadline_of or core.lease_deadline,
            parts=None if known is None else sorted(known),
            opened=partial(self._book.parts, self.lease),
        )
        self._renewer = core.Renewer(self._clock, lease_clock(), interval=interval)
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
    def renewals(self) -> int:
        """Renewals that moved the deadline."""
        return self._renewer.renewals

    @property
    def deadline(self) -> float:
        """When (``lease_clock``) the lease must be presumed lost."""
        with self._cond:
            return self._clock.deadline

    @property
    def confirmed_at(self) -> float:
        """When (``lease_clock``) the last renewal that counted was sent."""
        with self._cond:
            return self._clock.last_sent

    @property
    def ttl_ms(self) -> int:
        """The shortest TTL the leader may be counting the lease with (renewals pace by it)."""
        with self._cond:
            return self._clock.ttl_ms

    def confirmed(self, sent: float, ttl_ms: int) -> bool:
        """Records a renewal the caller made itself (sent at ``sent``, answered with
        ``ttl_ms``); False if it came too late to count. A renewal sent before the
        last TTL update (or the last renewal that counted) moves nothing."""
        return self._record(sent, ttl_ms, renewing=False)

    def _record(self, sent: float, ttl_ms: int, *, renewing: bool) -> bool:
        """``confirmed``; ``renewing``: the renewal went over the renewing connection."""
        with self._cond:
            if self._lost_marked or self._stopping.is_set():
                return False
            record = self._renewer.renewed if renewing else self._renewer.confirmed
            counted_ms = record(sent, ttl_ms, lease_clock())
            if counted_ms is None:
                return False
            self._cond.notify_all()
        if counted_ms and self._on_renewed is not None:
            try:
                self._on_renewed(sent, counted_ms)
            except Exception as exc:  # the callback's failure must not stop the renewals
                self.last_error = exc
        return True

    def update_sent(self, ttl_ms: int) -> int:
        """A TTL update of this lease is about to be sent (``Client.update_lease`` calls
        this): the deadline drops to what ``ttl_ms`` allows from now, and renewals pace
        by it. Returns the ticket for ``update_settled``."""
        with self._cond:
            ticket = self._clock.update_sent(lease_clock(), ttl_ms)
            self._cond.notify_all()  # the watcher and the renewer re-read their times
            return ticket

    def update_settled(self, ticket: int, ttl_ms: int | None, *, applied: bool | None) -> None:
        """What became of the update ``ticket`` (``core.LeaseClock.update_settled``)."""
        with self._cond:
            self._clock.update_settled(ticket, ttl_ms, lease_clock(), applied=applied)
            self._cond.notify_all()

    @property
    def running(self) -> bool:
        """Whether ``start`` was called (and ``stop`` not yet)."""
        return self._started and not self._stopping.is_set()

    def start(self) -> KeepAlive:
        if not self._started:
            self._started = True
            self._watchers.watch(self.lease, self)
            # The threads are born with the signals a program handles blocked (a thread
            # inherits its creator's mask), so that the kernel hands them to the main
            # thread: one that went to a helper thread would leave the main thread
            # blocked in a socket call until its reply came (`dlm exec` waiting in a
            # queue would not see Ctrl-C until it got the lock).
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED_SIGNALS)
            try:
                for t in self._threads:
                    t.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stops renewing (promptly: an in-flight renewal is interrupted) and waits for
        the threads to end."""
        self.halt()
        if self._started:
            for t in self._threads:
                # A thread whose start failed (start raised half-way) has nothing to join,
                # and joining it would raise over the error that start raised.
                if t.ident is not None and t is not threading.current_thread():
                    t.join(timeout)

    def halt(self) -> None:
        """Stops renewing without waiting for the threads (``stop`` joins them): a renewal
        that comes back after this moves no deadline and a loss found after it is not
        reported, so the caller may close the lease at once and join the threads after."""
        with self._cond:
            self._stopping.set()
            self._cond.notify_all()
        self._watchers.unwatch(self.lease, self)
        self._client.close()

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
                # Re-read after every wake-up: a TTL update may have moved it earlier.
                left = self._clock.deadline - lease_clock()
                if left <= 0:
                    break
                # A suspend stops the wait's clock, not the lease's: look again soon.
                self._cond.wait(min(left, RECHECK_S))
            if self._stopping.is_set() or self._lost_marked:
                return
            reason = self._renewer.lost_reason(self.lease)
        self._mark_lost(reason)

    def _renew_loop(self) -> None:
        """Performs what ``core.Renewer`` says, on the spawned client's connection."""
        with self._cond:
            self._renewer.pinged(lease_clock())  # the idle time counts from the start
        while True:
            with self._cond:
                if self._stopping.is_set() or self._lost_marked:
                    return
                now = lease_clock()
                step = self._renewer.next_step(now)
                if isinstance(step, core.Lost):
                    return  # the watcher reports it
                if now < step.at:
                    # Woken early by a TTL update: the step is asked for again.
                    self._cond.wait(step.at - now)
                    continue
                deadline = self._clock.deadline
            if isinstance(step, core.PingAt):
                # Long TTLs leave the connection idle for long: keep it open.
                self._client.ping()
                with self._cond:
                    self._renewer.pinged(lease_clock())
                continue
            sent = lease_clock()
            left = deadline - sent
            if left <= 0:
                return  # the watcher reports it
            self._join_parts()
            try:
                renewed = self._client.renew_parts(self.lease, timeout=left)
            except LeaseLost as exc:
                self._mark_lost(exc.message)
                return
            except (DlmError, ValueError) as exc:
                self.last_error = exc
                with self._cond:
                    self._renewer.renewal_failed(lease_clock())
                continue
            if not self._record_round(sent, renewed):
                return  # confirmed too late: the watcher reports the loss

    def _join_parts(self) -> None:
        """Parts opened since the last round (an acquire in a new partition) get a clock,
        from when their open was sent."""
        with self._cond:
            self._clock.join()

    def _record_round(self, sent: float, renewed: core.PartsRenewed) -> bool:
        """A renewal round over the lease's parts; False if it came too late to count.

        A part opened while the round was under way (an acquire in a new partition from
        another thread) joins first, with its own clock: the round did not renew it, so
        the round neither moves its deadline nor counts as whole."""
        self._join_parts()
        opened = set(self._book.parts(self.lease) or ())
        whole = renewed.whole and opened <= set(renewed.ttls)
        renewed = core.PartsRenewed(renewed.ttls, whole, renewed.complete)
        with self._cond:
            if self._lost_marked or self._stopping.is_set():
                return False
            counted_ms = self._renewer.renewed_parts(
                sent, renewed.ttls, lease_clock(), complete=renewed.complete, whole=renewed.whole
            )
            if counted_ms is None:
                return False
            self._cond.notify_all()
        if counted_ms and renewed.whole and self._on_renewed is not None:
            try:
                self._on_renewed(sent, counted_ms)
            except Exception as exc:  # the callback's failure must not stop the renewals
                self.last_error = exc
        return True


def _incarnation(lease: LeaseRef) -> int:
    return lease.incarnation if isinstance(lease, Lease) else 0
