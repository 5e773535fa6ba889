"""The Raft protocol itself: one member's state machine, inputs in, a ``Ready`` batch out.

Theory of operation
-------------------
``RaftNode`` never performs IO. The runtime calls ``tick()``, ``step(msg)``
and the client entry points (``propose``, ``read_index``,
``transfer_leadership``); each only updates memory and queues work. The
runtime then takes that work with ``ready()``, persists, sends and applies it
(see types.py for the order), and acknowledges it with ``advance(ready)``.

Sends to followers are coalesced: a proposal only appends to the leader's log
and marks the followers dirty; the AppendEntries messages are built when the
runtime next calls ``has_ready()``/``ready()``, so every proposal made between
two ``ready()`` calls leaves in one message per follower.

Roles: FOLLOWER (or LEARNER for a non-voting member) -> PRE_CANDIDATE (asks
"would you vote for me?" without touching any term) -> CANDIDATE -> LEADER.
Any message with a higher term sends us back to FOLLOWER, except the vote
requests a follower ignores while it still hears from a live leader (the
check-quorum lease) and pre-vote traffic, which carries a future term.

Lost messages: a follower in probe mode gets its next probe when it answers
a heartbeat; a streaming follower whose acknowledgements stop while its
heartbeat answers keep coming (``STALL_ROUNDS`` of them) drops back to probe.
``report_unreachable`` does the same at once when the runtime knows a link broke.

Snapshots: when a follower needs an entry the leader has compacted, the leader
sends ``storage.snapshot()`` in ``snapshot_chunk_bytes`` chunks, one in flight
at a time. The follower acknowledges each chunk with the byte it wants next
(``InstallSnapshotResponse.index`` is the snapshot's index), asks for a restart
(``reject``) when a chunk does not fit what it holds, and on the last chunk
hands the whole image to the runtime as ``Ready.snapshot``; its final answer's
``index`` is the index its log now matches. Heartbeats go on meanwhile.

Membership changes are a later issue: voters and learners are fixed at
construction (or by an installed snapshot). ``_set_membership`` is the one
place that changes them, and ``quorum.py`` the one place that counts them.

Test seams: ``_maybe_commit``, ``_log_is_up_to_date``, ``_on_higher_term`` and
``_hard_state`` are small protected methods that the real logic calls;
the simulator's bug-injection tests override them in subclasses.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlm.node.raft.log import RaftLog
from dlm.node.raft.progress import Progress, ProgressState
from dlm.node.raft.quorum import VoteResult, majority, quorum_index, vote_result
from dlm.node.raft.read_only import ReadOnly
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    ConfState,
    Entry,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    LogCompacted,
    LogStorage,
    LogUnavailable,
    Message,
    NodeId,
    NotLeader,
    ReadIndexRequest,
    ReadIndexResponse,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

STALL_ROUNDS = 3
"""Heartbeat answers without progress after which the leader assumes its appends were lost."""


@dataclass(frozen=True, slots=True)
class Config:
    id: NodeId
    voters: tuple[NodeId, ...]
    """Bootstrap membership, used only when storage.initial_state() has an empty ConfState."""
    group: int = 0
    election_ticks: int = 10
    """Followers time out after a random draw from [election_ticks, 2 * election_ticks)."""
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
    progress: dict[NodeId, FollowerProgress] = field(default_factory=dict)
    """Per-member replication state (including the leader itself); empty unless leader."""


@dataclass(slots=True)
class _SnapshotReceipt:
    """A snapshot a follower is reassembling from chunks."""

    src: NodeId
    term: int
    meta: SnapshotMeta
    chunks: list[bytes]
    size: int = 0


_LEADER_MESSAGES = (AppendEntries, Heartbeat, InstallSnapshot)


class RaftNode:
    """One Raft member. Not thread-safe: one runtime task owns it."""

    __slots__ = (
        "_append_all",
        "_cfg",
        "_commit_bcast",
        "_committed_in_term",
        "_dispatch",
        "_election_elapsed",
        "_group",
        "_heartbeat_due",
        "_heartbeat_elapsed",
        "_id",
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
        "_rng",
        "_role",
        "_snap_receipt",
        "_term",
        "_vote",
        "_voter_set",
        "_voters",
        "_votes",
    )

    def __init__(self, config: Config, storage: LogStorage, rng: random.Random) -> None:
        config.validate()
        self._cfg = config
        self._id = config.id
        self._group = config.group
        self._rng = rng
        self._log = RaftLog(storage)
        hard, conf = storage.initial_state()
        self._voters: tuple[NodeId, ...] = ()
        self._voter_set: frozenset[NodeId] = frozenset()
        self._learners: tuple[NodeId, ...] = ()
        self._quorum = 1
        if conf.voters:
            self._set_membership(conf)
        else:
            self._set_membership(ConfState(voters=config.voters, learners=conf.learners))

        log = self._log
        # A lazily persisted commit may lag the snapshot; it never exceeds the log.
        log.committed = min(max(hard.commit, log.committed), log.last_index())
        self._term = hard.term
        self._vote: NodeId | None = hard.vote
        self._leader: NodeId | None = None
        self._role = Role.FOLLOWER
        self._votes: dict[NodeId, bool] = {}
        self._progress: dict[NodeId, Progress] = {}
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
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
    def lead_transferee(self) -> NodeId | None:
        return self._lead_transferee

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

    def propose(self, data: bytes) -> int | NotLeader:
        """Append a command to the leader's log; returns the index it will commit at, if it does."""
        if self._role is not Role.LEADER:
            return NotLeader(self._leader)
        if self._lead_transferee is not None:
            return NotLeader(self._lead_transferee)
        index = self._append_entry(data)
        if self._quorum == 1 and self._maybe_commit():
            self._on_commit_advanced()
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

    def report_unreachable(self, peer: NodeId) -> None:
        """The runtime lost its link to ``peer``: stop pipelining to it until it answers again."""
        if self._role is not Role.LEADER or peer == self._id:
            return
        pr = self._progress.get(peer)
        if pr is not None and pr.state is ProgressState.REPLICATE:
            pr.become_probe()

    # ------------------------------------------------------------------
    # Output
    # ------------------------------------------------------------------

    def has_ready(self) -> bool:
        if self._append_all or self._commit_bcast or self._heartbeat_due or self._pending_append:
            self._flush()
        if self._msgs or self._read_states or self._log.has_work():
            return True
        return self._changed_hard_state() is not None or self._changed_soft_state() is not None

    def ready(self) -> Ready:
        """Take the work accumulated since the last call; see types.Ready for what to do with it.

        Each piece of work is handed out once, so ``step``/``tick``/``ready`` may go on
        while an earlier Ready is being persisted; ``advance`` it when it is done.
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
        if self._msgs:
            msgs = tuple(self._msgs)
            self._msgs = []
        reads: tuple[ReadState, ...] = ()
        if self._read_states:
            reads = tuple(self._read_states)
            self._read_states = []
        return Ready(
            hard_state=hard,
            entries=entries or (),
            snapshot=snapshot,
            messages=msgs,
            committed=committed or (),
            read_states=reads,
            soft_state=soft,
        )

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
        """The runtime persisted, sent and applied ``ready``."""
        log = self._log
        if ready.snapshot is not None:
            log.stable_snap_to(ready.snapshot.meta.index)
            log.applied_to(ready.snapshot.meta.index)
        if ready.entries:
            last = ready.entries[-1]
            log.stable_to(last.index, last.term)
        if ready.committed:
            log.applied_to(ready.committed[-1].index)

    def status(self) -> RaftStatus:
        log = self._log
        progress: dict[NodeId, FollowerProgress] = {}
        if self._role is Role.LEADER:
            progress = {
                peer: FollowerProgress(
                    match=pr.match,
                    next=pr.next,
                    recent_active=pr.recent_active,
                    snapshot_pending=pr.state is ProgressState.SNAPSHOT,
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

    # ------------------------------------------------------------------
    # Role changes
    # ------------------------------------------------------------------

    def _set_membership(self, conf: ConfState) -> None:
        """The one place membership changes (today: construction and snapshot install)."""
        self._voters = tuple(conf.voters)
        self._voter_set = frozenset(conf.voters)
        self._learners = tuple(n for n in conf.learners if n not in self._voter_set)
        self._quorum = majority(self._voters)

    def _soft_state(self) -> SoftState:
        return SoftState(self._role, self._leader, self._term)

    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = self._cfg.election_ticks + self._rng.randrange(
            self._cfg.election_ticks
        )
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
        self._reset(self._term)
        self._role = Role.LEADER
        self._leader = self._id
        self._committed_in_term = False
        log = self._log
        next_index = log.last_index() + 1
        max_inflight = self._cfg.max_inflight
        learners = set(self._learners)
        self._progress = {
            peer: Progress(next_index, max_inflight, is_learner=peer in learners)
            for peer in (*self._voters, *self._learners)
        }
        me = self._progress.get(self._id)
        if me is None:  # a leader outside the voter set cannot happen without membership changes
            me = self._progress[self._id] = Progress(next_index, max_inflight)
        me.match = next_index - 1
        me.recent_active = True
        # Raft 8: a no-op of our own term lets us commit (and learn) what earlier terms left.
        self._append_entry(b"")
        if self._maybe_commit():
            self._on_commit_advanced()

    def _in_lease(self) -> bool:
        """Whether we heard from a live leader within the election timeout (check-quorum lease)."""
        return (
            self._cfg.check_quorum
            and self._leader is not None
            and self._election_elapsed < self._cfg.election_ticks
        )

    # ------------------------------------------------------------------
    # Timers
    # ------------------------------------------------------------------

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._id in self._voter_set and self._election_elapsed >= self._randomized_timeout:
            self._campaign(pre_vote=self._cfg.pre_vote)

    def _tick_leader(self) -> None:
        self._election_elapsed += 1
        self._heartbeat_elapsed += 1
        cfg = self._cfg
        if self._election_elapsed >= cfg.election_ticks:
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
        can_vote = (
            self._vote == m.src
            or (self._vote is None and self._leader is None)
            or (m.pre_vote and m.term > self._term)
        )
        granted = can_vote and self._log_is_up_to_date(m.last_log_index, m.last_log_term)
        if granted and not m.pre_vote:
            self._vote = m.src
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
        return True

    def _on_append_entries(self, m: AppendEntries) -> None:
        if not self._follow(m):
            return
        log = self._log
        if m.prev_index < log.committed:
            # Everything up to our commit matches the leader already (and may be compacted).
            self._send_append_response(m.src, reject=False, index=log.committed)
            return
        last_new = log.maybe_append(m.prev_index, m.prev_term, m.commit, m.entries)
        if last_new is not None:
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
            log.restore(Snapshot(meta, b"".join(receipt.chunks)))
            if meta.conf.voters:
                self._set_membership(meta.conf)
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
        if m.ctx and m.src in self._voter_set:
            acks = self._read_only.ack(m.ctx, m.src)
            if acks + 1 >= self._quorum:  # +1: the leader itself
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

    def _append_entry(self, data: bytes) -> int:
        log = self._log
        index = log.last_index() + 1
        log.append(Entry(index, self._term, data))
        me = self._progress.get(self._id)
        if me is not None:
            me.match = index
            me.next = index + 1
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
        if self._quorum == 1 and self._id in self._voter_set:
            self._deliver_read(ctx, commit, requester)
        elif not self._committed_in_term:
            # Until an entry of our term commits, our commit index may lag the cluster's.
            self._reads_waiting_commit.append((ctx, requester))
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
