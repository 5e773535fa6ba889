"""Which requests a partition's process may serve: only those about its own keys.

A member of several partitions runs one process per partition, each serving one
Raft group; a request that names a key (acquire, release, proclaim, get, an
election, the runs or watch of one key) belongs to the group of that key's
partition (dlm.partitioning.partition_of). A client that routed it elsewhere (it
does not know the count yet, or the count changed with a restore) gets
WRONG_PARTITION with ``partitions``, re-learns the count and routes again.
Requests that name no key (leases, lists, status) are answered for this
partition alone. A member of one partition serves every key.

Pure: no IO, no clock, no randomness (tests/unit/node/test_purity.py). Tested by
tests/unit/node/test_partition_guard.py; NodeMachine calls it for every request
it admits (and the simulator drives it through the machine).
"""

from __future__ import annotations

from typing import Any

from dlm.partitioning import partition_of
from dlm.wire import ErrorCode, error


def named_key(request: Any) -> str | None:
    """The key a request is about, if it names one."""
    key = getattr(request, "key", None)
    return key if isinstance(key, str) else None


def partition_refusal(request: Any, partition: int, partitions: int) -> dict[str, Any] | None:
    """The WRONG_PARTITION error for a request about a key of another partition, or None
    when this partition serves it."""
    if partitions == 1:
        return None
    key = named_key(request)
    if key is None:
        return None
    home = partition_of(key, partitions)
    if home == partition:
        return None
    return error(
        getattr(request, "id", None),
        ErrorCode.WRONG_PARTITION,
        f"key {key!r} is in partition {home} of {partitions}, and this connection reached "
        f"partition {partition}: send it to partition {home}",
        partitions=partitions,
    )
