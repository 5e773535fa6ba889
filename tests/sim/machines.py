"""State machines the simulator applies committed entries to.

``DigestMachine`` folds every applied entry into a running hash, so two
replicas agree on their image only if they applied the same commands in the
same order. Its image also carries the last few commands, which makes it a
few hundred bytes: enough to need several InstallSnapshot chunks at the small
chunk size the simulator configures.
"""

from __future__ import annotations

import hashlib
import struct
from collections import deque
from typing import Protocol

from dlm.records import Entry

_RECENT = 12


class Machine(Protocol):
    """What the harness needs of an applied state machine."""

    def apply(self, entry: Entry) -> object: ...

    def snapshot(self) -> bytes: ...

    def restore(self, image: bytes) -> None: ...


class DigestMachine:
    def __init__(self) -> None:
        self.digest = bytes(16)
        self.count = 0
        self.recent: deque[bytes] = deque(maxlen=_RECENT)

    def apply(self, entry: Entry) -> None:
        h = hashlib.blake2b(self.digest, digest_size=16)
        h.update(struct.pack(">QQ", entry.index, entry.term))
        h.update(entry.data)
        self.digest = h.digest()
        self.count += 1
        if entry.data:
            self.recent.append(entry.data)

    def snapshot(self) -> bytes:
        parts = [self.digest, struct.pack(">QB", self.count, len(self.recent))]
        for data in self.recent:
            parts.append(struct.pack(">H", len(data)))
            parts.append(data)
        return b"".join(parts)

    def restore(self, image: bytes) -> None:
        self.digest = image[:16]
        self.count, n = struct.unpack_from(">QB", image, 16)
        offset = 16 + 9
        self.recent.clear()
        for _ in range(n):
            (length,) = struct.unpack_from(">H", image, offset)
            offset += 2
            self.recent.append(image[offset : offset + length])
            offset += length
