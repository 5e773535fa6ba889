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

Rooms
-----
``RaftNode`` keeps the state, the inputs, ``ready``/``advance`` and the
configuration; what a message or a tick does depends on the role, and
``roles.RULES[role]`` says it (one step function per role, as etcd-io/raft
swaps its ``step``), looked up after the term rules above. The leader's half is
leader.py, the follower's follower.py, elections election.py; they see the node
as a ``member.RaftMember``. Voters, learners, the quorum, the leader's progress
per member and the vote tally are ``tracker.ProgressTracker``'s.

Test seams: ``_maybe_commit``, ``_quorum_match_index``, ``_log_is_up_to_date``,
``_on_higher_term``, ``_hard_state``, ``_refuse_conf_change`` and
``election_timeout_range`` are small methods that the real logic (in every
role room too) calls on the node; the simulator's bug-injection tests override
them in subclasses.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from dlm.compiled import mypyc_attr
from dlm.node.raft.config import Config as Config  # noqa: PLC0414 (re-exported)
from dlm.node.raft.follower import NARROW_AFTER as NARROW_AFTER  # noqa: PLC0414 (re-exported)
from dlm.node.raft.follower import answer_stale_term, in_lease
from dlm.node.raft.leader import (
    after_committed_conf,
    append_entry,
    flush,
    leader_read,
    on_commit_advanced,
    send_timeout_now,
)
from dlm.node.raft.log import RaftLog
from dlm.node.raft.member import SnapshotReceipt
from dlm.node.raft.membership import (
    ConfHistory,
    apply_change,
    check_change,
    conf_after_entry,
    includes,
)
from dlm.node.raft.progress import ProgressState
from dlm.node.raft.read_only import ReadOnly
from dlm.node.raft.roles import RULES
from dlm.node.raft.tracker import ProgressTracker
from dlm.node.raft.types import (
    MESSAGE_TYPES,
    AppendEntries,
    ConfChangeRefused,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
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
    EntryKind,
    HardState,
    LogStorage,
    NodeId,
    encode_conf_change,
)


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
    conf_pending: bool = False
    """The latest configuration change in the log is not committed yet."""


_LEADER_MESSAGES = (AppendEntries, Heartbeat, InstallSnapshot)

_KNOWN_MESSAGES = frozenset(MESSAGE_TYPES)

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


# The simulator's mutants are interpreted subclasses of the compiled class.
@mypyc_attr(allow_interpreted_subclasses=True)
def _sends_pending(node: RaftNode) -> bool:
    """A leader has sends that ``flush`` has not turned into messages yet."""
    return bool(
        node._append_all or node._commit_bcast or node._heartbeat_due or node._pending_append
    )


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
        "_log",
        "_msgs",
        "_pending_append",
        "_prev_hard",
        "_prev_soft",
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
        "_tracker",
        "_unadvanced",
        "_vote",
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
        self._tracker = ProgressTracker()
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
        self._snap_receipt: SnapshotReceipt | None = None
        self._append_all = False
        self._commit_bcast = False
        self._heartbeat_due = False
        self._pending_append: set[NodeId] = set()
        self._become_follower(self._term, None)
        self._check_committed_conf()
        self._prev_hard = hard
        self._prev_soft = SoftState(self._role, self._leader, self._term)

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
        return self._tracker.voters

    @property
    def learners(self) -> tuple[NodeId, ...]:
        return self._tracker.learners

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

    def term_at(self, index: int) -> int:
        """The term of the entry at log ``index`` (from the compaction point on): what a
        snapshot or backup taken there records."""
        return self._log.term(index)

    # ------------------------------------------------------------------
    # Inputs
    # ------------------------------------------------------------------

    def tick(self) -> None:
        RULES[self._role].tick(self)

    def step(self, msg: Message) -> None:
        """Feed one message from a peer. Messages for another group or member are ignored."""
        if msg.group != self._group or msg.dst != self._id:
            return
        if type(msg) not in _KNOWN_MESSAGES:
            return
        term = msg.term
        if term > self._term:
            if isinstance(msg, VoteRequest):
                if not msg.transfer and in_lease(self):
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
            answer_stale_term(self, msg)
            return
        # Looked up after the term rules, which may have made us a follower.
        RULES[self._role].step(self, msg)
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
        return append_entry(self, data)

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
        index = append_entry(self, data, EntryKind.CONF_CHANGE)
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
            leader_read(self, ctx, self._id)
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
        if to == self._id or not self._tracker.is_voter(to) or self._lead_transferee == to:
            return None
        self._lead_transferee = to
        self._election_elapsed = 0  # the transfer's deadline
        pr = self._tracker.progress[to]
        if pr.match == self._log.last_index():
            send_timeout_now(self, to)
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
        RULES[self._role].unreachable(self, peer, gone)

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
        """The ticks the next election timeout is drawn from: [low, high).

        Failed rounds widen the range: rounds that keep colliding need their
        timeouts spread apart. A member that follows a leader also has its floor
        raised as far, so that on a lossy network a leader heard late now and then
        is not given up at the first late heartbeat. One with no leader keeps the
        configured floor: when the fault that failed the rounds heals, somebody
        must stand soon (with the floor raised, nobody stood for 8 election
        timeouts after a partition healed). The disk's latency raises the floor
        too: a round must outlast two fsyncs.
        """
        cfg = self._cfg
        width = cfg.election_ticks << self._failed_rounds
        floor = width if self._leader is not None else cfg.election_ticks
        low = floor + 2 * self._disk_ticks
        return low, low + width

    # ------------------------------------------------------------------
    # Output
    # ------------------------------------------------------------------

    def has_ready(self) -> bool:
        """Whether ``ready()`` has anything; a leader's pending sends become messages first
        (coalesced: every proposal since the last call rides in one append per follower)."""
        if self._role is Role.LEADER and _sends_pending(self):
            flush(self)
        return self.wants_ready()

    def wants_ready(self) -> bool:
        """``has_ready`` without its flush: True whenever ``has_ready`` would be (and also
        when a pending send turns out to make no message), so a runtime may ask it once
        per client frame and still send one append per follower for all of them."""
        if self._role is Role.LEADER and _sends_pending(self):
            return True
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
        if self._role is Role.LEADER and (
            self._append_all or self._commit_bcast or self._heartbeat_due or self._pending_append
        ):
            flush(self)
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
        return SoftState(self._role, self._leader, self._term)

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
            me = self._tracker.progress[self._id]
            durable = log.durable_index()
            if durable > me.match:
                # Our own copy now counts towards a quorum (section 10.2.1).
                me.match = durable
                if self._maybe_commit():
                    on_commit_advanced(self)
                    checked = self._conf_checked
                    if log.committed > checked and self._conf_history.latest_index > checked:
                        self._check_committed_conf()

    def status(self) -> RaftStatus:
        log = self._log
        progress: dict[NodeId, FollowerProgress] = {}
        if self._role is Role.LEADER:
            voters = self._tracker.voter_set
            progress = {
                peer: FollowerProgress(
                    match=pr.match,
                    next=pr.next,
                    recent_active=pr.recent_active,
                    snapshot_pending=pr.state is ProgressState.SNAPSHOT,
                    is_learner=peer not in voters,
                )
                for peer, pr in self._tracker.progress.items()
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
            voters=self._tracker.voters,
            learners=self._tracker.learners,
            removed=self._removed,
            progress=progress,
            conf_pending=self._conf_history.latest_index > log.committed,
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

    def _quorum_match_index(self) -> int:
        """Test seam. The highest index a quorum of voters holds (leader only)."""
        return self._tracker.quorum_match_index()

    # ------------------------------------------------------------------
    # Configuration and role changes
    # ------------------------------------------------------------------

    def _apply_conf(self, conf: ConfState) -> None:
        """Switch to ``conf``: the one place the configuration in force changes."""
        tracker = self._tracker
        tracker.apply_conf(conf)
        # A (pre-)candidate's configuration changes only through a leader's message, which
        # makes it a follower first; a leader's only through its own proposals.
        if self._role is Role.LEADER:
            # A member that left keeps its progress (and keeps receiving the log) until
            # the change that removed it commits, so that it can learn of its removal.
            tracker.track_members(self._log.last_index() + 1, self._cfg.max_inflight)
            # (No transfer can be under way: proposals, this one too, wait until it is over.)
            if self._maybe_commit():  # fewer voters may already hold a quorum
                on_commit_advanced(self)
        else:
            self._role = Role.FOLLOWER if tracker.is_voter(self._id) else Role.LEARNER

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
        if self._role is Role.LEADER and self._conf_history.latest_index <= committed:
            after_committed_conf(self)

    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        low, high = self.election_timeout_range()
        self._randomized_timeout = self._rng.randrange(low, high)
        self._tracker.votes = {}
        self._lead_transferee = None
        self._read_only.clear()
        self._reads_waiting_commit.clear()
        self._pending_append.clear()
        self._append_all = self._commit_bcast = self._heartbeat_due = False

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        self._reset(term)
        self._leader = leader
        self._role = Role.FOLLOWER if self._tracker.is_voter(self._id) else Role.LEARNER
        self._tracker.progress = {}

    def _send(self, msg: Message) -> None:
        self._msgs.append(msg)


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
