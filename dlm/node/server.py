"""The node runtime: one anyio task group that drives a RaftNode, its store and its sockets.

Theory of operation
-------------------
Everything that touches the Raft core, the lock state machine or the lease
tracker runs on one event loop thread, so none of it needs a lock. Tasks:

* **connections** are asyncio protocols on the node's one port, not tasks:
  the first frame (the hello) decides whether a connection is a peer's or a
  client's. A peer's frames are decoded and ``step``-ped as they arrive; a
  ``PeerLink`` per peer (peers.py) carries our messages out. A client's
  requests become proposals (writes), read rounds (reads, keep-alives) or
  immediate replies (stale reads, NOT_LEADER); replies and grant pushes are
  written to the transport the moment they exist. (anyio streams cost a
  selector re-arm and a loop round trip per receive and send; on the hot
  path that was more than the work itself, so sockets are plain asyncio
  transports while tasks, timeouts and threads stay anyio.)
* the **ticker** advances the core's logical clock from the monotonic clock,
  proposes ``Expire`` for leases whose deadline passed, and times requests out;
* the **driver** runs the Ready loop. Inputs only *mark* work; the driver takes
  one ``Ready`` at a time and, in this order: persists snapshot, entries and
  hard state (one fsync for the whole batch: group commit), sends the
  messages, applies the committed entries (answering their proposers and
  pushing grants to waiters connected here), serves read rounds whose index
  is applied, then calls ``advance``. Requests that arrive while a batch is
  being persisted all land in the next Ready.

A proposal is remembered by its log index and payload. When the entry at
that index is applied, its result goes back to the client if the payload is
ours; if another leader's entry took the index, or we lose leadership first,
the client gets NOT_LEADER and re-sends with the same seq, which the state
machine answers idempotently.

Time: only the leader keeps lease deadlines (leases.py) and only the leader
stamps ``at_ms`` (its wall clock) into commands. Keep-alives do not enter the
log: a keep-alive is answered once a ReadIndex round confirms we still lead
and the lease still exists, and the deadline becomes receipt time + TTL.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from dlm.node import locks
from dlm.node.config import NodeConfig
from dlm.node.leases import LeaseTracker
from dlm.node.log import Logger
from dlm.node.peer_codec import decode_raft_frame
from dlm.node.peers import PeerLink, split_first_frame
from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.types import (
    ConfState,
    EntryKind,
    Message,
    NotLeader,
    Ready,
    Role,
    Storage,
)
from dlm.wire import (
    CLIENT_FRAME_LIMIT,
    PEER_FRAME_LIMIT,
    PROTOCOL_VERSION,
    Acquire,
    ClientRequest,
    CloseLease,
    ErrorCode,
    FrameDecoder,
    Get,
    Hello,
    KeepAlive,
    LeaseInfo,
    ListLocks,
    OpenLease,
    ProtocolError,
    Release,
    Status,
    decode_request,
    encode_frame,
    error,
    grant_push,
    ok,
    welcome,
)
from dlm.wire import (
    Role as WireRole,
)

HELLO_TIMEOUT = 5.0
MAX_BAD_FRAMES = 16
"""Malformed frames tolerated on one client connection before we hang up on it."""
PERSIST_THREAD_MIN_ENTRIES = 2
"""Batches this large are persisted in a worker thread; smaller ones inline (see _drive)."""
CLIENT_BUFFER_LIMIT = 16 * CLIENT_FRAME_LIMIT
"""Unsent reply bytes beyond which a client that does not read is cut off."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True, eq=False)
class ClientConn:
    """One client connection: replies and pushes are written the moment they exist."""

    transport: asyncio.WriteTransport | None
    peer: str
    closed: bool = False
    waiting: set[tuple[str, str]] = field(default_factory=set)
    """(lease, key) pairs this connection waits for a grant push on."""
    bad_frames: int = 0

    def send(self, obj: dict[str, Any]) -> None:
        transport = self.transport
        if self.closed or transport is None:
            return
        if transport.get_write_buffer_size() > CLIENT_BUFFER_LIMIT:
            # A client that does not read its replies must not grow our memory.
            self.closed = True
            transport.abort()
            return
        transport.write(encode_frame(obj))

    @property
    def unsent(self) -> int:
        transport = self.transport
        return 0 if transport is None or self.closed else transport.get_write_buffer_size()


@dataclass(slots=True)
class _Proposal:
    conn: ClientConn
    request: ClientRequest
    data: bytes
    started: float


@dataclass(slots=True)
class _Read:
    """A request that needs a confirmed read point (or, for keep-alives, confirmed leadership)."""

    conn: ClientConn
    request: ClientRequest
    received: float


@dataclass(slots=True)
class _ReadRound:
    reads: list[_Read]
    started: float
    as_leader: bool
    index: int = -1
    """The confirmed read point, once the core reported it."""


class NodeServer:
    """A running member. Create it, then ``await serve(listener)`` inside a task group."""

    def __init__(
        self,
        config: NodeConfig,
        storage: Storage,
        *,
        log: Logger | None = None,
        rng: random.Random | None = None,
        persist_in_thread: bool | int = PERSIST_THREAD_MIN_ENTRIES,
    ) -> None:
        self.config = config
        self.storage = storage
        self.log = log or Logger(config.node_id)
        self._rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        # True: every batch; False: none; n: batches of at least n entries.
        if persist_in_thread is True:
            persist_in_thread = 1
        self._thread_min_entries = persist_in_thread if persist_in_thread else 1 << 62
        timing = config.timing
        self._timing = timing

        snap = storage.snapshot()
        self.machine = locks.LockStateMachine()
        if snap is not None and snap.data:
            self.machine = locks.LockStateMachine.restore(snap.data)
        self._snapshot_index = snap.meta.index if snap is not None else 0

        self.raft = RaftNode(
            Config(
                id=config.node_id,
                voters=config.voters,
                election_ticks=timing.election_ticks,
                heartbeat_ticks=timing.heartbeat_ticks,
            ),
            storage,
            self._rng,
        )
        self.tracker = LeaseTracker(expire_retry=timing.expire_retry_s)
        self._role = self.raft.role
        self._leader = self.raft.leader
        self._term = self.raft.term

        self._proposals: dict[int, _Proposal] = {}
        self._reads_queued: list[_Read] = []
        self._rounds: dict[bytes, _ReadRound] = {}
        self._round_seq = 0
        self._round_prefix = config.node_id.encode() + b"/" + os.urandom(4)
        self._waiters: dict[tuple[str, str], list[ClientConn]] = {}
        self._conns: set[ClientConn] = set()
        self._links: dict[str, PeerLink] = {}

        self._wake_flag = False
        self._wake_future: asyncio.Future[None] | None = None
        self._stopping = False
        self.stopped = anyio.Event()
        self._listener: anyio.abc.Listener[Any] | None = None
        self._servers: list[asyncio.Server] = []
        self._transports: set[asyncio.Transport] = set()
        self.leader_seen = anyio.Event()
        self.stats: dict[str, int] = {"readies": 0, "fsync_batches": 0, "entries_persisted": 0}

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, listener: anyio.abc.Listener[Any]) -> None:
        """Runs until ``shutdown`` (or cancellation); closes nothing it did not open."""
        self._listener = listener
        # The listener's sockets are served by asyncio directly: see _Connection.
        loop = asyncio.get_running_loop()
        for sock in _raw_sockets(listener):
            self._servers.append(await loop.create_server(lambda: _Connection(self), sock=sock))
        async with anyio.create_task_group() as tg:
            for peer_id, address in sorted(self.config.peers.items()):
                if peer_id == self.config.node_id:
                    continue
                link = PeerLink(
                    local_id=self.config.node_id,
                    peer_id=peer_id,
                    address=address,
                    cluster=self.config.cluster,
                    log=self.log,
                    on_down=self._peer_down,
                    rng=random.Random(self._rng.random()),
                )
                self._links[peer_id] = link
                tg.start_soon(link.run)
            tg.start_soon(self._drive)
            tg.start_soon(self._tick_loop)
            self.log.info(
                "node_started",
                address=self.config.address,
                cluster=self.config.cluster,
                voters=list(self.config.voters),
                term=self.raft.term,
                commit=self.raft.commit_index,
                last_index=self.raft.last_index,
            )
            self._wake()
            try:
                await self.stopped.wait()
            finally:
                tg.cancel_scope.cancel()
                self._stop_serving()
                for transport in list(self._transports):
                    transport.abort()

    async def shutdown(self) -> None:
        """Stops taking requests, lets in-flight ones finish (bounded), then stops."""
        if self._stopping:
            return
        self._stopping = True
        # Connections waiting in the backlog are refused now, so their clients
        # move on to another member instead of waiting for us to exit.
        self._stop_serving()
        if self._listener is not None:
            with anyio.CancelScope(shield=True):
                await self._listener.aclose()
        self.log.info("shutting_down", pending=len(self._proposals), reads=len(self._rounds))
        deadline = time.monotonic() + self._timing.shutdown_grace_s
        while (self._proposals or self._rounds) and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        handing_over = self._hand_over_leadership()
        while handing_over and self._role is Role.LEADER and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        for proposal in self._proposals.values():
            proposal.conn.send(
                error(proposal.request.id, ErrorCode.SHUTTING_DOWN, "node is shutting down")
            )
        self._proposals.clear()
        # Let the writers flush the last replies.
        for _ in range(10):
            if not any(c.unsent for c in self._conns):
                break
            await anyio.sleep(0.01)
        self.stopped.set()

    def _stop_serving(self) -> None:
        for srv in self._servers:
            srv.close()
        self._servers = []

    def _hand_over_leadership(self) -> bool:
        if self._role is not Role.LEADER or len(self.config.peers) < 2:
            return False
        status = self.raft.status()
        best = None
        best_match = -1
        for peer, pr in status.progress.items():
            if peer != self.config.node_id and pr.recent_active and pr.match > best_match:
                best, best_match = peer, pr.match
        if best is not None:
            self.log.info("transfer_leadership", to=best)
            self.raft.transfer_leadership(best)
            self._wake()
            return True
        return False

    # ------------------------------------------------------------------ wake-ups

    def _wake(self) -> None:
        self._wake_flag = True
        waiter = self._wake_future
        if waiter is not None:
            self._wake_future = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_wake(self) -> None:
        # A bare future rather than an anyio.Event: this runs a few thousand
        # times a second, and cancellation (task.cancel) reaches it all the same.
        while not self._wake_flag:
            waiter = asyncio.get_running_loop().create_future()
            self._wake_future = waiter
            await waiter
        self._wake_flag = False

    # ------------------------------------------------------------------ the Ready loop

    async def _drive(self) -> None:
        raft = self.raft
        while True:
            await self._wait_wake()
            while True:
                if self._reads_queued:
                    self._start_read_round()
                if not raft.has_ready():
                    break
                rd = raft.ready()
                if (
                    len(rd.entries) >= self._thread_min_entries
                    and rd.snapshot is None
                    and self._role is Role.LEADER
                ):
                    # A big batch means a busy leader: let the loop take in the
                    # next batch and answer the last one while the disk syncs this
                    # one. The core may read the stored prefix meanwhile; appends
                    # only touch indexes its unstable tail still shadows. A
                    # snapshot replaces the whole log, so it is installed inline.
                    # A follower has nothing to overlap with its fsync but the
                    # next append, and waking a thread (and winning the GIL back)
                    # cost it more than that.
                    await anyio.to_thread.run_sync(self._persist, rd)
                else:
                    self._persist(rd)
                self._handle_ready(rd)
                raft.advance(rd)
                # Let readers queue what arrived meanwhile, so it joins the next batch.
                await asyncio.sleep(0)

    def _persist(self, rd: Ready) -> None:
        storage = self.storage
        if rd.snapshot is not None:
            storage.apply_snapshot(rd.snapshot)
        if rd.entries:
            storage.append(rd.entries)
            self.stats["fsync_batches"] += 1
            self.stats["entries_persisted"] += len(rd.entries)
        if rd.hard_state is not None:
            # Commit-only changes cost no disk write in our stores (commit is advisory).
            storage.set_hard_state(rd.hard_state)

    def _handle_ready(self, rd: Ready) -> None:
        self.stats["readies"] += 1
        # Messages that carry new entries (or a snapshot) start the followers'
        # fsyncs, so they go first. The rest (commit news, acks, heartbeats)
        # wait until the clients are answered: a loopback write can hand the
        # CPU to the receiving process, and the answers are what someone is
        # waiting for. Everything in this Ready is already durable either way.
        # This runtime persists before it sends anything, so messages_now (which
        # could have left earlier) simply go out with the rest.
        outgoing = rd.messages_now + rd.messages
        send_first = bool(rd.entries) or rd.snapshot is not None
        if send_first and outgoing:
            self._send(outgoing)
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state.role, rd.soft_state.leader, rd.soft_state.term)
        if rd.snapshot is not None:
            self._install_snapshot(rd)
        if rd.committed:
            self._apply(rd)
        if rd.read_states:
            for rs in rd.read_states:
                read_round = self._rounds.get(rs.ctx)
                if read_round is not None:
                    read_round.index = rs.index
        if self._rounds:
            self._serve_ready_rounds()
        if not send_first and outgoing:
            self._send(outgoing)

    def _send(self, messages: Iterable[Message]) -> None:
        links = self._links
        for msg in messages:
            link = links.get(msg.dst)
            if link is not None:
                link.send(msg)
        for link in links.values():
            link.flush()

    def _on_soft_state(self, role: Role, leader: str | None, term: int) -> None:
        was_leader = self._role is Role.LEADER
        changed_leader = leader != self._leader or term != self._term
        self._role, self._leader, self._term = role, leader, term
        if leader is not None and not self.leader_seen.is_set():
            self.leader_seen.set()
        if changed_leader or (role is Role.LEADER) != was_leader:
            self.log.info("role_changed", role=role.value, leader=leader, term=term)
        if role is Role.LEADER and not was_leader:
            self.tracker.take_office(time.monotonic(), self.machine.leases())
        elif was_leader and role is not Role.LEADER:
            self.tracker.leave_office()
            self._fail_proposals(ErrorCode.NOT_LEADER, "leadership changed; re-send")
            for ctx in [c for c, r in self._rounds.items() if r.as_leader]:
                self._fail_reads(self._rounds.pop(ctx).reads, ErrorCode.NOT_LEADER)

    def _install_snapshot(self, rd: Ready) -> None:
        assert rd.snapshot is not None
        snap = rd.snapshot
        self.machine = locks.LockStateMachine.restore(snap.data)
        self._snapshot_index = snap.meta.index
        self.log.info("snapshot_installed", index=snap.meta.index, term=snap.meta.term)
        # Grants that happened inside the snapshot never passed through apply here.
        for (lease, key), conns in list(self._waiters.items()):
            state = self.machine.get(key)
            for holder in state.holders if state is not None else ():
                if holder.lease == lease:
                    self._push_grant(lease, key, holder.token)
                    break
            else:
                if self.machine.lease(lease) is None:
                    self._drop_waiter(lease, key, conns)
        if self.tracker.leading:
            self.tracker.take_office(time.monotonic(), self.machine.leases())

    def _apply(self, rd: Ready) -> None:
        machine = self.machine
        proposals = self._proposals
        tracker = self.tracker
        now = 0.0
        for entry in rd.committed:
            index = entry.index
            if index <= machine.applied_index:
                continue
            if entry.kind is not EntryKind.NORMAL:
                # Membership entries belong to a later issue; the lock table skips them.
                proposal = proposals.pop(index, None)
                if proposal is not None:
                    self._reply_not_leader(proposal.conn, proposal.request.id)
                continue
            outcome = machine.apply(index, entry.data)
            proposal = proposals.pop(index, None)
            if proposal is not None:
                if proposal.data == entry.data and outcome.result is not None:
                    self._answer(proposal, outcome.result)
                else:
                    self._reply_not_leader(proposal.conn, proposal.request.id)
            for grant in outcome.grants:
                self._push_grant(grant.lease, grant.key, grant.token)
            if outcome.opened or outcome.closed or outcome.expired:
                if tracker.leading:
                    now = now or time.monotonic()
                    for lease, ttl_ms in outcome.opened:
                        tracker.opened(lease, ttl_ms, now)
                for lease in (*outcome.closed, *outcome.expired):
                    tracker.ended(lease)
                    self._forget_lease_waiters(lease)
                for lease in outcome.expired:
                    self.log.info("lease_expired", lease=lease, index=index)
        if machine.applied_index - self._snapshot_index >= self.config.snapshot_every:
            self._take_snapshot()

    def _take_snapshot(self) -> None:
        index = self.machine.applied_index
        started = time.monotonic()
        data = self.machine.snapshot()
        conf = ConfState(voters=self.raft.voters, learners=self.raft.learners)
        self.storage.create_snapshot(index, conf, data)
        keep_from = index - self.config.snapshot_keep
        if keep_from > self.storage.first_index() - 1:
            self.storage.compact(keep_from)
        self._snapshot_index = index
        self.log.info(
            "snapshot_taken",
            index=index,
            bytes=len(data),
            ms=round((time.monotonic() - started) * 1000, 1),
        )

    # ------------------------------------------------------------------ answering

    def _answer(self, proposal: _Proposal, result: locks.Result) -> None:
        conn, req = proposal.conn, proposal.request
        rid = req.id
        if isinstance(result, locks.Granted):
            info = self.machine.lease(result.lease)
            conn.send(
                ok(
                    rid,
                    result="granted",
                    key=result.key,
                    token=result.token,
                    lease=result.lease,
                    ttl_ms=info.ttl_ms if info is not None else 0,
                )
            )
        elif isinstance(result, locks.Queued):
            assert isinstance(req, Acquire)
            self._register_waiter(conn, req.lease, result.key)
            conn.send(
                ok(rid, result="queued", key=result.key, lease=req.lease, position=result.position)
            )
        elif isinstance(result, locks.Released):
            conn.send(ok(rid, key=result.key, released="lock" if result.held else "queue"))
        elif isinstance(result, locks.LeaseOpened):
            conn.send(ok(rid, lease=result.lease, ttl_ms=result.ttl_ms))
        elif isinstance(result, locks.LeaseClosed):
            conn.send(ok(rid, lease=result.lease))
        elif isinstance(result, locks.Locked):
            conn.send(
                error(
                    rid,
                    ErrorCode.LOCKED,
                    f"{result.key!r} is held",
                    key=result.key,
                    holders=self._holders(result.holders),
                    retry_after_ms=result.retry_after_ms,
                )
            )
        elif isinstance(result, locks.NotHolder):
            conn.send(
                error(
                    rid,
                    ErrorCode.NOT_HOLDER,
                    f"this lease does not hold or wait for {result.key!r}",
                    key=result.key,
                    holders=self._holders(result.holders),
                )
            )
        elif isinstance(result, locks.SessionExpired):
            if isinstance(req, CloseLease):
                # Closing a lease that is already gone is what the caller wanted.
                conn.send(ok(rid, lease=result.lease))
            else:
                conn.send(
                    error(
                        rid,
                        ErrorCode.SESSION_EXPIRED,
                        f"lease {result.lease!r} does not exist (expired or closed)",
                    )
                )
        elif isinstance(result, locks.BadRequest):
            conn.send(error(rid, ErrorCode.BAD_REQUEST, result.message))

    def _holders(self, holders: Iterable[locks.Holder]) -> list[dict[str, Any]]:
        now_ms = _now_ms()
        now = time.monotonic()
        leading = self.tracker.leading
        out = []
        for h in holders:
            item: dict[str, Any] = {
                "lease": h.lease,
                "token": h.token,
                "granted_at_ms": h.granted_at_ms,
                "held_ms": max(0, now_ms - h.granted_at_ms),
                "meta": dict(h.meta),
            }
            if leading:
                info = self.machine.lease(h.lease)
                if info is not None:
                    item["ttl_ms"] = info.ttl_ms
                    item["remaining_ms"] = self.tracker.remaining_ms(h.lease, now)
            out.append(item)
        return out

    def _reply_not_leader(self, conn: ClientConn, rid: int, leader: str | None = None) -> None:
        if leader is None and self._leader != self.config.node_id:
            leader = self._leader
        conn.send(
            error(
                rid,
                ErrorCode.NOT_LEADER,
                "not the leader" if leader is None else f"not the leader; try {leader}",
                leader=leader,
                leader_address=self.config.address_of(leader),
            )
        )

    def _fail_proposals(self, code: ErrorCode, message: str) -> None:
        proposals, self._proposals = self._proposals, {}
        for proposal in proposals.values():
            if code is ErrorCode.NOT_LEADER:
                self._reply_not_leader(proposal.conn, proposal.request.id)
            else:
                proposal.conn.send(error(proposal.request.id, code, message))

    def _fail_reads(self, reads: Iterable[_Read], code: ErrorCode) -> None:
        for read in reads:
            if code is ErrorCode.NOT_LEADER:
                self._reply_not_leader(read.conn, read.request.id)
            elif code is ErrorCode.NO_QUORUM:
                read.conn.send(
                    error(
                        read.request.id,
                        code,
                        "the leader cannot reach a majority",
                        retry_after_ms=500,
                    )
                )
            else:
                read.conn.send(error(read.request.id, code, "read was not confirmed in time"))

    # ------------------------------------------------------------------ waiters and pushes

    def _register_waiter(self, conn: ClientConn, lease: str, key: str) -> None:
        if conn.closed:
            return
        conns = self._waiters.setdefault((lease, key), [])
        if conn not in conns:
            conns.append(conn)
        conn.waiting.add((lease, key))

    def _push_grant(self, lease: str, key: str, token: int) -> None:
        conns = self._waiters.pop((lease, key), None)
        if not conns:
            return
        frame = grant_push(lease, key, token)
        for conn in conns:
            conn.waiting.discard((lease, key))
            conn.send(frame)

    def _drop_waiter(self, lease: str, key: str, conns: list[ClientConn]) -> None:
        self._waiters.pop((lease, key), None)
        for conn in conns:
            conn.waiting.discard((lease, key))

    def _forget_lease_waiters(self, lease: str) -> None:
        if not self._waiters:
            return
        for pair in [p for p in self._waiters if p[0] == lease]:
            self._drop_waiter(*pair, self._waiters[pair])

    # ------------------------------------------------------------------ reads

    def _start_read_round(self) -> None:
        reads, self._reads_queued = self._reads_queued, []
        self._round_seq += 1
        ctx = self._round_prefix + self._round_seq.to_bytes(8, "big")
        result = self.raft.read_index(ctx)
        if isinstance(result, NotLeader):
            for read in reads:
                self._reply_not_leader(read.conn, read.request.id, result.leader)
            return
        self._rounds[ctx] = _ReadRound(reads, time.monotonic(), as_leader=self._role is Role.LEADER)

    def _serve_ready_rounds(self) -> None:
        applied = self.machine.applied_index
        done = [ctx for ctx, r in self._rounds.items() if r.index >= 0 and r.index <= applied]
        for ctx in done:
            for read in self._rounds.pop(ctx).reads:
                self._serve_read(read)

    def _serve_read(self, read: _Read) -> None:
        conn, req = read.conn, read.request
        if isinstance(req, KeepAlive):
            self._serve_keepalive(read, req)
        elif isinstance(req, Get):
            conn.send(self._get_reply(req))
        elif isinstance(req, ListLocks):
            conn.send(self._list_reply(req))
        elif isinstance(req, LeaseInfo):
            conn.send(self._lease_info_reply(req))
        elif isinstance(req, Status):
            conn.send(self._status_reply(req))

    def _serve_keepalive(self, read: _Read, req: KeepAlive) -> None:
        if self._role is not Role.LEADER:
            self._reply_not_leader(read.conn, req.id)
            return
        info = self.machine.lease(req.lease)
        if info is None or self.tracker.is_expiring(req.lease):
            read.conn.send(
                error(
                    req.id,
                    ErrorCode.SESSION_EXPIRED,
                    f"lease {req.lease!r} does not exist (expired or closed)",
                )
            )
            return
        if not self.tracker.renew(req.lease, read.received):
            self.tracker.opened(req.lease, info.ttl_ms, read.received)
        read.conn.send(ok(req.id, lease=req.lease, ttl_ms=info.ttl_ms))

    def _get_reply(self, req: Get) -> dict[str, Any]:
        state = self.machine.get(req.key)
        if state is None:
            return ok(req.id, key=req.key, limit=1, holders=[], waiters=[])
        return ok(
            req.id,
            key=req.key,
            limit=state.limit,
            holders=self._holders(state.holders),
            waiters=[
                {"lease": w.lease, "since_ms": w.since_ms, "position": i, "meta": dict(w.meta)}
                for i, w in enumerate(state.waiters, start=1)
            ],
        )

    def _list_reply(self, req: ListLocks) -> dict[str, Any]:
        return ok(
            req.id,
            locks=[
                {
                    "key": s.key,
                    "limit": s.limit,
                    "holders": self._holders(s.holders),
                    "waiters": len(s.waiters),
                }
                for s in self.machine.list_locks(req.prefix)
            ],
        )

    def _lease_info_reply(self, req: LeaseInfo) -> dict[str, Any]:
        info = self.machine.lease(req.lease)
        if info is None:
            return error(
                req.id,
                ErrorCode.SESSION_EXPIRED,
                f"lease {req.lease!r} does not exist (expired or closed)",
            )
        remaining = (
            self.tracker.remaining_ms(req.lease, time.monotonic()) if self.tracker.leading else None
        )
        return ok(
            req.id,
            lease=req.lease,
            ttl_ms=info.ttl_ms,
            remaining_ms=remaining,
            keys=list(info.holding),
            waiting=list(info.waiting),
        )

    def status_view(self) -> dict[str, Any]:
        st = self.raft.status()
        counts = self.machine.counts()
        view: dict[str, Any] = {
            "node": st.id,
            "address": self.config.address,
            "cluster": self.config.cluster,
            "role": st.role.value,
            "term": st.term,
            "leader": st.leader,
            "leader_address": self.config.address_of(st.leader),
            "commit": st.commit,
            "applied": self.machine.applied_index,
            "first_index": st.first_index,
            "last_index": st.last_index,
            "members": [
                {"id": member, "address": self.config.address_of(member)} for member in st.voters
            ],
            "sessions": counts.sessions,
            "locks": counts.locks,
            "waiters": counts.waiters,
        }
        view["stats"] = {
            **self.stats,
            "peer_frames": {p: link.sent_frames for p, link in self._links.items()},
            "peer_dropped": {p: link.dropped for p, link in self._links.items()},
        }
        if st.progress:
            view["progress"] = {
                member: {"match": p.match, "next": p.next, "active": p.recent_active}
                for member, p in st.progress.items()
            }
        return view

    def _status_reply(self, req: Status) -> dict[str, Any]:
        return ok(req.id, **self.status_view())

    # ------------------------------------------------------------------ the ticker

    async def _tick_loop(self) -> None:
        tick = self._timing.tick_s
        raft = self.raft
        next_at = time.monotonic() + tick
        while True:
            await anyio.sleep(max(0.0, next_at - time.monotonic()))
            now = time.monotonic()
            # After a stall, tick once rather than catching up: a burst of ticks
            # would make a starved follower start an election it does not need.
            next_at = max(next_at + tick, now + tick / 2)
            raft.tick()
            if self.tracker.leading:
                self._expire_due(now)
            self._time_out_requests(now)
            self._wake()

    def _expire_due(self, now: float) -> None:
        due = self.tracker.due(now)
        if not due:
            return
        at_ms = _now_ms()
        for lease in due:
            result = self.raft.propose(locks.encode_command(locks.Expire(lease, at_ms)))
            if isinstance(result, NotLeader):
                return
            self.log.info("lease_deadline_passed", lease=lease, index=result)

    def _time_out_requests(self, now: float) -> None:
        limit = now - self._timing.request_timeout_s
        if self._proposals:
            stale = [i for i, p in self._proposals.items() if p.started < limit]
            for index in stale:
                p = self._proposals.pop(index)
                p.conn.send(
                    error(p.request.id, ErrorCode.TIMEOUT, "not committed in time; re-send")
                )
        if self._rounds:
            for ctx in [c for c, r in self._rounds.items() if r.started < limit]:
                read_round = self._rounds.pop(ctx)
                code = ErrorCode.NO_QUORUM if read_round.as_leader else ErrorCode.TIMEOUT
                self._fail_reads(read_round.reads, code)

    # ------------------------------------------------------------------ peers

    def _peer_down(self, peer: str) -> None:
        self.raft.report_unreachable(peer)
        self._wake()

    def _peer_hello(self, hello: Hello, where: str) -> str | None:
        """Why a peer's hello is refused, or None to accept it."""
        if hello.cluster != self.config.cluster:
            return (
                f"cluster id mismatch: this node {self.config.node_id} is in cluster "
                f"{self.config.cluster!r}, the peer says {hello.cluster!r}"
            )
        if hello.node == self.config.node_id or hello.node not in self.config.peers:
            return f"{hello.node!r} is not a member of this cluster"
        return None

    def _step_peer_frames(self, src: str, decoder: FrameDecoder) -> None:
        """Steps every Raft message buffered from ``src``; ProtocolError ends the connection."""
        raft = self.raft
        node_id = self.config.node_id
        for obj in decoder.frames():
            for msg in decode_raft_frame(obj):
                if msg.src != src or msg.dst != node_id:
                    continue
                try:
                    raft.step(msg)
                except Exception as exc:  # a core bug must not kill the node
                    self.log.error(
                        "step_failed", peer=src, message=type(msg).__name__, error=repr(exc)
                    )
        self._wake()

    # ------------------------------------------------------------------ clients

    def _client_hello(self, hello: Hello) -> dict[str, Any] | None:
        """The error that refuses a client's hello, or None to accept it."""
        if hello.cluster and hello.cluster != self.config.cluster:
            message = (
                f"this node is in cluster {self.config.cluster!r}, "
                f"not {hello.cluster!r}: check DLM_CLUSTER"
            )
            return error(None, ErrorCode.BAD_REQUEST, message)
        if self._stopping:
            return error(None, ErrorCode.SHUTTING_DOWN, "node is shutting down")
        return None

    def _client_gone(self, conn: ClientConn) -> None:
        conn.closed = True
        self._conns.discard(conn)
        for pair in conn.waiting:
            conns = self._waiters.get(pair)
            if conns is not None and conn in conns:
                conns.remove(conn)
                if not conns:
                    del self._waiters[pair]
        conn.waiting.clear()

    def _handle_frames(self, conn: ClientConn, decoder: FrameDecoder) -> bool:
        """Handles every complete frame buffered; False when the connection must close."""
        handled = 0
        while True:
            try:
                for obj in decoder.frames():
                    self._handle_request(conn, obj)
                    handled += 1
                break
            except ProtocolError as exc:
                self.log.warning("client_bad_frame", remote=conn.peer, error=str(exc))
                conn.send(error(None, exc.code, str(exc)))
                conn.bad_frames += 1
                if exc.code is ErrorCode.TOO_LARGE or conn.bad_frames > MAX_BAD_FRAMES:
                    # The stream cannot be resynchronised after an oversized length.
                    return False
        if handled:
            self._wake()
        return True

    def _handle_request(self, conn: ClientConn, obj: Any) -> None:
        try:
            req = decode_request(obj)
        except ProtocolError as exc:
            rid = obj.get("id") if isinstance(obj, dict) else None
            if not isinstance(rid, int) or isinstance(rid, bool):
                rid = None
            conn.bad_frames += 1
            self.log.warning("client_bad_request", remote=conn.peer, error=str(exc))
            conn.send(error(rid, exc.code, str(exc)))
            return
        if self._stopping:
            conn.send(error(req.id, ErrorCode.SHUTTING_DOWN, "node is shutting down"))
            return
        if isinstance(req, Acquire | Release | OpenLease | CloseLease):
            self._propose_request(conn, req)
        elif isinstance(req, Get | ListLocks | Status) and req.stale:
            self._serve_read(_Read(conn, req, 0.0))
        elif self._role is not Role.LEADER:
            # Keep-alives and linearizable reads go to the leader: it confirms the read
            # point itself, and only it knows how much of each lease's TTL is left.
            self._reply_not_leader(conn, req.id)
        else:
            self._reads_queued.append(_Read(conn, req, time.monotonic()))

    def _propose_request(
        self, conn: ClientConn, req: Acquire | Release | OpenLease | CloseLease
    ) -> None:
        at_ms = _now_ms()
        cmd: locks.Command
        if isinstance(req, Acquire):
            cmd = locks.Acquire(req.lease, req.seq, req.key, req.wait, req.limit, req.meta, at_ms)
        elif isinstance(req, Release):
            cmd = locks.Release(req.lease, req.seq, req.key, at_ms)
        elif isinstance(req, OpenLease):
            cmd = locks.OpenLease(req.lease, req.ttl_ms, at_ms)
        else:
            cmd = locks.CloseLease(req.lease, req.seq, at_ms)
        problem = locks.validate_command(cmd)
        if problem is not None:
            conn.send(error(req.id, ErrorCode.BAD_REQUEST, problem))
            return
        data = locks.encode_command(cmd)
        result = self.raft.propose(data)
        if isinstance(result, NotLeader):
            self._reply_not_leader(conn, req.id, result.leader)
            return
        self._proposals[result] = _Proposal(conn, req, data, time.monotonic())


class _Connection(asyncio.Protocol):
    """One accepted TCP connection. Its hello decides whether a client or a peer speaks.

    Everything runs in the transport's callbacks, on the loop thread: frames
    are handled as they arrive and the driver is woken once per read.
    """

    def __init__(self, server: NodeServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._where = "?"
        self._hello_buf: bytearray | None = bytearray()
        self._hello_timer: asyncio.TimerHandle | None = None
        self._decoder: FrameDecoder | None = None
        self._client: ClientConn | None = None
        self._peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._where = _remote(transport.get_extra_info("peername"))
        self._server._transports.add(transport)
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(HELLO_TIMEOUT, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self._transport is not None:
            self._server._transports.discard(self._transport)
        if self._client is not None:
            self._server._client_gone(self._client)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        decoder = self._decoder
        if decoder is None:
            decoder = self._hello(data)
            if decoder is None:
                return
        else:
            decoder.feed(data)
        server = self._server
        if self._client is not None:
            if not server._handle_frames(self._client, decoder):
                transport.close()  # after the final error is flushed
        elif self._peer is not None:
            try:
                server._step_peer_frames(self._peer, decoder)
            except ProtocolError as exc:
                server.log.warning(
                    "peer_bad_frame", peer=self._peer, remote=self._where, error=str(exc)
                )
                transport.abort()

    def _hello(self, data: bytes) -> FrameDecoder | None:
        """Consumes the hello; the connection's decoder once its role is known."""
        assert self._transport is not None and self._hello_buf is not None
        transport, server, where = self._transport, self._server, self._where
        self._hello_buf += data
        try:
            first = split_first_frame(self._hello_buf)
            if first is None:
                return None
            hello = Hello.from_wire(first[0])
        except ProtocolError as exc:
            server.log.warning("bad_hello", remote=where, error=str(exc))
            _send_and_close(transport, error(None, exc.code, str(exc)))
            return None
        self._hello_buf = None
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if hello.version != PROTOCOL_VERSION:
            message = (
                f"protocol version {hello.version} is not supported "
                f"(this node speaks {PROTOCOL_VERSION})"
            )
            server.log.warning("bad_hello", remote=where, error=message)
            _send_and_close(transport, error(None, ErrorCode.BAD_REQUEST, message))
            return None
        config = server.config
        if hello.role is WireRole.PEER:
            problem = server._peer_hello(hello, where)
            if problem is not None:
                server.log.warning("peer_refused", remote=where, peer=hello.node, reason=problem)
                _send_and_close(transport, error(None, ErrorCode.BAD_REQUEST, problem))
                return None
            self._peer = hello.node
            decoder = FrameDecoder(PEER_FRAME_LIMIT)
        else:
            refusal = server._client_hello(hello)
            if refusal is not None:
                _send_and_close(transport, refusal)
                return None
            self._client = ClientConn(transport, where)
            server._conns.add(self._client)
            decoder = FrameDecoder(CLIENT_FRAME_LIMIT)
        transport.write(encode_frame(welcome(config.node_id, config.cluster)))
        self._decoder = decoder
        decoder.feed(first[1])
        return decoder


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


# ---------------------------------------------------------------------- process entry


async def run(
    config: NodeConfig,
    storage: Storage,
    listener: anyio.abc.Listener[Any],
    *,
    log: Logger,
    on_started: Callable[[NodeServer], None] | None = None,
    persist_in_thread: bool | int = PERSIST_THREAD_MIN_ENTRIES,
) -> None:
    """Serves until SIGTERM/SIGINT, then shuts down gracefully."""
    server = NodeServer(config, storage, log=log, persist_in_thread=persist_in_thread)
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
