"""The whole member as a pure state machine: events and the time in, actions out.

Theory of operation
-------------------
``NodeMachine`` makes every decision a member makes and performs none of
them. The runtime (server.py, or the simulator in tests/sim) feeds it events,
each with the time (``Instant``: a monotonic reading for timers and lease
clocks, and the wall clock only for the ``at_ms`` stamps users read):

* ``client_connected`` / ``client_frame`` / ``client_closed``: a client's
  connection, after the runtime accepted its hello;
* ``peer_messages``: Raft messages that arrived from an authenticated peer;
  ``peer_version`` / ``peer_unreachable``: what the links learned;
* ``timer``: the time in ``next_timer()`` has come;
* ``persisted``: a ``Persist`` action is durable.

and collects what must be done as actions (``take_actions()``): frames for
client connections, messages for peers, entries and hard state to persist,
snapshots to save, log events, a changed set of peers to dial, a request to
stop. It owns the Raft node, the lock state machine, the leader's lease
tracker, the pending proposals, the read rounds and the waiters to push
grants to. Nothing here reads a clock, touches a socket or a file, or draws
randomness it was not given, so the simulator drives exactly this object.

Persistence (Raft dissertation §10.2.1): each Ready is handed out as one
``Persist`` job, and jobs complete in order. The leader's appends and
heartbeats (``Ready.messages_now``) leave at once, while its own fsync runs;
everything that promises something about this member's disk leaves only
when its job, and every job before it, is durable. The core counts the
leader's own entries toward a commit only after ``advance``, which happens
at that point too. Committed entries are applied as soon as they are handed
out: they are durable on a quorum already.

Answers: a proposal is remembered by its log index and payload; when the
entry at that index is applied, its result goes to the client if the payload
is the one we proposed; if another leader's entry took the index, or we lose
leadership first, the client gets NOT_LEADER and re-sends with the same seq,
which the state machine answers from memory (docs/PROTOCOL.md).

Time: only the leader keeps lease deadlines (leases.py) and only the leader
stamps ``at_ms``. Keep-alives do not enter the log: they are answered once a
ReadIndex round confirms we still lead; one round confirms every keep-alive
and read that arrived before it started.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cbor2

from dlm.node import locks, replies
from dlm.node.leases import LeaseTracker
from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    ConfChange,
    ConfChangeDecodeError,
    ConfChangeKind,
    ConfChangeRefused,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    LogStorage,
    Message,
    NodeId,
    NotLeader,
    Ready,
    Role,
    Snapshot,
    decode_conf_change,
)
from dlm.node.replies import Replies, lease_gone
from dlm.node.stats import Stats
from dlm.views import MembersView, StatusView
from dlm.wire import (
    Acquire,
    BadFrame,
    ClientRequest,
    CloseLease,
    ErrorCode,
    Get,
    LeaseInfo,
    LeaseTerms,
    ListLeases,
    ListLocks,
    LockChange,
    MemberAdd,
    MemberChange,
    MemberPromote,
    MemberRemove,
    Members,
    OpenLease,
    Ping,
    ProtocolError,
    Release,
    Renew,
    Status,
    UpdateLease,
    decode_request,
    error,
    grant_push,
    ok,
    parse_addr,
)

PROMOTE_LAG = 64
"""A learner this close to the leader's log (in entries) is caught up: it may vote."""
REMOVED = "was removed from this cluster"
"""Words a member uses when it refuses a peer it knows was removed (the peer then stops, if
the refusal is authenticated: admission.py)."""
MAX_BAD_REQUESTS = 16
MAX_UNLISTED_PEERS = 16
"""Peers our log does not name whose addresses we keep (a stranger must not grow it)."""
"""Bad requests of any kind tolerated on one client connection before it is closed."""
NODE_IMAGE_FORMAT = 2
"""Layout of this member's snapshot image at cluster version 2 (version 1: the bare lock image)."""
PROTOCOL_SPOKEN = 2
"""The highest cluster version this release can run."""
REJECT_LOG_EVERY = 1.0
"""Seconds between two log lines about rejected input (the rest are counted)."""


# ---------------------------------------------------------------------------
# Inputs and outputs
# ---------------------------------------------------------------------------


class Instant(NamedTuple):
    """The time of an event: ``mono`` (monotonic seconds) for every timer and lease clock,
    ``wall_ms`` (ms since the epoch) only for the stamps people read."""

    mono: float
    wall_ms: int


@dataclass(frozen=True, slots=True)
class Timing:
    """Clock settings of a member.

    The election timeout is drawn by the core between ``election_ticks`` and
    twice that, so 50 ms ticks and 6 ticks give 300-600 ms: a dead leader is
    replaced well within a second, while a follower whose event loop stalls
    for a few hundred milliseconds under load does not start an election.
    """

    tick_s: float = 0.05
    election_ticks: int = 6
    heartbeat_ticks: int = 1
    request_timeout_s: float = 5.0
    """A proposal or read not answered in this time gets TIMEOUT (the client retries)."""
    expire_retry_s: float = 1.0
    """A lease whose Expire was proposed but is still alive this long after is proposed again."""

    @property
    def election_timeout_s(self) -> float:
        return self.tick_s * self.election_ticks


@dataclass(frozen=True, slots=True)
class Quotas:
    """What one member agrees to hold; requests beyond get QUOTA_EXCEEDED.

    The defaults are far beyond what a fleet of 5,000 hosts needs; they exist
    so that a runaway client cannot make the leader run out of memory.
    """

    max_leases: int = 200_000
    max_locks: int = 2_000_000
    """Held slots plus queued waiters."""
    max_meta_bytes: int = 4096
    """Owner metadata of one lock or lease, names and values together."""


@dataclass(frozen=True, slots=True)
class MachineConfig:
    node_id: NodeId
    cluster: str
    peers: Mapping[NodeId, str]
    """The cluster's first members (its bootstrap configuration) and their addresses."""
    timing: Timing = field(default_factory=Timing)
    snapshot_every: int = 10_000
    snapshot_keep: int = 1_000
    quotas: Quotas = field(default_factory=Quotas)
    max_version: int = PROTOCOL_SPOKEN
    """The highest cluster version this member runs (tests lower it to play an old member)."""
    auto_promote: bool = True
    """The leader promotes a learner to voter once it is within PROMOTE_LAG entries."""
    address: str = ""
    """This member's own address (for a member that joined later, not in ``peers``)."""
    join_members: Mapping[NodeId, str] = field(default_factory=dict)
    """The members a joining member was told of when it joined, with their addresses: it
    dials them until its own log names the configuration, so that it can answer a leader
    that is not among the first members."""


@dataclass(frozen=True, slots=True)
class SendFrame:
    conn: int
    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close a client connection once the frames queued before this are written."""

    conn: int
    reason: str


@dataclass(frozen=True, slots=True)
class SendMessages:
    peer: NodeId
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Persist:
    """Make these durable, in order after every earlier Persist, then call ``persisted(job)``.

    Snapshot first, then entries (dropping any stored entries at or after the
    first one's index), then the hard state; one fsync for the lot.
    """

    job: int
    snapshot: Snapshot | None
    entries: tuple[Entry, ...]
    hard_state: HardState | None


@dataclass(frozen=True, slots=True)
class SaveSnapshot:
    """Record this image of the applied state (after every earlier Persist), then drop
    log entries up to ``compact_to`` (nothing when 0)."""

    index: int
    conf: ConfState
    data: bytes
    compact_to: int


@dataclass(frozen=True, slots=True)
class LogEvent:
    level: str
    event: str
    fields: dict[str, Any]
    at_ms: int | None = None
    """The event's own time (wall clock, ms), when it is not now: the leader's stamp of a
    log entry this member applies again after a restart (``replayed``)."""


@dataclass(frozen=True, slots=True)
class PeersChanged:
    """The members to keep links to (every member but this one), with their addresses."""

    peers: dict[NodeId, str]


@dataclass(frozen=True, slots=True)
class Stop:
    """This member must stop serving and exit with ``code``, saying ``reason``."""

    reason: str
    code: int


Action = (
    SendFrame
    | CloseConnection
    | SendMessages
    | Persist
    | SaveSnapshot
    | LogEvent
    | PeersChanged
    | Stop
)


# ---------------------------------------------------------------------------
# Internal records
# ---------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Conn:
    conn: int
    remote: str
    waiting: set[tuple[str, str]] = field(default_factory=set)
    """(lease, key) pairs this connection waits for a grant push on."""
    bad_requests: int = 0


@dataclass(slots=True)
class _Proposal:
    conn: int
    request: ClientRequest
    data: bytes
    command: locks.Command
    started: float
    received_ms: int


@dataclass(slots=True)
class _Read:
    """A request that needs a confirmed read point (or, for keep-alives, confirmed leadership)."""

    conn: int
    request: ClientRequest
    received: float


@dataclass(slots=True)
class _ReadRound:
    reads: list[_Read]
    started: float
    as_leader: bool
    index: int = -1
    """The confirmed read point, once the core reported it."""


@dataclass(slots=True)
class _Job:
    ready: Ready
    persisting: bool
    done: bool = False


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


class NodeMachine:
    """One member's decisions. Not thread-safe: one runtime task owns it."""

    # Seams for the simulator's instrumented and bug-injected variants.
    lock_machine_class: type[locks.LockStateMachine] = locks.LockStateMachine
    raft_class: type[RaftNode] = RaftNode
    tracker_class: type[LeaseTracker] = LeaseTracker

    def __init__(
        self,
        config: MachineConfig,
        storage: LogStorage,
        rng: random.Random,
        now: Instant,
    ) -> None:
        self.config = config
        self._storage = storage
        self._rng = rng
        self._timing = timing = config.timing
        self._actions: list[Action] = []
        self.stats = Stats()

        self.locks = self.lock_machine_class()
        self._addresses: dict[NodeId, str] = dict(config.peers)
        self._add_configured_addresses()
        self._removed_ids: set[NodeId] = set()
        self._unlisted_peers: dict[NodeId, str] = {}
        """Addresses from the hellos of peers our log does not name (see accept_peer)."""
        self._member_proposals: dict[int, tuple[int, MemberChange, ConfChange]] = {}
        snap = storage.snapshot()
        self._snapshot_index = 0
        if snap is not None and snap.data:
            self._restore_image(snap.data)
            self._snapshot_index = snap.meta.index

        self.raft = self.raft_class(
            Config(
                id=config.node_id,
                voters=tuple(sorted(config.peers)),
                election_ticks=timing.election_ticks,
                heartbeat_ticks=timing.heartbeat_ticks,
            ),
            storage,
            rng,
        )
        self._addresses_from_log(storage)
        self._replay_until = self.raft.last_index
        """Entries up to here were in the log when this member started: applying them again
        repeats events that happened before, which the audit trail marks ``replayed``."""
        self._replaying = False
        self._entry_stamp_ms: int | None = None
        """The leader's stamp of the entry being applied (of the last one that had a stamp,
        for a membership entry, which carries none)."""
        self.tracker = self.tracker_class(expire_retry=timing.expire_retry_s)
        self._role = self.raft.role
        self._leader = self.raft.leader
        self._term = self.raft.term
        self._next_tick = now.mono + timing.tick_s

        self._conns: dict[int, _Conn] = {}
        self._waiters: dict[tuple[str, str], list[int]] = {}
        self._proposals: dict[int, _Proposal] = {}
        self._reads_queued: list[_Read] = []
        self._rounds: dict[bytes, _ReadRound] = {}
        self._round_seq = 0
        # Unique per process incarnation: a late answer to a read round from before a
        # restart must not be taken for one of ours.
        self._round_prefix = config.node_id.encode() + b"/" + rng.getrandbits(32).to_bytes(4)
        self._jobs: deque[tuple[int, _Job]] = deque()
        self._next_job = 1
        self._peer_versions: dict[NodeId, int] = {}
        self._peer_heard: dict[NodeId, float] = {}
        self._links_down: set[NodeId] = set()
        """Members whose link dropped and that have not been heard from since."""
        self._peers_silent: set[NodeId] = set()
        self._leading_since = now.mono
        self._append_sent: dict[NodeId, dict[int, float]] = {}
        self._version_proposed_at = -1.0e9
        self._stopping = False
        self._stopped = False
        self._reject_log_at = -1.0e9
        self._rejects_unlogged = 0
        self._granted_mono: dict[tuple[str, str], float] = {}
        self._queued_mono: dict[tuple[str, str], float] = {}
        self._emit(PeersChanged(self._peer_map()))
        self._pump(now)

    # ------------------------------------------------------------------ outputs

    def take_actions(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

    def next_timer(self) -> float:
        """The monotonic time at which ``timer`` must be called next."""
        return self._next_tick

    @property
    def role(self) -> Role:
        return self._role

    @property
    def leader(self) -> NodeId | None:
        return self._leader

    @property
    def transferring(self) -> bool:
        """A leader handing leadership over (a stopping member waits for it to finish)."""
        return self._role is Role.LEADER and self.raft.lead_transferee is not None

    @property
    def idle(self) -> bool:
        """No proposal, read or persistence outstanding (a draining member may stop)."""
        return not self._proposals and not self._rounds and not self._jobs

    def address_of(self, node: NodeId | None) -> str | None:
        return None if node is None else self._addresses.get(node)

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _log(self, level: str, event: str, **fields: Any) -> None:
        if self._replaying:
            # An event of an entry applied before the restart: marked, and at its own time,
            # so that neither a reader nor a log collector takes it for a new one.
            fields["replayed"] = True
            self._actions.append(LogEvent(level, event, fields, self._entry_stamp_ms))
            return
        self._actions.append(LogEvent(level, event, fields))

    def _reply(self, conn: int, frame: dict[str, Any]) -> None:
        if conn in self._conns:
            self._actions.append(SendFrame(conn, frame))

    def _answer_request(self, conn: int, kind: str, frame: dict[str, Any]) -> None:
        """Replies to a request of type ``kind``, counting the answer: every answer to a
        request leaves through here, so the counts by type and result are complete."""
        self.stats.count(kind, frame["code"] if frame["t"] == "error" else "OK")
        self._reply(conn, frame)

    def _peer_map(self) -> dict[NodeId, str]:
        members = {*self.raft.voters, *self.raft.learners}
        me = self.config.node_id
        if me not in members:
            # Joined, and our log does not name us yet: the leader may be a member our log
            # does not know either, and its first appends must be answered.
            members.update(self.config.join_members)
        peers = {m: self._addresses[m] for m in sorted(members) if m != me and m in self._addresses}
        leader = self.raft.leader
        if leader is not None and leader != me and leader not in peers:
            # We follow a leader our log does not name yet (added while we were away):
            # answer it at the address its hello gave, until the log catches up.
            address = self._unlisted_peers.get(leader)
            if address is not None:
                peers[leader] = address
        return peers

    def _add_configured_addresses(self) -> None:
        """Our own address and those we were told of at joining, where nothing newer says."""
        config = self.config
        if config.address:
            self._addresses.setdefault(config.node_id, config.address)
        for member, member_address in config.join_members.items():
            self._addresses.setdefault(member, member_address)

    def _addresses_from_log(self, storage: LogStorage) -> None:
        """The addresses of members added by the entries after the snapshot: the snapshot's
        image has the others, and the configuration counts these from start-up on."""
        first, last = storage.first_index(), storage.last_index()
        if last >= first:
            self._note_conf_entries(
                e for e in storage.entries(first, last + 1) if e.kind is EntryKind.CONF_CHANGE
            )

    # ------------------------------------------------------------------ inputs: time

    def timer(self, now: Instant) -> None:
        if now.mono >= self._next_tick:
            # After a stall, tick once rather than catching up: a burst of ticks would
            # make a starved follower start an election it does not need.
            tick = self._timing.tick_s
            self._next_tick = max(self._next_tick + tick, now.mono + tick / 2)
            self.raft.tick()
            if self.tracker.leading:
                self._expire_due(now)
                self._maybe_raise_version(now)
                self._promote_caught_up_learners()
            self._watch_peers(now)
            self._time_out_requests(now)
        self._pump(now)

    def _expire_due(self, now: Instant) -> None:
        for lease, incarnation in self.tracker.due(now.mono):
            cmd = locks.ExpireCommand(lease, incarnation, now.wall_ms)
            result = self.raft.propose(locks.encode_command(cmd))
            if isinstance(result, NotLeader):
                return
            self._log("info", "lease_deadline_passed", lease=lease, index=result)

    def _maybe_raise_version(self, now: Instant) -> None:
        """Once every member speaks version 2, the leader moves the log to it (PROTOCOL.md)."""
        if self.locks.version >= self.config.max_version or self._role is not Role.LEADER:
            return
        if now.mono - self._version_proposed_at < self._timing.election_timeout_s * 4:
            return
        members = (*self.raft.voters, *self.raft.learners)
        me = self.config.node_id
        if any(self._peer_versions.get(m, 1) < self.config.max_version for m in members if m != me):
            return
        cmd = locks.ClusterVersionCommand(self.config.max_version, now.wall_ms)
        if not isinstance(self.raft.propose(locks.encode_command(cmd)), NotLeader):
            self._version_proposed_at = now.mono
            self._log("info", "cluster_version_proposed", version=self.config.max_version)

    def _time_out_requests(self, now: Instant) -> None:
        limit = now.mono - self._timing.request_timeout_s
        if self._proposals:
            for index in [i for i, p in self._proposals.items() if p.started < limit]:
                p = self._proposals.pop(index)
                self._answer_request(
                    p.conn,
                    p.request.TYPE,
                    error(p.request.id, ErrorCode.TIMEOUT, "not committed in time; re-send"),
                )
        if self._rounds:
            for ctx in [c for c, r in self._rounds.items() if r.started < limit]:
                read_round = self._rounds.pop(ctx)
                code = ErrorCode.NO_QUORUM if read_round.as_leader else ErrorCode.TIMEOUT
                self._fail_reads(read_round.reads, code)

    # ------------------------------------------------------------------ inputs: peers

    def accept_peer(self, node: NodeId, speaks: int, address: str = "") -> str | None:
        """Why a peer's (authenticated) hello is refused, or None to accept it.

        A peer our log does not name, that says where it listens, is accepted: our log may
        be behind (we were down while it was added), and if it leads, its appends are how
        we catch up. Its address serves only to answer it while we follow it; it never
        makes it a member (only the log does)."""
        if node == self.config.node_id:
            return f"{node!r} is this member's own id"
        if node in self._removed_ids:
            return (
                f"member {node} {REMOVED}: remove its data directory and join it again, "
                "with a new id"
            )
        if node not in self._addresses and node not in self.raft.voters:
            if not address:
                return f"{node!r} is not a member of this cluster"
            if len(self._unlisted_peers) >= MAX_UNLISTED_PEERS:
                self._unlisted_peers.pop(next(iter(self._unlisted_peers)))
            self._unlisted_peers[node] = address
        if self.locks.version >= 2 and speaks < 2:
            return (
                f"member {node} speaks protocol {speaks}, and this cluster already runs "
                "version 2: upgrade it to this release"
            )
        return None

    def peer_refused(self, node: NodeId, message: str) -> None:
        """A member refused our link, and proved it wrote the refusal (sealed after the
        handshake, or over TLS: admission.py decides, and nothing unproved gets here);
        if it says we were removed, we stop (exit 0)."""
        if REMOVED in message and not self._stopped:
            self._stopped = True
            self._log("warning", "removed", told_by=node)
            self._emit(
                Stop(
                    f"this member {REMOVED} (told by {node}); to bring it back, remove its "
                    "data directory and start it with --join and a new --id",
                    0,
                )
            )

    def peer_version(self, node: NodeId, speaks: int) -> None:
        """A link to or from ``node`` learned the highest protocol version it speaks."""
        self._peer_versions[node] = speaks

    def peer_unreachable(self, node: NodeId, now: Instant, *, gone: bool = False) -> None:
        """Our link to ``node`` broke; ``gone``: a redial was refused (no process listens)."""
        self._links_down.add(node)
        self.raft.report_unreachable(node, gone=gone)
        self._pump(now)

    def peer_messages(
        self, src: NodeId, messages: Iterable[Message], now: Instant, *, pump: bool = True
    ) -> None:
        """Steps every message ``src`` sent; a message claiming another sender is dropped.

        ``pump=False`` leaves the work for a later ``pump`` (see ``client_frame``)."""
        raft = self.raft
        me = self.config.node_id
        members, unlisted = self._addresses, self._unlisted_peers
        for msg in messages:
            known = src in members or src in unlisted
            if msg.src != src or msg.dst != me or not known or src in self._removed_ids:
                self._reject(now, "peer_message_refused", peer=src, message=type(msg).__name__)
                continue
            heard_before = self._peer_heard.get(src, self._leading_since)
            self._peer_heard[src] = now.mono
            self._links_down.discard(src)
            if src in self._peers_silent:
                self._peers_silent.discard(src)
                silent_for = now.mono - max(heard_before, self._leading_since)
                self._log("info", "peer_regained", peer=src, silent_ms=int(silent_for * 1000))
            if type(msg) is AppendEntriesResponse and not msg.reject:
                self._acknowledged(src, msg.index, now)
            raft.step(msg)
        if pump:
            self._pump(now)

    def _acknowledged(self, peer: NodeId, index: int, now: Instant) -> None:
        sent = self._append_sent.get(peer)
        if not sent:
            return
        done = [i for i in sent if i <= index]
        if done:
            rtt = self.stats.rtt(peer)
            for i in done:
                rtt.observe(now.mono - sent.pop(i))

    def _watch_peers(self, now: Instant) -> None:
        """The leader says when a member has not answered for an election timeout."""
        if self._role is not Role.LEADER:
            if self._peers_silent:
                self._peers_silent.clear()
            return
        limit = self._timing.election_timeout_s
        for member in (*self.raft.voters, *self.raft.learners):
            if member == self.config.node_id or member in self._peers_silent:
                continue
            heard = self._peer_heard.get(member, self._leading_since)
            silent_for = now.mono - max(heard, self._leading_since)
            if silent_for > limit:
                self._peers_silent.add(member)
                self._append_sent.pop(member, None)
                self._log(
                    "warning",
                    "peer_silent",
                    peer=member,
                    address=self.address_of(member),
                    silent_ms=int(silent_for * 1000),
                )

    # ------------------------------------------------------------------ inputs: persistence

    def persisted(self, job: int, now: Instant, *, pump: bool = True) -> None:
        """Persist ``job`` is durable (jobs complete in the order they were handed out).

        ``pump=False`` leaves the work for a later ``pump`` (see ``client_frame``)."""
        for number, entry in self._jobs:
            if number == job:
                entry.done = True
                break
        self._finish_jobs(now)
        if pump:
            self._pump(now)

    def _finish_jobs(self, now: Instant) -> None:
        jobs = self._jobs
        while jobs and jobs[0][1].done:
            _, job = jobs.popleft()
            if job.ready.messages:
                self._send_messages(job.ready.messages, now)
            self.raft.advance(job.ready)

    # ------------------------------------------------------------------ the Ready loop

    def pump(self, now: Instant) -> None:
        """Hands out the work the inputs given with ``pump=False`` left in the Raft core."""
        self._pump(now)

    def _pump(self, now: Instant) -> None:
        raft = self.raft
        for _ in range(64):  # each turn hands out new work; a stuck core must not spin us
            if self._reads_queued and not self._leader_round_open():
                self._start_read_round(now)
            if not raft.has_ready():
                break
            self._handle_ready(raft.ready(), now)
        if self._rounds:
            self._serve_ready_rounds(now)

    def _handle_ready(self, rd: Ready, now: Instant) -> None:
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state.role, rd.soft_state.leader, rd.soft_state.term, now)
        if rd.messages_now:
            self._send_messages(rd.messages_now, now)
        persisting = bool(rd.entries) or rd.snapshot is not None or rd.hard_state is not None
        job = _Job(rd, persisting, done=not persisting)
        number = self._next_job
        self._next_job += 1
        self._jobs.append((number, job))
        if persisting:
            self.stats.persist_jobs += 1
            self.stats.entries_persisted += len(rd.entries)
            self._emit(Persist(number, rd.snapshot, rd.entries, rd.hard_state))
        if rd.snapshot is not None:
            self._install_snapshot(rd.snapshot, now)
        if rd.entries:
            self._note_conf_entries(rd.entries)
        if rd.committed:
            self._apply(rd.committed, now)
        for rs in rd.read_states:
            read_round = self._rounds.get(rs.ctx)
            if read_round is not None:
                read_round.index = rs.index
        self._finish_jobs(now)

    def _send_messages(self, messages: Iterable[Message], now: Instant) -> None:
        by_peer: dict[NodeId, list[Message]] = {}
        for msg in messages:
            by_peer.setdefault(msg.dst, []).append(msg)
            if type(msg) is AppendEntries and msg.entries:
                # For the append round-trip figure: when each batch left.
                sent = self._append_sent.setdefault(msg.dst, {})
                if len(sent) < 256:
                    sent.setdefault(msg.entries[-1].index, now.mono)
        for peer, batch in by_peer.items():
            self._emit(SendMessages(peer, tuple(batch)))

    def _on_soft_state(self, role: Role, leader: NodeId | None, term: int, now: Instant) -> None:
        was_leader = self._role is Role.LEADER
        changed_leader = leader != self._leader or term != self._term
        unlisted = {leader, self._leader} & self._unlisted_peers.keys()
        self._role, self._leader, self._term = role, leader, term
        if changed_leader:
            self.stats.leader_changes += 1
            if unlisted:
                self._emit(PeersChanged(self._peer_map()))
            self._log("info", "leader_changed", role=_role_name(role), leader=leader, term=term)
        elif (role is Role.LEADER) != was_leader:
            self._log("info", "role_changed", role=_role_name(role), leader=leader, term=term)
        if role is Role.LEADER and not was_leader:
            self._leading_since = now.mono
            self.tracker.take_office(now.mono, self.locks.leases())
            self._version_proposed_at = -1.0e9
        elif was_leader and role is not Role.LEADER:
            self.tracker.leave_office()
            self._fail_proposals()
            for ctx in [c for c, r in self._rounds.items() if r.as_leader]:
                self._fail_reads(self._rounds.pop(ctx).reads, ErrorCode.NOT_LEADER)

    # ------------------------------------------------------------------ applying

    def _install_snapshot(self, snap: Snapshot, now: Instant) -> None:
        self._restore_image(snap.data)
        self._snapshot_index = snap.meta.index
        self._log("info", "snapshot_installed", index=snap.meta.index, term=snap.meta.term)
        self._emit(PeersChanged(self._peer_map()))
        # Grants that happened inside the snapshot never passed through apply here.
        for (lease, key), conns in list(self._waiters.items()):
            state = self.locks.get(key)
            for holder in state.holders if state is not None else ():
                if holder.lease == lease:
                    self._push_grant(lease, key, holder.token)
                    break
            else:
                if self.locks.lease_terms(lease) is None:
                    self._drop_waiter(lease, key, conns)
        if self.tracker.leading:
            self.tracker.take_office(now.mono, self.locks.leases())
        # Holds and waits that ended inside the snapshot never pass through apply: forget
        # when they began, or these maps would keep them for good.
        for pair in [p for p in self._granted_mono if not self._holds(*p)]:
            del self._granted_mono[pair]
        for pair in [p for p in self._queued_mono if not self._waits(*p)]:
            del self._queued_mono[pair]

    def _holds(self, lease: str, key: str) -> bool:
        return self.locks.holds(lease, key)

    def _waits(self, lease: str, key: str) -> bool:
        return self.locks.waits(lease, key)

    def _restore_image(self, data: bytes) -> None:
        """Rebuild the applied state from a snapshot image of either layout."""
        try:
            item = cbor2.loads(data)
        except Exception as exc:
            raise ValueError(f"snapshot image is corrupt: {exc!r}") from None
        if isinstance(item, dict) and item.get("format") == NODE_IMAGE_FORMAT:
            lock_image = item.get("locks")
            members = item.get("members")
            if not isinstance(lock_image, bytes) or not isinstance(members, dict):
                raise ValueError("snapshot image has an unknown layout")
            self.locks = self.lock_machine_class.restore(lock_image)
            self._addresses = {str(k): str(v) for k, v in members.items()}
            self._add_configured_addresses()
            removed = item.get("removed", [])
            self._removed_ids = {str(r) for r in removed} if isinstance(removed, list) else set()
        else:
            self.locks = self.lock_machine_class.restore(data)

    def _image(self) -> bytes:
        lock_image = self.locks.snapshot()
        if self.locks.version < 2:
            return lock_image  # what a member of the previous release restores
        # Only replicated facts, so every member's image at this index is the same bytes: the
        # members of the configuration in force here, with the addresses their entries gave.
        conf = self.raft.conf_state_at(self.locks.applied_index)
        members = {
            m: self._addresses[m]
            for m in sorted((*conf.voters, *conf.learners))
            if m in self._addresses
        }
        return bytes(
            cbor2.dumps(
                {
                    "format": NODE_IMAGE_FORMAT,
                    "locks": lock_image,
                    "members": members,
                    "removed": sorted(self._removed_ids),
                },
                canonical=True,
            )
        )

    def _note_conf_entries(self, entries: Iterable[Entry]) -> None:
        """Membership entries carry the new member's address; keep it from the moment the
        entry is in our log, since the configuration takes effect then."""
        changed = False
        for entry in entries:
            if entry.kind is not EntryKind.CONF_CHANGE:
                continue
            changed = True
            change = _conf_change(entry)
            if change is not None and change.kind is ConfChangeKind.ADD_LEARNER:
                address = _address_of(change)
                if address is not None:
                    self._addresses[change.node] = address
        if changed:
            self._emit(PeersChanged(self._peer_map()))

    def _applied_conf_change(self, entry: Entry, now: Instant) -> None:
        """A membership change committed: say so, answer whoever asked, stop if it was us."""
        change = _conf_change(entry)
        proposal = self._member_proposals.pop(entry.index, None)
        if proposal is not None and proposal[2] != change:
            # Another leader's entry took the index: ours was lost, and the client re-sends.
            self._reply_not_leader(proposal[0], proposal[1])
            proposal = None
        if change is not None:
            if change.kind is ConfChangeKind.REMOVE:
                self._removed_ids.add(change.node)
            elif change.kind is ConfChangeKind.ADD_LEARNER:
                address = _address_of(change)
                if address is not None:
                    self._addresses[change.node] = address
            event = {
                ConfChangeKind.ADD_LEARNER: "member_added",
                ConfChangeKind.PROMOTE: "member_promoted",
                ConfChangeKind.REMOVE: "member_removed",
            }[change.kind]
            self._log(
                "info",
                event,
                member=change.node,
                address=self._addresses.get(change.node),
                index=entry.index,
            )
        self._emit(PeersChanged(self._peer_map()))
        if proposal is not None:
            conn, req, _ = proposal
            self._answer_request(conn, req.TYPE, self.members_view(now).frame(req.id))
        if self.raft.removed and not self._stopped:
            self._stopped = True
            self._emit(
                Stop(
                    f"this member {REMOVED}; to bring it back, remove its data directory "
                    "and start it with --join and a new --id",
                    0,
                )
            )

    def _apply(self, committed: Iterable[Entry], now: Instant) -> None:
        try:
            self._apply_entries(committed, now)
        finally:
            self._replaying = False
        if self.locks.applied_index - self._snapshot_index >= self.config.snapshot_every:
            self._take_snapshot()

    def _apply_entries(self, committed: Iterable[Entry], now: Instant) -> None:
        machine = self.locks
        proposals = self._proposals
        for entry in committed:
            index = entry.index
            if index <= machine.applied_index:
                continue  # already in the image we restored from
            self._replaying = index <= self._replay_until
            if entry.kind is not EntryKind.NORMAL:
                machine.skip(index)
                proposal = proposals.pop(index, None)
                if proposal is not None:
                    self._reply_not_leader(proposal.conn, proposal.request)
                if entry.kind is EntryKind.CONF_CHANGE:
                    self._applied_conf_change(entry, now)
                continue
            if self._member_proposals:
                lost = self._member_proposals.pop(index, None)
                if lost is not None:
                    self._reply_not_leader(lost[0], lost[1])
            proposal = proposals.pop(index, None)
            held_before = machine.counts().locks
            if proposal is not None and proposal.data == entry.data:
                outcome = machine.apply_command(index, proposal.command)
            else:
                outcome = machine.apply(index, entry.data)
                if proposal is not None:
                    self._reply_not_leader(proposal.conn, proposal.request)
                    proposal = None
            if outcome.command is not None:
                self._entry_stamp_ms = outcome.command.at_ms
            # Holds this entry ended; 0 for a re-sent request answered from memory.
            dropped = held_before - machine.counts().locks + len(outcome.promotions)
            self._after_apply(outcome, proposal, dropped, now)

    def _after_apply(
        self, outcome: locks.ApplyOutcome, proposal: _Proposal | None, dropped: int, now: Instant
    ) -> None:
        tracker = self.tracker
        for lease, ttl_ms, incarnation in outcome.armed:
            tracker.arm(lease, ttl_ms, incarnation, now.mono)
        if proposal is not None and outcome.result is not None:
            self._answer(proposal, outcome.result, now)
        for promotion in outcome.promotions:
            self.stats.grants += 1
            self._audit_grant(promotion.lease, promotion.key, promotion.token, now, queued=True)
            self._push_grant(promotion.lease, promotion.key, promotion.token)
        for lease in outcome.ended:
            tracker.ended(lease)
            self._forget_lease_waiters(lease)
        cmd = outcome.command
        result = outcome.result
        if isinstance(cmd, locks.ExpireCommand) and isinstance(result, locks.LeaseClosed):
            self.stats.expiries += 1
            self.stats.locks_lost += len(result.released)
            self._log(
                "info",
                "lease_expired",
                lease=cmd.lease,
                index=outcome.index,
                released=list(result.released),
            )
            self._audit_released(result.released, cmd.lease, "expired", outcome.index, now)
        elif isinstance(cmd, locks.ClusterVersionCommand):
            self._log("info", "cluster_version", version=self.locks.version, index=outcome.index)
            self._emit(PeersChanged(self._peer_map()))
        elif isinstance(result, locks.Granted) and result.token == outcome.index:
            self.stats.grants += 1
            self._audit_grant(result.lease, result.key, result.token, now, queued=False)
        # A re-sent request answered from memory repeats the result of the first one; the
        # events below are counted and logged when they happen, not when they are recalled.
        elif isinstance(result, locks.Released) and result.held and dropped > 0:
            lease = cmd.lease if cmd else ""
            self._audit_released((result.key,), lease, "released", outcome.index, now)
        elif (
            isinstance(result, locks.LeaseClosed)
            and isinstance(cmd, locks.CloseLeaseCommand)
            and cmd.lease in outcome.ended
        ):
            self._log(
                "info",
                "lease_closed",
                lease=cmd.lease,
                index=outcome.index,
                released=list(result.released),
            )
            self._audit_released(result.released, cmd.lease, "closed", outcome.index, now)
        elif isinstance(result, locks.LeaseOpened) and not result.joined and outcome.armed:
            self._log(
                "info",
                "lease_opened",
                lease=result.lease,
                ttl_ms=result.ttl_ms,
                index=outcome.index,
            )

    def _audit_grant(self, lease: str, key: str, token: int, now: Instant, *, queued: bool) -> None:
        state = self.locks.get(key)
        meta: dict[str, str] = {}
        for holder in state.holders if state is not None else ():
            if holder.lease == lease:
                meta = dict(holder.meta)
        self._granted_mono[(lease, key)] = now.mono
        queued_at = self._queued_mono.pop((lease, key), None)
        if queued_at is not None:
            self.stats.acquire_wait.observe(now.mono - queued_at)
        self._log("info", "lock_granted", key=key, token=token, lease=lease, owner=meta)

    def _audit_released(
        self, keys: Iterable[str], lease: str, how: str, index: int, now: Instant
    ) -> None:
        for key in keys:
            self.stats.released(how)
            granted = self._granted_mono.pop((lease, key), None)
            if granted is not None:
                self.stats.hold_time.observe(now.mono - granted)
            self._log("info", "lock_released", key=key, lease=lease, how=how, index=index)

    def _take_snapshot(self) -> None:
        index = self.locks.applied_index
        data = self._image()
        conf = self.raft.conf_state_at(index)
        keep_from = index - self.config.snapshot_keep
        self._emit(SaveSnapshot(index, conf, data, max(0, keep_from)))
        self._snapshot_index = index
        self.stats.snapshots_taken += 1
        self._log("info", "snapshot_taken", index=index, bytes=len(data))

    # ------------------------------------------------------------------ clients

    def client_connected(self, conn: int, remote: str) -> None:
        self._conns[conn] = _Conn(conn, remote)

    def client_closed(self, conn: int) -> None:
        state = self._conns.pop(conn, None)
        if state is None:
            return
        for pair in state.waiting:
            conns = self._waiters.get(pair)
            if conns is not None and conn in conns:
                conns.remove(conn)
                if not conns:
                    del self._waiters[pair]

    def client_frame(self, conn: int, obj: Any, now: Instant, *, pump: bool = True) -> None:
        """One decoded frame from a client connection.

        ``pump=False`` proposes without handing the work out yet: a runtime that
        feeds every frame that arrived at once this way, then calls ``pump``,
        gets one Ready for all of them (one append per follower, one fsync)."""
        state = self._conns.get(conn)
        if state is None:
            return
        if isinstance(obj, BadFrame):
            self._bad_request(state, "invalid", None, obj.code, obj.message, now=now)
            return
        try:
            req = decode_request(obj)
        except ProtocolError as exc:
            rid = obj.get("id") if isinstance(obj, dict) else None
            if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < 2**63:
                rid = None
            self._bad_request(state, "invalid", rid, exc.code, str(exc), now=now)
            return
        self._handle_request(state, req, now)
        if pump:
            self._pump(now)

    def _bad_request(
        self,
        state: _Conn,
        kind: str,
        rid: int | None,
        code: ErrorCode,
        message: str,
        *,
        now: Instant,
    ) -> None:
        state.bad_requests += 1
        self._reject(now, "client_bad_request", remote=state.remote, error=message)
        self._answer_request(state.conn, kind, error(rid, code, message))
        if state.bad_requests > MAX_BAD_REQUESTS:
            self._emit(CloseConnection(state.conn, "too many bad requests"))

    def _reject(self, now: Instant, event: str, **fields: Any) -> None:
        """A log line about refused input, at most one per REJECT_LOG_EVERY (the rest counted)."""
        self.stats.rejected_frames += 1
        if now.mono - self._reject_log_at < REJECT_LOG_EVERY:
            self._rejects_unlogged += 1
            return
        if self._rejects_unlogged:
            fields["also_refused"] = self._rejects_unlogged
        self._rejects_unlogged = 0
        self._reject_log_at = now.mono
        self._log("warning", event, **fields)

    def _handle_request(self, state: _Conn, req: ClientRequest, now: Instant) -> None:
        conn = state.conn
        if self._stopping:
            self._answer_request(
                conn, req.TYPE, error(req.id, ErrorCode.SHUTTING_DOWN, "member is shutting down")
            )
            return
        if isinstance(req, Ping):
            self._answer_request(conn, req.TYPE, ok(req.id))
        elif isinstance(req, OpenLease | CloseLease | UpdateLease | Acquire | Release):
            self._propose_change(state, req, now)
        elif isinstance(req, MemberChange):
            self._member_change(state, req, now)
        elif isinstance(req, Get | ListLocks | ListLeases | Status) and req.stale:
            self._serve_read(_Read(conn, req, now.mono), now)
        elif self._role is not Role.LEADER and not isinstance(req, Status):
            # Keep-alives and lock reads go to the leader: it confirms the read point
            # itself, and only it knows how much of each lease's TTL is left. A member's
            # own status is linearizable from any member: the read point comes from the
            # leader (ReadIndex), and the member answers once it has applied up to it.
            self._reply_not_leader(conn, req)
        else:
            self._reads_queued.append(_Read(conn, req, now.mono))

    # -- proposals ----------------------------------------------------------

    def _propose_change(self, state: _Conn, req: LockChange, now: Instant) -> None:
        conn = state.conn
        if self._role is not Role.LEADER:
            self._reply_not_leader(conn, req)
            return
        try:
            cmd = self._command_for(req, now)
        except _Refusal as refusal:
            frame = error(req.id, refusal.code, refusal.message, **refusal.extra)
            self._answer_request(conn, req.TYPE, frame)
            return
        problem = locks.validate_command(cmd)
        if problem is not None:
            self._bad_request(state, req.TYPE, req.id, ErrorCode.BAD_REQUEST, problem, now=now)
            return
        data = locks.encode_command(cmd)
        result = self.raft.propose(data)
        if isinstance(result, NotLeader):
            self._reply_not_leader(conn, req, result.leader)
            return
        self.stats.proposals += 1
        self._proposals[result] = _Proposal(conn, req, data, cmd, now.mono, now.wall_ms)

    def _command_for(self, req: LockChange, now: Instant) -> locks.ClientCommand:
        """The log command for ``req``, in the form the cluster's version runs."""
        v2 = self.locks.version >= 2
        if v2 and req.client:
            origin = locks.Origin(req.client, req.seq, req.acked)
        else:
            origin = locks.Origin(locks.LEGACY_CLIENT, req.seq)
        at_ms = now.wall_ms
        quotas = self.config.quotas
        if isinstance(req, OpenLease):
            if self._doomed(req.lease):
                raise _Refusal(
                    ErrorCode.SESSION_EXPIRED,
                    f"lease {req.lease!r} is being expired: open a new lease",
                    ended=locks.LEASE_EXPIRED,
                )
            if self.locks.lease_terms(req.lease) is None:
                if self.locks.counts().sessions >= quotas.max_leases:
                    raise _quota(f"this cluster holds {quotas.max_leases} leases", "max_leases")
                _check_meta_quota(req.meta, quotas)
            return locks.OpenLeaseCommand(
                lease=req.lease,
                ttl_ms=req.ttl_ms,
                origin=origin,
                at_ms=at_ms,
                ephemeral=req.ephemeral and v2,
                meta=req.meta if v2 else {},
            )
        if isinstance(req, CloseLease):
            return locks.CloseLeaseCommand(req.lease, origin, at_ms)
        if isinstance(req, Acquire):
            # A re-sent or re-entrant acquire of a key the lease already holds or waits
            # for adds nothing, and must get its grant (or place) back, not a refusal.
            adds = not (
                self.locks.holds(req.lease, req.key) or self.locks.waits(req.lease, req.key)
            )
            counts = self.locks.counts()
            if adds and counts.locks + counts.waiters >= quotas.max_locks:
                raise _quota(
                    f"this cluster holds {quotas.max_locks} locks and waiters", "max_locks"
                )
            _check_meta_quota(req.meta, quotas)
            return locks.AcquireCommand(
                req.lease, req.key, req.wait, req.limit, req.meta, origin, at_ms
            )
        if isinstance(req, Release):
            if not v2 and req.token is not None:
                raise _upgrading("release with a fencing token")
            return locks.ReleaseCommand(
                req.lease, req.key, req.token, req.keep_lease or not v2, origin, at_ms
            )
        if not v2:
            raise _upgrading("lease_update")
        return locks.UpdateLeaseCommand(req.lease, req.ttl_ms, req.finished, origin, at_ms)

    def _member_change(self, state: _Conn, req: MemberChange, now: Instant) -> None:
        conn = state.conn
        if self._role is not Role.LEADER:
            self._reply_not_leader(conn, req)
            return
        try:
            change = self._conf_change_for(req, now)
        except _Refusal as refusal:
            frame = error(req.id, refusal.code, refusal.message, **refusal.extra)
            self._answer_request(conn, req.TYPE, frame)
            return
        if change is None:  # the leader removes itself: it hands over first
            self._reply_not_leader(conn, req, self.raft.lead_transferee)
            return
        result = self.raft.propose_conf_change(change)
        if isinstance(result, NotLeader):
            self._reply_not_leader(conn, req, result.leader)
        elif isinstance(result, ConfChangeRefused):
            self._answer_request(conn, req.TYPE, _conf_change_refusal(req.id, result.reason))
        else:
            if isinstance(req, MemberAdd):
                # Known from now on, as the entry is in our log: the change counts it already.
                self._addresses[req.member] = req.address
            self._member_proposals[result] = (conn, req, change)
            self._emit(PeersChanged(self._peer_map()))
            self._log("info", "member_change_proposed", change=change.kind.name, member=change.node)

    def _conf_change_for(self, req: MemberChange, now: Instant) -> ConfChange | None:
        """The change ``req`` asks for; None when the leader must first hand over (it is the
        one to go); _Refusal with the reason it may not be made."""
        if self.locks.version < 2:
            raise _upgrading("a membership change")
        raft = self.raft
        voters, learners = set(raft.voters), set(raft.learners)
        member = req.member
        if isinstance(req, MemberAdd):
            if member in voters or member in learners:
                raise _Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"{member} is already a member: pick an id not in use "
                    "(dlm members list shows them)",
                )
            if member in self._removed_ids:
                raise _Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"{member} was a member and was removed: ids are not reused, pick another",
                )
            wanted = parse_addr(req.address)
            for other in voters | learners:
                address = self._addresses.get(other)
                if address is not None and parse_addr(address) == wanted:
                    raise _Refusal(
                        ErrorCode.BAD_REQUEST,
                        f"{req.address} is already {other}'s address: give the new member "
                        "an address of its own",
                    )
            return ConfChange(ConfChangeKind.ADD_LEARNER, member, req.address.encode())
        if isinstance(req, MemberPromote):
            if member not in learners:
                what = (
                    "already a voter: nothing to promote"
                    if member in voters
                    else "not a member: add it first, as a learner"
                )
                raise _Refusal(ErrorCode.BAD_REQUEST, f"{member} is {what}")
            return ConfChange(ConfChangeKind.PROMOTE, member)
        assert isinstance(req, MemberRemove)
        if member not in voters and member not in learners:
            raise _Refusal(
                ErrorCode.BAD_REQUEST,
                f"{member} is not a member: nothing to remove (dlm members list shows them)",
            )
        if member in voters:
            if len(voters) == 1:
                raise _Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"{member} is the last voter, and a cluster needs one: add another "
                    "member first",
                )
            if not req.force:
                self._check_quorum_after_removing(member, now)
        if member == self.config.node_id:
            best = self._best_successor()
            if best is None:
                raise _Refusal(
                    ErrorCode.UNAVAILABLE,
                    "the leader cannot hand over: no other voter is caught up; retry shortly",
                    retry_after_ms=500,
                )
            self._log("info", "transfer_leadership", to=best, reason="leader removal")
            raft.transfer_leadership(best)
            return None
        return ConfChange(ConfChangeKind.REMOVE, member)

    def _check_quorum_after_removing(self, member: NodeId, now: Instant) -> None:
        remaining = [v for v in self.raft.voters if v != member]
        reachable = [v for v in remaining if self._answers(v, now)]
        if len(reachable) < len(remaining) // 2 + 1:
            down = sorted(set(remaining) - set(reachable))
            raise _Refusal(
                ErrorCode.UNSAFE,
                f"removing {member} would leave {len(remaining)} voters of which only "
                f"{len(reachable)} answer ({', '.join(down)} do not): no quorum. Bring them "
                "back first, or insist with --force",
            )

    def _best_successor(self) -> NodeId | None:
        status = self.raft.status()
        best, best_match = None, -1
        for peer, pr in status.progress.items():
            if (
                peer != self.config.node_id
                and peer in self.raft.voters
                and pr.recent_active
                and pr.match > best_match
            ):
                best, best_match = peer, pr.match
        return best

    def _promote_caught_up_learners(self) -> None:
        """Leader: a learner within PROMOTE_LAG entries of the log becomes a voter."""
        if not self.config.auto_promote or self.locks.version < 2:
            return
        raft = self.raft
        if not raft.learners:
            return
        status = raft.status()
        for learner in raft.learners:
            pr = status.progress.get(learner)
            if pr is None or not pr.recent_active or status.last_index - pr.match > PROMOTE_LAG:
                continue
            result = raft.propose_conf_change(ConfChange(ConfChangeKind.PROMOTE, learner))
            if isinstance(result, int):
                self._log("info", "member_change_proposed", change="PROMOTE", member=learner)
            return  # one change at a time

    # -- answering ------------------------------------------------------------

    def _answer(self, proposal: _Proposal, result: locks.Result, now: Instant) -> None:
        conn, req = proposal.conn, proposal.request
        if isinstance(result, locks.Queued):
            assert isinstance(req, Acquire)
            self._register_waiter(conn, req.lease, result.key)
            self._queued_mono.setdefault((req.lease, result.key), now.mono)
        doomed = (
            isinstance(result, locks.LeaseOpened) and result.joined and self._doomed(result.lease)
        )
        self._answer_request(conn, req.TYPE, self._replies(now).answer(req, result, doomed=doomed))

    def _replies(self, now: Instant) -> Replies:
        """What this member answers at ``now`` (dlm/node/replies.py)."""
        return Replies(self.locks, self.tracker, now.mono, now.wall_ms)

    def _reply_not_leader(
        self, conn: int, req: ClientRequest, leader: NodeId | None = None
    ) -> None:
        if leader is None and self._leader != self.config.node_id:
            leader = self._leader
        extra: dict[str, Any] = {}
        if leader is None:
            # No one to send the client to: name the voters, so a client that finds too
            # few of them answering can say which, instead of waiting out its timeout.
            extra["voters"] = {
                voter: address
                for voter in self.raft.voters
                if (address := self.address_of(voter)) is not None
            }
        self._answer_request(
            conn,
            req.TYPE,
            error(
                req.id,
                ErrorCode.NOT_LEADER,
                "not the leader" if leader is None else f"not the leader; try {leader}",
                leader=leader,
                leader_address=self.address_of(leader),
                **extra,
            ),
        )

    def _fail_proposals(self) -> None:
        proposals, self._proposals = self._proposals, {}
        for proposal in proposals.values():
            self._reply_not_leader(proposal.conn, proposal.request)
        changes, self._member_proposals = self._member_proposals, {}
        for conn, req, _ in changes.values():
            self._reply_not_leader(conn, req)

    def _fail_reads(self, reads: Iterable[_Read], code: ErrorCode) -> None:
        for read in reads:
            kind = read.request.TYPE
            if code is ErrorCode.NOT_LEADER:
                self._reply_not_leader(read.conn, read.request)
            elif code is ErrorCode.NO_QUORUM:
                self._answer_request(
                    read.conn,
                    kind,
                    error(
                        read.request.id,
                        code,
                        "the leader cannot reach a majority",
                        retry_after_ms=500,
                    ),
                )
            else:
                self._answer_request(
                    read.conn, kind, error(read.request.id, code, "read was not confirmed in time")
                )

    # -- waiters and pushes -------------------------------------------------

    def _register_waiter(self, conn: int, lease: str, key: str) -> None:
        state = self._conns.get(conn)
        if state is None:
            return
        conns = self._waiters.setdefault((lease, key), [])
        if conn not in conns:
            conns.append(conn)
        state.waiting.add((lease, key))

    def _push_grant(self, lease: str, key: str, token: int) -> None:
        conns = self._waiters.pop((lease, key), None)
        if not conns:
            return
        frame = grant_push(lease, key, token)
        for conn in conns:
            state = self._conns.get(conn)
            if state is not None:
                state.waiting.discard((lease, key))
                self._reply(conn, frame)

    def _drop_waiter(self, lease: str, key: str, conns: list[int]) -> None:
        self._waiters.pop((lease, key), None)
        for conn in conns:
            state = self._conns.get(conn)
            if state is not None:
                state.waiting.discard((lease, key))

    def _forget_lease_waiters(self, lease: str) -> None:
        for pair in [p for p in self._queued_mono if p[0] == lease]:
            del self._queued_mono[pair]
        if not self._waiters:
            return
        for pair in [p for p in self._waiters if p[0] == lease]:
            self._drop_waiter(*pair, self._waiters[pair])

    # -- reads ----------------------------------------------------------------

    def _leader_round_open(self) -> bool:
        """A round we started as leader is still waiting for its quorum.

        Reads and keep-alives that arrive meanwhile wait for the next round, which
        starts as soon as this one is confirmed: so one heartbeat round confirms
        every read that arrived before it started (and none that came later),
        and a leader under 2,000 keep-alives a second sends a round per round
        trip rather than one per keep-alive. A follower forwards each round to
        the leader at once: its reads are few, and a forwarded request that is
        lost produces no answer, which must not hold up the reads behind it.
        """
        if self._role is not Role.LEADER:
            return False
        return any(r.as_leader and r.index < 0 for r in self._rounds.values())

    def _start_read_round(self, now: Instant) -> None:
        reads, self._reads_queued = self._reads_queued, []
        self._round_seq += 1
        ctx = self._round_prefix + self._round_seq.to_bytes(8, "big")
        result = self.raft.read_index(ctx)
        if isinstance(result, NotLeader):
            for read in reads:
                self._reply_not_leader(read.conn, read.request, result.leader)
            return
        self._rounds[ctx] = _ReadRound(reads, now.mono, as_leader=self._role is Role.LEADER)

    def _serve_ready_rounds(self, now: Instant) -> None:
        applied = self.locks.applied_index
        done = [ctx for ctx, r in self._rounds.items() if 0 <= r.index <= applied]
        for ctx in done:
            for read in self._rounds.pop(ctx).reads:
                self._serve_read(read, now)

    def _serve_read(self, read: _Read, now: Instant) -> None:
        conn, req = read.conn, read.request
        if isinstance(req, Renew):
            self._serve_keepalive(read, req)
        elif isinstance(req, Get):
            self._answer_request(conn, req.TYPE, self._replies(now).lock(req).frame(req.id))
        elif isinstance(req, ListLocks):
            self._answer_request(conn, req.TYPE, self._replies(now).locks_page(req).frame(req.id))
        elif isinstance(req, LeaseInfo):
            self._answer_request(conn, req.TYPE, self._replies(now).lease_info(req))
        elif isinstance(req, ListLeases):
            self._answer_request(conn, req.TYPE, self._replies(now).leases_page(req).frame(req.id))
        elif isinstance(req, Status):
            self._answer_request(conn, req.TYPE, self.status_view(now).frame(req.id))
        elif isinstance(req, Members):
            self._answer_request(conn, req.TYPE, self.members_view(now).frame(req.id))

    def _doomed(self, lease: str) -> bool:
        """The leader proposed an Expire for ``lease``: no client may count on it any more.

        (A seam: the simulator's bug-injection tests switch it off.)
        """
        return self.tracker.is_expiring(lease)

    def _serve_keepalive(self, read: _Read, req: Renew) -> None:
        if self._role is not Role.LEADER:
            self._reply_not_leader(read.conn, req)
            return
        info = self.locks.lease_terms(req.lease)
        stale = info is not None and req.incarnation not in (0, info.incarnation)
        if info is None or stale or self._doomed(req.lease):
            if self._doomed(req.lease):
                ended = locks.LEASE_EXPIRED
            elif info is None:
                ended = self.locks.lease_ending(req.lease)
            else:
                ended = ""  # a later lease reuses the id: how the renewed one ended is lost
            self._answer_request(read.conn, req.TYPE, lease_gone(req.id, req.lease, ended))
            return
        if not self.tracker.renew(req.lease, read.received, req.client, req.seq):
            # Not tracked (a lease applied before we took office is always tracked, so this
            # is a race with its opening): start its clock now.
            self.tracker.arm(req.lease, info.ttl_ms, info.incarnation, read.received)
        reply = LeaseTerms(lease=req.lease, ttl_ms=info.ttl_ms)
        self._answer_request(read.conn, req.TYPE, reply.frame(req.id))

    def status_view(self, now: Instant) -> StatusView:
        return replies.status_view(
            self.raft.status(),
            learners=self.raft.learners,
            counts=self.locks.counts(),
            applied=self.locks.applied_index,
            cluster=self.config.cluster,
            version=self.config.max_version,
            cluster_version=self.locks.version,
            address_of=self.address_of,
            last_contact_ms=lambda member: self._last_contact_ms(member, now),
        )

    def members_view(self, now: Instant) -> MembersView:
        return replies.members_view(
            self.raft.status(),
            learners=self.raft.learners,
            bootstrap=dict(self.config.peers),
            address_of=self.address_of,
            answers=lambda member: self._answers(member, now),
            last_contact_ms=lambda member: self._last_contact_ms(member, now),
        )

    def _answers(self, member: NodeId, now: Instant) -> bool:
        """Whether ``member`` is this one, or was heard from within the longest election
        timeout and its link has not dropped since.

        Not the core's ``recent_active``: the leader clears that at every check-quorum
        round, so a live member would look silent until it next answers. The link matters
        because this decides whether a removal is safe: a member killed a moment ago must
        not count, and its connection tells at once.
        """
        if member == self.config.node_id:
            return True
        if member in self._links_down:
            return False
        heard = self._peer_heard.get(member)
        return heard is not None and now.mono - heard <= 2 * self._timing.election_timeout_s

    def _last_contact_ms(self, member: NodeId, now: Instant) -> int | None:
        if member == self.config.node_id:
            return 0
        heard = self._peer_heard.get(member)
        return None if heard is None else max(0, int((now.mono - heard) * 1000))

    # ------------------------------------------------------------------ stopping

    def begin_shutdown(self, now: Instant) -> None:
        """Refuse new requests; a leader hands leadership to its most caught-up voter."""
        if self._stopping:
            return
        self._stopping = True
        self._log("info", "shutting_down", pending=len(self._proposals), reads=len(self._rounds))
        if self._role is Role.LEADER and len(self.raft.voters) > 1:
            status = self.raft.status()
            best, best_match = None, -1
            for peer, pr in status.progress.items():
                if (
                    peer != self.config.node_id
                    and peer in self.raft.voters
                    and pr.recent_active
                    and pr.match > best_match
                ):
                    best, best_match = peer, pr.match
            if best is not None:
                self._log("info", "transfer_leadership", to=best)
                self.raft.transfer_leadership(best)
        self._pump(now)

    def finish_shutdown(self) -> None:
        """Answer whatever is still pending: the member stops now."""
        proposals, self._proposals = self._proposals, {}
        for proposal in proposals.values():
            self._answer_request(
                proposal.conn,
                proposal.request.TYPE,
                error(proposal.request.id, ErrorCode.SHUTTING_DOWN, "member is shutting down"),
            )
        for read_round in self._rounds.values():
            for read in read_round.reads:
                self._answer_request(
                    read.conn,
                    read.request.TYPE,
                    error(read.request.id, ErrorCode.SHUTTING_DOWN, "member is shutting down"),
                )
        self._rounds.clear()


class _Refusal(Exception):
    """A request the leader refuses before proposing it."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


def _quota(what: str, limit: str) -> _Refusal:
    return _Refusal(
        ErrorCode.QUOTA_EXCEEDED,
        f"{what}, its limit (--{limit.replace('_', '-')}): release some, or raise the limit",
        limit=limit,
    )


def _upgrading(what: str) -> _Refusal:
    return _Refusal(
        ErrorCode.UNAVAILABLE,
        f"{what} needs every member on protocol version 2, and an upgrade is in progress: "
        "retry once every member runs this release",
        retry_after_ms=1000,
    )


def _check_meta_quota(meta: Mapping[str, str], quotas: Quotas) -> None:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in meta.items())
    if size > quotas.max_meta_bytes:
        raise _quota(f"owner metadata of {size} bytes is over", "max_meta_bytes")


def _conf_change_refusal(rid: int, reason: str) -> dict[str, Any]:
    """The answer to a membership change the Raft core refused, by the rule that refused it."""
    if "leader's term" in reason:
        # Elected a moment ago: its first entry commits within a round trip (the erratum's
        # rule), so this is a short wait for the client to ride out, not a conflict.
        return error(rid, ErrorCode.UNAVAILABLE, reason, retry_after_ms=50)
    if "not committed yet" in reason:
        return error(
            rid,
            ErrorCode.CONFLICT,
            f"{reason}: another membership change is in progress; retry in a moment",
        )
    return error(rid, ErrorCode.BAD_REQUEST, reason)


def _role_name(role: Role) -> str:
    return role.value


def _conf_change(entry: Entry) -> ConfChange | None:
    try:
        return decode_conf_change(entry.data)
    except ConfChangeDecodeError:
        return None


def _address_of(change: ConfChange) -> str | None:
    try:
        address = change.context.decode("utf-8")
        parse_addr(address)
    except (UnicodeDecodeError, ValueError):
        return None
    return address
