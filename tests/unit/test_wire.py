"""The client protocol codec: round trips, and refusal of everything it does not expect."""

from __future__ import annotations

import random
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm import views, wire
from tests.unit.fuzz import FUZZ, decode_all, hostile_values, mutated
from tests.unit.test_wire_golden import REPLIES  # one of each reply, as a member builds it


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

    monkeypatch.setattr(cbor2, "loads", _decoder.loads)
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
        wire.Hello(wire.HelloRole.CLIENT).to_wire(),
        wire.Hello(wire.HelloRole.PEER, cluster="c", node="n2").to_wire(),
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
    a = wire.Renew(id=1, lease="L")
    assert a == wire.Renew(id=1, lease="L")
    assert hash(a) == hash(wire.Renew(id=1, lease="L"))
    assert a != wire.Renew(id=2, lease="L")
    # Same fields, another type: not equal (they are not tuples).
    assert a != wire.LeaseInfo(id=1, lease="L")
    assert repr(a) == "Renew(id=1, lease='L', incarnation=0, client='', seq=0)"
    with pytest.raises(AttributeError):
        a.lease = "M"
    with pytest.raises(AttributeError):
        a.other = 1
    with pytest.raises(TypeError):
        wire.Renew(1, "L")  # type: ignore[call-arg]
    assert wire.Acquire(id=1, lease="L", seq=2, key="k").meta == {}


def _concrete_requests() -> list[type[wire.Request]]:
    """Every request class the decoder can produce: those with a wire type of their own.

    ``Change`` is an abstract base (its slots are the origin fields every state-changing
    request lists); it is checked through its subclasses.
    """
    found: list[type[wire.Request]] = []
    pending: list[type[wire.Request]] = [wire.Request]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "TYPE" in vars(cls) and cls.TYPE:
            found.append(cls)
    return sorted(found, key=lambda c: c.TYPE)


def test_every_request_type_of_the_protocol_has_a_class() -> None:
    types = {cls.TYPE for cls in _concrete_requests()}
    assert types == {
        "open_lease",
        "keepalive",
        "close_lease",
        "lease_update",
        "acquire",
        "release",
        "proclaim",
        "get",
        "list",
        "lease_info",
        "lease_list",
        "status",
        "ping",
        "members",
        "member_add",
        "member_remove",
        "member_promote",
        "snapshot_save",
        "auth_add",
        "auth_remove",
        "auth_rotate",
        "auth_finish",
        "auth_set",
        "auth_list",
        "runs",
        "watch",
        "config_set",
        "config_get",
    }
    assert {cls.TYPE for cls in _concrete_requests() if issubclass(cls, wire.Change)} == {
        "open_lease",
        "close_lease",
        "lease_update",
        "proclaim",
        "acquire",
        "release",
        "member_add",
        "member_remove",
        "member_promote",
    }


@pytest.mark.parametrize("cls", [wire.Hello, *_concrete_requests()], ids=lambda c: c.__name__)
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


# ---------------------------------------------------------------------------
# Version 2 requests
# ---------------------------------------------------------------------------

ORIGIN = {"client": "c-1", "seq": 7, "acked": 6}

DECODED: list[tuple[dict[str, object], wire.Request]] = [
    (
        {"t": "proclaim", "id": 4, "lease": "L", "key": "k", "value": "v2", **ORIGIN},
        wire.Proclaim(id=4, lease="L", key="k", value="v2", client="c-1", seq=7, acked=6),
    ),
    (
        {
            "t": "open_lease",
            "id": 1,
            "lease": "L",
            "ttl_ms": 5000,
            "ephemeral": True,
            "meta": {"host": "h"},
            **ORIGIN,
        },
        wire.OpenLease(
            id=1,
            lease="L",
            ttl_ms=5000,
            ephemeral=True,
            meta={"host": "h"},
            client="c-1",
            seq=7,
            acked=6,
        ),
    ),
    (
        {"t": "keepalive", "id": 2, "lease": "L", "incarnation": 9, "client": "c-1", "seq": 8},
        wire.Renew(id=2, lease="L", incarnation=9, client="c-1", seq=8),
    ),
    (
        {"t": "close_lease", "id": 3, "lease": "L", **ORIGIN},
        wire.CloseLease(id=3, lease="L", client="c-1", seq=7, acked=6),
    ),
    (
        {"t": "lease_update", "id": 4, "lease": "L", "ttl_ms": 1, "finished": True, **ORIGIN},
        wire.UpdateLease(id=4, lease="L", ttl_ms=1, finished=True, client="c-1", seq=7, acked=6),
    ),
    (
        {
            "t": "acquire",
            "id": 5,
            "lease": "L",
            "key": "jobs/a",
            "wait": True,
            "limit": 3,
            "meta": {"pid": "1"},
            **ORIGIN,
        },
        wire.Acquire(
            id=5,
            lease="L",
            key="jobs/a",
            wait=True,
            limit=3,
            meta={"pid": "1"},
            client="c-1",
            seq=7,
            acked=6,
        ),
    ),
    (
        {
            "t": "release",
            "id": 6,
            "lease": "L",
            "key": "k",
            "token": 41,
            "keep_lease": True,
            **ORIGIN,
        },
        wire.Release(
            id=6, lease="L", key="k", token=41, keep_lease=True, client="c-1", seq=7, acked=6
        ),
    ),
    ({"t": "get", "id": 7, "key": "k", "stale": True}, wire.Get(id=7, key="k", stale=True)),
    (
        {"t": "list", "id": 8, "prefix": "jobs/", "after": "jobs/a", "max": 10},
        wire.ListLocks(id=8, prefix="jobs/", after="jobs/a", max=10),
    ),
    ({"t": "lease_info", "id": 9, "lease": "L"}, wire.LeaseInfo(id=9, lease="L")),
    (
        {"t": "lease_list", "id": 10, "stale": True, "after": "L", "max": 1},
        wire.ListLeases(id=10, stale=True, after="L", max=1),
    ),
    ({"t": "status", "id": 11, "stale": True}, wire.Status(id=11, stale=True)),
    ({"t": "ping", "id": 12}, wire.Ping(id=12)),
    ({"t": "members", "id": 13}, wire.Members(id=13)),
    (
        {"t": "member_add", "id": 14, "member": "n4", "address": "10.0.0.4:7700", **ORIGIN},
        wire.MemberAdd(id=14, member="n4", address="10.0.0.4:7700", client="c-1", seq=7, acked=6),
    ),
    (
        {"t": "member_remove", "id": 15, "member": "n4", "force": True, **ORIGIN},
        wire.MemberRemove(id=15, member="n4", force=True, client="c-1", seq=7, acked=6),
    ),
    (
        {"t": "member_promote", "id": 16, "member": "n4", **ORIGIN},
        wire.MemberPromote(id=16, member="n4", client="c-1", seq=7, acked=6),
    ),
    ({"t": "snapshot_save", "id": 17}, wire.SnapshotSave(id=17)),
    (
        {
            "t": "auth_add",
            "id": 17,
            "name": "ci",
            "role": "client",
            "prefixes": ["ci/"],
            "key_id": b"k" * 8,
            "stored_key": b"s" * 32,
            "server_key": b"v" * 32,
        },
        wire.AuthAdd(
            id=17,
            name="ci",
            role="client",
            prefixes=["ci/"],
            key_id=b"k" * 8,
            stored_key=b"s" * 32,
            server_key=b"v" * 32,
        ),
    ),
    ({"t": "auth_remove", "id": 18, "name": "ci"}, wire.AuthRemove(id=18, name="ci")),
    (
        {
            "t": "auth_rotate",
            "id": 19,
            "name": "ci",
            "key_id": b"k" * 8,
            "stored_key": b"s" * 32,
            "server_key": b"v" * 32,
        },
        wire.AuthRotate(
            id=19, name="ci", key_id=b"k" * 8, stored_key=b"s" * 32, server_key=b"v" * 32
        ),
    ),
    ({"t": "auth_finish", "id": 20, "name": "ci"}, wire.AuthFinish(id=20, name="ci")),
    (
        {"t": "auth_set", "id": 21, "name": "ci", "max_leases": 2, "max_inflight": 0},
        wire.AuthSet(id=21, name="ci", max_leases=2, max_inflight=0),
    ),
    ({"t": "auth_list", "id": 21}, wire.AuthList(id=21)),
    (
        {"t": "config_set", "id": 22, "setting": "max-ttl", "value_ms": 10_000},
        wire.ConfigSet(id=22, setting="max-ttl", value_ms=10_000),
    ),
    ({"t": "config_get", "id": 23}, wire.ConfigGet(id=23)),
    ({"t": "runs", "id": 22, "key": "k"}, wire.Runs(id=22, key="k")),
    ({"t": "watch", "id": 23, "key": "k", "after": 3}, wire.Watch(id=23, key="k", after=3)),
    ({"t": "watch", "id": 24, "prefix": ""}, wire.Watch(id=24, prefix="")),
]


@pytest.mark.parametrize(("frame", "expected"), DECODED, ids=[str(f["t"]) for f, _ in DECODED])
def test_decode_request_of_each_type(frame: dict[str, object], expected: wire.Request) -> None:
    decoded = wire.decode_request(frame)
    assert type(decoded) is type(expected)
    assert decoded == expected
    assert wire.decode_request(decoded.to_wire()) == decoded


def test_every_request_type_is_decoded_by_some_case() -> None:
    assert {type(r) for _, r in DECODED} == set(_concrete_requests())


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (
            {"t": "acquire", "id": 1, "lease": "L", "seq": 123, "key": "k"},
            wire.Acquire(id=1, lease="L", seq=123, key="k"),
        ),
        (
            {"t": "open_lease", "id": 1, "lease": "L", "ttl_ms": 5000},
            wire.OpenLease(id=1, lease="L", ttl_ms=5000),
        ),
        ({"t": "keepalive", "id": 1, "lease": "L"}, wire.Renew(id=1, lease="L")),
        ({"t": "list", "id": 1}, wire.ListLocks(id=1, max=wire.PAGE_MAX)),
    ],
)
def test_version_1_requests_decode_with_no_client_and_defaults(
    frame: dict[str, object], expected: wire.Request
) -> None:
    decoded = wire.decode_request(frame)
    assert decoded == expected
    if isinstance(decoded, wire.Change):
        assert (decoded.client, decoded.acked) == ("", 0)


def test_a_hello_of_version_1_without_max_version_speaks_1() -> None:
    hello = wire.Hello.from_wire({"t": "hello", "role": "client", "version": 1})
    assert (hello.role, hello.version, hello.max_version, hello.speaks) == (
        wire.HelloRole.CLIENT,
        1,
        1,
        1,
    )


def test_a_hello_with_max_version_2_speaks_2_and_names_its_peer() -> None:
    frame = {
        "t": "hello",
        "role": "peer",
        "version": 1,
        "max_version": 2,
        "cluster": "prod",
        "node": "n2",
    }
    hello = wire.Hello.from_wire(frame)
    assert (hello.role, hello.speaks, hello.cluster, hello.node) == (
        wire.HelloRole.PEER,
        2,
        "prod",
        "n2",
    )


def test_our_hello_says_version_1_for_old_members_and_max_version_for_new_ones() -> None:
    frame = wire.Hello(wire.HelloRole.CLIENT).to_wire()
    assert (frame["t"], frame["role"], frame["version"]) == ("hello", "client", 1)
    assert frame["max_version"] == wire.PROTOCOL_VERSION == 5
    assert wire.Hello.from_wire(frame).speaks == wire.PROTOCOL_VERSION


def test_hello_max_version_is_clamped_to_the_encodable_range() -> None:
    def speaks(max_version: int) -> int:
        frame = {"t": "hello", "role": "client", "version": 1, "max_version": max_version}
        return wire.Hello.from_wire(frame).speaks

    assert speaks(0) == 1
    assert speaks(-5) == 1
    assert speaks(1 << 40) == 1 << 16


def test_welcome_carries_the_negotiated_version() -> None:
    assert wire.welcome("n1", "prod", 1) == {
        "t": "welcome",
        "version": 1,
        "node": "n1",
        "cluster": "prod",
    }
    assert wire.welcome("n1", "prod")["version"] == wire.PROTOCOL_VERSION


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "hello", "role": "client"},
        {"t": "hello", "role": "client", "version": 0},
        {"t": "hello", "role": "client", "version": True},
        {"t": "hello", "role": "client", "version": 1, "max_version": "2"},
        {"t": "hello", "role": "admin", "version": 1},
        {"t": "ping", "role": "client", "version": 1},
        {"t": "hello", "role": "peer", "version": 1, "node": 7},
        {"t": "hello", "role": "peer", "version": 1, "partitions": 0},
        {"t": "hello", "role": "peer", "version": 1, "partitions": 65},
        {"t": "hello", "role": "peer", "version": 1, "partitions": "4"},
    ],
)
def test_bad_hellos_are_protocol_errors(frame: dict[str, object]) -> None:
    with pytest.raises(wire.ProtocolError):
        wire.Hello.from_wire(frame)


def test_the_wire_bounds_the_partition_count_as_partitioning_does() -> None:
    from dlm.partitioning import MAX_PARTITIONS

    assert wire._MAX_PARTITIONS == MAX_PARTITIONS


def test_the_partition_count_rides_in_peer_hellos_and_welcomes_only_when_not_1() -> None:
    hello = wire.Hello(wire.HelloRole.PEER, cluster="c", node="n2", partitions=4)
    assert hello.to_wire()["partitions"] == 4
    assert wire.Hello.from_wire(hello.to_wire()).partitions == 4
    plain = wire.Hello(wire.HelloRole.PEER, cluster="c", node="n2").to_wire()
    assert "partitions" not in plain and wire.Hello.from_wire(plain).partitions == 1
    assert wire.welcome("n1", "c", 4, partitions=8, partition=3) == {
        "t": "welcome",
        "version": 4,
        "node": "n1",
        "cluster": "c",
        "partitions": 8,
        "partition": 3,
    }
    assert "partition" not in wire.welcome("n1", "c", 4, partitions=8, partition=0)
    assert wire.welcome("n1", "c", 4, partitions=1) == wire.welcome("n1", "c", 4)


INT_MAX = 2**63 - 1


def _acquire(**fields: object) -> dict[str, object]:
    return {"t": "acquire", "id": 1, "lease": "L", "key": "k", **ORIGIN, **fields}


@pytest.mark.parametrize(
    ("frame", "ok"),
    [
        ({"t": "ping", "id": INT_MAX}, True),
        ({"t": "ping", "id": INT_MAX + 1}, False),
        ({"t": "ping", "id": -1}, False),
        (_acquire(seq=INT_MAX), True),
        (_acquire(seq=INT_MAX + 1), False),
        (_acquire(seq=-1), False),
        (_acquire(acked=INT_MAX), True),
        (_acquire(acked=INT_MAX + 1), False),
        ({"t": "keepalive", "id": 1, "lease": "L", "seq": INT_MAX + 1}, False),
        ({"t": "keepalive", "id": 1, "lease": "L", "incarnation": INT_MAX + 1}, False),
        ({"t": "release", "id": 1, "lease": "L", "key": "k", "token": 0, **ORIGIN}, False),
        (
            {"t": "release", "id": 1, "lease": "L", "key": "k", "token": INT_MAX + 1, **ORIGIN},
            False,
        ),
        (_acquire(client="x" * 64), True),
        (_acquire(client="x" * 65), False),
        (_acquire(client="a b"), False),
        (_acquire(limit=1024), True),
        (_acquire(limit=0), False),
        (_acquire(limit=1025), False),
    ],
)
def test_integers_and_ids_on_the_wire_are_bounded(frame: dict[str, object], ok: bool) -> None:
    if ok:
        wire.decode_request(frame)
    else:
        with pytest.raises(wire.ProtocolError):
            wire.decode_request(frame)


@pytest.mark.parametrize("ttl", [-1, INT_MAX + 1, "5s", 1.5, True, None])
@pytest.mark.parametrize("kind", ["open_lease", "lease_update"])
def test_a_ttl_must_be_a_64_bit_count_of_milliseconds(kind: str, ttl: object) -> None:
    # The range of the limits rules (1 s to 24 h for a lease) is the lock rules' to check:
    # the member refuses it before proposing (tests/unit/node/test_machine.py).
    if kind == "open_lease" and ttl is None:
        # Protocol version 5: an open may leave its TTL to the cluster's default-ttl.
        assert wire.decode_request({"t": kind, "id": 1, "lease": "L", "ttl_ms": None, **ORIGIN})
        return
    with pytest.raises(wire.ProtocolError):
        wire.decode_request({"t": kind, "id": 1, "lease": "L", "ttl_ms": ttl, **ORIGIN})


@pytest.mark.parametrize(
    ("member", "ok"),
    [
        ("n4", True),
        ("a.b-c_9", True),
        ("m" * 63, True),
        ("", False),
        ("m" * 64, False),
        ("n 4", False),
        ("n/4", False),
        ("n4\n", False),
        (4, False),
    ],
)
def test_member_ids_are_names(member: object, ok: bool) -> None:
    frame = {"t": "member_promote", "id": 1, "member": member, **ORIGIN}
    if ok:
        assert wire.decode_request(frame).member == member  # type: ignore[union-attr]
    else:
        with pytest.raises(wire.ProtocolError):
            wire.decode_request(frame)


@pytest.mark.parametrize("address", ["", "h:0", "h:x", "[::1"])
def test_a_member_add_needs_a_valid_address(address: str) -> None:
    frame = {"t": "member_add", "id": 1, "member": "n4", "address": address, **ORIGIN}
    with pytest.raises(wire.ProtocolError, match="address"):
        wire.decode_request(frame)


@pytest.mark.parametrize("kind", ["list", "lease_list"])
@pytest.mark.parametrize(
    ("page", "expected"), [(1, 1), (wire.PAGE_MAX, wire.PAGE_MAX), (None, wire.PAGE_MAX)]
)
def test_a_page_holds_1_to_1000_items(kind: str, page: int | None, expected: int) -> None:
    frame: dict[str, object] = {"t": kind, "id": 1}
    if page is not None:
        frame["max"] = page
    assert wire.decode_request(frame).max == expected  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["list", "lease_list"])
@pytest.mark.parametrize("bad", [{"max": 0}, {"max": 1001}, {"max": "10"}, {"after": 3}])
def test_paging_fields_out_of_range_are_refused(kind: str, bad: dict[str, object]) -> None:
    with pytest.raises(wire.ProtocolError):
        wire.decode_request({"t": kind, "id": 1, **bad})


def test_a_client_frame_that_is_not_cbor_is_answered_and_the_stream_stays_in_step() -> None:
    good = wire.encode_frame({"t": "ping", "id": 1})
    junk = struct.pack(">I", 6) + b"\xff\xfe\xfd\xfc\xfb\xfa"
    tagged = cbor2.dumps(cbor2.CBORTag(1, 0))
    tagged_frame = struct.pack(">I", len(tagged)) + tagged
    tolerant = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT, tolerate_bad_bodies=True)
    tolerant.feed(junk + tagged_frame + good)
    frames = list(tolerant.frames())
    assert [type(f) for f in frames] == [wire.BadFrame, wire.BadFrame, dict]
    assert all(f.code is wire.ErrorCode.BAD_REQUEST for f in frames[:2])
    assert frames[2] == {"t": "ping", "id": 1}

    strict = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT)
    strict.feed(junk + good)
    with pytest.raises(wire.ProtocolError):
        list(strict.frames())


def test_an_oversized_length_still_ends_a_tolerant_stream() -> None:
    tolerant = wire.FrameDecoder(1024, tolerate_bad_bodies=True)
    tolerant.feed(struct.pack(">I", 1 << 30) + b"\0" * 8)
    with pytest.raises(wire.ProtocolError) as info:
        list(tolerant.frames())
    assert info.value.code is wire.ErrorCode.TOO_LARGE


def test_a_peer_hello_carries_its_address_and_a_malformed_one_is_refused() -> None:
    hello = wire.Hello(wire.HelloRole.PEER, cluster="c", node="n4", addr="10.0.0.4:7700")
    assert wire.Hello.from_wire(hello.to_wire()).addr == "10.0.0.4:7700"
    assert "addr" not in wire.Hello(wire.HelloRole.CLIENT).to_wire()
    assert wire.Hello.from_wire(wire.Hello(wire.HelloRole.PEER).to_wire()).addr == ""
    for bad in ("10.0.0.4:99999", "10.0.0.4:port", "x" * 400 + ":1", 7):
        with pytest.raises(wire.ProtocolError):
            wire.Hello.from_wire({**hello.to_wire(), "addr": bad})


# ---------------------------------------------------------------------------
# The request table
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", _concrete_requests(), ids=lambda c: c.__name__)
def test_each_request_names_how_a_member_serves_it(cls: type[wire.Request]) -> None:
    assert cls.ROUTE in {"local", "propose", "member", "confirm", "read", "identity", "watch"}
    assert cls.PERMISSION in {"any", "read", "key", "lock", "lease", "admin"}
    assert wire.REQUESTS[cls.TYPE] is cls
    # A state change is proposed or is a membership change; nothing else is.
    assert issubclass(cls, wire.Change) == (cls.ROUTE in {"propose", "member"})


def test_a_request_is_built_only_from_its_named_fields() -> None:
    with pytest.raises(TypeError, match="needs the keyword argument 'seq'"):
        wire.Acquire(id=1, lease="L", key="k")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="has no field 'colour'"):
        wire.Ping(id=1, colour="red")  # type: ignore[call-arg]
    # Each default container is the request's own.
    first, second = (
        wire.Acquire(id=1, lease="L", seq=1, key="k"),
        wire.OpenLease(id=1, lease="L", ttl_ms=1),
    )
    assert first.meta == second.meta == {} and first.meta is not second.meta


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_a_reply_record_survives_the_wire(reply: wire.Reply) -> None:
    frame = wire.decode_body(wire.encode_frame(reply.frame(5))[4:])
    assert (frame["t"], frame["id"]) == ("ok", 5)
    assert type(reply).from_wire(frame) == reply


def test_a_holder_says_nothing_of_lease_clocks_it_does_not_know() -> None:
    holder = views.HolderView(lease="L", token=1, granted_at_ms=5, held_ms=0, meta={})
    assert "ttl_ms" not in holder.to_wire() and "remaining_ms" not in holder.to_wire()
    # From the leader: the TTL, and the time left even when it is unknown (null).
    known = views.HolderView(lease="L", token=1, granted_at_ms=5, held_ms=0, meta={}, ttl_ms=9)
    assert known.to_wire()["remaining_ms"] is None


_REPLY_KINDS: list[type[wire.Reply]] = sorted(
    {type(r) for r in REPLIES}
    | {views.HolderView, views.LockState, views.LocksPage, views.LeaseState, views.LeasesPage},
    key=lambda c: c.__name__,
)


@given(
    st.dictionaries(
        st.sampled_from(["lease", "ttl_ms", "members", "progress", "waiters", "bootstrap", "x"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=5),
            lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c),
            max_leaves=12,
        ),
    )
)
def test_a_hostile_reply_is_read_or_refused_never_crashes_the_client(body: object) -> None:
    for kind in _REPLY_KINDS:
        try:
            kind.from_wire(body)
        except wire.ProtocolError:
            pass


def test_a_peer_hello_says_its_incarnation_only_when_restored() -> None:
    plain = wire.Hello(wire.HelloRole.PEER, cluster="c", node="n1").to_wire()
    assert "incarnation" not in plain  # a cluster never restored keeps its hello's bytes
    hello = wire.Hello(wire.HelloRole.PEER, cluster="c", node="n1", incarnation=2**32 + 7)
    frame = hello.to_wire()
    assert frame["incarnation"] == 2**32 + 7
    assert wire.Hello.from_wire(frame).incarnation == 2**32 + 7
    assert wire.Hello.from_wire(plain).incarnation == 0
    with pytest.raises(wire.ProtocolError, match="incarnation"):
        wire.Hello.from_wire({**frame, "incarnation": -1})
    assert wire.welcome("n1", "c", 3, 9)["incarnation"] == 9
    assert "incarnation" not in wire.welcome("n1", "c", 3)


# -- trace contexts (issue 30) ---------------------------------------------------------

GOOD_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (GOOD_TRACEPARENT.upper(), "lowercase hex"),
        ("01" + GOOD_TRACEPARENT[2:], "version 01 is not supported"),
        ("00-" + "0" * 32 + GOOD_TRACEPARENT[35:], "trace id must not be all zeros"),
        (GOOD_TRACEPARENT[:36] + "0" * 16 + "-01", "span id must not be all zeros"),
        (GOOD_TRACEPARENT + "-x", "55 characters"),
        (GOOD_TRACEPARENT[:-1], "55 characters"),
        (GOOD_TRACEPARENT.replace("-", "_"), "00-TRACEID-SPANID-FLAGS"),
        ("00-4bf92f3577b34da6a3ce929d0e0e47360-0f067aa0ba902b7-01", "2, 32, 16 and 2"),
        ("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "lowercase hex"),
        (55, "must be a string"),
    ],
)
def test_a_bad_traceparent_is_refused_with_one_line(value: object, problem: str) -> None:
    said = wire.traceparent_problem(value)
    assert said is not None and problem in said and "\n" not in said
    frame = {"t": "acquire", "id": 1, "lease": "L", "key": "k", "seq": 1, "trace": value}
    with pytest.raises(wire.ProtocolError, match="field 'trace'"):
        wire.decode_request(frame)


def test_a_traced_request_round_trips_and_an_untraced_one_leaves_the_field_out() -> None:
    assert wire.traceparent_problem(GOOD_TRACEPARENT) is None
    traced = wire.Acquire(id=7, lease="L1", seq=3, key="k", trace=GOOD_TRACEPARENT)
    assert traced.to_wire()["trace"] == GOOD_TRACEPARENT
    assert wire.decode_request(traced.to_wire()) == traced
    plain = wire.Acquire(id=7, lease="L1", seq=3, key="k")
    assert "trace" not in plain.to_wire() and "trace" not in repr(plain)
    assert wire.decode_request(plain.to_wire()).trace is None  # type: ignore[union-attr]


def test_only_the_lock_and_lease_requests_carry_a_trace() -> None:
    assert {
        "open_lease",
        "keepalive",
        "close_lease",
        "lease_update",
        "acquire",
        "release",
    } == wire.TRACED_REQUESTS
    for kind in wire.TRACED_REQUESTS:
        assert "trace" in wire.REQUESTS[kind].FIELDS
    # Any other request ignores the field, as an older member ignores it on every request.
    assert wire.decode_request({"t": "ping", "id": 1, "trace": "junk"}) == wire.Ping(id=1)
