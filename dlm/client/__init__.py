"""The dlm client library: talk to a cluster, take and hold locks.

``from dlm.client import Client`` gives the blocking client (sync.py);
``dlm.client.aio.AsyncClient`` is the anyio one. Importing this package is
cheap: the exceptions are loaded at once, everything else on first use, so
the CLI can catch ``DlmError`` without paying for sockets or CBOR.
"""

from __future__ import annotations

from dlm.client.errors import (
    BadRequest,
    ChangeInProgress,
    ClusterUnavailable,
    DlmError,
    LeaseLost,
    LockHeld,
    NotHolder,
    PermissionDenied,
    QuotaExceeded,
    ServerError,
    UnsafeChange,
)

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from dlm.client.core import Grant, Lease
    from dlm.client.sync import Client, KeepAlive

_LAZY = {
    "Client": "dlm.client.sync",
    "KeepAlive": "dlm.client.sync",
    "Grant": "dlm.client.core",
    "Lease": "dlm.client.core",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dlm.client' has no attribute {name!r}")
    # __import__ rather than importlib.import_module: importlib costs ~0.3 ms to import.
    return getattr(__import__(module, fromlist=(name,)), name)


__all__ = [
    "BadRequest",
    "ChangeInProgress",
    "Client",
    "ClusterUnavailable",
    "DlmError",
    "Grant",
    "KeepAlive",
    "Lease",
    "LeaseLost",
    "LockHeld",
    "NotHolder",
    "PermissionDenied",
    "QuotaExceeded",
    "ServerError",
    "UnsafeChange",
]
