"""What membership changes cost: a member joining a loaded cluster, and a leader's removal.

    python -m bench.membership [--locks 50000] [--entries 10000] [--removals 3]
                               [--clients 32] [--json FILE] [--data-dir DIR]

Not a test: it asserts nothing and prints what it measured, on this machine.

1. **Join.** Three members (fsync on, free 127.0.0.1 ports) take ``--locks``
   locks (many keys under a few hundred leases, through the async client);
   the leader snapshots once they are all held (``DLM_SNAPSHOT_EVERY`` is set
   just above that many entries, and acquire/release pairs on one more key fill
   the log up to it), then ``--entries`` more log entries are written. A fourth
   member then starts with ``--join``: it must install the snapshot (every
   lock) and replay the entries after it. Reported, from the spawn of its
   process: the join answered (it is a learner), the snapshot installed, and
   the member a voter (its promotion applied), read from the member's own log
   lines; and the time until ``members_view`` lists it as a voter.
2. **Leader removal.** One client takes and releases a lock in a loop while
   ``dlm members remove <leader>`` runs; the figure is the longest gap between
   two successful operations around it (the removal hands leadership over
   first, so this is the client's view of a planned leader change). Each
   round first joins a new member, so the cluster never shrinks below three.

Every process it starts is stopped by its PID at the end, also on errors;
the data lives in a temporary directory that is removed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from bench.floor import free_ports
from bench.procs import ProcessCluster

LEASE_TTL_MS = 3_600_000
"""The load's leases outlive the run: no keep-alives needed."""
KEYS_PER_LEASE = 200
LEADER_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 600.0


class Members(ProcessCluster):
    """The first members with --peers, then members that join with --join."""

    def __init__(self, base_dir: str, env: dict[str, str]) -> None:
        super().__init__(base_dir, ["n1", "n2", "n3"])
        self.addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
        self.first = list(self.addrs)
        self.env = env

    def _command(self, i: int) -> list[str]:
        name, addr = self.names[i], self.addrs[i]
        data = os.path.join(self.base_dir, name)
        if i < 3:
            peers = ",".join(f"{n}={a}" for n, a in zip(self.names, self.first, strict=False))
            where = ["--peers", peers]
        else:
            where = ["--join", ",".join(self.live_addrs())]
        args = ["--id", name, "--listen", addr, *where, "--data", data, "--cluster-id", "bench"]
        return [sys.executable, "-m", "dlm", "node", "start", *args]

    def _spawn(self, i: int) -> None:
        with open(os.path.join(self.base_dir, f"{self.names[i]}.log"), "ab") as log:
            self.procs[i] = subprocess.Popen(
                self._command(i), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env
            )

    def live_addrs(self) -> list[str]:
        return [a for i, a in enumerate(self.addrs) if self.alive(i)]

    def add(self, name: str) -> int:
        """Spawns a new member that joins through the live ones; its index."""
        self.names.append(name)
        self.addrs.append(f"127.0.0.1:{free_ports(1)[0]}")
        self.procs.append(None)
        self._spawn(len(self.names) - 1)
        return len(self.names) - 1

    def log_events(self, name: str, event: str) -> list[dict[str, Any]]:
        path = os.path.join(self.base_dir, f"{name}.log")
        found = []
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                if f'"event":"{event}"' in line:
                    try:
                        found.append(json.loads(line))
                    except ValueError:
                        continue
        return found


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)


def leader_of(members: Members) -> str | None:
    from dlm.client import Client

    with Client(members.live_addrs(), timeout=5.0) as client:
        for addr in members.live_addrs():
            view = client.member_status(addr, timeout=1.0)
            if view is not None and view.role == "leader":
                return str(view.node)
    return None


def is_voter(members: Members, name: str) -> bool:
    """Whether the leader lists ``name`` as a voter (asked through the members alive now:
    the first ones may all have been removed)."""
    from dlm.client import Client

    with Client(members.live_addrs(), timeout=30.0) as client:
        view = client.members_view()
    return any(m.id == name and m.role in ("leader", "follower") for m in view.members)


# ---------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------


async def _hold_locks(addrs: list[str], locks: int, clients: int) -> None:
    """``locks`` keys held under leases of KEYS_PER_LEASE keys each, by ``clients`` tasks."""
    from dlm.client.aio import AsyncClient

    leases = -(-locks // KEYS_PER_LEASE)

    async def worker(first: int) -> None:
        async with AsyncClient(addrs, timeout=60.0) as client:
            for lease_no in range(first, leases, clients):
                lease = await client.open_lease(LEASE_TTL_MS)
                start = lease_no * KEYS_PER_LEASE
                for key_no in range(start, min(start + KEYS_PER_LEASE, locks)):
                    await client.acquire(lease, f"held/{key_no:06d}")

    async with anyio.create_task_group() as tg:
        for first in range(min(clients, leases)):
            tg.start_soon(worker, first)


async def _pairs(
    addrs: list[str], pairs: int, clients: int, until: Callable[[], object] | None = None
) -> int:
    """Acquire/release pairs (two log entries each) on one key per client: ``pairs`` of
    them, or as many as it takes for ``until()`` to hold (asked four times a second, off
    the loop); the number done."""
    from dlm.client.aio import AsyncClient

    done = 0
    enough = anyio.Event()

    async def watch() -> None:
        while until is not None and not enough.is_set():
            if await anyio.to_thread.run_sync(until):
                enough.set()
                return
            await anyio.sleep(0.25)

    async def worker(n: int) -> None:
        nonlocal done
        async with AsyncClient(addrs, timeout=60.0) as client:
            lease = await client.open_lease(LEASE_TTL_MS)
            while done < pairs and not enough.is_set():
                await client.acquire(lease, f"pad/{n}")
                await client.release(lease, f"pad/{n}")
                done += 1
        enough.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        for n in range(clients):
            tg.start_soon(worker, n)
    return done


# ---------------------------------------------------------------------------
# The two measurements
# ---------------------------------------------------------------------------


@dataclass
class JoinResult:
    locks: int
    entries_after_snapshot: int
    snapshot_index: int
    snapshot_bytes: int
    load_seconds: float
    joined_s: float | None = None
    snapshot_installed_s: float | None = None
    voter_s: float | None = None
    voter_seen_s: float | None = None


@dataclass
class RemovalResult:
    removed: str
    command_s: float
    longest_pause_s: float
    failed_operations: int
    errors: list[str] = field(default_factory=list)


def latest_snapshot(members: Members, name: str) -> tuple[int, int] | None:
    """(index, bytes) of the newest snapshot in member ``name``'s data directory."""
    snaps = sorted(Path(members.base_dir, name, "snap").glob("*.snap"))
    if not snaps:
        return None
    return int(snaps[-1].name.split("-")[0], 16), snaps[-1].stat().st_size


def measure_join(members: Members, args: argparse.Namespace) -> JoinResult:
    started = time.monotonic()
    anyio.run(_hold_locks, members.first, args.locks, args.clients)
    filler = anyio.run(
        _pairs, members.first, 10**9, args.clients, lambda: latest_snapshot(members, "n1")
    )
    index, size = latest_snapshot(members, "n1") or (0, 0)
    anyio.run(_pairs, members.first, args.entries // 2, args.clients)
    load_s = time.monotonic() - started
    print(
        f"load: {args.locks} locks held, snapshot at index {index} ({size / 1e6:.1f} MB, "
        f"after {filler} filler pairs), then {args.entries} more entries; {load_s:.1f} s",
        flush=True,
    )
    result = JoinResult(args.locks, args.entries, index, size, load_s)

    spawned = time.time()
    spawned_mono = time.monotonic()
    i = members.add("n4")
    name = members.names[i]
    wait_until(lambda: is_voter(members, name), JOIN_TIMEOUT_S, f"{name} a voter")
    result.voter_seen_s = time.monotonic() - spawned_mono

    def since_spawn(event: str, **match: Any) -> float | None:
        for record in members.log_events(name, event):
            if all(record.get(k) == v for k, v in match.items()):
                return float(record["ts"]) - spawned
        return None

    result.joined_s = since_spawn("joined")
    result.snapshot_installed_s = since_spawn("snapshot_installed")
    result.voter_s = wait_until(
        lambda: since_spawn("member_promoted", member=name), 10.0, "the promotion in its log"
    )
    print(
        f"join: process spawned -> learner {result.joined_s:.2f} s -> snapshot installed "
        f"{result.snapshot_installed_s:.2f} s -> voter {result.voter_s:.2f} s "
        f"(seen as a voter by a client after {result.voter_seen_s:.2f} s)",
        flush=True,
    )
    return result


class LockLoop:
    """One client taking and releasing one lock as fast as it can; when each op ended.

    Its member list is renewed (as an operator updates DLM_CLUSTER) when ``refresh()`` is
    called, before each removal."""

    def __init__(self, members: Members) -> None:
        from dlm.client import Client

        self.members = members
        self.client = Client(members.live_addrs(), timeout=30.0)
        self.done: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._refresh = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def wait_for_more(self, count: int) -> None:
        target = len(self.done) + count
        wait_until(lambda: len(self.done) >= target, 30.0, "the probe client to go on")

    def refresh(self) -> None:
        """Talk to the members alive now, from the next operation on."""
        self._refresh.set()

    def _run(self) -> None:
        from dlm.client import Client
        from dlm.client.errors import ClusterUnavailable, DlmError

        lease = self.client.open_lease(60_000)
        while not self.stop.is_set():
            if self._refresh.is_set():
                self._refresh.clear()
                self.client.close()
                self.client = Client(self.members.live_addrs(), timeout=30.0)
            try:
                self.client.acquire(lease, "removal-probe")
                self.client.release(lease, "removal-probe", keep_lease=True)
                self.client.keepalive(lease)
            except ClusterUnavailable as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.client.close()
                self.client = Client(self.members.live_addrs(), timeout=30.0)
                continue
            except DlmError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            self.done.append(time.monotonic())

    def longest_gap(self, start: float, end: float) -> float:
        times = [t for t in self.done if t >= start - 5.0]
        gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
        return max(gaps, default=0.0)


def measure_removals(members: Members, rounds: int) -> list[RemovalResult]:
    results = []
    loop = LockLoop(members)
    loop.thread.start()
    try:
        loop.wait_for_more(20)
        for round_no in range(rounds):
            if round_no:
                i = members.add(f"n{len(members.names) + 1}")
                name = members.names[i]

                def voter(name: str = name) -> bool:
                    return is_voter(members, name)

                wait_until(voter, JOIN_TIMEOUT_S, f"{name} a voter")
            loop.refresh()
            loop.wait_for_more(20)
            leader = wait_until(lambda: leader_of(members), LEADER_TIMEOUT_S, "a leader")
            errors_before = len(loop.errors)
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "dlm", "members", "remove", leader, "--json"],
                env={**os.environ, "DLM_CLUSTER": ",".join(members.live_addrs())},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            ended = time.monotonic()
            if proc.returncode != 0:
                raise RuntimeError(f"dlm members remove {leader}: {proc.stderr.strip()}")

            def past(after: float = ended + 1.0) -> bool:
                return bool(loop.done) and loop.done[-1] > after

            wait_until(past, 30.0, "operations after the removal")

            def stopped(index: int = members.names.index(leader)) -> bool:
                return not members.alive(index)

            wait_until(stopped, 30.0, f"{leader} to stop by itself")
            result = RemovalResult(
                leader,
                ended - started,
                loop.longest_gap(started, ended + 1.0),
                len(loop.errors) - errors_before,
                loop.errors[errors_before:],
            )
            results.append(result)
            print(
                f"leader removal {round_no + 1}: removed {leader}; the command took "
                f"{result.command_s:.2f} s (interpreter start included), the client's longest "
                f"pause {result.longest_pause_s * 1000:.0f} ms, {result.failed_operations} "
                "failed operations",
                flush=True,
            )
    finally:
        loop.stop.set()
        loop.thread.join(timeout=30.0)
        loop.client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.membership", description=__doc__)
    parser.add_argument("--locks", type=int, default=50_000)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--removals", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--data-dir", metavar="DIR", default=None)
    args = parser.parse_args(argv)

    base = tempfile.mkdtemp(prefix="dlm-bench-membership-", dir=args.data_dir)
    leases = -(-args.locks // KEYS_PER_LEASE)
    # The snapshot comes once every lock is held (plus a margin for the leases' own
    # entries and the pairs that fill the log up to it).
    every = args.locks + leases + 1_000
    env = {**os.environ, "DLM_SNAPSHOT_EVERY": str(every), "DLM_NODE_LOG_FORMAT": "json"}
    env.setdefault("DLM_LOG_LEVEL", "info")
    members = Members(base, env)
    print(
        f"bench.membership: {args.locks} locks, {args.entries} entries after the snapshot, "
        f"{args.removals} leader removals; load average {os.getloadavg()[0]:.2f}; data in {base}",
        flush=True,
    )
    report: dict[str, Any] = {"settings": vars(args)}
    interrupted = False

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        members.spawn_all()
        wait_until(lambda: leader_of(members), LEADER_TIMEOUT_S, "a leader")
        join = measure_join(members, args)
        report["join"] = asdict(join)
        removals = measure_removals(members, args.removals)
        report["removals"] = [asdict(r) for r in removals]
        if removals:
            pauses = [r.longest_pause_s for r in removals]
            median_ms = statistics.median(pauses) * 1000
            print(
                f"leader removal: longest client pause median {median_ms:.0f} ms, max "
                f"{max(pauses) * 1000:.0f} ms over {len(pauses)} removals; "
                f"load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        members.stop()
        shutil.rmtree(base, ignore_errors=True)
    if args.json and not interrupted:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
