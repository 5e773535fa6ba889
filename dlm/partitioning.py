"""Which partition a key lives in, and how a connection names the partition it wants.

A cluster created with ``--partitions P`` runs P Raft groups; every member hosts
every group. A key belongs to exactly one group, chosen by ``partition_of``: the
first 8 bytes of BLAKE2b (digest size 8, no key, no salt) of the key's UTF-8
bytes, read as a big-endian unsigned integer, modulo P. The function is part of
the data format: it must give the same answer in every release, because a
member refuses a key that is not its own (``ErrorCode.WRONG_PARTITION``) and a
restore re-hashes every key with it. P = 1 maps every key to partition 0, which
is exactly the cluster of earlier releases.

One listening address serves every partition of a member. A connection to
partition 0 starts as it always did (a hello frame, or a TLS handshake). A
connection to partition i > 0 first sends ``preamble(i)``: a byte no frame or
TLS record starts with (a frame's length prefix starts with 0x00, a TLS record
with 0x16), four magic bytes, and the partition number. The member's supervisor
reads only those bytes and hands the connection to that partition's process,
which then sees an ordinary connection.

Pure: no IO, no clock, no randomness (tests/unit/node/test_purity.py).
Tested by tests/unit/test_partitioning.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

MAX_PARTITIONS = 64
"""The most partitions a cluster may have (one process each on every member)."""

PREAMBLE_MAGIC = b"\xffDLMP"
"""What a connection to a partition other than 0 sends before anything else."""
PREAMBLE_SIZE = len(PREAMBLE_MAGIC) + 1


def check_partitions(count: int) -> str | None:
    """Why ``count`` is not a valid partition count (None: it is)."""
    if isinstance(count, bool) or not isinstance(count, int):
        return "the partition count must be a whole number"
    if not 1 <= count <= MAX_PARTITIONS:
        return f"the partition count must be 1 to {MAX_PARTITIONS}, not {count}"
    return None


def partition_of(key: str, partitions: int) -> int:
    """The partition that holds ``key`` in a cluster of ``partitions`` partitions."""
    if partitions == 1:
        return 0
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def partition_order(keys: Iterable[str], partitions: int) -> list[tuple[int, list[str]]]:
    """The keys grouped by partition, in the one global order every multi-key acquire
    takes them: partitions ascending, keys sorted within each. Two acquires that both
    need partitions 1 and 3 both take 1 first, so neither can hold 3 while waiting for
    1 and the other hold 1 while waiting for 3."""
    groups: dict[int, list[str]] = {}
    for key in keys:
        groups.setdefault(partition_of(key, partitions), []).append(key)
    return [(p, sorted(set(groups[p]))) for p in sorted(groups)]


def preamble(partition: int) -> bytes:
    """The bytes a connection to ``partition`` sends first (none for partition 0)."""
    if partition == 0:
        return b""
    if not 0 < partition < MAX_PARTITIONS:
        raise ValueError(f"no partition {partition}")
    return PREAMBLE_MAGIC + bytes([partition])


def read_preamble(first: bytes) -> int | None:
    """The partition a connection's first bytes name: 0 when they are not a preamble
    (an ordinary hello or TLS handshake, which stays unread), the partition number
    for a whole preamble, None for a preamble that is malformed or names no
    partition (the connection is closed). ``first`` is at most PREAMBLE_SIZE bytes
    and, when it starts with the magic's first byte, exactly PREAMBLE_SIZE."""
    if not first or first[:1] != PREAMBLE_MAGIC[:1]:
        return 0
    if len(first) != PREAMBLE_SIZE or first[: len(PREAMBLE_MAGIC)] != PREAMBLE_MAGIC:
        return None
    partition = first[-1]
    return partition if 0 < partition < MAX_PARTITIONS else None
