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
timeout) is replaced, unless the sender's next retransmission is due sooner than a
new connection could retry (``worth_replacing``, by default Linux's initial SYN
timeout of 1 s). An idle connection is never suspect; a busy one that keeps getting
acknowledgements never is either, however slow.

Why the retransmission timer counts: on a link that loses packets at random (half of
them, measured in tests/chaos/netns.py) a segment often waits two or three
retransmissions, 0.2 + 0.4 + 0.8 s, and a connection replaced after 0.3 s of silence
starts again with a handshake whose own lost SYN waits 1 s: the members replaced
their links faster than they could use them, and 14 of 61 writes succeeded (35 of 71
since). A cut
that heals is the other case: TCP has backed off to seconds (52 s after a minute's
cut), far beyond what a new connection costs, and the connection is replaced.
"""

from __future__ import annotations

FRESH_CONNECTION_S = 1.0
"""How long a new connection waits before it resends a lost SYN (Linux's TCP_TIMEOUT_INIT,
RFC 6298's initial retransmission timeout): a connection whose own retransmission
comes sooner is the better bet."""


class LinkWatch:
    """Watches one outbound connection; a new connection starts a new watch (``connected``)."""

    __slots__ = (
        "_acknowledged",
        "_retransmit_after",
        "_waiting_since",
        "stall_after",
        "worth_replacing",
    )

    def __init__(self, stall_after: float, worth_replacing: float = FRESH_CONNECTION_S) -> None:
        if stall_after <= 0 or worth_replacing <= 0:
            raise ValueError("stall_after and worth_replacing must be positive")
        self.stall_after = stall_after
        self.worth_replacing = worth_replacing
        self._acknowledged = 0
        self._waiting_since: float | None = None
        self._retransmit_after: float | None = None

    def connected(self) -> None:
        """A new connection: nothing of it awaits acknowledgement yet."""
        self._acknowledged = 0
        self._waiting_since = None
        self._retransmit_after = None

    def observe(
        self,
        now: float,
        *,
        outstanding: bool,
        acknowledged: int,
        retransmit_after: float | None = None,
    ) -> bool:
        """One look at the connection; True when it must be replaced.

        ``outstanding``: something written to it is not acknowledged yet.
        ``acknowledged``: how much (bytes, messages: any unit that only grows) the
        peer has acknowledged on this connection in all. ``retransmit_after``: the
        sender's retransmission timeout now, in seconds (TCP's RTO, which doubles at
        each unanswered retransmission); None where it is not known, and then the
        silence alone decides. ``now`` in seconds on any clock that does not go back.
        """
        self._retransmit_after = retransmit_after
        if acknowledged != self._acknowledged:
            self._acknowledged = acknowledged
            self._waiting_since = now if outstanding else None
        elif not outstanding:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = now
        return self.stalled(now)

    def stalled(self, now: float) -> bool:
        """Has something waited for an acknowledgement, with none coming, for
        ``stall_after``, with the sender's next retransmission no sooner than a new
        connection's would be?"""
        since = self._waiting_since
        if since is None or now - since < self.stall_after:
            return False
        rto = self._retransmit_after
        return rto is None or rto >= self.worth_replacing

    @property
    def waiting_since(self) -> float | None:
        """Since when the connection has had something unacknowledged and no progress."""
        return self._waiting_since
