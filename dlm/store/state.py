"""The hard state file: term, vote, advisory commit and the bootstrap membership.

Written atomically: the new contents go to ``state.tmp``, which is fsynced,
renamed over ``state``, and the directory fsynced. A crash leaves either the
old file or the new one, never a mix; a leftover ``state.tmp`` is ignored
and removed on the next open.

Only term and vote need to be durable before a message leaves (a vote and a
term are promises). ``commit`` is advisory (see ``types.HardState``): it is
written whenever term or vote are, and when the store closes, but a change
of commit alone never costs a disk write, so it may come back lower after a
crash. A restarted node relearns it from the leader.

Format (little-endian)::

    b"DLMH" | u8 version | u64 term | u64 commit | u16 len + vote (utf-8, len 0xFFFF = none)
    | u16 count + (u16 len + utf-8) voters | u16 count + (u16 len + utf-8) learners | u32 crc

``crc`` is CRC-32 of everything before it. ``term`` and ``commit`` must be below
2**63: ``set`` refuses to persist more (StoreError), and a stored value out of
range is reported as corruption at its byte offset, never turned into a crash
at the next election.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from dataclasses import dataclass

from dlm.records import ConfState, HardState, NodeId
from dlm.store import StoreCorrupted, StoreError, StoreFull, out_of_range
from dlm.store.fs import FileSystem

STATE_NAME = "state"
MAGIC = b"DLMH"
VERSION = 1
_HEAD = struct.Struct("<4sBQQ")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_NO_VOTE = 0xFFFF
_TERM_AT = 5  # byte offsets in the file, for error messages
_COMMIT_AT = 13


@dataclass(frozen=True, slots=True)
class StoredState:
    hard_state: HardState
    conf: ConfState | None
    """The membership the store was bootstrapped with (None: never bootstrapped)."""


def _pack_str(text: str) -> bytes:
    raw = text.encode()
    if len(raw) >= _NO_VOTE:
        raise ValueError(f"name too long: {text[:40]!r}...")
    return _U16.pack(len(raw)) + raw


def pack_names(names: tuple[NodeId, ...]) -> bytes:
    return _U16.pack(len(names)) + b"".join(_pack_str(n) for n in names)


class _Reader:
    """Bounds-checked cursor; raises ValueError on a short read."""

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise ValueError(f"truncated at byte {self.pos}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u16(self) -> int:
        value: int = _U16.unpack(self.take(2))[0]
        return value

    def text(self) -> str:
        return self.take(self.u16()).decode()

    def names(self) -> tuple[NodeId, ...]:
        return tuple(self.text() for _ in range(self.u16()))


def _check_persistable(hs: HardState) -> None:
    bad = out_of_range("term", hs.term) or out_of_range("commit index", hs.commit)
    if bad is not None:
        raise StoreError(f"refusing to persist the hard state: {bad}")


def encode_state(state: StoredState) -> bytes:
    """The file's bytes; StoreError for a term or commit index outside [0, 2**63)."""
    hs = state.hard_state
    _check_persistable(hs)
    vote = _U16.pack(_NO_VOTE) if hs.vote is None else _pack_str(hs.vote)
    conf = (
        b"\x00"
        if state.conf is None
        else b"\x01" + pack_names(state.conf.voters) + pack_names(state.conf.learners)
    )
    body = _HEAD.pack(MAGIC, VERSION, hs.term, hs.commit) + vote + conf
    return body + _U32.pack(zlib.crc32(body))


def decode_state(buf: bytes, name: str = STATE_NAME) -> StoredState:
    if len(buf) < _HEAD.size + 4:
        raise StoreCorrupted(name, 0, f"file is {len(buf)} bytes, too short", what="hard state")
    (crc,) = _U32.unpack_from(buf, len(buf) - 4)
    if zlib.crc32(buf[:-4]) != crc:
        raise StoreCorrupted(name, 0, "checksum mismatch", what="hard state")
    magic, version, term, commit = _HEAD.unpack_from(buf)
    if magic != MAGIC or version != VERSION:
        raise StoreCorrupted(
            name, 0, f"unknown magic/version {magic!r}/{version}", what="hard state"
        )
    for offset, what, value in ((_TERM_AT, "term", term), (_COMMIT_AT, "commit index", commit)):
        bad = out_of_range(what, value)
        if bad is not None:
            raise StoreCorrupted(name, offset, bad, what="hard state")
    reader = _Reader(buf[:-4], _HEAD.size)
    try:
        vote_len = reader.u16()
        vote = None if vote_len == _NO_VOTE else reader.take(vote_len).decode()
        conf = None
        if reader.take(1) == b"\x01":
            conf = ConfState(reader.names(), reader.names())
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreCorrupted(name, reader.pos, str(exc), what="hard state") from None
    return StoredState(HardState(term, vote, commit), conf)


def load_state(fs: FileSystem, directory: str) -> StoredState | None:
    """The stored state, or None for a store that never wrote one."""
    path = os.path.join(directory, STATE_NAME)
    if not fs.exists(path):
        return None
    return decode_state(fs.read(path))


def write_atomically(fs: FileSystem, directory: str, name: str, data: bytes, *, sync: bool) -> None:
    """Replace ``directory/name`` with ``data`` so that a crash leaves old or new.

    StoreFull if the disk or quota is full (the old file is then untouched).
    """
    tmp = os.path.join(directory, name + ".tmp")
    try:
        handle = fs.create(tmp)
        try:
            handle.write(data)
            if sync:
                handle.fsync()
        finally:
            handle.close()
        fs.rename(tmp, os.path.join(directory, name))
        if sync:
            fs.fsync_dir(directory)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(directory, len(data)) from exc
        raise


class StateFile:
    """The hard state of one member, written only when term or vote change."""

    def __init__(self, fs: FileSystem, directory: str, *, sync: bool) -> None:
        self._fs = fs
        self._dir = directory
        self._sync = sync
        stale = os.path.join(directory, STATE_NAME + ".tmp")
        if fs.exists(stale):
            fs.remove(stale)
        loaded = load_state(fs, directory)
        self._persisted = loaded or StoredState(HardState(), None)
        self._current = self._persisted.hard_state

    @property
    def hard_state(self) -> HardState:
        return self._current

    @property
    def conf(self) -> ConfState | None:
        return self._persisted.conf

    def set(self, hard_state: HardState) -> None:
        """Record ``hard_state``; durable on return if term or vote changed."""
        old = self._persisted.hard_state
        if hard_state.term < old.term:
            raise ValueError(f"term would go back from {old.term} to {hard_state.term}")
        # Refused before it is held in memory, so that flush() never meets it later.
        _check_persistable(hard_state)
        if (hard_state.term, hard_state.vote) != (old.term, old.vote):
            self._write(StoredState(hard_state, self._persisted.conf))
        self._current = hard_state

    def set_conf(self, conf: ConfState) -> None:
        self._write(StoredState(self._current, conf))

    def flush(self) -> None:
        """Persist a commit index that only lives in memory so far (on close)."""
        if self._current != self._persisted.hard_state:
            self._write(StoredState(self._current, self._persisted.conf))

    def _write(self, state: StoredState) -> None:
        write_atomically(self._fs, self._dir, STATE_NAME, encode_state(state), sync=self._sync)
        self._persisted = state
