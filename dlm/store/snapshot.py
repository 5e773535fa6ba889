"""State-machine snapshot files: written atomically, checksummed, newest wins.

A snapshot lives in ``snap/<index:016x>-<term:016x>.snap``. It is written to
``<name>.tmp``, fsynced, renamed into place and the directory fsynced, so a
file with the final name is always complete; a stray ``.tmp`` is an
interrupted write and is ignored (and removed when the store opens). Every
final-named file is verified when the store opens: a bad checksum anywhere
means the disk rotted, and the store refuses to start rather than fall back
to a state it cannot vouch for. After each new snapshot the older ones beyond
``KEEP`` are deleted.

Format (little-endian)::

    b"DLMSNAP1" | u64 index | u64 term | u64 data_len | u32 data_crc
    | u16 count + (u16 len + utf-8) voters | u16 count + (u16 len + utf-8) learners
    | u32 header_crc (CRC-32 of every byte before it) | data (data_len bytes)

Index and term must be below 2**63: saving more is refused (StoreError), and a
file holding more is corrupt.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

from dlm.records import ConfState, Snapshot, SnapshotMeta
from dlm.store import StoreCorrupted, StoreError, out_of_range
from dlm.store.fs import FileSystem
from dlm.store.state import _Reader, pack_names, write_atomically

MAGIC = b"DLMSNAP1"
SUFFIX = ".snap"
KEEP = 2
_HEAD = struct.Struct("<8sQQQI")
_U32 = struct.Struct("<I")


def snapshot_name(index: int, term: int) -> str:
    return f"{index:016x}-{term:016x}{SUFFIX}"


def parse_snapshot_name(name: str) -> tuple[int, int] | None:
    if not name.endswith(SUFFIX) or len(name) != 33 + len(SUFFIX) or name[16] != "-":
        return None
    try:
        return int(name[:16], 16), int(name[17:33], 16)
    except ValueError:
        return None


def encode_snapshot(snapshot: Snapshot) -> bytes:
    meta = snapshot.meta
    bad = out_of_range("index", meta.index) or out_of_range("term", meta.term)
    if bad is not None:
        raise StoreError(f"refusing to save a snapshot: {bad}")
    head = _HEAD.pack(MAGIC, meta.index, meta.term, len(snapshot.data), zlib.crc32(snapshot.data))
    head += pack_names(meta.conf.voters) + pack_names(meta.conf.learners)
    return head + _U32.pack(zlib.crc32(head)) + snapshot.data


def decode_snapshot(buf: bytes, name: str) -> Snapshot:
    """Parse and verify a whole snapshot file; StoreCorrupted names the bad byte."""

    def corrupt(offset: int, reason: str) -> StoreCorrupted:
        return StoreCorrupted(name, offset, reason, what="snapshot")

    if len(buf) < _HEAD.size:
        raise corrupt(len(buf), f"file is {len(buf)} bytes, shorter than the header")
    magic, index, term, data_len, data_crc = _HEAD.unpack_from(buf)
    reader = _Reader(buf, _HEAD.size)
    try:
        voters = reader.names()
        learners = reader.names()
        (head_crc,) = _U32.unpack(reader.take(4))
    except ValueError:
        raise corrupt(0, "header checksum mismatch (header cut short)") from None
    head_end = reader.pos - 4
    if zlib.crc32(buf[:head_end]) != head_crc:
        raise corrupt(0, f"header checksum mismatch over bytes 0-{head_end}")
    if magic != MAGIC:
        raise corrupt(0, f"unknown magic {magic!r}")
    for offset, what, value in ((8, "index", index), (16, "term", term)):
        bad = out_of_range(what, value)
        if bad is not None:
            raise corrupt(offset, bad)
    if parse_snapshot_name(name) not in (None, (index, term)):
        raise corrupt(0, f"header says index {index} term {term}, unlike its file name")
    if len(buf) - reader.pos != data_len:
        raise corrupt(
            reader.pos, f"{len(buf) - reader.pos} data bytes where the header says {data_len}"
        )
    data = buf[reader.pos :]
    if zlib.crc32(data) != data_crc:
        raise corrupt(reader.pos, f"data checksum mismatch over bytes {reader.pos}-{len(buf)}")
    try:
        conf = ConfState(voters, learners)
    except UnicodeDecodeError:  # pragma: no cover - the checksum catches it first
        raise corrupt(0, "bad member name") from None
    return Snapshot(SnapshotMeta(index, term, conf), data)


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    name: str
    index: int
    term: int
    size: int


def list_snapshots(fs: FileSystem, snap_dir: str) -> list[SnapshotFile]:
    """Final-named snapshot files, oldest first."""
    found = []
    for name in fs.listdir(snap_dir):
        parsed = parse_snapshot_name(name)
        if parsed is not None:
            found.append(SnapshotFile(name, *parsed, fs.size(os.path.join(snap_dir, name))))
    found.sort(key=lambda f: (f.index, f.term))
    return found


class SnapshotDir:
    """The snapshots of one member."""

    def __init__(self, fs: FileSystem, snap_dir: str, *, sync: bool, keep: int = KEEP) -> None:
        self._fs = fs
        self._dir = snap_dir
        self._sync = sync
        self._keep = keep
        for name in fs.listdir(snap_dir):
            if name.endswith(SUFFIX + ".tmp"):
                fs.remove(os.path.join(snap_dir, name))
        self.latest: Snapshot | None = None
        for info in list_snapshots(fs, snap_dir):
            # Every file is read so that rot in an older one is found now, not
            # on the day it is the only one left.
            snap = decode_snapshot(fs.read(os.path.join(snap_dir, info.name)), info.name)
            self.latest = snap

    def save(self, snapshot: Snapshot) -> None:
        """Write ``snapshot`` durably, make it the latest and prune old ones."""
        name = snapshot_name(snapshot.meta.index, snapshot.meta.term)
        write_atomically(self._fs, self._dir, name, encode_snapshot(snapshot), sync=self._sync)
        self.latest = snapshot
        files = list_snapshots(self._fs, self._dir)
        doomed = [f for f in files[: max(0, len(files) - self._keep)] if f.name != name]
        for f in doomed:
            self._fs.remove(os.path.join(self._dir, f.name))
        if doomed and self._sync:
            self._fs.fsync_dir(self._dir)
