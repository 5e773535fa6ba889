"""What the node machine hands out, and the outbox its rooms put it in.

The machine (machine.py) is split into rooms by concern (read rounds, membership,
proposals, clients, peer health, audit, snapshots); each of them decides on its own
part and puts the resulting actions (frames, messages, log events, persistence) in
one shared ``Outbox``, in the order they were decided. The runtime collects them with
``NodeMachine.take_actions``. Here too are the time an event carries (``Instant``)
and the records of every action. Pure: nothing here does IO or reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from dlm.node.raft.types import Message
from dlm.node.stats import Stats
from dlm.records import ConfState, Entry, HardState, NodeId, Snapshot
from dlm.wire import ClientRequest

REJECT_LOG_EVERY = 1.0
"""Seconds between two log lines about rejected input (the rest are counted)."""


class Instant(NamedTuple):
    """The time of an event: ``mono`` (monotonic seconds) for every timer and lease clock,
    ``wall_ms`` (ms since the epoch) only for the stamps people read."""

    mono: float
    wall_ms: int


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


class PendingImage(Protocol):
    """An image of the applied state that the runtime builds off its event loop (a forked
    child: runtime/imaging.py). The machine only passes it on; ``purpose`` is
    ``snapshots.PERIODIC`` or ``snapshots.BACKUP``."""

    @property
    def purpose(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SaveSnapshot:
    """Record this image of the applied state (after every earlier Persist), then drop
    log entries up to ``compact_to`` (nothing when 0).

    ``pending``: the image is still being built (``data`` is empty until then); the
    runtime submits the job once it has the bytes, after the Persist jobs handed out
    meanwhile, which is as good (the image holds only committed entries, and the
    log it compacts still has them)."""

    index: int
    conf: ConfState
    data: bytes
    compact_to: int
    pending: PendingImage | None = None


@dataclass(frozen=True, slots=True)
class SendBackup:
    """Send connection ``conn`` the image of the applied state at ``index`` (committed) in
    answer to its ``snapshot_save`` request ``request_id``: the ``header`` (an ok frame's
    body, wire.SnapshotHeader) at once, then the image in chunks
    (wire.backup_chunk_frames) as the client takes them. ``image`` is the bytes, or an
    image being built off the event loop."""

    conn: int
    request_id: int
    header: dict[str, Any]
    image: bytes | PendingImage


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


@dataclass(frozen=True, slots=True)
class FinishedSpan:
    """One span of a traced request (dlm/node/spans.py), as plain data: ``local_id`` names
    it within its batch, ``parent`` is its parent's (None: the request's remote parent,
    ``traceparent``); ``start`` and ``end`` are monotonic seconds."""

    name: str
    local_id: int
    parent: int | None
    traceparent: str
    start: float
    end: float
    attributes: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class ExportSpans:
    """Export these spans of one traced request (parents first) when tracing is on, else
    drop them. ``anchor``: an Instant whose monotonic and wall readings place the spans'
    monotonic times on the wall clock."""

    spans: tuple[FinishedSpan, ...]
    anchor: Instant


Action = (
    SendFrame
    | CloseConnection
    | SendMessages
    | Persist
    | SaveSnapshot
    | SendBackup
    | LogEvent
    | PeersChanged
    | Stop
    | ExportSpans
)


class NotLeaderReply(Protocol):
    """Answers ``req`` with NOT_LEADER, naming ``leader`` (or the one this member follows)."""

    def __call__(self, conn: int, req: ClientRequest, leader: NodeId | None = None) -> None: ...


class Outbox:
    """The actions decided so far, in order, and the rules every room's output follows:
    frames only for connections still open, every answer counted, log events of replayed
    entries marked, and refused input logged at a bounded rate."""

    def __init__(self, stats: Stats, open_conns: Container[int]) -> None:
        self.stats = stats
        self._open_conns = open_conns
        self._actions: list[Action] = []
        self.replaying = False
        """The entry being applied was in the log when this member started."""
        self.entry_stamp_ms: int | None = None
        """The leader's stamp of the entry being applied (of the last one that had a stamp,
        for a membership entry, which carries none)."""
        self._reject_log_at = -1.0e9
        self._rejects_unlogged = 0
        self.answered: Callable[[int], None] | None = None
        """Told of every answer to a request, by connection (the in-flight counts)."""
        self.on_traced_answer: Callable[[int, object], None] | None = None
        """Told of every answer (connection, request id) while a traced request waits for
        its own (dlm/node/spans.py); None the rest of the time."""

    def take(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

    @property
    def pending(self) -> bool:
        """Actions decided and not taken yet."""
        return bool(self._actions)

    def emit(self, action: Action) -> None:
        self._actions.append(action)

    def emit_all(self, actions: Iterable[Action]) -> None:
        self._actions.extend(actions)

    def log(self, level: str, event: str, **fields: Any) -> None:
        if self.replaying:
            # An event of an entry applied before the restart: marked, and at its own time,
            # so that neither a reader nor a log collector takes it for a new one.
            fields["replayed"] = True
            self._actions.append(LogEvent(level, event, fields, self.entry_stamp_ms))
            return
        self._actions.append(LogEvent(level, event, fields))

    def reply(self, conn: int, frame: dict[str, Any]) -> None:
        if conn in self._open_conns:
            self._actions.append(SendFrame(conn, frame))

    def answer(self, conn: int, kind: str, frame: dict[str, Any]) -> None:
        """Replies to a request of type ``kind``, counting the answer: every answer to a
        request leaves through here, so the counts by type and result are complete."""
        self.stats.count(kind, frame["code"] if frame["t"] == "error" else "OK")
        if self.answered is not None:
            self.answered(conn)
        if self.on_traced_answer is not None:
            self.on_traced_answer(conn, frame.get("id"))
        self.reply(conn, frame)

    def reject(self, now: Instant, event: str, **fields: Any) -> None:
        """A log line about refused input, at most one per REJECT_LOG_EVERY (the rest counted)."""
        self.stats.rejected_frames += 1
        if now.mono - self._reject_log_at < REJECT_LOG_EVERY:
            self._rejects_unlogged += 1
            return
        if self._rejects_unlogged:
            fields["also_refused"] = self._rejects_unlogged
        self._rejects_unlogged = 0
        self._reject_log_at = now.mono
        self.log("warning", event, **fields)
