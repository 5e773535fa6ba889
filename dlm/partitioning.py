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


TARGET_MAGIC = b"\xffDLMG"
"""What a connection to a gateway sends first to name the member it wants (below)."""
MAX_TARGET_ADDRESS = 255
"""The longest member address a target preamble may carry (its length is one byte)."""


def target_preamble(partition: int, address: str) -> bytes:
    """The bytes a client sends a gateway (dlm/gateway/) first to reach ``partition`` at
    the member whose advertised address is ``address`` ("host:port", ASCII): the
    magic, the partition number, the address's length in one byte, the address. A
    gateway relays the connection to that member only if it is one of the gateway's
    own members; any other address gets the connection closed."""
    if not 0 <= partition < MAX_PARTITIONS:
        raise ValueError(f"no partition {partition}")
    try:
        encoded = address.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"a member address must be ASCII, not {address!r}") from None
    if not 1 <= len(encoded) <= MAX_TARGET_ADDRESS:
        raise ValueError(f"a member address must be 1 to {MAX_TARGET_ADDRESS} bytes")
    return TARGET_MAGIC + bytes([partition, len(encoded)]) + encoded


class Routing:
    """What a connection's first bytes ask a gateway for: ``partition``, at ``target`` (a
    member's address) or wherever the gateway chooses (None); ``consumed`` bytes of the
    connection were routing bytes (0: none, the client's own first bytes follow)."""

    __slots__ = ("consumed", "partition", "target")

    def __init__(self, partition: int, target: str | None, consumed: int) -> None:
        self.partition = partition
        self.target = target
        self.consumed = consumed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Routing) and (self.partition, self.target, self.consumed) == (
            other.partition,
            other.target,
            other.consumed,
        )

    def __hash__(self) -> int:
        return hash((self.partition, self.target, self.consumed))

    def __repr__(self) -> str:
        return f"Routing({self.partition!r}, {self.target!r}, {self.consumed!r})"


def read_routing(first: bytes) -> Routing | int | None:
    """What the first bytes a gateway read from a connection ask for.

    A ``Routing`` once they are enough to tell: a partition preamble (``preamble``), a
    target preamble (``target_preamble``), or anything else (partition 0, nothing
    consumed: an ordinary hello or TLS handshake). An int when more bytes are needed:
    the total count to read before asking again (never more than 7 + 255). None when
    they are malformed: an unknown magic, no such partition, an empty or non-ASCII
    address (the connection is closed). Never reads past the routing bytes, so the
    caller can read exactly what is asked and relay the rest untouched."""
    if not first:
        return 1
    if first[:1] != PREAMBLE_MAGIC[:1]:
        return Routing(0, None, 0)
    magic_size = len(PREAMBLE_MAGIC)
    if len(first) < magic_size:
        return magic_size
    magic = first[:magic_size]
    if magic == PREAMBLE_MAGIC:
        if len(first) < PREAMBLE_SIZE:
            return PREAMBLE_SIZE
        partition = read_preamble(first[:PREAMBLE_SIZE])
        return None if partition is None else Routing(partition, None, PREAMBLE_SIZE)
    if magic != TARGET_MAGIC:
        return None
    head = magic_size + 2
    if len(first) < head:
        return head
    partition, size = first[magic_size], first[magic_size + 1]
    if not 0 <= partition < MAX_PARTITIONS or size == 0:
        return None
    if len(first) < head + size:
        return head + size
    raw = first[head : head + size]
    if not all(0x21 <= byte < 0x7F for byte in raw):
        return None  # printable ASCII without spaces: an address, nothing else
    return Routing(partition, raw.decode("ascii"), head + size)
