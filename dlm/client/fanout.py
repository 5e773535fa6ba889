"""One view of a partitioned cluster from P partitions' answers: listings merged by key,
and a lease's parts joined into one lease.

A cluster of P partitions answers a listing (``list``, ``lease_list``, ``runs`` without
a key) one partition at a time: each partition lists only what it holds, sorted, a page
at a time, and its cursor is the last key (or lease id) of the page. The key space is
one order for every partition, so the same cursor means the same thing everywhere:
"after K" asked of each partition gives, merged, exactly "after K" of the whole
cluster. ``PageMerger`` keeps a cursor per partition, asks a partition again only when
it has nothing buffered, and lets an item out only once no partition can still send a
smaller one (every partition that is not finished has either a buffered item or a
cursor at or past it). So a listing is in key order, every key once, with at most one
page per partition buffered, whatever P.

A lease that holds keys in several partitions has a part in each, under the same id;
a merged lease listing has the parts side by side (equal ids), and ``join_lease_parts``
makes them one lease: its keys from every part, and the earliest deadline.

Pure (no IO, no clock; tests/unit/node/test_purity.py): dlm.client.listings drives it
with the client's flows. Tested by tests/unit/client/test_fanout.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from dlm.views import LeaseSummary

T = TypeVar("T")

MAX_PAGES = 1 << 20
"""A bound on the pages one listing reads (each moves its partition's cursor forward)."""


class PageMerger(Generic[T]):
    """The pages of P partitions' sorted listings, let out as one listing sorted by key.

    ``wanted()`` names the partitions to ask next (each ``after cursor(p)``); their
    answers go to ``take``; ``ready()`` lets out every item that is sure to come before
    anything still unasked; ``finished`` once every partition has said its last page and
    every item is out. Equal keys (a lease's parts) come out side by side, lowest
    partition first.
    """

    def __init__(self, partitions: int, key: Callable[[T], str], after: str | None = None):
        if partitions < 1:
            raise ValueError("a cluster has at least one partition")
        self._key = key
        self._buffers: list[deque[T]] = [deque() for _ in range(partitions)]
        self._cursors: list[str | None] = [after] * partitions
        self._asked = [False] * partitions
        self._done = [False] * partitions

    def wanted(self) -> list[int]:
        """The partitions to ask for their next page: unfinished ones with nothing left."""
        return [p for p, buffer in enumerate(self._buffers) if not self._done[p] and not buffer]

    def cursor(self, partition: int) -> str | None:
        """What to ask ``partition`` for its next page after (None: from the start)."""
        return self._cursors[partition]

    def take(self, partition: int, items: Sequence[T], next_cursor: str | None) -> None:
        """One page of ``partition``; ``next_cursor`` None when it was the last. A page
        that does not move the cursor forward ends that partition's listing (a member must
        not make us ask forever), and an item at or before the cursor we asked after is
        one we have already let out: passed over."""
        before = self._cursors[partition]
        fresh = [item for item in items if before is None or self._key(item) > before]
        self._buffers[partition].extend(sorted(fresh, key=self._key))
        self._asked[partition] = True
        if next_cursor is None or (before is not None and next_cursor <= before):
            self._done[partition] = True
        else:
            self._cursors[partition] = next_cursor

    def finish(self, partition: int) -> None:
        """``partition`` has nothing more to list (it holds none of what is asked)."""
        self._asked[partition] = self._done[partition] = True

    def ready(self) -> Iterator[T]:
        """Every item that no partition can still undercut, smallest key first."""
        while True:
            heads = [(self._key(b[0]), p) for p, b in enumerate(self._buffers) if b]
            if not heads:
                return
            smallest, partition = min(heads)
            for p, buffer in enumerate(self._buffers):
                if buffer or self._done[p]:
                    continue
                cursor = self._cursors[p]
                # Its next page starts after its cursor: it may hold smaller keys.
                if not self._asked[p] or cursor is None or smallest > cursor:
                    return
            yield self._buffers[partition].popleft()

    @property
    def finished(self) -> bool:
        return all(self._done) and not any(self._buffers)


def merge_sorted(
    partitions: int,
    key: Callable[[T], str],
    pages: Callable[[int, str | None], tuple[Sequence[T], str | None]],
) -> list[T]:
    """Every item of every partition, by key: ``pages(p, after)`` is one page of ``p``
    (its items and the cursor of the next, None after the last). The synchronous form of
    what ``merged_listing`` does in a flow (used by the tests and the simulator)."""
    merger = PageMerger(partitions, key)
    out: list[T] = []
    for _ in range(MAX_PAGES):
        for p in merger.wanted():
            merger.take(p, *pages(p, merger.cursor(p)))
        out.extend(merger.ready())
        if merger.finished:
            break
    return out


def group_equal(items: Sequence[T], key: Callable[[T], str]) -> list[list[T]]:
    """Runs of items with equal keys, in order (the items sorted by key)."""
    groups: list[list[T]] = []
    for item in items:
        if groups and key(groups[-1][0]) == key(item):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def lease_key(lease: LeaseSummary) -> str:
    return lease.id or ""


def join_lease_parts(parts: Sequence[LeaseSummary]) -> LeaseSummary:
    """One lease from its parts in several partitions (one part: itself, unchanged).

    ``holding`` and ``waiting``: the keys of every part, sorted (a key is in one
    partition only, so no key is in two parts). ``left_ms``: the earliest deadline, the
    least of the parts' (None when a part's is not known: only a partition's leader
    counts it, and the lease ends with its first part to end). ``ttl_ms``, ``meta``:
    the same in every part (the client opens each part with the lease's terms); the
    least TTL should an update have reached one part and not yet another. ``owner``:
    the first part's that names one.
    """
    from dlm.views import LeaseSummary

    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    lefts = [part.left_ms for part in parts if part.left_ms is not None]
    ttls = [part.ttl_ms for part in parts if part.ttl_ms is not None]
    joined: dict[str, Any] = {
        **first.to_wire(),
        "holding": sorted({key for part in parts for key in part.holding}),
        "waiting": sorted({key for part in parts for key in part.waiting}),
        "left_ms": min(lefts) if len(lefts) == len(parts) else None,
        "ttl_ms": min(ttls) if ttls else None,
    }
    owner = next((part.owner for part in parts if part.owner), None)
    if owner is not None:
        joined["owner"] = owner
    return LeaseSummary.from_wire(joined)


def join_leases(leases: Sequence[LeaseSummary]) -> list[LeaseSummary]:
    """A lease listing merged by id (parts side by side) with each lease's parts joined."""
    return [join_lease_parts(group) for group in group_equal(leases, lease_key)]


def run_key(row: dict[str, Any]) -> str:
    key = row.get("key")
    return key if isinstance(key, str) else ""
