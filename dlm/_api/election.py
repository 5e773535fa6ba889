"""What ``client.election(name)`` shares between the blocking and the async API:
``dlm.Leader`` (who leads) and the pure rules of a campaign; no IO. The election
classes themselves are sync.py's (``Election``, ``Leadership``) and aio.py's
(``AsyncElection``, ``AsyncLeadership``).

Private (import the names from ``dlm``). An election NAME is the lock key NAME, as for
`dlm elect`: a candidate campaigns by queueing for the key (FIFO), the holder leads,
its grant's token is the leadership epoch and the grant's metadata entry "value" is
what it proclaims. So a campaign is a ``dlm.Lock`` acquire with the value in its
metadata, and a ``Leadership`` *is* a ``dlm.Lock``: renewal, ``deadline``,
``check()``, ``lost``, ``on_lost`` and fork safety are the lock's. Election is not
fencing: pass ``token`` to what the leader writes to (README, "Elections").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dlm._api import options as _options
from dlm._api.options import Duration
from dlm.client.errors import NotHolder, ServerError

if TYPE_CHECKING:
    from dlm.client.watching import Leadership as _Watched
    from dlm.views import LockState

ELECTION_VALUE = "value"
"""The grant's metadata entry that holds the leader's value (as `dlm elect --value`)."""
CAMPAIGN_WAIT_S = 7 * 24 * 3600.0
"""How long ``campaign(wait=None)`` stays in the queue: the longest wait there is."""


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads an election: ``value`` (what it proclaimed), ``token`` (the leadership
    epoch: the fencing token of its grant, higher for every new leader), ``since`` (when
    the cluster elected it, UTC; a proclaim does not move it), ``lease`` (its lease id)
    and ``index`` (the log index this was read or pushed at)."""

    name: str
    value: str
    token: int
    since: datetime | None
    lease: str
    index: int


def _utc(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def leader_from_state(name: str, state: LockState) -> Leader | None:
    """The leader a read of the key shows (None while nobody leads)."""
    if not state.holders:
        return None
    holder = state.holders[0]
    if holder.lease is None or holder.token is None:
        # Only a stale read leaves them out; leader() reads through the Raft leader.
        raise ServerError(
            "BAD_REPLY", "the cluster's answer names a holder without its lease or token"
        )
    return Leader(
        name,
        holder.meta.get(ELECTION_VALUE, ""),
        holder.token,
        _utc(holder.granted_at_ms),
        holder.lease,
        holder.token,
    )


def leader_from_watch(seen: _Watched) -> Leader | None:
    """The leader a change of the watched key says (None while nobody leads)."""
    if seen.lease is None or seen.token is None:
        return None
    return Leader(
        seen.name, seen.value or "", seen.token, _utc(seen.since_ms), seen.lease, seen.index
    )


def campaign_meta(value: str) -> dict[str, str]:
    """The metadata a campaign records with its grant; ValueError if ``value`` is bad."""
    if not isinstance(value, str):
        raise TypeError("an election's value is a str")
    return {ELECTION_VALUE: value}


def campaign_wait(wait: Duration | None) -> float:
    """``wait`` in seconds; None waits as long as it takes (a week)."""
    if wait is None:
        return CAMPAIGN_WAIT_S
    return _options.seconds(wait, "wait", allow_zero=False)


def not_leading(name: str) -> NotHolder:
    return NotHolder(
        f"this candidate does not lead {name!r}: only the leader may proclaim "
        "(campaign first, or it lost its lease)"
    )
