"""The ConfChange codec: exact round trips, and strict refusal of anything else (hostile input)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm.records import (
    MAX_CONF_CONTEXT_BYTES,
    MAX_NODE_ID_BYTES,
    ConfChange,
    ConfChangeDecodeError,
    ConfChangeKind,
    decode_conf_change,
    encode_conf_change,
)

CHANGE = ConfChange(ConfChangeKind.ADD_LEARNER, "n4", b"127.0.0.1:7704")


@pytest.mark.parametrize(
    "change",
    [
        CHANGE,
        ConfChange(ConfChangeKind.PROMOTE, "n4"),
        ConfChange(ConfChangeKind.REMOVE, "é" * 100, b"\x00" * 10),
        ConfChange(ConfChangeKind.REMOVE, "x" * MAX_NODE_ID_BYTES, b"c" * MAX_CONF_CONTEXT_BYTES),
    ],
)
def test_conf_change_round_trips(change: ConfChange) -> None:
    assert decode_conf_change(encode_conf_change(change)) == change


@pytest.mark.parametrize(
    "change",
    [
        ConfChange(ConfChangeKind.REMOVE, ""),
        ConfChange(ConfChangeKind.REMOVE, "x" * (MAX_NODE_ID_BYTES + 1)),
        ConfChange(ConfChangeKind.REMOVE, "n1", b"c" * (MAX_CONF_CONTEXT_BYTES + 1)),
        ConfChange(7, "n1"),  # type: ignore[arg-type]
    ],
)
def test_encode_refuses_what_could_not_be_decoded(change: ConfChange) -> None:
    with pytest.raises(ValueError):
        encode_conf_change(change)


GOOD = encode_conf_change(CHANGE)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "only 0 bytes"),
        (GOOD[:2], "only 2 bytes"),
        (b"\x02" + GOOD[1:], "version"),
        (GOOD[:1] + b"\x00" + GOOD[2:], "kind"),
        (GOOD[:1] + b"\x09" + GOOD[2:], "kind"),
        (GOOD[:2] + b"\x00" + GOOD[3:], "names no member"),
        (GOOD[:3] + b"\xff\xfe" + GOOD[5:], "UTF-8"),
        (GOOD[:6], "cut short"),
        (GOOD[:-1], "arrived as"),
        (GOOD + b"\x00", "arrived as"),
        (GOOD[:5] + (1 << 31).to_bytes(4, "big") + GOOD[9:], "claims"),
    ],
)
def test_decode_is_strict(data: bytes, why: str) -> None:
    with pytest.raises(ConfChangeDecodeError, match=why):
        decode_conf_change(data)


@given(st.binary(max_size=64))
def test_decode_of_arbitrary_bytes_raises_only_the_decode_error(data: bytes) -> None:
    try:
        change = decode_conf_change(data)
    except ConfChangeDecodeError:
        return
    assert encode_conf_change(change) == data  # accepted bytes are exactly an encoding


@given(st.binary(min_size=1, max_size=64), st.integers(0, 63))
def test_decode_survives_a_corrupted_encoding(noise: bytes, at: int) -> None:
    data = bytearray(GOOD)
    for i, b in enumerate(noise):
        data[(at + i) % len(data)] ^= b
    try:
        change = decode_conf_change(bytes(data))
    except ConfChangeDecodeError:
        return
    assert encode_conf_change(change) == bytes(data)
