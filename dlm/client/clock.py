"""The one clock every lease deadline on a client host counts on.

A lease's time runs on the cluster whether this host is awake or not: a
laptop's sleep or a hibernated VM does not stop the leader from expiring the
lease and granting its locks to someone else. CLOCK_MONOTONIC stops while
Linux is suspended, so a deadline counted on it would pass, after a resume,
as much later as the host slept. CLOCK_BOOTTIME is CLOCK_MONOTONIC plus the
time spent suspended; it is what ``lease_clock`` reads where it exists, and
CLOCK_MONOTONIC (``time.monotonic``) elsewhere.

Everything that compares a lease deadline with the time reads this clock:
the library's request context (``core.Context.clock``, hence
``Lease.confirmed_at``), ``KeepAlive`` (sync and aio), ``dlm exec``'s
supervisor and its guard. A deadline handed from one process of a host to
another (the supervisor tells its guard each new D) therefore means the same
instant in both.

A timed wait (``select``, ``Condition.wait``, ``anyio.sleep``) counts on
CLOCK_MONOTONIC whatever we read, so a wait for a deadline sleeps through a
suspend; whoever waits for one wakes at least every ``RECHECK_S`` to read
this clock again.
"""

from __future__ import annotations

import time

RECHECK_S = 0.1
"""Longest wait between two readings of the clock while waiting for a lease deadline: a
deadline that passed during a suspend is noticed within this long of the resume."""


def _boottime() -> int | None:
    """CLOCK_BOOTTIME's id, if the platform has it and the kernel answers for it."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return None
    try:
        time.clock_gettime(clock_id)
    except OSError:  # an old kernel, or a sandbox that filters the clock id
        return None
    return int(clock_id)


_BOOTTIME = _boottime()

if _BOOTTIME is not None:
    _CLOCK_ID: int = _BOOTTIME

    def lease_clock() -> float:
        """Seconds on a clock that keeps running while the host is suspended."""
        return time.clock_gettime(_CLOCK_ID)

else:  # pragma: no cover - not Linux

    def lease_clock() -> float:
        """Seconds on a clock that keeps running while the host is suspended (as far as
        this platform offers one: CLOCK_MONOTONIC)."""
        return time.monotonic()


CLOCK_NAME = "CLOCK_BOOTTIME" if _BOOTTIME is not None else "CLOCK_MONOTONIC"
"""Which clock ``lease_clock`` reads here (for messages and tests)."""
