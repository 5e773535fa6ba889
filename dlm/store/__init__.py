"""Durable storage for a member: the write-ahead log, the hard state and snapshots.

Layout of a data directory::

    DIR/LOCK                     advisory lock: one process per store
    DIR/state                    term, vote, advisory commit, bootstrap membership
    DIR/wal/<seq:016x>.wal       log segments, oldest first
    DIR/snap/<index>-<term>.snap state-machine snapshots (newest two kept)

``DiskStorage`` (dlm/store/disk.py) ties them together behind the Raft
``Storage`` protocol; ``inspect_store`` (dlm/store/inspect.py) reports on a
directory without changing it.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be opened or used (bad path, permissions, misuse)."""


class StoreCorrupted(StoreError):
    """Bytes on disk fail their checksum or framing where a torn write cannot explain it.

    The message names the file and the byte offset. The node must not start:
    guessing which entries are still good could drop something that was
    acknowledged to the leader.
    """

    def __init__(self, file: str, offset: int, reason: str, *, what: str = "file") -> None:
        self.file = file
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"{what} {file} is corrupt at byte {offset} ({reason}); refusing to start: "
            "restore this member from a peer or remove its data dir"
        )


__all__ = ["StoreCorrupted", "StoreError"]
