"""The values the Raft core exchanges with the world around it.

This module is the contract between the pure core (core.py and its helpers), the
peer codec (dlm/node/peer_codec.py) and the runtimes that drive the core
(dlm/node/runtime/server.py and the simulator in tests/sim): messages, the Ready
batch, roles. The records the store also keeps (entries, hard state, configuration,
snapshots, the storage contract) live below both, in dlm/records.py, so the store
needs nothing from the node. Everything here is an immutable value; nothing here
does IO.

Theory of operation
-------------------
The runtime owns a ``RaftNode`` and feeds it three kinds of input: ``tick()``
once per tick of its own clock, ``step(message)`` for every message that
arrives from a peer, and requests from clients (``propose``,
``propose_conf_change``, ``read_index``, ``transfer_leadership``). The core
never answers by doing something; it collects what must be done into a
``Ready`` batch, which the runtime takes with ``ready()``. For each Ready:

1. send ``messages_now`` at once, before or while the Ready is persisted;
2. persist ``snapshot`` (if any), then ``entries`` and ``hard_state``, with one
   fsync covering the whole batch;
3. only once that persistence has completed, send ``messages``;
4. apply ``committed`` entries to the state machine, in order, and serve
   ``read_states`` once the state machine has applied up to their index (both
   may also happen earlier, see below);
5. call ``advance(ready)``.

Pipelining: the runtime may take Ready N+1 (and go on calling ``tick``,
``step`` and the client entry points) while Ready N is still being persisted,
so a slow fsync delays neither heartbeats nor the next batch. It must persist
Readys strictly in the order ``ready()`` returned them and call ``advance``
for each (the very object), in that order, once its persistence has completed. Steps 3 to 5 of
Ready N therefore happen after Ready N, and every Ready before it, is on disk.
Committed entries may be applied, and ``read_states`` served, as soon as the
Ready is taken, before its persistence completes (a quorum holds those entries
durably). A runtime that does so must still call ``advance`` only after the
persistence, and must not take a state-machine snapshot at an index before
every Ready taken so far is persisted (the committed entry may still be on its
way to the disk, over a stale entry at the same index).

Persist before you speak. ``messages`` holds everything that promises
something about this member's disk: answers to AppendEntries and to snapshot
chunks (an acknowledgement says the entries or the snapshot are on disk),
granted (and refused) votes, this member's own vote requests, and every
message at all while this member's current term or vote
is newer than the last ``hard_state`` an ``advance`` confirmed durable. A
crash may lose what was not yet persisted, so none of these may leave before
the Ready's persistence completes. ``messages_now`` holds only messages that
promise nothing about the disk, and only while this member's term and vote
are the durable ones: a leader's AppendEntries, Heartbeat, InstallSnapshot and
TimeoutNow, heartbeat answers, ReadIndex requests and answers, and pre-vote
traffic. This is what lets a leader send new entries to its followers while
it writes them itself (Raft dissertation, section 10.2.1): the leader counts
its own copy of an entry towards a quorum only when ``advance`` tells it the
entry is durable, so a commit always rests on a quorum of durable copies.

Membership: the configuration (voters and learners) changes one member at a
time through ``EntryKind.CONF_CHANGE`` entries whose payload is an encoded
``ConfChange``; see core.py. The core applies each one itself as soon as it
is in its log; committed CONF_CHANGE entries still come out in
``Ready.committed`` so the runtime can log them and learn new members'
addresses from ``ConfChange.context``. A snapshot's ``ConfState`` must be the
configuration in force at its index: ``RaftNode.conf_state_at(index)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dlm.records import Entry, HardState, NodeId, Snapshot, SnapshotMeta

# ---------------------------------------------------------------------------
# Messages between members. Every message names its Raft group, so one process
# can later host several groups without changing the wire format.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteRequest:
    """RequestVote, or its pre-vote probe when ``pre_vote`` is set.

    A pre-vote carries the term the candidate *would* use (current + 1) and
    changes no state on the receiver. ``transfer`` marks a campaign started by
    TimeoutNow, which receivers honour even while they believe a leader is
    alive (the leader asked for it).
    """

    group: int
    term: int
    src: NodeId
    dst: NodeId
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    transfer: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteResponse:
    group: int
    term: int
    src: NodeId
    dst: NodeId
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendEntries:
    group: int
    term: int
    src: NodeId
    dst: NodeId
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendEntriesResponse:
    """Acknowledges (``reject`` false) or refuses an AppendEntries.

    On success ``index`` is the last index the follower now matches. On
    rejection ``index`` echoes the request's ``prev_index`` and
    ``hint_index``/``hint_term`` let the leader skip a whole conflicting term
    at once (the fast backtracking of the Raft dissertation, section 5.3):
    ``hint_term`` is the follower's term at ``hint_index`` (0 when the
    follower's log is simply shorter, with ``hint_index`` its last index).
    """

    group: int
    term: int
    src: NodeId
    dst: NodeId
    reject: bool
    index: int
    hint_index: int = 0
    hint_term: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """Leader liveness and commit propagation; ``ctx`` ties it to a ReadIndex round."""

    group: int
    term: int
    src: NodeId
    dst: NodeId
    commit: int
    ctx: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResponse:
    group: int
    term: int
    src: NodeId
    dst: NodeId
    ctx: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshot:
    """One chunk of a snapshot; ``offset`` is where ``data`` starts in the whole."""

    group: int
    term: int
    src: NodeId
    dst: NodeId
    meta: SnapshotMeta
    offset: int
    data: bytes
    done: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshotResponse:
    """Acknowledges a chunk; ``next_offset`` is the byte the follower wants next.

    ``reject`` asks the leader to restart the transfer from offset 0 (the
    follower lost the partial image, for example after a restart).
    """

    group: int
    term: int
    src: NodeId
    dst: NodeId
    index: int
    next_offset: int
    reject: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutNow:
    """Sent by a leader to the member it hands leadership to: campaign at once."""

    group: int
    term: int
    src: NodeId
    dst: NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadIndexRequest:
    """A follower forwards a client's read to the leader."""

    group: int
    term: int
    src: NodeId
    dst: NodeId
    ctx: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadIndexResponse:
    """The leader's confirmed commit index for a forwarded read (``index`` 0: refused)."""

    group: int
    term: int
    src: NodeId
    dst: NodeId
    ctx: bytes
    index: int


Message = (
    VoteRequest
    | VoteResponse
    | AppendEntries
    | AppendEntriesResponse
    | Heartbeat
    | HeartbeatResponse
    | InstallSnapshot
    | InstallSnapshotResponse
    | TimeoutNow
    | ReadIndexRequest
    | ReadIndexResponse
)

MESSAGE_TYPES: tuple[type[Message], ...] = (
    VoteRequest,
    VoteResponse,
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    TimeoutNow,
    ReadIndexRequest,
    ReadIndexResponse,
)


# ---------------------------------------------------------------------------
# What the core hands back.
# ---------------------------------------------------------------------------


class Role(enum.StrEnum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"
    LEARNER = "learner"


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile facts worth telling the runtime when they change."""

    role: Role
    leader: NodeId | None
    term: int


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be served once the state machine has applied ``index``."""

    ctx: bytes
    index: int


@dataclass(frozen=True, slots=True)
class NotLeader:
    """The answer to a request only a leader can take; ``leader`` is a hint (may be None)."""

    leader: NodeId | None


@dataclass(frozen=True, slots=True)
class ConfChangeRefused:
    """The leader will not take this configuration change now; ``reason`` says why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the runtime. See the module docstring for the order.

    Send ``messages_now`` at once. Persist ``snapshot``, ``entries`` and
    ``hard_state`` (one fsync for the batch), and only then send ``messages``.
    ``entries`` may start at or below the store's last index: the store then
    drops its conflicting suffix first. ``committed`` entries are applied in
    order; ``read_states`` are served once applied >= their index. Then call
    ``RaftNode.advance(ready)``, in the order the Readys were taken.
    """

    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    messages: tuple[Message, ...] = ()
    """Sent only after this Ready (and every earlier one) is persisted."""
    committed: tuple[Entry, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    soft_state: SoftState | None = None
    messages_now: tuple[Message, ...] = ()
    """Sent at once: none of them promises anything about this member's disk."""

    def is_empty(self) -> bool:
        return (
            self.hard_state is None
            and not self.entries
            and self.snapshot is None
            and not self.messages
            and not self.messages_now
            and not self.committed
            and not self.read_states
            and self.soft_state is None
        )

    def must_persist(self) -> bool:
        """Whether this Ready carries anything for stable storage (and so must be advanced)."""
        return self.hard_state is not None or bool(self.entries) or self.snapshot is not None
