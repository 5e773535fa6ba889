"""The runtime around a NodeMachine: sockets, the clock, the disk. It decides nothing.

Theory of operation
-------------------
machine.py makes every decision; this adapter only moves things between it
and the operating system, on one asyncio event loop (anyio for tasks,
signals and threads; plain asyncio protocols for sockets, because anyio's
streams cost a selector re-arm and a loop round trip per receive and send,
which on the hot path was more than the work itself):

* **connections**: one listening port for clients and peers. The first frame
  (the hello) decides the role. Transport rules live here: frame size limits,
  a deadline for the hello and for a frame that stalls half-way, the cap on
  connections, the write-buffer cap of a client that does not read. A
  client's frames go to ``machine.client_frame``; a peer's Raft messages to
  ``machine.peer_messages``.
* **the clock**: a timer task sleeps until ``machine.next_timer()``.
* **the disk**: ``Persist`` and ``SaveSnapshot`` actions go, in order, to one
  worker thread; each completion comes back to the loop as
  ``machine.persisted(job)``. While the disk works, the loop keeps reading,
  ticking and sending (the leader's appends and heartbeats leave before its
  own fsync: Raft dissertation §10.2.1).
* **peers**: a ``PeerLink`` (peers.py) per member carries our messages out.

After every event the adapter executes ``machine.take_actions()`` in order.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from dlm.node.config import NodeConfig
from dlm.node.log import Logger
from dlm.node.machine import (
    Action,
    CloseConnection,
    Instant,
    LogEvent,
    MachineConfig,
    NodeMachine,
    PeersChanged,
    Persist,
    SaveSnapshot,
    SendFrame,
    SendMessages,
    Stop,
)
from dlm.node.notify import notify
from dlm.node.peer_codec import decode_raft_frame
from dlm.node.peers import PeerLink, split_first_frame
from dlm.node.raft.types import Storage
from dlm.node.stats import DiskStats
from dlm.wire import (
    CLIENT_FRAME_LIMIT,
    PEER_FRAME_LIMIT,
    PROTOCOL_VERSION,
    ErrorCode,
    FrameDecoder,
    Hello,
    HelloRole,
    ProtocolError,
    encode_frame,
    error,
    parse_addr,
    welcome,
)

HELLO_TIMEOUT = 5.0
"""A connection that has not completed its hello by then is closed."""
FRAME_STALL_TIMEOUT = 10.0
"""A client connection holding half a frame this long is closed (a slow-loris)."""
IDLE_TIMEOUT = 120.0
"""A client connection silent this long is closed (idle clients ping every 30 s)."""
CLIENT_BUFFER_LIMIT = 16 * CLIENT_FRAME_LIMIT
"""Unsent reply bytes beyond which a client that does not read is cut off."""
MAX_CONNECTIONS = 8192
"""Client connections per member; peers always get in (they are few)."""


class RemovedMember(Exception):
    """This data directory belongs to a member that was removed; the message says what to do."""


def now() -> Instant:
    return Instant(time.monotonic(), int(time.time() * 1000))


@dataclass(slots=True)
class Limits:
    """Transport limits (the tests lower them)."""

    hello_timeout: float = HELLO_TIMEOUT
    frame_stall_timeout: float = FRAME_STALL_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS


class _Persister:
    """The one thread that touches the disk: jobs run in the order they were queued."""

    def __init__(self, storage: Storage, loop: asyncio.AbstractEventLoop) -> None:
        self._storage = storage
        self._loop = loop
        # Test-only (tests/chaos): a slow disk, this many ms more for every write of entries.
        delay = os.environ.get("DLM_TEST_FSYNC_DELAY_MS", "").strip()
        self._test_delay_s = int(delay) / 1000.0 if delay.isdigit() else 0.0
        self._queue: queue.SimpleQueue[tuple[Persist | SaveSnapshot, Callable[..., None]] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dlm-persist", daemon=True)
        self._thread.start()
        self.failure: BaseException | None = None
        self.stats = DiskStats()

    def submit(self, job: Persist | SaveSnapshot, done: Callable[..., None]) -> None:
        self._queue.put((job, done))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        storage = self._storage
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, done = item
            started = time.perf_counter()
            try:
                if isinstance(job, Persist):
                    if job.snapshot is not None:
                        storage.apply_snapshot(job.snapshot)
                    if job.entries:
                        if self._test_delay_s:
                            time.sleep(self._test_delay_s)
                        storage.append(job.entries)
                    if job.hard_state is not None:
                        # A commit-only change costs no disk write (commit is advisory).
                        storage.set_hard_state(job.hard_state)
                    if job.entries:
                        self.stats.fsync.observe(time.perf_counter() - started)
                        self.stats.batch.observe(len(job.entries))
                else:
                    existing = storage.snapshot()
                    if existing is None or existing.meta.index < job.index:
                        storage.create_snapshot(job.index, job.conf, job.data)
                    if job.compact_to > storage.first_index() - 1:
                        storage.compact(min(job.compact_to, job.index))
            except BaseException as exc:  # the loop decides what a failed disk means
                self.failure = exc
                self._loop.call_soon_threadsafe(done, exc)
                return
            self._loop.call_soon_threadsafe(done, None)


@dataclass(slots=True, eq=False)
class _Client:
    number: int
    transport: asyncio.Transport
    decoder: FrameDecoder
    last_heard: float
    partial_since: float | None = None


@dataclass(slots=True)
class Counters:
    """Transport figures for status and metrics."""

    connections_refused: int = 0
    frames_in: int = 0
    peer_frames: dict[str, int] = field(default_factory=dict)


class NodeServer:
    """A running member. Create it, then ``await serve(listener)`` inside a task group."""

    def __init__(
        self,
        config: NodeConfig,
        storage: Storage,
        *,
        log: Logger | None = None,
        rng: random.Random | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.log = log or Logger(config.node_id)
        self.limits = limits or Limits()
        self._rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        self.machine = NodeMachine(
            MachineConfig(
                node_id=config.node_id,
                cluster=config.cluster,
                peers={node: _addr_text(addr) for node, addr in sorted(config.peers.items())},
                address=config.address,
                auto_promote=config.auto_promote,
                timing=config.timing,
                snapshot_every=config.snapshot_every,
                snapshot_keep=config.snapshot_keep,
                quotas=config.quotas,
            ),
            storage,
            self._rng,
            now(),
        )
        self.counters = Counters()
        self.exit_code = 0
        self.stopped = anyio.Event()
        self.leader_seen = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._persister: _Persister | None = None
        self._clients: dict[int, _Client] = {}
        self._next_conn = 1
        self._links: dict[str, PeerLink] = {}
        self._peer_conns: dict[str, set[_Connection]] = {}
        """Inbound connections of each peer (the ones it dialled to us)."""
        self._link_scopes: dict[str, anyio.CancelScope] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._wake = asyncio.Event()
        self._servers: list[asyncio.Server] = []
        self._transports: set[asyncio.Transport] = set()
        self._listener: anyio.abc.Listener[Any] | None = None
        self._stopping = False
        self._pending_peers: dict[str, str] | None = None
        self.failure: BaseException | None = None
        """Why the disk worker stopped the member, if it did."""
        self.stop_reason: str | None = None
        """Why the machine asked the member to stop (removed from the cluster), if it did."""
        self.metrics: Any = None
        """The /metrics listener, when --metrics-listen is given."""

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, listener: anyio.abc.Listener[Any]) -> None:
        """Runs until ``shutdown`` (or cancellation); closes nothing it did not open."""
        self._listener = listener
        loop = self._loop = asyncio.get_running_loop()
        self._persister = _Persister(self.storage, loop)
        for sock in _raw_sockets(listener):
            self._servers.append(await loop.create_server(lambda: _Connection(self), sock=sock))
        if self.config.metrics_listen is not None:
            await self._start_metrics(*self.config.metrics_listen)
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                if self._pending_peers is not None:
                    self._reconcile_links(self._pending_peers)
                    self._pending_peers = None
                tg.start_soon(self._timer_loop)
                self.log.info(
                    "node_started",
                    address=self.config.address,
                    cluster=self.config.cluster,
                    voters=list(self.machine.raft.voters),
                    term=self.machine.raft.term,
                    commit=self.machine.raft.commit_index,
                    last_index=self.machine.raft.last_index,
                )
                self._run_actions()
                notify("READY=1")  # systemd's Type=notify: serving from now on
                try:
                    await self.stopped.wait()
                finally:
                    tg.cancel_scope.cancel()
                    self._stop_serving()
                    if self.metrics is not None:
                        self.metrics.close()
                    for transport in list(self._transports):
                        transport.abort()
        finally:
            self._persister.stop()

    async def _start_metrics(self, host: str, port: int) -> None:
        # prometheus-client is imported only by members that serve metrics.
        from dlm.node.metrics import MetricsListener, registry_for

        listener = MetricsListener(registry_for(self), log=self.log)
        try:
            await listener.start(host, port)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot serve metrics on {_addr_text((host, port))}: {exc.strerror}"
            ) from None
        self.metrics = listener
        self.log.info("metrics_serving", address=_addr_text((host, listener.port)))

    async def shutdown(self) -> None:
        """Stops taking requests, lets in-flight ones finish (bounded), then stops."""
        if self._stopping:
            return
        self._stopping = True
        notify("STOPPING=1")
        # Connections waiting in the backlog are refused now, so their clients
        # move on to another member instead of waiting for us to exit.
        self._stop_serving()
        if self._listener is not None:
            with anyio.CancelScope(shield=True):
                await self._listener.aclose()
        machine = self.machine
        machine.begin_shutdown(now())
        self._run_actions()
        deadline = time.monotonic() + self.config.shutdown_grace_s
        while time.monotonic() < deadline and (not machine.idle or machine.transferring):
            await anyio.sleep(0.01)
        machine.finish_shutdown()
        self._run_actions()
        # Let the last replies leave.
        for _ in range(10):
            if not any(c.transport.get_write_buffer_size() for c in self._clients.values()):
                break
            await anyio.sleep(0.01)
        self.stopped.set()

    def _stop_serving(self) -> None:
        for srv in self._servers:
            srv.close()
        self._servers = []

    # ------------------------------------------------------------------ actions

    def _run_actions(self) -> None:
        """Carries out everything the machine asked for, in order."""
        machine = self.machine
        touched: set[PeerLink] = set()
        while True:
            actions = machine.take_actions()
            if not actions:
                break
            for action in actions:
                self._perform(action, touched)
        for link in touched:
            link.flush()
        if machine.leader is not None and not self.leader_seen.is_set():
            self.leader_seen.set()
        self._wake.set()

    def _perform(self, action: Action, touched: set[PeerLink]) -> None:
        if isinstance(action, SendFrame):
            client = self._clients.get(action.conn)
            if client is not None:
                self._write(client, action.frame)
        elif isinstance(action, SendMessages):
            link = self._links.get(action.peer)
            if link is not None:
                for msg in action.messages:
                    link.send(msg)
                touched.add(link)
        elif isinstance(action, Persist | SaveSnapshot):
            assert self._persister is not None
            self._persister.submit(action, self._persist_done(action))
        elif isinstance(action, LogEvent):
            self.log.log(_LEVELS.get(action.level, 20), action.event, **action.fields)
        elif isinstance(action, CloseConnection):
            client = self._clients.get(action.conn)
            if client is not None:
                client.transport.close()
        elif isinstance(action, PeersChanged):
            self._reconcile_links(action.peers)
        elif isinstance(action, Stop):
            self.log.info("stopping", reason=action.reason)
            self.exit_code = action.code
            self.stop_reason = action.reason
            self.stopped.set()

    def _persist_done(
        self, action: Persist | SaveSnapshot
    ) -> Callable[[BaseException | None], None]:
        def done(failure: BaseException | None) -> None:
            if failure is not None:
                self.log.error("persist_failed", error=repr(failure))
                self.failure = failure
                self.stopped.set()
                return
            if isinstance(action, Persist):
                self.machine.persisted(action.job, now())
                self._run_actions()

        return done

    def _write(self, client: _Client, frame: dict[str, Any]) -> None:
        transport = client.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > CLIENT_BUFFER_LIMIT:
            # A client that does not read its replies must not grow our memory.
            transport.abort()
            return
        transport.write(encode_frame(frame))

    # ------------------------------------------------------------------ the clock

    async def _timer_loop(self) -> None:
        machine = self.machine
        while True:
            delay = machine.next_timer() - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            machine.timer(now())
            self._check_clients(time.monotonic())
            self._run_actions()

    def _check_clients(self, mono: float) -> None:
        limits = self.limits
        for client in list(self._clients.values()):
            stalled = client.partial_since is not None and (
                mono - client.partial_since > limits.frame_stall_timeout
            )
            if stalled or mono - client.last_heard > limits.idle_timeout:
                client.transport.abort()

    # ------------------------------------------------------------------ peers

    def _reconcile_links(self, peers: dict[str, str]) -> None:
        # A member that left the configuration loses its connections to us too: when it
        # dials again it is told it was removed, and stops.
        for peer_id in [p for p in self._peer_conns if p not in peers]:
            for conn in self._peer_conns.pop(peer_id):
                conn.close()
        tg = self._task_group
        if tg is None:
            self._pending_peers = peers
            return
        for peer_id in [p for p in self._links if p not in peers]:
            self._link_scopes.pop(peer_id).cancel()
            del self._links[peer_id]
        for peer_id, address in sorted(peers.items()):
            link = self._links.get(peer_id)
            host_port = parse_addr(address)
            if link is not None and link.address == host_port:
                continue
            if link is not None:
                self._link_scopes.pop(peer_id).cancel()
            link = PeerLink(
                local_id=self.config.node_id,
                peer_id=peer_id,
                address=host_port,
                cluster=self.config.cluster,
                log=self.log,
                on_down=self._peer_down,
                on_welcome=self._peer_welcomed,
                on_refused=self._peer_refused,
                rng=random.Random(self._rng.random()),
            )
            self._links[peer_id] = link
            scope = anyio.CancelScope()
            self._link_scopes[peer_id] = scope
            tg.start_soon(self._run_link, link, scope)

    @staticmethod
    async def _run_link(link: PeerLink, scope: anyio.CancelScope) -> None:
        with scope:
            await link.run()

    def _peer_down(self, peer: str) -> None:
        self.machine.peer_unreachable(peer, now())
        self._run_actions()

    def _peer_welcomed(self, peer: str, version: int) -> None:
        self.machine.peer_version(peer, version)

    def _peer_refused(self, peer: str, message: str) -> None:
        self.machine.peer_refused(peer, message)
        self._run_actions()

    def _peer_frames(self, src: str, decoder: FrameDecoder) -> None:
        """Steps every Raft message buffered from ``src``; ProtocolError ends the connection."""
        machine = self.machine
        count = 0
        for obj in decoder.frames():
            count += 1
            machine.peer_messages(src, decode_raft_frame(obj), now())
        if count:
            frames = self.counters.peer_frames
            frames[src] = frames.get(src, 0) + count
            self._run_actions()

    # ------------------------------------------------------------------ clients

    def _client_hello(self, hello: Hello) -> dict[str, Any] | None:
        """The error that refuses a client's hello, or None to accept it."""
        if hello.cluster and hello.cluster != self.config.cluster:
            message = (
                f"this member is in cluster {self.config.cluster!r}, "
                f"not {hello.cluster!r}: check DLM_CLUSTER"
            )
            return error(None, ErrorCode.BAD_REQUEST, message)
        if self._stopping:
            return error(None, ErrorCode.SHUTTING_DOWN, "member is shutting down")
        if len(self._clients) >= self.limits.max_connections:
            self.counters.connections_refused += 1
            return error(
                None,
                ErrorCode.UNAVAILABLE,
                "this member has too many connections: try another member",
                retry_after_ms=1000,
            )
        return None

    def _client_opened(self, transport: asyncio.Transport, where: str) -> _Client:
        number = self._next_conn
        self._next_conn += 1
        client = _Client(number, transport, FrameDecoder(CLIENT_FRAME_LIMIT), time.monotonic())
        self._clients[number] = client
        self.machine.client_connected(number, where)
        return client

    def _client_closed(self, client: _Client) -> None:
        if self._clients.pop(client.number, None) is not None:
            self.machine.client_closed(client.number)
            self._run_actions()

    def _client_data(self, client: _Client) -> bool:
        """Hands every complete frame to the machine; False when the connection must close."""
        machine = self.machine
        decoder = client.decoder
        mono = time.monotonic()
        client.last_heard = mono
        handled = 0
        try:
            for obj in decoder.frames():
                handled += 1
                machine.client_frame(client.number, obj, now())
        except ProtocolError as exc:
            # Framing is lost (an oversized length, bytes that are not CBOR): say why, hang up.
            self.counters.frames_in += handled
            self._write(client, error(None, exc.code, str(exc)))
            self._run_actions()
            return False
        self.counters.frames_in += handled
        client.partial_since = (client.partial_since or mono) if decoder.pending else None
        if handled:
            self._run_actions()
        return True

    def status_view(self) -> dict[str, Any]:
        return self.machine.status_view(now())

    @staticmethod
    def now() -> Instant:
        return now()

    @property
    def client_count(self) -> int:
        return len(self._clients)

    @property
    def disk_stats(self) -> DiskStats:
        return self._persister.stats if self._persister is not None else DiskStats()


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class _Connection(asyncio.Protocol):
    """One accepted TCP connection. Its hello decides whether a client or a peer speaks.

    Everything runs in the transport's callbacks, on the loop thread: frames
    are handled as they arrive.
    """

    def __init__(self, server: NodeServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._where = "?"
        self._hello_buf: bytearray | None = bytearray()
        self._hello_timer: asyncio.TimerHandle | None = None
        self._client: _Client | None = None
        self._peer: str | None = None
        self._peer_decoder: FrameDecoder | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._where = _remote(transport.get_extra_info("peername"))
        self._server._transports.add(transport)
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(self._server.limits.hello_timeout, transport.abort)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is not None:
            conns = self._server._peer_conns.get(self._peer)
            if conns is not None:
                conns.discard(self)
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self._transport is not None:
            self._server._transports.discard(self._transport)
        if self._client is not None:
            self._server._client_closed(self._client)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        server = self._server
        if self._client is not None:
            self._client.decoder.feed(data)
            if not server._client_data(self._client):
                transport.close()  # after the final error is flushed
            return
        if self._peer is not None:
            assert self._peer_decoder is not None
            self._peer_decoder.feed(data)
            self._peer_data()
            return
        self._hello(data)

    def _peer_data(self) -> None:
        assert self._peer is not None and self._peer_decoder is not None
        try:
            self._server._peer_frames(self._peer, self._peer_decoder)
        except ProtocolError as exc:
            self._server.log.warning(
                "peer_bad_frame", peer=self._peer, remote=self._where, error=str(exc)
            )
            if self._transport is not None:
                self._transport.abort()

    def _hello(self, data: bytes) -> None:
        """Consumes the hello; then the connection knows its role."""
        assert self._transport is not None and self._hello_buf is not None
        transport, server, where = self._transport, self._server, self._where
        self._hello_buf += data
        try:
            first = split_first_frame(self._hello_buf)
            if first is None:
                return
            hello = Hello.from_wire(first[0])
        except ProtocolError as exc:
            server.log.warning("bad_hello", remote=where, error=str(exc))
            _send_and_close(transport, error(None, exc.code, _hello_problem(exc)))
            return
        self._hello_buf = None
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if hello.version > PROTOCOL_VERSION:
            message = (
                f"protocol version {hello.version} is not supported "
                f"(this member speaks 1 to {PROTOCOL_VERSION}): upgrade this member"
            )
            server.log.warning("bad_hello", remote=where, error=message)
            _send_and_close(transport, error(None, ErrorCode.BAD_REQUEST, message))
            return
        version = min(hello.speaks, PROTOCOL_VERSION)
        config = server.config
        rest = first[1]
        if hello.role is HelloRole.PEER:
            problem = server.machine.accept_peer(hello.node, hello.speaks)
            if problem is None and hello.cluster != config.cluster:
                problem = (
                    f"cluster id mismatch: this member {config.node_id} is in cluster "
                    f"{config.cluster!r}, the peer says {hello.cluster!r}"
                )
            if problem is not None:
                server.log.warning("peer_refused", remote=where, peer=hello.node, reason=problem)
                _send_and_close(transport, error(None, ErrorCode.BAD_REQUEST, problem))
                return
            server.machine.peer_version(hello.node, hello.speaks)
            transport.write(encode_frame(welcome(config.node_id, config.cluster, version)))
            self._peer = hello.node
            server._peer_conns.setdefault(hello.node, set()).add(self)
            self._peer_decoder = FrameDecoder(PEER_FRAME_LIMIT)
            if rest:
                self._peer_decoder.feed(rest)
                self._peer_data()
            return
        refusal = server._client_hello(hello)
        if refusal is not None:
            _send_and_close(transport, refusal)
            return
        transport.write(encode_frame(welcome(config.node_id, config.cluster, version)))
        self._client = client = server._client_opened(transport, where)
        if rest:
            client.decoder.feed(rest)
            if not server._client_data(client):
                transport.close()


def _hello_problem(exc: ProtocolError) -> str:
    message = str(exc)
    if exc.code is ErrorCode.TOO_LARGE:
        return f"{message}: this port speaks the dlm protocol"
    return message


def _send_and_close(transport: asyncio.Transport, frame: dict[str, Any]) -> None:
    transport.write(encode_frame(frame))
    transport.close()


def _raw_sockets(listener: anyio.abc.Listener[Any]) -> list[socket.socket]:
    listeners = getattr(listener, "listeners", None) or [listener]
    return [item.extra(anyio.abc.SocketAttribute.raw_socket) for item in listeners]


def _remote(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return "?" if addr is None else str(addr)


def _addr_text(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------- process entry


async def run(
    config: NodeConfig,
    storage: Storage,
    listener: anyio.abc.Listener[Any],
    *,
    log: Logger,
    on_started: Callable[[NodeServer], None] | None = None,
) -> int:
    """Serves until SIGTERM/SIGINT (then shuts down gracefully) or until the machine says
    stop; returns the exit code."""
    server = NodeServer(config, storage, log=log)
    if server.machine.raft.removed:
        raise RemovedMember(
            f"member {config.node_id} was removed from the cluster: to bring it back, remove "
            f"its data directory ({config.data_dir}) and start it with --join"
        )
    async with anyio.create_task_group() as tg:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("signal", signal=signal.Signals(signum).name)
                    tg.start_soon(server.shutdown)
                    break
            # A second signal means "now".
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    server.stopped.set()
                    break

        tg.start_soon(watch_signals)
        if on_started is not None:
            on_started(server)
        await server.serve(listener)
        tg.cancel_scope.cancel()
    if server.failure is not None:
        raise server.failure
    if server.stop_reason is not None:
        sys.stderr.write(f"dlm node: {server.stop_reason}\n")
        sys.stderr.flush()
    return server.exit_code
