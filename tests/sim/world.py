"""Simulated time for whole-node simulations: one event queue, and a clock per process.

Real time is an integer number of microseconds, so two runs with the same
seed order every event identically. ``World.at(t, fn)`` runs ``fn`` at real
time ``t``; events at the same time run in the order they were scheduled.

Each simulated process reads its own ``Clock``, which runs at a rate within
``DRIFT`` of real time (the bound the system must tolerate: ±0.5%) from an
offset of its own, and converts back and forth between its readings and real
time. A process never sees real time, only its clock.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

from dlm.node.machine import Instant

DRIFT = 0.005
"""Each process's clock runs at a rate in [1 - DRIFT, 1 + DRIFT] of real time."""
US = 1_000_000


class Clock:
    """One process's clocks: monotonic seconds and wall milliseconds, both drifting."""

    __slots__ = ("_mono_offset", "_wall_offset_ms", "rate")

    def __init__(self, rng: random.Random) -> None:
        self.rate = 1.0 + rng.uniform(-DRIFT, DRIFT)
        self._mono_offset = rng.uniform(100.0, 10_000.0)
        self._wall_offset_ms = 1_800_000_000_000 + rng.randrange(10**9)

    def mono(self, t_us: int) -> float:
        return self._mono_offset + self.rate * t_us / US

    def instant(self, t_us: int) -> Instant:
        mono = self.mono(t_us)
        return Instant(mono, self._wall_offset_ms + int(self.rate * t_us / 1000))

    def real_us(self, mono: float) -> int:
        """The real time at which this clock reads ``mono`` (rounded up: never early)."""
        return -int(-(mono - self._mono_offset) * US // self.rate)


class World:
    """The event queue of one simulation."""

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self.events = 0

    def at(self, t_us: int, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t_us, self.now), self._seq, fn))

    def after(self, delay_us: int, fn: Callable[[], None]) -> None:
        self.at(self.now + delay_us, fn)

    def run_until(self, t_us: int, after_each: Callable[[], None] | None = None) -> None:
        heap = self._heap
        while heap and heap[0][0] <= t_us:
            when, _, fn = heapq.heappop(heap)
            self.now = when
            self.events += 1
            fn()
            if after_each is not None:
                after_each()
        self.now = max(self.now, t_us)
