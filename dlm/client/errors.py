"""What can go wrong when talking to a dlm cluster, as exceptions a caller can act on.

Each exception carries the protocol's error ``code``, a one-line ``message``
that says what to do next, and the ``exit_code`` the ``dlm`` command maps it
to. This module imports nothing heavy: the CLI imports it on its hot path.
"""

from __future__ import annotations

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class DlmError(Exception):
    """Base of every error the client raises; ``code`` is the protocol error code."""

    exit_code: int = 1

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class ClusterUnavailable(DlmError):
    """No member answered, or none could reach a leader with a quorum, within the timeout."""

    exit_code = 69

    def __init__(self, message: str, code: str = "UNAVAILABLE") -> None:
        super().__init__(code, message)


class LockHeld(DlmError):
    """Someone else holds the lock (and it was not obtained within the wait, if any)."""

    exit_code = 75

    def __init__(
        self,
        message: str,
        *,
        holders: list[dict[str, Any]] | None = None,
        retry_after_ms: int | None = None,
        quarantined_until_ms: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__("LOCKED", message)
        self.key = key
        """The key that is held (set by a multi-key acquire: which of them it was)."""
        self.holders: list[dict[str, Any]] = list(holders or [])
        self.retry_after_ms = retry_after_ms
        self.quarantined_until_ms = quarantined_until_ms
        """Set when the cluster is quarantined after a restore or recovery: when it ends
        (ms since the epoch; 0 when no leader has said yet)."""


class LeaseLost(DlmError):
    """The lease is not live (it expired, was closed, or never existed); every lock it held
    is gone. ``ended`` is how, when the cluster said: "expired", "closed" or "unknown"
    (no such lease: never opened, or ended longer ago than the cluster remembers)."""

    exit_code = 77

    def __init__(self, message: str, ended: str | None = None) -> None:
        super().__init__("SESSION_EXPIRED", message)
        self.ended = ended
        self.applied_elsewhere = False
        """A TTL update that met this loss in one partition was applied by another part
        of the lease before (so the update may be in force: see core.update_applied)."""


class LockLost(DlmError):
    """A lock taken through ``dlm.Client``/``dlm.AsyncClient`` can no longer be counted on:
    its client-side deadline passed without a confirmed renewal, or the cluster said its
    lease is gone (expired, revoked by an operator). ``reason`` says which. The same
    meaning as the ``dlm`` command's exit 77 for a lost lock (``LOCK_LOST``)."""

    exit_code = 77

    def __init__(self, message: str) -> None:
        super().__init__("LOCK_LOST", message)


class InertAfterFork(DlmError):
    """A ``dlm.Client``/``dlm.AsyncClient`` or one of its locks was used in a process forked
    from the one that made it. In the child every such object is inert: calls raise this,
    and nothing is sent on the connections it inherited (so a child never renews or
    releases its parent's locks). Make a new client in the child."""

    exit_code = 70

    def __init__(self, message: str) -> None:
        super().__init__("FORKED", message)


class NotHolder(DlmError):
    """The lease does not hold the key; ``holders`` says who does now (maybe nobody)."""

    exit_code = 77

    def __init__(self, message: str, *, holders: list[dict[str, Any]] | None = None) -> None:
        super().__init__("NOT_HOLDER", message)
        self.holders: list[dict[str, Any]] = list(holders or [])


class PermissionDenied(DlmError):
    """The identity this client authenticated as may not do this (a key outside its
    prefixes, another identity's lease, or an admin's action); the message names the
    identity, the action and what it lacks."""

    exit_code = 77

    def __init__(self, message: str) -> None:
        super().__init__("PERMISSION_DENIED", message)


class QuotaExceeded(DlmError):
    """The identity this client authenticated as (or, for the cluster's own caps, everyone
    together) is at a limit: its leases, its held locks and places in queues, its
    connections or its requests in flight. ``limit`` names which (``identity_max_leases``,
    ...), ``identity`` whose. Ending some, or the operator raising it, is what helps."""

    exit_code = 77

    def __init__(self, message: str, *, limit: str | None = None, identity: str | None = None):
        super().__init__("QUOTA_EXCEEDED", message)
        self.limit = limit
        self.identity = identity


class BadRequest(DlmError):
    """The cluster refused the request as malformed or too large; retrying will not help."""

    exit_code = 2

    def __init__(self, message: str, code: str = "BAD_REQUEST") -> None:
        super().__init__(code, message)


class AuthFailed(DlmError):
    """Authentication or TLS verification failed: the secret or the certificates this client
    was given do not match the cluster's. Retrying will not help; the configuration must."""

    exit_code = 78

    def __init__(self, message: str) -> None:
        super().__init__("AUTH_FAILED", message)


class ChangeInProgress(DlmError):
    """Another membership change has not committed yet, so this one was not made: retry
    shortly (the ``dlm`` command exits 75, as for any try-again-later)."""

    exit_code = 75

    def __init__(self, message: str) -> None:
        super().__init__("CONFLICT", message)


class UnsafeChange(DlmError):
    """The membership change was not made: it would leave voters of which too few answer to
    make a quorum. Bring them back first, or insist (``force``)."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__("UNSAFE", message)


class ServerError(DlmError):
    """An error code this client does not know how to handle (the ``dlm`` command's exit
    70: a bug, or a reply it does not understand)."""

    exit_code = 70


__all__ = [
    "AuthFailed",
    "BadRequest",
    "ChangeInProgress",
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
    "UnsafeChange",
]
