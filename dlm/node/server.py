"""The runtime around a NodeMachine: sockets, the clock, the disk. It decides nothing.

Theory of operation
-------------------
machine.py makes every decision; this adapter only moves things between it
and the operating system, on one asyncio event loop (anyio for tasks,
signals and threads; plain asyncio protocols for sockets, because anyio's
streams cost a selector re-arm and a loop round trip per receive and send,
which on the hot path was more than the work itself):

* **connections**: one listening port for clients and peers (TLS when
  configured). The first frame (the hello) decides the role; with a secret
  for that role, the connection must then complete the handshake of
  dlm/auth.py, and every later frame carries its tag. Nothing a connection
  sends reaches the machine before it is admitted. Transport rules live
  here: frame size limits, a deadline for the hello (and the handshake) and
  for a frame that stalls half-way, the cap on client connections and the
  budget of descriptors, the write-buffer cap of a client that does not read.
  A client's frames go to ``machine.client_frame``; a peer's Raft messages
  to ``machine.peer_messages``.
* **the clock**: a timer task sleeps until ``machine.next_timer()``.
* **the disk**: ``Persist`` and ``SaveSnapshot`` actions go, in order, to one
  worker thread, which writes the jobs that queued up together with one
  fsync; each completion comes back to the loop as ``machine.persisted(job)``.
  While the disk works, the loop keeps reading, ticking and sending (the
  leader's appends and heartbeats leave before its own fsync: Raft
  dissertation §10.2.1). A follower whose disk thread is idle writes on the
  loop thread instead (``_persist_inline``).
* **batching**: every frame, peer answer and disk completion of one loop turn
  is fed to the machine first; the machine hands out its work once, at the
  end of the turn (``_pump_soon``).
* **peers**: a ``PeerLink`` (peers.py) per member carries our messages out.

After every event the adapter executes ``machine.take_actions()`` in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import queue
import random
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import anyio.abc

from dlm.node import locks
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
from dlm.node.quiet import QuietLog, loop_exception_handler
from dlm.node.raft.types import Entry, Role, Storage
from dlm.node.rlimits import raise_open_files_limit
from dlm.node.security import NodeSecurity
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
    as_map,
    encode_frame,
    error,
    parse_addr,
    welcome,
)

HELLO_TIMEOUT = 5.0
"""A connection that has not completed its hello (and its handshake) by then is closed."""
FRAME_STALL_TIMEOUT = 5.0
"""A client connection holding half a frame this long is closed (a slow-loris)."""
IDLE_TIMEOUT = 120.0
"""A client connection silent this long is closed (idle clients ping every 30 s)."""
EVICT_IDLE_AFTER = 5.0
"""When the client cap is reached, a new client takes the place of the one silent the
longest, if that one has been silent at least this long (it reconnects when it needs to)."""
CLIENT_CHECK_EVERY = 0.5
"""Seconds between two looks for stalled and idle clients."""
CLIENT_BUFFER_LIMIT = 16 * CLIENT_FRAME_LIMIT
"""Unsent reply bytes beyond which a client that does not read is cut off."""
MAX_CONNECTIONS = 8192
"""Client connections per member; peers always get in (they are few)."""
FD_RESERVE = 128
"""Descriptors kept from connections: log segments, snapshots, the metrics listener's
scrapers (64), the event loop's own."""
HANDSHAKE_ROOM = 64
"""Descriptors kept beyond the client cap for connections still saying hello, so that a
full cap never stops the member from accepting (peers, and replies saying it is full)."""
AUTH_FRAME_LIMIT = 1024
"""The ``auth`` frame is a proof of 32 bytes: anything longer is not one."""


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
    evict_idle_after: float = EVICT_IDLE_AFTER


class Budget:
    """How many connections this member takes, from its open-files limit.

    Every accepted connection holds a descriptor, and a member out of descriptors
    cannot accept anyone, not even a peer. So the member keeps FD_RESERVE for its
    files, one per outbound peer link, and counts the rest: ``transports`` is how
    many connections may be open at once (beyond it the oldest one still saying
    hello is dropped), ``clients`` how many of them may be admitted clients, which
    leaves room for the inbound peer connections and HANDSHAKE_ROOM for newcomers.
    """

    __slots__ = ("clients", "transports")

    def __init__(self, open_files: int, peers: int, max_clients: int) -> None:
        self.transports = max(8, open_files - FD_RESERVE - peers)
        self.clients = max(1, min(max_clients, self.transports - peers - HANDSHAKE_ROOM))

    @classmethod
    def for_process(cls, peers: int, max_clients: int) -> Budget:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return cls(1 << 30 if soft == resource.RLIM_INFINITY else soft, peers, max_clients)


class _Persister:
    """The one thread that touches the disk: jobs complete in the order they were queued.

    Group commit: the jobs that queued up while the disk was busy are written
    together, with one fsync (``_merge``), and reported together. Nothing is
    reported before it is durable, and each job still reaches the disk in
    order: a later job's entries replace what an earlier one wrote from their
    first index on, exactly as appending them one after the other would.
    """

    def __init__(
        self,
        storage: Storage,
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[list[Persist | SaveSnapshot], BaseException | None], None],
    ) -> None:
        self._storage = storage
        self._loop = loop
        self._on_done = on_done
        # Test-only (tests/chaos): a slow disk, this many ms more for every write of entries.
        delay = os.environ.get("DLM_TEST_FSYNC_DELAY_MS", "").strip()
        self._test_delay_s = int(delay) / 1000.0 if delay.isdigit() else 0.0
        self._queue: queue.SimpleQueue[Persist | SaveSnapshot | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dlm-persist", daemon=True)
        self._thread.start()
        self.failure: BaseException | None = None
        self.stats = DiskStats()
        self.snapshot_write_s: dict[int, float] = {}
        """Seconds each snapshot took to write and compact behind, by index (read once)."""

    @property
    def slowed(self) -> bool:
        """DLM_TEST_FSYNC_DELAY_MS is set (tests/chaos)."""
        return self._test_delay_s > 0

    def submit(self, job: Persist | SaveSnapshot) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        pending = self._queue
        while True:
            item = pending.get()
            queued: list[Persist | SaveSnapshot | None] = [item]
            while item is not None:
                try:
                    item = pending.get_nowait()
                except queue.Empty:
                    break
                queued.append(item)
            stop = queued[-1] is None
            jobs = [job for job in queued if job is not None]
            while jobs:
                group = _persist_group(jobs)
                del jobs[: len(group)]
                try:
                    self._write(group)
                except BaseException as exc:  # the loop decides what a failed disk means
                    self.failure = exc
                    self._loop.call_soon_threadsafe(self._on_done, group, exc)
                    return
                self._loop.call_soon_threadsafe(self._on_done, group, None)
            if stop:
                return

    def write_now(self, job: Persist) -> None:
        """Writes ``job`` on the calling thread; only while no job is queued or running."""
        self._write([job])

    def _write(self, group: list[Persist | SaveSnapshot]) -> None:
        storage = self._storage
        started = time.perf_counter()
        job = group[0]
        if isinstance(job, SaveSnapshot):
            existing = storage.snapshot()
            if existing is None or existing.meta.index < job.index:
                storage.create_snapshot(job.index, job.conf, job.data)
            if job.compact_to > storage.first_index() - 1:
                storage.compact(min(job.compact_to, job.index))
            self.snapshot_write_s[job.index] = time.perf_counter() - started
            return
        persists = [j for j in group if isinstance(j, Persist)]
        if job.snapshot is not None:
            storage.apply_snapshot(job.snapshot)
        entries = _merge(persists)
        if entries:
            if self._test_delay_s:
                time.sleep(self._test_delay_s)
            storage.append(entries)
        hard_state = next(
            (j.hard_state for j in reversed(persists) if j.hard_state is not None), None
        )
        if hard_state is not None:
            # A commit-only change costs no disk write (commit is advisory).
            storage.set_hard_state(hard_state)
        if entries:
            self.stats.fsync.observe(time.perf_counter() - started)
            self.stats.batch.observe(len(entries))


def _persist_group(jobs: list[Persist | SaveSnapshot]) -> list[Persist | SaveSnapshot]:
    """The first job of ``jobs`` and the Persist jobs after it that can share its fsync.

    A snapshot to install or to save is a group of its own (it rewrites the log
    in ways a merged append cannot express); a snapshot to install may lead a
    group, since the entries after it are appended to the log it leaves.
    """
    first = jobs[0]
    if isinstance(first, SaveSnapshot):
        return [first]
    group: list[Persist | SaveSnapshot] = [first]
    for job in jobs[1:]:
        if not isinstance(job, Persist) or job.snapshot is not None:
            break
        group.append(job)
    return group


def _merge(group: list[Persist]) -> list[Entry]:
    """The entries of ``group`` as one append: each job's entries replace the merged
    ones from their first index on, as a separate append would replace the stored ones."""
    merged: list[Entry] = []
    for job in group:
        entries = job.entries
        if not entries:
            continue
        if merged:
            keep = entries[0].index - merged[0].index
            if keep < len(merged):
                del merged[max(0, keep) :]
        merged.extend(entries)
    return merged


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: for work that builds or drops a whole table."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Locks(locks.LockStateMachine):
    """The lock table, imaged and restored with the cyclic collector paused.

    Imaging or restoring 100,000 locks makes about a million containers, and
    each 700 of them would start a collection, now and then a full one over the
    whole heap: most of the two seconds that imaging took on the leader's loop,
    long enough for its followers to start an election. The image holds no
    cycles, so nothing is left for the collector afterwards.
    """

    def snapshot(self) -> bytes:
        with _collector_paused():
            return super().snapshot()

    @classmethod
    def restore(cls, data: bytes) -> Self:
        with _collector_paused():
            return super().restore(data)


class _Machine(NodeMachine):
    lock_machine_class = _Locks


@dataclass(slots=True, eq=False)
class _ClientConnection:
    number: int
    transport: asyncio.Transport
    decoder: FrameDecoder
    last_heard: float
    partial_since: float | None = None
    sealer: Any = None
    """dlm.auth.FrameSealer for what we send, once the client authenticated (None: plain)."""


@dataclass(slots=True)
class Counters:
    """Transport figures for status and metrics."""

    connections_refused: int = 0
    frames_in: int = 0
    peer_frames: dict[str, int] = field(default_factory=dict)
    auth_failures: int = 0
    connections_shed: int = 0
    """Connections dropped to keep descriptors: still saying hello, or idle clients."""


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
        security: NodeSecurity | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.log = log or Logger(config.node_id)
        self.quiet = QuietLog(self.log)
        self.limits = limits or Limits(max_connections=config.max_connections)
        self.security = security or NodeSecurity()
        self.budget = Budget.for_process(len(config.peers), self.limits.max_connections)
        self._rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        self.machine = _Machine(
            MachineConfig(
                node_id=config.node_id,
                cluster=config.cluster,
                peers={node: _addr_text(addr) for node, addr in sorted(config.peers.items())},
                address=config.address,
                join_members={n: _addr_text(a) for n, a in sorted(config.join_members.items())},
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
        self._clients: dict[int, _ClientConnection] = {}
        self._next_conn = 1
        self._links: dict[str, PeerLink] = {}
        self._link_scopes: dict[str, anyio.CancelScope] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._wake = asyncio.Event()
        self._pump_scheduled = False
        self._disk_jobs = 0
        """Jobs handed to the disk thread and not reported back yet."""
        self._unsubmitted: list[Persist | SaveSnapshot] = []
        """Jobs of this turn, handed to the disk thread once its messages are written."""
        self._servers: list[asyncio.Server] = []
        self._transports: set[asyncio.Transport] = set()
        self._unadmitted: dict[_Accepted, None] = {}
        """Connections still in their hello or handshake, oldest first."""
        self._peer_conns: dict[str, _Accepted] = {}
        """The one admitted inbound connection of each peer."""
        self._clients_checked_at = 0.0
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
        previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(loop_exception_handler(self.quiet))
        self._persister = _Persister(self.storage, loop, self._persisted)
        self.budget = Budget.for_process(len(self.config.peers), self.limits.max_connections)
        tls = self.security.server_tls
        for sock in _raw_sockets(listener):
            server = await loop.create_server(
                lambda: _Accepted(self),
                sock=sock,
                ssl=tls,
                ssl_handshake_timeout=self.limits.hello_timeout if tls is not None else None,
            )
            self._servers.append(server)
        if self.config.metrics_listen is not None:
            await self._start_metrics(*self.config.metrics_listen)
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                if self._pending_peers is not None:
                    self._reconcile_links(self._pending_peers)
                    self._pending_peers = None
                tg.start_soon(self._timer_loop)
                security = self.security
                self.log.info(
                    "node_started",
                    address=self.config.address,
                    cluster=self.config.cluster,
                    voters=list(self.machine.raft.voters),
                    term=self.machine.raft.term,
                    commit=self.machine.raft.commit_index,
                    last_index=self.machine.raft.last_index,
                    tls=security.server_tls is not None,
                    peer_secret=security.peer_secret is not None,
                    client_secret=security.client_secret is not None,
                    max_clients=self.budget.clients,
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
            loop.set_exception_handler(previous_handler)

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
        """Carries out everything the machine asked for, in order.

        Log lines are written together at the end, with one write: under load an
        audit line per grant and release, each its own write to a file on the disk
        that is busy with fsyncs, cost a follower more than the rest of its work.
        """
        machine = self.machine
        touched: set[PeerLink] = set()
        lines: list[str] = []
        while True:
            actions = machine.take_actions()
            if not actions:
                break
            for action in actions:
                if type(action) is LogEvent:
                    line = self.log.line(_LEVELS.get(action.level, 20), action.event, action.fields)
                    if line is not None:
                        lines.append(line)
                else:
                    self._perform(action, touched)
        for link in touched:
            link.flush()
        if self._unsubmitted:
            # After the appends are written: waking the disk thread first could let it
            # take the CPU while our appends wait (§10.2.1: they leave before the fsync).
            assert self._persister is not None
            for job in self._unsubmitted:
                self._persister.submit(job)
            self._unsubmitted.clear()
        self.log.write_lines(lines)
        if machine.leader is not None and not self.leader_seen.is_set():
            self.leader_seen.set()
        self._wake.set()

    def _pump_soon(self) -> None:
        """Lets the machine hand out its work once every event of this loop turn is in.

        Frames from many clients, peer answers and disk completions that arrive
        together then make one Ready: one append per follower and one fsync for
        all of them, instead of one each. The cost is one turn of the loop.
        """
        if not self._pump_scheduled:
            self._pump_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._pump_now)

    def _pump_now(self) -> None:
        self._pump_scheduled = False
        self.machine.pump(now())
        self._run_actions()

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
            if self._persist_inline(action):
                return
            self._disk_jobs += 1
            self._unsubmitted.append(action)
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

    def _persist_inline(self, action: Persist | SaveSnapshot) -> bool:
        """A follower writes its appends on the loop thread when the disk thread is idle.

        Its acknowledgement can only leave once the entries are durable, so handing
        the write to the disk thread and back adds two thread wake-ups to every
        commit's critical path and saves it nothing; the appends that arrive during
        the fsync wait in the socket and are written together next. The leader keeps
        the disk thread, so that its appends and heartbeats leave while it writes
        (§10.2.1), and so do snapshots, which are large.
        """
        assert self._persister is not None
        if (
            self._disk_jobs
            or not isinstance(action, Persist)
            or action.snapshot is not None
            or self.machine.role is not Role.FOLLOWER
            or self._persister.slowed  # the chaos tests' slow disk must not stall the loop
        ):
            return False
        try:
            self._persister.write_now(action)
        except BaseException as exc:  # the same as a failure in the disk thread
            self._disk_jobs += 1
            self._persisted([action], exc)
            return True
        self.machine.persisted(action.job, now())
        return True

    def _persisted(self, jobs: list[Persist | SaveSnapshot], failure: BaseException | None) -> None:
        """The disk thread finished ``jobs`` (all durable), or failed on them."""
        self._disk_jobs -= len(jobs)
        if failure is not None:
            self.log.error("persist_failed", error=repr(failure))
            self.failure = failure
            self.stopped.set()
            return
        instant = now()
        for job in jobs:
            if isinstance(job, Persist):
                self.machine.persisted(job.job, instant, pump=False)
            elif self._persister is not None:
                seconds = self._persister.snapshot_write_s.pop(job.index, 0.0)
                self.log.info(
                    "snapshot_saved", index=job.index, bytes=len(job.data), ms=round(seconds * 1e3)
                )
        self._pump_soon()

    def _write(self, client: _ClientConnection, frame: dict[str, Any]) -> None:
        transport = client.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > CLIENT_BUFFER_LIMIT:
            # A client that does not read its replies must not grow our memory.
            transport.abort()
            return
        transport.write(encode_frame(frame, client.sealer))

    # ------------------------------------------------------------------ the clock

    async def _timer_loop(self) -> None:
        machine = self.machine
        while True:
            delay = machine.next_timer() - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            machine.timer(now())
            mono = time.monotonic()
            self._check_clients(mono)
            self.quiet.flush(mono)
            self._run_actions()

    def _check_clients(self, mono: float) -> None:
        # The timeouts are seconds long: a look twice a second is enough, and spares the
        # loop a walk over thousands of idle clients on every tick.
        if mono - self._clients_checked_at < CLIENT_CHECK_EVERY:
            return
        self._clients_checked_at = mono
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
            self._peer_conns.pop(peer_id).abort()
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
                secret=self.security.peer_secret,
                tls=self.security.peer_tls,
                advertise=self.config.address,
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
            machine.peer_messages(src, decode_raft_frame(obj), now(), pump=False)
        if count:
            frames = self.counters.peer_frames
            frames[src] = frames.get(src, 0) + count
            self._pump_soon()

    # ------------------------------------------------------------------ clients

    def _client_hello(self, hello: Hello) -> dict[str, Any] | None:
        """The error that refuses a client's hello, or None to go on (to its handshake)."""
        if hello.cluster and hello.cluster != self.config.cluster:
            message = (
                f"this member is in cluster {self.config.cluster!r}, "
                f"not {hello.cluster!r}: check DLM_CLUSTER"
            )
            return error(None, ErrorCode.BAD_REQUEST, message)
        if self._stopping:
            return error(None, ErrorCode.SHUTTING_DOWN, "member is shutting down")
        return None

    def _client_room(self, where: str) -> dict[str, Any] | None:
        """Makes room for one more client, or the error that refuses it.

        Called once the client is authenticated, so that only a client holding the
        secret (when there is one) can make another give way: the client silent the
        longest, if it has been silent for ``evict_idle_after``.
        """
        if len(self._clients) < self.budget.clients:
            return None
        mono = time.monotonic()
        quietest = min(self._clients.values(), key=lambda c: c.last_heard)
        if mono - quietest.last_heard >= self.limits.evict_idle_after:
            self.counters.connections_shed += 1
            self.quiet.warning("client_evicted", reason="connection cap reached", remote=where)
            quietest.transport.abort()
            self._client_closed(quietest)
            return None
        self.counters.connections_refused += 1
        self.quiet.warning("client_refused", reason="connection cap reached", remote=where)
        return error(
            None,
            ErrorCode.UNAVAILABLE,
            "this member has too many connections: try another member",
            retry_after_ms=1000,
        )

    def _client_opened(
        self, transport: asyncio.Transport, where: str, sealer: Any, opener: Any
    ) -> _ClientConnection:
        number = self._next_conn
        self._next_conn += 1
        decoder = FrameDecoder(CLIENT_FRAME_LIMIT, opener, tolerate_bad_bodies=True)
        client = _ClientConnection(number, transport, decoder, time.monotonic(), sealer=sealer)
        self._clients[number] = client
        self.machine.client_connected(number, where)
        return client

    def _peer_hello(self, hello: Hello, transport: asyncio.Transport) -> dict[str, Any] | None:
        """The error that refuses a peer's hello, or None to go on (to its handshake)."""
        config = self.config
        if self.security.server_tls is not None:
            from dlm.tls import peer_certificate_problem

            problem = peer_certificate_problem(transport.get_extra_info("peercert"), hello.node)
            if problem is not None:
                return error(None, ErrorCode.AUTH_FAILED, problem)
        problem = self.machine.accept_peer(hello.node, hello.speaks, hello.addr)
        if problem is None and hello.cluster != config.cluster:
            problem = (
                f"cluster id mismatch: this member {config.node_id} is in cluster "
                f"{config.cluster!r}, the peer says {hello.cluster!r}"
            )
        return None if problem is None else error(None, ErrorCode.BAD_REQUEST, problem)

    def _peer_admitted(self, conn: _Accepted, node: str, speaks: int) -> None:
        """``conn`` proved it speaks for ``node``: it replaces any older connection of
        ``node``, whose frames stop here (a member that restarted, or whose old
        connection is half-open after a partition, must not be locked out until the
        old one times out; only a holder of the credentials can replace it)."""
        old = self._peer_conns.get(node)
        if old is not None and old is not conn:
            self.quiet.warning("peer_connection_replaced", peer=node, old=old.where, new=conn.where)
            old.abort()
        self._peer_conns[node] = conn
        self.machine.peer_version(node, speaks)

    def _peer_closed(self, conn: _Accepted, node: str) -> None:
        if self._peer_conns.get(node) is conn:
            del self._peer_conns[node]

    def _connection_made(self, conn: _Accepted, transport: asyncio.Transport) -> None:
        """Counts a new connection; over the budget, drops the oldest still saying hello."""
        self._transports.add(transport)
        self._unadmitted[conn] = None
        if len(self._transports) > self.budget.transports:
            oldest = next(iter(self._unadmitted))
            del self._unadmitted[oldest]
            self.counters.connections_shed += 1
            self.quiet.warning("connection_shed", reason="descriptor budget", remote=oldest.where)
            oldest.abort()

    def _auth_failed(self, role: str, where: str, node: str, message: str) -> None:
        self.counters.auth_failures += 1
        self.quiet.warning("auth_failed", role=role, remote=where, claims=node, error=message)

    def _client_closed(self, client: _ClientConnection) -> None:
        if self._clients.pop(client.number, None) is not None:
            self.machine.client_closed(client.number)
            self._run_actions()

    def _client_data(self, client: _ClientConnection) -> bool:
        """Hands every complete frame to the machine; False when the connection must close."""
        machine = self.machine
        decoder = client.decoder
        mono = time.monotonic()
        client.last_heard = mono
        handled = 0
        try:
            for obj in decoder.frames():
                handled += 1
                machine.client_frame(client.number, obj, now(), pump=False)
        except ProtocolError as exc:
            # Framing is lost (an oversized length) or the frame failed its authentication
            # tag: answer the frames before it, say why, hang up. (A body that is not CBOR
            # comes out as a BadFrame and is answered like any bad request.)
            self.counters.frames_in += handled
            if handled:
                machine.pump(now())  # the frames before the bad one are answered first
            self._run_actions()
            self._write(client, error(None, exc.code, str(exc)))
            return False
        self.counters.frames_in += handled
        client.partial_since = (client.partial_since or mono) if decoder.pending else None
        if handled:
            self._pump_soon()
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


class _Handshake:
    """A connection between its welcome and its ``auth`` frame."""

    __slots__ = ("buf", "hello", "responder")

    def __init__(self, hello: Hello, responder: Any) -> None:
        self.hello = hello
        self.responder = responder
        self.buf = bytearray()


class _Accepted(asyncio.Protocol):
    """One accepted connection. Its hello decides whether a client or a peer speaks.

    hello -> (with a secret for that role: welcome + proof, then the ``auth``
    frame) -> admitted as a client or a peer. Until admitted, what it sends goes
    nowhere but this object, and the hello timer runs. Everything runs in the
    transport's callbacks, on the loop thread: frames are handled as they arrive.
    """

    def __init__(self, server: NodeServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self.where = "?"
        self._hello_buf: bytearray | None = bytearray()
        self._hello_timer: asyncio.TimerHandle | None = None
        self._handshake: _Handshake | None = None
        self._client: _ClientConnection | None = None
        self._peer: str | None = None
        self._peer_decoder: FrameDecoder | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.where = _remote(transport.get_extra_info("peername"))
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(self._server.limits.hello_timeout, self.abort)
        self._server._connection_made(self, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        server = self._server
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        server._unadmitted.pop(self, None)
        if self._transport is not None:
            server._transports.discard(self._transport)
        if self._client is not None:
            server._client_closed(self._client)
        if self._peer is not None:
            server._peer_closed(self, self._peer)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

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
        if self._handshake is not None:
            self._auth_data(data)
            return
        self._hello(data)

    def _peer_data(self) -> None:
        assert self._peer is not None and self._peer_decoder is not None
        try:
            self._server._peer_frames(self._peer, self._peer_decoder)
        except ProtocolError as exc:
            self._server.quiet.warning(
                "peer_bad_frame", peer=self._peer, remote=self.where, error=str(exc)
            )
            self.abort()

    def _hello(self, data: bytes) -> None:
        """Consumes the hello; then the connection knows its role."""
        assert self._transport is not None and self._hello_buf is not None
        transport, server, where = self._transport, self._server, self.where
        self._hello_buf += data
        try:
            first = split_first_frame(self._hello_buf)
            if first is None:
                return
            hello = Hello.from_wire(first[0])
        except ProtocolError as exc:
            server.quiet.warning("bad_hello", remote=where, error=str(exc))
            _send_and_close(transport, error(None, exc.code, _hello_problem(exc)))
            return
        self._hello_buf = None
        if hello.version > PROTOCOL_VERSION:
            message = (
                f"protocol version {hello.version} is not supported "
                f"(this member speaks 1 to {PROTOCOL_VERSION}): upgrade this member"
            )
            server.quiet.warning("bad_hello", remote=where, error=message)
            _send_and_close(transport, error(None, ErrorCode.BAD_REQUEST, message))
            return
        config, security = server.config, server.security
        if hello.role is HelloRole.PEER:
            refusal = server._peer_hello(hello, transport)
            secret = security.peer_secret
        else:
            refusal = server._client_hello(hello)
            secret = security.client_secret
        if refusal is not None:
            if refusal.get("code") == ErrorCode.AUTH_FAILED:
                server._auth_failed(hello.role.value, where, hello.node, refusal["message"])
            elif hello.role is HelloRole.PEER:
                server.quiet.warning(
                    "peer_refused", remote=where, peer=hello.node, reason=refusal["message"]
                )
            _send_and_close(transport, refusal)
            return
        greeting = welcome(config.node_id, config.cluster, min(hello.speaks, PROTOCOL_VERSION))
        if secret is None:
            self._admit(hello, None, None, first[1], greeting)
            return
        from dlm.auth import AuthError, Responder, new_nonce

        responder = Responder(secret, new_nonce(), node=config.node_id)
        try:
            greeting.update(responder.welcome_fields(first[0]))
        except AuthError as exc:
            self._refuse_auth(hello, str(exc))
            return
        transport.write(encode_frame(greeting))
        self._handshake = _Handshake(hello, responder)
        if first[1]:
            self._auth_data(first[1])

    def _auth_data(self, data: bytes) -> None:
        """The initiator's ``auth`` frame: its proof, checked before anything else counts."""
        from dlm.auth import AuthError

        handshake = self._handshake
        assert handshake is not None
        handshake.buf += data
        try:
            first = split_first_frame(handshake.buf, AUTH_FRAME_LIMIT)
            if first is None:
                return
            sealer, opener = handshake.responder.check_auth(as_map(first[0]))
        except (ProtocolError, AuthError) as exc:
            self._refuse_auth(handshake.hello, str(exc))
            return
        self._handshake = None
        self._admit(handshake.hello, sealer, opener, first[1])

    def _refuse_auth(self, hello: Hello, message: str) -> None:
        assert self._transport is not None
        self._server._auth_failed(hello.role.value, self.where, hello.node, message)
        _send_and_close(self._transport, error(None, ErrorCode.AUTH_FAILED, message))

    def _admit(
        self,
        hello: Hello,
        sealer: Any,
        opener: Any,
        rest: bytes,
        greeting: dict[str, Any] | None = None,
    ) -> None:
        """The hello (and handshake, if any) is done: from now on the machine listens.
        ``greeting``: the welcome still to send (without a handshake), or None."""
        transport, server = self._transport, self._server
        assert transport is not None
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        server._unadmitted.pop(self, None)
        if hello.role is HelloRole.PEER:
            if greeting is not None:
                transport.write(encode_frame(greeting))
            server._peer_admitted(self, hello.node, hello.speaks)
            self._peer = hello.node
            self._peer_decoder = FrameDecoder(PEER_FRAME_LIMIT, opener)
            if rest:
                self._peer_decoder.feed(rest)
                self._peer_data()
            return
        refusal = server._client_room(self.where)
        if refusal is not None:
            transport.write(encode_frame(refusal, sealer))
            transport.close()
            return
        if greeting is not None:
            transport.write(encode_frame(greeting))
        self._client = client = server._client_opened(transport, self.where, sealer, opener)
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
    security: NodeSecurity | None = None,
) -> int:
    """Serves until SIGTERM/SIGINT (then shuts down gracefully) or until the machine says
    stop; returns the exit code."""
    limit = raise_open_files_limit()
    if limit.after != limit.before or limit.error is not None:
        log.info("open_files_limit", before=limit.before, after=limit.after, error=limit.error)
    server = NodeServer(config, storage, log=log, security=security)
    if server.machine.raft.removed:
        raise RemovedMember(
            f"member {config.node_id} was removed from the cluster: to bring it back, remove "
            f"its data directory ({config.data_dir}) and start it with --join and a new --id"
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
