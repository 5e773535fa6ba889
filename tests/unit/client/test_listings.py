"""The client's listings of a partitioned cluster, driven with canned partitions: `list`,
`lease_list` and `runs` ask every partition, each after its own cursor, and give one
listing by key; `runs KEY` and `status` go to the partition named."""

from __future__ import annotations

from typing import Any

from dlm.client import core
from dlm.partitioning import partition_of
from dlm.wire import ok
from tests.unit.client.test_core import drive, settings

P = 3
KEYS = [f"k/{i:02d}" for i in range(20)]


def by_partition(keys: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(P)}
    for key in sorted(keys):
        out[partition_of(key, P)].append(key)
    return out


class Cluster:
    """P partitions, each paging its own sorted keys two at a time, as a member pages them;
    the first reply (partition 0's) is where the client learns P (as from a greeting)."""

    def __init__(self, s: core.Context, make: Any, field: str) -> None:
        self.s = s
        self.make = make
        self.field = field
        self.held = by_partition(KEYS)
        self.asked: list[tuple[int, str | None]] = []

    def answer(self, action: core.Send) -> Any:
        self.s.learn_partitions(P)
        after = action.request.get("after")
        self.asked.append((action.partition, after))
        rest = [k for k in self.held[action.partition] if after is None or k > after]
        page = rest[:2]
        return ok(
            1, **{self.field: [self.make(k) for k in page]}, next=page[-1] if rest[2:] else None
        )


def test_locks_of_every_partition_come_as_one_listing_by_key() -> None:
    s, clock = settings(["a:1"])
    cluster = Cluster(s, lambda k: {"key": k, "holders": [], "waiters": []}, "locks")
    locks = drive(core.list_locks_flow(s, "k/"), cluster.answer, clock)
    assert [lock.key for lock in locks] == KEYS
    # Each partition is paged through after its own cursor, each page asked for once.
    for p in range(P):
        cursors = [after for q, after in cluster.asked if q == p]
        assert cursors == [None, *cluster.held[p][1::2]][: len(cursors)]
        assert len(cursors) == len(set(cursors))


def test_runs_of_every_partition_come_by_key_and_a_key_s_runs_from_its_partition() -> None:
    s, clock = settings(["a:1"])
    cluster = Cluster(s, lambda k: {"key": k, "outcome": "finished"}, "runs")
    rows = drive(core.runs_flow(s), cluster.answer, clock)
    assert [row["key"] for row in rows] == KEYS
    asked: list[int] = []

    def one_key(action: core.Send) -> Any:
        asked.append(action.partition)
        return ok(1, key=action.request["key"], runs=[{"key": action.request["key"]}])

    assert drive(core.runs_flow(s, "k/07"), one_key, clock) == [{"key": "k/07"}]
    assert asked == [partition_of("k/07", P)]


def test_a_lease_with_parts_in_two_partitions_is_listed_once() -> None:
    s, clock = settings(["a:1"])

    def answer(action: core.Send) -> Any:
        s.learn_partitions(P)
        parts = {
            0: [{"id": "A", "holding": ["a0"], "left_ms": 900}, {"id": "B", "holding": ["b0"]}],
            1: [{"id": "A", "holding": ["a1"], "left_ms": 400}],
            2: [{"id": "C", "holding": []}],
        }
        return ok(1, leases=parts[action.partition], next=None)

    leases = drive(core.list_leases_flow(s), answer, clock)
    assert [(x.id, x.holding, x.left_ms) for x in leases] == [
        ("A", ["a0", "a1"], 400),
        ("B", ["b0"], None),
        ("C", [], None),
    ]


def test_status_goes_to_the_partition_named() -> None:
    s, clock = settings(["a:1"])
    s.learn_partitions(P)
    sent: list[int] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.partition)
        return ok(1, node="n1", role="leader", partition=action.partition, partitions=P)

    view = drive(core.status_flow(s, partition=2), answer, clock)
    assert sent == [2] and view.partition == 2
