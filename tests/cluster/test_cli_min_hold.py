"""`dlm exec --min-hold` against real members: one run per cron tick across a fleet.

The fleet test plays cron on five hosts: every tick, each "host" (a `dlm exec`
process) starts after a seeded random skew of up to 1.5 s, and the job appends
its tick's number to a file, so the runs per tick can be counted afterwards.
The same ticks run twice at once, on two keys: with --min-hold (exactly one
run per tick) and without it (later hosts run the job again once the first
has released the lock), so the test can tell the difference.

The other tests measure one hold: dlm exits as soon as CMD ends, the lock
stays taken until the hold's end (also across a leader failover) and no
longer than a job that outlasts the hold. "Taken until" is checked from the
outside: every read of the key answered before the hold's end must show it
held. Members, dlm and this test share one host, hence one wall clock, so the
holder's `granted_at_ms` (stamped by the leader before the grant) bounds the
hold's end from below.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dlm.client.errors import DlmError
from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import Cluster

pytestmark = pytest.mark.cluster

SEED = 1515
HOSTS = 5
TICKS = 8
PERIOD_S = 4.0
MAX_SKEW_S = 1.5
JOB_S = 0.3
HOLD_S = 3.0
POLL_S = 0.02


def fleet_schedule() -> list[list[float]]:
    """skews[tick][host]: when each host's cron fires, in seconds after the tick."""
    rng = random.Random(SEED)
    return [[rng.uniform(0.0, MAX_SKEW_S) for _ in range(HOSTS)] for _ in range(TICKS)]


def test_the_schedule_leaves_each_tick_a_host_after_the_previous_hold() -> None:
    """A property of the seed, not of dlm: a hold that began late in one tick ends before
    the last host of the next tick fires (with time to spare for start-up jitter), so that
    tick gets its run too."""
    skews = fleet_schedule()
    for tick in range(TICKS - 1):
        hold_ends = min(skews[tick]) + HOLD_S * 1.005
        assert max(skews[tick + 1]) + PERIOD_S - hold_ends > 0.8, tick


@pytest.mark.serial  # a fleet of hosts playing cron on a schedule of fractions of a second
def test_min_hold_gives_one_run_per_tick_across_a_fleet_and_without_it_some_ticks_run_twice(
    dlm: Dlm, tmp_path: Path
) -> None:
    script = f'echo "$0" >> "$1"; sleep {JOB_S}'
    variants = {
        "held": (["--min-hold", f"{HOLD_S:g}s"], tmp_path / "runs-held"),
        "free": ([], tmp_path / "runs-free"),
    }
    starts = sorted(
        (tick * PERIOD_S + skew, tick, name)
        for tick, skews in enumerate(fleet_schedule())
        for skew in skews
        for name in variants
    )
    started: list[tuple[int, str, subprocess.Popen[str]]] = []
    try:
        origin = time.monotonic() + 0.5
        for at, tick, name in starts:
            # Playing cron: each host fires at its own moment of the tick.
            time.sleep(max(0.0, origin + at - time.monotonic()))
            extra, runs = variants[name]
            proc = dlm.start(
                "exec", "--lock", f"fleet-{name}", *extra, "--", "sh", "-c", script, str(tick),
                str(runs),
            )  # fmt: skip
            started.append((tick, name, proc))
        outcomes = [(tick, name, finish(proc)) for tick, name, proc in started]
        took = time.monotonic() - origin
    finally:
        for _, _, proc in started:
            stop(proc)
    for _tick, _name, (code, _, err) in outcomes:
        assert code in (0, 75), err  # ran, or found the lock taken and skipped
    per_tick = {
        name: Counter(int(line) for line in runs.read_text().split())
        for name, (_, runs) in variants.items()
    }
    held = [per_tick["held"][tick] for tick in range(TICKS)]
    free = [per_tick["free"][tick] for tick in range(TICKS)]
    print(f"runs per tick with --min-hold {HOLD_S:g}s: {held}; without: {free}; {took:.1f}s")
    assert held == [1] * TICKS
    assert all(runs >= 1 for runs in free)
    assert sum(free) > TICKS  # the hold is what made it one


# --- one hold, measured ------------------------------------------------------------------


def holder_of(dlm: Dlm, key: str) -> dict[str, Any]:
    (holder,) = dlm.json("status", key)["holders"]
    assert isinstance(holder, dict)
    return holder


def watch_until_free(
    cluster: Cluster, key: str, held_until_ms: int, timeout: float
) -> tuple[int, float]:
    """Reads ``key`` until it is free; every read answered before ``held_until_ms`` (wall
    clock) must find it held. Returns how many reads said so, and when it was seen free."""
    client = cluster.client(timeout=1.0, dial_timeout=1.0)
    held_reads = 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            try:
                holders = client.get(key).holders
            except DlmError:
                continue  # no leader for a moment: that proves nothing either way
            answered_ms = time.time() * 1000
            if holders:
                held_reads += answered_ms < held_until_ms
                continue
            assert answered_ms >= held_until_ms, (
                f"free {held_until_ms - answered_ms:.0f} ms before the hold's end"
            )
            return held_reads, answered_ms
    finally:
        client.close()
    raise AssertionError(f"{key!r} still taken {timeout}s on")


@pytest.mark.serial  # it times `dlm exec` against half the hold
def test_exec_exits_when_cmd_ends_and_the_lock_stays_taken_until_the_hold_ends(
    dlm: Dlm, shared: Cluster
) -> None:
    hold_s = 4.0
    started = time.monotonic()
    ran = dlm.json("exec", "--lock", "mh-one", "--min-hold", f"{hold_s:g}s", "--", "true")
    exec_took = time.monotonic() - started
    assert ran["exit_code"] == 0 and ran["hold_until"] is not None
    holder = holder_of(dlm, "mh-one")
    print(f"dlm exec --min-hold {hold_s:g}s -- true took {exec_took * 1000:.0f} ms")
    assert exec_took < hold_s / 2  # it did not sit out the hold

    # Another host, in the same tick: the lock is taken, so it skips.
    assert dlm.run("exec", "--lock", "mh-one", "--", "true").returncode == 75
    state = dlm.json("status", "mh-one")
    assert state["command_finished"] is True and holder["lease"] == ran["lease"]
    (shown,) = state["holders"]
    assert shown["command_finished"] is True
    assert shown["hold_until"] == state["hold_until"]
    table = dlm.run("status", "mh-one", "--format", "table").stdout
    assert "after its command finished (--min-hold) until" in table

    until_ms = int(holder["granted_at_ms"] + hold_s * 1000)
    held_reads, freed_ms = watch_until_free(shared, "mh-one", until_ms, timeout=30.0)
    assert held_reads > 0
    print(f"free {freed_ms - until_ms:.0f} ms after the hold's end")
    assert freed_ms - until_ms < 3000  # the leader expired it: not the 30 s TTL


def test_a_job_longer_than_the_hold_releases_the_lock_at_its_end(dlm: Dlm) -> None:
    ran = dlm.json("exec", "--lock", "mh-long", "--min-hold", "500ms", "--", "sleep", "1.5")
    assert ran["exit_code"] == 0 and ran["hold_until"] is None
    assert dlm.json("status", "mh-long")["holders"] == []  # released, not left to expire


def test_a_leader_failover_during_the_hold_does_not_shorten_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    dlm = Dlm(cluster.members_env, tmp_path)
    hold_s = 6.0
    ran = dlm.json("exec", "--lock", "mh-failover", "--min-hold", f"{hold_s:g}s", "--", "true")
    assert ran["hold_until"] is not None
    holder = holder_of(dlm, "mh-failover")
    leader = cluster.wait_for_leader()
    leader.kill()
    new_leader = cluster.wait_for_leader(timeout=15.0, not_=leader.node_id)
    until_ms = int(holder["granted_at_ms"] + hold_s * 1000)
    assert time.time() * 1000 < until_ms, "the failover took the whole hold: nothing tested"
    held_reads, freed_ms = watch_until_free(cluster, "mh-failover", until_ms, timeout=40.0)
    assert held_reads > 0  # answered by the new leader, within the hold
    print(
        f"failover {leader.node_id} -> {new_leader.node_id}: free "
        f"{freed_ms - until_ms:.0f} ms after the hold's end"
    )
