"""An in-memory ``Storage``: the double the unit tests and the simulator run the core against.

It keeps exactly what a durable store would keep (hard state, a snapshot, the
entries after the compaction point), so a simulated crash can be modelled by
keeping this object and throwing the ``RaftNode`` away.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlm.records import (
    ConfState,
    Entry,
    HardState,
    LogCompacted,
    LogUnavailable,
    Snapshot,
    SnapshotMeta,
    entry_size,
)


class MemoryStorage:
    """Entries after ``_base_index`` in a list; the image of the state machine kept alongside."""

    __slots__ = ("_base_index", "_base_term", "_conf", "_entries", "_hard", "_snapshot")

    def __init__(self, conf: ConfState | None = None) -> None:
        self._hard = HardState()
        self._conf = conf if conf is not None else ConfState()
        self._snapshot: Snapshot | None = None
        self._base_index = 0  # the last compacted index (its term is still known)
        self._base_term = 0
        self._entries: list[Entry] = []

    def __repr__(self) -> str:
        return (
            f"MemoryStorage(first={self.first_index()} last={self.last_index()} hard={self._hard})"
        )

    # -- LogStorage --------------------------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._hard, self._conf

    @property
    def hard_state(self) -> HardState:
        return self._hard

    def first_index(self) -> int:
        return self._base_index + 1

    def last_index(self) -> int:
        return self._base_index + len(self._entries)

    def term(self, index: int) -> int:
        if index == self._base_index:
            return self._base_term
        if index < self._base_index:
            raise LogCompacted(index)
        pos = index - self._base_index - 1
        if pos >= len(self._entries):
            raise LogUnavailable(index)
        return self._entries[pos].term

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        if lo <= self._base_index:
            raise LogCompacted(lo)
        if hi > self.last_index() + 1:
            raise LogUnavailable(hi - 1)
        if lo >= hi:
            return []
        base = self._base_index + 1
        chosen = self._entries[lo - base : hi - base]
        if max_bytes is None:
            return chosen
        total = 0
        for n, e in enumerate(chosen):
            total += entry_size(e)
            if total > max_bytes and n > 0:
                return chosen[:n]
        return chosen

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    # -- Storage -----------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        if first > self.last_index() + 1:
            raise ValueError(f"gap: appending at {first} after last index {self.last_index()}")
        skip = self._base_index + 1 - first
        if skip > 0:  # already compacted away: those entries are committed and equal
            entries = entries[skip:]
            if not entries:
                return
            first = entries[0].index
        del self._entries[first - self._base_index - 1 :]
        self._entries.extend(entries)

    def set_hard_state(self, hard_state: HardState) -> None:
        self._hard = hard_state

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        meta = snapshot.meta
        if self._snapshot is not None and meta.index <= self._snapshot.meta.index:
            return  # older than what we hold already
        self._snapshot = snapshot
        self._base_index = meta.index
        self._base_term = meta.term
        self._entries = []
        if meta.conf.voters:
            self._conf = meta.conf

    def create_snapshot(self, index: int, conf: ConfState, data: bytes) -> Snapshot:
        if index > self.last_index():
            raise LogUnavailable(index)
        if self._snapshot is not None and index < self._snapshot.meta.index:
            raise LogCompacted(index)
        snap = Snapshot(SnapshotMeta(index, self.term(index), conf), data)
        self._snapshot = snap
        if conf.voters:
            self._conf = conf
        return snap

    def compact(self, index: int) -> None:
        if index <= self._base_index:
            return
        snap_index = self._snapshot.meta.index if self._snapshot is not None else 0
        if index > snap_index:
            raise ValueError(f"cannot compact to {index} past the snapshot at {snap_index}")
        self._base_term = self.term(index)
        del self._entries[: index - self._base_index]
        self._base_index = index
