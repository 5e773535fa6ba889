"""The peer codec: Raft messages survive the trip, and nothing else gets through."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm import wire
from dlm.node import peer_codec
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    ConfState,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    SnapshotMeta,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

H = {"group": 0, "term": 3, "src": "a", "dst": "b"}

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
