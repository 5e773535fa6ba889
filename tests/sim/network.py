"""The simulator's in-memory network: a seeded, lossy, reordering message queue.

Messages wait in a heap ordered by (delivery tick, send sequence), so two
runs with the same seed deliver the same messages in the same order. Random
delays reorder messages; drops, duplicates and per-direction cuts model the
faults the fault scheduler switches on and off. A cut is a counter per
directed link so overlapping partitions compose and heal independently.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dlm.node.raft.types import Message
from dlm.records import NodeId

MessageFilter = Callable[[Message], "Message | None"]
"""A scripted test's hook: return the message (possibly rewritten) or None to drop it."""


@dataclass
class LinkConditions:
    drop: float = 0.01
    duplicate: float = 0.01
    min_delay: int = 1
    max_delay: int = 3


class SimNetwork:
    def __init__(self, rng: random.Random, base: LinkConditions) -> None:
        self._rng = rng
        self.base = base
        self.extra_drop = 0.0
        self.extra_duplicate = 0.0
        self.extra_delay = 0
        self._heap: list[tuple[int, int, Message]] = []
        self._seq = 0
        self._cuts: Counter[tuple[NodeId, NodeId]] = Counter()
        self.filter: MessageFilter | None = None
        self.stats: Counter[str] = Counter()

    # -- faults -------------------------------------------------------------

    def cut(self, links: Iterable[tuple[NodeId, NodeId]]) -> None:
        for link in links:
            self._cuts[link] += 1

    def mend(self, links: Iterable[tuple[NodeId, NodeId]]) -> None:
        for link in links:
            self._cuts[link] -= 1
            if self._cuts[link] <= 0:
                del self._cuts[link]

    def mend_all(self) -> None:
        self._cuts.clear()

    def is_cut(self, src: NodeId, dst: NodeId) -> bool:
        return (src, dst) in self._cuts

    def calm(self) -> None:
        """End every degradation, leaving the base link conditions."""
        self.extra_drop = 0.0
        self.extra_duplicate = 0.0
        self.extra_delay = 0

    # -- traffic ------------------------------------------------------------

    def send(self, message: Message, now: int) -> None:
        self.stats["sent"] += 1
        rng = self._rng
        if rng.random() < self.base.drop + self.extra_drop:
            self.stats["dropped"] += 1
            return
        copies = 1
        if rng.random() < self.base.duplicate + self.extra_duplicate:
            copies = 2
            self.stats["duplicated"] += 1
        low = self.base.min_delay
        spread = self.base.max_delay + self.extra_delay - low + 1
        for _ in range(copies):
            # random() rather than randint(): this runs for every message of every seed.
            self._push(now + low + int(rng.random() * spread), message)

    def resend(self, message: Message, at: int) -> None:
        """Put back a message held for a paused node, to arrive at tick ``at``."""
        self._push(at, message)

    def _push(self, at: int, message: Message) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, message))

    def due(self, now: int) -> list[Message]:
        """Pop every message due by ``now`` that survives the cuts and the filter."""
        out: list[Message] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            message = heapq.heappop(heap)[2]
            if (message.src, message.dst) in self._cuts:
                self.stats["cut"] += 1
                continue
            if self.filter is not None:
                kept = self.filter(message)
                if kept is None:
                    self.stats["filtered"] += 1
                    continue
                message = kept
            out.append(message)
        return out

    def in_flight(self) -> int:
        return len(self._heap)
