"""The write-ahead log: segmented, append-only, every record checksummed.

File format
-----------
A segment ``<seq:016x>.wal`` is a run of records. Each record is framed as::

    u32 length | u32 crc | payload (length bytes)

little-endian, where ``crc = crc32(payload, crc32(length bytes))`` (zlib's
CRC-32), so a flipped length is caught as surely as a flipped payload byte.
The payload's first byte is its type:

* ``HEADER`` (always the first record of a segment):
  ``u8 type | b"DLMW" | u8 version | u64 seq | u64 prev_index | u64 prev_term | u8 flags``.
  ``prev_*`` name the entry just before this segment's first entry. With the
  ``RESET`` flag the segment starts a fresh log after a snapshot installed at
  ``prev_index``: everything in older segments is void.
* ``ENTRY``: ``u8 type | u64 index | u64 term | u8 kind | data``.

Truncating a conflicting suffix writes nothing special: appending an entry
whose index is at or below the last one means "drop from here", both in
memory and on replay. So a suffix truncation costs exactly the append that
replaces it and is as crash-safe as any append. Dropping a prefix deletes
whole sealed segments.

Durability: one ``append`` writes its whole batch with a single ``write`` and
makes it durable with a single fsync (plus a directory fsync when the batch
opened a new segment). A batch never spans segments, so a segment may exceed
``segment_bytes`` by one batch.

Recovery: a record that fails its framing or checksum in the *last* segment,
with no valid record anywhere after it, is a torn write: it is cut off. Any
other bad record is corruption, reported with file and byte offset.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlm.node.raft.types import Entry, EntryKind
from dlm.store import StoreCorrupted
from dlm.store.fs import AppendFile, FileSystem

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
MAX_RECORD_BYTES = 1 << 30

REC_HEADER = 2
REC_ENTRY = 1
FLAG_RESET = 1
WAL_MAGIC = b"DLMW"
WAL_VERSION = 1
SUFFIX = ".wal"

_FRAME = struct.Struct("<II")
_LEN = struct.Struct("<I")
_ENTRY = struct.Struct("<BQQB")
_HEADER = struct.Struct("<B4sBQQQB")
_KINDS = frozenset(int(k) for k in EntryKind)
_NONZERO = re.compile(rb"[^\x00]")
_UNKNOWN_TERM = -1


def segment_name(seq: int) -> str:
    return f"{seq:016x}{SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    if not name.endswith(SUFFIX) or len(name) != 16 + len(SUFFIX):
        return None
    try:
        return int(name[:16], 16)
    except ValueError:
        return None


def _frame(payload: bytes) -> bytes:
    length = _LEN.pack(len(payload))
    return length + _LEN.pack(zlib.crc32(payload, zlib.crc32(length))) + payload


def encode_entries(entries: Sequence[Entry]) -> bytes:
    """All records of a batch as one buffer (one write, one fsync)."""
    parts: list[bytes] = []
    pack_head = _ENTRY.pack
    pack_len = _LEN.pack
    crc32 = zlib.crc32
    for e in entries:
        payload = pack_head(REC_ENTRY, e.index, e.term, e.kind) + e.data
        length = pack_len(len(payload))
        parts.append(length)
        parts.append(pack_len(crc32(payload, crc32(length))))
        parts.append(payload)
    return b"".join(parts)


def encode_header(seq: int, prev_index: int, prev_term: int, reset: bool) -> bytes:
    flags = FLAG_RESET if reset else 0
    return _frame(
        _HEADER.pack(REC_HEADER, WAL_MAGIC, WAL_VERSION, seq, prev_index, prev_term, flags)
    )


# ---------------------------------------------------------------------------
# Reading (shared by recovery and `dlm store inspect`; never writes).
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    seq: int
    prev_index: int
    prev_term: int
    reset: bool


@dataclass(slots=True)
class Problem:
    offset: int
    reason: str
    torn: bool
    """True when nothing valid follows in the last segment: a torn write, repairable."""


@dataclass(slots=True)
class SegmentScan:
    name: str
    seq: int
    size: int
    header: SegmentHeader | None = None
    entries: list[Entry] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    """Byte offset of each of ``entries``' records, for error messages."""
    good_end: int = 0
    problem: Problem | None = None

    @property
    def max_index(self) -> int:
        highest = self.header.prev_index if self.header else 0
        return max([highest, *(e.index for e in self.entries)])


def _valid_record_at(buf: bytes, pos: int) -> bool:
    if len(buf) - pos < _FRAME.size + 1:
        return False
    length, crc = _FRAME.unpack_from(buf, pos)
    if length < 1 or length > len(buf) - pos - _FRAME.size:
        return False
    if buf[pos + _FRAME.size] not in (REC_ENTRY, REC_HEADER):
        return False
    view = memoryview(buf)
    actual = zlib.crc32(view[pos + 8 : pos + 8 + length], zlib.crc32(view[pos : pos + 4]))
    return bool(actual == crc)


def _valid_record_after(buf: bytes, start: int) -> bool:
    """Is there any checksum-valid record starting after ``start``?

    A torn tail is only the end of one batch, so this is short in the common
    case; runs of zeros (a file extended but never written) are skipped fast.
    """
    pos = start + 1
    while True:
        match = _NONZERO.search(buf, pos)
        if match is None:
            return False
        pos = match.start()
        if _valid_record_at(buf, pos):
            return True
        pos += 1


def scan_segment(buf: bytes, name: str, seq: int, *, last: bool) -> SegmentScan:
    """Decode a segment; stop at the first bad record and classify it."""
    scan = SegmentScan(name=name, seq=seq, size=len(buf))
    view = memoryview(buf)
    n = len(buf)
    pos = 0
    crc32 = zlib.crc32
    unpack_frame = _FRAME.unpack_from
    unpack_entry = _ENTRY.unpack_from
    reason: str | None = None
    fatal = False
    while pos < n:
        if n - pos < _FRAME.size:
            reason = "partial record frame"
            break
        length, crc = unpack_frame(buf, pos)
        if length < 1 or length > MAX_RECORD_BYTES:
            reason = f"invalid record length {length}"
            break
        end = pos + 8 + length
        if end > n:
            reason = f"record of {length} bytes runs past the end of the file"
            break
        if crc32(view[pos + 8 : end], crc32(view[pos : pos + 4])) != crc:
            reason = "checksum mismatch"
            break
        rtype = buf[pos + 8]
        if rtype == REC_ENTRY and scan.header is not None and length >= _ENTRY.size:
            _, index, term, kind = unpack_entry(buf, pos + 8)
            if kind not in _KINDS:
                reason, fatal = f"unknown entry kind {kind}", True
                break
            data = buf[pos + 8 + _ENTRY.size : end]
            scan.entries.append(Entry(index, term, data, EntryKind(kind)))
            scan.offsets.append(pos)
        elif rtype == REC_HEADER and scan.header is None and pos == 0 and length == _HEADER.size:
            _, magic, version, hseq, prev_index, prev_term, flags = _HEADER.unpack_from(buf, 8)
            if magic != WAL_MAGIC or version != WAL_VERSION:
                reason, fatal = f"unknown segment magic/version {magic!r}/{version}", True
                break
            if hseq != seq:
                reason, fatal = f"header names segment {hseq}, file name says {seq}", True
                break
            scan.header = SegmentHeader(hseq, prev_index, prev_term, bool(flags & FLAG_RESET))
        else:
            reason, fatal = f"unexpected record type {rtype} of {length} bytes", True
            break
        pos = end
    scan.good_end = pos
    if reason is not None:
        torn = last and not fatal and not _valid_record_after(buf, pos)
        scan.problem = Problem(pos, reason, torn)
    return scan


def list_segments(fs: FileSystem, wal_dir: str) -> list[tuple[int, str]]:
    found = []
    for name in fs.listdir(wal_dir):
        seq = parse_segment_name(name)
        if seq is not None:
            found.append((seq, name))
    found.sort()
    return found


def scan_dir(fs: FileSystem, wal_dir: str) -> list[SegmentScan]:
    segments = list_segments(fs, wal_dir)
    return [
        scan_segment(fs.read(os.path.join(wal_dir, name)), name, seq, last=i == len(segments) - 1)
        for i, (seq, name) in enumerate(segments)
    ]


def _corrupt(name: str, offset: int, reason: str) -> StoreCorrupted:
    return StoreCorrupted(name, offset, reason, what="wal segment")


@dataclass(slots=True)
class Replay:
    """The log the segments describe, reconciled with the newest snapshot."""

    base_index: int
    base_term: int
    entries: list[Entry]
    needs_reset: bool = False
    """The snapshot supersedes the log (a crash inside an install): restart the WAL."""


def replay(scans: list[SegmentScan], snap_index: int, snap_term: int) -> Replay:
    """Rebuild the log from decoded segments; raise StoreCorrupted on anything a
    crash cannot explain. Torn tails must already be classified (``problem.torn``)."""
    base: tuple[int, int] | None = None
    entries: list[Entry] = []
    for position, scan in enumerate(scans):
        if scan.problem is not None and not scan.problem.torn:
            raise _corrupt(scan.name, scan.problem.offset, scan.problem.reason)
        header = scan.header
        if header is None:
            if position < len(scans) - 1:
                raise _corrupt(scan.name, 0, "sealed segment has no header record")
            continue  # a torn segment creation: it never held an acknowledged entry
        if header.reset or base is None:
            base, entries = (header.prev_index, header.prev_term), []
        else:
            last = base[0] + len(entries)
            last_term = entries[-1].term if entries else base[1]
            if (header.prev_index, header.prev_term) != (last, last_term):
                if header.prev_index > snap_index:
                    raise _corrupt(
                        scan.name,
                        0,
                        f"segment continues the log after index {header.prev_index} "
                        f"(term {header.prev_term}) but the segments before it end at "
                        f"index {last} (term {last_term}); a segment is missing",
                    )
                # Only segments wholly under the snapshot went missing (a
                # compaction whose deletes were partly undone by a crash).
                base, entries = (header.prev_index, header.prev_term), []
        for e, offset in zip(scan.entries, scan.offsets, strict=True):
            nxt = base[0] + len(entries) + 1
            if e.index == nxt:
                entries.append(e)
            elif base[0] < e.index < nxt:
                del entries[e.index - base[0] - 1 :]
                entries.append(e)
            elif 0 < e.index <= base[0] and e.index - 1 <= snap_index:
                # A rewind to before this segment's start, whose earlier
                # segments compaction has deleted: the log restarts here, and
                # only the snapshot can vouch for what came before.
                base, entries = (e.index - 1, _UNKNOWN_TERM), [e]
            else:
                raise _corrupt(
                    scan.name,
                    offset,
                    f"entry {e.index} does not follow the log (next index {nxt}, "
                    f"first index {base[0] + 1})",
                )
    if base is None:
        return Replay(snap_index, snap_term, [], needs_reset=snap_index > 0)
    base_index, base_term = base
    if snap_index == 0 and base_index == 0:
        return Replay(0, 0, entries)
    if base_index > snap_index:
        name = next(s.name for s in scans if s.header is not None)
        raise _corrupt(
            name,
            0,
            f"log starts after index {base_index} but the newest snapshot covers only "
            f"up to {snap_index}; entries in between are missing",
        )
    last = base_index + len(entries)
    if snap_index <= last:
        term_at = (
            base_term if snap_index == base_index else entries[snap_index - base_index - 1].term
        )
        if term_at == snap_term or (term_at == _UNKNOWN_TERM and snap_index == base_index):
            if base_term == _UNKNOWN_TERM:
                # term(first_index - 1) must be answerable: start at the snapshot.
                return Replay(snap_index, snap_term, entries[snap_index - base_index :])
            return Replay(base_index, base_term, entries)
    return Replay(snap_index, snap_term, [], needs_reset=True)


# ---------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Segment:
    seq: int
    name: str
    max_index: int


class Wal:
    """The open log of one member. Not thread-safe: one owner drives it."""

    def __init__(self, fs: FileSystem, wal_dir: str, *, segment_bytes: int, sync: bool) -> None:
        self._fs = fs
        self._dir = wal_dir
        self._segment_bytes = segment_bytes
        self._sync = sync
        self._segments: list[_Segment] = []
        self._active: AppendFile | None = None
        self._last_index = 0
        self._last_term = 0

    @classmethod
    def open(
        cls,
        fs: FileSystem,
        wal_dir: str,
        *,
        snap_index: int,
        snap_term: int,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        sync: bool = True,
    ) -> tuple[Wal, Replay]:
        """Recover the log in ``wal_dir`` (cutting a torn tail) and open it for appends."""
        scans = scan_dir(fs, wal_dir)
        result = replay(scans, snap_index, snap_term)
        wal = cls(fs, wal_dir, segment_bytes=segment_bytes, sync=sync)
        wal._repair_tail(scans)
        wal._segments = [
            _Segment(s.seq, s.name, s.max_index) for s in scans if s.header is not None
        ]
        if result.entries:
            wal._last_index, wal._last_term = result.entries[-1].index, result.entries[-1].term
        else:
            wal._last_index, wal._last_term = result.base_index, result.base_term
        if result.needs_reset or not wal._segments:
            wal.reset(result.base_index, result.base_term)
        else:
            wal._active = fs.open_append(os.path.join(wal_dir, wal._segments[-1].name))
        return wal, result

    def _repair_tail(self, scans: list[SegmentScan]) -> None:
        if not scans or (scans[-1].problem is None and scans[-1].header is not None):
            return
        tail = scans[-1]
        path = os.path.join(self._dir, tail.name)
        if tail.header is None:
            self._fs.remove(path)
            if self._sync:
                self._fs.fsync_dir(self._dir)
            scans.pop()
            return
        handle = self._fs.open_append(path)
        try:
            handle.truncate(tail.good_end)
            if self._sync:
                handle.fsync()
        finally:
            handle.close()
        tail.size = tail.good_end
        tail.problem = None

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def segment_names(self) -> list[str]:
        return [s.name for s in self._segments]

    def append(self, entries: Sequence[Entry]) -> None:
        """Write a batch durably (one fsync); entries at or below the last index replace
        the stored suffix from there."""
        if not entries:
            return
        buf = encode_entries(entries)
        active = self._active
        assert active is not None, "wal is closed"
        if active.size >= self._segment_bytes:
            self._roll(buf, entries[-1].index)
        else:
            active.write(buf)
            if self._sync:
                active.fsync()
            seg = self._segments[-1]
            seg.max_index = max(seg.max_index, entries[-1].index)
        self._last_index, self._last_term = entries[-1].index, entries[-1].term

    def _roll(self, first_batch: bytes, max_index: int) -> None:
        """Seal the active segment and put the header and ``first_batch`` in a new one."""
        self._open_segment(self._last_index, self._last_term, reset=False, batch=first_batch)
        self._segments[-1].max_index = max(self._segments[-1].max_index, max_index)

    def _open_segment(self, prev_index: int, prev_term: int, *, reset: bool, batch: bytes) -> None:
        seq = self._segments[-1].seq + 1 if self._segments else 1
        name = segment_name(seq)
        handle = self._fs.create(os.path.join(self._dir, name))
        handle.write(encode_header(seq, prev_index, prev_term, reset) + batch)
        if self._sync:
            handle.fsync()
            self._fs.fsync_dir(self._dir)
        if self._active is not None:
            self._active.close()
        self._active = handle
        self._segments.append(_Segment(seq, name, prev_index))

    def reset(self, index: int, term: int) -> None:
        """Void the whole log: it now continues after ``(index, term)`` (a snapshot)."""
        self._open_segment(index, term, reset=True, batch=b"")
        old, self._segments = self._segments[:-1], self._segments[-1:]
        for seg in old:
            self._fs.remove(os.path.join(self._dir, seg.name))
        if old and self._sync:
            self._fs.fsync_dir(self._dir)
        self._last_index, self._last_term = index, term

    def drop_prefix(self, index: int) -> None:
        """Delete sealed segments that hold nothing above ``index``."""
        doomed = 0
        while doomed < len(self._segments) - 1 and self._segments[doomed].max_index <= index:
            doomed += 1
        if not doomed:
            return
        for seg in self._segments[:doomed]:
            self._fs.remove(os.path.join(self._dir, seg.name))
        del self._segments[:doomed]
        if self._sync:
            self._fs.fsync_dir(self._dir)

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None
