"""The protocol's bytes and verdicts, pinned: every request kind encodes to the same
frame, and every damaged request gets the same answer (the decoded value, or the error
code and message), as they did before the request records were written as one table.

The golden file was made by this module's ``python -m tests.unit.test_wire_golden``
on the commit before that change; regenerate it only for a deliberate protocol change.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from dlm import wire

GOLDEN = Path(__file__).parent / "testdata" / "wire_golden.json"

ORIGIN: dict[str, Any] = {"client": "c-1", "seq": 7, "acked": 6}

# One frame per request kind with every field it knows set, plus the version-1 forms.
FRAMES: list[dict[str, Any]] = [
    {"t": "open_lease", "id": 1, "lease": "L", "ttl_ms": 5000, "ephemeral": True}
    | {"meta": {"host": "h"}, **ORIGIN},
    {"t": "open_lease", "id": 1, "lease": "L", "ttl_ms": 5000},
    {"t": "keepalive", "id": 2, "lease": "L", "incarnation": 9, "client": "c-1", "seq": 8},
    {"t": "keepalive", "id": 2, "lease": "L"},
    {"t": "close_lease", "id": 3, "lease": "L", **ORIGIN},
    {"t": "lease_update", "id": 4, "lease": "L", "ttl_ms": 1, "finished": True, **ORIGIN},
    {"t": "acquire", "id": 5, "lease": "L", "key": "jobs/a", "wait": True, "limit": 3}
    | {"meta": {"pid": "1"}, **ORIGIN},
    {"t": "acquire", "id": 5, "lease": "L", "key": "k", "seq": 1},
    {"t": "release", "id": 6, "lease": "L", "key": "k", "token": 41, "keep_lease": True} | ORIGIN,
    {"t": "get", "id": 7, "key": "k", "stale": True},
    {"t": "list", "id": 8, "prefix": "jobs/", "stale": True, "after": "jobs/a", "max": 10},
    {"t": "lease_info", "id": 9, "lease": "L"},
    {"t": "lease_list", "id": 10, "stale": True, "after": "L", "max": 1},
    {"t": "status", "id": 11, "stale": True},
    {"t": "ping", "id": 12},
    {"t": "members", "id": 13},
    {"t": "member_add", "id": 14, "member": "n4", "address": "10.0.0.4:7700", **ORIGIN},
    {"t": "member_remove", "id": 15, "member": "n4", "force": True, **ORIGIN},
    {"t": "member_promote", "id": 16, "member": "n4", **ORIGIN},
    {"t": "auth_add", "id": 17, "name": "ci", "role": "client", "prefixes": ["ci/", "x/"]}
    | {"key_id": b"i" * 8, "stored_key": b"s" * 32, "server_key": b"v" * 32},
    {"t": "auth_remove", "id": 18, "name": "ci"},
    {"t": "auth_rotate", "id": 19, "name": "ci", "key_id": b"i" * 8}
    | {"stored_key": b"s" * 32, "server_key": b"v" * 32},
    {"t": "auth_finish", "id": 20, "name": "ci"},
    {"t": "auth_list", "id": 21},
]

# Values a hostile or careless client puts in a field; most are wrong for every field.
BAD_VALUES: list[Any] = [
    None,
    True,
    False,
    -1,
    0,
    1,
    1001,
    2**63 - 1,
    "",
    "x" * 65,
    "bad lease!",
    "a\n",
    "k" * 513,
    "10.0.0.4:0",
    {"a": 1},
    {"a": "b"},
    [],
    b"k",
]
PAIR_VALUES: list[Any] = [None, True, -1, "", "bad lease!", [], {"": "x"}]


def verdict(frame: Any) -> str:
    """What the decoder says of ``frame``, as one comparable line."""
    try:
        decoded = wire.decode_request(frame)
    except wire.ProtocolError as exc:
        return f"error {exc.code.value}: {exc}"
    encoded = hashlib.sha256(wire.encode_frame(decoded.to_wire())).hexdigest()[:16]
    return f"ok {decoded!r} -> {encoded}"


def _single_edits() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for frame in FRAMES:
        names = sorted(set(frame) | {"token", "address", "prefix", "after", "max", "limit"})
        for name in names:
            if name in frame:
                out.append({k: v for k, v in frame.items() if k != name})
            out.extend(frame | {name: value} for value in BAD_VALUES)
    return out


def _pair_edits() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for frame in FRAMES:
        for a, b in itertools.combinations(sorted(frame), 2):
            for va, vb in itertools.product(PAIR_VALUES, repeat=2):
                out.append(frame | {a: va, b: vb})
    return out


def encodings() -> dict[str, str]:
    """Each request, built from its decoded frame, encoded as a frame (hex)."""
    return {
        json.dumps(frame, sort_keys=True, default=bytes.hex): wire.encode_frame(
            wire.decode_request(frame).to_wire()
        ).hex()
        for frame in FRAMES
    }


def built_encodings() -> list[str]:
    """Requests built by their constructors with defaults left out, as client code does."""
    requests: list[wire.Request] = [
        wire.OpenLease(id=1, lease="L", ttl_ms=5000),
        wire.Renew(id=2, lease="L"),
        wire.CloseLease(id=3, lease="L", seq=4),
        wire.UpdateLease(id=4, lease="L", ttl_ms=10, seq=5),
        wire.Acquire(id=5, lease="L", seq=6, key="k"),
        wire.Release(id=6, lease="L", seq=7, key="k"),
        wire.Get(id=7, key="k"),
        wire.ListLocks(id=8),
        wire.LeaseInfo(id=9, lease="L"),
        wire.ListLeases(id=10),
        wire.Status(id=11),
        wire.Ping(id=12),
        wire.Members(id=13),
        wire.MemberAdd(id=14, member="n4", address="h:1", seq=8),
        wire.MemberRemove(id=15, member="n4", seq=9),
        wire.MemberPromote(id=16, member="n4", seq=10),
        wire.AuthAdd(
            id=17,
            name="ci",
            role="client",
            key_id=b"i" * 8,
            stored_key=b"s" * 32,
            server_key=b"v" * 32,
        ),
        wire.AuthRemove(id=18, name="ci"),
        wire.AuthRotate(
            id=19, name="ci", key_id=b"i" * 8, stored_key=b"s" * 32, server_key=b"v" * 32
        ),
        wire.AuthFinish(id=20, name="ci"),
        wire.AuthList(id=21),
    ]
    return [f"{r!r} -> {wire.encode_frame(r.to_wire()).hex()}" for r in requests]


def current() -> dict[str, Any]:
    pairs = hashlib.sha256()
    for frame in _pair_edits():
        pairs.update(verdict(frame).encode() + b"\n")
    return {
        "encodings": encodings(),
        "built": built_encodings(),
        "single_edits": [verdict(frame) for frame in _single_edits()],
        "pair_edits_sha256": pairs.hexdigest(),
    }


def test_every_request_kind_encodes_to_the_golden_bytes() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert encodings() == golden["encodings"]
    assert built_encodings() == golden["built"]


def test_every_damaged_request_gets_the_golden_verdict() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = [verdict(frame) for frame in _single_edits()]
    for frame, was, is_now in zip(_single_edits(), golden["single_edits"], now, strict=True):
        assert is_now == was, frame


def test_damage_to_two_fields_at_once_gets_the_golden_verdicts() -> None:
    # Which of two bad fields is named first is part of the protocol's behaviour.
    golden = json.loads(GOLDEN.read_text())
    assert current()["pair_edits_sha256"] == golden["pair_edits_sha256"]


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(current(), indent=0, sort_keys=True) + "\n")
    sys.exit(0)
