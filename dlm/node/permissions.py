"""Who may: the check a member makes of each client request against its applied identity
table before it serves the request, and the audit lines that say who asked.

The rule itself is identities.py's (``refusal``); the state machine checks every change
again when it applies it (locks/machine.py, ``_denied``), so an identity removed between
proposal and apply is refused alike on every replica. Pure: part of the node machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlm.node.locks.identities import ADMIN, refusal
from dlm.wire import Acquire, Get, Watch

if TYPE_CHECKING:
    from dlm.node import locks
    from dlm.node.clients import ClientConn
    from dlm.node.outbox import Outbox
    from dlm.node.stats import Stats
    from dlm.wire import ClientRequest


def request_refusal(
    table: locks.LockStateMachine,
    out: Outbox,
    state: ClientConn,
    req: ClientRequest,
    *,
    leading: bool,
    enforce: bool = True,
) -> str | None:
    """Why the connection's identity may not make ``req`` (by the permission wire.py's
    table names for its kind), or None, after logging an admin action. A follower, whose
    lease owners may lag, leaves the owner check to the leader it sends the client to."""
    identity = state.identity or ADMIN
    key = req.key if isinstance(req, Get | Acquire) else None
    if isinstance(req, Watch):
        # A prefix is watched as a key would be: it must lie under one of the prefixes.
        key = req.key if req.key is not None else req.prefix
    owner = None
    lease = getattr(req, "lease", None)
    if leading and isinstance(lease, str):
        owner = table.lease_owner(lease)
    # Before version 3 there is no identity table: every client is the admin.
    if table.version >= 3 and enforce:
        problem = refusal(
            table.identities, identity, req.TYPE, req.PERMISSION, key=key, owner=owner
        )
        if problem is not None:
            return problem
    if req.PERMISSION == "admin" or (owner and owner != identity):
        # An admin action (membership, identities, another identity's lease): the audit
        # trail says who asked. Identity changes are said again when applied.
        target = getattr(req, "member", None) or getattr(req, "name", None) or lease
        extra = {"target": target} if target else {}
        if owner:
            extra["owner"] = owner
        out.log("info", "admin_action", identity=identity, action=req.TYPE, **extra)
    return None


def count_refusal(stats: Stats, out: Outbox, identity: str, action: str, problem: str) -> None:
    """Counts and logs a refusal (the audit trail names the identity and the action)."""
    stats.refused(identity, action)
    out.log("warning", "permission_denied", identity=identity, action=action, reason=problem)
