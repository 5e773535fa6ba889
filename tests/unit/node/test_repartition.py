"""Merging old partitions' states and splitting them by a new count (dlm/node/repartition.py):
after any split each key is in exactly one partition, its own, with its holders, tokens,
waiters, lock-delay and runs; no lease part is lost; tokens never fall."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlm.node import locks
from dlm.node.locks.identities import Verifier
from dlm.node.repartition import RepartitionError, identities_differ, split
from dlm.partitioning import partition_of

from .locks_driver import Driver

LEASES = [f"L{n}" for n in range(6)]
KEYS = [f"k{n}" for n in range(14)]

op = st.tuples(
    st.sampled_from(["open", "acquire", "acquire", "acquire", "release", "close", "expire"]),
    st.sampled_from(LEASES),
    st.integers(0, len(KEYS) - 1),
    st.booleans(),
    st.integers(1, 2),
)


def old_cluster(partitions: int, ops: list[tuple[str, str, int, bool, int]]) -> list[Driver]:
    """One driver per old partition; each op goes to the partition of its key (opens and
    closes of a keyless lease to the lease's own), as a partitioned cluster's client sends
    them."""
    drivers = [Driver(version=4) for _ in range(partitions)]
    for kind, lease, k, flag, limit in ops:
        key = KEYS[k]
        d = drivers[partition_of(key, partitions)]
        if kind == "open":
            d.open(lease, 5_000 * limit, lock_delay_ms=1_000 if flag else 0)
        elif kind == "acquire":
            if d.sm.lease(lease) is None:
                d.open(lease, 10_000, lock_delay_ms=500 if flag else 0)
            d.acquire(lease, key, wait=flag, limit=limit, meta={"cmd": "run"} if flag else None)
        elif kind == "release":
            d.release(lease, key)
        elif kind == "close":
            d.close(lease, revoke=flag)
        else:
            d.expire(lease)
    return drivers


def keys_of(machine: locks.LockStateMachine) -> dict[str, locks.KeyView]:
    listed, _ = machine.list_locks()
    return {view.key: view for view in listed}


def lease_links(machines: list[locks.LockStateMachine]) -> set[tuple[str, str, str]]:
    """(lease, key, held|waits) across every partition."""
    links = set()
    for m in machines:
        for view in m.list_leases()[0]:
            links |= {(view.lease, k, "held") for k in view.holding}
            links |= {(view.lease, k, "waits") for k in view.waiting}
    return links


def all_leases(machines: list[locks.LockStateMachine]) -> set[str]:
    return {v.lease for m in machines for v in m.list_leases()[0]}


@settings(max_examples=150, deadline=None)
@given(
    old=st.integers(1, 4),
    new=st.integers(1, 5),
    ops=st.lists(op, max_size=60),
)
def test_after_any_split_each_key_is_in_exactly_its_own_partition(
    old: int, new: int, ops: list[tuple[str, str, int, bool, int]]
) -> None:
    before = [d.sm for d in old_cluster(old, ops)]
    after = split(before, new)
    assert len(after) == new
    old_keys: dict[str, locks.KeyView] = {}
    for m in before:
        old_keys.update(keys_of(m))
    seen: dict[str, int] = {}
    for p, m in enumerate(after):
        for key, view in keys_of(m).items():
            assert key not in seen, f"{key} in partitions {seen[key]} and {p}"
            seen[key] = p
            assert p == partition_of(key, new)
            # The same holders with the same tokens, the same queue, the same delay.
            assert view == old_keys[key]
    assert set(seen) == set(old_keys)
    # Tokens only rise: no holder's token changed, and every new partition is applied up
    # to the highest old index (its log continues above it).
    top = max(m.applied_index for m in before)
    assert all(m.applied_index == top for m in after)
    # No lease part lost: every (lease, key) link is in the key's new partition, and every
    # lease is somewhere.
    assert lease_links(after) == lease_links(before)
    assert all_leases(after) == all_leases(before)
    for p, m in enumerate(after):
        for lease in m.list_leases()[0]:
            keys = set(lease.holding) | set(lease.waiting)
            if keys:
                assert {partition_of(k, new) for k in keys} == {p}
            elif not any(
                v.holding or v.waiting
                for b in before
                for v in b.list_leases()[0]
                if v.lease == lease.lease
            ):
                assert p == partition_of(lease.lease, new)
    # Totals match, the run ledger moved with its keys.
    assert sum(m.counts().locks for m in after) == sum(m.counts().locks for m in before)
    assert sum(m.counts().waiters for m in after) == sum(m.counts().waiters for m in before)
    for m in before:
        for run in m.ledger.last_runs():
            assert after[partition_of(run.key, new)].ledger.runs_of(run.key) == m.ledger.runs_of(
                run.key
            )


@settings(max_examples=60, deadline=None)
@given(old=st.integers(1, 4), via=st.integers(1, 5), ops=st.lists(op, max_size=50))
def test_splitting_and_merging_back_keeps_every_key(
    old: int, via: int, ops: list[tuple[str, str, int, bool, int]]
) -> None:
    before = [d.sm for d in old_cluster(old, ops)]
    (once,) = split(before, 1)
    (twice,) = split(split(before, via), 1)
    assert keys_of(twice) == keys_of(once)
    assert lease_links([twice]) == lease_links([once])


def test_a_lease_spanning_partitions_is_one_lease_again_where_its_parts_meet() -> None:
    a, b = Driver(version=4), Driver(version=4)
    a.open("job", 7_000, meta={"who": "me"})
    a.acquire("job", "x")
    b.open("job", 7_000, meta={"who": "me"})
    b.acquire("job", "y", meta={"cmd": "backup"})
    (merged,) = split([a.sm, b.sm], 1)
    view = merged.lease("job")
    assert view is not None
    assert set(view.holding) == {"x", "y"} and view.ttl_ms == 7_000 and view.meta == {"who": "me"}
    tokens = {k: keys_of(merged)[k].holders[0].token for k in ("x", "y")}
    assert tokens == {"x": keys_of(a.sm)["x"].holders[0].token, "y": 3}
    assert merged.ledger.runs_of("y")[0].command == "backup"


def test_a_keyless_lease_goes_to_its_own_partition_and_tombstones_everywhere() -> None:
    d = Driver(version=4)
    d.open("idle", 5_000)
    d.open("gone", 5_000)
    d.close("gone")
    after = split([d.sm], 4)
    home = partition_of("idle", 4)
    assert [m.lease("idle") is not None for m in after] == [p == home for p in range(4)]
    # A re-sent open of the ended lease is answered in every new partition as it was.
    before = Driver(version=4)
    before.sm, before.index = locks.LockStateMachine.restore(d.sm.snapshot()), d.index
    expected = before.open("gone", 5_000, seq=2).result
    assert not isinstance(expected, locks.LeaseOpened)
    for m in after:
        replay = Driver(version=4)
        replay.sm, replay.index = m, m.applied_index
        assert replay.open("gone", 5_000, seq=2).result == expected


def test_the_identity_table_is_copied_into_every_partition() -> None:
    a, b = Driver(version=4), Driver(version=4)
    key = Verifier(b"i" * 8, b"s" * 32, b"v" * 32)
    assert a.sm.identities.add("ci", "client", ("ci/",), key) is None
    after = split([a.sm, b.sm], 3)
    assert identities_differ([a.sm, b.sm]) == [1]
    assert all(m.identities.image() == a.sm.identities.image() for m in after)
    assert after[0].identities is not after[1].identities


def test_a_key_in_two_old_partitions_is_a_damaged_backup() -> None:
    a, b = Driver(version=4), Driver(version=4)
    for d in (a, b):
        d.open("l", 5_000)
        d.acquire("l", "same")
    with pytest.raises(RepartitionError, match="'same' is in two partitions"):
        split([a.sm, b.sm], 2)


@pytest.mark.parametrize("count", [0, 65])
def test_a_bad_count_is_refused(count: int) -> None:
    with pytest.raises(RepartitionError, match="partition count"):
        split([locks.LockStateMachine()], count)


def test_an_old_machine_below_version_3_is_brought_up() -> None:
    d = Driver(version=1)
    d.open("l", 5_000)
    d.acquire("l", "k")
    after = split([d.sm], 2)
    assert all(m.version == 3 for m in after)
    assert keys_of(after[partition_of("k", 2)])["k"] == keys_of(d.sm)["k"]


def test_tombstones_keep_their_age_on_the_merged_clock() -> None:
    young, old = Driver(version=4), Driver(version=4)
    old.at_ms += 9_000
    for _ in range(30):
        old.now()
        old.open("tick", 5_000)
    young.open("ended", 5_000)
    young.close("ended")
    (merged,) = split([young.sm, old.sm], 1)
    image: Any = cbor2.loads(merged.snapshot())
    stones = {row[0]: row[4] for row in image[5]}
    young_image: Any = cbor2.loads(young.sm.snapshot())
    age_before = young_image[6][0] - young_image[5][0][4]
    assert image[6][0] - stones["ended"] == age_before
