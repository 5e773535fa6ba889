"""The owner of a lease: the identity whose connection opened it (cluster version 3).

Every replica records it from the ``open3`` entry, snapshots keep it (layout 3), and a
layout-2 image (a member of the previous release, or a cluster still at version 2)
restores with owner "" on every lease.
"""

from __future__ import annotations

from typing import Any

import cbor2

from dlm.node.locks import (
    Invalid,
    LeaseOpened,
    LockStateMachine,
    OpenLeaseCommand,
    Origin,
    decode_command,
    encode_command,
    is_legacy,
    validate_command,
)
from dlm.node.locks.identities import Verifier

from .locks_driver import LEGACY, Driver


def _v3() -> Driver:
    """A machine at version 3 whose identity table has the owners these tests name (an
    open by an identity the table does not have is refused at apply: identities.py)."""
    d = Driver(version=3)
    for n, name in enumerate(("team-a", "team-b", "mallory", "ci", "ops")):
        key = Verifier(bytes([n]) * 8, bytes([n]) * 32, bytes([n]) * 32)
        assert d.sm.identities.add(name, "client", ("k", "b"), key) is None
    return d


def test_an_open_with_an_owner_has_a_version_3_encoding_that_reads_back() -> None:
    cmd = OpenLeaseCommand("a", 10_000, Origin("c1", 3, 2), 1_234, True, {"h": "x"}, owner="ci")
    data = encode_command(cmd)
    assert cbor2.loads(data)[0] == "open3"
    assert decode_command(data) == cmd
    assert not is_legacy(OpenLeaseCommand("a", 10_000, Origin(LEGACY, 3), 0, owner="ci"))


def test_an_open_without_an_owner_keeps_its_version_2_bytes() -> None:
    cmd = OpenLeaseCommand("a", 10_000, Origin("c1", 3, 2), 1_234)
    assert cbor2.loads(encode_command(cmd))[0] == "open2"


def test_an_owner_must_be_printable() -> None:
    bad = OpenLeaseCommand("a", 10_000, Origin("c1", 1), 0, owner="ci\n")
    assert "identity" in (validate_command(bad) or "")
    assert validate_command(OpenLeaseCommand("a", 10_000, Origin("c1", 1), 0, owner="x" * 129))


def test_at_version_3_a_lease_records_its_owner() -> None:
    d = _v3()
    assert isinstance(d.open("a", owner="team-a").result, LeaseOpened)
    d.open("b")
    views, _ = d.sm.list_leases()
    assert [(v.lease, v.owner) for v in views] == [("a", "team-a"), ("b", "")]
    view = d.sm.lease("a")
    assert view is not None and view.owner == "team-a"


def test_before_version_3_every_replica_refuses_an_owner_alike() -> None:
    # A member of the previous release cannot decode open3: it would call it invalid,
    # and so must this release, or the replicas would part ways.
    d = Driver(version=2)
    before = d.image()
    outcome = d.open("a", owner="team-a")
    assert isinstance(outcome.result, Invalid) and "version 3" in outcome.result.message
    assert d.image() == before


def test_a_rejoining_open_keeps_the_first_owner() -> None:
    d = _v3()
    d.open("a", owner="team-a", client="p")
    d.open("a", owner="mallory", client="q")
    view = d.sm.lease("a")
    assert view is not None and view.owner == "team-a"


def _state_at_version_3() -> Driver:
    d = _v3()
    d.open("a", owner="team-a")
    d.acquire("a", "k")
    d.open("b", owner="team-b")
    d.acquire("b", "k", wait=True)
    d.open("c")
    return d


def test_a_version_3_snapshot_keeps_owners() -> None:
    d = _state_at_version_3()
    image: list[Any] = cbor2.loads(d.sm.snapshot())
    assert image[0] == 3
    assert [row[-1] for row in image[3]] == ["team-a", "team-b", ""]
    restored = LockStateMachine.restore(d.sm.snapshot())
    assert restored.snapshot() == d.sm.snapshot()
    assert [v.owner for v in restored.list_leases()[0]] == ["team-a", "team-b", ""]


def test_at_version_2_the_snapshot_keeps_the_layout_version_2_members_read() -> None:
    d = Driver(version=2)
    d.open("a")
    image: list[Any] = cbor2.loads(d.sm.snapshot())
    assert image[0] == 2 and len(image[3][0]) == 8


def test_a_version_2_image_restores_with_no_owners() -> None:
    # Layout 2, as a member of the previous release (or a cluster at version 2) wrote it:
    # [2, applied, version, leases, keys, tombstones, [log_ms, last_stamp_ms]].
    old = [
        2,
        12,
        2,
        [
            ["a", 10_000, 100, 3, False, {"host": "h"}, None, [["c1", 0, []]]],
            ["b", 5_000, 200, 5, True, {}, None, []],
        ],
        [["k", 1, [["a", 4, 300, {}]], [["b", 310, {}]]]],
        [["gone", "", 0, {"type": "session_expired", "lease": "gone"}, 40]],
        [50, 1_200],
    ]
    sm = LockStateMachine.restore(cbor2.dumps(old, canonical=True))
    assert sm.version == 2
    assert [(v.lease, v.owner, v.holding, v.waiting) for v in sm.list_leases()[0]] == [
        ("a", "", ("k",), ()),
        ("b", "", (), ("k",)),
    ]
    # Written again at version 2, it is the same image.
    assert cbor2.loads(sm.snapshot()) == old


def test_a_lease_row_of_the_wrong_length_is_refused() -> None:
    d = _state_at_version_3()
    image: list[Any] = cbor2.loads(d.sm.snapshot())
    image[3][0] = image[3][0][:8]
    try:
        LockStateMachine.restore(cbor2.dumps(image, canonical=True))
    except ValueError as exc:
        assert "layout" in str(exc)
    else:
        raise AssertionError("a short lease row was restored")


# ------------------------------------------------------------------ quotas per owner


def test_quotas_ride_in_version_3_entries_and_read_back() -> None:
    from dlm.node.locks import AcquireCommand

    opened = OpenLeaseCommand("a", 10_000, Origin("c1", 3, 2), 5, owner="ci", quota=7)
    acquire = AcquireCommand("a", "k", True, 1, {}, Origin("c1", 4, 2), 6, quota=9)
    for cmd in (opened, acquire):
        data = encode_command(cmd)
        assert cbor2.loads(data)[0] in ("open3", "acquire3")
        assert decode_command(data) == cmd
    assert cbor2.loads(encode_command(AcquireCommand("a", "k", True, 1, {}, Origin("c1", 4), 6)))[
        0
    ] == ("acquire2")


def test_apply_refuses_what_the_owners_quota_in_the_entry_does_not_allow() -> None:
    from dlm.node.locks import AcquireCommand, QuotaExceeded

    d = _v3()
    d.open("a", owner="ci", client="p")
    refused = d.run(OpenLeaseCommand("b", 10_000, Origin("p", 50), d.now(), owner="ci", quota=1))
    assert refused.result == QuotaExceeded("ci", "leases", 1)
    assert d.sm.lease("b") is None
    d.open("c", owner="ops", client="q")  # another owner is not counted
    assert d.sm.usage.of("ci").leases == 1 and d.sm.usage.of("ops").leases == 1

    def acquire(key: str, seq: int) -> object:
        cmd = AcquireCommand("a", key, True, 1, {}, Origin("p", seq), d.now(), quota=2)
        return d.run(cmd).result

    d.acquire("c", "busy", client="q")
    assert type(acquire("k1", 60)).__name__ == "Granted"
    assert type(acquire("busy", 61)).__name__ == "Queued"
    assert acquire("k2", 62) == QuotaExceeded("ci", "locks", 2)
    # A re-send gets the remembered refusal, not a new decision.
    assert acquire("k2", 62) == QuotaExceeded("ci", "locks", 2)
    assert d.sm.usage.of("ci") == (1, 2)
    restored = LockStateMachine.restore(d.sm.snapshot())
    assert restored.usage.of("ci") == (1, 2) and restored.usage.of("ops") == (1, 1)
    assert restored.snapshot() == d.sm.snapshot()
    # When its lease ends, all of it is given back.
    d.close("a", client="p")
    assert d.sm.usage.of("ci") == (0, 0)


def test_before_version_3_a_quota_in_an_entry_is_refused_alike() -> None:
    from dlm.node.locks import AcquireCommand

    d = Driver(version=2)
    d.open("a")
    before = d.image()
    cmd = AcquireCommand("a", "k", False, 1, {}, Origin("c1", 9), d.now(), quota=3)
    assert isinstance(d.run(cmd).result, Invalid)
    assert d.image() == before


def test_an_acquire_with_its_identity_and_the_owners_quota_has_one_version_3_form() -> None:
    """acquire3: the acquire2 fields, then the asking identity, then the owner's lock quota
    (issue 23: the identities' ``by`` and the quotas' ``quota`` share one form)."""
    from dlm.node.locks import AcquireCommand, Origin, decode_command, encode_command

    for by, quota in (("ci", 0), ("", 4), ("ci", 4)):
        cmd = AcquireCommand("L", "ci/k", True, 1, {"a": "b"}, Origin("p", 3), 1_000, by, quota)
        data = encode_command(cmd)
        item = cbor2.loads(data)
        assert item[0] == "acquire3" and item[-2:] == [by, quota]
        assert decode_command(data) == cmd
    plain = AcquireCommand("L", "k", False, 1, {}, Origin("p", 3), 1_000)
    assert cbor2.loads(encode_command(plain))[0] == "acquire2"
