"""The async client (anyio): the blocking client's API as coroutines.

It drives the same decision generators as sync.py (core.py), so redirects,
retries, backoff and error mapping behave identically. Calls on one client
are serialised over one connection; ``keep_alive`` renews from a client of its
own, so a renewal never waits behind a long acquire. Imported only by code
that runs an event loop: importing anyio is too slow for the CLI's hot path.

``secret`` and ``tls`` work as in the blocking client: the handshake of
dlm/auth.py after the hello, sealed frames after it, TLS around it all, and
AuthFailed when the member cannot be authenticated.
"""

from __future__ import annotations

import asyncio
import random
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.abc

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
from dlm.event_loop import open_socket
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

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from dlm.client.core import Action, Outcome
    from dlm.client.watching import Leadership, WatchEvent, WatchStream
    from dlm.views import LeaseState, LeaseSummary, LockState, MembersView, StatusView

_STREAM_ERRORS = (
    OSError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


class _Handshake:
    """The client's side of dlm/auth.py's handshake on one connection."""

    def __init__(self, secret: bytes, addr: str, trace: str | None = None) -> None:
        from dlm.auth import client_initiator, new_nonce

        self.addr = addr
        self.trace = trace
        self.initiator = client_initiator(secret, new_nonce())

    def hello(self) -> dict[str, Any]:
        hello = Hello(role=HelloRole.CLIENT, trace=self.trace).to_wire()
        return {**hello, **self.initiator.hello_fields()}

    def answer(self, greeting: dict[Any, Any]) -> tuple[dict[str, Any], Any, Any]:
        """(auth frame, sealer, opener) for the member's welcome; AuthFailed if its proof
        is missing or wrong."""
        from dlm.auth import AuthError

        try:
            auth_frame = self.initiator.check_welcome(greeting)
        except AuthError as exc:
            raise core.proof_failed(self.addr, str(exc)) from None
        sealer, opener = self.initiator.keys()
        return auth_frame, sealer, opener


def _tls_failure(exc: BaseException, addr: str) -> AuthFailed | None:
    """AuthFailed for a TLS handshake that failed for a reason reconnecting will not fix."""
    ssl = sys.modules.get("ssl")
    if ssl is None or not isinstance(exc, ssl.SSLError):
        cause = exc.__cause__ or exc.__context__
        return _tls_failure(cause, addr) if cause is not None else None
    if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return None
    if isinstance(exc, ssl.SSLCertVerificationError):
        return core.tls_failed(addr, exc.verify_message or str(exc), verifying=True)
    reason = str(exc.reason).replace("_", " ").lower() if exc.reason else str(exc)
    return core.tls_failed(addr, reason, verifying=False)


class _StreamConnection:
    def __init__(self, addr: str, stream: anyio.abc.ByteStream) -> None:
        self.addr = addr
        self.stream = stream
        self.via_gateway = False
        self.version: int | None = None  # the protocol version the welcome negotiated
        self._decoder = FrameDecoder(PEER_FRAME_LIMIT)
        self._sealer: Any = None
        self._frames: deque[Any] = deque()
        self._pushes: list[dict[Any, Any]] = []
        self._ids = core.RequestIds()

    @classmethod
    async def open(
        cls,
        addr: str,
        timeout: float,
        secret: bytes | None = None,
        tls: Any = None,
        partition: int = 0,
        *,
        trace: str | None = None,
    ) -> tuple[_StreamConnection, dict[Any, Any]]:
        host, port, first, tls_name = core.dial_plan(addr, partition)
        try:
            with anyio.fail_after(max(0.001, timeout)):
                if first:
                    # The preamble goes first, on the bare connection, before TLS.
                    tcp = await anyio.connect_tcp(host, port)
                    try:
                        await tcp.send(first)
                        stream: anyio.abc.ByteStream = tcp
                        if tls is not None:
                            from anyio.streams.tls import TLSStream

                            stream = await TLSStream.wrap(tcp, hostname=tls_name, ssl_context=tls)
                    except BaseException:
                        await tcp.aclose()
                        raise
                elif tls is not None:
                    stream = await anyio.connect_tcp(host, port, ssl_context=tls, tls_hostname=host)
                else:
                    stream = await anyio.connect_tcp(host, port)
                conn = cls(addr, stream)
                try:
                    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    handshake = _Handshake(secret, addr, trace) if secret is not None else None
                    hello = Hello(role=HelloRole.CLIENT, trace=trace).to_wire()
                    await conn.send(handshake.hello() if handshake is not None else hello)
                    greeting = await conn.read()
                    if core.is_gateway_notice(greeting):
                        conn.via_gateway = True  # a gateway's first frame, not the member's
                        greeting = await conn.read()
                    if handshake is not None and greeting.get("t") == "welcome":
                        auth_frame, sealer, opener = handshake.answer(greeting)
                        if conn._frames or conn._decoder.pending:
                            raise ConnectionBroken(
                                "the member sent frames before the handshake ended"
                            )
                        await conn.send(auth_frame)
                        conn._sealer = sealer
                        conn._decoder = FrameDecoder(PEER_FRAME_LIMIT, opener)
                except BaseException:
                    await conn.aclose()
                    raise
        except TimeoutError:
            raise ConnectionBroken("no greeting in time") from None
        except _STREAM_ERRORS as exc:
            failure = _tls_failure(exc, addr) if tls is not None else None
            if failure is not None:
                raise failure from None
            raise ConnectionBroken(str(exc) or "connect failed") from None
        return conn, greeting

    async def send(self, obj: Any) -> None:
        try:
            await self.stream.send(encode_frame(obj, self._sealer))
        except _STREAM_ERRORS as exc:
            raise ConnectionBroken(str(exc) or "send failed") from None

    async def read(self) -> dict[Any, Any]:
        while not self._frames:
            try:
                data = await self.stream.receive()
            except anyio.EndOfStream:
                raise ConnectionBroken("connection closed by the member") from None
            except _STREAM_ERRORS as exc:
                raise ConnectionBroken(str(exc) or "receive failed") from None
            self._decoder.feed(data)
            try:
                self._frames.extend(self._decoder.frames())
            except ProtocolError as exc:
                raise ConnectionBroken(f"bad frame: {exc}") from None
        frame = self._frames.popleft()
        if not isinstance(frame, dict):
            raise ConnectionBroken("frame is not a map")
        return frame

    async def next_frame(self, timeout: float) -> dict[Any, Any] | None:
        """The next frame, or None if none came within ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            return await self.read()
        return None

    async def send_ping(self, timeout: float) -> None:
        """A ping whose answer nobody waits for (it keeps a watching connection alive)."""
        with anyio.move_on_after(timeout):
            await self.send({**core.ping_request(), "id": 0})

    async def request(self, request: dict[str, Any], timeout: float) -> dict[Any, Any] | None:
        rid = self._ids.next()
        with anyio.move_on_after(timeout):
            await self.send({**request, "id": rid})
            while True:
                frame = await self.read()
                if frame.get("t") == "grant" and "id" not in frame:
                    self._pushes.append(frame)
                elif core.is_reply_to(frame, rid) or (
                    frame.get("t") == "error" and "id" not in frame
                ):
                    return frame
        return None

    def drop_pushes(self, lease: str, key: str) -> None:
        self._pushes = [p for p in self._pushes if not _push_matches(p, lease, key)]

    async def await_grant(self, lease: str, key: str, timeout: float) -> dict[Any, Any] | None:
        with anyio.move_on_after(timeout):
            while True:
                for i, push in enumerate(self._pushes):
                    if _push_matches(push, lease, key):
                        del self._pushes[i]
                        return push
                frame: dict[Any, Any] | None = None
                with anyio.move_on_after(core.PING_EVERY_S):
                    frame = await self.read()
                if frame is None:
                    # Idle connections are closed after two minutes: keep this one wanted.
                    await self.send({**core.ping_request(), "id": self._ids.next()})
                    continue
                if frame.get("t") == "grant" and "id" not in frame:
                    self._pushes.append(frame)
                elif frame.get("t") == "error" and "id" not in frame:
                    raise ConnectionBroken(f"member closed the connection: {frame.get('code')}")
        return None

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except _STREAM_ERRORS:
                pass


class _Wake:
    """Why a waiting read woke up: data (or a broken connection) arrived, or its time ran out."""

    DATA = True
    TIMEOUT = False


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(_Wake.TIMEOUT)


class _FrameProtocol(asyncio.Protocol):
    """Decodes frames as bytes arrive, in the loop's callback, and wakes the one reader.

    On asyncio this replaces anyio's socket stream, which pauses and resumes
    reading (two epoll syscalls) and enters a cancel scope and a checkpoint on
    every receive and send: most of the client's CPU per request.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.frames: deque[Any] = deque()
        self.problem: str | None = None
        self.waiter: asyncio.Future[bool] | None = None
        self.writable: asyncio.Future[bool] | None = None
        self.decoder = FrameDecoder(PEER_FRAME_LIMIT)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though on uvloop not an asyncio.Transport by class.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.problem is not None:
            return
        self.decoder.feed(data)
        try:
            self.frames.extend(self.decoder.frames())
        except ProtocolError as exc:
            # The connection is dropped on this; frames before the bad one are never read.
            self.frames.clear()
            self._broken(f"bad frame: {exc}")
            return
        self._wake(self.waiter)

    def eof_received(self) -> bool:
        self._broken("connection closed by the member")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken(str(exc) if exc else "connection closed by the member")

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self.writable = self.writable, None
        self._wake(writable)

    def _broken(self, reason: str) -> None:
        if self.problem is None:
            self.problem = reason or "connection broken"
        self._wake(self.waiter)
        self._wake(self.writable)

    @staticmethod
    def _wake(waiter: asyncio.Future[bool] | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(_Wake.DATA)


class _AsyncioConnection:
    """The asyncio twin of _StreamConnection: the same requests and pushes, with deadlines
    instead of cancel scopes."""

    def __init__(self, addr: str, protocol: _FrameProtocol, loop: asyncio.AbstractEventLoop):
        self.addr = addr
        self.via_gateway = False
        self.version: int | None = None  # the protocol version the welcome negotiated
        self._protocol = protocol
        self._loop = loop
        self._sealer: Any = None
        self._pushes: list[dict[Any, Any]] = []
        self._ids = core.RequestIds()

    @classmethod
    async def open(
        cls,
        addr: str,
        timeout: float,
        secret: bytes | None = None,
        tls: Any = None,
        partition: int = 0,
        *,
        trace: str | None = None,
    ) -> tuple[_AsyncioConnection, dict[Any, Any]]:
        host, port, first, tls_name = core.dial_plan(addr, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.001, timeout)
        protocol = _FrameProtocol()
        options: dict[str, Any] = {}
        if tls is not None:
            options = {"ssl": tls, "server_hostname": tls_name}
        try:
            with anyio.fail_after(max(0.001, timeout)):
                if first:
                    # The preamble goes first, on the bare socket, before TLS and the hello.
                    sock = await _dial_with_preamble(loop, host, port, first)
                    try:
                        transport, _ = await loop.create_connection(
                            lambda: protocol, sock=sock, **options
                        )
                    except BaseException:
                        sock.close()
                        raise
                else:
                    transport, _ = await loop.create_connection(
                        lambda: protocol, host, port, **options
                    )
        except TimeoutError:
            raise ConnectionBroken("no greeting in time") from None
        except OSError as exc:
            failure = _tls_failure(exc, addr) if tls is not None else None
            if failure is not None:
                raise failure from None
            raise ConnectionBroken(str(exc) or "connect failed") from None
        conn = cls(addr, protocol, loop)
        try:
            sock = open_socket(transport)  # None: closed already, which the read below says
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            handshake = _Handshake(secret, addr, trace) if secret is not None else None
            hello = Hello(role=HelloRole.CLIENT, trace=trace).to_wire()
            await conn.send(handshake.hello() if handshake is not None else hello, deadline)
            greeting = await conn.read(deadline)
            if core.is_gateway_notice(greeting):
                conn.via_gateway = True  # a gateway's first frame, not the member's
                greeting = await conn.read(deadline)
            if handshake is not None and greeting is not None and greeting.get("t") == "welcome":
                auth_frame, sealer, opener = handshake.answer(greeting)
                if protocol.frames or protocol.decoder.pending:
                    raise ConnectionBroken("the member sent frames before the handshake ended")
                await conn.send(auth_frame, deadline)
                conn._sealer = sealer
                protocol.decoder = FrameDecoder(PEER_FRAME_LIMIT, opener)
        except BaseException:
            await conn.aclose()
            raise
        if greeting is None:
            await conn.aclose()
            raise ConnectionBroken(core.NOT_A_MEMBER)  # connected, but not even a greeting
        return conn, greeting

    async def send(self, obj: Any, deadline: float) -> bool:
        """Writes one frame; False if the peer did not take it before ``deadline``."""
        protocol = self._protocol
        if protocol.problem is not None or protocol.transport is None:
            raise ConnectionBroken(protocol.problem or "send failed")
        protocol.transport.write(encode_frame(obj, self._sealer))
        while protocol.writable is not None:
            if not await self._wait(protocol.writable, deadline):
                return False
            if protocol.problem is not None:
                raise ConnectionBroken(protocol.problem)
        return True

    async def read(self, deadline: float) -> dict[Any, Any] | None:
        """The next frame, or None if none arrived before ``deadline``."""
        protocol = self._protocol
        frames = protocol.frames
        while not frames:
            if protocol.problem is not None:
                raise ConnectionBroken(protocol.problem)
            waiter = self._loop.create_future()
            protocol.waiter = waiter
            try:
                if not await self._wait(waiter, deadline):
                    return None
            finally:
                protocol.waiter = None
        frame = frames.popleft()
        if not isinstance(frame, dict):
            raise ConnectionBroken("frame is not a map")
        return frame

    async def next_frame(self, timeout: float) -> dict[Any, Any] | None:
        """The next frame, or None if none came within ``timeout`` seconds."""
        return await self.read(self._loop.time() + timeout)

    async def send_ping(self, timeout: float) -> None:
        """A ping whose answer nobody waits for (it keeps a watching connection alive)."""
        await self.send({**core.ping_request(), "id": 0}, self._loop.time() + timeout)

    async def _wait(self, waiter: asyncio.Future[bool], deadline: float) -> bool:
        timer = self._loop.call_at(deadline, _expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def request(self, request: dict[str, Any], timeout: float) -> dict[Any, Any] | None:
        rid = self._ids.next()
        deadline = self._loop.time() + timeout
        if not await self.send({**request, "id": rid}, deadline):
            return None
        while True:
            frame = await self.read(deadline)
            if frame is None:
                return None
            if frame.get("t") == "grant" and "id" not in frame:
                self._pushes.append(frame)
            elif core.is_reply_to(frame, rid) or (frame.get("t") == "error" and "id" not in frame):
                return frame

    def drop_pushes(self, lease: str, key: str) -> None:
        self._pushes = [p for p in self._pushes if not _push_matches(p, lease, key)]

    async def await_grant(self, lease: str, key: str, timeout: float) -> dict[Any, Any] | None:
        deadline = self._loop.time() + timeout
        while True:
            for i, push in enumerate(self._pushes):
                if _push_matches(push, lease, key):
                    del self._pushes[i]
                    return push
            slice_end = min(deadline, self._loop.time() + core.PING_EVERY_S)
            frame = await self.read(slice_end)
            if frame is None:
                if slice_end >= deadline:
                    return None
                # Idle connections are closed after two minutes: keep this one wanted.
                await self.send({**core.ping_request(), "id": self._ids.next()}, deadline)
                continue
            if frame.get("t") == "grant" and "id" not in frame:
                self._pushes.append(frame)
            elif frame.get("t") == "error" and "id" not in frame:
                raise ConnectionBroken(f"member closed the connection: {frame.get('code')}")

    async def aclose(self) -> None:
        transport = self._protocol.transport
        if transport is not None:
            transport.close()
            # The socket is closed in a callback close() schedules: let it run, as
            # anyio's aclose does, so an event loop ending right after us finds it done.
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0)


async def _dial_with_preamble(
    loop: asyncio.AbstractEventLoop, host: str, port: int, first: bytes
) -> socket.socket:
    """A connected socket to ``host`` (each of its addresses in turn) that has sent
    ``first``, a preamble: what the member's supervisor (or a gateway) reads to hand it on."""
    last: OSError | None = None
    for family, kind, proto, _, address in await loop.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
            await loop.sock_sendall(sock, first)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise last or OSError(f"no address found for {host!r}")


def _on_asyncio() -> bool:
    """Whether the running loop is asyncio's (anyio may also run on trio)."""
    if not NATIVE_ASYNCIO:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _open_connection(
    addr: str,
    timeout: float,
    secret: bytes | None = None,
    tls: Any = None,
    partition: int = 0,
    *,
    trace: str | None = None,
) -> tuple[_AnyConnection, dict[Any, Any]]:
    """A connection to ``partition``'s group on the member at ``addr``, and its greeting
    (``trace``: the caller's trace context, for the hello)."""
    if _on_asyncio():
        return await _AsyncioConnection.open(addr, timeout, secret, tls, partition, trace=trace)
    return await _StreamConnection.open(addr, timeout, secret, tls, partition, trace=trace)


_AnyConnection = _StreamConnection | _AsyncioConnection

# Tests turn this off to drive the portable anyio path on asyncio too.
NATIVE_ASYNCIO = True


def _push_matches(push: Mapping[Any, Any], lease: str, key: str) -> bool:
    return push.get("lease") == lease and push.get("key") == key


class AsyncClient:
    """An anyio dlm client. Use as ``async with AsyncClient(...) as client``."""

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
        """As the blocking client's: ``dial_timeout``: give a call up once this long has
        passed without any member answering at all (None: keep trying for the whole
        ``timeout``); ``secret``: the cluster's client secret, when its members require
        one; ``tls``: an ssl.SSLContext (dlm.tls.client_context) to connect with TLS."""
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
        # asyncio's Lock takes no checkpoint when free; anyio's is the portable fallback.
        self._lock: asyncio.Lock | anyio.Lock | None = None
        # One connection per partition, to the address its router chose last.
        self._conns: dict[int, _AnyConnection] = {}
        self._closed = False
        self._ttl_ms: dict[str, int] = {}
        # Shared with spawned clients: a keep_alive renews from one (see sync.Client).
        self._watchers = core.LeaseWatchers()
        # The leases opened through this family of clients and their parts (sync.Client).
        self._book = core.LeaseBook()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._drop_connections()

    @property
    def _conn(self) -> _AnyConnection | None:
        """Partition 0's connection (the only one in a cluster of one partition)."""
        return self._conns.get(0)

    @property
    def connected_to(self) -> str | None:
        return self._conn.addr if self._conn is not None else None

    @property
    def partitions(self) -> int:
        """How many partitions the cluster has, as far as this client has learned."""
        return self._ctx.partitions

    @property
    def client_id(self) -> str:
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

    def spawn(self) -> AsyncClient:
        rng = random.Random(self._rng.getrandbits(64)) if self._rng is not None else None
        child = AsyncClient(
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

    # -- leases (each method is the blocking client's, as a coroutine) ----------

    async def open_lease(
        self,
        ttl_ms: int | None,
        lease: str | None = None,
        *,
        ephemeral: bool = False,
        meta: Mapping[str, str] | None = None,
        lock_delay_ms: int = 0,
        near: Sequence[str] = (),
    ) -> Lease:
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
        opened: Lease = await self._run(flow)
        self._ttl_ms[opened.id] = opened.ttl_ms
        self._book.opened(opened, ephemeral=ephemeral, meta=meta, lock_delay_ms=lock_delay_ms)
        return opened

    async def keepalive(self, lease: LeaseRef, *, timeout: float | None = None) -> int:
        """As the blocking client's: every part renewed, the shortest TTL returned."""
        lid = lease_id(lease)
        renewed = await self.renew_parts(lease, timeout=timeout)
        if not renewed.whole:
            raise ClusterUnavailable(
                f"lease {lid}: a partition that holds part of it could not be reached "
                f"(renewed in partitions {sorted(renewed.ttls)} only)"
            )
        ttl = min(renewed.ttls.values())
        self._ttl_ms[lid] = ttl
        return ttl

    async def renew_parts(
        self, lease: LeaseRef, *, timeout: float | None = None
    ) -> core.PartsRenewed:
        """One renewal round of every part of the lease (as the blocking client's)."""
        lid = lease_id(lease)
        if isinstance(lease, Lease) and self._book.get(lid) is None:
            self._book.opened(lease)
        renewed: core.PartsRenewed = await self._run(
            core.renew_parts_flow(self._ctx, self._book, lid, timeout=timeout)
        )
        return renewed

    async def close_lease(
        self,
        lease: LeaseRef,
        *,
        must_exist: bool = False,
        run: core.RunEnd | None = None,
        revoke: bool = False,
    ) -> list[str]:
        lid = lease_id(lease)
        released: list[str] = await self._run(
            core.close_all_flow(
                self._ctx, self._book, lid, must_exist=must_exist, run=run, revoke=revoke
            )
        )
        self._ttl_ms.pop(lid, None)
        return released

    async def update_lease(
        self,
        lease: LeaseRef,
        ttl_ms: int,
        *,
        finished: bool = False,
        timeout: float | None = None,
        run: core.RunEnd | None = None,
    ) -> int:
        """As the blocking client's: every keep_alive of this lease made from this client
        (or one it spawned) hears of the update before it is sent."""
        lid = lease_id(lease)
        flow = core.update_parts_flow(
            self._ctx, self._book, lid, ttl_ms, finished=finished, timeout=timeout, run=run
        )
        tickets = [(w, w.update_sent(ttl_ms)) for w in self._watchers.of(lid)]
        try:
            ttl: int = await self._run(flow)
        except BaseException as exc:  # cancelled included: the update may have gone out
            applied = core.update_applied(exc)
            for watcher, ticket in tickets:
                watcher.update_settled(ticket, None, applied=applied)
            raise
        for watcher, ticket in tickets:
            watcher.update_settled(ticket, ttl, applied=True)
        self._ttl_ms[lid] = ttl
        return ttl

    async def lease_info(self, lease: LeaseRef) -> LeaseState:
        """The lease's TTL, the time left (the leader's count), and the keys it holds and
        waits for."""
        info: LeaseState = await self._run(
            core.lease_info_flow(self._ctx, lease_id(lease), self._book)
        )
        return info

    async def list_leases(self, *, stale: bool = False) -> list[LeaseSummary]:
        """Every live lease (paged through, however many)."""
        leases: list[LeaseSummary] = await self._run(core.list_leases_flow(self._ctx, stale=stale))
        return leases

    # -- locks ----------------------------------------------------------------

    async def acquire(
        self,
        lease: LeaseRef,
        key: str,
        *,
        wait: float | None = None,
        limit: int = 1,
        meta: Mapping[str, str] | None = None,
    ) -> Grant:
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
        grant: Grant = await self._run(flow)
        return grant

    async def acquire_all(
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
        grants: list[Grant] = await self._run(flow)
        return grants

    async def release(
        self, lease: LeaseRef, key: str, *, token: int | None = None, keep_lease: bool = True
    ) -> ReleaseOutcome:
        lid = lease_id(lease)
        flow = core.release_flow(self._ctx, lid, key, token=token, keep_lease=keep_lease)
        released: ReleaseOutcome = await self._run(flow)
        if released.lease_ended:
            # The release ended the lease's part in the key's partition: end the rest.
            await self._run(core.parts_ended_flow(self._ctx, self._book, lid, key))
        return released

    async def campaign(
        self, lease: LeaseRef, name: str, value: str = "", *, wait: float | None = None
    ) -> Grant:
        """Campaigns for election ``name`` (the lock key ``name``) under ``lease``, which the
        caller keeps alive: queues FIFO (``wait`` as for ``acquire``) and returns the grant
        once it leads, its token the leadership epoch; ``value`` is what ``leader`` shows."""
        grant: Grant = await self.acquire(lease, name, wait=wait, meta={core.ELECTION_VALUE: value})
        return grant

    async def resign(self, lease: LeaseRef, name: str) -> None:
        """Gives up leading (or campaigning for) ``name``: a release, so the next candidate
        is elected at once (no lock-delay)."""
        await self.release(lease, name, keep_lease=True)

    async def proclaim(self, lease: LeaseRef, name: str, value: str) -> int:
        """Changes the value of election ``name`` without a new election, only while
        ``lease`` leads it (NotHolder otherwise); returns the unchanged token."""
        token: int = await self._run(core.proclaim_flow(self._ctx, lease_id(lease), name, value))
        return token

    async def leader(self, name: str) -> dict[str, Any]:
        """Who leads ``name`` now: ``{"name", "value", "token", "since", "index", "lease"}``
        (``value`` None while nobody leads; see ``core.leadership``)."""
        return core.leadership(name, await self.get(name))

    async def get(self, key: str, *, stale: bool = False) -> LockState:
        """Who holds ``key`` and who waits for it."""
        state: LockState = await self._run(core.get_flow(self._ctx, key, stale=stale))
        return state

    async def watch(
        self,
        key: str | None = None,
        *,
        prefix: str | None = None,
        after: int | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """As the blocking client's ``watch``, as an async iterator (close it, e.g. with
        ``contextlib.aclosing``, in the task that iterates it: a prefix in a cluster of
        several partitions is watched by a task per partition)."""
        from dlm.client.watching import WatchStream

        budget = self.timeout if timeout is None else timeout
        if key is None and prefix is not None and await self._learn_partitions(budget) > 1:
            if after is not None:
                raise core.prefix_after_refused(after, self._ctx.partitions)
            merging = self._watch_partitions(prefix, budget)
            try:
                async for merged in merging:
                    yield merged
            finally:
                # Closed here, in the task that iterates: its task group was entered here.
                await merging.aclose()
            return
        stream = WatchStream(key, prefix, after, budget)
        async for event in self._watch(stream):
            if event is not None:
                yield event

    async def _learn_partitions(self, timeout: float) -> int:
        """As the blocking client's."""
        if not self._ctx.reached:
            await self._run(core.read_flow(self._ctx, Ping(id=0), timeout=timeout))
        return self._ctx.partitions

    async def _watch_partitions(self, prefix: str, timeout: float) -> AsyncGenerator[WatchEvent]:
        """``prefix``'s changes in every partition, as they come: a task per partition
        follows its watch; closing the iterator cancels them."""
        import math

        from dlm.client.watching import WatchEvent, WatchStream

        send, receive = anyio.create_memory_object_stream[WatchEvent | Exception](math.inf)

        async def follow(partition: int) -> None:
            stream = WatchStream(None, prefix, None, timeout)
            try:
                async for event in self._watch(stream, partition):
                    if event is not None:
                        send.send_nowait(event)
            except Exception as exc:  # the watch's end (COMPACTED, unavailable, refused)
                send.send_nowait(exc)

        # Nothing is raised inside the task group (it would wrap it in an exception
        # group): a partition's end is raised after it, and a close ends it quietly.
        ended: Exception | None = None
        async with anyio.create_task_group() as tasks:
            for partition in range(self._ctx.partitions):
                tasks.start_soon(follow, partition)
            try:
                async for item in receive:
                    if isinstance(item, Exception):
                        ended = item
                        break
                    yield item
            except GeneratorExit:
                pass
            finally:
                tasks.cancel_scope.cancel()
                send.close()
                receive.close()
        if ended is not None:
            raise ended

    async def _watch(
        self, stream: WatchStream, partition: int | None = None
    ) -> AsyncGenerator[WatchEvent | None]:
        """``watch``'s changes, and None each time a member starts serving it;
        ``partition`` as for the blocking client's."""
        import itertools

        from dlm.client.watching import WatchBroken

        members = list(self.members)
        ctx = self._ctx
        preferred = ctx.router_for(core.watch_partition(ctx, stream.key, partition)).preferred
        first = members.index(preferred) if preferred in members else 0
        attempt = ctx.attempt_timeout
        for tried in itertools.count(first):
            addr = members[tried % len(members)]
            conn: _AnyConnection | None = None
            try:
                conn, greeting = await _open_connection(
                    addr,
                    attempt,
                    self._secret,
                    self._tls,
                    core.watch_partition(ctx, stream.key, partition),
                )
                reply = None
                if greeting.get("t") != "error":
                    ctx.learn_partitions(core.greeting_partitions(greeting)[0])
                    reply = await conn.request(stream.request(), attempt)
                    if reply is not None and reply.get("code") == "WRONG_PARTITION":
                        # The key is another partition's: the next try goes there.
                        ctx.learn_partitions(reply.get("partitions"))
                node = greeting.get("node")
                if reply is not None and stream.started(
                    reply, node if isinstance(node, str) else addr
                ):
                    yield None
                    watch_id = int(reply.get("id", -1))
                    while True:
                        frame = await conn.next_frame(core.PING_EVERY_S)
                        if frame is None:
                            # The member closes a connection that stays silent too long.
                            await conn.send_ping(attempt)
                            continue
                        for event in stream.take(frame, watch_id):
                            yield event
            except (ConnectionBroken, WatchBroken):
                pass
            finally:
                if conn is not None:
                    await conn.aclose()
            await anyio.sleep(stream.failed(time.monotonic(), len(members)))

    async def observe(
        self, name: str, *, timeout: float | None = None
    ) -> AsyncIterator[Leadership]:
        """As the blocking client's ``observe``, as an async iterator."""
        from dlm.client.watching import Observer, WatchCompacted, WatchStream, leader_of

        observer = Observer(name)
        while True:
            stream = WatchStream(name, None, None, self.timeout if timeout is None else timeout)
            events = self._watch(stream)
            try:
                async for event in events:
                    if event is None:
                        if observer.now is None:
                            state = await self.get(name)
                            yield observer.start(*leader_of(state), stream.last or 0)
                        continue
                    said = observer.change(event)
                    if said is not None:
                        yield said
            except WatchCompacted:
                observer.now = None
            finally:
                await events.aclose()

    async def list_locks(self, prefix: str = "", *, stale: bool = False) -> list[LockState]:
        """Every held lock whose key starts with ``prefix`` (paged through, however many)."""
        locks: list[LockState] = await self._run(
            core.list_locks_flow(self._ctx, prefix, stale=stale)
        )
        return locks

    # -- cluster --------------------------------------------------------------

    async def status(self, *, stale: bool = False, partition: int = 0) -> StatusView:
        flow = core.status_flow(self._ctx, stale=stale, partition=partition)
        view: StatusView = await self._run(flow)
        return view

    async def members_view(self, *, partition: int = 0) -> MembersView:
        """The leader's view of the membership: ``members`` and ``leader`` (of ``partition``'s
        group, in a partitioned cluster)."""
        view: MembersView = await self._run(core.members_flow(self._ctx, partition=partition))
        return view

    async def add_member(self, member: str, address: str, *, partition: int = 0) -> MembersView:
        request = MemberAdd(id=0, member=member, address=address, seq=0)
        view: MembersView = await self._run(
            core.member_change_flow(self._ctx, request, partition=partition)
        )
        return view

    async def remove_member(
        self, member: str, *, force: bool = False, partition: int = 0
    ) -> MembersView:
        request = MemberRemove(id=0, member=member, force=force, seq=0)
        view: MembersView = await self._run(
            core.member_change_flow(self._ctx, request, partition=partition)
        )
        return view

    async def auth_change(self, request: AuthChange, *, partition: int = 0) -> dict[str, Any]:
        """Adds, removes or rotates an identity (an admin's request; ``request`` is a wire
        ``auth_*`` request with id 0): the cluster's answer, ``op`` and ``name``. In a
        partitioned cluster each partition keeps its own copy: ``partition`` names the
        one to change (`dlm auth` changes every one in turn)."""
        answer: dict[str, Any] = await self._run(
            core.read_flow(self._ctx, request, partition=partition)
        )
        return answer

    async def runs(
        self, key: str | None = None, *, prefix: str = "", stale: bool = False
    ) -> list[dict[str, Any]]:
        """The run ledger: ``key``'s runs newest first, or the last run of every key."""
        rows: list[dict[str, Any]] = await self._run(
            core.runs_flow(self._ctx, key, prefix=prefix, stale=stale)
        )
        return rows

    async def identities(self) -> list[dict[str, Any]]:
        """The cluster's identities (an admin's request): names, roles, prefixes, key ids."""
        answer = await self._run(core.read_flow(self._ctx, AuthList(id=0)))
        rows = answer.get("identities")
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    async def promote_member(self, member: str, *, partition: int = 0) -> MembersView:
        request = MemberPromote(id=0, member=member, seq=0)
        view: MembersView = await self._run(
            core.member_change_flow(self._ctx, request, partition=partition)
        )
        return view

    async def save_snapshot(
        self, *, image_timeout: float = 600.0, partition: int = 0
    ) -> tuple[SnapshotHeader, bytes]:
        """A backup from the leader, as ``Client.save_snapshot``: the header, and the image
        at its committed index, each chunk within ``image_timeout`` of the last."""
        reply = (await self._run(core.snapshot_save_flow(self._ctx, partition=partition)))[1]
        header = core.read_reply(SnapshotHeader, reply)
        rid = reply.get("id")
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise ServerError("BAD_REPLY", "the backup header has no request id")
        assembly = core.ImageAssembly(rid)
        async with self._call_lock():
            conn = self._conns.get(partition)
            if conn is None:
                raise ClusterUnavailable("the connection closed before the image came")
            try:
                while not assembly.done:
                    frame = await _next_frame(conn, image_timeout)
                    if frame is None:
                        raise ClusterUnavailable(
                            f"no part of the image came within {image_timeout:g}s"
                        )
                    assembly.take(frame)  # a grant push or a late reply is passed over
            except ConnectionBroken as exc:
                await self._drop_connection(partition)
                raise ClusterUnavailable(f"the connection broke during the image: {exc}") from None
            except BaseException:
                await self._drop_connection(partition)
                raise
        return header, assembly.image()

    async def ping(self) -> bool:
        """Tells the members these idle connections (one per partition) are still wanted;
        False if there is none, or one did not answer (nothing is opened for it)."""
        lock = self._call_lock()
        async with lock:
            if not self._conns or self._closed:
                return False
            answered = True
            for partition, conn in list(self._conns.items()):
                try:
                    reply = await conn.request(core.ping_request(), 2.0)
                except ConnectionBroken:
                    reply = None
                if reply is None or reply.get("t") != "ok":
                    await self._drop_connection(partition)
                    answered = False
            return answered

    async def member_status(
        self, addr: str, timeout: float = 2.0, *, partition: int = 0
    ) -> StatusView | None:
        deadline = time.monotonic() + timeout
        try:
            conn, greeting = await _open_connection(
                self._ctx.member_route(format_addr(*parse_addr(addr))),
                timeout,
                self._secret,
                self._tls,
                partition,
            )
        except (ConnectionBroken, ValueError, AuthFailed):
            return None
        try:
            if greeting.get("t") != "welcome":
                return None
            left = max(0.001, deadline - time.monotonic())
            reply = await conn.request(without_id(Status(id=0, stale=True)), left)
        except ConnectionBroken:
            return None
        finally:
            await conn.aclose()
        return core.own_view(reply)

    # -- keeping a lease alive --------------------------------------------------

    @asynccontextmanager
    async def keep_alive(
        self,
        lease: LeaseRef,
        *,
        confirmed_at: float | None = None,
        ttl_ms: int | None = None,
        on_lost: Callable[[str], None] | None = None,
        interval: float | None = None,
        deadline_of: Callable[[float, int], float] | None = None,
        on_renewed: Callable[[float, int], None] | None = None,
    ) -> AsyncIterator[AsyncKeepAlive]:
        """Renews ``lease`` in the background for the duration of the block, from a
        client of its own (the arguments are sync.KeepAlive's)."""
        keeper = AsyncKeepAlive(
            self.spawn(),
            lease,
            confirmed_at=confirmed_at,
            ttl_ms=ttl_ms,
            on_lost=on_lost,
            interval=interval,
            deadline_of=deadline_of,
            on_renewed=on_renewed,
        )
        self._watchers.watch(keeper.lease, keeper)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(keeper._renew_loop)
                tg.start_soon(keeper._watch)
                try:
                    yield keeper
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self._watchers.unwatch(keeper.lease, keeper)
            await keeper._client.aclose()

    # -- the driver -------------------------------------------------------------

    def _call_lock(self) -> asyncio.Lock | anyio.Lock:
        lock = self._lock
        if lock is None:
            lock = self._lock = asyncio.Lock() if _on_asyncio() else anyio.Lock()
        return lock

    async def _run(self, flow: core.Flow) -> Any:
        async with self._call_lock():
            try:
                action: Action = next(flow)
                while True:
                    action = flow.send(await self._perform(action))
            except StopIteration as done:
                return done.value

    async def _perform(self, action: Action) -> Outcome:
        if self._closed:
            raise ClusterUnavailable("the client was closed", code="CLOSED")
        if isinstance(action, Sleep):
            if action.seconds > 0:
                await anyio.sleep(action.seconds)
            return None
        if isinstance(action, AwaitGrant):
            conn = self._conns.get(action.partition)
            if conn is None or conn.addr != action.addr:
                return Failed("connection lost while waiting")
            try:
                return await conn.await_grant(action.lease, action.key, action.timeout)
            except ConnectionBroken as exc:
                await self._drop_connection(action.partition)
                return Failed(str(exc))
        return await self._send(action)

    async def _send(self, action: Send) -> Outcome:
        deadline = time.monotonic() + action.timeout
        partition = action.partition
        conn = self._conns.get(partition)
        if conn is None or conn.addr != action.addr:
            await self._drop_connection(partition)
            try:
                conn, greeting = await _open_connection(
                    action.addr,
                    action.timeout,
                    self._secret,
                    self._tls,
                    partition,
                    trace=self._ctx.trace,
                )
            except ConnectionBroken as exc:
                return Failed(str(exc))
            if greeting.get("t") != "welcome":
                await conn.aclose()
                return greeting if greeting.get("t") == "error" else Failed("no welcome")
            count, greeted = core.greeting_partitions(greeting)
            self._ctx.learn_partitions(count)
            if greeted != partition:
                # The member's supervisor handed us to another group than the preamble
                # named (or the greeting is garbled): nothing it answers here counts.
                await conn.aclose()
                return Failed(f"answered for partition {greeted}, not {partition}")
            conn.version = core.greeting_version(greeting)
            self._conns[partition] = conn
            if conn.via_gateway:
                self._ctx.gateways.add(core.split_route(conn.addr)[0])
        if action.drop_pushes_for is not None:
            conn.drop_pushes(*action.drop_pushes_for)
        try:
            request = core.for_member(action.request, conn.version)
            reply = await conn.request(request, max(0.001, deadline - time.monotonic()))
        except ConnectionBroken as exc:
            await self._drop_connection(partition)
            return Failed(str(exc))
        if reply is None:
            await self._drop_connection(partition)
            return Failed(f"no reply within {action.timeout:.3g}s")
        if (reply.get("t") == "error" and "id" not in reply) or (
            conn.via_gateway and core.redial_through_gateway(reply)
        ):
            # Through a gateway, a member that cannot serve is left: the next connection
            # lets the gateway choose again, or names the leader.
            await self._drop_connection(partition)
        return reply

    async def _drop_connection(self, partition: int = 0) -> None:
        conn = self._conns.pop(partition, None)
        if conn is not None:
            await conn.aclose()

    async def _drop_connections(self) -> None:
        for partition in list(self._conns):
            await self._drop_connection(partition)


async def _next_frame(conn: _AnyConnection, timeout: float) -> dict[Any, Any] | None:
    """The connection's next frame, or None when none came within ``timeout``."""
    if isinstance(conn, _AsyncioConnection):
        return await conn.read(time.monotonic() + timeout)
    with anyio.move_on_after(timeout):
        return await conn.read()
    return None


class AsyncKeepAlive:
    """The async twin of sync.KeepAlive (the same ``core.LeaseClock`` rules); made by
    ``AsyncClient.keep_alive``."""

    def __init__(
        self,
        client: AsyncClient,
        lease: LeaseRef,
        *,
        confirmed_at: float | None = None,
        ttl_ms: int | None = None,
        on_lost: Callable[[str], None] | None = None,
        interval: float | None = None,
        deadline_of: Callable[[float, int], float] | None = None,
        on_renewed: Callable[[float, int], None] | None = None,
    ) -> None:
        """As sync.KeepAlive's; ``client`` is the one it renews from, all its own."""
        if isinstance(lease, Lease):
            ttl_ms = lease.ttl_ms if ttl_ms is None else ttl_ms
            confirmed_at = lease.confirmed_at if confirmed_at is None else confirmed_at
        if ttl_ms is None or ttl_ms <= 0:
            raise ValueError("keep_alive needs the lease's ttl_ms")
        if confirmed_at is None:
            raise ValueError("keep_alive needs confirmed_at: when the lease was last confirmed")
        self.lease = lease_id(lease)
        self.lost = anyio.Event()
        self.reason: str | None = None
        self.last_error: BaseException | None = None
        if isinstance(lease, Lease) and client._book.get(lease.id) is None:
            client._book.opened(lease)
        self._book = client._book
        known = self._book.parts(self.lease)
        # One clock per part; the lease's deadline is the earliest (sync.KeepAlive).
        self._clock = core.PartClocks(
            ttl_ms,
            confirmed_at,
            deadline_of or core.lease_deadline,
            parts=None if known is None else sorted(known),
            opened=partial(self._book.parts, self.lease),  # parts join once opened
        )
        self._renewer = core.Renewer(self._clock, lease_clock(), interval=interval)
        self._client = client
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        self._changed = anyio.Event()
        """Set (and replaced) when a TTL update moves the deadline or the renewal time."""

    @property
    def renewals(self) -> int:
        """Renewals that moved the deadline."""
        return self._renewer.renewals

    @property
    def ttl_ms(self) -> int:
        """The shortest TTL the leader may be counting the lease with (renewals pace by it)."""
        return self._clock.ttl_ms

    @property
    def deadline(self) -> float:
        """When (``lease_clock``) the lease must be presumed lost."""
        return self._clock.deadline

    @property
    def confirmed_at(self) -> float:
        """When (``lease_clock``) the last renewal that counted was sent."""
        return self._clock.last_sent

    def confirmed(self, sent: float, ttl_ms: int) -> bool:
        """Records a renewal the caller made itself (sent at ``sent``, answered with
        ``ttl_ms``); False if it came too late to count (sync.KeepAlive.confirmed)."""
        return self._record(sent, ttl_ms, renewing=False)

    def _record(self, sent: float, ttl_ms: int, *, renewing: bool) -> bool:
        if self.lost.is_set():
            return False
        record = self._renewer.renewed if renewing else self._renewer.confirmed
        counted_ms = record(sent, ttl_ms, lease_clock())
        if counted_ms is None:
            return False
        self._wake()
        if counted_ms and self._on_renewed is not None:
            try:
                self._on_renewed(sent, counted_ms)
            except Exception as exc:  # the callback's failure must not stop the renewals
                self.last_error = exc
        return True

    def _record_round(self, sent: float, renewed: core.PartsRenewed) -> bool:
        """A renewal round over the lease's parts; False if it came too late to count (a
        part opened meanwhile joins first: sync.KeepAlive._record_round)."""
        if self.lost.is_set():
            return False
        self._join_parts()
        opened = set(self._book.parts(self.lease) or ())
        whole = renewed.whole and opened <= set(renewed.ttls)
        renewed = core.PartsRenewed(renewed.ttls, whole, renewed.complete)
        counted_ms = self._renewer.renewed_parts(
            sent, renewed.ttls, lease_clock(), complete=renewed.complete, whole=renewed.whole
        )
        if counted_ms is None:
            return False
        self._wake()
        if counted_ms and renewed.whole and self._on_renewed is not None:
            try:
                self._on_renewed(sent, counted_ms)
            except Exception as exc:  # the callback's failure must not stop the renewals
                self.last_error = exc
        return True

    def _join_parts(self) -> None:
        """Parts opened since the last round join with a clock from their own open."""
        self._clock.join()

    def update_sent(self, ttl_ms: int) -> int:
        """A TTL update of this lease is about to be sent (``AsyncClient.update_lease``)."""
        ticket = self._clock.update_sent(lease_clock(), ttl_ms)
        self._wake()
        return ticket

    def update_settled(self, ticket: int, ttl_ms: int | None, *, applied: bool | None) -> None:
        self._clock.update_settled(ticket, ttl_ms, lease_clock(), applied=applied)
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _sleep(self, seconds: float) -> None:
        """Sleeps ``seconds``, or less if a TTL update changes the times meanwhile."""
        with anyio.move_on_after(seconds):
            await self._changed.wait()

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.reason = reason
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception as exc:
                self.last_error = exc
        self.lost.set()

    async def _watch(self) -> None:
        while not self.lost.is_set():
            left = self.deadline - lease_clock()
            if left <= 0:
                self._mark_lost(self._renewer.lost_reason(self.lease))
                return
            # A suspend stops the sleep's clock, not the lease's: look again soon.
            await self._sleep(min(left, RECHECK_S))

    async def _renew_loop(self) -> None:
        """Performs what ``core.Renewer`` says, on the spawned client's connection."""
        self._renewer.pinged(lease_clock())  # the idle time counts from the start
        while not self.lost.is_set():
            now = lease_clock()
            step = self._renewer.next_step(now)
            if isinstance(step, core.Lost):
                return  # the watcher reports it
            if now < step.at:
                await self._sleep(step.at - now)
                continue  # asked again: a TTL update may bring the renewal forward
            if isinstance(step, core.PingAt):
                # Long TTLs leave the connection idle for long: keep it open.
                await self._client.ping()
                self._renewer.pinged(lease_clock())
                continue
            sent = lease_clock()
            left = self.deadline - sent
            if left <= 0:
                return
            self._join_parts()
            try:
                with anyio.move_on_after(left):
                    renewed = await self._client.renew_parts(self.lease, timeout=left)
                    if not self._record_round(sent, renewed):
                        return  # too late to count: the watcher reports the loss
                    continue
            except LeaseLost as exc:
                self._mark_lost(exc.message)
                return
            except (DlmError, ValueError) as exc:
                self.last_error = exc
            self._renewer.renewal_failed(lease_clock())


def _incarnation(lease: LeaseRef) -> int:
    return lease.incarnation if isinstance(lease, Lease) else 0
