"""The runtime around a NodeMachine: sockets, the clock, the disk. It decides nothing.

Theory of operation
-------------------
machine.py makes every decision; this adapter only moves things between it
and the operating system, on one asyncio event loop (anyio for tasks,
signals and threads; plain asyncio protocols for sockets, because anyio's
streams cost a selector re-arm and a loop round trip per receive and send,
which on the hot path was more than the work itself):

* **connections**: one listening port for clients and peers (TLS when
  configured). accepting.py turns an accepted connection into a client or a
  peer (the hello, the handshake of dlm/auth.py, the transport limits);
  nothing it sends reaches the machine before it is admitted. This module
  keeps the books of connections (the descriptor budget, the client cap, the
  write-buffer cap of a client that does not read). A client's frames go to
  ``machine.client_frame``; a peer's Raft messages to ``machine.peer_messages``.
* **the clock**: one loop timer (``Alarm``) calls ``machine.timer`` at
  ``machine.next_timer()``, set again after every turn's actions.
* **the disk**: ``Persist`` and ``SaveSnapshot`` actions go, in order, to one
  worker thread (persister.py), which writes the jobs that queued up together with one
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
import dataclasses
import gc
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field, replace
from typing import Any, Self

import anyio
import anyio.abc

from dlm.event_loop import running_loop_name, timer_floor
from dlm.node import locks
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
from dlm.node.outbox import ExportSpans, SendBackup
from dlm.node.peer_codec import decode_raft_frame
from dlm.node.raft.types import Role
from dlm.node.runtime import trace_export
from dlm.node.runtime.accepting import (
    AcceptedConnection,
    Budget,
    ClientConnection,
    Limits,
)
from dlm.node.runtime.config.node_config import NodeConfig
from dlm.node.runtime.imaging import ChildImage, ForkImager
from dlm.node.runtime.log import Logger
from dlm.node.runtime.notify import notify
from dlm.node.runtime.peers import PeerLink
from dlm.node.runtime.persister import Persister
from dlm.node.runtime.quiet import QuietLog, loop_exception_handler
from dlm.node.runtime.reload import Reloading, watch_reloads
from dlm.node.runtime.rlimits import raise_open_files_limit
from dlm.node.runtime.seat import METRICS, SERVING, Seat
from dlm.node.runtime.security import NodeSecurity
from dlm.node.snapshots import PERIODIC
from dlm.node.stats import BackupStats, DiskStats
from dlm.node.watches import WATCH_BUFFER_BYTES
from dlm.records import Entry, Storage
from dlm.views import StatusView
from dlm.wire import (
    BACKUP_CHUNK_BYTES,
    CLIENT_FRAME_LIMIT,
    ErrorCode,
    FrameDecoder,
    Hello,
    ProtocolError,
    backup_chunk_frames,
    encode_frame,
    error,
    parse_addr,
)

INLINE_SLOW_S = 0.02
"""A follower's write on the loop thread slower than this sends its next ones to the
disk thread for a while (the loop must keep answering heartbeats)."""
INLINE_PAUSE_S = 10.0
"""How long the follower then keeps to the disk thread, at least: it comes back only once
a write there was fast again."""
CLIENT_CHECK_EVERY = 0.5
"""Seconds between two looks for stalled and idle clients."""
CUT_OFF_GRACE_S = 5.0
"""A watcher cut off for not reading gets this long to read why before it is aborted."""
CLIENT_BUFFER_LIMIT = 16 * CLIENT_FRAME_LIMIT
"""Unsent reply bytes beyond which a client that does not read is cut off."""
BACKUP_BUFFERED = 2 * BACKUP_CHUNK_BYTES
"""A backup's next chunk is written only while less than this is unsent to its client
(with the chunk, the buffer stays inside CLIENT_BUFFER_LIMIT)."""
BACKUP_POLL_S = 0.002
"""How often a backup whose client has not taken its last chunks looks again."""


class Alarm:
    """One timer of the event loop that calls ``fire`` at the earliest time asked of it.

    The member's clock (``NodeMachine.next_timer``): a tick every 50 ms, and sooner the
    round of keep-alives waiting out its gap, a hundred times a second under load. A
    loop timer costs a handle; the task it replaces woke through a cancel scope and an
    event, several times the CPU, twice per round (once brought forward, once due).
    """

    __slots__ = ("_fire", "_floor", "_handle", "_loop", "at")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fire: Callable[[], None], floor: float = 0.0
    ) -> None:
        self._loop = loop
        self._fire = fire
        self._floor = floor
        """The shortest wait asked of the loop: uvloop's timers count whole milliseconds
        from a clock read once per turn, so a shorter one goes off early, again and again
        (event_loop.timer_floor)."""
        self._handle: asyncio.TimerHandle | None = None
        self.at = float("inf")
        """When it goes off (monotonic s); infinity when it is not set."""

    def no_later_than(self, when: float) -> None:
        """Sets it for ``when`` (monotonic s), unless it is set to go off sooner already."""
        if self._handle is not None:
            if when >= self.at:
                return
            self._handle.cancel()
        self.at = when
        delay = max(self._floor, when - time.monotonic())
        self._handle = self._loop.call_later(delay, self._went_off)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.at = float("inf")

    def _went_off(self) -> None:
        self._handle = None
        self.at = float("inf")
        self._fire()


class RemovedMember(Exception):
    """This data directory belongs to a member that was removed; the message says what to do."""


def now() -> Instant:
    return Instant(time.monotonic(), int(time.time() * 1000))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
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
        with collector_paused():
            return super().snapshot()

    @classmethod
    def restore(cls, data: bytes) -> Self:
        with collector_paused():
            return super().restore(data)


LONG_APPLY_ENTRIES = 1_000
"""Committed entries in one batch from which it is applied with the collector paused (a
batch is at most 1 MiB of entries: a replayed log of small commands comes in batches of
four or five thousand)."""


class _Machine(NodeMachine):
    lock_machine_class = _Locks

    def _apply(self, committed: Iterable[Entry], now: Instant) -> None:
        """A long batch (a restart replaying its log, a member catching up) is applied with
        the cyclic collector paused: it grows the table by as many keys and leases, and the
        collector, started every 35,000 new containers (main.GC_THRESHOLD), would walk the
        growing heap again and again (a full pass each time it grew by a quarter). Applying
        makes no cycles worth collecting at once; the collector resumes after the batch."""
        if isinstance(committed, Sized) and len(committed) >= LONG_APPLY_ENTRIES:
            with collector_paused():
                super()._apply(committed, now)
            # Out of the collector's sight, as imaging does: the batch's new objects are
            # table entries, which make no cycles, and the first collection after the
            # batch would otherwise walk them all (a tenth of a replay's time, py-spy).
            # gc.freeze takes the whole heap, and only an image's end (gc.unfreeze) gives
            # it back: until then, something alive now that later becomes cyclic garbage
            # is not collected. The cost is bounded by the heap at this moment, and a
            # member that applies long batches also takes images (every snapshot_every
            # entries); one that never images again keeps that much.
            gc.freeze()
        else:
            super()._apply(committed, now)


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
        seat: Seat | None = None,
    ) -> None:
        self.config = config
        self.seat = seat
        """A partition child's channel to its supervisor, which accepts its connections
        (None: this process listens itself)."""
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
                incarnation=config.incarnation,
                peers={node: _addr_text(addr) for node, addr in sorted(config.peers.items())},
                address=config.address,
                join_members={n: _addr_text(a) for n, a in sorted(config.join_members.items())},
                auto_promote=config.auto_promote,
                peers_authenticated=self.security.peers_authenticated,
                timing=config.timing,
                snapshot_every=config.snapshot_every,
                snapshot_keep=config.snapshot_keep,
                quotas=replace(config.quotas, max_connections=self.budget.clients),
                partition=config.partition,
                partitions=config.partitions,
            ),
            storage,
            self._rng,
            now(),
        )
        self.counters = Counters()
        self._export_spans: Callable[[ExportSpans], None] | None = None
        """Exports the spans of traced requests; None: tracing is off, they are dropped."""
        self.exit_code = 0
        self.other_incarnations: set[str] = set()
        """Members of another cluster incarnation that dialled us (each said once)."""
        self.stopped = anyio.Event()
        self.leader_seen = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._persister: Persister | None = None
        self._clients: dict[int, ClientConnection] = {}
        self._next_conn = 1
        self._links: dict[str, PeerLink] = {}
        self._link_scopes: dict[str, anyio.CancelScope] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._timer_floor = 0.0
        """The shortest wait the clock's alarm is set for (event_loop.timer_floor)."""
        self._alarm: Alarm | None = None
        """Calls the machine's timer when it is due (set once the member serves)."""
        self._pump_scheduled = False
        self._disk_jobs = 0
        """Jobs handed to the disk thread and not reported back yet."""
        self._unsubmitted: list[Persist | SaveSnapshot] = []
        """Jobs of this turn, handed to the disk thread once its messages are written."""
        self._inline: list[Persist] = []
        """A follower's appends of this round, written on the loop once its messages left."""
        self._inline_paused_until = 0.0
        """Until then (monotonic s) a follower's appends go to the disk thread."""
        self._servers: list[asyncio.Server] = []
        self._transports: set[asyncio.Transport] = set()
        self._unadmitted: dict[AcceptedConnection, None] = {}
        """Connections still in their hello or handshake, oldest first."""
        self._peer_conns: dict[str, AcceptedConnection] = {}
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
        self.imager: ForkImager | None = None
        """Builds snapshot and backup images in a forked child (imaging.py)."""
        self.backup_stats = BackupStats()
        self._adoptions: set[asyncio.Task[Any]] = set()
        """Connections from the supervisor still being adopted (their TLS handshakes)."""
        self._image_s: dict[int, tuple[float, float]] = {}
        """Seconds each periodic image took to build off the loop, and its fork held the
        loop, by index (read once)."""

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, listener: anyio.abc.Listener[Any] | None) -> None:
        """Runs until ``shutdown`` (or cancellation); closes nothing it did not open."""
        self._listener = listener
        loop = self._loop = asyncio.get_running_loop()
        self._timer_floor = timer_floor(loop)
        previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(loop_exception_handler(self.quiet))
        self._persister = Persister(self.storage, loop, self._persisted)
        self.imager = ForkImager(loop)
        self.machine.snapshots.imager = self._image
        self.budget = Budget.for_process(len(self.config.peers), self.limits.max_connections)
        self.machine.member_connections(self.budget.clients)
        tls = self.security.server_tls
        if self.seat is not None:
            self.seat.start(loop, self._adopt, self._supervisor_gone)
        for sock in _raw_sockets(listener) if listener is not None else []:
            server = await loop.create_server(
                lambda: AcceptedConnection(self),
                sock=sock,
                ssl=tls,
                ssl_handshake_timeout=self.limits.hello_timeout if tls is not None else None,
            )
            self._servers.append(server)
        if self.config.metrics_listen is not None:
            await self._start_metrics(*self.config.metrics_listen)
        self._export_spans = trace_export.exporter()
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                if self._pending_peers is not None:
                    self._reconcile_links(self._pending_peers)
                    self._pending_peers = None
                alarm = self._alarm = Alarm(loop, self._on_timer, self._timer_floor)
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
                    tracing=self._export_spans is not None,
                    event_loop=running_loop_name(loop),
                )
                self._run_actions()
                notify("READY=1")  # systemd's Type=notify: serving from now on
                if self.seat is not None:
                    self.seat.tell(SERVING)
                try:
                    await self.stopped.wait()
                finally:
                    alarm.cancel()
                    self._alarm = None  # a late pump must not set it again
                    tg.cancel_scope.cancel()
                    self._stop_serving()
                    if self.metrics is not None:
                        self.metrics.close()
                    for transport in list(self._transports):
                        transport.abort()
        finally:
            if self._export_spans is not None:
                trace_export.stop()
            self.imager.close()
            self._persister.stop()
            loop.set_exception_handler(previous_handler)

    async def _start_metrics(self, host: str, port: int) -> None:
        # prometheus-client is imported only by members that serve metrics.
        from dlm.node.runtime.metrics import MetricsListener, registry_for

        security = self.security
        listener = MetricsListener(
            registry_for(self),
            log=self.log,
            token=security.metrics_token,
            tls=security.metrics_tls,
        )
        try:
            await listener.start(host, port)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot serve metrics on {_addr_text((host, port))}: {exc.strerror}"
            ) from None
        self.metrics = listener
        if self.seat is not None:
            self.seat.tell(METRICS + b" %d" % listener.port)
        self.log.info(
            "metrics_serving",
            address=_addr_text((host, listener.port)),
            token=security.metrics_token is not None,
            tls=security.metrics_tls is not None,
        )

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
        # A snapshot being built is worth its wait: a restart replays less of the log.
        while (
            time.monotonic() < deadline
            and self.imager is not None
            and PERIODIC in self.imager.running
        ):
            await anyio.sleep(0.01)
        machine.finish_shutdown()
        self._run_actions()
        # Let the last replies leave.
        for _ in range(10):
            if not any(c.transport.get_write_buffer_size() for c in self._clients.values()):
                break
            await anyio.sleep(0.01)
        self.stopped.set()

    def _adopt(self, sock: socket.socket) -> None:
        """A connection the supervisor accepted for this partition: served exactly as one
        this process accepted itself (TLS handshake included)."""
        loop = self._loop
        if self._stopping or loop is None:
            sock.close()
            return
        tls = self.security.server_tls
        task = loop.create_task(
            loop.connect_accepted_socket(
                lambda: AcceptedConnection(self),
                sock,
                ssl=tls,
                ssl_handshake_timeout=self.limits.hello_timeout if tls is not None else None,
            )
        )
        self._adoptions.add(task)
        task.add_done_callback(self._adopted)

    def _adopted(self, task: asyncio.Task[Any]) -> None:
        self._adoptions.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A failed TLS handshake or a connection reset before it was adopted: its
            # socket is closed already, as a listener's would be.
            self.quiet.warning("connection_not_adopted", error=str(task.exception())[:200])

    def _supervisor_gone(self) -> None:
        """The member's supervisor is gone: a partition never outlives its member."""
        self.log.warning("supervisor_gone")
        tg = self._task_group
        if tg is None:
            self.stopped.set()
        else:
            tg.start_soon(self.shutdown)

    def _stop_serving(self) -> None:
        if self.seat is not None:
            self.seat.stop()
        for srv in self._servers:
            srv.close()
        self._servers = []

    # ------------------------------------------------------------------ actions

    def _run_actions(self) -> None:
        """Carries out everything the machine asked for, in order; stops the member if
        that fails half-way.

        Log lines are written together, with one write per round: under load an
        audit line per grant and release, each its own write to a file on the disk
        that is busy with fsyncs, cost a follower more than the rest of its work.
        A follower's inline write (``_persist_inline``) comes after this round's
        messages have left and its lines are written, so that the answers it
        already owes (heartbeats, read confirmations) do not wait for its fsync.

        The machine hands each action out once: one that raised takes the rest of its
        batch with it, and a lost write followed by a later one that succeeds would
        acknowledge entries that are not on the disk. So an unexpected error here ends
        the member, like a failed write: it restarts from what its disk holds.
        """
        try:
            machine = self.machine
            while True:
                touched: set[PeerLink] = set()
                lines: list[str] = []
                try:
                    while True:
                        actions = machine.take_actions()
                        if not actions:
                            break
                        for action in actions:
                            if type(action) is LogEvent:
                                line = self.log.line(
                                    _LEVELS.get(action.level, 20),
                                    action.event,
                                    action.fields,
                                    at_ms=action.at_ms,
                                )
                                if line is not None:
                                    lines.append(line)
                            else:
                                if type(action) is Stop:
                                    # Its own line goes after the lines that explain it.
                                    self.log.write_lines(lines)
                                    lines = []
                                self._perform(action, touched)
                    for link in touched:
                        link.flush()
                finally:
                    self.log.write_lines(lines)
                inline, self._inline = self._inline, []
                for written in inline:
                    if not self._write_inline(written):
                        break
                if self.failure is not None:
                    # The disk failed: the member stops, and nothing more is written or done.
                    self._unsubmitted.clear()
                    break
                if self._unsubmitted:
                    # After the appends are written: waking the disk thread first could let
                    # it take the CPU while our appends wait (§10.2.1: they leave before the
                    # fsync).
                    assert self._persister is not None
                    for job in self._unsubmitted:
                        self._persister.submit(job)
                    self._unsubmitted.clear()
                if not inline:
                    break
            if machine.leader is not None and not self.leader_seen.is_set():
                self.leader_seen.set()
            if self._alarm is not None:
                self._alarm.no_later_than(machine.next_timer())
        except Exception as exc:
            if self.failure is None:
                self.log.error("actions_failed", error=repr(exc))
                self.failure = exc
            self.stopped.set()

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
        elif type(action) is SaveSnapshot and action.pending is not None:
            self._save_when_built(action)
        elif isinstance(action, SendBackup):
            self._send_backup(action)
        elif isinstance(action, Persist | SaveSnapshot):
            assert self._persister is not None
            if self.failure is not None:
                return  # after a failed write nothing is written (and so nothing acknowledged)
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
        elif type(action) is ExportSpans:
            if self._export_spans is not None:  # tracing is on (trace_export.py)
                self._export_spans(action)
        elif isinstance(action, Stop):
            self.log.info("stopping", reason=action.reason)
            self.exit_code = action.code
            self.stop_reason = action.reason
            self.stopped.set()

    def _persist_inline(self, action: Persist | SaveSnapshot) -> bool:
        """Keeps a follower's append for the loop thread when the disk thread is idle.

        Its acknowledgement can only leave once the entries are durable, so handing
        the write to the disk thread and back adds two thread wake-ups to every
        commit's critical path and saves it nothing; the appends that arrive during
        the fsync wait in the socket and are written together next. The leader keeps
        the disk thread, so that its appends and heartbeats leave while it writes
        (§10.2.1), and so do snapshots, which are large. A write on the loop blocks
        the loop, so after one slow fsync (``INLINE_SLOW_S``) the follower uses the
        thread for ``INLINE_PAUSE_S`` and until a write there is fast again: a disk
        that stalls must not also keep the follower from answering heartbeats.
        """
        assert self._persister is not None
        if (
            self._disk_jobs
            or not isinstance(action, Persist)
            or action.snapshot is not None
            or self.machine.role is not Role.FOLLOWER
            or self._persister.slowed  # the chaos tests' slow disk must not stall the loop
            or time.monotonic() < self._inline_paused_until
            # A disk that is still slow would block the loop as long again (a 2 s fsync
            # every 10 s cost a healthy leader its quorum): wait until a write is fast.
            or self._persister.last_write_s > INLINE_SLOW_S
        ):
            return False
        self._inline.append(action)
        return True

    def _write_inline(self, job: Persist) -> bool:
        """Writes a job kept by ``_persist_inline``; False if the disk failed."""
        assert self._persister is not None
        started = time.monotonic()
        try:
            self._persister.write_now(job)
        except BaseException as exc:  # the same as a failure in the disk thread
            self._disk_jobs += 1
            self._persisted([job], exc)
            return False
        finished = time.monotonic()
        if finished - started > INLINE_SLOW_S:
            self._inline_paused_until = finished + INLINE_PAUSE_S
        self.machine.persisted(job.job, now())
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
                built = self._image_s.pop(job.index, None)
                self.log.info(
                    "snapshot_written",
                    index=job.index,
                    bytes=len(job.data),
                    ms=round(seconds * 1e3),
                    **(
                        {}
                        if built is None
                        else {
                            "image_ms": round(built[0] * 1e3),
                            "fork_ms": round(built[1] * 1e3, 1),
                        }
                    ),
                )
        self._pump_soon()

    # ------------------------------------------------------------------ images

    def _image(self, build: Callable[[], bytes], purpose: str) -> bytes | ChildImage | None:
        """The machine's imager: a forked child builds the image (imaging.py)."""
        assert self.imager is not None
        made = self.imager(build, purpose)
        if isinstance(made, ChildImage):
            self.backup_stats.image_fork_seconds.observe(made.fork_s)
        return made

    def _save_when_built(self, action: SaveSnapshot) -> None:
        """Hands a periodic snapshot to the disk thread once its child has built the image
        (after the jobs handed out meanwhile: see SaveSnapshot)."""
        pending = action.pending
        assert isinstance(pending, ChildImage)

        def built(image: bytes | None, problem: str | None) -> None:
            if image is None:
                self.log.warning("snapshot_failed", index=action.index, error=problem)
                return
            if self.failure is not None or self._persister is None or self.stopped.is_set():
                return
            self._image_s[action.index] = (pending.seconds, pending.fork_s)
            self._disk_jobs += 1
            self._persister.submit(dataclasses.replace(action, data=image, pending=None))
            self.machine.image_built()
            self._run_actions()

        pending.add_done_callback(built)

    def _send_backup(self, action: SendBackup) -> None:
        """The header now; the image's chunks once it is built, as fast as the client
        takes them (never more than BACKUP_BUFFERED unsent); then the audit line."""
        client = self._clients.get(action.conn)
        if client is None:
            return  # the client left; a child still building the image finishes unread
        self._write(client, {**action.header, "t": "ok", "id": action.request_id})
        started = time.monotonic()
        header = action.header
        conn = self.machine.clients.conns.get(action.conn)
        remote = conn.remote if conn is not None else ""

        def send(image: bytes | None, problem: str | None) -> None:
            live = self._clients.get(action.conn)
            if live is not client:
                return
            if image is None:
                self.log.warning(
                    "snapshot_save_failed", index=header["index"], remote=remote, error=problem
                )
                self._write(
                    client,
                    error(
                        action.request_id,
                        ErrorCode.UNAVAILABLE,
                        f"the member could not build the image: {problem}",
                    ),
                )
                return
            frames = backup_chunk_frames(action.request_id, image)

            def more() -> None:
                if self._clients.get(action.conn) is not client or client.transport.is_closing():
                    return
                transport = client.transport
                while transport.get_write_buffer_size() < BACKUP_BUFFERED:
                    frame = next(frames, None)
                    if frame is None:
                        seconds = time.monotonic() - started
                        stats = self.backup_stats
                        stats.backups += 1
                        stats.backup_bytes += len(image)
                        stats.backup_seconds.observe(seconds)
                        self.log.info(
                            "snapshot_saved",
                            index=header["index"],
                            term=header["term"],
                            bytes=len(image),
                            ms=round(seconds * 1e3),
                            fork_ms=fork_ms,
                            remote=remote,
                        )
                        return
                    self._write(client, frame)
                assert self._loop is not None
                self._loop.call_later(BACKUP_POLL_S, more)

            more()

        image = action.image
        fork_ms = round(image.fork_s * 1e3, 1) if isinstance(image, ChildImage) else 0.0
        if isinstance(image, bytes):
            send(image, None)
        else:
            assert isinstance(image, ChildImage)
            image.add_done_callback(send)

    def _write(self, client: ClientConnection, frame: dict[str, Any]) -> None:
        transport = client.transport
        if transport.is_closing():
            return
        unsent = transport.get_write_buffer_size()
        watches = self.machine.watches
        watching = client.number in watches.per_connection
        if unsent > (WATCH_BUFFER_BYTES if watching else CLIENT_BUFFER_LIMIT):
            # A client that does not read its replies must not grow our memory. A watcher
            # is told why (after what it has not read yet), and cut off for good a few
            # seconds later if it does not read that either.
            if watching:
                reason = (
                    f"this watcher left {unsent} bytes of pushed changes unread: cut off; "
                    "resume from the last index seen"
                )
                for end in watches.cut_off(client.number, reason):
                    transport.write(encode_frame(end, client.sealer))
                transport.close()
                assert self._loop is not None
                self._loop.call_later(CUT_OFF_GRACE_S, transport.abort)
                return
            transport.abort()
            return
        transport.write(encode_frame(frame, client.sealer))

    # ------------------------------------------------------------------ the clock

    def _on_timer(self) -> None:
        """The alarm went off: the machine's timer, if due (an input may have moved it
        later), then its actions, which set the alarm again. A failure here ends the
        member, as one in ``_run_actions`` does: a member whose clock stopped must not
        go on serving."""
        machine = self.machine
        try:
            if machine.next_timer() <= time.monotonic():
                machine.timer(now())
                mono = time.monotonic()
                self._check_clients(mono)
                self.quiet.flush(mono)
        except Exception as exc:
            if self.failure is None:
                self.log.error("timer_failed", error=repr(exc))
                self.failure = exc
            self.stopped.set()
            return
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
                incarnation=self.config.incarnation,
                log=self.log,
                on_down=self._peer_down,
                on_welcome=self._peer_welcomed,
                on_refused=self._peer_refused,
                rng=random.Random(self._rng.random()),
                secret=self.security.peer_secret,
                previous_secret=self.security.previous_peer_secret,
                tls=self.security.peer_tls,
                advertise=self.config.address,
                # A connection that has delivered nothing for an election timeout is replaced.
                stall_after=self.config.timing.election_timeout_s,
                partition=self.config.partition,
                partitions=self.config.partitions,
            )
            self._links[peer_id] = link
            scope = anyio.CancelScope()
            self._link_scopes[peer_id] = scope
            tg.start_soon(self._run_link, link, scope)

    @staticmethod
    async def _run_link(link: PeerLink, scope: anyio.CancelScope) -> None:
        with scope:
            await link.run()

    def _peer_down(self, peer: str, gone: bool) -> None:
        self.machine.peer_unreachable(peer, now(), gone=gone)
        self._run_actions()

    def _peer_welcomed(self, peer: str, version: int) -> None:
        self.machine.peer_version(peer, version)

    def _peer_refused(self, peer: str, message: str) -> None:
        self.machine.peer_refused(peer, message)
        self._run_actions()

    def peer_frames(self, src: str, decoder: FrameDecoder) -> None:
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

    def client_verdict(self, where: str, identity: str = "") -> dict[str, Any] | None:
        """The error that refuses a client whose hello (and proof, if any) passed, or None.

        An identity at its own connection quota is refused before anyone makes room for
        it (dlm/node/quotas.py): it may not evict another identity's idle client either."""
        if self._stopping:
            return error(None, ErrorCode.SHUTTING_DOWN, "member is shutting down")
        refusal = self.machine.client_refusal(identity)
        if refusal is not None:
            self.counters.connections_refused += 1
            self.quiet.warning(
                "client_refused",
                reason="identity connection quota",
                remote=where,
                identity=identity,
            )
            return refusal
        return self.client_room(where)

    def client_room(self, where: str) -> dict[str, Any] | None:
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
            self.client_closed(quietest)
            return None
        self.counters.connections_refused += 1
        self.quiet.warning("client_refused", reason="connection cap reached", remote=where)
        return error(
            None,
            ErrorCode.UNAVAILABLE,
            "this member has too many connections: try another member",
            retry_after_ms=1000,
        )

    def client_opened(
        self,
        transport: asyncio.Transport,
        where: str,
        sealer: Any,
        opener: Any,
        identity: str = "admin",
    ) -> ClientConnection:
        number = self._next_conn
        self._next_conn += 1
        decoder = FrameDecoder(CLIENT_FRAME_LIMIT, opener, tolerate_bad_bodies=True)
        client = ClientConnection(number, transport, decoder, time.monotonic(), sealer=sealer)
        self._clients[number] = client
        self.machine.client_connected(number, where, identity=identity)
        return client

    def identity_known(self, name: str) -> bool | None:
        table = self.machine.locks.identities
        return None if len(table) == 0 else table.get(name) is not None

    def identity_verifier(self, name: str, key_id: bytes) -> tuple[bytes, bytes] | None:
        # The table as this member has applied it, at this moment's wall clock (the old
        # key of a rotation runs out by it).
        found = self.machine.locks.identities.verifier(name, key_id, int(time.time() * 1000))
        return None if found is None else (found.stored_key, found.server_key)

    def peer_verdict(self, hello: Hello) -> dict[str, Any] | None:
        """The error that refuses a peer whose hello passed, and whose proof too when there
        is a peer secret (admission.py), or None to admit it."""
        problem = self.machine.accept_peer(hello.node, hello.speaks, hello.addr)
        return None if problem is None else error(None, ErrorCode.BAD_REQUEST, problem)

    def peer_admitted(self, conn: AcceptedConnection, node: str, speaks: int) -> None:
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

    def peer_closed(self, conn: AcceptedConnection, node: str) -> None:
        if self._peer_conns.get(node) is conn:
            del self._peer_conns[node]

    def connection_opened(self, conn: AcceptedConnection, transport: asyncio.Transport) -> None:
        """Counts a new connection; over the budget, drops the oldest still saying hello."""
        self._transports.add(transport)
        self._unadmitted[conn] = None
        if len(self._transports) > self.budget.transports:
            oldest = next(iter(self._unadmitted))
            del self._unadmitted[oldest]
            self.counters.connections_shed += 1
            self.quiet.warning("connection_shed", reason="descriptor budget", remote=oldest.where)
            oldest.abort()

    def connection_admitted(self, conn: AcceptedConnection) -> None:
        self._unadmitted.pop(conn, None)

    def connection_ended(
        self, conn: AcceptedConnection, transport: asyncio.Transport | None
    ) -> None:
        self._unadmitted.pop(conn, None)
        if transport is not None:
            self._transports.discard(transport)

    def auth_failed(self, role: str, where: str, node: str, message: str) -> None:
        self.counters.auth_failures += 1
        self.quiet.warning("auth_failed", role=role, remote=where, claims=node, error=message)

    def client_closed(self, client: ClientConnection) -> None:
        if self._clients.pop(client.number, None) is not None:
            self.machine.client_closed(client.number)
            self._run_actions()

    def client_data(self, client: ClientConnection) -> bool:
        """Hands every complete frame to the machine; False when the connection must close."""
        machine = self.machine
        decoder = client.decoder
        mono = time.monotonic()
        client.last_heard = mono
        handled = 0
        instant = None
        try:
            for obj in decoder.frames():
                handled += 1
                instant = now()
                machine.client_frame(client.number, obj, instant, pump=False)
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
        if instant is not None:
            if machine.needs_pump(instant):
                self._pump_soon()
            # Keep-alives waiting for their round (the gap, or an open round): no turn
            # of the loop, no pump; the timer, brought forward if need be, starts it.
            elif self._alarm is not None:
                self._alarm.no_later_than(machine.next_timer())
        return True

    def status_view(self) -> StatusView:
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


def _raw_sockets(listener: anyio.abc.Listener[Any]) -> list[socket.socket]:
    listeners = getattr(listener, "listeners", None) or [listener]
    return [item.extra(anyio.abc.SocketAttribute.raw_socket) for item in listeners]


def _addr_text(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------- process entry


async def run(
    config: NodeConfig,
    storage: Storage,
    listener: anyio.abc.Listener[Any] | None,
    *,
    log: Logger,
    on_started: Callable[[NodeServer], None] | None = None,
    security: NodeSecurity | None = None,
    seat: Seat | None = None,
    reloading: Reloading | None = None,
) -> int:
    """Serves until SIGTERM/SIGINT (then shuts down gracefully) or until the machine says
    stop; returns the exit code. SIGHUP re-reads the settings (``reloading``: how;
    reload.py)."""
    limit = raise_open_files_limit()
    if limit.after != limit.before or limit.error is not None:
        log.info("open_files_limit", before=limit.before, after=limit.after, error=limit.error)
    server = NodeServer(config, storage, log=log, security=security, seat=seat)
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
        if reloading is not None:
            tg.start_soon(watch_reloads, server, reloading)
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
