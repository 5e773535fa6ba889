"""The gateway's IO: accept client connections, route each, relay its bytes both ways.

`dlm gateway` runs this (dlm/cli/gateway.py). For each accepted connection:

1. read its routing bytes (dlm/partitioning.py ``read_routing``), exactly as many
   as they need and no more, within ``ROUTING_TIMEOUT_S``; then the client's first
   byte of its own (a hello frame's, or a TLS record's 0x16);
2. ask the pure router (routing.py) which members to dial, and dial them in that
   order until one connects (each within ``DIAL_TIMEOUT_S``), sending
   ``preamble(i)`` first for partition i > 0, as a client would;
3. unless the client speaks TLS, write it the notice frame ``{t: gateway,
   version: 1}`` before any byte of the member's, so the client knows it came
   through a gateway and redials it (with a target preamble) after a redirect;
4. relay both ways until both sides have closed: EOF on one side is passed on
   as a half-close, a failure on either closes both, and each direction waits
   for the other side's write buffer to drain before reading more (flow control:
   a slow reader never makes the gateway buffer without bound).

Tracing (dlm/tracing.py's rules; service name "dlm-gateway" unless OTEL_SERVICE_NAME
says otherwise): when it is on, the gateway also reads the client's hello frame, the
only frame it ever reads (unsealed, sent before any proof), without consuming it:
every byte read goes on to the member unchanged. A hello that carries a ``trace``
(a traced client's context, dlm/wire.py ``Hello``) gets one span ``dlm.gateway.route``,
child of that context, from the connection's accept to the moment the member's
connection is up and the relay starts: partition, member, dial attempts, whether
the client named the member. The read is bounded (``HELLO_CAP`` bytes, within the
routing timeout); past either the gateway gives up on the span silently and relays
as usual. A TLS client's hello is ciphertext to the gateway: no span. When tracing
is off, nothing here reads the hello and OpenTelemetry is never imported.

The gateway reads no frame after the hello: the member authenticates
the client end to end, so it holds no secret and a stolen gateway can
impersonate nobody. At most ``max_clients`` connections are open at once, and at
most ``MAX_ROUTING`` of them still sending their routing bytes; one more is
closed at once. On SIGTERM or SIGINT it stops accepting, closes every
connection and returns 0. Warnings a client can cause at will (a refused
target, a connection that failed) go through the runtime's QuietLog: at most
one line a second each, with a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

from dlm import tracing
from dlm.event_loop import open_socket, running_loop_name
from dlm.gateway.routing import GatewayRouter
from dlm.node.runtime.log import INFO, Logger
from dlm.node.runtime.quiet import QuietLog, loop_exception_handler
from dlm.partitioning import Routing, preamble, read_routing
from dlm.wire import ProtocolError, decode_body, encode_frame, parse_addr, traceparent_problem

ROUTING_TIMEOUT_S = 5.0
"""How long a connection may take to send its routing bytes and its first own byte."""
DIAL_TIMEOUT_S = 2.0
"""How long one dial of a member may take before the next member is tried."""
RELAY_CHUNK = 65536
"""The most bytes one read takes from either side."""
DEFAULT_MAX_CLIENTS = 4096
MAX_ROUTING = 512
"""Connections still sending their routing bytes at once (as the supervisor's cap): one
more is closed at once, so clients that connect and say nothing cannot hold the rest."""
NOTICE = encode_frame({"t": "gateway", "version": 1})
"""The frame a plain (non-TLS) client reads first through a gateway."""
TLS_RECORD = 0x16
HELLO_CAP = 4096
"""The largest hello body the gateway reads for its trace context (a client's hello,
with a handshake's fields, is a few hundred bytes); a longer one is relayed unread."""
ROUTE_SPAN = "dlm.gateway.route"


class Gateway:
    """One gateway process: a listener, a router, and the connections it relays."""

    def __init__(
        self,
        members: Sequence[str],
        log: Logger,
        *,
        max_clients: int = DEFAULT_MAX_CLIENTS,
        max_routing: int = MAX_ROUTING,
    ) -> None:
        self.router = GatewayRouter(members)
        self.max_routing = max_routing
        self.routing = 0
        """Connections still sending their routing bytes."""
        self.log = log
        self.quiet = QuietLog(log)
        """Warnings a client can cause at will: at most one line a second each."""
        self.max_clients = max_clients
        self.open = 0
        """Client connections open now (routing or relaying)."""
        self.refused = 0
        """Connections closed for bad routing bytes, a refused target, a timeout or the cap."""
        self.relayed = 0
        """Connections relayed to a member so far."""
        self._writers: set[asyncio.StreamWriter] = set()
        self._stopping: asyncio.Event | None = None
        self.traced = False
        """Tracing is on in this process (decided as ``run`` starts)."""

    def stop(self) -> None:
        """Stops ``run`` as SIGTERM does (from the loop's thread)."""
        if self._stopping is not None:
            self._stopping.set()

    async def run(self, listener: socket.socket, *, signals: bool = True) -> int:
        """Serves ``listener`` until SIGTERM or SIGINT (or ``stop``); 0 once every
        connection is closed. ``signals=False``: leave the signal handlers alone (tests)."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.traced = tracing.enabled("dlm-gateway", batch=True)
        handled = (signal.SIGTERM, signal.SIGINT) if signals else ()
        for signum in handled:
            loop.add_signal_handler(signum, self._stopping.set)
        loop.set_exception_handler(loop_exception_handler(self.quiet))
        server = await asyncio.start_server(self._serve, sock=listener, limit=RELAY_CHUNK)
        flushing = asyncio.ensure_future(self._flush_warnings())
        host, port = listener.getsockname()[:2]
        self.log.log(
            INFO,
            "gateway_listening",
            address=f"{host}:{port}",
            members=list(self.router.members),
            event_loop=running_loop_name(loop),
        )
        try:
            await self._stopping.wait()
        finally:
            flushing.cancel()
            server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5.0)
            for signum in handled:
                loop.remove_signal_handler(signum)
        self.quiet.flush(float("inf"))
        self.log.log(INFO, "gateway_stopped", relayed=self.relayed, refused=self.refused)
        if self.traced:
            tracing.shutdown()  # sends the spans still buffered
        return 0

    async def _flush_warnings(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.quiet.flush()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_clients:
            self.refused += 1
            writer.transport.abort()
            return
        accepted_ns = time.time_ns()
        self.open += 1
        self._writers.add(writer)
        try:
            await self._route(reader, writer, accepted_ns)
        except Exception as exc:  # one connection's trouble never stops the gateway
            self.quiet.warning("gateway_connection_failed", error=str(exc) or type(exc).__name__)
        finally:
            self.open -= 1
            self._writers.discard(writer)
            writer.transport.abort()

    async def _route(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, accepted_ns: int
    ) -> None:
        if self.routing >= self.max_routing:
            self.refused += 1
            self.quiet.warning("gateway_shed", reason="too many connections sending nothing yet")
            return
        self.routing += 1
        routing_ends = asyncio.get_running_loop().time() + ROUTING_TIMEOUT_S
        try:
            routed = await asyncio.wait_for(_routing_bytes(reader), ROUTING_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            self.refused += 1
            return
        finally:
            self.routing -= 1
        if routed is None:
            self.refused += 1
            return
        routing, first = routed
        span = _RouteSpan()
        if self.traced and first[0] != TLS_RECORD:
            head = bytearray(first)
            parent = await _hello_trace(reader, head, routing_ends)
            first = bytes(head)  # every byte read goes on to the member
            if parent is not None:
                span.span = tracing.start_span(
                    ROUTE_SPAN,
                    parent,
                    attributes={
                        "dlm.partition": routing.partition,
                        "dlm.targeted": routing.target is not None,
                    },
                    start_ns=accepted_ns,
                    kind="server",
                )
        try:
            await self._dial_and_relay(reader, writer, routing, first, span)
        finally:
            span.end("no member reached")  # nothing to do once the relay began

    async def _dial_and_relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        routing: Routing,
        first: bytes,
        span: _RouteSpan,
    ) -> None:
        """Dials the member for ``routing`` and relays; ends ``span`` as the relay starts."""
        plan = self.router.plan(routing.partition, routing.target)
        if plan is None:
            self.refused += 1
            self.quiet.warning(
                "gateway_target_refused",
                target=routing.target,
                partition=routing.partition,
                peer=_peer(writer),
            )
            return
        member = await self._dial(routing.partition, plan)
        if member is None:
            return
        member_reader, member_writer, address, attempts = member
        self._writers.add(member_writer)
        try:
            member_writer.write(preamble(routing.partition) + first)
            if first[0] != TLS_RECORD:
                writer.write(NOTICE)
            self.relayed += 1
            span.end(attributes={"dlm.member": address, "dlm.dial_attempts": attempts})
            await _relay(reader, writer, member_reader, member_writer)
        finally:
            self._writers.discard(member_writer)
            member_writer.transport.abort()

    async def _dial(
        self, partition: int, plan: list[str]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str, int] | None:
        """The first member of ``plan`` that answers: its streams, its address and how
        many dials it took; None when none did."""
        for attempt, address in enumerate(plan, start=1):
            host, port = parse_addr(address)
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, limit=RELAY_CHUNK), DIAL_TIMEOUT_S
                )
            except (TimeoutError, OSError):
                self.router.dial_failed(partition, address)
                continue
            sock = open_socket(writer.transport)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return reader, writer, address, attempt
        self.quiet.warning("gateway_no_member", partition=partition, tried=plan)
        return None


async def _routing_bytes(reader: asyncio.StreamReader) -> tuple[Routing, bytes] | None:
    """The connection's routing (None: malformed) and the client's first byte of its own."""
    seen = b""
    while True:
        answer = read_routing(seen)
        if answer is None or isinstance(answer, Routing):
            break
        seen += await reader.readexactly(answer - len(seen))
    if answer is None:
        return None
    first = seen[answer.consumed :]
    if not first:
        first = await reader.readexactly(1)
    return answer, first


class _RouteSpan:
    """A connection's ``dlm.gateway.route`` span (``span`` None: not traced), ended once."""

    __slots__ = ("span",)

    def __init__(self) -> None:
        self.span: Any = None

    def end(self, error: str | None = None, attributes: dict[str, Any] | None = None) -> None:
        if self.span is None:
            return
        span, self.span = self.span, None
        for name, value in (attributes or {}).items():
            span.set_attribute(name, value)
        tracing.end_span(span, error=error)


async def _hello_trace(
    reader: asyncio.StreamReader, head: bytearray, routing_ends: float
) -> str | None:
    """The ``trace`` of the client's hello, whose first bytes are ``head``; every byte
    read is appended to ``head`` (to go on to the member). None, silently, when the
    hello carries no valid trace, is longer than HELLO_CAP, or is not in by
    ``routing_ends`` (the loop's clock)."""
    left = routing_ends - asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(max(left, 0.0)):
            if len(head) < 4:
                head += await reader.readexactly(4 - len(head))
            length = int.from_bytes(head[:4], "big")
            if length > HELLO_CAP:
                return None
            if len(head) < 4 + length:
                head += await reader.readexactly(4 + length - len(head))
    except asyncio.IncompleteReadError as exc:
        head += exc.partial
        return None
    except (TimeoutError, OSError):
        return None
    try:
        hello = decode_body(bytes(head[4 : 4 + length]))
    except ProtocolError:
        return None
    if not isinstance(hello, dict) or hello.get("t") != "hello":
        return None
    trace = hello.get("trace")
    return trace if isinstance(trace, str) and traceparent_problem(trace) is None else None


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copies ``source`` to ``sink`` until EOF, then half-closes ``sink``."""
    while True:
        data = await source.read(RELAY_CHUNK)
        if not data:
            break
        sink.write(data)
        await sink.drain()  # flow control: wait while the sink's buffer is full
    if sink.can_write_eof():
        sink.write_eof()


async def _relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    member_reader: asyncio.StreamReader,
    member_writer: asyncio.StreamWriter,
) -> None:
    """Both directions until both ended; the first failure ends both."""
    pumps = [
        asyncio.ensure_future(_pump(client_reader, member_writer)),
        asyncio.ensure_future(_pump(member_reader, client_writer)),
    ]
    try:
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
        for pump in done:
            if pump.exception() is not None:
                return
        # One direction ended cleanly; the other runs until its own EOF.
        await asyncio.gather(*pumps, return_exceptions=True)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"
