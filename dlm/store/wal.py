"""The write-ahead log: segmented, append-only, one checksummed record per batch.

File format (version 2)
-----------------------
A segment ``<seq:016x>.wal`` is a run of records. Each record is framed as::

    u32 length | u32 crc | payload (length bytes) | u32 length | u32 crc

little-endian, where ``crc = crc32(payload, crc32(length field))`` (zlib's
CRC-32), so a flipped length is caught as surely as a flipped payload byte. The
8-byte head is repeated after the payload: that copy tells a damaged record
that is whole from one a crash cut short (see Recovery). The payload's first
byte is its type:

* ``HEADER`` (always the first record of a segment):
  ``u8 type | b"DLMW" | u8 version | u64 seq | u64 prev_index | u64 prev_term | u8 flags``.
  ``prev_*`` name the entry just before this segment's first entry. With the
  ``RESET`` flag the segment starts a fresh log after a snapshot installed at
  ``prev_index``: everything in older segments is void.
* ``BATCH``: all the entries of one ``append``:
  ``u8 type | u32 count`` then ``count`` times
  ``u64 index | u64 term | u8 kind | u32 size | data (size bytes)``.

Truncating a conflicting suffix writes nothing special: appending an entry
whose index is at or below the last one means "drop from here", both in
memory and on replay. So a suffix truncation costs exactly the append that
replaces it and is as crash-safe as any append. Dropping a prefix deletes
whole sealed segments.

Durability: one ``append`` is one record, written with a single ``write`` and
made durable with a single fsync (plus a directory fsync when the batch opened a
new segment). A batch never spans segments, so a segment may exceed
``segment_bytes`` by one batch. Terms and indexes must be below 2**63.

Version 1 segments (dlm 0.1) have no copy of the head and one ``ENTRY`` record
per entry (``u8 type | u64 index | u64 term | u8 kind | data``). They are still
read, by the rule of their release (below); nothing is appended to one: the
first append after start-up opens a version 2 segment.

Recovery
--------
A bad record (framing, checksum, a copy of its head that differs) in a sealed
segment, or with a checksum-valid record anywhere after it, is corruption: the
store refuses to open and names the file and byte offset. At the end of the
last segment:

* version 2: a record whose payload fails its checksum is rot, reported as
  corruption, if it is whole: if its head and the copy after its payload agree
  (so the payload was damaged), or if the file ends with a copy of the head that
  verifies the payload (so the head was damaged). Anything else was cut short by
  a crash (a torn write): that write was never acknowledged, and is cut off. So
  a bit flip anywhere in the last batch's head or payload stops the member. A
  copy that differs from a head that verifies its payload is rot too, except in
  the very last record, where a crash may have damaged the copy alone: that
  record is kept (its payload verified, so nothing is lost or invented) and its
  copy written again; a copy cut short makes the record torn. This relies on a
  crash never leaving the end of a write on disk without the bytes before it
  (ext4's default data=ordered mode guarantees it for appends); where that can
  happen, the failure is a false report of corruption, never a silent loss.
* version 1: a bad record with nothing valid after it is taken for a torn write
  and cut off (that release cannot tell rot in its last record from a tear).

A write or fsync that fails for want of space raises ``StoreFull``; any failed
write or fsync leaves the log refusing further appends (after a failed fsync
the kernel may have dropped the dirty pages, so retrying could lose data
silently); the member restarts and recovery sorts out the tail.
"""

from __future__ import annotations

import errno
import os
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlm.records import Entry, EntryKind
from dlm.store import VALUE_LIMIT, StoreCorrupted, StoreError, StoreFull, out_of_range
from dlm.store.fs import AppendFile, FileSystem

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
MAX_RECORD_BYTES = 1 << 30

REC_ENTRY = 1
"""Version 1 only: one entry per record."""
REC_HEADER = 2
REC_BATCH = 3
FLAG_RESET = 1
WAL_MAGIC = b"DLMW"
WAL_VERSION = 2
LEGACY_VERSION = 1
SUFFIX = ".wal"
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

_FRAME = struct.Struct("<II")
_LEN = struct.Struct("<I")
_TRAILER = _FRAME.size
_ENTRY = struct.Struct("<BQQB")
_BATCH = struct.Struct("<BI")
_BATCH_ENTRY = struct.Struct("<QQBI")
_HEADER = struct.Struct("<B4sBQQQB")
_KIND_OF = {int(k): k for k in EntryKind}
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
    head = length + _LEN.pack(zlib.crc32(payload, zlib.crc32(length)))
    return b"".join((head, payload, head))


def encode_batch(entries: Sequence[Entry]) -> bytes:
    """One append's entries as one record (one write, one fsync)."""
    pack = _BATCH_ENTRY.pack
    parts = [_BATCH.pack(REC_BATCH, len(entries))]
    for e in entries:
        parts.append(pack(e.index, e.term, e.kind, len(e.data)))
        parts.append(e.data)
    return _frame(b"".join(parts))


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
    version: int = WAL_VERSION


@dataclass(slots=True)
class Problem:
    offset: int
    reason: str
    torn: bool
    """True for a torn write at the end of the last segment: repairable by cutting it off."""


@dataclass(slots=True)
class SegmentScan:
    name: str
    seq: int
    size: int
    header: SegmentHeader | None = None
    entries: list[Entry] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    """Byte offset of each of ``entries`` (its record in version 1, its place in its
    batch in version 2), for error messages."""
    records: int = 0
    good_end: int = 0
    problem: Problem | None = None
    damaged_copy: tuple[int, bytes] | None = None
    """Where the last record's copy of its head is, and that head, when only the copy
    is damaged (a crash in the middle of writing it): recovery writes it again."""

    @property
    def max_index(self) -> int:
        highest = self.header.prev_index if self.header else 0
        return max([highest, *(e.index for e in self.entries)])


_RECORD_TYPES = {LEGACY_VERSION: (REC_ENTRY, REC_HEADER), WAL_VERSION: (REC_BATCH, REC_HEADER)}


def _valid_record_at(buf: bytes, pos: int, types: tuple[int, ...]) -> bool:
    if len(buf) - pos < _FRAME.size + 1:
        return False
    length, crc = _FRAME.unpack_from(buf, pos)
    if length < 1 or length > len(buf) - pos - _FRAME.size:
        return False
    if buf[pos + _FRAME.size] not in types:
        return False
    view = memoryview(buf)
    actual = zlib.crc32(view[pos + 8 : pos + 8 + length], zlib.crc32(view[pos : pos + 4]))
    return bool(actual == crc)


def _valid_record_after(buf: bytes, start: int, types: tuple[int, ...]) -> bool:
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
        if _valid_record_at(buf, pos, types):
            return True
        pos += 1


def _whole_record_at(buf: bytes, pos: int) -> bool:
    """Is the damaged version 2 record at ``pos`` all on disk (rot) rather than cut short?

    Whole if its head and the copy after its payload agree (the payload was
    damaged), or if the file ends with a copy of the head that verifies the
    payload (the head was damaged). A crash that cuts a write short damages its
    end, where the copy is, so neither can hold after a torn write.
    """
    n = len(buf)
    head = buf[pos : pos + _FRAME.size]
    if len(head) < _FRAME.size:
        return False
    (length, _) = _FRAME.unpack(head)
    copy_at = pos + _FRAME.size + length
    if length >= 1 and copy_at + _TRAILER <= n and buf[copy_at : copy_at + _TRAILER] == head:
        return True
    length, crc = _FRAME.unpack_from(buf, n - _TRAILER)
    if length < 1 or length != n - pos - _FRAME.size - _TRAILER:
        return False
    view = memoryview(buf)
    return bool(zlib.crc32(view[pos + 8 : pos + 8 + length], zlib.crc32(_LEN.pack(length))) == crc)


def _torn_tail(buf: bytes, pos: int, header: SegmentHeader | None) -> bool:
    """Is the bad record at ``pos``, at the end of the last segment, a torn write?"""
    if header is not None and header.version == LEGACY_VERSION:
        return not _valid_record_after(buf, pos, _RECORD_TYPES[LEGACY_VERSION])
    # With the header itself damaged the version is unknown: look for either kind.
    types = _RECORD_TYPES[WAL_VERSION] if header is not None else (REC_ENTRY, REC_HEADER, REC_BATCH)
    return not _valid_record_after(buf, pos, types) and not _whole_record_at(buf, pos)


def _read_header(buf: bytes, length: int, seq: int) -> tuple[SegmentHeader | None, str]:
    """The header record at the start of a segment, or why it cannot be one."""
    if buf[_FRAME.size] != REC_HEADER or length != _HEADER.size:
        return None, f"unexpected record type {buf[_FRAME.size]} of {length} bytes"
    _, magic, version, hseq, prev_index, prev_term, flags = _HEADER.unpack_from(buf, _FRAME.size)
    if magic != WAL_MAGIC or version not in _RECORD_TYPES:
        return None, f"unknown segment magic/version {magic!r}/{version}"
    if hseq != seq:
        return None, f"header names segment {hseq}, file name says {seq}"
    bad = out_of_range("previous index", prev_index) or out_of_range("previous term", prev_term)
    if bad is not None:
        return None, bad
    return SegmentHeader(hseq, prev_index, prev_term, bool(flags & FLAG_RESET), version), ""


def _read_batch(
    buf: bytes, start: int, end: int, entries: list[Entry], offsets: list[int]
) -> tuple[int, str] | None:
    """Appends the entries of the batch payload ``buf[start:end]``; on a malformed one,
    returns where and why (its checksum was valid, so a writer bug or a forgery)."""
    if end - start < _BATCH.size:
        return start, "batch record too short"
    _, count = _BATCH.unpack_from(buf, start)
    pos = start + _BATCH.size
    unpack = _BATCH_ENTRY.unpack_from
    head = _BATCH_ENTRY.size
    kinds = _KIND_OF
    for _ in range(count):
        if end - pos < head:
            return pos, f"batch promises {count} entries but ends after {len(offsets)}"
        index, term, kind, size = unpack(buf, pos)
        data_end = pos + head + size
        if data_end > end:
            return pos, f"entry of {size} bytes runs past the end of its batch"
        entry_kind = kinds.get(kind)
        if entry_kind is None:
            return pos, f"unknown entry kind {kind}"
        if index >= VALUE_LIMIT or term >= VALUE_LIMIT:
            bad = out_of_range("index", index) or out_of_range("term", term)
            return pos, f"entry {bad}"
        entries.append(Entry(index, term, buf[pos + head : data_end], entry_kind))
        offsets.append(pos)
        pos = data_end
    if pos != end:
        return pos, f"{end - pos} bytes after the last entry of the batch"
    return None


def scan_segment(buf: bytes, name: str, seq: int, *, last: bool) -> SegmentScan:
    """Decode a segment; stop at the first bad record and classify it."""
    scan = SegmentScan(name=name, seq=seq, size=len(buf))
    view = memoryview(buf)
    n = len(buf)
    pos = 0
    copy = _TRAILER  # bytes after each payload: 0 in a version 1 segment
    crc32 = zlib.crc32
    unpack_frame = _FRAME.unpack_from
    reason: str | None = None
    problem_at = 0
    fatal = False
    while pos < n:
        problem_at = pos
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
        if scan.header is None:
            header, why = _read_header(buf, length, seq)
            if header is None:
                reason, fatal = why, True
                break
            copy = 0 if header.version == LEGACY_VERSION else _TRAILER
        if end + copy > n:
            reason = "record cut short after its payload"
            break
        if copy and buf[end : end + copy] != buf[pos : pos + copy]:
            # Rot, unless this is the last write and a crash damaged only its copy (its
            # payload verified, so keeping it loses nothing and invents nothing).
            if not last or _valid_record_after(buf, end, _RECORD_TYPES[WAL_VERSION]):
                problem_at, reason, fatal = end, "the copy of the record's head differs", True
                break
            scan.damaged_copy = (end, bytes(buf[pos : pos + copy]))
        rtype = buf[pos + 8]
        if scan.header is None:
            scan.header = header
        elif copy and rtype == REC_BATCH:
            before = len(scan.entries)
            bad = _read_batch(buf, pos + 8, end, scan.entries, scan.offsets)
            if bad is not None:
                del scan.entries[before:], scan.offsets[before:]
                (problem_at, reason), fatal = bad, True
                break
        elif not copy and rtype == REC_ENTRY and length >= _ENTRY.size:
            _, index, term, kind = _ENTRY.unpack_from(buf, pos + 8)
            entry_kind = _KIND_OF.get(kind)
            if entry_kind is None:
                reason, fatal = f"unknown entry kind {kind}", True
                break
            bad_value = out_of_range("index", index) or out_of_range("term", term)
            if bad_value is not None:
                reason, fatal = f"entry {bad_value}", True
                break
            scan.entries.append(Entry(index, term, buf[pos + 8 + _ENTRY.size : end], entry_kind))
            scan.offsets.append(pos)
        else:
            reason, fatal = f"unexpected record type {rtype} of {length} bytes", True
            break
        scan.records += 1
        pos = end + copy
    scan.good_end = pos
    if reason is not None:
        torn = last and not fatal and _torn_tail(buf, pos, scan.header)
        scan.problem = Problem(problem_at, reason, torn)
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
        self._active_is_legacy = False
        self._failed: str | None = None
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
            last = scans[-1].header
            wal._active_is_legacy = last is not None and last.version == LEGACY_VERSION
            wal._active = fs.open_append(os.path.join(wal_dir, wal._segments[-1].name))
        return wal, result

    def _repair_tail(self, scans: list[SegmentScan]) -> None:
        if not scans:
            return
        tail = scans[-1]
        if tail.problem is None and tail.header is not None and tail.damaged_copy is None:
            return
        path = os.path.join(self._dir, tail.name)
        if tail.header is None:
            self._fs.remove(path)
            if self._sync:
                self._fs.fsync_dir(self._dir)
            scans.pop()
            return
        handle = self._fs.open_append(path)
        try:
            if tail.damaged_copy is not None:
                copy_at, head = tail.damaged_copy
                handle.truncate(copy_at)
                handle.write(head)
            else:
                handle.truncate(tail.good_end)
            if self._sync:
                handle.fsync()
        finally:
            handle.close()
        tail.size = tail.good_end
        tail.problem = None
        tail.damaged_copy = None

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def segment_names(self) -> list[str]:
        return [s.name for s in self._segments]

    def append(self, entries: Sequence[Entry]) -> None:
        """Write a batch durably (one fsync); entries at or below the last index replace
        the stored suffix from there.

        Raises StoreFull when the disk or quota is full, StoreError for a term or
        index at or above 2**63 (checked on the last entry: along a log, neither
        decreases) and, after any failed write, for every later call.
        """
        if not entries:
            return
        self._check_usable()
        last = entries[-1]
        if last.index >= VALUE_LIMIT or last.term >= VALUE_LIMIT:
            bad = out_of_range("index", last.index) or out_of_range("term", last.term)
            raise StoreError(f"refusing to log entry {last.index}: {bad}")
        buf = encode_batch(entries)
        active = self._active
        assert active is not None, "wal is closed"
        if self._active_is_legacy or active.size >= self._segment_bytes:
            self._roll(buf, last.index)
        else:
            size = active.size
            try:
                active.write(buf)
                if self._sync:
                    active.fsync()
            except OSError as exc:
                try:
                    active.truncate(size)  # best effort: recovery would cut it off anyway
                except OSError:
                    pass
                raise self._failure(exc, len(buf)) from exc
            seg = self._segments[-1]
            seg.max_index = max(seg.max_index, last.index)
        self._last_index, self._last_term = last.index, last.term

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise StoreError(
                f"log {self._dir} refuses writes after a failed one ({self._failed}); "
                "restart the member"
            )

    def _failure(self, exc: OSError, size: int) -> Exception:
        """Refuse every later write, and name this failure (StoreFull for a full disk)."""
        self._failed = exc.strerror or str(exc)
        if exc.errno in FULL_ERRNOS:
            return StoreFull(self._dir, size)
        return exc

    def _roll(self, first_batch: bytes, max_index: int) -> None:
        """Seal the active segment and put the header and ``first_batch`` in a new one."""
        self._open_segment(self._last_index, self._last_term, reset=False, batch=first_batch)
        self._segments[-1].max_index = max(self._segments[-1].max_index, max_index)

    def _open_segment(self, prev_index: int, prev_term: int, *, reset: bool, batch: bytes) -> None:
        self._check_usable()
        seq = self._segments[-1].seq + 1 if self._segments else 1
        name = segment_name(seq)
        data = encode_header(seq, prev_index, prev_term, reset) + batch
        try:
            handle = self._fs.create(os.path.join(self._dir, name))
        except OSError as exc:
            raise self._failure(exc, len(data)) from exc
        try:
            handle.write(data)
            if self._sync:
                handle.fsync()
                self._fs.fsync_dir(self._dir)
        except OSError as exc:
            # The new segment stays as it is: recovery cuts a torn write off it, or
            # removes it when even its header is incomplete.
            handle.close()
            raise self._failure(exc, len(data)) from exc
        if self._active is not None:
            self._active.close()
        self._active = handle
        self._active_is_legacy = False
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
