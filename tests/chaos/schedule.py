"""Fault schedules: which faults a chaos run injects and when, as a pure function of a seed.

A schedule is the cluster's size (3 or 5 members), the faults in order (each
with the earliest time it starts, counted from the start of the workload, how
long it lasts, and its own seed for the choices made when it starts: which
follower, which split), and when the workload stops. Faults run one after the
other with a gap between them in which the cluster may recover; what a fault
targets that depends on the moment (the leader, the client inside a critical
section) is resolved by the runner when the fault starts.

Replaying a seed replays this schedule exactly; the processes' own timing (who
wins an election, where a pause lands) differs from run to run.

Kinds (see runner.py for what each does): the members (``kill-leader``,
``kill-follower``, ``pause-member`` past the lease TTL, ``restart``, ``slow-disk``),
the network between members (``partition``, ``one-way``, ``delay``), membership
(``replace-member``, ``replace-leader``: a member joins, then one is removed),
and the clients (``pause-client`` past its TTL: the GC-pause zombie;
``pause-exec``: the `dlm exec` supervisor stopped past its TTL; ``freeze-exec``:
its whole process tree stopped, a frozen host; ``kill-exec``; ``kill-client``;
``client-partition``: a client cut off from the cluster, both ways or one, or
its link slowed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

MEMBER_KINDS = ("kill-leader", "kill-follower", "pause-member", "restart", "slow-disk")
NETWORK_KINDS = ("partition", "one-way", "delay")
MEMBERSHIP_KINDS = ("replace-member", "replace-leader")
CLIENT_KINDS = (
    "pause-client", "pause-exec", "freeze-exec", "kill-exec", "kill-client", "client-partition",
)  # fmt: skip
KINDS = MEMBER_KINDS + NETWORK_KINDS + MEMBERSHIP_KINDS + CLIENT_KINDS

SHORT_ORDER = (
    "kill-leader", "pause-client", "partition", "freeze-exec",
    "slow-disk", "client-partition", "replace-leader", "pause-exec",
    "one-way", "pause-member", "kill-client", "delay",
    "kill-follower", "kill-exec", "restart", "replace-member",
)  # fmt: skip
"""Short schedules take their faults in this order, so that consecutive seeds cover every
kind: seeds 0, 1, 2 (what `make test` runs) inject the first twelve."""

WARMUP_S = 1.5
TAIL_S = 1.5


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    duration: float
    seed: int
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kind} at +{self.at:.1f}s for {self.duration:.1f}s" + (
            f" ({extra})" if extra else ""
        )


@dataclass(frozen=True)
class Schedule:
    seed: int
    profile: str
    size: int
    faults: tuple[Fault, ...]
    length: float
    """When the workload stops (seconds after it started), at the earliest."""

    def replay_hint(self) -> str:
        return f"make chaos CHAOS_SEEDS={self.seed}:1 CHAOS_PROFILE={self.profile}"


def _params(kind: str, rng: random.Random, ttl_s: float) -> tuple[float, dict[str, Any]]:
    """(duration, parameters) of one fault."""
    past_ttl = round(ttl_s + rng.uniform(0.8, 2.0), 2)
    if kind in ("kill-leader", "kill-follower"):
        return round(rng.uniform(1.0, 3.5), 2), {}
    if kind == "pause-member":
        return past_ttl, {"leader": rng.random() < 0.5}
    if kind == "restart":
        return 0.5, {"leader": rng.random() < 0.5}
    if kind == "slow-disk":
        return round(rng.uniform(3.0, 5.0), 2), {
            "fsync_ms": rng.choice((50, 100, 200)),
            "leader": rng.random() < 0.5,
        }
    if kind == "partition":
        return round(rng.uniform(2.0, 4.0), 2), {
            "split": rng.choice(("isolate-leader", "minority", "majority-without-leader"))
        }
    if kind == "one-way":
        return round(rng.uniform(2.0, 4.0), 2), {
            "way": rng.choice(("leader-mute", "leader-deaf", "follower-mute"))
        }
    if kind == "delay":
        return round(rng.uniform(2.5, 4.5), 2), {
            "seconds": rng.choice((0.05, 0.1, 0.2, 0.3)),
            "leader": rng.random() < 0.5,
        }
    if kind in MEMBERSHIP_KINDS:
        return 0.0, {}
    if kind in ("pause-client", "pause-exec", "freeze-exec"):
        return past_ttl, {}
    if kind in ("kill-exec", "kill-client"):
        return 0.0, {}
    if kind == "client-partition":
        return round(rng.uniform(2.5, 4.0), 2), {
            "client": rng.choice(("library", "exec")),
            "dirs": rng.choice((("up", "down"), ("up", "down"), ("up",), ("down",))),
            # Most often dropped; sometimes only slowed, by a good part of the TTL.
            "delay": rng.choice((0.0, 0.0, 0.0, 0.4, 0.8)),
        }
    raise ValueError(f"unknown fault kind {kind!r}")


def make_schedule(seed: int, profile: str = "long", ttl_s: float = 2.0) -> Schedule:
    """The schedule of ``seed``: ``short`` (3 faults, for `make test`) or ``long`` (8)."""
    if profile not in ("short", "long"):
        raise ValueError(f"profile must be short or long, not {profile!r}")
    rng = random.Random(f"dlm-chaos-{seed}")
    size = 5 if seed % 3 == 2 else 3
    if profile == "short":
        kinds = [SHORT_ORDER[(seed * 4 + i) % len(SHORT_ORDER)] for i in range(4)]
    else:
        kinds = []
        membership = 0
        while len(kinds) < 8:
            kind = rng.choice(KINDS)
            if kind in MEMBERSHIP_KINDS:
                if membership >= 2:
                    continue
                membership += 1
            kinds.append(kind)
    faults = []
    at = WARMUP_S
    for kind in kinds:
        duration, params = _params(kind, rng, ttl_s)
        faults.append(Fault(kind, round(at, 2), duration, rng.randrange(1 << 30), params))
        at += duration + rng.uniform(1.5, 2.5)
    return Schedule(seed, profile, size, tuple(faults), round(at + TAIL_S, 2))
