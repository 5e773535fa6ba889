"""The client protocol codec: round trips, and refusal of everything it does not expect."""

from __future__ import annotations

import struct

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm import wire


def test_oversized_frame_is_refused_before_it_is_buffered() -> None:
    dec = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT)
    dec.feed(struct.pack(">I", wire.CLIENT_FRAME_LIMIT + 1))
    with pytest.raises(wire.ProtocolError) as info:
        list(dec.frames())
    assert info.value.code is wire.ErrorCode.TOO_LARGE


def test_unknown_cbor_tags_are_refused() -> None:
    body = cbor2.dumps(cbor2.CBORTag(999, 0))
    with pytest.raises(wire.ProtocolError):
        wire.decode_body(body)


def test_a_tagged_value_in_a_field_is_refused() -> None:
    frame = {"t": "acquire", "id": 1, "lease": "l", "seq": cbor2.CBORTag(1, 0), "key": "k"}
    with pytest.raises(wire.ProtocolError):
        wire.decode_request(wire.decode_body(cbor2.dumps(frame)))


@pytest.mark.parametrize(
    "frame",
    [
        [],
        {"t": "acquire"},
        {"t": "acquire", "id": 1, "lease": "l", "seq": True, "key": "k"},
        {"t": "acquire", "id": 1, "lease": "bad lease!", "seq": 1, "key": "k"},
        {"t": "acquire", "id": 1, "lease": "lease\n", "seq": 1, "key": "k"},
        {"t": "acquire", "id": 1, "lease": "", "seq": 1, "key": "k"},
        {"t": "acquire", "id": 1, "lease": "x" * 65, "seq": 1, "key": "k"},
        {"t": "acquire", "id": 1, "lease": "l", "seq": 1, "key": ""},
        {"t": "acquire", "id": 1, "lease": "l", "seq": 1, "key": "k", "meta": {"a": 1}},
        {"t": "nope", "id": 1},
    ],
)
def test_bad_requests_are_protocol_errors(frame: object) -> None:
    with pytest.raises(wire.ProtocolError):
        wire.decode_request(frame)


def test_request_round_trip() -> None:
    req = wire.Acquire(id=7, lease="L1", seq=3, key="k", wait=True, limit=2, meta={"h": "x"})
    assert wire.decode_request(req.to_wire()) == req


def test_requests_behave_as_immutable_values() -> None:
    a = wire.KeepAlive(id=1, lease="L")
    assert a == wire.KeepAlive(id=1, lease="L")
    assert hash(a) == hash(wire.KeepAlive(id=1, lease="L"))
    assert a != wire.KeepAlive(id=2, lease="L")
    # Same fields, another type: not equal (they are not tuples).
    assert a != wire.LeaseInfo(id=1, lease="L")
    assert repr(a) == "KeepAlive(id=1, lease='L')"
    with pytest.raises(AttributeError):
        a.lease = "M"
    with pytest.raises(AttributeError):
        a.other = 1
    with pytest.raises(TypeError):
        wire.KeepAlive(1, "L")  # type: ignore[call-arg]
    assert wire.Acquire(id=1, lease="L", seq=2, key="k").meta == {}
    assert wire.Hello(wire.Role.CLIENT).to_wire()["version"] == wire.PROTOCOL_VERSION


@pytest.mark.parametrize("cls", [wire.Hello, *wire.Request.__subclasses__()])
def test_each_record_lists_all_its_slots_as_fields(cls: type[wire.Record]) -> None:
    slots = {name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())}
    assert set(cls.FIELDS) == slots
    assert len(cls.FIELDS) == len(slots)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.binary() | st.text(),
        lambda c: st.lists(c, max_size=6),
        max_leaves=30,
    )
)
def test_arbitrary_cbor_values_never_raise_anything_but_protocol_error(value: object) -> None:
    for decode in (wire.decode_request, wire.Hello.from_wire):
        try:
            decode(value)
        except wire.ProtocolError:
            pass


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:7701", ("127.0.0.1", 7701)), ("host", ("host", 7700)), ("[::1]:9", ("::1", 9))],
)
def test_parse_addr(text: str, expected: tuple[str, int]) -> None:
    assert wire.parse_addr(text) == expected


@pytest.mark.parametrize("text", ["", "h:0", "h:x", "[::1"])
def test_parse_addr_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        wire.parse_addr(text)
