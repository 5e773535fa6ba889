"""Fault schedules: which fault starts when and for how long, drawn from a seed.

A schedule is plain data, drawn before the run starts, so a seed names the
whole plan. Who a fault hits (which node crashes, which follower lags) is
decided when it starts, from the simulation's own seeded generator, because
"the current leader" only exists at run time.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

FAULT_KINDS: tuple[str, ...] = (
    "partition",  # two sides, both directions cut
    "one_way",  # some links cut in one direction only
    "isolate_leader",  # the sitting leader loses every link
    "crash",  # a node loses its process and its unsynced bytes, restarts at the end
    "crash_leader",
    "pause",  # a node stops ticking and receiving (a GC pause, SIGSTOP)
    "lossy",  # extra message loss everywhere
    "duplicate",  # extra duplication everywhere
    "reorder",  # longer, more spread delays everywhere
    "lag_follower",  # one follower cut off long enough to fall behind the compacted log
    "fsync_stall",  # one member's disk (the leader's or a follower's) completes nothing for a while
)

DEFAULT_WEIGHTS: Mapping[str, int] = {
    "partition": 3,
    "one_way": 2,
    "isolate_leader": 3,
    "crash": 3,
    "crash_leader": 3,
    "pause": 2,
    "lossy": 1,
    "duplicate": 1,
    "reorder": 1,
    "lag_follower": 1,
    "fsync_stall": 2,
}

_DURATIONS: Mapping[str, tuple[int, int]] = {
    "partition": (30, 200),
    "one_way": (30, 200),
    "isolate_leader": (30, 150),
    "crash": (5, 200),
    "crash_leader": (5, 150),
    "pause": (10, 120),
    "lossy": (50, 300),
    "duplicate": (50, 300),
    "reorder": (50, 300),
    "lag_follower": (250, 600),
    # Longer than an election timeout (10 to 20 ticks in the simulator): the stall must
    # not cost the leader its office nor make a follower campaign.
    "fsync_stall": (25, 120),
}


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: str
    start: int
    end: int


def draw_schedule(
    rng: random.Random,
    *,
    first_tick: int,
    heal_tick: int,
    count: tuple[int, int] = (12, 18),
    weights: Mapping[str, int] = DEFAULT_WEIGHTS,
    lagging_follower: bool = True,
) -> list[FaultSpec]:
    """Draw between ``count[0]`` and ``count[1]`` faults, all over by ``heal_tick``.

    ``lagging_follower`` guarantees one long follower cut-off early in the run,
    so snapshots and InstallSnapshot are exercised on most seeds.
    """
    kinds = [k for k in FAULT_KINDS if weights.get(k, 0) > 0]
    kind_weights = [weights[k] for k in kinds]
    specs: list[FaultSpec] = []
    if lagging_follower:
        low, high = _DURATIONS["lag_follower"]
        start = rng.randint(first_tick, max(first_tick, heal_tick // 3))
        specs.append(
            FaultSpec("lag_follower", start, min(heal_tick, start + rng.randint(low, high)))
        )
    total = rng.randint(*count)
    while len(specs) < total:
        kind = rng.choices(kinds, kind_weights)[0]
        low, high = _DURATIONS[kind]
        start = rng.randint(first_tick, heal_tick - 1)
        specs.append(FaultSpec(kind, start, min(heal_tick, start + rng.randint(low, high))))
    specs.sort(key=lambda s: (s.start, s.kind))
    return specs


def fault_mix(specs: list[FaultSpec]) -> Counter[str]:
    return Counter(s.kind for s in specs)
