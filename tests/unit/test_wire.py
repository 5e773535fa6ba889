"""The client protocol codec: round trips, and refusal of everything it does not expect."""

from __future__ import annotations

import random
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm import wire
from tests.unit.fuzz import FUZZ, decode_all, hostile_values, mutated


def test_oversized_frame_is_refused_before_it_is_buffered() -> None:
    dec = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT)
    dec.feed(struct.pack(">I", wire.CLIENT_FRAME_LIMIT + 1))
    with pytest.raises(wire.ProtocolError) as info:
        list(dec.frames())
    assert info.value.code is wire.ErrorCode.TOO_LARGE


def _acquire_with_seq(raw_seq: bytes) -> bytes:
    """An acquire frame body whose ``seq`` value is the raw CBOR item ``raw_seq``."""
    head = {"t": "acquire", "id": 1, "lease": "L1", "key": "k"}
    body = bytearray([0xA0 + len(head) + 1])
    for name, value in head.items():
        body += cbor2.dumps(name) + cbor2.dumps(value)
    return bytes(body + cbor2.dumps("seq") + raw_seq)


def _nested(depth: int) -> bytes:
    return b"\xa1\x61t" + b"\x81" * depth + b"\x00"


# Each of these once went straight through to cbor2 (the hardening options were silently
# off): a decoder that accepts any of them again has lost a limit.
HOSTILE_ITEMS = {
    "tag": b"\xc1\x00",
    "unknown tag": b"\xd9\x03\xe7\x00",
    "depth 1000": b"\x81" * 1000 + b"\x00",
    "2**64 (bignum tag)": b"\xc2\x49\x01" + bytes(8),
    "2**64 - 1": b"\x1b" + b"\xff" * 8,
    "2**63": b"\x1b\x80" + bytes(7),
    "-(2**63)": b"\x3b\x7f" + b"\xff" * 7,
    "negative bignum tag": b"\xc3\x41\x05",
    "decimal tag": b"\xc4\x82\x19\x01\x00\xc2\x41\x01",
    "half float": b"\xf9\x3c\x00",
    "double float": b"\xfb" + struct.pack(">d", 1.5),
    "undefined": b"\xf7",
    "simple value": b"\xf0",
    "indefinite map": b"\xbf\x61a\x01\xff",
    "indefinite array": b"\x9f\x01\xff",
    "indefinite text": b"\x7f\x61a\xff",
    "integer map key": b"\xa1\x01\x02",
    "bytes map key": b"\xa1\x41a\x02",
    "shared reference": b"\xd8\x1c\x80",
}


@pytest.mark.parametrize("limit", [wire.CLIENT_FRAME_LIMIT, wire.PEER_FRAME_LIMIT])
@pytest.mark.parametrize("item", list(HOSTILE_ITEMS.values()), ids=list(HOSTILE_ITEMS))
def test_hostile_items_are_refused_by_the_frame_decoder(item: bytes, limit: int) -> None:
    for body in (_acquire_with_seq(item), item):
        dec = wire.FrameDecoder(limit)
        dec.feed(struct.pack(">I", len(body)) + body)
        with pytest.raises(wire.ProtocolError):
            list(dec.frames())


def test_integers_up_to_the_limit_pass_and_round_trip() -> None:
    for n in (0, 23, 24, 2**32, 2**63 - 1, -(2**63 - 1), -1):
        assert wire.decode_body(_acquire_with_seq(cbor2.dumps(n)))["seq"] == n


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_limit_is_exact() -> None:
    # The map is one level: MAX_DEPTH - 1 arrays inside it pass, one more does not.
    assert wire.decode_body(_nested(wire.MAX_DEPTH - 1)) == {"t": _deep(wire.MAX_DEPTH - 1)}
    with pytest.raises(wire.ProtocolError, match="deep"):
        wire.decode_body(_nested(wire.MAX_DEPTH))


def test_a_flood_of_decimal_bignums_is_refused_at_its_first_byte() -> None:
    """The probe's attack: 1.8 MB of decimal tags with huge bignums took 9.6 s to decode."""
    bignum = b"\xc2\x5a" + struct.pack(">I", 60_000) + b"\x07" * 60_000
    item = b"\xc4\x82\x3a\x7f\xff\xff\xff" + bignum
    body = b"\xa1\x61m\x99\x00\x1e" + item * 30
    with pytest.raises(wire.ProtocolError, match="tags"):
        wire.check_cbor(body)
    # Refused as soon as the first tag's head is read, whatever follows it.
    with pytest.raises(wire.ProtocolError, match="tags"):
        wire.check_cbor(body[:40])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "ends inside"),
        (b"\xa1\x61t", "ends inside"),
        (b"\x5a\xff\xff\xff\xff", "ends inside"),
        (b"\x9b" + b"\xff" * 8, "ends inside"),
        (b"\xa0\x00", "after the end"),
        (b"\x1c", "malformed"),
    ],
)
def test_truncated_and_trailing_bytes_are_refused(body: bytes, reason: str) -> None:
    with pytest.raises(wire.ProtocolError, match=reason):
        wire.check_cbor(body)


def test_the_pure_python_cbor2_is_as_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zipapp runs cbor2's pure-Python decoder: the same limits must hold there."""
    from cbor2 import _decoder

    monkeypatch.setattr(wire.cbor2, "loads", _decoder.loads)
    for item in HOSTILE_ITEMS.values():
        with pytest.raises(wire.ProtocolError):
            wire.decode_body(_acquire_with_seq(item))
    assert wire.decode_body(_acquire_with_seq(b"\x01"))["seq"] == 1
    with pytest.raises(wire.ProtocolError, match="not valid CBOR"):
        wire.decode_body(b"\x62\xff\xfe")  # text that is not UTF-8


@FUZZ
@given(st.binary(max_size=400), st.randoms(use_true_random=False))
def test_fuzz_arbitrary_bytes_only_raise_protocol_error(body: bytes, rng: random.Random) -> None:
    decode_all(body, rng)


@FUZZ
@given(hostile_values, st.randoms(use_true_random=False))
def test_fuzz_hostile_values_only_raise_protocol_error(value: Any, rng: random.Random) -> None:
    decode_all(cbor2.dumps(value), rng)


def _valid_client_bodies() -> list[bytes]:
    frames: list[dict[str, Any]] = [
        wire.Hello(wire.Role.CLIENT).to_wire(),
        wire.Hello(wire.Role.PEER, cluster="c", node="n2").to_wire(),
        wire.Acquire(
            id=1, lease="L", seq=2**62, key="k", wait=True, limit=3, meta={"a": "b"}
        ).to_wire(),
        wire.Release(id=2, lease="L", seq=9, key="k").to_wire(),
        wire.OpenLease(id=3, lease="L", ttl_ms=30_000).to_wire(),
        wire.Status(id=4, stale=True).to_wire(),
    ]
    return [cbor2.dumps(f) for f in frames]


@FUZZ
@given(st.sampled_from(_valid_client_bodies()).flatmap(mutated), st.randoms(use_true_random=False))
def test_fuzz_near_valid_client_frames_only_raise_protocol_error(
    body: bytes, rng: random.Random
) -> None:
    decode_all(body, rng)


def test_valid_frames_pass_every_check() -> None:
    rng = random.Random(3)
    for body in _valid_client_bodies():
        assert decode_all(body, rng) >= 2  # accepted by its decoder, under both limits


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
