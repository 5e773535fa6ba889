"""The values the Raft core exchanges with the world around it.

This module is the contract between four rooms: the pure core (core.py and its
helpers), the durable store (dlm/store), the wire codec (dlm/wire.py) and the
runtimes that drive the core (dlm/node/server.py and the simulator in
tests/sim). Everything here is an immutable value; nothing here does IO.

Theory of operation
-------------------
The runtime owns a ``RaftNode`` and feeds it three kinds of input: ``tick()``
once per tick of its own clock, ``step(message)`` for every message that
arrives from a peer, and requests from clients (``propose``, ``read_index``,
``transfer_leadership``). The core never answers by doing something; it
collects what must be done into a ``Ready`` batch. The runtime takes that batch
and, strictly in this order:

1. persists ``snapshot`` (if any), then ``entries`` and ``hard_state`` to stable
   storage, with one fsync covering the whole batch;
2. only then sends ``messages`` (a vote or an append acknowledgement is a
   promise about what is on disk, so it must not leave before the disk has it);
3. applies ``committed`` entries to the state machine, in order, and serves
   ``read_states`` once the state machine has applied up to their index;
4. calls ``advance(ready)``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

NodeId = str
"""A member's stable name, as given by ``dlm node start --id``."""


class EntryKind(enum.IntEnum):
    """What an entry's payload means to the runtime."""

    NORMAL = 0
    """An opaque command for the state machine (empty for a leader's no-op)."""
    CONF_CHANGE = 1
    """A membership change; reserved for the membership issue."""


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    data: bytes = b""
    kind: EntryKind = EntryKind.NORMAL


@dataclass(frozen=True, slots=True)
class HardState:
    """What a node must remember across a crash.

    ``term`` and ``vote`` must be durable before any message of the same Ready
    is sent. ``commit`` is advisory: a store may persist it lazily, because a
    node that restarts with a lower commit index simply relearns it from the
    leader (it never goes backwards in a running node).
    """

    term: int = 0
    vote: NodeId | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class ConfState:
    """The membership a log prefix or snapshot was taken under."""

    voters: tuple[NodeId, ...] = ()
    learners: tuple[NodeId, ...] = ()


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int
    term: int
    conf: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A state-machine image that replaces every entry up to ``meta.index``."""

    meta: SnapshotMeta
    data: bytes


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
class Ready:
    """One batch of work for the runtime. See the module docstring for the order.

    Persist ``snapshot``, ``entries`` and ``hard_state`` (one fsync for the
    batch) *before* sending any of ``messages``. ``entries`` may start at or
    below the store's last index: the store then drops its conflicting suffix
    first. ``committed`` entries are applied in order; ``read_states`` are
    served once applied >= their index. Then call ``RaftNode.advance(ready)``.
    """

    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    messages: tuple[Message, ...] = ()
    committed: tuple[Entry, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    soft_state: SoftState | None = None
    messages_now: tuple[Message, ...] = ()
    """Messages that may leave before this Ready is persisted (none yet: see the
    membership and §10.2.1 work on the core)."""

    def is_empty(self) -> bool:
        return (
            self.hard_state is None
            and not self.entries
            and self.snapshot is None
            and not self.messages
            and not self.committed
            and not self.read_states
            and self.soft_state is None
        )


# ---------------------------------------------------------------------------
# Storage, as the core sees it (read-only) and as a runtime drives it.
# ---------------------------------------------------------------------------


class LogCompacted(Exception):
    """The requested index lies inside the snapshot: send the snapshot instead."""


class LogUnavailable(Exception):
    """The requested index lies beyond the last stored entry."""


class LogStorage(Protocol):
    """The read side of a member's log, which the core consults.

    Indexes below ``first_index()`` are compacted into the snapshot;
    ``term(first_index() - 1)`` is still answered (it is the snapshot's term,
    or 0 for an empty log).
    """

    def initial_state(self) -> tuple[HardState, ConfState]: ...

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def term(self, index: int) -> int:
        """Raise LogCompacted below first_index()-1, LogUnavailable above last_index()."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi); at least one if any is in range, however big it is."""
        ...

    def snapshot(self) -> Snapshot | None: ...


class Storage(LogStorage, Protocol):
    """What a runtime does to a member's log. Each call is durable when it returns."""

    def append(self, entries: Sequence[Entry]) -> None:
        """Append, first dropping any stored entries at or after ``entries[0].index``."""
        ...

    def set_hard_state(self, hard_state: HardState) -> None: ...

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Install a snapshot received from the leader, replacing the whole log."""
        ...

    def create_snapshot(self, index: int, conf: ConfState, data: bytes) -> Snapshot:
        """Record the state machine's image as of applied ``index`` (log kept)."""
        ...

    def compact(self, index: int) -> None:
        """Drop entries up to and including ``index`` (must be <= the snapshot's index)."""
        ...
