"""Quotas per identity: how much of a member, and of the cluster, one identity may take.

One identity (a team's CI runners, say) must not be able to starve the others: fill
the cluster's lease table, take every client connection of a member, or pipeline
requests without end. So each identity has limits (``IdentityLimits``) below the
cluster's own caps (machine_config.Quotas):

* ``max_leases`` and ``max_locks`` (held slots plus places in queues) count what the
  identity's leases take in the replicated state. The leader looks the identity's
  limit up when it proposes and writes it into the entry (``open3``/``acquire3``),
  and the lock state machine decides at apply time from the replicated counts
  (``LockStateMachine.usage``), so every replica refuses alike, and concurrent
  proposals cannot overshoot;
* ``max_connections`` counts the identity's client connections on one member, and
  ``max_inflight`` the requests one connection has sent and not yet had answered.

``limits_for(identity)`` is the lookup the member uses (``with_settings``): an admin's
setting for the identity in the replicated identity table (``dlm auth set NAME
--max-leases N``, cluster version 4), else the member's defaults (flags
``--identity-max-*``); the built-in admin keeps the cluster's and the member's own caps.
The lock state machine lays the same setting over the quota an entry carries at apply
(locks/machine.py, ``_quota``), so a setting binds every entry applied after it, alike on
every replica. Refusals are QUOTA_EXCEEDED naming the identity's limit, never the
cluster's.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MAX_INFLIGHT = 512
"""Requests one connection may have unanswered (the client library sends one at a time
per call; a pipelining client far beyond this only makes the member queue its work)."""
CONNECTION_SHARE = 4
"""By default one identity may hold at most 3/4 of a member's client connections, so
the last quarter stays for everyone else."""


@dataclass(frozen=True, slots=True)
class IdentityLimits:
    """What one identity may take. Every count is at least 1."""

    max_leases: int
    """Live leases it owns, cluster-wide."""
    max_locks: int
    """Held slots plus places in queues of its leases, cluster-wide."""
    max_connections: int
    """Client connections on one member."""
    max_inflight: int
    """Requests in flight (sent, not yet answered) on one connection."""


LimitsFor = Callable[[str], IdentityLimits]
"""The limits of an identity ("" is the anonymous one: no identity proved)."""


def default_limits(
    *,
    cluster_max_leases: int,
    cluster_max_locks: int,
    member_max_connections: int,
    max_leases: int = 0,
    max_locks: int = 0,
    max_connections: int = 0,
    max_inflight: int = 0,
    anonymous: bool = False,
) -> IdentityLimits:
    """Each identity's limits when an admin set none: the values given (0: unset), else
    half the cluster's caps on leases and locks, and 3/4 of the member's connections,
    so that a runaway identity leaves room for the others.

    ``anonymous``: the limits of the built-in admin and of "" (every client of a cluster
    without identities is one of them): the cluster's and the member's own caps, whatever
    the per-identity values, so a cluster without identities keeps the capacity it had
    and the operator is never locked out by a limit meant for client identities."""
    if anonymous:
        return IdentityLimits(
            max_leases=cluster_max_leases,
            max_locks=cluster_max_locks,
            max_connections=member_max_connections,
            max_inflight=max_inflight or DEFAULT_MAX_INFLIGHT,
        )
    return IdentityLimits(
        max_leases=max_leases or max(1, cluster_max_leases // 2),
        max_locks=max_locks or max(1, cluster_max_locks // 2),
        max_connections=max_connections
        or max(1, member_max_connections - member_max_connections // CONNECTION_SHARE),
        max_inflight=max_inflight or DEFAULT_MAX_INFLIGHT,
    )


def with_settings(base: IdentityLimits, settings: tuple[int, ...]) -> IdentityLimits:
    """``base`` with an admin's settings laid over it (per identities.QUOTA_KINDS: leases,
    locks, connections, in flight; 0 keeps the base's)."""
    if not any(settings):
        return base
    leases, locks, connections, inflight = settings
    return IdentityLimits(
        max_leases=leases or base.max_leases,
        max_locks=locks or base.max_locks,
        max_connections=connections or base.max_connections,
        max_inflight=inflight or base.max_inflight,
    )


def who(identity: str) -> str:
    """An identity as a message names it."""
    return f"identity {identity!r}" if identity else "the anonymous identity (no identity proved)"


QUOTAS = {
    "leases": ("leases", "--identity-max-leases"),
    "locks": ("held locks and places in queues", "--identity-max-locks"),
    "connections": ("connections to this member", "--identity-max-connections"),
    "inflight": ("requests in flight on this connection", "--identity-max-inflight"),
}
"""Each per-identity quota: what it counts (for the message) and the node flag that sets
its default."""


def over_quota(identity: str, kind: str, limit: int) -> str:
    """The sentence for QUOTA_EXCEEDED: whose limit, which, and what to do."""
    what, flag = QUOTAS[kind]
    return (
        f"{who(identity)} has {limit} {what}, its own limit (an admin's `dlm auth set "
        f"--max-{kind}`, else the members' {flag}): end some, or have an admin raise it"
    )


def limit_name(kind: str) -> str:
    """The ``limit`` field of the QUOTA_EXCEEDED error (``identity_max_leases``...)."""
    return f"identity_max_{kind}"


def connection_refusal(identity: str, held: int, limits: IdentityLimits) -> str | None:
    """Why one more client connection of ``identity`` is refused on a member where it
    holds ``held`` already, or None."""
    if held < limits.max_connections:
        return None
    return over_quota(identity, "connections", limits.max_connections)
