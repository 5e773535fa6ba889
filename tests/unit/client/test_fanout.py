"""Listings of a partitioned cluster merged into one (dlm.client.fanout): every key once, in
key order, whatever the pages; a lease's parts joined into one lease."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from dlm.client.fanout import (
    PageMerger,
    group_equal,
    join_lease_parts,
    join_leases,
    lease_key,
    merge_sorted,
)
from dlm.partitioning import partition_of
from dlm.views import LeaseSummary


class Partitions:
    """P partitions' sorted listings, paged like a member pages them: up to ``page`` items
    after the cursor, the next cursor the last item's key; ``hidden`` items are cut from a
    page after it is cut (a viewer's permissions), so a page may be short, even empty."""

    def __init__(
        self, keys: Sequence[str], partitions: int, page: int, hidden: frozenset[str] = frozenset()
    ) -> None:
        self.by_partition = [
            sorted(k for k in keys if partition_of(k, partitions) == p) for p in range(partitions)
        ]
        self.page = page
        self.hidden = hidden
        self.asked: list[tuple[int, str | None]] = []

    def pages(self, partition: int, after: str | None) -> tuple[list[str], str | None]:
        self.asked.append((partition, after))
        rest = [k for k in self.by_partition[partition] if after is None or k > after]
        cut = rest[: self.page]
        cursor = cut[-1] if len(rest) > self.page else None
        return [k for k in cut if k not in self.hidden], cursor


def keys_of(rng: random.Random, n: int) -> list[str]:
    return sorted({f"{rng.choice('abc')}/{rng.randrange(10_000):04d}" for _ in range(n)})


@pytest.mark.parametrize("seed", range(40))
def test_every_key_once_in_key_order_whatever_the_pages(seed: int) -> None:
    rng = random.Random(seed)
    keys = keys_of(rng, rng.randrange(0, 120))
    partitions = rng.choice([1, 2, 3, 4, 7])
    hidden = frozenset(k for k in keys if rng.random() < 0.2)
    cluster = Partitions(keys, partitions, page=rng.randrange(1, 9), hidden=hidden)
    merged = merge_sorted(partitions, lambda k: k, cluster.pages)
    assert merged == [k for k in keys if k not in hidden]


def test_a_partition_is_asked_again_only_once_its_page_is_used_up() -> None:
    keys = [f"k{i:03d}" for i in range(40)]
    cluster = Partitions(keys, 4, page=5)
    merge_sorted(4, lambda k: k, cluster.pages)
    # Each partition's pages, each after the last key of its previous page: never a page twice.
    for p in range(4):
        cursors = [after for q, after in cluster.asked if q == p]
        assert len(cursors) == len(set(cursors))
        expected_pages = max(1, -(-len(cluster.by_partition[p]) // 5))
        assert len(cursors) == expected_pages


def test_nothing_comes_out_before_every_partition_has_answered() -> None:
    merger: PageMerger[str] = PageMerger(3, lambda k: k)
    assert merger.wanted() == [0, 1, 2]
    merger.take(0, ["a", "m"], None)
    assert list(merger.ready()) == []  # 1 and 2 may hold smaller keys
    merger.take(1, ["b"], "b")  # more after b
    merger.take(2, [], None)
    # "a" and "b" are safe; "m" waits for partition 1's page after "b".
    assert list(merger.ready()) == ["a", "b"]
    assert merger.wanted() == [1]
    assert merger.cursor(1) == "b"
    merger.take(1, ["c", "z"], None)
    assert list(merger.ready()) == ["c", "m", "z"]
    assert merger.finished


def test_a_page_that_does_not_move_the_cursor_ends_that_partition() -> None:
    merger: PageMerger[str] = PageMerger(2, lambda k: k)
    merger.take(0, ["a"], "a")
    merger.take(1, ["b"], None)
    assert list(merger.ready()) == ["a"]  # partition 0 may hold keys between a and b
    merger.take(0, ["a"], "a")  # the same page again: a repeat is passed over, and it ends
    assert list(merger.ready()) == ["b"]
    assert merger.finished


def test_a_listing_resumed_after_a_key_is_the_rest_of_the_whole_listing() -> None:
    keys = [f"job/{i:02d}" for i in range(30)]
    cluster = Partitions(keys, 4, page=3)
    merger: PageMerger[str] = PageMerger(4, lambda k: k, after="job/11")
    out: list[str] = []
    while not merger.finished:
        for p in merger.wanted():
            merger.take(p, *cluster.pages(p, merger.cursor(p)))
        out.extend(merger.ready())
    assert out == keys[12:]


def test_equal_keys_come_out_side_by_side() -> None:
    merged = merge_sorted(
        2,
        lambda item: item[0],
        lambda p, after: ([("a", p), ("l", p)] if after is None else [], None),
    )
    assert merged == [("a", 0), ("a", 1), ("l", 0), ("l", 1)]
    assert group_equal(merged, lambda item: item[0]) == [
        [("a", 0), ("a", 1)],
        [("l", 0), ("l", 1)],
    ]


def lease(lid: str, holding: list[str], left_ms: int | None, **extra: object) -> LeaseSummary:
    return LeaseSummary.from_wire(
        {
            "id": lid,
            "ttl_ms": 30_000,
            "left_ms": left_ms,
            "holding": holding,
            "waiting": [],
            "meta": {"host": "h1"},
            **extra,
        }
    )


def test_a_lease_in_two_partitions_is_one_lease_with_every_key_and_the_earliest_deadline() -> None:
    joined = join_lease_parts(
        [lease("L", ["b", "d"], 20_000, owner="ci"), lease("L", ["a"], 12_000, owner="ci")]
    )
    assert joined.id == "L"
    assert joined.holding == ["a", "b", "d"]
    assert joined.left_ms == 12_000
    assert joined.ttl_ms == 30_000
    assert joined.meta == {"host": "h1"}
    assert joined.owner == "ci"
    # --json shows the joined lease, not its first part.
    assert joined.to_wire()["holding"] == ["a", "b", "d"]
    assert joined.to_wire()["left_ms"] == 12_000


def test_the_deadline_is_unknown_while_a_part_s_is() -> None:
    assert join_lease_parts([lease("L", ["a"], 5_000), lease("L", ["b"], None)]).left_ms is None


def test_a_lease_of_one_part_is_shown_as_the_member_sent_it() -> None:
    only = lease("L", ["a"], 5_000, future_field=1)
    assert join_lease_parts([only]) is only


def test_join_leases_lists_each_lease_once() -> None:
    listing = [lease("A", ["x"], 1), lease("B", ["p"], 9), lease("B", ["q"], 7), lease("C", [], 3)]
    joined = join_leases(listing)
    assert [lease_key(item) for item in joined] == ["A", "B", "C"]
    assert joined[1].holding == ["p", "q"] and joined[1].left_ms == 7


def test_a_merger_needs_a_partition() -> None:
    with pytest.raises(ValueError):
        PageMerger(0, lambda k: k)
