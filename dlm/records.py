"""The records Raft keeps and the store makes durable: log entries, the hard state,
the configuration and its changes, snapshots, and the storage contract between them.

A leaf below both the Raft core (dlm/node/raft) and the store (dlm/store): the store
writes these records without importing the node. Immutable values; nothing here does IO.
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
    """A membership change: ``data`` is an encoded ``ConfChange``."""


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    data: bytes = b""
    kind: EntryKind = EntryKind.NORMAL


ENTRY_OVERHEAD = 24
"""Bytes charged per entry on top of its payload when a batch is sized against a byte
budget (index, term, kind and framing: the same charge for messages and for the store)."""


def entry_size(entry: Entry) -> int:
    return len(entry.data) + ENTRY_OVERHEAD


@dataclass(frozen=True, slots=True)
class HardState:
    """What a node must remember across a crash.

    ``term`` and ``vote`` must be durable before ``Ready.messages`` of the same
    Ready are sent (``messages_now`` only ever carries a term and vote that an
    earlier, advanced Ready made durable). ``commit`` is advisory: a store may
    persist it lazily, because a node that restarts with a lower commit index
    simply relearns it from the leader (it never goes backwards in a running
    node).
    """

    term: int = 0
    vote: NodeId | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class ConfState:
    """The membership a log prefix or snapshot was taken under."""

    voters: tuple[NodeId, ...] = ()
    learners: tuple[NodeId, ...] = ()


class ConfChangeKind(enum.IntEnum):
    """What a single-member configuration change does."""

    ADD_LEARNER = 1
    """A new member joins as a learner: it receives the log but does not vote."""
    PROMOTE = 2
    """A learner becomes a voter."""
    REMOVE = 3
    """A voter or a learner leaves the configuration."""


@dataclass(frozen=True, slots=True)
class ConfChange:
    """One membership change, the payload of an ``EntryKind.CONF_CHANGE`` entry.

    ``context`` is opaque to the core; the runtime uses it to carry what it
    needs to reach the member (its address).
    """

    kind: ConfChangeKind
    node: NodeId
    context: bytes = b""


class ConfChangeDecodeError(ValueError):
    """The bytes are not an encoded ConfChange."""


_CONF_CHANGE_VERSION = 1
MAX_NODE_ID_BYTES = 255
MAX_CONF_CONTEXT_BYTES = 1 << 16


def encode_conf_change(change: ConfChange) -> bytes:
    """Version, kind, id length (1 byte), UTF-8 id, context length (4 bytes), context.

    Raises ValueError for a change that could not be decoded back: an empty or
    over-long id, an over-long context, an unknown kind.
    """
    kind = ConfChangeKind(change.kind)
    node = change.node.encode("utf-8")
    if not node or len(node) > MAX_NODE_ID_BYTES:
        raise ValueError(f"a member id must be 1 to {MAX_NODE_ID_BYTES} UTF-8 bytes")
    context = bytes(change.context)
    if len(context) > MAX_CONF_CONTEXT_BYTES:
        raise ValueError(f"a change's context is at most {MAX_CONF_CONTEXT_BYTES} bytes")
    return b"".join(
        (
            bytes((_CONF_CHANGE_VERSION, kind, len(node))),
            node,
            len(context).to_bytes(4, "big"),
            context,
        )
    )


def decode_conf_change(data: bytes) -> ConfChange:
    """The inverse of ``encode_conf_change``; raises ConfChangeDecodeError on anything else."""
    if len(data) < 3:
        raise ConfChangeDecodeError(f"a configuration change of only {len(data)} bytes")
    version, kind_code, id_len = data[0], data[1], data[2]
    if version != _CONF_CHANGE_VERSION:
        raise ConfChangeDecodeError(f"unknown configuration change version {version}")
    try:
        kind = ConfChangeKind(kind_code)
    except ValueError:
        raise ConfChangeDecodeError(f"unknown configuration change kind {kind_code}") from None
    if id_len == 0:
        raise ConfChangeDecodeError("a configuration change names no member")
    context_at = 3 + id_len
    if len(data) < context_at + 4:
        raise ConfChangeDecodeError("a configuration change is cut short")
    try:
        node = bytes(data[3:context_at]).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfChangeDecodeError("a configuration change's member id is not UTF-8") from None
    context_len = int.from_bytes(data[context_at : context_at + 4], "big")
    end = context_at + 4 + context_len
    if context_len > MAX_CONF_CONTEXT_BYTES:
        raise ConfChangeDecodeError(f"a configuration change's context claims {context_len} bytes")
    if len(data) != end:
        raise ConfChangeDecodeError(
            f"a configuration change of {end} bytes arrived as {len(data)} bytes"
        )
    return ConfChange(kind, node, bytes(data[context_at + 4 : end]))


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
