"""``DiskStorage``: the Raft ``Storage`` protocol over the WAL, hard state and snapshots.

Every entry since the last compaction is also kept in memory, so ``term()``
and ``entries()`` (the core's hot path) never touch the disk. Each mutating
call is durable when it returns; ``append`` costs one write and one fsync.

Recovery on open: load and verify every snapshot (the newest wins), load the
hard state, replay the WAL segments, cut a torn tail off the last segment,
and reconcile the log with the snapshot. If the snapshot is newer than the
log and does not match it (a crash in the middle of ``apply_snapshot``), the
log is voided, as the install intended. ``initial_state()`` reports a commit
index of at least the snapshot's index and at most the last index.

A full disk (ENOSPC or EDQUOT on any write or fsync) raises ``StoreFull`` naming
this data directory; everything written before stays valid, the log refuses
further appends, and the member must stop and start again once space is freed.

Membership: ``initial_state()`` returns the newest snapshot's ConfState, or,
before any snapshot, the ``bootstrap_conf`` given to the first ``open`` (it is
stored with the hard state; a later ``bootstrap_conf`` for a store that
already has one is ignored). Membership changes recorded as log entries are
for the core to replay.
"""

from __future__ import annotations

import itertools
import os
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
from dlm.store import StoreError, StoreFull
from dlm.store.fs import DirLock, FileSystem, RealFS
from dlm.store.snapshot import SnapshotDir
from dlm.store.state import StateFile
from dlm.store.wal import DEFAULT_SEGMENT_BYTES, FULL_ERRNOS, Wal

WAL_DIR = "wal"
SNAP_DIR = "snap"
LOCK_NAME = "LOCK"


FREE_SLICE = 2_000
"""Entries freed at a time after a compaction (about a millisecond's work)."""


class DiskStorage:
    """A member's durable log, hard state and snapshot in one directory."""

    def __init__(
        self,
        *,
        fs: FileSystem,
        path: str,
        lock: DirLock,
        wal: Wal,
        state: StateFile,
        snaps: SnapshotDir,
        base_index: int,
        base_term: int,
        entries: list[Entry],
    ) -> None:
        self._fs = fs
        self.path = path
        self._lock: DirLock | None = lock
        self._wal = wal
        self._state = state
        self._snaps = snaps
        self._base_index = base_index
        self._base_term = base_term
        self._entries = entries

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        fsync: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        bootstrap_conf: ConfState | None = None,
        fs: FileSystem | None = None,
    ) -> DiskStorage:
        """Open (creating if needed) the store in ``path``.

        ``fsync=False`` skips every fsync: only for tests and throwaway nodes.
        ``fs`` substitutes the filesystem (``CrashableFS`` in tests and the
        simulator). Raises ``StoreCorrupted`` for rot and ``StoreError`` for a
        directory that cannot be used.
        """
        fs = fs or RealFS()
        root = os.fspath(path)
        try:
            return cls._open(fs, root, fsync, segment_bytes, bootstrap_conf)
        except StoreFull as exc:
            raise StoreFull(root, exc.needed) from exc
        except StoreError:
            raise
        except BlockingIOError:
            raise StoreError(
                f"store {root} is in use by another process (lock on {LOCK_NAME} is held)"
            ) from None
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                raise StoreFull(root, 0) from exc
            raise StoreError(f"cannot open store {root}: {exc.strerror or exc}") from exc

    @classmethod
    def _open(
        cls,
        fs: FileSystem,
        root: str,
        sync: bool,
        segment_bytes: int,
        bootstrap_conf: ConfState | None,
    ) -> DiskStorage:
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        if fs.exists(root) and not fs.isdir(root):
            raise StoreError(f"store path {root} exists and is not a directory")
        fresh = not fs.exists(root)
        if fresh:
            fs.makedirs(root)
            parent = os.path.dirname(os.path.normpath(root)) or "."
            if sync:
                fs.fsync_dir(parent)
        fs.listdir(root)  # unreadable directories fail here, with their errno
        lock = fs.lock(os.path.join(root, LOCK_NAME))
        try:
            wal_dir, snap_dir = os.path.join(root, WAL_DIR), os.path.join(root, SNAP_DIR)
            made = False
            for sub in (wal_dir, snap_dir):
                if not fs.isdir(sub):
                    fs.makedirs(sub)
                    made = True
            if made and sync:
                fs.fsync_dir(root)
            snaps = SnapshotDir(fs, snap_dir, sync=sync)
            state = StateFile(fs, root, sync=sync)
            snap_meta = snaps.latest.meta if snaps.latest else SnapshotMeta(0, 0)
            wal, replayed = Wal.open(
                fs,
                wal_dir,
                snap_index=snap_meta.index,
                snap_term=snap_meta.term,
                segment_bytes=segment_bytes,
                sync=sync,
            )
            if bootstrap_conf is not None and state.conf is None:
                state.set_conf(bootstrap_conf)
        except BaseException:
            lock.release()
            raise
        return cls(
            fs=fs,
            path=root,
            lock=lock,
            wal=wal,
            state=state,
            snaps=snaps,
            base_index=replayed.base_index,
            base_term=replayed.base_term,
            entries=replayed.entries,
        )

    def close(self) -> None:
        """Persist the in-memory commit index and release the directory."""
        if self._lock is None:
            return
        try:
            try:
                self._state.flush()
            except StoreFull as exc:
                raise self._full(exc) from exc
        finally:
            self._wal.close()
            self._lock.release()
            self._lock = None

    def __enter__(self) -> DiskStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- LogStorage -------------------------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        hs = self._state.hard_state
        snap = self._snaps.latest
        commit = min(max(hs.commit, snap.meta.index if snap else 0), self.last_index())
        if commit != hs.commit:
            hs = HardState(hs.term, hs.vote, commit)
        if snap is not None:
            return hs, snap.meta.conf
        return hs, self._state.conf or ConfState()

    def first_index(self) -> int:
        return self._base_index + 1

    def last_index(self) -> int:
        return self._base_index + len(self._entries)

    def term(self, index: int) -> int:
        offset = index - self._base_index
        if offset == 0:
            return self._base_term
        if offset < 0:
            raise LogCompacted(index)
        if offset > len(self._entries):
            raise LogUnavailable(index)
        return self._entries[offset - 1].term

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        if lo <= self._base_index:
            raise LogCompacted(lo)
        if hi > self.last_index() + 1:
            raise LogUnavailable(hi)
        chosen = self._entries[lo - self._base_index - 1 : hi - self._base_index - 1]
        if max_bytes is None or len(chosen) <= 1:
            return chosen
        total = 0
        for count, entry in enumerate(chosen):
            total += entry_size(entry)
            if total > max_bytes:
                return chosen[: max(count, 1)]
        return chosen

    def snapshot(self) -> Snapshot | None:
        return self._snaps.latest

    # -- Storage ----------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        if first <= self._base_index:
            # Already compacted, hence committed and identical: skip them.
            entries = entries[self._base_index - first + 1 :]
            if not entries:
                return
            first = entries[0].index
        if first > self.last_index() + 1:
            raise ValueError(f"append at {first} leaves a gap after last index {self.last_index()}")
        for prev, nxt in itertools.pairwise(entries):
            if nxt.index != prev.index + 1:
                raise ValueError(f"batch is not contiguous at index {nxt.index}")
        try:
            self._wal.append(entries)
        except StoreFull as exc:
            raise self._full(exc) from exc
        del self._entries[first - self._base_index - 1 :]
        self._entries.extend(entries)

    def set_hard_state(self, hard_state: HardState) -> None:
        try:
            self._state.set(hard_state)
        except StoreFull as exc:
            raise self._full(exc) from exc

    def _full(self, exc: StoreFull) -> StoreFull:
        """The same failure, naming the data directory rather than a part of it."""
        return StoreFull(self.path, exc.needed)

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        current = self._snaps.latest
        meta = snapshot.meta
        if current is not None and meta.index < current.meta.index:
            raise ValueError(
                f"snapshot at {meta.index} is older than the stored one at {current.meta.index}"
            )
        try:
            self._snaps.save(snapshot)
            self._wal.reset(meta.index, meta.term)
        except StoreFull as exc:
            raise self._full(exc) from exc
        self._base_index, self._base_term = meta.index, meta.term
        self._entries = []

    def create_snapshot(self, index: int, conf: ConfState, data: bytes) -> Snapshot:
        current = self._snaps.latest
        if current is not None and index <= current.meta.index:
            raise ValueError(
                f"snapshot at {index} is not newer than the stored one at {current.meta.index}"
            )
        if index > self.last_index():
            raise LogUnavailable(index)
        snapshot = Snapshot(SnapshotMeta(index, self.term(index), conf), data)
        try:
            self._snaps.save(snapshot)
        except StoreFull as exc:
            raise self._full(exc) from exc
        return snapshot

    def compact(self, index: int) -> None:
        snap = self._snaps.latest
        if snap is None or index > snap.meta.index:
            raise ValueError(f"cannot compact to {index}: not covered by a snapshot")
        if index <= self._base_index:
            return
        term = self.term(index)
        count = index - self._base_index
        # Freeing a hundred thousand entries at once holds the GIL for tens of ms, and the
        # disk thread compacts while the event loop serves: take them out of the log in one
        # step, then free them in slices the interpreter may switch threads between.
        dropped = self._entries[:count]
        del self._entries[:count]
        self._base_index, self._base_term = index, term
        self._wal.drop_prefix(index)
        while dropped:
            del dropped[-FREE_SLICE:]

    # -- introspection ----------------------------------------------------

    @property
    def segment_names(self) -> list[str]:
        return self._wal.segment_names
