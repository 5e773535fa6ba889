"""The peer codec: Raft messages survive the trip, and nothing else gets through."""

from __future__ import annotations

import dataclasses
import random
import struct
from typing import Any, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm import wire
from dlm.node import peer_codec
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
from dlm.records import ConfState, Entry, SnapshotMeta
from tests.unit.fuzz import BOUNDARY_INTS, FUZZ, decode_all, mutated


class Header(TypedDict):
    """The fields every Raft message starts with."""

    group: int
    term: int
    src: str
    dst: str


H: Header = {"group": 0, "term": 3, "src": "a", "dst": "b"}

SAMPLES: list[Message] = [
    VoteRequest(**H, last_log_index=5, last_log_term=2, pre_vote=True, transfer=False),
    VoteResponse(**H, granted=True, pre_vote=False),
    AppendEntries(
        **H,
        prev_index=4,
        prev_term=2,
        entries=(Entry(5, 3, b"x"), Entry(6, 3, b"")),
        commit=4,
    ),
    AppendEntriesResponse(**H, reject=True, index=4, hint_index=3, hint_term=1),
    Heartbeat(**H, commit=7, ctx=b"r1"),
    HeartbeatResponse(**H, ctx=b"r1"),
    InstallSnapshot(
        **H,
        meta=SnapshotMeta(10, 2, ConfState(("a", "b", "c"), ())),
        offset=0,
        data=b"img",
        done=True,
    ),
    InstallSnapshotResponse(**H, index=10, next_offset=3, reject=False),
    TimeoutNow(**H),
    ReadIndexRequest(**H, ctx=b"q"),
    ReadIndexResponse(**H, ctx=b"q", index=9),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_raft_message_round_trips(msg: Message) -> None:
    dec = wire.FrameDecoder(wire.PEER_FRAME_LIMIT)
    dec.feed(peer_codec.raft_frame([msg, msg]))
    (frame,) = list(dec.frames())
    assert peer_codec.decode_raft_frame(frame) == [msg, msg]


def test_decoder_reassembles_frames_split_anywhere() -> None:
    data = peer_codec.raft_frame(SAMPLES) + wire.encode_frame({"t": "x"})
    for cut in range(0, len(data), 7):
        dec = wire.FrameDecoder(wire.PEER_FRAME_LIMIT)
        dec.feed(data[:cut])
        got = list(dec.frames())
        dec.feed(data[cut:])
        got += list(dec.frames())
        assert len(got) == 2


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(data: bytes) -> None:
    dec = wire.FrameDecoder(wire.PEER_FRAME_LIMIT)
    dec.feed(struct.pack(">I", len(data)) + data)
    try:
        for frame in dec.frames():
            peer_codec.decode_raft_frame(frame)
    except wire.ProtocolError:
        pass


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.binary() | st.text(),
        lambda c: st.lists(c, max_size=6),
        max_leaves=30,
    )
)
def test_arbitrary_cbor_values_never_raise_anything_but_protocol_error(value: object) -> None:
    try:
        peer_codec.raft_from_wire(value)
    except wire.ProtocolError:
        pass


def _int_fields(msg: Message) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(msg)
        if type(getattr(msg, f.name)) is int  # not bool, not the nested values
    ]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_integer_field_is_bounded_to_63_bits(msg: Message) -> None:
    for name in _int_fields(msg):
        for good in (0, 2**63 - 1):
            # Any: the field is chosen by name at run time, so mypy cannot check it.
            ok_field: dict[str, Any] = {name: good}
            ok = dataclasses.replace(msg, **ok_field)
            assert peer_codec.raft_from_wire(peer_codec.raft_to_wire(ok)) == ok
        for bad in (-1, 2**63, 2**64 - 1, 2**64):
            bad_field: dict[str, Any] = {name: bad}
            wrong = peer_codec.raft_to_wire(dataclasses.replace(msg, **bad_field))
            with pytest.raises(wire.ProtocolError, match=r"2\*\*63"):
                peer_codec.raft_from_wire(wrong)


@pytest.mark.parametrize("bad", [-1, 2**63, 2**64 - 1])
def test_entry_and_snapshot_indexes_and_terms_are_bounded(bad: int) -> None:
    entries = (Entry(5, 3, b"x"),)
    append = AppendEntries(**H, prev_index=4, prev_term=2, entries=entries, commit=4)
    meta = SnapshotMeta(10, 2, ConfState(("a",), ()))
    install = InstallSnapshot(**H, meta=meta, offset=0, data=b"", done=True)
    cases: list[Message] = [
        dataclasses.replace(append, entries=(Entry(bad, 3, b"x"),)),
        dataclasses.replace(append, entries=(Entry(5, bad, b"x"),)),
        dataclasses.replace(install, meta=SnapshotMeta(bad, 2, meta.conf)),
        dataclasses.replace(install, meta=SnapshotMeta(10, bad, meta.conf)),
    ]
    for msg in cases:
        with pytest.raises(wire.ProtocolError):
            peer_codec.raft_from_wire(peer_codec.raft_to_wire(msg))
        # Through the frame decoder too (there 2**63 and up never reach the codec).
        dec = wire.FrameDecoder(wire.PEER_FRAME_LIMIT)
        dec.feed(peer_codec.raft_frame([msg]))
        with pytest.raises(wire.ProtocolError):
            for frame in dec.frames():
                peer_codec.decode_raft_frame(frame)


def test_a_bool_is_not_a_message_kind() -> None:
    with pytest.raises(wire.ProtocolError):
        peer_codec.raft_from_wire([True, 0, 1, "a", "b", 1, 1, False, False])
    with pytest.raises(wire.ProtocolError):
        peer_codec.raft_from_wire([3, 0, 1, "a", "b", 0, 0, [[1, 1, True, b""]], 0])


@st.composite
def messages_with_any_integers(draw: st.DrawFn) -> Message:
    """A sample message whose integer fields (entries and snapshot metadata included)
    are drawn from everywhere: negative, at the 63- and 64-bit limits, far beyond."""
    ints = st.integers(min_value=-(2**70), max_value=2**70) | BOUNDARY_INTS
    msg = draw(st.sampled_from(SAMPLES))
    changes: dict[str, Any] = {name: draw(ints) for name in _int_fields(msg)}
    if isinstance(msg, AppendEntries):
        changes["entries"] = tuple(
            Entry(draw(ints), draw(ints), b"d") for _ in range(draw(st.integers(0, 3)))
        )
    if isinstance(msg, InstallSnapshot):
        changes["meta"] = SnapshotMeta(draw(ints), draw(ints), msg.meta.conf)
    return dataclasses.replace(msg, **changes)


def _all_ints(msg: Message) -> list[int]:
    values = [getattr(msg, name) for name in _int_fields(msg)]
    if isinstance(msg, AppendEntries):
        values += [n for e in msg.entries for n in (e.index, e.term)]
    if isinstance(msg, InstallSnapshot):
        values += [msg.meta.index, msg.meta.term]
    return values


@FUZZ
@given(messages_with_any_integers())
def test_fuzz_a_message_round_trips_exactly_when_its_integers_fit(msg: Message) -> None:
    fits = all(0 <= n < 2**63 for n in _all_ints(msg))
    dec = wire.FrameDecoder(wire.PEER_FRAME_LIMIT)
    dec.feed(peer_codec.raft_frame([msg]))
    try:
        decoded = [peer_codec.decode_raft_frame(frame) for frame in dec.frames()]
    except wire.ProtocolError:
        assert not fits
    else:
        assert fits
        assert decoded == [[msg]]


@FUZZ
@given(
    st.sampled_from([peer_codec.raft_frame([m])[4:] for m in SAMPLES]).flatmap(mutated),
    st.randoms(use_true_random=False),
)
def test_fuzz_near_valid_raft_frames_only_raise_protocol_error(
    body: bytes, rng: random.Random
) -> None:
    decode_all(body, rng)
