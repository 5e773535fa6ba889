"""What a member counts about itself: the fixed-bucket Histogram, and the counters the node
machine keeps as it decides (driven here as a one-member cluster on MemoryStorage, with a
clock moved by hand and every Persist completed at once)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dlm.node.machine import (
    Instant,
    LogEvent,
    MachineConfig,
    NodeMachine,
    Persist,
    SaveSnapshot,
    SendFrame,
    Timing,
)
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import Role
from dlm.node.stats import Histogram
from dlm.records import ConfState

# ---------------------------------------------------------------------------
# Histogram
# ---------------------------------------------------------------------------


def test_histogram_buckets_are_inclusive_upper_bounds_and_cumulative() -> None:
    histogram = Histogram((0.1, 1.0, 10.0))
    for value in (0.05, 0.1, 0.5, 1.0, 3.0, 10.0, 11.0, 1e9):
        histogram.observe(value)
    assert histogram.cumulative() == [("0.1", 2), ("1.0", 4), ("10.0", 6), ("+Inf", 8)]
    assert histogram.count == 8
    assert histogram.sum == pytest.approx(0.05 + 0.1 + 0.5 + 1.0 + 3.0 + 10.0 + 11.0 + 1e9)


def test_an_empty_histogram_has_every_bucket_at_zero() -> None:
    histogram = Histogram((1, 2, 4))
    assert histogram.cumulative() == [("1", 0), ("2", 0), ("4", 0), ("+Inf", 0)]
    assert (histogram.count, histogram.sum) == (0, 0.0)


def test_histogram_memory_does_not_grow_with_observations() -> None:
    histogram = Histogram((0.5, 1.0))
    rng = random.Random(7)
    for _ in range(10_000):
        histogram.observe(rng.uniform(0.0, 2.0))
    assert len(histogram.counts) == 3
    assert histogram.cumulative()[-1] == ("+Inf", 10_000)


# ---------------------------------------------------------------------------
# The machine's counters
# ---------------------------------------------------------------------------

TIMING = Timing()
CONN = 1


class OneMember:
    """A one-member cluster: a NodeMachine whose disk is instant and whose clock is ours."""

    def __init__(self) -> None:
        self.storage = MemoryStorage(ConfState(voters=("n1",)))
        self.mono = 1000.0
        self.frames: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.machine = NodeMachine(
            MachineConfig("n1", "test", {"n1": "127.0.0.1:7700"}, timing=TIMING),
            self.storage,
            random.Random(1),
            self.now(),
        )
        self.machine.client_connected(CONN, "127.0.0.1:50000")
        self.run()
        for _ in range(200):
            if self.machine.role is Role.LEADER and self.machine.locks.version >= 2:
                break
            self.advance(TIMING.tick_s)
        assert self.machine.role is Role.LEADER and self.machine.locks.version >= 2
        self.seq = 0
        self.rid = 0

    def now(self) -> Instant:
        return Instant(self.mono, int(self.mono * 1000))

    def advance(self, seconds: float) -> None:
        """Moves the clock, one tick at a time (as the runtime's timer does)."""
        end = self.mono + seconds
        while self.mono < end:
            self.mono = min(end, max(self.mono, self.machine.next_timer()))
            self.machine.timer(self.now())
            self.run()

    def run(self) -> None:
        while actions := self.machine.take_actions():
            for action in actions:
                if isinstance(action, Persist):
                    if action.snapshot is not None:
                        self.storage.apply_snapshot(action.snapshot)
                    if action.entries:
                        self.storage.append(action.entries)
                    if action.hard_state is not None:
                        self.storage.set_hard_state(action.hard_state)
                    self.machine.persisted(action.job, self.now())
                elif isinstance(action, SaveSnapshot):
                    self.storage.create_snapshot(action.index, action.conf, action.data)
                elif isinstance(action, SendFrame):
                    self.frames.append(action.frame)
                elif isinstance(action, LogEvent):
                    self.events.append((action.event, action.fields))

    def send(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Sends ``frame`` as is and returns the reply with its id."""
        self.machine.client_frame(CONN, frame, self.now())
        self.run()
        replies = [f for f in self.frames if f.get("id") == frame.get("id")]
        assert replies, f"no reply to {frame}"
        return replies[-1]

    def change(self, t: str, **fields: Any) -> dict[str, Any]:
        """A state-changing request with a fresh id and seq; returns the frame sent."""
        self.seq += 1
        self.rid += 1
        return {"t": t, "id": self.rid, "client": "c1", "seq": self.seq, "acked": 0, **fields}

    def resend(self, frame: dict[str, Any]) -> dict[str, Any]:
        """The same request again (same client and seq), as a client retrying sends it."""
        self.rid += 1
        return self.send({**frame, "id": self.rid})

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]


@pytest.fixture
def member() -> OneMember:
    return OneMember()


def test_a_resent_release_is_neither_counted_nor_audited_twice(member: OneMember) -> None:
    member.send(member.change("open_lease", lease="L", ttl_ms=30_000))
    member.send(member.change("acquire", lease="L", key="k"))
    release = member.change("release", lease="L", key="k", keep_lease=True)
    first = member.send(release)
    again = member.resend(release)
    assert first["released"] == again["released"] == "lock"  # answered from memory
    assert member.machine.stats.releases == {"released": 1}
    assert len(member.named("lock_released")) == 1
    assert member.machine.stats.hold_time.count == 1


def test_a_resent_close_is_neither_counted_nor_audited_twice(member: OneMember) -> None:
    member.send(member.change("open_lease", lease="L", ttl_ms=30_000))
    member.send(member.change("acquire", lease="L", key="a"))
    member.send(member.change("acquire", lease="L", key="b"))
    close = member.change("close_lease", lease="L")
    assert member.send(close)["released"] == ["a", "b"]
    assert member.resend(close)["released"] == ["a", "b"]
    assert member.machine.stats.releases == {"closed": 2}
    assert len(member.named("lease_closed")) == 1
    assert len(member.named("lock_released")) == 2


def test_a_resent_open_is_audited_once(member: OneMember) -> None:
    opened = member.change("open_lease", lease="L", ttl_ms=30_000)
    member.send(opened)
    member.resend(opened)
    assert len(member.named("lease_opened")) == 1


def test_a_conflict_a_wait_and_a_hand_over_are_counted(member: OneMember) -> None:
    stats = member.machine.stats
    member.send(member.change("open_lease", lease="A", ttl_ms=30_000))
    member.send(member.change("open_lease", lease="B", ttl_ms=30_000))
    meta = {"host": "web-1", "user": "deploy", "pid": "42", "cmd": "backup.sh"}
    member.send(member.change("acquire", lease="A", key="k", meta=meta))
    held = member.send(member.change("acquire", lease="B", key="k"))
    assert held["code"] == "LOCKED"
    assert member.send(member.change("acquire", lease="B", key="k", wait=True))["result"] == (
        "queued"
    )
    member.advance(2.0)
    member.send(member.change("release", lease="A", key="k", keep_lease=True))
    assert stats.requests[("acquire", "OK")] == 2
    assert stats.requests[("acquire", "LOCKED")] == 1
    assert stats.requests[("release", "OK")] == 1
    assert stats.grants == 2 and stats.releases == {"released": 1}
    assert stats.acquire_wait.count == 1
    assert stats.acquire_wait.sum == pytest.approx(2.0, abs=0.01)
    assert stats.hold_time.count == 1
    assert stats.hold_time.sum == pytest.approx(2.0, abs=0.01)
    first, second = member.named("lock_granted")
    assert first == {"key": "k", "token": first["token"], "lease": "A", "owner": meta}
    assert (second["lease"], second["key"]) == ("B", "k") and second["token"] > first["token"]
    (released,) = member.named("lock_released")
    assert released == {"key": "k", "lease": "A", "how": "released", "index": second["token"]}


def test_an_expiry_counts_the_lease_and_every_lock_it_held(member: OneMember) -> None:
    stats = member.machine.stats
    member.send(member.change("open_lease", lease="A", ttl_ms=1_000))
    member.send(member.change("open_lease", lease="B", ttl_ms=60_000))
    member.send(member.change("acquire", lease="A", key="x"))
    member.send(member.change("acquire", lease="A", key="y"))
    member.send(member.change("acquire", lease="B", key="z"))
    member.send(member.change("acquire", lease="A", key="z", wait=True))
    member.advance(1.5)
    assert stats.expiries == 1 and stats.locks_lost == 2
    assert stats.releases == {"expired": 2}
    assert stats.hold_time.count == 2
    (expired,) = member.named("lease_expired")
    assert (expired["lease"], expired["released"]) == ("A", ["x", "y"])
    (deadline,) = member.named("lease_deadline_passed")
    assert deadline == {"lease": "A", "index": expired["index"]}
    assert [(e["key"], e["how"], e["index"]) for e in member.named("lock_released")] == [
        ("x", "expired", expired["index"]),
        ("y", "expired", expired["index"]),
    ]
    assert member.machine.locks.counts().waiters == 0


def test_every_answer_to_a_request_is_counted_once(member: OneMember) -> None:
    """Reads, pings, refusals, malformed frames and answers while stopping included: the
    counts add up to the replies sent."""
    member.send(member.change("open_lease", lease="A", ttl_ms=30_000))
    member.send(member.change("acquire", lease="A", key="k"))
    member.send({"t": "ping", "id": 900})
    member.send({"t": "status", "id": 901})
    member.send({"t": "get", "id": 902, "key": "k"})
    member.send({"t": "list", "id": 903, "prefix": ""})
    member.send({"t": "keepalive", "id": 904, "lease": "A"})
    member.send({"t": "keepalive", "id": 905, "lease": "nope"})
    member.send(member.change("release", lease="B", key="k"))  # no such lease
    member.send({"t": "acquire", "id": 906})  # malformed: no lease, key or seq
    member.machine.client_frame(CONN, ["not", "a", "request"], member.now())
    member.machine.begin_shutdown(member.now())
    member.run()
    member.send({"t": "ping", "id": 907})
    answers = [f for f in member.frames if f.get("t") in ("ok", "error")]
    requests = member.machine.stats.requests
    assert sum(requests.values()) == len(answers)
    assert requests[("ping", "OK")] == 1 and requests[("ping", "SHUTTING_DOWN")] == 1
    assert requests[("status", "OK")] == requests[("get", "OK")] == 1
    assert requests[("list", "OK")] == 1
    assert requests[("keepalive", "OK")] == requests[("keepalive", "SESSION_EXPIRED")] == 1
    assert requests[("release", "SESSION_EXPIRED")] == 1
    # A frame that is not a request has no type to count it under (and a made-up type
    # must not become a label).
    assert requests[("invalid", "BAD_REQUEST")] == 2
