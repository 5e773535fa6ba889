"""Hypothesis strategies for hostile frames, and the check every decoder must pass.

Shared by the wire and peer-codec tests. ``hostile_values`` draws Python values
cbor2 can encode, most of which dlm must refuse (tags of every kind, floats,
integers beyond 64 bits, sets, non-text map keys, deep nesting); ``mutated``
takes a valid frame body and damages it the ways a hostile sender would (bit
flips, bytes that start tags, floats, indefinite or oversized items, cuts,
insertions). ``decode_all`` pushes one body through ``FrameDecoder`` (client
and peer limits, fed in seeded random pieces) and on into every decoder of
decoded values, and fails if anything but ``ProtocolError`` escapes or if a
decoded value holds more than one item per byte of its frame.

Runs are derandomized (the same examples every time). Set
``DLM_FUZZ_EXAMPLES=N`` for a longer campaign, and ``DLM_FUZZ_RANDOM=1`` to
draw fresh examples instead of the fixed ones.
"""

from __future__ import annotations

import datetime
import os
import random
import struct
import uuid
from collections.abc import Callable
from typing import Any

import cbor2
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dlm import wire
from dlm.node import peer_codec

FUZZ = settings(
    max_examples=int(os.environ.get("DLM_FUZZ_EXAMPLES", "200")),
    deadline=None,
    derandomize=os.environ.get("DLM_FUZZ_RANDOM", "") != "1",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

BOUNDARY_INTS = st.sampled_from(
    [0, 1, 23, 24, 255, 256, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]
).flatmap(lambda n: st.sampled_from([n, -n, -n - 1]))

_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | BOUNDARY_INTS
    | st.floats(allow_nan=True)
    | st.binary(max_size=40)
    | st.text(max_size=20)
    | st.builds(cbor2.CBORTag, st.integers(0, 2**64 - 1), st.integers() | st.text(max_size=5))
    | st.builds(cbor2.CBORSimpleValue, st.integers(0, 19))
    | st.just(cbor2.undefined)
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.fractions()
    | st.just(datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC))
    | st.just(uuid.UUID(int=7))
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text(max_size=8) | st.integers() | st.binary(max_size=4)
    return (
        st.lists(children, max_size=5)
        | st.dictionaries(keys, children, max_size=5)
        | st.frozensets(st.integers(), max_size=3)
    )


hostile_values = st.recursive(_LEAVES, _containers, max_leaves=25)

# Bytes that start the items dlm refuses, or that claim more than the frame holds.
INTERESTING_BYTES = [
    0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xD8, 0xD9, 0xDB,  # tags
    0xF9, 0xFA, 0xFB,  # floats
    0xF7, 0xF0, 0xF8,  # undefined, simple values
    0x5F, 0x7F, 0x9F, 0xBF, 0xFF,  # indefinite lengths, break
    0x1B, 0x3B, 0x5B, 0x7B, 0x9B, 0xBB,  # 8-byte arguments
    0x1C, 0x5C, 0x9D,  # reserved additional information
    0x80, 0xA0, 0x81, 0xA1,  # containers
]  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` with one to four hostile edits."""
    data = bytearray(body)
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["flip", "poke", "insert", "delete", "dup", "cut", "big"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if edit == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif edit == "poke" and data:
            data[at] = draw(st.sampled_from(INTERESTING_BYTES) | st.integers(0, 255))
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=9))
        elif edit == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif edit == "dup":
            data[at:at] = data[at : at + draw(st.integers(1, 16))]
        elif edit == "cut":
            del data[at:]
        elif edit == "big":
            # An 8-byte argument: a huge integer, string length or container count.
            data[at:at] = bytes([draw(st.sampled_from([0x1B, 0x3B, 0x5B, 0x9B, 0xBB]))])
            data[at + 1 : at + 1] = struct.pack(">Q", draw(st.integers(0, 2**64 - 1)))
    return bytes(data)


def weight(value: Any) -> int:
    """Items in a decoded value, counting each string's bytes as items too."""
    if isinstance(value, list):
        return 1 + sum(weight(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(weight(k) + weight(v) for k, v in value.items())
    if isinstance(value, str | bytes):
        return 1 + len(value)
    assert value is None or isinstance(value, bool | int), type(value)
    return 1


VALUE_DECODERS: list[Callable[[Any], object]] = [
    wire.decode_request,
    wire.Hello.from_wire,
    peer_codec.decode_raft_frame,
]


def decode_all(body: bytes, rng: random.Random) -> int:
    """Decode ``body`` every way a member or client can; returns how many decoders
    accepted a decoded value. Fails on anything but ProtocolError."""
    frame = struct.pack(">I", len(body)) + body
    accepted = 0
    for limit in (wire.CLIENT_FRAME_LIMIT, wire.PEER_FRAME_LIMIT):
        decoder = wire.FrameDecoder(limit)
        values: list[Any] = []
        try:
            pos = 0
            while pos < len(frame):
                step = rng.randint(1, len(frame) - pos)
                decoder.feed(frame[pos : pos + step])
                pos += step
                values.extend(decoder.frames())
        except wire.ProtocolError:
            continue
        assert len(values) == 1
        (value,) = values
        # Bounded work: decoding built no more than one item per byte of the frame.
        assert weight(value) <= len(body) + 1
        assert wire.check_cbor(body) <= len(body)
        for decode in VALUE_DECODERS:
            try:
                decode(value)
                accepted += 1
            except wire.ProtocolError:
                pass
    return accepted
