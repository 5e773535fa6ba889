"""The protocol's bytes and verdicts, pinned: every request kind encodes to the same
frame, and every damaged request gets the same answer (the decoded value, or the error
code and message), as they did before the request records were written as one table;
every reply a member builds encodes to the same frame as before the client read the
replies as records; and what a client reads from a reply, whole or damaged, is pinned.

The golden file was made by this module's ``python -m tests.unit.test_wire_golden``
on the commit before each change (the reply reads: with it); regenerate it only for a
deliberate protocol change.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from dlm import views, wire

GOLDEN = Path(__file__).parent / "testdata" / "wire_golden.json"

ORIGIN: dict[str, Any] = {"client": "c-1", "seq": 7, "acked": 6}

# One frame per request kind with every field it knows set, plus the version-1 forms.
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

FRAMES: list[dict[str, Any]] = [
    {"t": "open_lease", "id": 1, "lease": "L", "ttl_ms": 5000, "ephemeral": True}
    | {"meta": {"host": "h"}, **ORIGIN},
    {"t": "open_lease", "id": 1, "lease": "L", "ttl_ms": 5000},
    {"t": "open_lease", "id": 1, "lease": "L", "ttl_ms": 5000, "lock_delay_ms": 2000, **ORIGIN},
    {"t": "keepalive", "id": 2, "lease": "L", "incarnation": 9, "client": "c-1", "seq": 8},
    {"t": "keepalive", "id": 2, "lease": "L"},
    {"t": "close_lease", "id": 3, "lease": "L", **ORIGIN},
    {"t": "close_lease", "id": 3, "lease": "L", "revoke": True, **ORIGIN},
    {"t": "lease_update", "id": 4, "lease": "L", "ttl_ms": 1, "finished": True, **ORIGIN},
    {"t": "acquire", "id": 5, "lease": "L", "key": "jobs/a", "wait": True, "limit": 3}
    | {"meta": {"pid": "1"}, **ORIGIN},
    {"t": "acquire", "id": 5, "lease": "L", "key": "k", "seq": 1},
    {"t": "release", "id": 6, "lease": "L", "key": "k", "token": 41, "keep_lease": True} | ORIGIN,
    {"t": "proclaim", "id": 6, "lease": "L", "key": "k", "value": "host-b", **ORIGIN},
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
    {"t": "snapshot_save", "id": 17},
    {"t": "auth_add", "id": 17, "name": "ci", "role": "client", "prefixes": ["ci/", "x/"]}
    | {"key_id": b"i" * 8, "stored_key": b"s" * 32, "server_key": b"v" * 32},
    {"t": "auth_remove", "id": 18, "name": "ci"},
    {"t": "auth_rotate", "id": 19, "name": "ci", "key_id": b"i" * 8}
    | {"stored_key": b"s" * 32, "server_key": b"v" * 32},
    {"t": "auth_finish", "id": 20, "name": "ci"},
    {"t": "auth_list", "id": 21},
    {"t": "runs", "id": 22, "key": "k"},
    {"t": "runs", "id": 23, "prefix": "p", "after": "a", "max": 5},
    {"t": "close_lease", "id": 24, "lease": "L", "outcome": "finished", "exit_code": 3, **ORIGIN},
    {
        "t": "lease_update",
        "id": 25,
        "lease": "L",
        "ttl_ms": 1,
        "finished": True,
        "outcome": "finished",
        "signal": 9,
        **ORIGIN,
    },
    {"t": "watch", "id": 26, "key": "jobs/a", "after": 41},
    {"t": "watch", "id": 27, "prefix": "jobs/"},
    # Issue 30: a request of a traced job carries the job's trace context.
    {"t": "acquire", "id": 28, "lease": "L", "key": "k", "trace": TRACEPARENT, **ORIGIN},
    {"t": "keepalive", "id": 29, "lease": "L", "trace": TRACEPARENT},
    {"t": "open_lease", "id": 30, "lease": "L", "ttl_ms": 5000, "trace": TRACEPARENT, **ORIGIN},
    {"t": "release", "id": 31, "lease": "L", "key": "k", "trace": TRACEPARENT, **ORIGIN},
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
        wire.Proclaim(id=6, lease="L", seq=7, key="k", value="v"),
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
        wire.SnapshotSave(id=17),
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
        wire.Runs(id=22, key="k"),
        wire.Runs(id=23),
        wire.CloseLease(id=24, lease="L", seq=4, outcome="lock_lost"),
        wire.AuthRemove(id=25, name="ci", request=b"r" * 8),
        wire.AuthSet(id=26, name="ci", max_leases=2, max_locks=0),
    ]
    return [f"{r!r} -> {wire.encode_frame(r.to_wire()).hex()}" for r in requests]


HOLDER: dict[str, Any] = {
    "lease": "L",
    "token": 41,
    "granted_at_ms": 1_700_000_000_000,
    "held_ms": 1500,
}
HOLDERS = [
    # A follower's view: no lease clocks.
    views.HolderView(**HOLDER, meta={"host": "h"}),
    # The leader's: the TTL, and what is left of it (unknown here: null, not left out).
    views.HolderView(**HOLDER, meta={}, ttl_ms=30_000),
    # A `dlm exec --min-hold` whose command ended: when, and until when the lock is held.
    views.HolderView(
        **HOLDER,
        meta={},
        ttl_ms=9000,
        remaining_ms=8000,
        finished_at_ms=1_700_000_001_000,
        hold_until_ms=1_700_000_009_500,
    ),
]
WAITERS = [views.WaiterView(lease="W", since_ms=1_700_000_000_500, position=1, meta={"pid": "7"})]
LOCK = views.LockState(key="jobs/a", limit=2, holders=HOLDERS[1:], waiters=WAITERS)
LEASE = views.LeaseSummary(
    id="L", ttl_ms=30_000, left_ms=None, holding=["jobs/a"], waiting=[], meta={"u": "x"}
)

# One record per reply kind (and per shape a member builds of it), as the member builds it.
REPLIES: list[wire.Reply] = [
    wire.LeaseOpened(lease="L", ttl_ms=5000, incarnation=3),
    wire.LeaseTerms(lease="L", ttl_ms=4000),
    wire.LeaseEnded(lease="L", released=["a", "b"]),
    wire.LockGranted(key="k", token=9, lease="L", ttl_ms=5000),
    wire.LockQueued(key="k", lease="L", position=2),
    wire.LockReleased(key="k", released="queue", token=None, lease_ended=True),
    views.LockState(key="free", limit=1, holders=[], waiters=[]),
    views.LockState(key="k", limit=1, holders=HOLDERS[:1], waiters=[]),
    LOCK,
    views.LocksPage(locks=[LOCK], next="jobs/a"),
    views.LocksPage(locks=[], next=None),
    views.LeaseState(lease="L", ttl_ms=30_000, remaining_ms=29_000, keys=["k"], waiting=["q"]),
    views.LeaseState(lease="L", ttl_ms=30_000, remaining_ms=None, keys=[], waiting=[]),
    views.LeasesPage(leases=[LEASE], next=None),
    views.StatusView(
        node="n1",
        address="127.0.0.1:7701",
        cluster="c",
        role="leader",
        term=3,
        leader="n1",
        leader_address="127.0.0.1:7701",
        commit=9,
        applied=9,
        first_index=1,
        last_index=9,
        members=[
            views.MemberEntry(id="n1", address="127.0.0.1:7701", role="voter"),
            views.MemberEntry(id="n4", address=None, role="learner"),
        ],
        sessions=1,
        locks=2,
        waiters=0,
        version=2,
        cluster_version=2,
        progress={"n1": views.Progress(match=9, next=10, active=True, last_contact_ms=0)},
    ),
    views.StatusView(
        node="n2",
        address=None,
        cluster="c",
        role="follower",
        term=3,
        leader=None,
        leader_address=None,
        commit=9,
        applied=8,
        first_index=1,
        last_index=9,
        members=[],
        sessions=0,
        locks=0,
        waiters=0,
        version=2,
        cluster_version=1,
    ),
    views.MembersView(
        members=[
            views.MemberHealth(
                id="n1",
                address="127.0.0.1:7701",
                role="leader",
                match=9,
                lag=0,
                reachable=True,
                last_contact_ms=0,
            ),
            views.MemberHealth(
                id="n2",
                address=None,
                role="unknown",
                match=None,
                lag=None,
                reachable=False,
                last_contact_ms=None,
            ),
        ],
        leader="n1",
        bootstrap={"n1": "127.0.0.1:7701"},
    ),
]


def reply_encodings() -> list[str]:
    """Each reply as the member sends it (request id 7), hex."""
    return [f"{type(r).__name__} {wire.encode_frame(r.frame(7)).hex()}" for r in REPLIES]


# Values a careless or hostile member may put in a reply field.
BAD_REPLY_VALUES: list[Any] = [None, True, -1, "", "x", [], [1, "a", {}], {"a": 1}]


def read_verdict(kind: type[wire.Reply], body: Any) -> str:
    """What a client reads from ``body`` as a ``kind``, as one comparable line."""
    try:
        record = kind.from_wire(body)
    except wire.ProtocolError as exc:
        return f"error {exc}"
    return f"ok {record!r}"


def reply_reads() -> list[str]:
    """What a client reads from each reply, whole, with a field missing, and with a field
    holding each bad value."""
    out: list[str] = []
    for reply in REPLIES:
        kind, body = type(reply), reply.to_wire()
        edits = [body] + [{k: v for k, v in body.items() if k != name} for name in body]
        edits += [body | {name: bad} for name in body for bad in BAD_REPLY_VALUES]
        out.extend(f"{kind.__name__} {read_verdict(kind, edit)}" for edit in edits)
    return out


# Hellos (issue 30 added them here): a traced client's hello carries its trace context.
HELLOS: list[wire.Hello] = [
    wire.Hello(wire.HelloRole.CLIENT),
    wire.Hello(wire.HelloRole.CLIENT, trace=TRACEPARENT),
    wire.Hello(wire.HelloRole.PEER, cluster="c", node="n2", addr="h:1", partitions=2),
]


def hello_encodings() -> list[str]:
    """Each hello as sent (hex), and what a member reads back from it."""
    out: list[str] = []
    for hello in HELLOS:
        frame = hello.to_wire()
        out.append(f"{wire.encode_frame(frame).hex()} {wire.Hello.from_wire(frame)!r}")
    return out


def current() -> dict[str, Any]:
    pairs = hashlib.sha256()
    for frame in _pair_edits():
        pairs.update(verdict(frame).encode() + b"\n")
    return {
        "encodings": encodings(),
        "built": built_encodings(),
        "single_edits": [verdict(frame) for frame in _single_edits()],
        "pair_edits_sha256": pairs.hexdigest(),
        "replies": reply_encodings(),
        "reply_reads": reply_reads(),
        "hellos": hello_encodings(),
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


def test_the_backup_reply_frames_are_pinned() -> None:
    """The header and chunk frames that answer ``snapshot_save``, byte for byte."""
    header = wire.SnapshotHeader(
        cluster="prod",
        index=9,
        term=2,
        voters=["n1", "n2", "n3"],
        learners=[],
        leader="n1",
        taken_at_ms=1_790_000_000_000,
    )
    assert wire.encode_frame(header.frame(17)).hex() == (
        "0000005ea96174626f6b67636c75737465726470726f6465696e64657809647465726d0266766f7465"
        "727383626e31626e32626e33686c6561726e65727380666c6561646572626e316b74616b656e5f6174"
        "5f6d731b000001a0c4506c0062696411"
    )
    image = bytes(range(256)) * (wire.BACKUP_CHUNK_BYTES // 256) + b"tail"
    frames = list(wire.backup_chunk_frames(17, image))
    assert [(f["offset"], len(f["data"]), f["last"]) for f in frames] == [
        (0, wire.BACKUP_CHUNK_BYTES, False),
        (wire.BACKUP_CHUNK_BYTES, 4, True),
    ]
    assert wire.encode_frame(frames[1]).hex() == (
        "00000029a56174656368756e6b666f66667365741a000400006464617461447461696c646c617374f562696411"
    )
    assert wire.SnapshotHeader.from_wire(header.frame(17)) == header
    assert wire.SnapshotChunk.from_wire(frames[1]).data == b"tail"


def test_every_reply_a_member_builds_encodes_to_the_golden_bytes() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert reply_encodings() == golden["replies"]


def test_what_a_client_reads_from_each_reply_is_golden() -> None:
    golden = json.loads(GOLDEN.read_text())
    for now, was in zip(reply_reads(), golden["reply_reads"], strict=True):
        assert now == was


def test_every_hello_encodes_to_the_golden_bytes() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert hello_encodings() == golden["hellos"]


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(current(), indent=0, sort_keys=True) + "\n")
    sys.exit(0)
