"""A member's log as the core sees it: the stable prefix in storage plus an unstable tail.

Entries the core has accepted but the runtime has not yet persisted live in
``RaftLog``'s unstable tail (and a snapshot received from the leader waits in
``_snapshot``). ``ready()`` hands them to the runtime once
(``take_unstable``/``take_snapshot``); after the runtime has written them and
called ``advance``, ``stable_to``/``stable_snap_to`` drop them here, and the
same entries are read back from storage from then on.

Invariant: when the tail is empty, ``_offset == last_index() + 1``; otherwise
the tail holds indexes ``_offset .. _offset + len - 1`` and shadows anything the
storage may still hold at or after ``_offset`` (a suffix the runtime will drop
when it persists the tail). Everything below ``_offset`` is durable, so
``durable_index()`` is ``_offset - 1`` (unless a snapshot is still on its way
to the disk, which will replace the whole log).

Pipelining: several batches may be on their way to the disk at once, written
in the order they were taken. ``_in_flight`` remembers each batch's last
entry and how far it may still be trusted: when a later rewrite (a conflicting
suffix cut off, or a snapshot replacing the log) reaches into a batch that is
still in flight, the batch's limit drops below the rewrite, because the disk
will hold the rewrite, not the batch, once the later write completes. So an
acknowledgement that arrives after its entries were overwritten, even by an
entry of the same index and term that came back (A, then B, then A again),
only marks stable what is still what the disk will keep.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from dlm.records import Entry, LogCompacted, LogStorage, LogUnavailable, Snapshot, entry_size


@dataclass(slots=True)
class _Batch:
    """Entries handed to the runtime and not yet acknowledged."""

    last_index: int
    last_term: int
    trusted_to: int
    """The highest index of the batch that no later rewrite has reached."""


class RaftLog:
    __slots__ = (
        "_in_flight",
        "_offset",
        "_persist_from",
        "_snapshot",
        "_snapshot_taken",
        "_storage",
        "_unstable",
        "applied",
        "applying",
        "committed",
    )

    def __init__(self, storage: LogStorage) -> None:
        self._storage = storage
        first = storage.first_index()
        last = storage.last_index()
        self._unstable: list[Entry] = []
        self._offset = last + 1
        self._persist_from = last + 1
        self._snapshot: Snapshot | None = None
        self._snapshot_taken = False
        self._in_flight: deque[_Batch] = deque()
        # The runtime restores its state machine from storage's snapshot, which may
        # be newer than the compaction point (the log is kept behind a snapshot).
        snap = storage.snapshot()
        restored = max(first - 1, snap.meta.index if snap is not None else 0)
        self.committed = restored
        self.applying = restored  # handed to the runtime to apply
        self.applied = restored  # confirmed applied by advance()

    def __repr__(self) -> str:
        return (
            f"RaftLog(first={self.first_index()} last={self.last_index()} "
            f"unstable@{self._offset}x{len(self._unstable)} commit={self.committed} "
            f"applied={self.applied})"
        )

    # -- reading -----------------------------------------------------------

    def first_index(self) -> int:
        if self._snapshot is not None:
            return self._snapshot.meta.index + 1
        return self._storage.first_index()

    def last_index(self) -> int:
        if self._unstable:
            return self._offset + len(self._unstable) - 1
        if self._snapshot is not None:
            return self._snapshot.meta.index
        return self._offset - 1

    def durable_index(self) -> int:
        """The last index that both is in this log and is known to be on disk (0 if unknown)."""
        if self._snapshot is not None:
            return 0  # the disk still holds the log the pending snapshot replaces
        return self._offset - 1

    def term(self, index: int) -> int:
        """The term of the entry at ``index``; raises LogCompacted / LogUnavailable like storage."""
        offset = self._offset
        unstable = self._unstable
        if offset <= index < offset + len(unstable):
            return unstable[index - offset].term
        snap = self._snapshot
        if snap is not None:
            if index == snap.meta.index:
                return snap.meta.term
            if index < snap.meta.index:
                raise LogCompacted(index)
            raise LogUnavailable(index)
        if index >= offset:
            raise LogUnavailable(index)
        return self._storage.term(index)

    def term_or_none(self, index: int) -> int | None:
        try:
            return self.term(index)
        except (LogCompacted, LogUnavailable):
            return None

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, index: int, term: int) -> bool:
        return self.term_or_none(index) == term

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi), at least one if any is in range; raises LogCompacted below first."""
        if lo >= hi:
            return []
        if lo < self.first_index():
            raise LogCompacted(lo)
        last = self.last_index()
        if hi > last + 1:
            raise LogUnavailable(hi - 1)
        offset = self._offset
        out: list[Entry] = []
        budget = max_bytes
        if lo < offset:
            stable_hi = min(hi, offset)
            out = self._storage.entries(lo, stable_hi, max_bytes)
            if hi <= offset or len(out) < stable_hi - lo:
                return out
            if budget is not None:
                budget -= sum(entry_size(e) for e in out)
        start = max(lo, offset) - offset
        end = hi - offset
        if budget is None:
            out.extend(self._unstable[start:end])
            return out
        for e in self._unstable[start:end]:
            budget -= entry_size(e)
            if budget < 0 and out:
                break
            out.append(e)
        return out

    def snapshot(self, storage_snapshot: bool = True) -> Snapshot | None:
        """The newest snapshot we hold: a pending one from the leader, else storage's."""
        if self._snapshot is not None:
            return self._snapshot
        return self._storage.snapshot() if storage_snapshot else None

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft 5.4.1: a log with a later last term, or the same term and no shorter, wins."""
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest i <= index whose term is <= ``term``, and that term.

        Terms never decrease along a log, so a binary search over the indexes we
        can still read finds it in O(log n) term look-ups. Below the first
        readable index we answer ``(index, 0)``: the caller will fall back to a
        snapshot.
        """
        lo = self.first_index() - 1
        hi = min(index, self.last_index())
        if hi < lo:
            return index, 0
        lo_term = self.term(lo)
        if lo_term > term:
            return lo, lo_term
        # Invariant: term(lo) <= term; answer in [lo, hi].
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.term(mid) <= term:
                lo = mid
            else:
                hi = mid - 1
        return lo, self.term(lo)

    # -- changing ----------------------------------------------------------

    def append(self, entry: Entry) -> None:
        """A leader's own new entry, at last_index() + 1."""
        if not self._unstable:
            self._offset = entry.index
        self._unstable.append(entry)

    def truncate_and_append(self, entries: Sequence[Entry]) -> None:
        """Put ``entries`` in place, dropping anything at or after the first one's index."""
        after = entries[0].index
        unstable = self._unstable
        offset = self._offset
        if after == offset + len(unstable):
            unstable.extend(entries)
            return
        # A rewrite: batches still on their way to the disk are overwritten from ``after`` on.
        for batch in self._in_flight:
            if batch.trusted_to >= after:
                batch.trusted_to = after - 1
        if after <= offset:
            self._unstable = list(entries)
            self._offset = after
            self._persist_from = after
        else:
            del unstable[after - offset :]
            unstable.extend(entries)
            self._persist_from = min(self._persist_from, after)

    def maybe_append(
        self, prev_index: int, prev_term: int, commit: int, entries: Sequence[Entry]
    ) -> tuple[int, int] | None:
        """The follower side of AppendEntries: (last index now matched, first index written).

        None when the entries do not attach at (prev_index, prev_term), or would
        overwrite a committed entry. The first index written is 0 when every
        entry was already there. Only a real conflict truncates the log: a stale
        or duplicated message whose entries we already hold changes nothing, so
        a delayed packet can never cut off entries we acknowledged since.
        """
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        conflict = self._find_conflict(entries)
        if conflict:
            if conflict <= self.committed:
                # The leader contradicts a committed entry: refuse rather than rewrite history.
                return None
            self.truncate_and_append(entries[conflict - entries[0].index :])
        self.commit_to(min(commit, last_new))
        return last_new, conflict

    def _find_conflict(self, entries: Sequence[Entry]) -> int:
        if not entries:
            return 0
        last = self.last_index()
        for e in entries:
            if e.index > last:
                return e.index
            if self.term_or_none(e.index) != e.term:
                return e.index
        return 0

    def commit_to(self, index: int) -> bool:
        index = min(index, self.last_index())
        if index > self.committed:
            self.committed = index
            return True
        return False

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log by a snapshot from the leader (persisted via the next Ready)."""
        index = snapshot.meta.index
        for batch in self._in_flight:
            batch.trusted_to = -1  # the disk will hold the snapshot instead
        self._snapshot = snapshot
        self._snapshot_taken = False
        self._unstable = []
        self._offset = index + 1
        self._persist_from = index + 1
        self.committed = index

    # -- handing work to the runtime ---------------------------------------

    def has_work(self) -> bool:
        """Whether entries to persist, a snapshot to install or entries to apply are waiting."""
        return (
            self._persist_from < self._offset + len(self._unstable)
            or self.committed > self.applying
            or (self._snapshot is not None and not self._snapshot_taken)
        )

    def has_unstable(self) -> bool:
        return self._persist_from < self._offset + len(self._unstable)

    def take_unstable(self) -> tuple[Entry, ...]:
        start = max(self._persist_from, self._offset)
        end = self._offset + len(self._unstable)
        if start >= end:
            return ()
        self._persist_from = end
        last = self._unstable[-1]
        self._in_flight.append(_Batch(last.index, last.term, last.index))
        return tuple(self._unstable[start - self._offset :])

    def take_snapshot(self) -> Snapshot | None:
        if self._snapshot is None or self._snapshot_taken:
            return None
        self._snapshot_taken = True
        self.applying = max(self.applying, self._snapshot.meta.index)
        return self._snapshot

    def take_committed(self, max_bytes: int) -> tuple[Entry, ...]:
        lo = max(self.applying + 1, self.first_index())
        if lo > self.committed:
            # Only compacted entries are left: they are in the state machine's snapshot.
            self.applying = max(self.applying, self.committed)
            return ()
        ents = self.entries(lo, self.committed + 1, max_bytes)
        if ents:
            self.applying = ents[-1].index
        return tuple(ents)

    def stable_to(self, index: int, term: int) -> None:
        """The runtime persisted the batch ending at (index, term): stop holding it here.

        Batches are persisted in the order they were taken, so this one's
        acknowledgement covers every batch taken before it as well. An
        acknowledgement that matches no batch in flight is ignored.
        """
        in_flight = self._in_flight
        if not in_flight:
            return
        batch = in_flight[0]
        if batch.last_index == index and batch.last_term == term:
            in_flight.popleft()  # the usual case: the oldest batch
        elif any(b.last_index == index and b.last_term == term for b in in_flight):
            while not (batch.last_index == index and batch.last_term == term):
                in_flight.popleft()
                batch = in_flight[0]
            in_flight.popleft()
        else:
            return
        trusted = batch.trusted_to
        offset = self._offset
        if trusted < offset:
            return  # rewritten since it was handed out; the newer entries are still pending
        del self._unstable[: trusted + 1 - offset]
        self._offset = trusted + 1
        self._persist_from = max(self._persist_from, self._offset)

    def stable_snap_to(self, index: int) -> None:
        if self._snapshot is not None and self._snapshot.meta.index == index:
            self._snapshot = None
            self._snapshot_taken = False

    def applied_to(self, index: int) -> None:
        self.applied = max(self.applied, index)
        self.applying = max(self.applying, index)
