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
* ``opened(lease, ttl_ms, now)``: an OpenLease was applied while leading.
* ``renew(lease, received_at)``: a keep-alive, confirmed by a ReadIndex round,
  moves the deadline to ``received_at + ttl`` (never backwards).
* ``ended(lease)``: a CloseLease or Expire was applied.
* ``due(now)``: leases whose deadline passed and need an Expire proposal. A
  lease is reported once, then again only if it is still tracked
  ``expire_retry`` seconds later (the first proposal was lost, say, in a
  leadership blip). Once reported, a lease is doomed: ``renew`` refuses it.
* ``leave_office()``: this node stopped leading; forget everything.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class _Tracked:
    ttl: float
    deadline: float
    wake_at: float
    """When ``due`` must look at this lease: its deadline, or the next Expire retry."""
    expiring: bool = False


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

    def take_office(self, now: float, leases: Iterable[tuple[str, int]]) -> None:
        self._leading = True
        self._leases.clear()
        self._heap.clear()
        for lease, ttl_ms in leases:
            self._arm(lease, ttl_ms / 1000.0, now)

    def leave_office(self) -> None:
        self._leading = False
        self._leases.clear()
        self._heap.clear()

    def opened(self, lease: str, ttl_ms: int, now: float) -> None:
        if not self._leading:
            return
        tracked = self._leases.get(lease)
        if tracked is not None and tracked.expiring:
            # An Expire is already on its way through the log; re-opening after
            # it applies creates a new lease and arrives here again then.
            return
        self._arm(lease, ttl_ms / 1000.0, now)

    def ended(self, lease: str) -> None:
        self._leases.pop(lease, None)

    def renew(self, lease: str, received_at: float) -> bool:
        """Extends a live lease; False if it is unknown here or already being expired."""
        tracked = self._leases.get(lease)
        if not self._leading or tracked is None or tracked.expiring:
            return False
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

    def due(self, now: float) -> list[str]:
        """Leases to propose an Expire for now (each marked so it is not reported again soon)."""
        out: list[str] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            wake_at, lease = heapq.heappop(heap)
            tracked = self._leases.get(lease)
            if tracked is None or tracked.wake_at != wake_at:
                continue
            tracked.expiring = True
            tracked.wake_at = now + self._expire_retry
            self._push(tracked.wake_at, lease)
            out.append(lease)
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

    def _arm(self, lease: str, ttl: float, now: float) -> None:
        deadline = now + ttl
        self._leases[lease] = _Tracked(ttl=ttl, deadline=deadline, wake_at=deadline)
        self._push(deadline, lease)

    def _push(self, when: float, lease: str) -> None:
        heapq.heappush(self._heap, (when, lease))
        # Frequent renewals leave stale entries behind; rebuild before they pile up.
        if len(self._heap) > 4 * len(self._leases) + 64:
            self._heap = [(t.wake_at, name) for name, t in self._leases.items()]
            heapq.heapify(self._heap)
