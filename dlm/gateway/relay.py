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

The gateway reads no frame after the routing bytes: the member authenticates
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
from collections.abc import Sequence

from dlm.gateway.routing import GatewayRouter
from dlm.node.runtime.log import INFO, Logger
from dlm.node.runtime.quiet import QuietLog, loop_exception_handler
from dlm.partitioning import Routing, preamble, read_routing
from dlm.wire import encode_frame, parse_addr

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

    def stop(self) -> None:
        """Stops ``run`` as SIGTERM does (from the loop's thread)."""
        if self._stopping is not None:
            self._stopping.set()

    async def run(self, listener: socket.socket, *, signals: bool = True) -> int:
        """Serves ``listener`` until SIGTERM or SIGINT (or ``stop``); 0 once every
        connection is closed. ``signals=False``: leave the signal handlers alone (tests)."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        handled = (signal.SIGTERM, signal.SIGINT) if signals else ()
        for signum in handled:
            loop.add_signal_handler(signum, self._stopping.set)
        loop.set_exception_handler(loop_exception_handler(self.quiet))
        server = await asyncio.start_server(self._serve, sock=listener, limit=RELAY_CHUNK)
        flushing = asyncio.ensure_future(self._flush_warnings())
        host, port = listener.getsockname()[:2]
        self.log.log(
            INFO, "gateway_listening", address=f"{host}:{port}", members=list(self.router.members)
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
        self.open += 1
        self._writers.add(writer)
        try:
            await self._route(reader, writer)
        except Exception as exc:  # one connection's trouble never stops the gateway
            self.quiet.warning("gateway_connection_failed", error=str(exc) or type(exc).__name__)
        finally:
            self.open -= 1
            self._writers.discard(writer)
            writer.transport.abort()

    async def _route(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.routing >= self.max_routing:
            self.refused += 1
            self.quiet.warning("gateway_shed", reason="too many connections sending nothing yet")
            return
        self.routing += 1
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
        member_reader, member_writer = member
        self._writers.add(member_writer)
        try:
            member_writer.write(preamble(routing.partition) + first)
            if first[0] != TLS_RECORD:
                writer.write(NOTICE)
            self.relayed += 1
            await _relay(reader, writer, member_reader, member_writer)
        finally:
            self._writers.discard(member_writer)
            member_writer.transport.abort()

    async def _dial(
        self, partition: int, plan: list[str]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for address in plan:
            host, port = parse_addr(address)
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, limit=RELAY_CHUNK), DIAL_TIMEOUT_S
                )
            except (TimeoutError, OSError):
                self.router.dial_failed(partition, address)
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return reader, writer
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
