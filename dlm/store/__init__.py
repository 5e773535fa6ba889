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

VALUE_LIMIT = 1 << 63
"""Terms and indexes are stored as u64 but must stay below 2**63, as on the wire: a value
the store cannot write back (or add one to) is refused on the way in and is corruption
on the way out."""
NEAR_LIMIT = 1 << 62
"""``dlm store inspect`` warns about terms and indexes above this."""
MIN_FREE_BYTES = 1 << 20
"""The least free space a StoreFull asks for, however small the write that failed."""


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


class StoreFull(StoreError):
    """A write or fsync failed for want of space (ENOSPC) or quota (EDQUOT).

    ``path`` is the data directory and ``needed`` the free space to ask for: at least
    the write that failed (and ``MIN_FREE_BYTES``). What was written before stays
    valid; the store refuses further writes, so the member must stop and start again
    once space is freed.
    """

    def __init__(self, path: str, needed: int) -> None:
        self.path = path
        self.needed = max(needed, MIN_FREE_BYTES)
        super().__init__(
            f"no space left on {path} (needs at least {format_bytes(self.needed)} free; "
            "free some space and start again)"
        )


def format_bytes(count: int) -> str:
    """1536 -> '1.5 KB': decimal units, as ``df -H`` prints them."""
    if count < 1000:
        return f"{count} B"
    size = count / 1000
    for unit in ("KB", "MB"):
        if size < 1000:
            return f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def out_of_range(what: str, value: int) -> str | None:
    """Why ``value`` cannot be a stored term or index, or None if it can."""
    if 0 <= value < VALUE_LIMIT:
        return None
    return f"{what} {value} is outside [0, 2**63)"


__all__ = ["StoreCorrupted", "StoreError", "StoreFull"]
