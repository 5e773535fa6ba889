"""The simulator's permission check: no request is applied without its permission.

Written apart from dlm/node/locks/identities.py on purpose (a rule checked by itself
proves nothing): before each client command or identity change is applied, it decides
from the replica's own table and lease owners whether the asking identity may do it,
and an entry applied with an effect while the identity lacked the permission is a
``unpermitted`` violation. It also checks what the removal of an identity does: no
lease ends at that entry (a removed identity's leases run out at their TTL, after each
holder stopped: ``removed-lease-freed``).

And the quotas an admin set per identity (``dlm auth set``, in the identity table):
before an open or an acquire is applied, ``over_own_limit`` says whether the owner
already has as many leases (or held locks plus places in queues) as its own setting
allows; an entry that then takes effect and adds one is an ``over-quota`` violation.
"""

from __future__ import annotations

from dlm.node import locks

BUILT_IN_ADMIN = "admin"


def forbidden(machine: locks.LockStateMachine, cmd: locks.Command) -> str | None:
    """Why applying ``cmd`` on ``machine`` (as it stands before the entry) would be done
    without permission, or None when the asking identity may."""
    if isinstance(cmd, locks.IdentityCommand):
        who = cmd.by
        if who != BUILT_IN_ADMIN:
            entry = machine.identities.get(who)
            if entry is None or entry.role != "admin":
                return f"identity change {cmd.op} {cmd.name} by non-admin {who!r}"
        return None
    if isinstance(cmd, locks.SettingsCommand):
        who = cmd.by
        if who != BUILT_IN_ADMIN:
            entry = machine.identities.get(who)
            if entry is None or entry.role != "admin":
                return f"config set {cmd.setting} by non-admin {who!r}"
        return None
    if isinstance(cmd, locks.ClusterVersionCommand | locks.ExpireCommand | locks.QuarantineCommand):
        return None
    who = cmd.owner if isinstance(cmd, locks.OpenLeaseCommand) else cmd.by
    if not who or who == BUILT_IN_ADMIN:
        return None
    entry = machine.identities.get(who)
    if entry is None:
        return f"{type(cmd).__name__} by {who!r}, an identity the table does not have"
    if entry.role == "admin":
        return None
    owner = machine.lease_owner(cmd.lease)
    if owner is not None and owner != who:
        return f"{type(cmd).__name__} by {who!r} on lease {cmd.lease} opened by {owner!r}"
    if isinstance(cmd, locks.AcquireCommand) and not any(
        cmd.key.startswith(prefix) for prefix in entry.prefixes
    ):
        return f"acquire of {cmd.key!r} by {who!r}, whose prefixes are {entry.prefixes}"
    return None


QUOTA_LEASES, QUOTA_LOCKS = 0, 1
"""Where an identity's own lease and lock limits sit in ``Identity.limits``."""


def over_own_limit(machine: locks.LockStateMachine, cmd: locks.Command) -> str | None:
    """Why applying ``cmd`` with effect would take its owner past the limit an admin set for
    it (as ``machine`` stands before the entry), or None."""
    if isinstance(cmd, locks.OpenLeaseCommand):
        owner = cmd.owner
        if not owner or machine.lease_terms(cmd.lease) is not None:
            return None  # no identity, or joining a lease it has: adds nothing
        kind, used = QUOTA_LEASES, machine.usage.of(owner).leases
    elif isinstance(cmd, locks.AcquireCommand):
        owner = machine.lease_owner(cmd.lease) or ""
        if not owner or machine.holds(cmd.lease, cmd.key) or machine.waits(cmd.lease, cmd.key):
            return None
        kind, used = QUOTA_LOCKS, machine.usage.of(owner).locks
    else:
        return None
    entry = machine.identities.get(owner)
    limit = entry.limits[kind] if entry is not None else 0
    if limit and used >= limit:
        what = ("leases", "held locks and places in queues")[kind]
        return f"{type(cmd).__name__} for {owner!r}, which has {used} {what}, its own limit {limit}"
    return None


def added(outcome: locks.ApplyOutcome) -> bool:
    """Whether an open or acquire took something: a lease opened, a lock held or queued."""
    return isinstance(outcome.result, locks.LeaseOpened | locks.Granted | locks.Queued)


def effective(outcome: locks.ApplyOutcome) -> bool:
    """Whether the entry did something (not refused, not malformed)."""
    return not isinstance(outcome.result, locks.Denied | locks.Invalid)
