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

Rooms: the machine wires together pure rooms, each of one concern, that put their
actions in one shared outbox (outbox.py): the client connections and grant waiters
(clients.py), proposals (proposals.py), read rounds (read_rounds.py), membership and
the address book (membership.py), peer health (peer_health.py), persistence jobs
(persist_jobs.py), the audit trail of applied entries (audit.py) and snapshots
(snapshots.py). docs/ARCHITECTURE.md draws them.

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
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, ClassVar, cast

from dlm.compiled import mypyc_attr
from dlm.node import locks, permissions, replies
from dlm.node.audit import Audit
from dlm.node.clients import MAX_BAD_REQUESTS, ClientConn, Clients
from dlm.node.leases import LeaseTracker
from dlm.node.locks.identities import ADMIN, ROLE_ADMIN
from dlm.node.machine_config import PROTOCOL_SPOKEN, MachineConfig, Quotas, Timing
from dlm.node.membership import PROMOTE_LAG, REMOVED, Membership
from dlm.node.outbox import (
    Action,
    CloseConnection,
    Instant,
    LogEvent,
    Outbox,
    PeersChanged,
    Persist,
    SaveSnapshot,
    SendBackup,
    SendFrame,
    SendMessages,
    Stop,
)
from dlm.node.partition_guard import partition_refusal
from dlm.node.peer_health import PeerHealth
from dlm.node.persist_jobs import PersistJobs
from dlm.node.proposals import Proposal as _Proposal
from dlm.node.proposals import Proposals
from dlm.node.quotas import (
    IdentityLimits,
    LimitsFor,
    connection_refusal,
    limit_name,
    over_quota,
    with_settings,
)
from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.types import AppendEntriesResponse, Message, Ready, Role
from dlm.node.read_rounds import Read, ReadRounds, renew_confirmed
from dlm.node.replies import Replies, denied, lease_gone
from dlm.node.settings_reply import settings_reply
from dlm.node.snapshots import Snapshots, restore_image
from dlm.node.spans import SpanRecorder
from dlm.node.spread import SETTLE_ELECTION_TIMEOUTS, LeaderSpread, spread_tick
from dlm.node.stats import Stats
from dlm.node.watches import Watches
from dlm.records import Entry, EntryKind, LogStorage, NodeId, Snapshot
from dlm.views import MembersView, StatusView
from dlm.wire import (
    OTHER_INCARNATION,
    Acquire,
    AuthChange,
    AuthList,
    BadFrame,
    ClientRequest,
    ConfigGet,
    ErrorCode,
    Get,
    LeaseInfo,
    ListLeases,
    ListLocks,
    LockChange,
    MemberChange,
    Members,
    ProtocolError,
    Renew,
    Runs,
    SnapshotSave,
    Status,
    Watch,
    decode_request,
    error,
    ok,
)

EXIT_OLD_INCARNATION = 65
"""A member told (with proof) that the cluster was restored or recovered without it
exits with this code, as `dlm node start` does for another cluster's data directory."""

__all__ = [
    "MAX_BAD_REQUESTS",
    "PROMOTE_LAG",
    "PROTOCOL_SPOKEN",
    "REMOVED",
    "Action",
    "CloseConnection",
    "Instant",
    "LogEvent",
    "MachineConfig",
    "NodeMachine",
    "PeersChanged",
    "Persist",
    "Quotas",
    "SaveSnapshot",
    "SendBackup",
    "SendFrame",
    "SendMessages",
    "Stop",
    "Timing",
    "lease_gone",
]


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


# The simulator's variants and mutants are interpreted subclasses of the compiled class.
@mypyc_attr(allow_interpreted_subclasses=True)
class NodeMachine:
    """One member's decisions. Not thread-safe: one runtime task owns it.

    The machine wires the rooms together: it takes each event, hands the Raft core's
    Ready out (persistence jobs, messages, snapshots, applying), and routes requests
    and results to the room of their concern; the rooms put their actions in the
    shared outbox, in order.
    """

    # Seams for the simulator's instrumented and bug-injected variants.
    lock_machine_class: ClassVar[type[locks.LockStateMachine]] = locks.LockStateMachine
    raft_class: ClassVar[type[RaftNode]] = RaftNode
    tracker_class: ClassVar[type[LeaseTracker]] = LeaseTracker
    read_rounds_class: ClassVar[type[ReadRounds]] = ReadRounds
    watches_class: ClassVar[type[Watches]] = Watches
    check_permissions: ClassVar[bool] = True
    """A seam: the simulator's mutant switches the receiving member's permission check off."""

    def __init__(
        self,
        config: MachineConfig,
        storage: LogStorage,
        rng: random.Random,
        now: Instant,
    ) -> None:
        self.config = config
        self._timing = timing = config.timing
        self.stats = Stats()
        self.clients = Clients()
        self.out = Outbox(self.stats, self.clients.conns)
        self.out.answered = self.clients.answered
        self.membership = Membership(config, self.out, self._reply_not_leader)
        self.snapshots = Snapshots(self.out, config.snapshot_every, config.snapshot_keep)
        self.locks = self.lock_machine_class()
        snap = storage.snapshot()
        if snap is not None and snap.data:
            self.locks = restore_image(snap.data, self.lock_machine_class, self.membership)
            self.snapshots.index = snap.meta.index

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
        self.membership.from_log(storage, self.raft)
        self._replay_until = self.raft.last_index
        """Entries up to here were in the log when this member started: applying them again
        repeats events that happened before, which the audit trail marks ``replayed``."""
        self.tracker = self.tracker_class(expire_retry=timing.expire_retry_s)
        self._role = self.raft.role
        self._leader = self.raft.leader
        self._term = self.raft.term
        self._next_tick = now.mono + timing.tick_s

        self._member_connections = config.quotas.max_connections
        self.default_limits: IdentityLimits = config.quotas.identity_defaults()
        """Every identity's limits unless an admin set its own (dlm/node/quotas.py)."""
        self.anonymous_limits = config.quotas.identity_defaults(anonymous=True)
        """The limits of "" (no identity proved): the cluster's and the member's caps."""
        self.limits_for: LimitsFor = lambda identity: with_settings(
            self.anonymous_limits
            if identity in ("", ADMIN)
            or getattr(self.locks.identities.get(identity), "role", None) == ROLE_ADMIN
            else self.default_limits,
            self.locks.identities.limits_of(identity),
        )
        """The limits of an identity: an admin's settings in the replicated identity table
        over this member's defaults (quotas.py)."""
        self.proposals = Proposals(
            self.out,
            self.clients,
            self._reply_not_leader,
            config.quotas,
            # Through the attribute each time: whoever backs ``limits_for`` later is asked.
            lambda identity: self.limits_for(identity),  # noqa: PLW0108
        )
        # The prefix is unique per process incarnation: a late answer to a read round from
        # before a restart must not be taken for one of ours.
        round_prefix = config.node_id.encode() + b"/" + rng.getrandbits(32).to_bytes(4)
        self.reads = self.read_rounds_class(self.out, self._reply_not_leader, round_prefix)
        self.jobs = PersistJobs()
        self.health = PeerHealth(config.node_id, timing.election_timeout_s, now)
        self.audit = Audit(self.out)
        self.watches = self.watches_class(self.out, self.stats, self.locks.applied_index)
        """Pushed watches and the window of recent changes (watches.py)."""
        # The audit's own map: _answer starts the clock of a wait where the audit stops it.
        self._queued_mono = self.audit.queued_at
        self._stopping = False
        self._stopped = False
        self.spread = LeaderSpread(
            config.partition,
            config.partitions,
            settle_s=timing.election_timeout_s * SETTLE_ELECTION_TIMEOUTS,
        )
        """Which voter this partition's leader hands leadership to (spread.py)."""
        self.spans = SpanRecorder(
            self.out, config.node_id, config.partition if config.partitions > 1 else None
        )
        """The spans of traced requests, until each is answered (spans.py)."""
        self.membership.announce(self.raft)
        self.pump(now)

    # ------------------------------------------------------------------ outputs

    def take_actions(self) -> list[Action]:
        return self.out.take()

    def next_timer(self) -> float:
        """The monotonic time at which ``timer`` must be called next: the next tick, or
        sooner a round of keep-alives that waits out its gap (read_rounds.py)."""
        return min(self._next_tick, self.reads.deferred_until(self.raft, self._role is Role.LEADER))

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
        return not self.proposals.pending and not self.reads.rounds and not self.jobs

    def address_of(self, node: NodeId | None) -> str | None:
        return None if node is None else self.membership.addresses.get(node)

    def _answer_request(self, conn: int, kind: str, frame: dict[str, Any]) -> None:
        self.out.answer(conn, kind, frame)

    # ------------------------------------------------------------------ inputs: time

    def timer(self, now: Instant) -> None:
        if now.mono >= self._next_tick:
            # After a stall, tick once rather than catching up: a burst of ticks would
            # make a starved follower start an election it does not need.
            tick = self._timing.tick_s
            self._next_tick = max(self._next_tick + tick, now.mono + tick / 2)
            raft = self.raft
            raft.tick()
            if self.tracker.leading:
                self.proposals.expire_due(self.tracker, raft, now)
                self.proposals.say_quarantine_end(self.tracker, self.locks, raft, now)
                if self._role is Role.LEADER:
                    me, versions = self.config.node_id, self.health.versions
                    self.proposals.raise_version(
                        version=self.locks.version,
                        max_version=self.config.max_version,
                        versions_spoken=(
                            versions.get(m, 1) for m in (*raft.voters, *raft.learners) if m != me
                        ),
                        raft=raft,
                        retry_after_s=self._timing.election_timeout_s * 4,
                        now=now,
                    )
                    if not self._stopping:
                        health = self.health
                        to = spread_tick(
                            self.spread, raft, lambda m: health.answers(m, now), now.mono
                        )
                        if to is not None:
                            self.out.log("info", "transfer_leadership", to=to, reason="spread")
                self.membership.promote_caught_up_learners(
                    raft, self.locks.version, self.health.proved
                )
            members = (*raft.voters, *raft.learners)
            for member, silent_for in self.health.newly_silent(
                members, self._role is Role.LEADER, now
            ):
                self.out.log(
                    "warning",
                    "peer_silent",
                    peer=member,
                    address=self.address_of(member),
                    silent_ms=int(silent_for * 1000),
                )
            started_before = now.mono - self._timing.request_timeout_s
            self.proposals.time_out(started_before)
            self.reads.time_out(started_before)
        self.pump(now)

    # ------------------------------------------------------------------ inputs: peers

    def accept_peer(self, node: NodeId, speaks: int, address: str = "") -> str | None:
        """Why a peer's (authenticated) hello is refused, or None to accept it
        (membership.py decides)."""
        return self.membership.refusal(node, speaks, address, self.raft, self.locks.version)

    def peer_refused(self, node: NodeId, message: str) -> None:
        """A member refused our link, and proved it wrote the refusal (sealed after the
        handshake, or over TLS: admission.py decides, and nothing unproved gets here);
        if it says we were removed, we stop (exit 0)."""
        old = f"so {self.config.node_id} belongs to the old cluster"
        if OTHER_INCARNATION in message and old in message and not self._stopped:
            # The cluster was restored or recovered without this member's data directory.
            self._stopped = True
            self.out.log("warning", "old_incarnation", told_by=node)
            self.out.emit(Stop(message, EXIT_OLD_INCARNATION))
        if REMOVED in message and not self._stopped:
            self._stopped = True
            self.out.log("warning", "removed", told_by=node)
            self.out.emit(
                Stop(
                    f"this member {REMOVED} (told by {node}); to bring it back, remove its "
                    "data directory and start it with --join and a new --id",
                    0,
                )
            )

    def peer_version(self, node: NodeId, speaks: int) -> None:
        """A link to or from ``node`` learned the highest protocol version it speaks."""
        self.health.versions[node] = speaks

    def peer_unreachable(self, node: NodeId, now: Instant, *, gone: bool = False) -> None:
        """Our link to ``node`` broke; ``gone``: a redial was refused (no process listens)."""
        self.health.links_down.add(node)
        self.raft.report_unreachable(node, gone=gone)
        self.pump(now)

    def peer_messages(
        self, src: NodeId, messages: Iterable[Message], now: Instant, *, pump: bool = True
    ) -> None:
        """Steps every message ``src`` sent; a message claiming another sender is dropped.

        ``pump=False`` leaves the work for a later ``pump`` (see ``client_frame``)."""
        raft, health = self.raft, self.health
        me = self.config.node_id
        for msg in messages:
            if msg.src != src or msg.dst != me or not self.membership.knows(src):
                self.out.reject(now, "peer_message_refused", peer=src, message=type(msg).__name__)
                continue
            silent_for = health.heard_from(src, now)
            if silent_for is not None:
                self.out.log("info", "peer_regained", peer=src, silent_ms=int(silent_for * 1000))
            if type(msg) is AppendEntriesResponse and not msg.reject:
                health.acknowledged(src, msg.index, now, self.stats)
                if self.spans.busy:
                    self.spans.acknowledged(src, msg.index, now)
            raft.step(msg)
        if pump:
            self.pump(now)

    # ------------------------------------------------------------------ inputs: persistence

    def persisted(self, job: int, now: Instant, *, pump: bool = True) -> None:
        """Persist ``job`` is durable (jobs complete in the order they were handed out).

        ``pump=False`` leaves the work for a later ``pump`` (see ``client_frame``)."""
        if self.jobs.durable(job, now.mono):
            # A vote waits for one write on each side: the core's election timeouts must
            # outlast them (in ticks; a write within a tick changes nothing).
            self.raft.set_disk_latency(int(self.jobs.latency_s / self._timing.tick_s))
        if self.spans.busy:
            self.spans.durable(job, now)
        self._finish_jobs(now)
        if pump:
            self.pump(now)

    def _finish_jobs(self, now: Instant) -> None:
        for ready in self.jobs.finished():
            if ready.messages:
                if self.spans.busy:
                    self.spans.messages_sent(ready.messages, now)
                self.out.emit_all(self.health.batches(ready.messages, now))
            self.raft.advance(ready)

    # ------------------------------------------------------------------ inputs: images

    def image_built(self) -> None:
        """An image the runtime built off its loop is done: a periodic snapshot that came
        due meanwhile (the imager said "not now") is taken at the applied index now,
        rather than at the next entry, which may be long in coming."""
        self.snapshots.take_if_due(self.locks, self.raft, self.membership)

    # ------------------------------------------------------------------ the Ready loop

    def pump(self, now: Instant) -> None:
        """Hands out the work the Raft core has (and that inputs given with ``pump=False``
        left in it)."""
        raft = self.raft
        for _ in range(64):  # each turn hands out new work; a stuck core must not spin us
            self.reads.start_if_due(raft, self._role is Role.LEADER, now)
            if not raft.has_ready():
                break
            self._handle_ready(raft.ready(), now)
        if self.reads.rounds:
            for read in self.reads.ready(self.locks.applied_index):
                self._serve_read(read, now)
        if self.spans.answered:
            self.spans.settle(now)

    def needs_pump(self, now: Instant) -> bool:
        """Whether ``pump`` (and a look at ``take_actions``) has anything to do at ``now``.

        A runtime that fed frames with ``pump=False`` may skip the pump when this is
        False: keep-alives queued behind their round's gap, or behind an open round,
        change nothing until ``next_timer`` or the round's confirmation, each of which
        pumps. At 2,000 keep-alives a second that spares the leader a loop turn, a
        pump and an empty batch of actions for nearly every keep-alive."""
        raft = self.raft
        return (
            self.out.pending
            # Not has_ready: it flushes, and asked once per client frame it would send
            # each frame's entry to the followers in an append of its own.
            or raft.wants_ready()
            or self.reads.due(raft, self._role is Role.LEADER, now.mono)
            or (bool(self.reads.rounds) and self.reads.any_ready(self.locks.applied_index))
            or self.spans.answered
        )

    def _handle_ready(self, rd: Ready, now: Instant) -> None:
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state.role, rd.soft_state.leader, rd.soft_state.term, now)
        if rd.messages_now:
            self.out.emit_all(self.health.batches(rd.messages_now, now))
        number = self.jobs.hand_out(rd, now.mono)
        spans = self.spans
        if spans.busy and (rd.entries or rd.messages_now):
            # The appends left just now, with the entries they carry: both at ``now``.
            spans.handed_out(number, rd.entries, self.proposals.pending, now)
            spans.messages_sent(rd.messages_now, now)
        if number is not None:
            self.stats.persist_jobs += 1
            self.stats.entries_persisted += len(rd.entries)
            self.out.emit(Persist(number, rd.snapshot, rd.entries, rd.hard_state))
        if rd.snapshot is not None:
            self._install_snapshot(rd.snapshot, now)
        if rd.entries:
            self.membership.note_entries(rd.entries, self.raft)
        if rd.committed:
            self._apply(rd.committed, now)
        self.reads.confirmed(rd.read_states)
        self._finish_jobs(now)

    def _on_soft_state(self, role: Role, leader: NodeId | None, term: int, now: Instant) -> None:
        was_leader = self._role is Role.LEADER
        changed_leader = leader != self._leader or term != self._term
        unlisted = {leader, self._leader} & self.membership.unlisted.keys()
        self._role, self._leader, self._term = role, leader, term
        if changed_leader:
            self.stats.leader_changes += 1
            if unlisted:
                self.membership.announce(self.raft)
            self.out.log("info", "leader_changed", role=_role_name(role), leader=leader, term=term)
        elif (role is Role.LEADER) != was_leader:
            self.out.log("info", "role_changed", role=_role_name(role), leader=leader, term=term)
        if role is Role.LEADER and not was_leader:
            self.health.took_office(now)
            self.tracker.take_office(now.mono, self.locks.leases())
            self.proposals.took_office()
        elif was_leader and role is not Role.LEADER:
            self.tracker.leave_office()
            self.spread.left_office()
            self.proposals.fail_all()
            self.clients.left_office(self.out)
            self.membership.fail_proposals()
            self.reads.leadership_lost()

    # ------------------------------------------------------------------ applying

    def _install_snapshot(self, snap: Snapshot, now: Instant) -> None:
        self.locks = restore_image(snap.data, self.lock_machine_class, self.membership)
        self.snapshots.index = snap.meta.index
        self.out.log("info", "snapshot_installed", index=snap.meta.index, term=snap.meta.term)
        self.membership.announce(self.raft)
        self.clients.after_snapshot(self.locks, self.out)
        self.watches.after_snapshot(snap.meta.index)
        if self.tracker.leading:
            self.tracker.take_office(now.mono, self.locks.leases())
        self.audit.after_snapshot(self.locks)

    def _apply(self, committed: Iterable[Entry], now: Instant) -> None:
        """Applies committed entries, answering the clients who proposed them."""
        machine = self.locks
        pending = self.proposals.pending
        try:
            for entry in committed:
                index = entry.index
                if index <= machine.applied_index:
                    continue  # already in the image we restored from
                self.out.replaying = index <= self._replay_until
                if entry.kind is not EntryKind.NORMAL:
                    machine.skip(index)
                    proposal = pending.pop(index, None)
                    if proposal is not None:
                        self._reply_not_leader(proposal.conn, proposal.request)
                    if entry.kind is EntryKind.CONF_CHANGE:
                        self.membership.applied(
                            entry,
                            self.raft,
                            lambda conn, req: self._answer_request(
                                conn, req.TYPE, self.members_view(now).frame(req.id)
                            ),
                        )
                        if self.raft.removed and not self._stopped:
                            self._stopped = True
                            self.out.emit(
                                Stop(
                                    f"this member {REMOVED}; to bring it back, remove its data "
                                    "directory and start it with --join and a new --id",
                                    0,
                                )
                            )
                    continue
                self.membership.lost(index)
                proposal = pending.pop(index, None)
                held_before = locks.held_count(machine)
                if proposal is not None and proposal.data == entry.data:
                    outcome = machine.apply_command(index, proposal.command)
                else:
                    outcome = machine.apply(index, entry.data)
                    if proposal is not None:
                        self._reply_not_leader(proposal.conn, proposal.request)
                        proposal = None
                if outcome.command is not None:
                    self.out.entry_stamp_ms = outcome.command.at_ms
                # Holds this entry ended; 0 for a re-sent request answered from memory.
                dropped = held_before - locks.held_count(machine) + len(outcome.promotions)
                if self.spans.busy:
                    self.spans.applied(index, now)
                self._after_apply(outcome, proposal, dropped, now)
        finally:
            self.out.replaying = False
            self.watches.flush()
        self.snapshots.take_if_due(self.locks, self.raft, self.membership)

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
            self.audit.granted(
                promotion.lease, promotion.key, promotion.token, self.locks, now, queued=True
            )
            self.clients.push_grant(promotion.lease, promotion.key, promotion.token, self.out)
        for lease in outcome.ended:
            tracker.ended(lease)
            self.audit.forget_lease(lease)
            self.clients.forget_lease(lease)
        self.audit.applied(outcome, dropped, self.locks, now)
        if outcome.before:
            self.watches.applied(outcome, self.locks)
        result = outcome.result
        if isinstance(result, locks.Denied):
            permissions.count_refusal(
                self.stats, self.out, result.identity, result.action, result.message
            )
        elif isinstance(result, locks.IdentityChanged) and result.op == "remove":
            # Its connections close; its leases are renewed by nobody, so they expire at
            # their TTL, after each holder's guard stopped its command (never at once).
            self.clients.close_identity(result.name, self.out)
        if isinstance(outcome.command, locks.ClusterVersionCommand):
            self.membership.announce(self.raft)

    # ------------------------------------------------------------------ clients

    def client_connected(self, conn: int, remote: str, identity: str = "") -> None:
        """A client connection was admitted; ``identity``: who its handshake proved it is
        ("" when nothing names anyone), the owner of every lease it opens."""
        self.clients.connected(conn, remote, identity)

    def client_refusal(self, identity: str) -> dict[str, Any] | None:
        """The error that refuses one more client connection of ``identity`` (it holds
        its limit of connections on this member already), or None to take it. The
        runtime asks before ``client_connected``, once the handshake proved who it is."""
        limits = self.limits_for(identity)
        if limits.max_connections >= self._member_connections:
            return None  # no smaller than the member's own cap, which answers (UNAVAILABLE)
        held = self.clients.connections_of(identity)
        problem = connection_refusal(identity, held, limits)
        if problem is None:
            return None
        return error(
            None,
            ErrorCode.QUOTA_EXCEEDED,
            problem,
            limit=limit_name("connections"),
            identity=identity,
            retry_after_ms=1000,
        )

    def member_connections(self, count: int, quotas: Quotas | None = None) -> None:
        """The runtime serves at most ``count`` client connections (its descriptor budget):
        the default per-identity share follows it. ``quotas``: the member's new quotas and
        limits (a reload, dlm/node/runtime/reload.py), taken on by every check from now on."""
        quotas = replace(quotas or self.config.quotas, max_connections=count)
        if quotas != self.config.quotas:
            self.config = replace(self.config, quotas=quotas)
            self.proposals.quotas = quotas
        self._member_connections = count
        self.default_limits = quotas.identity_defaults()
        self.anonymous_limits = quotas.identity_defaults(anonymous=True)

    def client_closed(self, conn: int) -> None:
        self.clients.closed(conn)
        self.watches.closed(conn)
        self.spans.closed(conn)

    def client_frame(self, conn: int, obj: Any, now: Instant, *, pump: bool = True) -> None:
        """One decoded frame from a client connection.

        ``pump=False`` proposes without handing the work out yet: a runtime that
        feeds every frame that arrived at once this way, then calls ``pump``,
        gets one Ready for all of them (one append per follower, one fsync)."""
        state = self.clients.conns.get(conn)
        if state is None:
            return
        state.inflight += 1  # every frame gets one answer, which takes it off
        if isinstance(obj, BadFrame):
            self.clients.bad_request(
                state, "invalid", None, obj.code, obj.message, now=now, out=self.out
            )
            return
        try:
            req = decode_request(obj)
        except ProtocolError as exc:
            rid = obj.get("id") if isinstance(obj, dict) else None
            if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < 2**63:
                rid = None
            self.clients.bad_request(
                state, "invalid", rid, exc.code, str(exc), now=now, out=self.out
            )
            return
        limit = self.limits_for(state.identity).max_inflight
        if state.inflight > limit:
            self._answer_request(
                conn,
                req.TYPE,
                error(
                    req.id,
                    ErrorCode.QUOTA_EXCEEDED,
                    over_quota(state.identity, "inflight", limit),
                    limit=limit_name("inflight"),
                    identity=state.identity,
                    retry_after_ms=100,
                ),
            )
            return
        # Requests that carry a trace context are followed (spans.py); others cost this test.
        trace = getattr(req, "trace", None)
        if trace is not None:
            self.spans.received(conn, req, trace, now)
        self._handle_request(state, req, now)
        if pump:
            self.pump(now)

    def _handle_request(self, state: ClientConn, req: ClientRequest, now: Instant) -> None:
        conn = state.conn
        if self._stopping:
            self._answer_request(
                conn, req.TYPE, error(req.id, ErrorCode.SHUTTING_DOWN, "member is shutting down")
            )
            return
        config = self.config
        if config.partitions != 1:
            misrouted = partition_refusal(req, config.partition, config.partitions)
            if misrouted is not None:
                self._answer_request(conn, req.TYPE, misrouted)
                return
        leading = self._role is Role.LEADER
        problem = permissions.request_refusal(
            self.locks, self.out, state, req, leading=leading, enforce=self.check_permissions
        )
        if problem is not None:
            identity = state.identity or ADMIN
            permissions.count_refusal(self.stats, self.out, identity, req.TYPE, problem)
            self._answer_request(state.conn, req.TYPE, denied(req.id, problem))
            return
        # How a member serves each request is the protocol table's (wire.Request.ROUTE).
        route = req.ROUTE
        if route == "local":  # a ping
            self._answer_request(conn, req.TYPE, ok(req.id))
        elif route == "watch":  # served from this member's applied log, whatever its role
            self.watches.request(conn, cast(Watch, req), self.locks.applied_index)
        elif route == "read" and getattr(req, "stale", False):
            self._serve_read(Read(conn, req, now.mono), now)
        elif self._role is not Role.LEADER and not isinstance(req, Status):
            # Changes, keep-alives and lock reads go to the leader: it confirms the read
            # point itself, and only it knows how much of each lease's TTL is left. A
            # member's own status is linearizable from any member: the read point comes
            # from the leader (ReadIndex), and the member answers once it has applied up to it.
            self._reply_not_leader(conn, req)
        elif route in ("propose", "identity"):
            self.proposals.propose(
                state,
                # The identity route's requests are AuthChanges: mypyc checks a cast.
                cast(LockChange | AuthChange, req),
                now,
                raft=self.raft,
                machine=self.locks,
                doomed=self._doomed,
            )
        elif route == "member":
            self.membership.request(
                conn,
                cast(MemberChange, req),
                now,
                raft=self.raft,
                version=self.locks.version,
                answers=self.health.answers,
                proved=self.health.proved,
            )
        else:  # "confirm", and a read that is not stale: after a read round
            self.reads.queue(Read(conn, req, now.mono))

    # -- answering ------------------------------------------------------------

    def _answer(self, proposal: _Proposal, result: locks.Result, now: Instant) -> None:
        conn, req = proposal.conn, proposal.request
        if isinstance(result, locks.Queued):
            assert isinstance(req, Acquire)
            self._register_waiter(conn, req.lease, result.key)
            self._queued_mono.setdefault((req.lease, result.key), now.mono)
        # An Expire for the lease is in the log already: a join must not count a fresh TTL,
        # and an update proposed before the Expire and applied after would promise time
        # the lease does not have (its clock was not restarted: leases.py, arm).
        doomed = (
            (isinstance(result, locks.LeaseOpened) and result.joined)
            or isinstance(result, locks.LeaseUpdated)
        ) and self._doomed(result.lease)
        self._answer_request(conn, req.TYPE, self._replies(now).answer(req, result, doomed=doomed))

    def _replies(self, now: Instant, viewer: str = ADMIN) -> Replies:
        """What this member answers at ``now`` (dlm/node/replies.py) to identity ``viewer``."""
        return Replies(self.locks, self.tracker, now.mono, now.wall_ms, viewer)

    def _viewer(self, conn: int) -> str:
        state = self.clients.conns.get(conn)
        return (state.identity if state is not None else "") or ADMIN

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

    def _register_waiter(self, conn: int, lease: str, key: str) -> None:
        self.clients.register_waiter(conn, lease, key)

    # -- reads ----------------------------------------------------------------

    def _serve_read(self, read: Read, now: Instant) -> None:
        conn, req = read.conn, read.request
        if isinstance(req, Renew):
            if self._role is not Role.LEADER:
                self._reply_not_leader(conn, req)
                return
            renewed = renew_confirmed(
                req, read.received, self.locks, self.tracker, doomed=self._doomed(req.lease)
            )
            if isinstance(renewed, int):
                self._answer_request(conn, req.TYPE, ok(req.id, lease=req.lease, ttl_ms=renewed))
            else:
                self._answer_request(conn, req.TYPE, lease_gone(req.id, req.lease, renewed))
        elif isinstance(req, Get):
            self._answer_request(conn, req.TYPE, self._replies(now).lock(req).frame(req.id))
        elif isinstance(req, ListLocks):
            page = self._replies(now, self._viewer(conn)).locks_page(req)
            self._answer_request(conn, req.TYPE, page.frame(req.id))
        elif isinstance(req, LeaseInfo):
            self._answer_request(conn, req.TYPE, self._replies(now).lease_info(req))
        elif isinstance(req, ListLeases):
            leases = self._replies(now, self._viewer(conn)).leases_page(req)
            self._answer_request(conn, req.TYPE, leases.frame(req.id))
        elif isinstance(req, Runs):
            runs = self._replies(now, self._viewer(conn)).runs(req)
            self._answer_request(conn, req.TYPE, runs)
        elif isinstance(req, AuthList):
            rows = self.locks.identities.rows(now.wall_ms)
            self._answer_request(conn, req.TYPE, ok(req.id, identities=rows))
        elif isinstance(req, ConfigGet):
            self._answer_request(conn, req.TYPE, settings_reply(req, self.locks))
        elif isinstance(req, Status):
            self._answer_request(conn, req.TYPE, self.status_view(now).frame(req.id))
        elif isinstance(req, Members):
            self._answer_request(conn, req.TYPE, self.members_view(now).frame(req.id))
        elif isinstance(req, SnapshotSave):
            self._serve_backup(conn, req, now)

    def _serve_backup(self, conn: int, req: SnapshotSave, now: Instant) -> None:
        """An image of the applied state for ``dlm snapshot save``. The read round that
        led here confirmed we led when it started, so the image holds every change
        acknowledged before the request; its index is committed, as every applied one is."""
        if self._role is not Role.LEADER:
            self._reply_not_leader(conn, req)
            return
        taken = self.snapshots.backup(self.locks, self.raft, self.membership)
        if taken is None:
            self._answer_request(
                conn,
                req.TYPE,
                error(
                    req.id,
                    ErrorCode.UNAVAILABLE,
                    "another backup is being taken on this member; try again when it is done",
                    retry_after_ms=1000,
                ),
            )
            return
        index, term, conf, image = taken
        header = {
            "cluster": self.config.cluster,
            "index": index,
            "term": term,
            "voters": list(conf.voters),
            "learners": list(conf.learners),
            "leader": self.config.node_id,
            "taken_at_ms": now.wall_ms,
        }
        self.stats.count(req.TYPE, "OK")
        self.out.emit(SendBackup(conn, req.id, header, image))

    def _doomed(self, lease: str) -> bool:
        """The leader proposed an Expire for ``lease``: no client may count on it any more.

        (A seam: the simulator's bug-injection tests switch it off.)
        """
        return self.tracker.is_expiring(lease)

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
            incarnation=self.config.incarnation,
            quarantine=self.locks.quarantine,
            partition=self.config.partition,
            partitions=self.config.partitions,
        )

    def members_view(self, now: Instant) -> MembersView:
        return replies.members_view(
            self.raft.status(),
            learners=self.raft.learners,
            bootstrap=dict(self.config.peers),
            incarnation=self.config.incarnation,
            address_of=self.address_of,
            answers=lambda member: self.health.answers(member, now),
            last_contact_ms=lambda member: self._last_contact_ms(member, now),
            reason=lambda member: self.membership.learner_reason(
                member, self.raft, self.health.proved
            ),
        )

    def _last_contact_ms(self, member: NodeId, now: Instant) -> int | None:
        return self.health.last_contact_ms(member, now)

    # ------------------------------------------------------------------ stopping

    def begin_shutdown(self, now: Instant) -> None:
        """Refuse new requests; a leader hands leadership to its most caught-up voter."""
        if self._stopping:
            return
        self._stopping = True
        self.out.log(
            "info",
            "shutting_down",
            pending=len(self.proposals.pending),
            reads=len(self.reads.rounds),
        )
        if self._role is Role.LEADER and len(self.raft.voters) > 1:
            best = self.membership.best_successor(self.raft)
            if best is not None:
                self.out.log("info", "transfer_leadership", to=best)
                self.raft.transfer_leadership(best)
        self.pump(now)

    def finish_shutdown(self) -> None:
        """Answer whatever is still pending: the member stops now."""
        self.proposals.shut_down()
        self.reads.shut_down()


def _role_name(role: Role) -> str:
    return role.value
