"""The leader's lease deadlines: when each live lease ends unless renewed.

Theory of operation
-------------------
Only the leader decides that time has passed (ARCHITECTURE.md, invariant 3).
It keeps one deadline per live lease on its monotonic clock and, when a
deadline passes, proposes an ``Expire`` entry; the lease ends for everyone
when that entry is applied. Followers keep nothing here.

Nothing in this module reads a clock: every call takes ``now`` (monotonic
seconds) from the runtime, and ``next_timer()`` says when the runtime should
call ``due()`` again, in the manner of aioquic's timers. Tests drive it with
made-up times.

* ``take_office(now, leases)``: this node became leader; every live lease gets
  a fresh full TTL from ``now``, so a failover never shortens a lease.
* ``arm(lease, ttl_ms, incarnation, now)``: an entry that (re)starts a lease's
  clock was applied while leading: an open, a join or a TTL update.
* ``renew(lease, received_at)``: a keep-alive, confirmed by a ReadIndex round,
  moves the deadline to ``received_at + ttl`` (never backwards).
* ``ended(lease)``: the lease ended (closed, expired, released idle).
* ``due(now)``: (lease, incarnation) pairs whose deadline passed and need an
  Expire proposal. A lease is reported once, then again only if it is still
  tracked ``expire_retry`` seconds later (the first proposal was lost, say, in
  a leadership blip). Once reported, a lease is doomed: ``renew`` and ``arm``
  refuse it, and the node refuses to let a client join it, update its TTL or
  acquire with it (machine.py, proposals.py).
* ``leave_office()``: this node stopped leading; forget everything.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Tracked:
    ttl: float
    incarnation: int
    deadline: float
    wake_at: float
    """When ``due`` must look at this lease: its deadline, or the next Expire retry."""
    expiring: bool = False
    renewers: dict[str, int] = field(default_factory=dict)
    """The highest keep-alive seq seen from each client of this lease."""


class LeaseTracker:
    """Deadlines of the live leases while this node leads; empty otherwise."""

    def __init__(self, *, expire_retry: float = 1.0) -> None:
        self._expire_retry = expire_retry
        self._leading = False
        self._leases: dict[str, _Tracked] = {}
        # Entries go stale when a lease is renewed or ended; they are skipped on pop.
        self._heap: list[tuple[float, str]] = []

    @property
    def leading(self) -> bool:
        return self._leading

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, lease: object) -> bool:
        return lease in self._leases

    def take_office(self, now: float, leases: Iterable[tuple[str, int, int]]) -> None:
        """``leases``: (lease id, ttl_ms, incarnation) of every live lease."""
        self._leading = True
        self._leases.clear()
        self._heap.clear()
        for lease, ttl_ms, incarnation in leases:
            self._arm(lease, ttl_ms / 1000.0, incarnation, now)

    def leave_office(self) -> None:
        self._leading = False
        self._leases.clear()
        self._heap.clear()

    def arm(self, lease: str, ttl_ms: int, incarnation: int, now: float) -> None:
        if not self._leading:
            return
        tracked = self._leases.get(lease)
        if tracked is not None and tracked.expiring and tracked.incarnation == incarnation:
            # An Expire of this incarnation is on its way through the log: the lease
            # is doomed, and a new clock would only hide that.
            return
        self._arm(lease, ttl_ms / 1000.0, incarnation, now)

    def ended(self, lease: str) -> None:
        self._leases.pop(lease, None)

    def renew(self, lease: str, received_at: float, client: str = "", seq: int = 0) -> bool:
        """Extends a live lease; False if it is unknown here or already being expired.

        A keep-alive that names its ``client`` and ``seq`` extends the lease at most
        once: a copy of an older keep-alive of that client (seq not above the last one
        seen) is acknowledged without moving the deadline.
        """
        tracked = self._leases.get(lease)
        if not self._leading or tracked is None or tracked.expiring:
            return False
        if client:
            if seq <= tracked.renewers.get(client, -1):
                return True
            tracked.renewers[client] = seq
        deadline = received_at + tracked.ttl
        if deadline > tracked.deadline:
            tracked.deadline = deadline
            tracked.wake_at = deadline
            self._push(deadline, lease)
        return True

    def is_expiring(self, lease: str) -> bool:
        tracked = self._leases.get(lease)
        return tracked is not None and tracked.expiring

    def remaining_ms(self, lease: str, now: float) -> int | None:
        tracked = self._leases.get(lease)
        if tracked is None:
            return None
        return max(0, int((tracked.deadline - now) * 1000))

    def due(self, now: float) -> list[tuple[str, int]]:
        """(lease, incarnation) to propose an Expire for now (each marked so it is not
        reported again soon)."""
        out: list[tuple[str, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            wake_at, lease = heapq.heappop(heap)
            tracked = self._leases.get(lease)
            if tracked is None or tracked.wake_at != wake_at:
                continue
            tracked.expiring = True
            tracked.wake_at = now + self._expire_retry
            self._push(tracked.wake_at, lease)
            out.append((lease, tracked.incarnation))
        return out

    def next_timer(self) -> float | None:
        """The earliest time ``due`` may have something to report (None: nothing tracked)."""
        heap = self._heap
        while heap:
            wake_at, lease = heap[0]
            tracked = self._leases.get(lease)
            if tracked is not None and tracked.wake_at == wake_at:
                return wake_at
            heapq.heappop(heap)
        return None

    def _arm(self, lease: str, ttl: float, incarnation: int, now: float) -> None:
        deadline = now + ttl
        tracked = _Tracked(ttl=ttl, incarnation=incarnation, deadline=deadline, wake_at=deadline)
        previous = self._leases.get(lease)
        if previous is not None and previous.incarnation == incarnation:
            # A re-armed lease (joined, updated) still knows which keep-alives it took.
            tracked.renewers = previous.renewers
        self._leases[lease] = tracked
        self._push(deadline, lease)

    def _push(self, when: float, lease: str) -> None:
        heapq.heappush(self._heap, (when, lease))
        # Frequent renewals leave stale entries behind; rebuild before they pile up.
        if len(self._heap) > 4 * len(self._leases) + 64:
            self._heap = [(t.wake_at, name) for name, t in self._leases.items()]
            heapq.heapify(self._heap)
