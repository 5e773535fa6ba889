"""The Raft protocol itself: one member's state machine, inputs in, a ``Ready`` batch out.

Theory of operation
-------------------
``RaftNode`` never performs IO. The runtime calls ``tick()``, ``step(msg)``
and the client entry points (``propose``, ``propose_conf_change``,
``read_index``, ``transfer_leadership``); each only updates memory and queues
work. The runtime then takes that work with ``ready()``, sends, persists and
applies it (see types.py for the order), and acknowledges it with
``advance(ready)``.

Sends to followers are coalesced: a proposal only appends to the leader's log
and marks the followers dirty; the AppendEntries messages are built when the
runtime next calls ``has_ready()``/``ready()``, so every proposal made between
two ``ready()`` calls leaves in one message per follower.

Persistence runs beside the protocol (Raft dissertation, section 10.2.1). A
leader's AppendEntries leave in ``Ready.messages_now``, while the leader is
still writing the same entries, and the leader's own copy counts towards a
quorum only from the ``advance`` that reports it durable (``_become_leader``
likewise starts from what is already on disk). The core remembers the term
and vote of the last hard state an ``advance`` confirmed; while the current
ones are newer, every message waits for the disk (``Ready.messages``). Several
Readys may be in flight at once; ``advance`` must acknowledge them in order.

Roles: FOLLOWER (or LEARNER for a member that is not a voter) ->
PRE_CANDIDATE (asks "would you vote for me?" without touching any term) ->
CANDIDATE -> LEADER. Any message with a higher term sends us back to
FOLLOWER, except the vote requests a follower ignores while it still hears
from a live leader (the check-quorum lease) and pre-vote traffic, which
carries a future term.

Lost messages: a follower in probe mode gets its next probe when it answers
a heartbeat; a streaming follower whose acknowledgements stop while its
heartbeat answers keep coming (``STALL_ROUNDS`` of them) drops back to probe.
``report_unreachable`` does the same at once when the runtime knows a link broke
(and, on a follower told that its leader's process is gone, brings its election
closer).

Snapshots: when a follower needs an entry the leader has compacted, the leader
sends ``storage.snapshot()`` in ``snapshot_chunk_bytes`` chunks, one in flight
at a time. The follower acknowledges each chunk with the byte it wants next
(``InstallSnapshotResponse.index`` is the snapshot's index), asks for a restart
(``reject``) when a chunk does not fit what it holds, and on the last chunk
hands the whole image to the runtime as ``Ready.snapshot``; its final answer's
``index`` is the index its log now matches. Heartbeats go on meanwhile.

Membership
----------
Single-server changes (Raft dissertation, chapter 4), not joint consensus: a
change adds a learner, promotes a learner to voter, or removes one member, so
the majorities of the configurations before and after any one change always
overlap, and ``quorum.py`` stays plain majority arithmetic. dlm's membership
changes are operator steps taken one at a time (start a member, let it catch
up as a learner, promote it; or remove one), which is exactly what single
changes express; joint consensus earns its extra state only when several
members must be swapped atomically, which dlm never needs. The rules:

* A configuration takes effect on a member as soon as its CONF_CHANGE entry is
  in that member's log, committed or not; the latest one in the log wins, and
  it is reverted when the suffix holding it is cut off (``membership.py``
  keeps the history). Leaders count commits, votes, check-quorum and
  ReadIndex acknowledgements with it at once.
* A leader accepts a change only once an entry of its own term is committed
  (its no-op, normally within one round trip) and only while no earlier change
  is uncommitted. The first rule is the erratum Diego Ongaro posted to the
  raft-dev list in 2015: without it, a new leader can commit a change made
  under its own configuration while a different, uncommitted change from an
  earlier term sits in another member's log, and the two configurations need
  not share a majority. ``ConfChangeRefused`` says which rule refused.
* Learners get appends, heartbeats and snapshots, but never campaign and never
  count towards a quorum or check-quorum, nor does a member that is not a voter
  in its own latest configuration (not yet added, or being removed). They do
  answer vote requests: a candidate counts only the voters of its own
  configuration, so a learner's vote counts only for a candidate that already
  knows it was promoted, and a learner whose promotion committed without
  reaching it must be able to help elect the leader that will tell it (with
  four voters, refusing can leave the cluster leaderless for good). Only a
  member that knows its own removal committed refuses to vote.
* A leader goes on leading while the configuration that removes it is
  uncommitted (not counting itself), and steps down once it commits, handing
  over with TimeoutNow to a caught-up voter. A member being removed keeps
  receiving the log until its removal commits, so it normally learns of it:
  ``removed`` becomes true once a committed configuration no longer includes
  a member that an earlier committed configuration did.
* Start-up rebuilds the configuration from the snapshot's ConfState (or the
  bootstrap voters of ``Config``) plus every CONF_CHANGE entry after it.

Test seams: ``_maybe_commit``, ``_log_is_up_to_date``, ``_on_higher_term``,
``_hard_state`` and ``_refuse_conf_change`` are small protected methods that
the real logic calls; the simulator's bug-injection tests override them in
subclasses.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlm.node.raft.log import RaftLog
from dlm.node.raft.membership import (
    ConfHistory,
    apply_change,
    check_change,
    conf_after_entry,
    includes,
)
from dlm.node.raft.progress import Progress, ProgressState
from dlm.node.raft.quorum import VoteResult, majority, quorum_index, vote_result
from dlm.node.raft.read_only import ReadOnly
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    ConfChangeRefused,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    NotLeader,
    ReadIndexRequest,
    ReadIndexResponse,
    ReadState,
    Ready,
    Role,
    SoftState,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import (
    ConfChange,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    LogCompacted,
    LogStorage,
    LogUnavailable,
    NodeId,
    Snapshot,
    SnapshotMeta,
    encode_conf_change,
)

STALL_ROUNDS = 3
"""Heartbeat answers without progress after which the leader assumes its appends were lost."""


@dataclass(frozen=True, slots=True)
class Config:
    id: NodeId
    voters: tuple[NodeId, ...]
    """Bootstrap voters: the configuration at log index 0.

    Used only when storage.initial_state() has an empty ConfState. Every member
    the cluster ever has, including one added later, must be started with the
    same bootstrap voters, because the log's configuration changes are relative
    to it (a member added later is not among them, and stays passive until its
    log or a snapshot makes it a member). A member id must never be reused.
    """
    group: int = 0
    election_ticks: int = 10
    """Followers time out after a random draw from [election_ticks, 2 * election_ticks),
    widened after failed rounds and lengthened by the disk's latency (``election_timeout``)."""
    max_backoff_doublings: int = 3
    """How many times failed rounds in a row may double the election timeout's range."""
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 64
    """Unacknowledged AppendEntries messages allowed per follower in replicate mode."""
    max_entries_bytes: int = 1 << 20
    """Payload budget of one AppendEntries (one entry is always sent, however big)."""
    snapshot_chunk_bytes: int = 1 << 16

    def validate(self) -> None:
        if self.heartbeat_ticks < 1:
            raise ValueError("heartbeat_ticks must be >= 1")
        if self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("election_ticks must exceed heartbeat_ticks")
        if not 0 <= self.max_backoff_doublings <= 10:
            raise ValueError("max_backoff_doublings must be between 0 and 10")
        if self.max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        if self.max_entries_bytes < 1 or self.snapshot_chunk_bytes < 1:
            raise ValueError("message budgets must be positive")


@dataclass(frozen=True, slots=True)
class FollowerProgress:
    match: int
    next: int
    recent_active: bool
    snapshot_pending: bool
    is_learner: bool = False
    """A learner, or a member whose removal is not yet committed (neither counts)."""


@dataclass(frozen=True, slots=True)
class RaftStatus:
    id: NodeId
    term: int
    vote: NodeId | None
    role: Role
    leader: NodeId | None
    commit: int
    applied: int
    first_index: int
    last_index: int
    voters: tuple[NodeId, ...]
    learners: tuple[NodeId, ...] = ()
    removed: bool = False
    progress: dict[NodeId, FollowerProgress] = field(default_factory=dict)
    """Per-member replication state (the leader itself and learners too); empty unless leader."""


@dataclass(slots=True)
class _SnapshotReceipt:
    """A snapshot a follower is reassembling from chunks."""

    src: NodeId
    term: int
    meta: SnapshotMeta
    chunks: list[bytes]
    size: int = 0


_LEADER_MESSAGES = (AppendEntries, Heartbeat, InstallSnapshot)

NARROW_AFTER = 8
"""Widened election timeouts (their base) that must pass with a leader before the back-off
narrows by one doubling: from the widest back to the configured range takes about 34 s at
dlm's 300 ms (8 x (2.4 + 1.2 + 0.6) s)."""

_SEND_NOW = frozenset(
    {
        AppendEntries,
        Heartbeat,
        InstallSnapshot,
        TimeoutNow,
        HeartbeatResponse,
        ReadIndexRequest,
        ReadIndexResponse,
    }
)
"""Messages that promise nothing about the sender's disk (only its durable term and vote)."""


class RaftNode:
    """One Raft member. Not thread-safe: one runtime task owns it."""

    __slots__ = (
        "_append_all",
        "_cfg",
        "_commit_bcast",
        "_committed_in_term",
        "_conf_checked",
        "_conf_history",
        "_disk_ticks",
        "_dispatch",
        "_durable_term",
        "_durable_vote",
        "_election_elapsed",
        "_failed_rounds",
        "_group",
        "_heartbeat_due",
        "_heartbeat_elapsed",
        "_id",
        "_in_round",
        "_lead_transferee",
        "_leader",
        "_learners",
        "_log",
        "_msgs",
        "_pending_append",
        "_prev_hard",
        "_prev_soft",
        "_progress",
        "_quorum",
        "_randomized_timeout",
        "_read_only",
        "_read_states",
        "_reads_waiting_commit",
        "_removed",
        "_rng",
        "_role",
        "_snap_receipt",
        "_steady_ticks",
        "_term",
        "_unadvanced",
        "_vote",
        "_voter_set",
        "_voters",
        "_votes",
        "_was_member",
    )

    def __init__(self, config: Config, storage: LogStorage, rng: random.Random) -> None:
        config.validate()
        self._cfg = config
        self._id = config.id
        self._group = config.group
        self._rng = rng
        self._log = RaftLog(storage)
        hard, conf = storage.initial_state()
        self._role = Role.FOLLOWER
        self._voters: tuple[NodeId, ...] = ()
        self._voter_set: frozenset[NodeId] = frozenset()
        self._learners: tuple[NodeId, ...] = ()
        self._quorum = 1
        if not conf.voters:
            conf = ConfState(voters=config.voters, learners=conf.learners)
        self._conf_history = _replay_conf_changes(storage, conf)
        base = self._conf_history.base_index
        self._conf_checked = base - 1  # configurations up to here were checked for removal
        self._was_member = False
        self._removed = False
        self._apply_conf(self._conf_history.latest)

        log = self._log
        # A lazily persisted commit may lag the snapshot; it never exceeds the log.
        log.committed = min(max(hard.commit, log.committed), log.last_index())
        self._term = hard.term
        self._vote: NodeId | None = hard.vote
        self._durable_term = hard.term
        self._durable_vote: NodeId | None = hard.vote
        self._unadvanced: deque[Ready] = deque()
        self._leader: NodeId | None = None
        self._votes: dict[NodeId, bool] = {}
        self._progress: dict[NodeId, Progress] = {}
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._failed_rounds = 0
        self._in_round = False
        """Since we last heard a leader, a round reached us (we granted a vote) or ours
        reached another member (it answered)."""
        self._steady_ticks = 0
        """Ticks with a leader since the back-off last moved (it narrows after enough)."""
        self._disk_ticks = 0
        self._randomized_timeout = config.election_ticks
        self._lead_transferee: NodeId | None = None
        self._committed_in_term = False
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._read_only = ReadOnly()
        self._reads_waiting_commit: list[tuple[bytes, NodeId]] = []
        self._snap_receipt: _SnapshotReceipt | None = None
        self._append_all = False
        self._commit_bcast = False
        self._heartbeat_due = False
        self._pending_append: set[NodeId] = set()
        self._become_follower(self._term, None)
        self._check_committed_conf()
        self._prev_hard = hard
        self._prev_soft = self._soft_state()
        self._dispatch: dict[type[Any], Callable[[Any], None]] = {
            VoteRequest: self._on_vote_request,
            VoteResponse: self._on_vote_response,
            AppendEntries: self._on_append_entries,
            AppendEntriesResponse: self._on_append_response,
            Heartbeat: self._on_heartbeat,
            HeartbeatResponse: self._on_heartbeat_response,
            InstallSnapshot: self._on_install_snapshot,
            InstallSnapshotResponse: self._on_install_snapshot_response,
            TimeoutNow: self._on_timeout_now,
            ReadIndexRequest: self._on_read_index_request,
            ReadIndexResponse: self._on_read_index_response,
        }

    def __repr__(self) -> str:
        return (
            f"RaftNode({self._id} {self._role.value} term={self._term} "
            f"leader={self._leader} {self._log!r})"
        )

    # ------------------------------------------------------------------
    # Properties
    # ------------------------------------------------------------------

    @property
    def id(self) -> NodeId:
        return self._id

    @property
    def term(self) -> int:
        return self._term

    @property
    def vote(self) -> NodeId | None:
        return self._vote

    @property
    def role(self) -> Role:
        return self._role

    @property
    def leader(self) -> NodeId | None:
        return self._leader

    @property
    def commit_index(self) -> int:
        return self._log.committed

    @property
    def applied_index(self) -> int:
        return self._log.applied

    @property
    def last_index(self) -> int:
        return self._log.last_index()

    @property
    def voters(self) -> tuple[NodeId, ...]:
        return self._voters

    @property
    def learners(self) -> tuple[NodeId, ...]:
        return self._learners

    @property
    def conf_state(self) -> ConfState:
        """The configuration in force: the latest in the log, committed or not."""
        return self._conf_history.latest

    @property
    def removed(self) -> bool:
        """A committed configuration no longer includes this member (after one that did).

        Latched: the runtime should stop serving as a member. A member removed
        while cut off may never learn it; nothing unsafe follows, since it is
        no voter to the others, but the runtime cannot rely on this alone.
        """
        return self._removed

    @property
    def lead_transferee(self) -> NodeId | None:
        return self._lead_transferee

    def conf_state_at(self, index: int) -> ConfState:
        """The configuration in force at log ``index``: what a snapshot taken there records.

        Known from the log's compaction point (its first index - 1) to its end;
        raises ValueError outside that range.
        """
        if index > self._log.last_index():
            raise ValueError(f"index {index} is beyond the log's end {self._log.last_index()}")
        return self._conf_history.at(index)

    # ------------------------------------------------------------------
    # Inputs
    # ------------------------------------------------------------------

    def tick(self) -> None:
        if self._role is Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()

    def step(self, msg: Message) -> None:
        """Feed one message from a peer. Messages for another group or member are ignored."""
        if msg.group != self._group or msg.dst != self._id:
            return
        handler = self._dispatch.get(type(msg))
        if handler is None:
            return
        term = msg.term
        if term > self._term:
            if isinstance(msg, VoteRequest):
                if not msg.transfer and self._in_lease():
                    # A live leader is in touch with us: this candidate would only disrupt it.
                    return
                if not msg.pre_vote:
                    self._on_higher_term(term, None)
            elif isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
                pass  # a granted pre-vote carries the term we would campaign at
            else:
                leader = msg.src if isinstance(msg, _LEADER_MESSAGES) else None
                self._on_higher_term(term, leader)
        elif term < self._term:
            self._on_stale_term(msg)
            return
        handler(msg)
        checked = self._conf_checked
        if self._log.committed > checked and self._conf_history.latest_index > checked:
            self._check_committed_conf()

    def propose(self, data: bytes) -> int | NotLeader:
        """Append a command to the leader's log; returns the index it will commit at, if it does."""
        if self._role is not Role.LEADER:
            return NotLeader(self._leader)
        if self._lead_transferee is not None:
            return NotLeader(self._lead_transferee)
        # Even a lone voter commits only after advance() reports its own copy durable.
        return self._append_entry(data)

    def propose_conf_change(self, change: ConfChange) -> int | NotLeader | ConfChangeRefused:
        """Append a single-member configuration change; it takes effect at once (see above).

        Returns the index of its CONF_CHANGE entry, NotLeader, or
        ConfChangeRefused with the reason: an earlier change is uncommitted, no
        entry of this leader's term is committed yet, or the change does not
        apply (the id is already a member, is unknown, is not a learner, is the
        last voter, or cannot be encoded).
        """
        if self._role is not Role.LEADER:
            return NotLeader(self._leader)
        if self._lead_transferee is not None:
            return NotLeader(self._lead_transferee)
        reason = self._refuse_conf_change(change)
        if reason is not None:
            return ConfChangeRefused(reason)
        try:
            data = encode_conf_change(change)
        except ValueError as error:
            return ConfChangeRefused(str(error))
        conf = apply_change(self._conf_history.latest, change)
        index = self._append_entry(data, EntryKind.CONF_CHANGE)
        self._conf_history.push(index, conf)
        self._apply_conf(conf)
        return index

    def read_index(self, ctx: bytes) -> NotLeader | None:
        """Ask for a linearizable read point; the answer comes as ``ReadState(ctx, index)``.

        ``ctx`` must be unique among pending reads cluster-wide (say, node id and a
        counter): a duplicate is dropped. A follower forwards the request to the
        leader; a refused or lost request produces no ReadState at all, so the
        runtime needs a deadline for each read.
        """
        if self._role is Role.LEADER:
            self._leader_read(ctx, self._id)
            return None
        if self._leader is None:
            return NotLeader(None)
        self._send(
            ReadIndexRequest(
                group=self._group, term=self._term, src=self._id, dst=self._leader, ctx=ctx
            )
        )
        return None

    def transfer_leadership(self, to: NodeId) -> NotLeader | None:
        """Hand leadership to ``to``: stop proposals, catch it up, then send it TimeoutNow.

        The attempt is abandoned after an election timeout. Asking for ourselves,
        or for a member that is not a voter, is a no-op.
        """
        if self._role is not Role.LEADER:
            return NotLeader(self._leader)
        if to == self._id or to not in self._voter_set or self._lead_transferee == to:
            return None
        self._lead_transferee = to
        self._election_elapsed = 0  # the transfer's deadline
        pr = self._progress[to]
        if pr.match == self._log.last_index():
            self._send_timeout_now(to)
        else:
            self._pending_append.add(to)
        return None

    def report_unreachable(self, peer: NodeId, *, gone: bool = False) -> None:
        """The runtime lost its link to ``peer``; ``gone``: its process is not there at all
        (a redial was refused), not merely a broken connection.

        A leader stops pipelining to it until it answers again. A follower told that
        its leader is gone stops counting on the leader's lease, so it grants votes
        at once, and campaigns after 1 to ``election_ticks`` ticks (random, so that
        two followers seldom collide) unless it hears from the leader first: a
        crashed leader is replaced in a few ticks instead of a whole election
        timeout. A connection that merely broke changes no timer: when something
        resets every connection at once (a NAT or firewall dropping its table) while
        the leader lives, followers that gave up its lease together would grant each
        other's pre-votes and depose it.
        """
        if peer == self._id:
            return
        if self._role is Role.FOLLOWER:
            if gone and peer == self._leader and self._id in self._voter_set:
                ticks = self._cfg.election_ticks
                lease = ticks << self._failed_rounds  # as widened as _in_lease counts it
                self._election_elapsed = max(self._election_elapsed, lease)
                self._randomized_timeout = self._election_elapsed + self._rng.randrange(
                    1, ticks + 1
                )
            return
        if self._role is not Role.LEADER:
            return
        pr = self._progress.get(peer)
        if pr is not None and pr.state is ProgressState.REPLICATE:
            pr.become_probe()

    def set_disk_latency(self, ticks: int) -> None:
        """How many ticks this member's writes take now, as the runtime measures them.

        A vote leaves only after the voter's fsync, and a candidate asks for votes only
        after its own, so an election round takes about two fsyncs: each election
        timeout drawn from now on is that much longer, or rounds on a slow disk would
        all time out before their votes arrived. Timers decide only liveness.
        """
        self._disk_ticks = max(0, ticks)

    @property
    def failed_rounds(self) -> int:
        """Election timeouts in a row that passed without a leader, up to
        ``max_backoff_doublings`` (the back-off's step)."""
        return self._failed_rounds

    def election_timeout_range(self) -> tuple[int, int]:
        """The ticks the next election timeout is drawn from: [low, high)."""
        cfg = self._cfg
        base = cfg.election_ticks << self._failed_rounds
        low = base + 2 * self._disk_ticks
        return low, low + base

    # ------------------------------------------------------------------
    # Output
    # ------------------------------------------------------------------

    def has_ready(self) -> bool:
        if self._append_all or self._commit_bcast or self._heartbeat_due or self._pending_append:
            self._flush()
        if self._msgs or self._read_states or self._log.has_work():
            return True
        prev = self._prev_soft
        if prev.role is not self._role or prev.leader != self._leader or prev.term != self._term:
            return True
        return self._changed_hard_state() is not None

    def ready(self) -> Ready:
        """Take the work accumulated since the last call; see types.Ready for what to do with it.

        Each piece of work is handed out once, so ``step``/``tick``/``ready`` may go on
        while earlier Readys are being persisted; ``advance`` each, in order, when it is.
        """
        if self._append_all or self._commit_bcast or self._heartbeat_due or self._pending_append:
            self._flush()
        log = self._log
        hard = self._changed_hard_state()
        if hard is not None:
            self._prev_hard = hard
        soft = self._changed_soft_state()
        if soft is not None:
            self._prev_soft = soft
        snapshot = entries = committed = None
        if log.has_work():
            snapshot = log.take_snapshot()
            entries = log.take_unstable()
            committed = log.take_committed(self._cfg.max_entries_bytes)
        msgs: tuple[Message, ...] = ()
        msgs_now: tuple[Message, ...] = ()
        pending = self._msgs
        if pending:
            self._msgs = []
            if self._term != self._durable_term or self._vote != self._durable_vote:
                msgs = tuple(pending)  # our term or vote is not on disk yet: all must wait
            else:
                msgs, msgs_now = _sort_messages(pending)
        reads: tuple[ReadState, ...] = ()
        if self._read_states:
            reads = tuple(self._read_states)
            self._read_states = []
        rd = Ready(
            hard_state=hard,
            entries=entries or (),
            snapshot=snapshot,
            messages=msgs,
            committed=committed or (),
            read_states=reads,
            soft_state=soft,
            messages_now=msgs_now,
        )
        if hard is not None or entries or snapshot is not None:
            self._unadvanced.append(rd)
        return rd

    def _changed_hard_state(self) -> HardState | None:
        prev = self._prev_hard
        # Compare raw fields first; build the value (through the seam) only when one moved.
        if (
            prev.term == self._term
            and prev.vote == self._vote
            and prev.commit == self._log.committed
        ):
            return None
        hard = self._hard_state()
        return hard if hard != prev else None

    def _changed_soft_state(self) -> SoftState | None:
        prev = self._prev_soft
        if prev.role is self._role and prev.leader == self._leader and prev.term == self._term:
            return None
        return self._soft_state()

    def advance(self, ready: Ready) -> None:
        """The runtime persisted, sent and applied ``ready``.

        Readys that carry anything to persist must be advanced in the order
        ``ready()`` returned them; anything else raises ValueError.
        """
        hard = ready.hard_state
        snapshot = ready.snapshot
        entries = ready.entries
        if hard is not None or entries or snapshot is not None:
            unadvanced = self._unadvanced
            if not unadvanced or unadvanced[0] is not ready:
                raise ValueError("advance() must acknowledge Readys in the order ready() gave them")
            unadvanced.popleft()
        log = self._log
        if hard is not None:
            self._durable_term = hard.term
            self._durable_vote = hard.vote
        if snapshot is not None:
            log.stable_snap_to(snapshot.meta.index)
            log.applied_to(snapshot.meta.index)
        if entries:
            last = entries[-1]
            log.stable_to(last.index, last.term)
        if ready.committed:
            log.applied_to(ready.committed[-1].index)
            history = self._conf_history
            if history.latest_index > history.base_index:
                # The runtime's next snapshot lies at or after the compaction point.
                history.forget_before(min(log.applied, log.first_index() - 1))
        if (entries or snapshot is not None) and self._role is Role.LEADER:
            me = self._progress[self._id]
            durable = log.durable_index()
            if durable > me.match:
                # Our own copy now counts towards a quorum (section 10.2.1).
                me.match = durable
                if self._maybe_commit():
                    self._on_commit_advanced()
                    checked = self._conf_checked
                    if log.committed > checked and self._conf_history.latest_index > checked:
                        self._check_committed_conf()

    def status(self) -> RaftStatus:
        log = self._log
        progress: dict[NodeId, FollowerProgress] = {}
        if self._role is Role.LEADER:
            voters = self._voter_set
            progress = {
                peer: FollowerProgress(
                    match=pr.match,
                    next=pr.next,
                    recent_active=pr.recent_active,
                    snapshot_pending=pr.state is ProgressState.SNAPSHOT,
                    is_learner=peer not in voters,
                )
                for peer, pr in self._progress.items()
            }
        return RaftStatus(
            id=self._id,
            term=self._term,
            vote=self._vote,
            role=self._role,
            leader=self._leader,
            commit=log.committed,
            applied=log.applied,
            first_index=log.first_index(),
            last_index=log.last_index(),
            voters=self._voters,
            learners=self._learners,
            removed=self._removed,
            progress=progress,
        )

    # ------------------------------------------------------------------
    # Test seams (overridden by the simulator's bug-injection tests)
    # ------------------------------------------------------------------

    def _maybe_commit(self) -> bool:
        """Test seam. Leader: advance commit to the index a quorum holds, if it is of our term.

        Raft 5.4.2: an entry of an earlier term is never committed by counting
        replicas; it commits implicitly once an entry of the current term above
        it does. Returns True when the commit index moved. Helpers for an
        override: ``_quorum_match_index()``, ``_log.term(i)``, ``_log.commit_to(i)``.
        """
        index = self._quorum_match_index()
        if index <= self._log.committed:
            return False
        if self._log.term_or_none(index) != self._term:
            return False
        return self._log.commit_to(index)

    def _log_is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Test seam. Raft 5.4.1: grant a vote only to a log at least as up to date as ours."""
        return self._log.is_up_to_date(last_index, last_term)

    def _on_higher_term(self, term: int, leader: NodeId | None) -> None:
        """Test seam. A message carries a higher term: adopt it and become a follower.

        ``leader`` is the sender when the message is one only a leader sends.
        The real logic is ``_become_follower(term, leader)``; the attributes it
        changes are ``_term``, ``_vote``, ``_leader`` and ``_role``.
        """
        self._become_follower(term, leader)

    def _hard_state(self) -> HardState:
        """Test seam. What must be persisted before this node's messages go out."""
        return HardState(self._term, self._vote, self._log.committed)

    def _refuse_conf_change(self, change: ConfChange) -> str | None:
        """Test seam. Why the leader will not append ``change`` now (None: it will).

        Helpers for an override: ``_committed_in_term``, ``_conf_history``,
        ``check_change(conf, change)``.
        """
        if not self._committed_in_term:
            return "no entry of this leader's term is committed yet"
        if self._conf_history.latest_index > self._log.committed:
            return "an earlier configuration change is not committed yet"
        return check_change(self._conf_history.latest, change)

    # ------------------------------------------------------------------
    # Role changes
    # ------------------------------------------------------------------

    def _apply_conf(self, conf: ConfState) -> None:
        """Switch to ``conf``: the one place the configuration in force changes."""
        voter_set = frozenset(conf.voters)
        self._voters = tuple(conf.voters)
        self._voter_set = voter_set
        self._learners = tuple(n for n in conf.learners if n not in voter_set)
        self._quorum = majority(self._voters)
        # A (pre-)candidate's configuration changes only through a leader's message, which
        # makes it a follower first; a leader's only through its own proposals.
        if self._role is Role.LEADER:
            self._sync_progress()
        else:
            self._role = Role.FOLLOWER if self._id in voter_set else Role.LEARNER

    def _sync_progress(self) -> None:
        """A leader's configuration changed: track new members, count with the new quorum.

        A member that left keeps its progress (and keeps receiving the log) until
        the change that removed it commits, so that it can learn of its removal.
        """
        progress = self._progress
        next_index = self._log.last_index() + 1
        max_inflight = self._cfg.max_inflight
        for peer in (*self._voters, *self._learners):
            pr = progress.get(peer)
            if pr is None:
                progress[peer] = Progress(next_index, max_inflight, is_learner=True)
        voters = self._voter_set
        for peer, pr in progress.items():
            pr.is_learner = peer not in voters
        # (No transfer can be under way: proposals, this one too, wait until it is over.)
        if self._maybe_commit():  # fewer voters may already hold a quorum
            self._on_commit_advanced()

    def _check_committed_conf(self) -> None:
        """Configurations up to the commit index are committed: note removals, prune, step down."""
        committed = self._log.committed
        me = self._id
        for index, conf in self._conf_history.since(self._conf_checked):
            if index > committed:
                break
            if includes(conf, me):
                self._was_member = True
            elif self._was_member:
                self._removed = True
        self._conf_checked = committed
        if self._role is not Role.LEADER or self._conf_history.latest_index > committed:
            return
        if me not in self._voter_set:
            self._step_down_removed()
            return
        members = self._voter_set.union(self._learners)
        for peer in [p for p in self._progress if p != me and p not in members]:
            self._send_farewell(peer, self._progress.pop(peer))

    def _send_farewell(self, peer: NodeId, pr: Progress) -> None:
        """A member's removal committed: send it the log from its match on, with the commit.

        Best effort (it may be lost, or the entries compacted): it lets the member
        see its own removal committed, and so stop campaigning and report ``removed``.
        """
        log = self._log
        try:
            prev_term = log.term(pr.match)
            entries = log.entries(pr.match + 1, log.last_index() + 1, self._cfg.max_entries_bytes)
        except (LogCompacted, LogUnavailable):
            return
        self._send(
            AppendEntries(
                group=self._group,
                term=self._term,
                src=self._id,
                dst=peer,
                prev_index=pr.match,
                prev_term=prev_term,
                entries=tuple(entries),
                commit=log.committed,
            )
        )

    def _step_down_removed(self) -> None:
        """Our own removal committed: hand over to the most caught-up voter and step down."""
        last = self._log.last_index()
        best = max(
            (p for p in self._voters if p in self._progress),
            key=lambda p: self._progress[p].match,
            default=None,
        )
        if best is not None and self._progress[best].match == last:
            self._send_timeout_now(best)
        self._flush()  # the commit news, so that the others learn the removal took effect
        self._become_follower(self._term, None)

    def _soft_state(self) -> SoftState:
        return SoftState(self._role, self._leader, self._term)

    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        low, high = self.election_timeout_range()
        self._randomized_timeout = self._rng.randrange(low, high)
        self._votes = {}
        self._lead_transferee = None
        self._read_only.clear()
        self._reads_waiting_commit.clear()
        self._pending_append.clear()
        self._append_all = self._commit_bcast = self._heartbeat_due = False

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        self._reset(term)
        self._leader = leader
        self._role = Role.FOLLOWER if self._id in self._voter_set else Role.LEARNER
        self._progress = {}

    def _campaign(self, pre_vote: bool, transfer: bool = False) -> None:
        if pre_vote:
            self._reset(self._term)
            self._role = Role.PRE_CANDIDATE
            vote_term = self._term + 1
        else:
            self._reset(self._term + 1)
            self._role = Role.CANDIDATE
            self._vote = self._id
            vote_term = self._term
        self._votes[self._id] = True
        if vote_result(self._voters, self._votes) is VoteResult.WON:
            self._won_election(pre_vote)
            return
        log = self._log
        last_index = log.last_index()
        last_term = log.last_term()
        for peer in self._voters:
            if peer != self._id:
                self._send(
                    VoteRequest(
                        group=self._group,
                        term=vote_term,
                        src=self._id,
                        dst=peer,
                        last_log_index=last_index,
                        last_log_term=last_term,
                        pre_vote=pre_vote,
                        transfer=transfer,
                    )
                )

    def _won_election(self, pre_vote: bool) -> None:
        if pre_vote:
            self._campaign(pre_vote=False)
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        self._in_round = False
        self._reset(self._term)
        self._role = Role.LEADER
        self._leader = self._id
        self._committed_in_term = False
        log = self._log
        next_index = log.last_index() + 1
        max_inflight = self._cfg.max_inflight
        voters = self._voter_set
        self._progress = {
            peer: Progress(next_index, max_inflight, is_learner=peer not in voters)
            for peer in (*self._voters, *self._learners)
        }
        me = self._progress[self._id]  # only a voter campaigns
        # Only what is already on our disk counts; the rest counts as advance() reports it.
        me.match = log.durable_index()
        me.recent_active = True
        # Raft 8: a no-op of our own term lets us commit (and learn) what earlier terms left.
        self._append_entry(b"")

    def _in_lease(self) -> bool:
        """Whether we heard from a live leader within the election timeout (check-quorum lease)."""
        return (
            self._cfg.check_quorum
            and self._leader is not None
            # As widened as our own timeout: while we would not stand, nor may others.
            and self._election_elapsed < self._cfg.election_ticks << self._failed_rounds
        )

    # ------------------------------------------------------------------
    # Timers
    # ------------------------------------------------------------------

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._id in self._voter_set and self._election_elapsed >= self._randomized_timeout:
            if self._in_round:
                # The last round (ours, or one we voted in) reached others but ended without
                # a leader: widen the range the next timeouts are drawn from, so that members
                # whose rounds keep colliding, or keep running out before slow votes arrive,
                # spread out. A round that reached nobody (we are cut off) widens nothing:
                # the timeouts after the heal must still be short.
                self._failed_rounds = min(self._failed_rounds + 1, self._cfg.max_backoff_doublings)
                self._steady_ticks = 0
                self._in_round = False
            self._campaign(pre_vote=self._cfg.pre_vote)
        elif self._leader is not None:
            self._narrow_back_off()

    def _narrow_back_off(self) -> None:
        """One tick with a leader: after ``NARROW_AFTER`` of its base timeouts in a row,
        the back-off narrows by one doubling. Not at once: on a lossy network the leader
        a round found is heard late now and then, and the configured timeout would give
        it up again, round after round (terms 4 to 16 in 20 s at 30 % packet loss)."""
        if not self._failed_rounds:
            return
        self._steady_ticks += 1
        if self._steady_ticks >= NARROW_AFTER * (self._cfg.election_ticks << self._failed_rounds):
            self._steady_ticks = 0
            self._failed_rounds -= 1
            if self._role is not Role.LEADER:
                low, high = self.election_timeout_range()
                self._randomized_timeout = self._rng.randrange(low, high)

    def _tick_leader(self) -> None:
        self._election_elapsed += 1
        self._heartbeat_elapsed += 1
        cfg = self._cfg
        self._narrow_back_off()
        # Give followers as long to answer as they give us: the same widened timeout.
        if self._election_elapsed >= cfg.election_ticks << self._failed_rounds:
            self._election_elapsed = 0
            if cfg.check_quorum:
                if not self._quorum_active():
                    self._become_follower(self._term, None)
                    return
                for peer, pr in self._progress.items():
                    if peer != self._id:
                        pr.recent_active = False
            self._lead_transferee = None  # a transfer that has not happened by now is abandoned
        if self._heartbeat_elapsed >= cfg.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._heartbeat_due = True

    def _quorum_active(self) -> bool:
        active = 0
        for voter in self._voters:
            if voter == self._id:
                active += 1
            else:
                pr = self._progress.get(voter)
                if pr is not None and pr.recent_active:
                    active += 1
        return active >= self._quorum

    # ------------------------------------------------------------------
    # Message handlers
    # ------------------------------------------------------------------

    def _send(self, msg: Message) -> None:
        self._msgs.append(msg)

    def _on_stale_term(self, msg: Message) -> None:
        """A message from an older term. Answer only where that helps its sender catch up."""
        if isinstance(msg, AppendEntries):
            # Figure 2: reply false, with our term, so a deposed leader steps down. Under
            # check-quorum it may never see a higher-term vote (we refuse those in lease).
            self._send_append_response(msg.src, reject=True, index=msg.prev_index)
        elif isinstance(msg, (Heartbeat, InstallSnapshot)):
            self._send(
                HeartbeatResponse(group=self._group, term=self._term, src=self._id, dst=msg.src)
            )
        elif isinstance(msg, VoteRequest) and msg.pre_vote:
            self._send(
                VoteResponse(
                    group=self._group,
                    term=self._term,
                    src=self._id,
                    dst=msg.src,
                    granted=False,
                    pre_vote=True,
                )
            )

    def _on_vote_request(self, m: VoteRequest) -> None:
        # Whatever our own configuration says, we answer: a candidate counts only the
        # voters of its configuration, and one that lists us may know of a promotion we
        # have not seen yet (refusing could leave the cluster leaderless). Only a member
        # whose removal is committed is sure never to be needed again.
        can_vote = not self._removed and (
            self._vote == m.src
            or (self._vote is None and self._leader is None)
            or (m.pre_vote and m.term > self._term)
        )
        granted = can_vote and self._log_is_up_to_date(m.last_log_index, m.last_log_term)
        if granted:
            self._in_round = True
        if granted and not m.pre_vote:
            self._vote = m.src
            self._election_elapsed = 0
        elif granted and self._role is Role.FOLLOWER:
            # A follower that would vote for this candidate holds its own campaign for one
            # randomized timeout, long enough for the candidate's real election to end.
            # Otherwise every follower whose timer fires within one pre-vote round trip of
            # another's also wins its pre-vote, they all stand, and with four or more
            # voters the votes can split round after round when latency is a sizeable
            # part of the election timeout. The leader is forgotten too: we judged it
            # gone, and keeping it would make the restarted timer look like its lease.
            self._leader = None
            self._election_elapsed = 0
        self._send(
            VoteResponse(
                group=self._group,
                # A granted pre-vote answers in the term it was asked about.
                term=m.term if granted and m.pre_vote else self._term,
                src=self._id,
                dst=m.src,
                granted=granted,
                pre_vote=m.pre_vote,
            )
        )

    def _on_vote_response(self, m: VoteResponse) -> None:
        role = self._role
        if m.pre_vote:
            if role is not Role.PRE_CANDIDATE:
                return
        elif role is not Role.CANDIDATE:
            return
        self._in_round = True  # our round reached someone
        self._votes.setdefault(m.src, m.granted)
        result = vote_result(self._voters, self._votes)
        if result is VoteResult.WON:
            self._won_election(m.pre_vote)
        elif result is VoteResult.LOST:
            self._become_follower(self._term, None)

    def _follow(self, m: AppendEntries | Heartbeat | InstallSnapshot) -> bool:
        """What every leader message at our term does first: accept the leader, reset the timer."""
        role = self._role
        if role is Role.LEADER:
            return False  # two leaders in one term cannot happen; drop it
        if role is Role.CANDIDATE or role is Role.PRE_CANDIDATE:
            self._become_follower(self._term, m.src)
        else:
            self._leader = m.src
        self._election_elapsed = 0
        self._in_round = False
        return True

    def _on_append_entries(self, m: AppendEntries) -> None:
        if not self._follow(m):
            return
        log = self._log
        if m.prev_index < log.committed:
            # Everything up to our commit matches the leader already (and may be compacted).
            self._send_append_response(m.src, reject=False, index=log.committed)
            return
        appended = log.maybe_append(m.prev_index, m.prev_term, m.commit, m.entries)
        if appended is not None:
            last_new, written_from = appended
            if written_from:
                self._log_rewritten(written_from, m.entries)
            self._send_append_response(m.src, reject=False, index=last_new)
            return
        last = log.last_index()
        if m.prev_index > last:
            hint_index, hint_term = last, 0
        else:
            hint_index, hint_term = log.find_conflict_by_term(m.prev_index, m.prev_term)
        self._send_append_response(
            m.src, reject=True, index=m.prev_index, hint_index=hint_index, hint_term=hint_term
        )

    def _log_rewritten(self, first: int, entries: tuple[Entry, ...]) -> None:
        """Our log holds ``entries`` from index ``first`` on: follow the configurations in them."""
        history = self._conf_history
        changed = history.latest_index >= first and history.truncate(first)
        conf = history.latest
        for entry in entries[first - entries[0].index :]:
            if entry.kind is EntryKind.CONF_CHANGE:
                new = conf_after_entry(conf, entry)
                if new is not None:
                    history.push(entry.index, new)
                    conf = new
                    changed = True
        if changed:
            self._apply_conf(conf)

    def _send_append_response(
        self, to: NodeId, reject: bool, index: int, hint_index: int = 0, hint_term: int = 0
    ) -> None:
        self._send(
            AppendEntriesResponse(
                group=self._group,
                term=self._term,
                src=self._id,
                dst=to,
                reject=reject,
                index=index,
                hint_index=hint_index,
                hint_term=hint_term,
            )
        )

    def _on_heartbeat(self, m: Heartbeat) -> None:
        if not self._follow(m):
            return
        # The leader sends min(commit, our match), which we are known to hold.
        self._log.commit_to(m.commit)
        self._send(
            HeartbeatResponse(
                group=self._group, term=self._term, src=self._id, dst=m.src, ctx=m.ctx
            )
        )

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        if self._role is Role.LEADER or self._id not in self._voter_set:
            return
        # The leader asked for it: skip pre-vote and tell voters to ignore their lease.
        self._campaign(pre_vote=False, transfer=True)

    def _on_read_index_request(self, m: ReadIndexRequest) -> None:
        if self._role is Role.LEADER:
            self._leader_read(m.ctx, m.src)
        else:
            self._send(
                ReadIndexResponse(
                    group=self._group, term=self._term, src=self._id, dst=m.src, ctx=m.ctx, index=0
                )
            )

    def _on_read_index_response(self, m: ReadIndexResponse) -> None:
        # index 0 is a refusal; reporting it as ReadState(ctx, 0) would invite a stale read.
        if m.index > 0 and self._role is not Role.LEADER:
            self._read_states.append(ReadState(m.ctx, m.index))

    # -- snapshots, follower side ---------------------------------------

    def _on_install_snapshot(self, m: InstallSnapshot) -> None:
        if not self._follow(m):
            return
        log = self._log
        meta = m.meta
        end = m.offset + len(m.data)
        if meta.index <= log.committed:
            # Already covered (a retransmission after we installed it): report done.
            self._snap_receipt = None
            self._send_snapshot_response(m.src, log.committed, end)
            return
        receipt = self._snap_receipt
        same = (
            receipt is not None
            and receipt.src == m.src
            and receipt.term == m.term
            and receipt.meta == meta
        )
        if m.offset == 0:
            if receipt is not None and same and receipt.size > 0:
                self._send_snapshot_response(m.src, meta.index, receipt.size)
                return
            receipt = self._snap_receipt = _SnapshotReceipt(m.src, m.term, meta, [])
        elif receipt is None or not same or m.offset > receipt.size:
            self._snap_receipt = None
            self._send_snapshot_response(m.src, meta.index, 0, reject=True)
            return
        elif m.offset < receipt.size:
            self._send_snapshot_response(m.src, meta.index, receipt.size)
            return
        receipt.chunks.append(m.data)
        receipt.size = end
        if not m.done:
            self._send_snapshot_response(m.src, meta.index, end)
            return
        self._snap_receipt = None
        if log.match_term(meta.index, meta.term):
            # Our log already holds the snapshot's last entry: just fast-forward the commit.
            log.commit_to(meta.index)
        else:
            committed = log.committed
            log.restore(Snapshot(meta, b"".join(receipt.chunks)))
            history = self._conf_history
            conf = meta.conf if meta.conf.voters else history.latest
            # Keep the committed part: the runtime may still be applying (and taking
            # snapshots of) committed entries handed out before this snapshot.
            history.truncate(committed + 1)
            history.push(meta.index, conf)
            self._apply_conf(conf)
        self._send_snapshot_response(m.src, meta.index, end)

    def _send_snapshot_response(
        self, to: NodeId, index: int, next_offset: int, reject: bool = False
    ) -> None:
        self._send(
            InstallSnapshotResponse(
                group=self._group,
                term=self._term,
                src=self._id,
                dst=to,
                index=index,
                next_offset=next_offset,
                reject=reject,
            )
        )

    # -- leader side ------------------------------------------------------

    def _follower(self, peer: NodeId) -> Progress | None:
        if self._role is not Role.LEADER or peer == self._id:
            return None
        return self._progress.get(peer)

    def _on_append_response(self, m: AppendEntriesResponse) -> None:
        pr = self._follower(m.src)
        if pr is None:
            return
        pr.recent_active = True
        log = self._log
        if m.reject:
            if not self._accept_rejection(pr, m):
                return
            self._pending_append.add(m.src)
            return
        if m.index > log.last_index():
            return  # acknowledges entries we never had: not from our term
        if not pr.maybe_update(m.index):
            if pr.state is ProgressState.PROBE and m.index == pr.next - 1 == pr.match:
                # An empty probe confirmed where the follower's log ends: start streaming.
                pr.become_replicate()
                self._pending_append.add(m.src)
            return
        state = pr.state
        if state is ProgressState.PROBE:
            pr.become_replicate()
        elif state is ProgressState.SNAPSHOT:
            if pr.match >= pr.pending_snapshot:
                pr.become_replicate()
        else:
            pr.free_to(m.index)
        if self._maybe_commit():
            self._on_commit_advanced()
        self._pending_append.add(m.src)
        if m.src == self._lead_transferee and pr.match == log.last_index():
            self._send_timeout_now(m.src)

    def _accept_rejection(self, pr: Progress, m: AppendEntriesResponse) -> bool:
        """Move ``next`` back after a rejection, skipping a whole conflicting term at once."""
        rejected = m.index
        if pr.state is ProgressState.REPLICATE:
            if rejected <= pr.match:
                return False  # stale: we know it matches there
        elif pr.state is ProgressState.PROBE:
            if rejected != pr.next - 1:
                return False  # an answer to an older probe
        else:
            return False
        if m.hint_term > 0:
            probe, _ = self._log.find_conflict_by_term(m.hint_index, m.hint_term)
        else:
            probe = m.hint_index
        new_next = max(min(rejected, probe + 1), pr.match + 1)
        pr.become_probe()
        pr.next = new_next
        return True

    def _on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self._follower(m.src)
        if pr is None:
            return
        pr.recent_active = True
        pr.probe_sent = False
        if pr.match < self._log.last_index():
            if pr.match == pr.hb_match:
                pr.stall += 1
            else:
                pr.hb_match = pr.match
                pr.stall = 0
            if pr.stall >= STALL_ROUNDS:
                # Nothing we sent has been acknowledged for several round trips: assume
                # it was lost and start again from what the follower surely has.
                pr.stall = 0
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                elif pr.state is ProgressState.SNAPSHOT:
                    pr.snap_need_send = True
            self._pending_append.add(m.src)
        else:
            pr.stall = 0
            if m.src == self._lead_transferee:
                self._send_timeout_now(m.src)  # the first one may have been lost
        voters = self._voter_set
        if m.ctx and m.src in voters:
            acks = self._read_only.ack(m.ctx, m.src)
            # Only voters of the configuration in force count, the leader too if it is one.
            count = sum(1 for v in acks if v in voters) + (1 if self._id in voters else 0)
            if count >= self._quorum:
                for req in self._read_only.confirm(m.ctx):
                    self._deliver_read(req.ctx, req.index, req.requester)

    def _on_install_snapshot_response(self, m: InstallSnapshotResponse) -> None:
        pr = self._follower(m.src)
        if pr is None:
            return
        pr.recent_active = True
        snap = pr.snapshot
        if pr.state is not ProgressState.SNAPSHOT or snap is None:
            return
        if m.reject:
            pr.snap_offset = 0
            pr.snap_need_send = True
        elif m.index >= snap.meta.index and (
            m.next_offset >= len(snap.data) or m.index > snap.meta.index
        ):
            # Installed, or the follower's commit already covers the snapshot.
            if m.index <= self._log.last_index():
                pr.maybe_update(m.index)
            pr.become_probe()
        elif m.index == snap.meta.index and m.next_offset > pr.snap_offset:
            pr.snap_offset = m.next_offset
            pr.snap_need_send = True
            pr.stall = 0
        else:
            return
        self._pending_append.add(m.src)

    def _send_timeout_now(self, to: NodeId) -> None:
        self._send(TimeoutNow(group=self._group, term=self._term, src=self._id, dst=to))

    # ------------------------------------------------------------------
    # Leader machinery
    # ------------------------------------------------------------------

    def _append_entry(self, data: bytes, kind: EntryKind = EntryKind.NORMAL) -> int:
        """Append to the leader's log; its own copy counts once advance() says it is durable."""
        log = self._log
        index = log.last_index() + 1
        log.append(Entry(index, self._term, data, kind))
        self._append_all = True
        return index

    def _quorum_match_index(self) -> int:
        """The highest index a quorum of voters holds (leader only)."""
        progress = self._progress
        return quorum_index(
            self._voters, {v: progress[v].match for v in self._voters if v in progress}
        )

    def _on_commit_advanced(self) -> None:
        self._commit_bcast = True
        log = self._log
        if not self._committed_in_term and log.term_or_none(log.committed) == self._term:
            self._committed_in_term = True
            waiting = self._reads_waiting_commit
            self._reads_waiting_commit = []
            for ctx, requester in waiting:
                self._leader_read(ctx, requester)

    def _leader_read(self, ctx: bytes, requester: NodeId) -> None:
        commit = self._log.committed
        if not self._committed_in_term:
            # Until an entry of our term commits, our commit index may lag the cluster's
            # (even a lone voter's: it commits only what its disk confirmed).
            self._reads_waiting_commit.append((ctx, requester))
        elif self._quorum == 1 and self._id in self._voter_set:
            self._deliver_read(ctx, commit, requester)
        elif self._read_only.add(ctx, commit, requester):
            self._heartbeat_due = True

    def _deliver_read(self, ctx: bytes, index: int, requester: NodeId) -> None:
        if requester == self._id:
            self._read_states.append(ReadState(ctx, index))
        else:
            self._send(
                ReadIndexResponse(
                    group=self._group,
                    term=self._term,
                    src=self._id,
                    dst=requester,
                    ctx=ctx,
                    index=index,
                )
            )

    def _flush(self) -> None:
        """Turn the pending sends of a leader into messages (coalescing proposals)."""
        if self._role is not Role.LEADER:
            return
        if self._heartbeat_due:
            self._heartbeat_due = False
            self._broadcast_heartbeat()
        append_all = self._append_all
        commit = self._commit_bcast
        pending = self._pending_append
        if not (append_all or commit or pending):
            return
        everyone = append_all or commit
        for peer, pr in self._progress.items():
            if peer != self._id and (everyone or peer in pending):
                self._send_appends(peer, pr, send_empty=commit)
        self._append_all = self._commit_bcast = False
        pending.clear()

    def _broadcast_heartbeat(self) -> None:
        ctx = self._read_only.last_ctx()
        commit = self._log.committed
        for peer, pr in self._progress.items():
            if peer != self._id:
                self._send(
                    Heartbeat(
                        group=self._group,
                        term=self._term,
                        src=self._id,
                        dst=peer,
                        commit=min(commit, pr.match),
                        ctx=ctx,
                    )
                )

    def _send_appends(self, peer: NodeId, pr: Progress, send_empty: bool) -> None:
        if pr.state is ProgressState.SNAPSHOT:
            if pr.snap_need_send:
                self._send_snapshot_chunk(peer, pr)
            return
        if not self._send_append(peer, pr, send_empty):
            return
        last = self._log.last_index()
        # Pipeline the rest of a long backlog, up to the in-flight window.
        while pr.state is ProgressState.REPLICATE and pr.next <= last and not pr.is_paused():
            if not self._send_append(peer, pr, False):
                break

    def _send_append(self, peer: NodeId, pr: Progress, send_empty: bool) -> bool:
        if pr.is_paused():
            return False
        log = self._log
        last = log.last_index()
        if pr.next > last and pr.state is ProgressState.REPLICATE:
            if not send_empty:
                return False
            # Commit news only. Anchor it at match, which the follower surely holds, so
            # that it cannot be refused while our earlier appends are still in flight.
            anchor_term = log.term_or_none(pr.match)
            if anchor_term is None:
                return False  # compacted: the next heartbeat carries the commit instead
            self._send(
                AppendEntries(
                    group=self._group,
                    term=self._term,
                    src=self._id,
                    dst=peer,
                    prev_index=pr.match,
                    prev_term=anchor_term,
                    entries=(),
                    commit=log.committed,
                )
            )
            return True
        prev_index = pr.next - 1
        try:
            prev_term = log.term(prev_index)
            entries = (
                log.entries(pr.next, last + 1, self._cfg.max_entries_bytes)
                if pr.next <= last
                else []
            )
        except LogCompacted:
            return self._start_snapshot(peer, pr)
        except LogUnavailable:
            pr.next = last + 1  # beyond our log: only a confused ack leads here
            return False
        self._send(
            AppendEntries(
                group=self._group,
                term=self._term,
                src=self._id,
                dst=peer,
                prev_index=prev_index,
                prev_term=prev_term,
                entries=tuple(entries),
                commit=log.committed,
            )
        )
        if entries:
            pr.sent_entries(entries[-1].index)
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _start_snapshot(self, peer: NodeId, pr: Progress) -> bool:
        snap = self._log.snapshot()
        if snap is None:
            return False
        pr.become_snapshot(snap)
        self._send_snapshot_chunk(peer, pr)
        return True

    def _send_snapshot_chunk(self, peer: NodeId, pr: Progress) -> None:
        snap = pr.snapshot
        if snap is None:
            return
        data = snap.data
        offset = min(pr.snap_offset, len(data))
        end = min(offset + self._cfg.snapshot_chunk_bytes, len(data))
        pr.snap_need_send = False
        self._send(
            InstallSnapshot(
                group=self._group,
                term=self._term,
                src=self._id,
                dst=peer,
                meta=snap.meta,
                offset=offset,
                data=data[offset:end],
                done=end >= len(data),
            )
        )


def _sort_messages(pending: list[Message]) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """(after persisting, at once), for a member whose term and vote are durable (types.py)."""
    later: list[Message] = []
    now: list[Message] = []
    for m in pending:
        kind = type(m)
        if kind in _SEND_NOW or (
            (kind is VoteRequest or kind is VoteResponse) and m.pre_vote  # type: ignore[union-attr]
        ):
            now.append(m)
        else:
            later.append(m)
    return tuple(later), tuple(now)


def _replay_conf_changes(storage: LogStorage, base_conf: ConfState) -> ConfHistory:
    """The configuration history at start-up: the snapshot's, then each change logged after it."""
    snap = storage.snapshot()
    base = snap.meta.index if snap is not None else 0
    history = ConfHistory(base, base_conf)
    conf = base_conf
    lo = max(base + 1, storage.first_index())
    last = storage.last_index()
    while lo <= last:
        batch = storage.entries(lo, last + 1, 1 << 20)
        for entry in batch:
            if entry.kind is EntryKind.CONF_CHANGE:
                new = conf_after_entry(conf, entry)
                if new is not None:
                    history.push(entry.index, new)
                    conf = new
        lo = batch[-1].index + 1
    return history
