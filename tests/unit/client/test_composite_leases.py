"""Leases with parts in several partitions (issue 25): a part opened lazily in each
partition that holds a key of the lease, renewals, updates and closes that reach every
part, a lease lost when any part is (and its other parts closed), and the deadline of
the lease the EARLIEST of its parts' deadlines."""

from __future__ import annotations

from typing import Any

import pytest

from dlm.client import core
from dlm.client.errors import LeaseLost, LockHeld
from dlm.client.renewal import EVERY_PARTITION, PartClocks, Renewer, lease_deadline
from dlm.partitioning import partition_of
from dlm.wire import ErrorCode, error, ok

from .test_core import drive, settings
from .test_partition_routing import key_in

P = 4


class FakeCluster:
    """Each partition's leases and locks, answering the flows' Sends as members would
    (WRONG_PARTITION for another partition's key, SESSION_EXPIRED with ``ended``)."""

    def __init__(self, partitions: int = P, ttl_ms: int = 9000) -> None:
        self.partitions = partitions
        self.ttl_ms = ttl_ms
        self.leases: list[dict[str, int]] = [{} for _ in range(partitions)]
        self.ended: list[dict[str, str]] = [{} for _ in range(partitions)]
        self.locks: list[dict[str, str]] = [{} for _ in range(partitions)]
        self.sent: list[tuple[str, int]] = []  # (request type, partition)
        self.unreachable: set[int] = set()
        self.index = 100
        self.default_ttl = 45_000
        self.opened_with: list[tuple[int, int | None]] = []  # (partition, ttl_ms asked)

    def __call__(self, action: Any) -> Any:
        assert isinstance(action, core.Send)
        request: dict[str, Any] = action.request
        p = action.partition
        kind = request["t"]
        self.sent.append((kind, p))
        if p in self.unreachable:
            return core.Failed("connection refused")
        key: str = request.get("key", "")
        if key and partition_of(key, self.partitions) != p:
            return error(1, ErrorCode.WRONG_PARTITION, "no", partitions=self.partitions)
        lease: str = request.get("lease", "")
        self.index += 1
        if kind == "open_lease":
            # An open naming no TTL gets the cluster's default-ttl.
            ttl_ms = request["ttl_ms"] if request.get("ttl_ms") is not None else self.default_ttl
            self.opened_with.append((p, request.get("ttl_ms")))
            self.leases[p][lease] = ttl_ms
            return ok(1, lease=lease, ttl_ms=ttl_ms, incarnation=self.index)
        if kind == "ping":
            return ok(1)
        if lease not in self.leases[p]:
            ended = self.ended[p].get(lease, "unknown")
            return error(1, ErrorCode.SESSION_EXPIRED, "gone", ended=ended)
        if kind == "keepalive":
            return ok(1, lease=lease, ttl_ms=self.leases[p][lease])
        if kind == "lease_update":
            self.leases[p][lease] = request["ttl_ms"]
            return ok(1, lease=lease, ttl_ms=request["ttl_ms"])
        if kind == "close_lease":
            del self.leases[p][lease]
            self.ended[p][lease] = "closed"
            held = [k for k, owner in self.locks[p].items() if owner == lease]
            for k in held:
                del self.locks[p][k]
            return ok(1, lease=lease, released=held)
        if kind == "acquire":
            owner = self.locks[p].get(key)
            if owner not in (None, lease):
                return error(1, ErrorCode.LOCKED, "held", holders=[{"lease": owner}])
            self.locks[p][key] = lease
            return ok(1, result="granted", token=self.index, ttl_ms=self.leases[p][lease])
        if kind == "release":
            self.locks[p].pop(key, None)
            return ok(1, key=key, released="lock", token=None)
        if kind == "lease_info":
            return ok(1, lease=lease, ttl_ms=self.leases[p][lease], remaining_ms=1, keys=[])
        raise AssertionError(f"unexpected {kind}")

    def expire(self, partition: int, lease: str) -> None:
        del self.leases[partition][lease]
        self.ended[partition][lease] = "expired"


def cluster_context() -> tuple[core.Context, Any, FakeCluster]:
    s, clock = settings(["a:1"])
    s.learn_partitions(P)
    s.reached = True
    return s, clock, FakeCluster()


def open_lease(s: core.Context, clock: Any, book: core.LeaseBook, cluster: FakeCluster) -> str:
    opened = drive(core.open_lease_flow(s, 9000, "L"), cluster, clock)
    book.opened(opened)
    return "L"


def acquire(s: core.Context, clock: Any, book: core.LeaseBook, cluster: Any, key: str) -> Any:
    flow = core.lease_acquire_flow(
        s, book, "L", key, wait=None, limit=1, meta=None, known_ttl_ms=9000
    )
    return drive(flow, cluster, clock)


# -- parts opened where the keys are ---------------------------------------------


def test_a_part_is_opened_in_a_keys_partition_the_first_time_only() -> None:
    s, clock, cluster = cluster_context()
    book = core.LeaseBook()
    home = partition_of("L", P)
    open_lease(s, clock, book, cluster)
    other = (home + 1) % P
    key, again = key_in(other, P, "a"), key_in(other, P, "b")
    acquire(s, clock, book, cluster, key)
    acquire(s, clock, book, cluster, again)
    assert cluster.sent == [
        ("open_lease", home),
        ("open_lease", other),
        ("acquire", other),
        ("acquire", other),
    ]
    assert sorted(book.parts("L") or {}) == sorted({home, other})
    assert cluster.locks[other] == {key: "L", again: "L"}


def test_a_lease_opened_without_a_ttl_opens_its_later_parts_with_the_ttl_it_got() -> None:
    s, clock, cluster = cluster_context()
    book = core.LeaseBook()
    home = partition_of("L", P)
    book.opened(drive(core.open_lease_flow(s, None, "L"), cluster, clock))
    other = (home + 1) % P
    acquire(s, clock, book, cluster, key_in(other, P, "a"))
    assert cluster.opened_with == [(home, None), (other, 45_000)]
    assert cluster.leases[home]["L"] == cluster.leases[other]["L"] == 45_000


def test_a_lease_opened_before_the_count_was_known_gets_a_part_where_its_key_is() -> None:
    s, clock = settings(["a:1"])
    cluster = FakeCluster()
    book = core.LeaseBook()
    open_lease(s, clock, book, cluster)  # the count is 1 as far as the client knows
    key = key_in(3, P)
    acquire(s, clock, book, cluster, key)
    assert s.partitions == P
    assert cluster.sent == [
        ("open_lease", 0),
        ("acquire", 0),  # WRONG_PARTITION: the count is learned
        ("open_lease", 3),
        ("acquire", 3),
    ]


def test_a_lease_known_only_by_id_is_found_in_another_partition_and_its_part_opened() -> None:
    s, clock, cluster = cluster_context()
    cluster.leases[1]["L"] = 7000  # opened by another process
    key = key_in(2, P)
    grant = acquire(s, clock, core.LeaseBook(), cluster, key)
    assert grant.key == key
    assert cluster.leases[2]["L"] == 7000
    assert ("open_lease", 2) in cluster.sent


def test_a_lease_no_partition_knows_is_lost() -> None:
    s, clock, cluster = cluster_context()
    with pytest.raises(LeaseLost):
        acquire(s, clock, core.LeaseBook(), cluster, key_in(2, P))
    assert ("open_lease", 2) not in cluster.sent


# -- renewals, updates, closes reach every part ----------------------------------


def lease_in(parts: list[int]) -> tuple[core.Context, Any, FakeCluster, core.LeaseBook]:
    s, clock, cluster = cluster_context()
    book = core.LeaseBook()
    for p in parts:
        cluster.leases[p]["L"] = 9000
        book.opened(core.Lease("L", 9000, confirmed_at=clock.now, partition=p))
    return s, clock, cluster, book


def test_a_renewal_reaches_every_part_and_no_other_partition() -> None:
    s, clock, cluster, book = lease_in([1, 3])
    renewed = drive(core.renew_parts_flow(s, book, "L"), cluster, clock)
    assert renewed.ttls == {1: 9000, 3: 9000} and renewed.whole
    assert cluster.sent == [("keepalive", 1), ("keepalive", 3)]


def test_a_renewal_of_an_unknown_lease_asks_every_partition_and_tolerates_never_had_it() -> None:
    s, clock, cluster = cluster_context()
    cluster.leases[2]["L"] = 9000
    book = core.LeaseBook()
    renewed = drive(core.renew_parts_flow(s, book, "L"), cluster, clock)
    assert renewed.ttls == {2: 9000} and renewed.complete
    assert [p for _, p in cluster.sent] == [0, 1, 2, 3]
    assert sorted(book.parts("L") or {}) == [2]


def test_one_part_lost_loses_the_lease_and_closes_the_other_parts() -> None:
    s, clock, cluster, book = lease_in([0, 1, 3])
    cluster.expire(1, "L")
    with pytest.raises(LeaseLost) as caught:
        drive(core.renew_parts_flow(s, book, "L"), cluster, clock)
    assert caught.value.ended == "expired"
    assert ("close_lease", 0) in cluster.sent and ("close_lease", 3) in cluster.sent
    assert all("L" not in cluster.leases[p] for p in range(P))
    assert book.get("L") is None


def test_a_tombstone_in_one_partition_is_a_loss_even_for_a_lease_known_only_by_id() -> None:
    s, clock, cluster = cluster_context()
    cluster.leases[0]["L"] = 9000
    cluster.ended[2]["L"] = "expired"
    with pytest.raises(LeaseLost):
        drive(core.renew_parts_flow(s, core.LeaseBook(), "L"), cluster, clock)
    assert "L" not in cluster.leases[0]


def test_an_unreachable_part_is_left_out_of_the_round() -> None:
    s, clock, cluster, book = lease_in([0, 2])
    cluster.unreachable.add(2)
    renewed = drive(core.renew_parts_flow(s, book, "L", timeout=2.0), cluster, clock)
    assert renewed.ttls == {0: 9000} and not renewed.whole


def test_close_reaches_every_part() -> None:
    s, clock, cluster, book = lease_in([1, 2])
    cluster.locks[2]["k"] = "L"
    released = drive(core.close_all_flow(s, book, "L"), cluster, clock)
    assert released == ["k"]
    assert [(k, p) for k, p in cluster.sent] == [("close_lease", 1), ("close_lease", 2)]


def test_revoke_by_id_asks_every_partition_and_fails_only_when_none_had_it() -> None:
    s, clock, cluster = cluster_context()
    cluster.leases[3]["L"] = 9000
    drive(core.close_all_flow(s, core.LeaseBook(), "L", must_exist=True), cluster, clock)
    assert "L" not in cluster.leases[3]
    with pytest.raises(LeaseLost) as caught:
        drive(core.close_all_flow(s, core.LeaseBook(), "L", must_exist=True), cluster, clock)
    assert caught.value.ended == "closed"  # the tombstone's word beats "never had it"


def test_a_ttl_update_reaches_every_part() -> None:
    s, clock, cluster, book = lease_in([0, 3])
    ttl = drive(core.update_parts_flow(s, book, "L", 4000), cluster, clock)
    assert ttl == 4000
    assert cluster.leases[0]["L"] == cluster.leases[3]["L"] == 4000
    entry = book.get("L")
    assert entry is not None and entry.ttl_ms == 4000


# -- the clocks: the lease's deadline is the earliest part's ---------------------


def test_the_lease_deadline_is_the_earliest_part_deadline() -> None:
    clocks = PartClocks(9000, 100.0, parts=[0, 2])
    clocks.confirmed_parts(103.0, {0: 9000}, 103.5, complete=False)
    # Part 2 was not confirmed: the lease's deadline is still the one it had from 100.
    assert clocks.deadline == lease_deadline(100.0, 9000)
    clocks.confirmed_parts(106.0, {2: 9000}, 106.5, complete=False)
    assert clocks.deadline == lease_deadline(103.0, 9000)
    assert clocks.parts[2].deadline == lease_deadline(106.0, 9000)


def test_a_part_that_expires_loses_the_lease_whatever_the_others_say() -> None:
    clocks = PartClocks(3000, 100.0, parts=[0, 1])
    renewer = Renewer(clocks, 100.0)
    for t in (101.0, 102.0):
        assert renewer.renewed_parts(t, {0: 3000}, t, complete=False, whole=False) is not None
    # Part 1 was never renewed: its deadline passed, and with it the lease's.
    assert isinstance(renewer.next_step(103.0), core.Lost)
    assert (
        renewer.renewed_parts(103.1, {0: 3000, 1: 3000}, 103.2, complete=False, whole=True) is None
    )


def test_a_part_opened_later_counts_from_its_own_open() -> None:
    clocks = PartClocks(3000, 100.0, parts=[0])
    for t in (101.0, 102.0, 103.0, 104.0):
        clocks.confirmed_parts(t, {0: 3000}, t, complete=False)
    clocks.add_part(2, 104.5, 3000)
    assert not clocks.expired(105.0)
    assert clocks.deadline == lease_deadline(104.0, 3000)


def test_a_ttl_update_caps_every_part_until_confirmed() -> None:
    clocks = PartClocks(60_000, 100.0, parts=[0, 1])
    ticket = clocks.update_sent(101.0, 2000)
    assert clocks.parts[0].deadline == clocks.parts[1].deadline == lease_deadline(101.0, 2000)
    # A renewal of part 0 sent after the update but answered with the old TTL (served
    # before the update was applied) counts with at most the new TTL.
    clocks.confirmed_parts(101.5, {0: 60_000}, 101.6, complete=False)
    assert clocks.parts[0].deadline <= lease_deadline(101.5, 2000)
    clocks.update_settled(ticket, 2000, 101.7, applied=True)
    assert clocks.deadline <= lease_deadline(101.5, 2000)


def test_until_the_parts_are_known_the_partitions_not_asked_count() -> None:
    clocks = PartClocks(3000, 100.0)
    assert EVERY_PARTITION in clocks.parts
    clocks.confirmed_parts(101.0, {2: 3000}, 101.1, complete=False)
    assert clocks.deadline == lease_deadline(100.0, 3000)  # the others may hold a part
    clocks.confirmed_parts(102.0, {2: 3000}, 102.1, complete=True)
    assert EVERY_PARTITION not in clocks.parts
    assert clocks.deadline == lease_deadline(102.0, 3000)


def test_a_waiting_acquire_in_another_partition_is_held_by_someone_else() -> None:
    s, clock, cluster, book = lease_in([0])
    key = key_in(1, P)
    cluster.locks[1][key] = "other"
    with pytest.raises(LockHeld):
        acquire(s, clock, book, cluster, key)


# -- several keys: one global order, all or nothing ------------------------------


def acquire_all(
    s: core.Context, clock: Any, book: core.LeaseBook, cluster: Any, keys: list[str], **kw: Any
) -> Any:
    flow = core.acquire_all_flow(
        s, book, "L", keys, wait=kw.get("wait"), limit=1, meta=None, known_ttl_ms=9000
    )
    return drive(flow, cluster, clock)


def test_several_keys_are_taken_partitions_ascending_keys_sorted_within() -> None:
    s, clock, cluster, book = lease_in([0])
    keys = [key_in(3, P, "z"), key_in(1, P, "b"), key_in(3, P, "a"), key_in(1, P, "y")]
    grants = acquire_all(s, clock, book, cluster, keys)
    expected = [k for _, group in sorted(core_order(keys)) for k in group]
    assert [g.key for g in grants] == expected
    acquires = [p for kind, p in cluster.sent if kind == "acquire"]
    assert acquires == sorted(acquires)
    assert all(g.lease == "L" for g in grants)


def core_order(keys: list[str]) -> list[tuple[int, list[str]]]:
    from dlm.partitioning import partition_order

    return partition_order(keys, P)


def test_a_busy_key_in_a_later_partition_gives_back_what_was_taken() -> None:
    s, clock, cluster, book = lease_in([0])
    first, busy = key_in(0, P, "free"), key_in(2, P, "busy")
    cluster.locks[2][busy] = "someone-else"
    with pytest.raises(LockHeld):
        acquire_all(s, clock, book, cluster, [busy, first])
    assert cluster.locks[0] == {}  # taken, then released
    assert cluster.sent[-1] == ("release", 0)


def test_a_lease_for_a_key_is_opened_in_the_keys_partition_once_the_count_is_known() -> None:
    s, clock = settings(["a:1"])
    cluster = FakeCluster()
    key = key_in(3, P)

    def answer(action: Any) -> Any:
        # The member's greeting teaches the count with the first reply.
        s.learn_partitions(P)
        return cluster(action)

    opened = drive(core.open_near_flow(s, 9000, [key]), answer, clock)
    assert opened.partition == 3
    assert all(not cluster.leases[p] for p in (0, 1, 2)) and opened.id in cluster.leases[3]
    assert [k for k, _ in cluster.sent] == ["open_lease", "close_lease", "open_lease"]
    # Known from the start: one open, in the key's partition.
    cluster.sent.clear()
    again = drive(core.open_near_flow(s, 9000, [key]), cluster, clock)
    assert again.partition == 3 and cluster.sent == [("open_lease", 3)]


def test_lease_info_asks_a_part_the_book_knows_else_finds_one() -> None:
    s, clock, cluster, book = lease_in([2, 3])
    info = drive(core.lease_info_flow(s, "L", book), cluster, clock)
    assert info.lease == "L" and cluster.sent == [("lease_info", 2)]
    cluster.sent.clear()
    info = drive(core.lease_info_flow(s, "L", core.LeaseBook()), cluster, clock)
    assert [p for _, p in cluster.sent] == [0, 1, 2]
    cluster.sent.clear()
    with pytest.raises(LeaseLost):
        drive(core.lease_info_flow(s, "nope", core.LeaseBook()), cluster, clock)
    assert [p for _, p in cluster.sent] == [0, 1, 2, 3]


def test_an_update_that_one_part_took_before_another_was_lost_stays_in_force() -> None:
    s, clock, cluster, book = lease_in([0, 3])
    cluster.expire(3, "L")
    with pytest.raises(LeaseLost) as caught:
        drive(core.update_parts_flow(s, book, "L", 2000), cluster, clock)
    assert cluster.leases[0]["L"] == 2000  # part 0 has the shorter TTL now
    # So the keepers must keep counting with it: "may have been applied", not "refused".
    assert core.update_applied(caught.value) is None


def test_a_part_whose_open_came_back_late_counts_the_moment_the_book_has_it() -> None:
    # Seed 33 of the gateway simulation: the open of the lease's part in partition 1 was
    # first sent at 100.2, its reply lost with a gateway and the retry answered (the same
    # part, deduplicated) only at 101.3, past that part's own deadline. The keeper renews
    # part 0 on; the next round is a third of the TTL away, and until then the lease must
    # not count on the part's (passed) deadline being part 0's.
    book = core.LeaseBook()
    book.opened(core.Lease("L", 1000, 100.0, partition=0))
    clocks = PartClocks(1000, 100.0, parts=[0], opened=lambda: book.parts("L"))
    renewer = Renewer(clocks, 100.0)
    for t in (100.3, 100.6, 100.9):
        assert renewer.renewed_parts(t, {0: 1000}, t + 0.01, complete=False, whole=True)
    book.opened(core.Lease("L", 1000, 100.2, partition=1))
    assert clocks.deadline == lease_deadline(100.2, 1000)
    assert isinstance(renewer.next_step(101.3), core.Lost)
