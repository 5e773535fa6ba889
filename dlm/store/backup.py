"""Backup files: one consistent image of a cluster's replicated state, in a file of its own.

``dlm snapshot save`` writes one, ``dlm snapshot inspect`` reads one and ``dlm node
restore`` builds a new cluster from one. The image is the same bytes a member's
snapshots hold at that index (``dlm.node.snapshots.image``), so whatever restores a
snapshot restores a backup; around it the file says which cluster it came from, at
which committed index and term, when it was taken and who the members were.

Format (integers little-endian)::

    b"DLMBACKUP\\x00" (10 bytes) | u16 format | u32 header_len
    | header: canonical CBOR map of header_len bytes
    | image (header["image_bytes"] bytes)
    | SHA-256 of every byte before it (32 bytes)

Header fields (format 1): ``cluster`` (text), ``index``, ``term`` (below 2**63),
``taken_at_ms`` (the taker's wall clock, ms since the epoch), ``voters`` and
``learners`` (lists of member names), ``leader`` (the member that served it, text,
may be empty), ``image_bytes``. A reader of format 1 ignores header fields it does
not know, so a later format may add some without a new number; a format it does not
know is refused rather than guessed at.

Format 2 is a partitioned cluster's backup (``--partitions P`` with P > 1): one whole
format-1 file per partition, each with its own header and checksum, in one container::

    b"DLMBACKUP\x00" | u16 2 | u32 header_len
    | header: canonical CBOR map of header_len bytes
    | part 0 (a whole format-1 file) | part 1 | ... | part P-1
    | SHA-256 of every byte before it (32 bytes)

Header fields (format 2): ``cluster``, ``partitions`` (P, 2 to 64), ``taken_at_ms``
(when the save began) and ``part_bytes`` (each part's length, in partition order).
Each part is taken from its own partition's leader at its own committed index, so the
parts are not one instant of the whole cluster: each is one consistent instant of its
partition (a key is in exactly one partition, so every key is consistent). A
one-partition cluster's backup is always format 1, exactly as before.

The checksum covers everything, so a flipped bit anywhere, a cut tail or bytes
appended all make the file not intact; every such case raises ``BackupError`` with
one line naming the file and what is wrong. Encoding and decoding are pure; only
``write_backup`` and ``read_backup`` touch the disk.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cbor2

from dlm.records import ConfState, NodeId, Snapshot, SnapshotMeta
from dlm.store import out_of_range

MAGIC = b"DLMBACKUP\x00"
FORMAT = 1
"""The format this release writes for one partition; ``READABLE_FORMATS`` are those it opens."""
PARTITIONED_FORMAT = 2
"""The format of a partitioned cluster's backup (one format-1 file per partition)."""
READABLE_FORMATS = frozenset({FORMAT, PARTITIONED_FORMAT})
HEADER_MAX_BYTES = 1 << 20
"""A header is a few hundred bytes; more than this is not a header dlm wrote."""
NAME_MAX_CHARS = 255
MEMBERS_MAX = 1024
PARTITIONS_MAX = 64
"""The most partitions a backup holds (dlm.partitioning.MAX_PARTITIONS)."""
_PREFIX = struct.Struct("<10sHI")
_DIGEST_BYTES = 32
_DAMAGED = "checksum mismatch (the file is damaged)"


class BackupError(Exception):
    """The file is not an intact backup this release can read: ``str()`` is one line
    naming the file and what is wrong with it."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True, slots=True)
class Backup:
    """What a backup file holds. ``image`` is a member's snapshot image at ``index``."""

    cluster: str
    index: int
    term: int
    taken_at_ms: int
    voters: tuple[NodeId, ...]
    learners: tuple[NodeId, ...]
    image: bytes
    leader: str = ""
    """The member that served the backup (empty if unknown)."""
    format: int = FORMAT
    """The format of the file it was read from (what ``encode_backup`` writes: ``FORMAT``)."""

    @property
    def conf(self) -> ConfState:
        return ConfState(self.voters, self.learners)

    def snapshot(self) -> Snapshot:
        """The backup as the snapshot a member's store saves and its machine restores."""
        return Snapshot(SnapshotMeta(self.index, self.term, self.conf), self.image)


def _check_text(what: str, value: object, *, allow_empty: bool = False) -> str | None:
    if type(value) is not str:
        return f"{what} is not text"
    if not value and not allow_empty:
        return f"{what} is empty"
    if len(value) > NAME_MAX_CHARS or not value.isprintable():
        return f"{what} {value[:40]!r} is not a printable name of at most {NAME_MAX_CHARS} chars"
    return None


def _check_int(what: str, value: object) -> str | None:
    if type(value) is not int:
        return f"{what} is not an integer"
    return out_of_range(what, value)


def _check_names(what: str, value: object) -> str | None:
    if type(value) not in (list, tuple):
        return f"{what} is not a list"
    assert isinstance(value, (list, tuple))
    if len(value) > MEMBERS_MAX:
        return f"{what} lists {len(value)} members, more than {MEMBERS_MAX}"
    for name in value:
        bad = _check_text(f"a name among {what}", name)
        if bad is not None:
            return bad
    if len(set(value)) != len(value):
        return f"{what} names a member twice"
    return None


def _problem(backup: Backup) -> str | None:
    """Why ``backup`` cannot be written (or was not written by dlm), or None."""
    return (
        _check_text("the cluster id", backup.cluster)
        or _check_int("index", backup.index)
        or _check_int("term", backup.term)
        or _check_int("taken_at_ms", backup.taken_at_ms)
        or _check_names("voters", backup.voters)
        or _check_names("learners", backup.learners)
        or _check_text("the leader", backup.leader, allow_empty=True)
        or (None if backup.voters else "voters is empty")
        or (
            "a member is both a voter and a learner"
            if set(backup.voters) & set(backup.learners)
            else None
        )
    )


def encode_backup(backup: Backup) -> bytes:
    """The file's bytes in ``FORMAT``; ValueError for a backup no reader would accept."""
    bad = _problem(backup)
    if bad is not None:
        raise ValueError(f"refusing to write a backup: {bad}")
    header = bytes(
        cbor2.dumps(
            {
                "cluster": backup.cluster,
                "index": backup.index,
                "term": backup.term,
                "taken_at_ms": backup.taken_at_ms,
                "voters": list(backup.voters),
                "learners": list(backup.learners),
                "leader": backup.leader,
                "image_bytes": len(backup.image),
            },
            canonical=True,
        )
    )
    body = _PREFIX.pack(MAGIC, FORMAT, len(header)) + header
    digest = hashlib.sha256(body)
    digest.update(backup.image)
    return body + backup.image + digest.digest()


def decode_backup(buf: bytes, path: str) -> Backup:
    """Parse and verify a whole backup file's bytes; BackupError (naming ``path``) if they
    are not an intact backup of a format this release reads."""

    def fail(reason: str) -> BackupError:
        return BackupError(path, reason)

    size = len(buf)
    if size < len(MAGIC) or buf[: len(MAGIC)] != MAGIC:
        if buf.startswith(b"DLMSNAP"):
            raise fail(
                "not a dlm backup (it is a member's snapshot file; take a backup with "
                "`dlm snapshot save`)"
            )
        if size < len(MAGIC) and MAGIC.startswith(buf):
            raise fail(f"truncated: {size} bytes, shorter than a backup's header")
        raise fail("not a dlm backup file (no backup magic at its start)")
    if size < _PREFIX.size:
        raise fail(f"truncated: {size} bytes, shorter than a backup's header")
    _, version, header_len = _PREFIX.unpack_from(buf)
    if version == PARTITIONED_FORMAT:
        raise fail("a partitioned cluster's backup: read it as a set (read_backup_set)")
    if version not in READABLE_FORMATS:
        raise fail(
            f"unknown backup format {version} (this dlm reads format "
            f"{', '.join(str(v) for v in sorted(READABLE_FORMATS))}; use a newer dlm)"
        )
    if header_len > HEADER_MAX_BYTES:
        raise fail(f"corrupt: header length {header_len} is beyond {HEADER_MAX_BYTES}")
    image_at = _PREFIX.size + header_len
    if size < image_at + _DIGEST_BYTES:
        raise fail(f"truncated: {size} bytes, cut inside its header")
    header_bytes = buf[_PREFIX.size : image_at]
    try:
        header: Any = cbor2.loads(header_bytes)
    except Exception:
        header = None
    image_len = header.get("image_bytes") if isinstance(header, dict) else None
    if type(image_len) is not int or image_len < 0:
        # The checksum decides whether this is rot or a writer's bug; rot is likelier.
        if hashlib.sha256(buf[:-_DIGEST_BYTES]).digest() != buf[-_DIGEST_BYTES:]:
            raise fail("checksum mismatch (the file is damaged)")
        raise fail("corrupt: its header cannot be read")
    expected = image_at + image_len + _DIGEST_BYTES
    if size < expected:
        raise fail(f"truncated: {size} bytes where its header says {expected}")
    if size > expected:
        raise fail(f"corrupt: {size - expected} bytes after its end (expected {expected} bytes)")
    digest = hashlib.sha256(memoryview(buf)[: image_at + image_len]).digest()
    if digest != buf[image_at + image_len :]:
        raise fail("checksum mismatch (the file is damaged)")
    voters = header.get("voters")
    learners = header.get("learners")
    backup = Backup(
        cluster=header.get("cluster"),  # type checks follow in _problem
        index=header.get("index"),
        term=header.get("term"),
        taken_at_ms=header.get("taken_at_ms"),
        voters=tuple(voters) if isinstance(voters, list) else voters,
        learners=tuple(learners) if isinstance(learners, list) else learners,
        image=bytes(buf[image_at : image_at + image_len]),
        leader=header.get("leader", ""),
        format=version,
    )
    bad = _problem(backup)
    if bad is not None:
        raise fail(f"corrupt: {bad}")
    return backup


def write_backup(path: str, backup: Backup) -> int:
    """Write ``backup`` to ``path`` atomically: a crash leaves the old file (or none) or
    the whole new one, never part of it. Returns the bytes written. OSError as the disk
    raises it (the temporary file is removed); ValueError for an unwritable backup."""
    return _write_atomically(path, encode_backup(backup))


def write_backup_set(path: str, parts: Sequence[Backup], taken_at_ms: int) -> int:
    """Write the backup of every partition (in partition order) to ``path`` atomically,
    as ``write_backup`` does: format 1 for one partition, format 2 for more."""
    return _write_atomically(path, encode_backup_set(parts, taken_at_ms))


def _write_atomically(path: str, data: bytes) -> int:
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return len(data)


def read_backup(path: str) -> Backup:
    """The backup in the file at ``path``; BackupError (one line) if it is missing,
    unreadable or not an intact backup of a format this release reads."""
    return decode_backup(_read(path), path)


def read_backup_set(path: str) -> BackupSet:
    """Every partition's backup in the file at ``path`` (format 1: one), BackupError
    (one line) as ``read_backup``."""
    return decode_backup_set(_read(path), path)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise BackupError(path, "no such file") from None
    except IsADirectoryError:
        raise BackupError(path, "is a directory, not a backup file") from None
    except OSError as exc:
        raise BackupError(path, f"cannot be read ({exc.strerror or exc})") from None


# ---------------------------------------------------------------------------
# A partitioned cluster's backup (format 2)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackupSet:
    """What a backup file holds, by partition: ``parts[i]`` is partition i's backup (one
    part for a format-1 file)."""

    parts: tuple[Backup, ...]
    format: int
    taken_at_ms: int

    @property
    def partitions(self) -> int:
        return len(self.parts)

    @property
    def cluster(self) -> str:
        return self.parts[0].cluster

    @property
    def index(self) -> int:
        """The highest index of any partition's image (a restore starts above it)."""
        return max(part.index for part in self.parts)

    @property
    def term(self) -> int:
        return max(part.term for part in self.parts)


def encode_backup_set(parts: Sequence[Backup], taken_at_ms: int) -> bytes:
    """The file's bytes: format 1 for one partition (exactly ``encode_backup``), format 2
    for more; ValueError for parts no reader would accept."""
    if len(parts) == 1:
        return encode_backup(parts[0])
    if not 2 <= len(parts) <= PARTITIONS_MAX:
        raise ValueError(f"refusing to write a backup of {len(parts)} partitions")
    if len({part.cluster for part in parts}) != 1:
        raise ValueError("refusing to write a backup whose partitions name different clusters")
    bad = _check_int("taken_at_ms", taken_at_ms)
    if bad is not None:
        raise ValueError(f"refusing to write a backup: {bad}")
    files = [encode_backup(part) for part in parts]
    header = bytes(
        cbor2.dumps(
            {
                "cluster": parts[0].cluster,
                "partitions": len(parts),
                "taken_at_ms": taken_at_ms,
                "part_bytes": [len(f) for f in files],
            },
            canonical=True,
        )
    )
    digest = hashlib.sha256()
    out = [_PREFIX.pack(MAGIC, PARTITIONED_FORMAT, len(header)), header, *files]
    for piece in out:
        digest.update(piece)
    return b"".join([*out, digest.digest()])


def decode_backup_set(buf: bytes, path: str) -> BackupSet:
    """Parse and verify a whole backup file of either format; BackupError (naming
    ``path`` and, for a damaged part, its partition) if it is not intact."""

    def fail(reason: str) -> BackupError:
        return BackupError(path, reason)

    if len(buf) < _PREFIX.size or buf[: len(MAGIC)] != MAGIC:
        single = decode_backup(buf, path)  # raises its own one line
        return BackupSet((single,), single.format, single.taken_at_ms)
    _, version, header_len = _PREFIX.unpack_from(buf)
    if version != PARTITIONED_FORMAT:
        single = decode_backup(buf, path)
        return BackupSet((single,), single.format, single.taken_at_ms)
    if header_len > HEADER_MAX_BYTES:
        raise fail(f"corrupt: header length {header_len} is beyond {HEADER_MAX_BYTES}")
    parts_at = _PREFIX.size + header_len
    if len(buf) < parts_at + _DIGEST_BYTES:
        raise fail(f"truncated: {len(buf)} bytes, cut inside its header")
    intact = hashlib.sha256(memoryview(buf)[:-_DIGEST_BYTES]).digest() == buf[-_DIGEST_BYTES:]
    try:
        header: Any = cbor2.loads(buf[_PREFIX.size : parts_at])
    except Exception:
        header = None
    sizes = header.get("part_bytes") if isinstance(header, dict) else None
    count = header.get("partitions") if isinstance(header, dict) else None
    if (
        type(sizes) is not list
        or type(count) is not int
        or not 2 <= count <= PARTITIONS_MAX
        or len(sizes) != count
        or not all(type(n) is int and n >= 0 for n in sizes)
    ):
        # The checksum decides whether this is rot or a writer's bug; rot is likelier.
        raise fail("corrupt: its header cannot be read" if intact else _DAMAGED)
    expected = parts_at + sum(sizes) + _DIGEST_BYTES
    if len(buf) < expected:
        raise fail(f"truncated: {len(buf)} bytes where its header says {expected}")
    if len(buf) > expected:
        raise fail(
            f"corrupt: {len(buf) - expected} bytes after its end (expected {expected} bytes)"
        )
    if not intact:
        raise fail(_DAMAGED)
    parts = []
    at = parts_at
    for partition, size in enumerate(sizes):
        try:
            parts.append(decode_backup(buf[at : at + size], path))
        except BackupError as exc:
            raise fail(f"partition {partition}: {exc.reason}") from None
        at += size
    taken_at_ms = header.get("taken_at_ms")
    bad = _check_text("the cluster id", header.get("cluster")) or _check_int(
        "taken_at_ms", taken_at_ms
    )
    if bad is None and any(part.cluster != header["cluster"] for part in parts):
        bad = "its partitions name different clusters"
    if bad is not None:
        raise fail(f"corrupt: {bad}")
    return BackupSet(tuple(parts), PARTITIONED_FORMAT, taken_at_ms)


def describe_write_error(path: str, exc: OSError) -> str:
    """One line for an OSError from ``write_backup``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write {path}: no space left on its disk"
    return f"cannot write {path}: {exc.strerror or exc}"


__all__ = [
    "FORMAT",
    "PARTITIONED_FORMAT",
    "Backup",
    "BackupError",
    "BackupSet",
    "decode_backup",
    "decode_backup_set",
    "encode_backup",
    "encode_backup_set",
    "read_backup",
    "read_backup_set",
    "write_backup",
    "write_backup_set",
]
