"""Cluster versions, lease incarnations, and compatibility with the previous release.

docs/PROTOCOL.md, "Mixed versions": until the log reaches version 2 every member
(of either release) applies version-1 commands, so this release must write the
same bytes, apply them the same way and read and write the same snapshots as
the previous release (commit e62e477). The previous release's lock machine is
loaded from the archive in tests/compat into a throw-away package for the tests
that compare against it.
"""

from __future__ import annotations

import importlib
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlm.node.locks import (
    AcquireCommand,
    ApplyOutcome,
    CloseLeaseCommand,
    ClusterVersionCommand,
    Command,
    ExpireCommand,
    Granted,
    LeaseClosed,
    LeaseGone,
    LeaseOpened,
    LockStateMachine,
    OpenLeaseCommand,
    Origin,
    Queued,
    ReleaseCommand,
    Released,
    StaleRequest,
    UpdateLeaseCommand,
    decode_command,
    encode_command,
    is_legacy,
    validate_command,
)
from tests import compat

from .locks_driver import LEGACY, Driver

V1 = Origin(LEGACY, 5)
V2 = Origin("c1", 5, 4)


# ---------------------------------------------------------------- the version


def test_a_new_machine_is_at_cluster_version_1() -> None:
    assert LockStateMachine().version == 1


def test_a_cluster_version_entry_raises_the_version_and_answers_nothing() -> None:
    d = Driver(version=1)
    outcome = d.raise_version(2)
    assert outcome.result is None
    assert d.sm.version == 2


def test_the_cluster_version_never_falls() -> None:
    d = Driver(version=2)
    d.raise_version(1)  # a stale proposal from a leader that had not seen the raise
    assert d.sm.version == 2


# --------------------------------------------------------------- incarnations


def test_at_version_1_a_lease_has_incarnation_0() -> None:
    d = Driver(version=1)
    assert d.open("a", client=LEGACY).result == LeaseOpened("a", 10_000, incarnation=0)


def test_at_version_2_a_lease_has_the_index_of_its_open_as_incarnation() -> None:
    d = Driver(version=2)
    d.open("a")
    outcome = d.open("b", client=LEGACY)
    assert outcome.result == LeaseOpened("b", 10_000, incarnation=outcome.index)
    assert d.sm.leases() == [("a", 10_000, outcome.index - 1), ("b", 10_000, outcome.index)]


def test_a_lease_opened_at_version_1_keeps_incarnation_0_after_the_switch() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.raise_version(2)
    assert d.open("a").result == LeaseOpened("a", 10_000, incarnation=0, joined=True)


def test_an_expire_of_another_incarnation_does_nothing() -> None:
    d = Driver()
    incarnation = d.open("a").index
    d.acquire("a", "k")
    before = d.image()
    assert d.expire("a", incarnation + 1).result == LeaseGone("a")
    assert d.image() == before
    assert d.expire("a", incarnation).result == LeaseClosed("a", released=("k",))


def test_an_expire_of_incarnation_0_ends_a_lease_opened_at_version_1() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.raise_version(2)
    outcome = d.expire("a", 0)
    assert outcome.result == LeaseClosed("a")
    assert outcome.expired == ("a",)


def test_an_expire_of_an_older_incarnation_spares_a_lease_reopened_after_its_tombstone_went(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What incarnations protect at version 2, where tombstones refuse a re-open: the
    # tombstone is forgotten (here after one more end), the id is opened again, and an
    # Expire the leader proposed for the first lease arrives late.
    monkeypatch.setattr(LockStateMachine, "tombstone_capacity", 1)
    d = Driver()
    first = d.open("a").index
    d.close("a")
    d.open("x")
    d.close("x")  # pushes a's tombstone out
    second = d.open("a").index
    before = d.image()
    assert d.expire("a", first).result == LeaseGone("a")
    assert d.image() == before
    assert d.sm.leases() == [("a", 10_000, second)]


def test_an_expire_meant_for_a_version_1_lease_spares_its_successor_opened_at_version_2() -> None:
    # The leader tracks lease a (incarnation 0) and its deadline passes: it proposes
    # Expire(a, 0). Already in the log before that entry: a's close, the version
    # raise and a new open of the id (no tombstone: a ended at version 1).
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.close("a", client=LEGACY)
    d.raise_version(2)
    successor = d.open("a").index
    before = d.image()
    assert d.expire("a", 0).result == LeaseGone("a")
    assert d.image() == before
    assert d.sm.leases() == [("a", 10_000, successor)]


# -------------------------------------------------------- lease ends by version


def test_at_version_1_an_ended_lease_id_can_be_opened_again() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.acquire("a", "k", client=LEGACY)
    d.expire("a")
    assert d.open("a", client=LEGACY).result == LeaseOpened("a", 10_000)
    assert d.acquire("a", "k", client=LEGACY).result == Granted("k", d.index, "a")


def test_tombstones_start_at_version_2() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.close("a", client=LEGACY)
    d.raise_version(2)
    assert d.open("a").result == LeaseOpened("a", 10_000, incarnation=d.index)


def test_at_version_1_opening_a_live_lease_joins_it_and_remembers_nothing() -> None:
    d = Driver(version=1)
    d.open("a", 7_000, client=LEGACY, seq=1)
    outcome = d.open("a", 9_000, client=LEGACY, seq=1)
    assert outcome.result == LeaseOpened("a", 7_000, joined=True)
    assert outcome.armed == (("a", 7_000, 0),)


# ------------------------------------------------------------------ encodings


# Written out from the previous release's encode_command (e62e477:dlm/node/locks/commands.py):
# canonical CBOR of ["open", lease, ttl_ms, at_ms], ["close", lease, seq, at_ms],
# ["acquire", lease, seq, key, wait, limit, meta, at_ms], ["release", lease, seq, key, at_ms]
# and ["expire", lease, at_ms].
VERSION_1_BYTES: list[tuple[Command, str]] = [
    (
        OpenLeaseCommand("lease-1", 5_000, Origin(LEGACY, 0), 17),
        "84 646f70656e 676c656173652d31 191388 11",
    ),
    (
        OpenLeaseCommand("ci-42", 86_400_000, Origin(LEGACY, 0), 1_764_115_627_000),
        "84 646f70656e 6563692d3432 1a05265c00 1b0000019abd7c3bf8",
    ),
    (
        CloseLeaseCommand("lease_2", Origin(LEGACY, 3), 18),
        "84 65636c6f7365 676c656173655f32 03 12",
    ),
    (
        CloseLeaseCommand("ci-42", Origin(LEGACY, 2**62 + 5), 1_764_115_627_001),
        "84 65636c6f7365 6563692d3432 1b4000000000000005 1b0000019abd7c3bf9",
    ),
    (
        AcquireCommand(
            "L",
            "jobs/nightly backup",
            True,
            3,
            {"pid": "42", "host": "h1"},
            Origin(LEGACY, 9),
            19,
        ),
        "88 6761637175697265 614c 09 736a6f62732f6e696768746c79206261636b7570 f5 03"
        " a2 63706964 623432 64686f7374 626831 13",
    ),
    (
        AcquireCommand(
            "ci-42", "deploy/prod", False, 1, {}, Origin(LEGACY, 2**62 + 6), 1_764_115_627_002
        ),
        "88 6761637175697265 6563692d3432 1b4000000000000006 6b6465706c6f792f70726f64 f4 01"
        " a0 1b0000019abd7c3bfa",
    ),
    (
        ReleaseCommand("L", "ключ", None, True, Origin(LEGACY, 10), 20),
        "85 6772656c65617365 614c 0a 68d0bad0bbd18ed187 14",
    ),
    (
        ReleaseCommand("ci-42", "k", None, True, Origin(LEGACY, 0), 0),
        "85 6772656c65617365 6563692d3432 00 616b 00",
    ),
    (ExpireCommand("L", 0, 21), "83 66657870697265 614c 15"),
    (
        ExpireCommand("ci-42", 0, 1_764_115_627_003),
        "83 66657870697265 6563692d3432 1b0000019abd7c3bfb",
    ),
]


@pytest.mark.parametrize(("cmd", "hex_bytes"), VERSION_1_BYTES, ids=repr)
def test_version_1_encodings_are_the_previous_release_bytes(cmd: Command, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes)
    assert encode_command(cmd) == data
    assert decode_command(data) == cmd


@pytest.mark.parametrize(
    ("cmd", "legacy"),
    [
        (OpenLeaseCommand("a", 5_000, V1, 0), True),
        (OpenLeaseCommand("a", 5_000, V1, 0, ephemeral=True), False),
        (OpenLeaseCommand("a", 5_000, V1, 0, meta={"host": "h"}), False),
        (OpenLeaseCommand("a", 5_000, V2, 0), False),
        (CloseLeaseCommand("a", V1, 0), True),
        (CloseLeaseCommand("a", V2, 0), False),
        (AcquireCommand("a", "k", True, 2, {"h": "x"}, V1, 0), True),
        (AcquireCommand("a", "k", True, 2, {"h": "x"}, V2, 0), False),
        (ReleaseCommand("a", "k", None, True, V1, 0), True),
        (ReleaseCommand("a", "k", None, False, V1, 0), False),
        (ReleaseCommand("a", "k", 7, True, V1, 0), False),
        (ReleaseCommand("a", "k", None, True, V2, 0), False),
        (UpdateLeaseCommand("a", 5_000, False, V1, 0), False),
        (UpdateLeaseCommand("a", 5_000, False, V2, 0), False),
        (ExpireCommand("a", 0, 0), True),
        (ExpireCommand("a", 7, 0), False),
        (ClusterVersionCommand(2, 0), False),
    ],
    ids=repr,
)
def test_a_command_takes_its_version_1_form_exactly_when_the_previous_release_could_say_it(
    cmd: Command, legacy: bool
) -> None:
    assert is_legacy(cmd) == legacy
    name = cbor2.loads(encode_command(cmd))[0]
    if legacy:
        assert name in ("open", "close", "acquire", "release", "expire")
    elif not isinstance(cmd, ClusterVersionCommand):
        assert name.endswith("2")


def test_a_release_from_a_previous_release_client_applies_alike_on_leader_and_followers() -> None:
    # At version 2, a client of the previous release sends no client id and no
    # keep_lease: the node proposes a version-1 origin with keep_lease False, which
    # has no version-1 form. The leader applies the command object, the followers its
    # bytes; both must do the same.
    leader, follower = Driver(), Driver()
    for d in (leader, follower):
        d.open("a", client=LEGACY)
        d.acquire("a", "k", client=LEGACY)
    cmd = ReleaseCommand("a", "k", None, False, Origin(LEGACY, 99), 0)
    index = leader.index + 1
    from_object = leader.sm.apply_command(index, cmd)
    from_bytes = follower.sm.apply(index, encode_command(cmd))
    assert from_bytes == from_object
    assert from_object.result == Released("k", held=True, token=index - 1)
    assert follower.sm.snapshot() == leader.sm.snapshot()


def _commands() -> st.SearchStrategy[Command]:
    leases = st.sampled_from(["a", "b", "gone"])
    keys = st.sampled_from(["k", "ключ"])
    meta = st.sampled_from([{}, {"host": "h"}])
    origin = st.builds(
        Origin,
        st.sampled_from([LEGACY, "p", "q"]),
        st.integers(0, 6),
        st.integers(0, 3),
    )
    at_ms = st.integers(0, 2**41)
    return st.one_of(
        st.builds(
            OpenLeaseCommand,
            leases,
            st.sampled_from([1_000, 5_000]),
            origin,
            at_ms,
            st.booleans(),
            meta,
        ),
        st.builds(CloseLeaseCommand, leases, origin, at_ms),
        st.builds(
            AcquireCommand, leases, keys, st.booleans(), st.integers(1, 2), meta, origin, at_ms
        ),
        st.builds(
            ReleaseCommand,
            leases,
            keys,
            st.one_of(st.none(), st.integers(1, 12)),
            st.booleans(),
            origin,
            at_ms,
        ),
        st.builds(UpdateLeaseCommand, leases, st.integers(1, 9_000), st.booleans(), origin, at_ms),
        st.builds(ExpireCommand, leases, st.integers(0, 5), at_ms),
        st.builds(ClusterVersionCommand, st.integers(1, 2), at_ms),
    )


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(first=st.lists(_commands(), max_size=8), cmd=_commands())
def test_the_leader_applies_a_command_as_followers_apply_its_bytes(
    first: list[Command], cmd: Command
) -> None:
    leader, follower = Driver(version=1), Driver(version=1)
    for earlier in first:
        leader.run(earlier)
        follower.run(earlier)
    index = leader.index + 1
    from_object = leader.sm.apply_command(index, cmd)
    from_bytes = follower.sm.apply(index, encode_command(cmd))
    # A version-1 open carries no seq (a version-1 open never used it); all else is equal.
    assert replace(from_bytes, command=None) == replace(from_object, command=None)
    assert follower.sm.snapshot() == leader.sm.snapshot()
    if validate_command(cmd) is None:
        assert encode_command(decode_command(encode_command(cmd))) == encode_command(cmd)


# ------------------------------------------------------------------ snapshots


def _image(sm: LockStateMachine) -> list[Any]:
    item: list[Any] = cbor2.loads(sm.snapshot())
    return item


def _version_1_state() -> Driver:
    d = Driver(version=1)
    for lease in ("a", "b", "c"):
        d.open(lease, client=LEGACY)
    d.acquire("a", "k", meta={"host": "h"}, client=LEGACY, seq=11)
    d.acquire("b", "k", wait=True, client=LEGACY, seq=12)
    d.acquire("c", "s", limit=2, client=LEGACY, seq=13)
    d.release("c", "gone", client=LEGACY, seq=14)
    d.acquire("c", "t", client=LEGACY, seq=15)
    d.release("c", "t", client=LEGACY, seq=16)
    return d


def test_at_version_1_the_snapshot_has_the_previous_release_layout() -> None:
    d = _version_1_state()
    granted = {"type": "granted", "key": "k", "token": 4, "lease": "a"}
    # A remembered release also carries the fields version 2 added (the previous
    # release reads past them).
    released = {"type": "released", "key": "t", "held": True, "token": 8, "lease_ended": False}
    assert _image(d.sm) == [
        1,  # layout version
        9,  # applied index
        [  # leases: [id, ttl_ms, opened_at_ms, [[seq, result], ...]], sorted by id
            ["a", 10_000, 1_010, [[11, granted]]],
            ["b", 10_000, 1_020, [[12, {"type": "queued", "key": "k", "position": 1}]]],
            [
                "c",
                10_000,
                1_030,
                [
                    [13, {"type": "granted", "key": "s", "token": 6, "lease": "c"}],
                    [14, {"type": "not_holder", "key": "gone", "holders": []}],
                    [15, {"type": "granted", "key": "t", "token": 8, "lease": "c"}],
                    [16, released],
                ],
            ],
        ],
        [  # keys: [key, limit, [[lease, token, granted_at_ms, meta]], [[lease, since_ms, meta]]]
            ["k", 1, [["a", 4, 1_040, {"host": "h"}]], [["b", 1_050, {}]]],
            ["s", 2, [["c", 6, 1_060, {}]], []],
        ],
    ]


def test_a_previous_release_snapshot_restores_here() -> None:
    # The previous release's layout, written out by hand: [1, applied, leases, keys].
    old = [
        1,
        40,
        [
            ["a", 10_000, 100, [[7, {"type": "granted", "key": "k", "token": 30, "lease": "a"}]]],
            ["b", 5_000, 200, [[8, {"type": "released", "key": "x", "held": True}]]],
        ],
        [["k", 1, [["a", 30, 300, {"host": "h"}]], [["b", 310, {}]]]],
    ]
    sm = LockStateMachine.restore(cbor2.dumps(old, canonical=True))
    assert sm.version == 1 and sm.applied_index == 40
    assert sm.leases() == [("a", 10_000, 0), ("b", 5_000, 0)]
    view = sm.get("k")
    assert view is not None
    assert [(h.lease, h.token) for h in view.holders] == [("a", 30)]
    assert [w.lease for w in view.waiters] == ["b"]
    # Its remembered results answer re-sent version-1 requests, as they did there.
    again = sm.apply_command(41, AcquireCommand("a", "k", False, 1, {}, Origin(LEGACY, 7), 0))
    assert again.result == Granted("k", 30, "a")
    again = sm.apply_command(42, ReleaseCommand("b", "x", None, True, Origin(LEGACY, 8), 0))
    assert again.result == Released("x", held=True)


def test_a_replica_restored_from_a_version_1_snapshot_writes_the_same_version_2_snapshots() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)  # nothing remembered for a
    d.open("b", client=LEGACY)
    d.acquire("b", "k", client=LEGACY)
    replica = LockStateMachine.restore(d.sm.snapshot())
    for sm in (d.sm, replica):
        sm.apply_command(d.index + 1, ClusterVersionCommand(2, 0))
    assert replica.snapshot() == d.sm.snapshot()


def test_at_version_2_a_snapshot_keeps_incarnations_client_memory_and_tombstones() -> None:
    d = Driver()
    incarnation = d.open("a", client="p", seq=1).index
    d.acquire("a", "k", wait=True, client="p", seq=2)
    d.open("b", client="p", seq=3)
    d.acquire("b", "k", wait=True, client="p", seq=4)  # queued behind a
    d.release("a", "free", client="p", seq=5, acked=2)
    d.open("gone", client="q", seq=1)
    d.close("gone", client="q", seq=2)
    restored = Driver()
    restored.sm = LockStateMachine.restore(d.sm.snapshot())
    restored.index = d.index
    assert restored.sm.version == 2
    assert restored.sm.leases()[0] == ("a", 10_000, incarnation)
    assert restored.acquire("b", "k", wait=True, client="p", seq=4).result == Queued("k", 1)
    assert restored.acquire("a", "k", client="p", seq=2).result == StaleRequest(2)
    assert restored.close("gone", client="q", seq=2).result == LeaseClosed("gone")
    assert restored.open("gone", client="q", seq=1).result == LeaseGone("gone")


# ------------------------------------------- against the previous release itself


@dataclass(frozen=True)
class Previous:
    """The previous release's lock modules."""

    commands: ModuleType
    machine: ModuleType


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Previous]:
    """The previous release's lock machine (tests/compat), loaded as a throw-away package."""
    package = "dlm_previous_locks"
    unpacked = compat.extract(tmp_path_factory.mktemp("previous_release"))
    where = tmp_path_factory.mktemp("previous_locks")
    (where / package).mkdir()
    (where / package / "__init__.py").write_text("")
    for name in ("commands", "results", "machine"):
        text = (unpacked / "dlm" / "node" / "locks" / f"{name}.py").read_text()
        text = text.replace("dlm.node.locks.", f"{package}.")
        (where / package / f"{name}.py").write_text(text)
    sys.path.insert(0, str(where))
    try:
        yield Previous(
            commands=importlib.import_module(f"{package}.commands"),
            machine=importlib.import_module(f"{package}.machine"),
        )
    finally:
        sys.path.remove(str(where))
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]


def _old_views(old: Any) -> tuple[object, object]:
    return (
        [view.to_dict() for view in old.list_locks()],
        [(lease, ttl, 0) for lease, ttl in old.leases()],
    )


def _new_views(sm: LockStateMachine) -> tuple[object, object]:
    # The previous release has no lock-delays (cluster version 4): no view shows one.
    views = [view.to_dict() for view in sm.list_locks()[0]]
    for view in views:
        assert view.pop("lock_delay") is None
    return views, sm.leases()


def test_a_version_1_snapshot_restores_with_the_previous_release(previous: Previous) -> None:
    d = _version_1_state()
    old = previous.machine.LockStateMachine.restore(d.sm.snapshot())
    assert _old_views(old) == _new_views(d.sm)
    assert old.applied_index == d.sm.applied_index
    # Restored there, it answers re-sent requests and goes on as this release does.
    later: list[Command] = [
        AcquireCommand("b", "k", True, 1, {}, Origin(LEGACY, 12), 1),
        CloseLeaseCommand("a", Origin(LEGACY, 99), 2),
        AcquireCommand("b", "k", True, 1, {}, Origin(LEGACY, 12), 3),
    ]
    for cmd in later:
        index = d.sm.applied_index + 1
        data = encode_command(cmd)
        _same_outcome(old.apply(index, data), d.sm.apply(index, data))
    assert _old_views(old) == _new_views(d.sm)


def test_a_previous_release_machine_snapshot_restores_here(previous: Previous) -> None:
    old = previous.machine.LockStateMachine()
    c = previous.commands
    log = [
        c.OpenLease("a", 10_000, 1),
        c.OpenLease("b", 5_000, 2),
        c.Acquire("a", 11, "k", False, 1, {"host": "h"}, 3),
        c.Acquire("b", 12, "k", True, 1, {}, 4),
        c.Acquire("a", 13, "t", False, 1, {}, 5),
        c.Release("a", 14, "t", 6),
    ]
    for index, cmd in enumerate(log, start=1):
        old.apply(index, c.encode_command(cmd))
    sm = LockStateMachine.restore(old.snapshot())
    assert sm.version == 1 and sm.applied_index == old.applied_index
    assert _new_views(sm) == _old_views(old)
    # Its remembered results answer re-sent requests here as they would have there.
    resent = ReleaseCommand("a", "t", None, True, Origin(LEGACY, 14), 7)
    assert sm.apply(7, encode_command(resent)).result == Released("t", held=True)
    assert old.apply(7, encode_command(resent)).result.to_dict() == {
        "type": "released",
        "key": "t",
        "held": True,
    }


def _random_version_1_log(rng: random.Random, count: int) -> Iterator[Command]:
    """Commands a previous-release leader could have written: version-1 forms only."""
    leases, keys = ["a", "b", "c"], ["k1", "k2"]
    sent: list[Command] = []
    for _ in range(count):
        lease, key, at_ms = rng.choice(leases), rng.choice(keys), rng.randrange(10**6)
        origin = Origin(LEGACY, rng.randrange(40))  # small: re-used seqs hit the memory
        roll = rng.random()
        cmd: Command
        if roll < 0.15:
            cmd = OpenLeaseCommand(lease, rng.choice([1_000, 60_000]), Origin(LEGACY, 0), at_ms)
        elif roll < 0.5:
            limit = rng.choice([1, 1, 2])
            cmd = AcquireCommand(lease, key, rng.random() < 0.6, limit, {}, origin, at_ms)
        elif roll < 0.75:
            cmd = ReleaseCommand(lease, key, None, True, origin, at_ms)
        elif roll < 0.82:
            cmd = CloseLeaseCommand(lease, origin, at_ms)
        elif roll < 0.88:
            cmd = ExpireCommand(lease, 0, at_ms)
        elif sent:
            cmd = rng.choice(sent)  # a re-sent request
        else:
            continue
        sent.append(cmd)
        yield cmd


def _same_outcome(old: Any, new: ApplyOutcome) -> None:
    """The previous release's outcome and ours agree; ours may add fields it did not have."""
    if old.result is None:
        assert new.result is None
    else:
        assert new.result is not None, old.result
        theirs, ours = old.result.to_dict(), new.result.to_dict()
        assert {name: ours.get(name) for name in theirs} == theirs, (theirs, ours)
    assert [g.to_dict() for g in old.grants] == [p.to_dict() for p in new.promotions]
    assert [(lease, ttl, 0) for lease, ttl in old.opened] == list(new.armed)
    assert (*old.closed, *old.expired) == new.ended
    assert old.expired == new.expired


@pytest.mark.parametrize("seed", range(20))
def test_at_version_1_this_machine_applies_a_log_as_the_previous_release_does(
    previous: Previous, seed: int
) -> None:
    old, new = previous.machine.LockStateMachine(), LockStateMachine()
    for index, cmd in enumerate(_random_version_1_log(random.Random(seed), 300), start=1):
        data = encode_command(cmd)
        _same_outcome(old.apply(index, data), new.apply(index, data))
        assert _old_views(old) == _new_views(new)
    # Each reads the other's snapshot of the state they reached.
    assert _new_views(LockStateMachine.restore(old.snapshot())) == _new_views(new)
    assert _old_views(previous.machine.LockStateMachine.restore(new.snapshot())) == _old_views(old)
