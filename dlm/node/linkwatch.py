"""When an outbound peer connection that has stopped delivering must be replaced.

A member sends to each peer on a connection of its own and hears back on the
peer's (peers.py), so no reply ever tells it that *its* connection still
delivers. A TCP connection that lost packets for a while (a cut cable, a
partition that healed) can sit in retransmission back-off for tens of seconds
after the network is whole again, while a fresh connection would work at once.
This room holds the decision, and only the decision: the runtime (peers.py,
from the kernel's own acknowledgement counters) and the simulator (from its
deliveries) feed it what they see, and replace the connection when it says so.

The rule: a connection on which something has waited for acknowledgement,
with no acknowledgement at all, for ``stall_after`` seconds (about an election
timeout) is replaced. An idle connection is never suspect; a busy one that
keeps getting acknowledgements never is either, however slow.
"""

from __future__ import annotations


class LinkWatch:
    """Watches one outbound connection; a new connection starts a new watch (``connected``)."""

    __slots__ = ("_acknowledged", "_waiting_since", "stall_after")

    def __init__(self, stall_after: float) -> None:
        if stall_after <= 0:
            raise ValueError("stall_after must be positive")
        self.stall_after = stall_after
        self._acknowledged = 0
        self._waiting_since: float | None = None

    def connected(self) -> None:
        """A new connection: nothing of it awaits acknowledgement yet."""
        self._acknowledged = 0
        self._waiting_since = None

    def observe(self, now: float, *, outstanding: bool, acknowledged: int) -> bool:
        """One look at the connection; True when it must be replaced.

        ``outstanding``: something written to it is not acknowledged yet.
        ``acknowledged``: how much (bytes, messages: any unit that only grows) the
        peer has acknowledged on this connection in all. ``now`` in seconds on any
        clock that does not go back.
        """
        if acknowledged != self._acknowledged:
            self._acknowledged = acknowledged
            self._waiting_since = now if outstanding else None
        elif not outstanding:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = now
        return self.stalled(now)

    def stalled(self, now: float) -> bool:
        """Has something waited for an acknowledgement, with none coming, for ``stall_after``?"""
        since = self._waiting_since
        return since is not None and now - since >= self.stall_after

    @property
    def waiting_since(self) -> float | None:
        """Since when the connection has had something unacknowledged and no progress."""
        return self._waiting_since
