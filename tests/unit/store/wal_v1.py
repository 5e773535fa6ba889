"""Version 1 WAL segments, byte for byte as dlm 0.1 wrote them, for upgrade tests.

dlm 0.1 framed each record as ``u32 length | u32 crc | payload`` (no copy of
the head after it) and wrote one ``ENTRY`` record per entry. The store no
longer writes this format but must keep reading it; these helpers build such
segments (checked byte-identical against the 0.1 encoder when written).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from dlm.records import Entry
from dlm.store.wal import FLAG_RESET, REC_ENTRY, REC_HEADER, WAL_MAGIC

_LEN = struct.Struct("<I")
_ENTRY = struct.Struct("<BQQB")
_HEADER = struct.Struct("<B4sBQQQB")


def frame(payload: bytes) -> bytes:
    length = _LEN.pack(len(payload))
    return length + _LEN.pack(zlib.crc32(payload, zlib.crc32(length))) + payload


def header(seq: int, prev_index: int, prev_term: int, reset: bool = False) -> bytes:
    flags = FLAG_RESET if reset else 0
    return frame(_HEADER.pack(REC_HEADER, WAL_MAGIC, 1, seq, prev_index, prev_term, flags))


def entries(batch: Sequence[Entry]) -> bytes:
    return b"".join(frame(_ENTRY.pack(REC_ENTRY, e.index, e.term, e.kind) + e.data) for e in batch)


def segment(seq: int, prev_index: int, prev_term: int, batch: Sequence[Entry]) -> bytes:
    return header(seq, prev_index, prev_term) + entries(batch)
