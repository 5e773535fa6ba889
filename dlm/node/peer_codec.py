"""The Raft messages members send each other, as compact positional arrays.

A peer frame is ``{"t": "raft", "m": [message, ...]}`` (framing as in
dlm/wire.py), and each message is ``[kind, group, term, src, dst, ...fields]``.
Decoding checks every field's type and raises ``ProtocolError`` on anything
else, so a confused or hostile peer costs only its own connection. Every
integer field (terms, indexes, offsets, the group) must be in ``[0, 2**63)``:
the store keeps them as u64 but refuses to persist anything at or above 2**63,
so a larger one must never get past the wire. Kept apart from dlm/wire.py so
the client, which never sees these, does not import them.
"""

from __future__ import annotations

from typing import Any

from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import ConfState, Entry, EntryKind, SnapshotMeta
from dlm.wire import INT_LIMIT, ProtocolError, as_map, encode_frame

# ---------------------------------------------------------------------------


def _entry_to_wire(e: Entry) -> list[Any]:
    return [e.index, e.term, int(e.kind), e.data]


_ENTRY_KINDS = {int(k): k for k in EntryKind}


def _entry_from_wire(v: Any) -> Entry:
    # The hot loop of a large AppendEntries: exact type tests (cbor2 gives exactly int,
    # never bool, for an integer) and a dict for the kind, instead of the helpers below.
    if type(v) is not list or len(v) != 4:
        raise ProtocolError("malformed entry")
    index, term, kind, data = v
    if (
        type(index) is not int
        or type(term) is not int
        or not 0 <= index < INT_LIMIT
        or not 0 <= term < INT_LIMIT
    ):
        raise ProtocolError("entry index and term must be integers in [0, 2**63)")
    entry_kind = _ENTRY_KINDS.get(kind) if type(kind) is int else None
    if entry_kind is None:
        raise ProtocolError(f"unknown entry kind {kind!r}")
    if type(data) is not bytes:
        raise ProtocolError("entry data must be bytes")
    return Entry(index=index, term=term, data=data, kind=entry_kind)


def _meta_to_wire(m: SnapshotMeta) -> list[Any]:
    return [m.index, m.term, list(m.conf.voters), list(m.conf.learners)]


def _str_tuple(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ProtocolError("expected a list of node ids")
    return tuple(v)


def _meta_from_wire(v: Any) -> SnapshotMeta:
    if not isinstance(v, list) or len(v) != 4:
        raise ProtocolError("malformed snapshot metadata")
    _check_ints(v[0], v[1])
    return SnapshotMeta(
        index=v[0], term=v[1], conf=ConfState(voters=_str_tuple(v[2]), learners=_str_tuple(v[3]))
    )


def _check_ints(*values: Any) -> None:
    """Terms, indexes, offsets and groups: integers in [0, 2**63), never bool."""
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < INT_LIMIT:
            raise ProtocolError(f"expected an integer in [0, 2**63), got {_describe(v)}")


def _describe(v: Any) -> str:
    # Never echo a huge value whole into an error message (or a log line).
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _check_bools(*values: Any) -> None:
    for v in values:
        if not isinstance(v, bool):
            raise ProtocolError("expected a boolean")


def _check_bytes(*values: Any) -> None:
    for v in values:
        if not isinstance(v, bytes):
            raise ProtocolError("expected bytes")


_KIND = {
    VoteRequest: 1,
    VoteResponse: 2,
    AppendEntries: 3,
    AppendEntriesResponse: 4,
    Heartbeat: 5,
    HeartbeatResponse: 6,
    InstallSnapshot: 7,
    InstallSnapshotResponse: 8,
    TimeoutNow: 9,
    ReadIndexRequest: 10,
    ReadIndexResponse: 11,
}


def raft_to_wire(m: Message) -> list[Any]:
    head: list[Any] = [_KIND[type(m)], m.group, m.term, m.src, m.dst]
    match m:
        case VoteRequest():
            return [*head, m.last_log_index, m.last_log_term, m.pre_vote, m.transfer]
        case VoteResponse():
            return [*head, m.granted, m.pre_vote]
        case AppendEntries():
            ents = [_entry_to_wire(e) for e in m.entries]
            return [*head, m.prev_index, m.prev_term, ents, m.commit]
        case AppendEntriesResponse():
            return [*head, m.reject, m.index, m.hint_index, m.hint_term]
        case Heartbeat():
            return [*head, m.commit, m.ctx]
        case HeartbeatResponse():
            return [*head, m.ctx]
        case InstallSnapshot():
            return [*head, _meta_to_wire(m.meta), m.offset, m.data, m.done]
        case InstallSnapshotResponse():
            return [*head, m.index, m.next_offset, m.reject]
        case TimeoutNow():
            return head
        case ReadIndexRequest():
            return [*head, m.ctx]
        case ReadIndexResponse():
            return [*head, m.ctx, m.index]
    raise TypeError(f"not a raft message: {m!r}")  # pragma: no cover - exhaustive match


_ARITY = {1: 9, 2: 7, 3: 9, 4: 9, 5: 7, 6: 6, 7: 9, 8: 8, 9: 5, 10: 6, 11: 7}


def raft_from_wire(v: Any) -> Message:
    """Decodes one Raft message; any deviation from the schema is a ProtocolError."""
    if (
        not isinstance(v, list)
        or not v
        or type(v[0]) is not int  # not bool: True would pass as kind 1
        or v[0] not in _ARITY
        or len(v) != _ARITY[v[0]]
    ):
        raise ProtocolError("malformed raft message")
    kind, group, term, src, dst = v[:5]
    _check_ints(group, term)
    if not isinstance(src, str) or not isinstance(dst, str):
        raise ProtocolError("raft message src/dst must be strings")
    h = {"group": group, "term": term, "src": src, "dst": dst}
    r = v[5:]
    if kind == 1:
        _check_ints(r[0], r[1])
        _check_bools(r[2], r[3])
        return VoteRequest(
            **h, last_log_index=r[0], last_log_term=r[1], pre_vote=r[2], transfer=r[3]
        )
    if kind == 2:
        _check_bools(r[0], r[1])
        return VoteResponse(**h, granted=r[0], pre_vote=r[1])
    if kind == 3:
        _check_ints(r[0], r[1], r[3])
        if not isinstance(r[2], list):
            raise ProtocolError("entries must be a list")
        entries = tuple([_entry_from_wire(e) for e in r[2]])
        return AppendEntries(**h, prev_index=r[0], prev_term=r[1], entries=entries, commit=r[3])
    if kind == 4:
        _check_bools(r[0])
        _check_ints(r[1], r[2], r[3])
        return AppendEntriesResponse(**h, reject=r[0], index=r[1], hint_index=r[2], hint_term=r[3])
    if kind == 5:
        _check_ints(r[0])
        _check_bytes(r[1])
        return Heartbeat(**h, commit=r[0], ctx=r[1])
    if kind == 6:
        _check_bytes(r[0])
        return HeartbeatResponse(**h, ctx=r[0])
    if kind == 7:
        _check_ints(r[1])
        _check_bytes(r[2])
        _check_bools(r[3])
        return InstallSnapshot(**h, meta=_meta_from_wire(r[0]), offset=r[1], data=r[2], done=r[3])
    if kind == 8:
        _check_ints(r[0], r[1])
        _check_bools(r[2])
        return InstallSnapshotResponse(**h, index=r[0], next_offset=r[1], reject=r[2])
    if kind == 9:
        return TimeoutNow(**h)
    if kind == 10:
        _check_bytes(r[0])
        return ReadIndexRequest(**h, ctx=r[0])
    _check_bytes(r[0])
    _check_ints(r[1])
    return ReadIndexResponse(**h, ctx=r[0], index=r[1])


def raft_frame(messages: list[Message], sealer: Any = None) -> bytes:
    """One frame carrying several Raft messages to the same peer (sealed by ``sealer``, a
    dlm.auth.FrameSealer, on an authenticated link)."""
    return encode_frame({"t": "raft", "m": [raft_to_wire(m) for m in messages]}, sealer)


def decode_raft_frame(obj: Any) -> list[Message]:
    msg = as_map(obj)
    if msg.get("t") != "raft" or not isinstance(msg.get("m"), list):
        raise ProtocolError("expected a raft frame")
    return [raft_from_wire(m) for m in msg["m"]]
