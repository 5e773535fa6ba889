"""The public Python API's room (private by name: import everything from ``dlm``).

``dlm/__init__.py`` exports these names lazily; this package holds them:
sync.py (``Client``, ``Lock``), aio.py (``AsyncClient``, ``AsyncLock``: anyio),
with ``client.election(name)``'s ``Election`` and ``Leadership`` (sync.py) and
``AsyncElection`` and ``AsyncLeadership`` (aio.py), built on the locks; election.py
(``Leader`` and the campaign's pure rules),
held.py (what a lock object knows of what it holds, shared by both), options.py
(the arguments read as the ``dlm`` command reads its flags and variables), fork.py
(objects inert in a forked child), and here ``now()`` and the exceptions, which are
dlm.client's own. A thin layer: every request, retry and deadline rule is
dlm.client's (core.py, driven by its sync.py and aio.py).
"""

from __future__ import annotations

from dlm.client.clock import lease_clock
from dlm.client.errors import (
    AuthFailed,
    BadRequest,
    ClusterUnavailable,
    DlmError,
    InertAfterFork,
    LeaseLost,
    LockHeld,
    LockLost,
    NotHolder,
    PermissionDenied,
    QuotaExceeded,
    ServerError,
)


def now() -> float:
    """Seconds on the clock every lock ``deadline`` is on: CLOCK_BOOTTIME where there is
    one (it runs on while the host is suspended, as leases do), else CLOCK_MONOTONIC.
    Only differences mean anything; never compare it with wall-clock time, or send it to
    another host."""
    return lease_clock()


__all__ = [
    "AuthFailed",
    "BadRequest",
    "ClusterUnavailable",
    "DlmError",
    "InertAfterFork",
    "LeaseLost",
    "LockHeld",
    "LockLost",
    "NotHolder",
    "PermissionDenied",
    "QuotaExceeded",
    "ServerError",
    "now",
]
