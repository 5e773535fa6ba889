"""dlm: a distributed lock service with Raft-replicated leases and fencing tokens.

The public Python API (docs/python.md) is what ``__all__`` lists, and nothing else:

- ``dlm.Client`` / ``dlm.AsyncClient`` (anyio: asyncio or trio), and the locks they
  make: ``dlm.Lock`` / ``dlm.AsyncLock`` (``client.lock(key)``, ``client.semaphore``);
- elections (``client.election(name)``): ``dlm.Election`` / ``dlm.AsyncElection``, whose
  ``campaign`` gives a ``dlm.Leadership`` / ``dlm.AsyncLeadership`` (a lock on the
  election's key), and ``dlm.Leader`` (who leads, from ``leader()`` and ``observe()``);
- ``dlm.now()``: the clock every lock deadline is on;
- the exceptions, one per exit code of the ``dlm`` command, with the same meaning.

Every other module and name (``dlm.client``, ``dlm.cli``, ``dlm.node``, names with a
leading underscore) is internal and may change. ``import dlm`` stays cheap (every
``dlm`` command starts with it): the names load on first use.
"""

__version__ = "0.1.0"

# typing (and __future__) stay off the CLI's import path, which starts here: every `dlm`
# command imports this module. mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from dlm._api import (
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
        now,
    )
    from dlm._api.aio import AsyncClient, AsyncElection, AsyncLeadership, AsyncLock
    from dlm._api.election import Leader
    from dlm._api.sync import Client, Election, Leadership, Lock

_LAZY = {
    "Client": "dlm._api.sync",
    "Lock": "dlm._api.sync",
    "AsyncClient": "dlm._api.aio",
    "AsyncLock": "dlm._api.aio",
    "Election": "dlm._api.sync",
    "Leadership": "dlm._api.sync",
    "Leader": "dlm._api.election",
    "AsyncElection": "dlm._api.aio",
    "AsyncLeadership": "dlm._api.aio",
}
"""Where each public name lives (dlm._api, the public API's room, unless named here)."""


def __getattr__(name: str) -> "Any":
    if name not in __all__ or name == "__version__":
        raise AttributeError(f"module 'dlm' has no attribute {name!r}")
    module = _LAZY.get(name, "dlm._api")
    # __import__ rather than importlib.import_module: importlib costs ~0.3 ms to import.
    value = getattr(__import__(module, fromlist=(name,)), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> "list[str]":
    return sorted({*globals(), *__all__})


__all__ = [
    "AsyncClient",
    "AsyncElection",
    "AsyncLeadership",
    "AsyncLock",
    "AuthFailed",
    "BadRequest",
    "Client",
    "ClusterUnavailable",
    "DlmError",
    "Election",
    "InertAfterFork",
    "Leader",
    "Leadership",
    "LeaseLost",
    "Lock",
    "LockHeld",
    "LockLost",
    "NotHolder",
    "PermissionDenied",
    "QuotaExceeded",
    "ServerError",
    "__version__",
    "now",
]
