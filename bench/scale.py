"""Fleet scale: 10,000 leases kept alive, and 100,000 held locks, on a local 3-member cluster.

Run with ``make bench-scale`` (or ``python -m bench.scale``). Not a test: it
prints what it measured beside the machine's floor, and writes
bench/results/scale.md, .png and .json. Two parts, each on a fresh cluster:

**Leases.** Load processes open ``--leases`` leases (TTL 15 s) over many
connections and renew each every 5 s, evenly spread (10,000 leases: 2,000
keep-alives a second). First the acquire/release cell of 16 clients runs
alone (the baseline), then keep-alives alone (server CPU per keep-alive),
then both together: keep-alive latency, and the pair latency against the
baseline. A lease that expires on the way is counted (there should be none).

**Locks.** Members run with ``DLM_SNAPSHOT_EVERY`` set to ``--locks``, so
that their snapshot is taken when the table holds about that many locks. Load processes
take ``--locks`` locks, each with 100 bytes of owner metadata, under a
hundred long leases. Measured: the leader's resident memory per held lock;
a follower's restart with a log of about 100,000 entries and no snapshot
(killed just before the table reaches 100,000 and restarted); the
snapshot's size and write time (the ``snapshot_written`` log event) and how
long the leader stops answering while it builds the image (a probe process
pings the leader every few milliseconds); a follower's restart from that
snapshot; a new member's catch-up (``dlm node start --join``); and how long
``dlm locks`` (every page) and ``dlm status`` take.

Every process started here is stopped by its PID; data lives in a temporary
directory that is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.floor import Floor, free_ports, measure_floor, percentile, summarize
from bench.locks import (
    DEFAULT_RESULTS,
    Cell,
    CellResult,
    DlmCluster,
    Target,
    cpu_seconds,
    run_cell,
)
from dlm.views import StatusView

LEASES = 10_000
LEASE_TTL_MS = 15_000
KEEPALIVE_EVERY_S = 5.0
ACQUIRERS = 16
LOCKS = 100_000
LOCK_LEASES = 100
LOCK_LEASE_TTL_MS = 3_600_000
META_BYTES = 100
CONNECTIONS_PER_PROC = 32
PROBE_EVERY_S = 0.005
SETUP_TIMEOUT_S = 600.0
CATCH_UP_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------
# Load processes
# ---------------------------------------------------------------------------


def _ordered(cluster: DlmCluster) -> list[str]:
    leader = cluster.leader_index(30)
    return [cluster.addrs[leader], *(a for i, a in enumerate(cluster.addrs) if i != leader)]


async def _keepalive_worker(
    endpoints: list[str], leases: int, ready: Any, stop: Any, results: Any
) -> None:
    from dlm.client.aio import AsyncClient

    clients = [AsyncClient(endpoints, timeout=10.0) for _ in range(CONNECTIONS_PER_PROC)]
    shares = [leases // len(clients) + (i < leases % len(clients)) for i in range(len(clients))]
    samples: list[tuple[float, float]] = []  # (sent at, latency)
    lost = 0
    errors = 0

    async def open_share(client: Any, count: int) -> list[Any]:
        return [await client.open_lease(LEASE_TTL_MS) for _ in range(count)]

    opened = await asyncio.gather(*(open_share(c, n) for c, n in zip(clients, shares, strict=True)))
    ready.set()

    async def renew(client: Any, own: list[Any], offset: float) -> None:
        nonlocal lost, errors
        if not own:
            return
        gap = KEEPALIVE_EVERY_S / len(own)
        next_at = time.monotonic() + offset
        i = 0
        while not stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            sent = time.monotonic()
            try:
                await client.keepalive(own[i % len(own)])
                samples.append((sent, time.monotonic() - sent))
            except Exception as exc:
                if "SESSION_EXPIRED" in str(exc) or "expired" in str(exc):
                    lost += 1
                else:
                    errors += 1
            i += 1
            next_at += gap

    spread = KEEPALIVE_EVERY_S / len(clients)
    await asyncio.gather(
        *(
            renew(c, own, k * spread / len(clients))
            for k, (c, own) in enumerate(zip(clients, opened, strict=True))
        )
    )
    results.put({"samples": samples, "lost": lost, "errors": errors})
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()


def _keepalive_process(
    endpoints: list[str], leases: int, ready: Any, stop: Any, results: Any
) -> None:
    try:
        asyncio.run(_keepalive_worker(endpoints, leases, ready, stop, results))
    except BaseException as exc:
        ready.set()
        results.put(
            {"samples": [], "lost": 0, "errors": 1, "error": f"{type(exc).__name__}: {exc}"}
        )


async def _fill_worker(endpoints: list[str], first: int, count: int, prefix: str) -> dict[str, Any]:
    from dlm.client.aio import AsyncClient

    meta = {"owner": "o" * (META_BYTES - len("owner"))}
    clients = [AsyncClient(endpoints, timeout=30.0) for _ in range(CONNECTIONS_PER_PROC)]
    leases_each = max(1, LOCK_LEASES // 2 // len(clients))
    errors = 0

    async def fill(k: int, client: Any) -> None:
        nonlocal errors
        leases = [await client.open_lease(LOCK_LEASE_TTL_MS) for _ in range(leases_each)]
        for n in range(first + k, first + count, len(clients)):
            try:
                await client.acquire(leases[n % len(leases)], f"{prefix}/{n:07d}", meta=meta)
            except Exception:
                errors += 1

    started = time.monotonic()
    await asyncio.gather(*(fill(k, c) for k, c in enumerate(clients)))
    elapsed = time.monotonic() - started
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()
    return {"errors": errors, "seconds": elapsed}


def _fill_process(endpoints: list[str], first: int, count: int, prefix: str, results: Any) -> None:
    try:
        results.put(asyncio.run(_fill_worker(endpoints, first, count, prefix)))
    except BaseException as exc:
        results.put({"errors": count, "seconds": 0.0, "error": f"{type(exc).__name__}: {exc}"})


def _probe_process(address: str, stop: Any, results: Any) -> None:
    """Asks one member for a key, stale (answered at once from its own state, no Raft round),
    every PROBE_EVERY_S; (wall time sent, latency) of each answer."""
    from dlm.client.sync import Client

    client = Client([address], timeout=30.0)
    samples: list[tuple[float, float]] = []
    try:
        while not stop.is_set():
            wall, sent = time.time(), time.monotonic()
            try:
                client.get("scale/probe", stale=True)
            except Exception:
                continue
            samples.append((wall, time.monotonic() - sent))
            time.sleep(PROBE_EVERY_S)
    finally:
        client.close()
        results.put(samples)


# ---------------------------------------------------------------------------
# Cluster helpers
# ---------------------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _status(cluster: DlmCluster, address: str) -> StatusView | None:
    return cluster._client.member_status(address, timeout=2.0)


def _wait_caught_up(cluster: DlmCluster, address: str, index: int, since: float) -> float | None:
    """Seconds from ``since`` until the member at ``address`` has applied ``index``."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while time.monotonic() < deadline:
        view = _status(cluster, address)
        if view is not None and (view.applied or 0) >= index:
            return time.monotonic() - since
        time.sleep(0.02)
    return math.inf


def _leader_commit(cluster: DlmCluster) -> tuple[int, int]:
    leader = cluster.leader_index(30)
    view = _status(cluster, cluster.addrs[leader])
    return leader, (view.commit or 0) if view is not None else 0


def _restart_follower(cluster: DlmCluster, avoid: int) -> tuple[int, float | None]:
    """kill -9 a follower, start it again, and time it until it applied the leader's commit."""
    leader, _ = _leader_commit(cluster)
    victim = next(i for i in range(len(cluster.names)) if i not in (leader, avoid))
    cluster.kill(victim)
    _, commit = _leader_commit(cluster)
    started = time.monotonic()
    cluster.restart(victim)
    return victim, _wait_caught_up(cluster, cluster.addrs[victim], commit, started)


def _log_events(path: str, event: str) -> list[dict[str, Any]]:
    found = []
    with open(path, errors="replace") as f:
        for line in f:
            if f'"{event}"' in line:
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
    return found


def _time_command(argv: list[str], env: dict[str, str], repeats: int = 3) -> tuple[float, int]:
    """Median wall seconds of ``argv`` and the bytes its last run printed."""
    times, size = [], 0
    for _ in range(repeats):
        started = time.monotonic()
        out = subprocess.run(argv, env=env, capture_output=True, timeout=300, check=False)
        times.append(time.monotonic() - started)
        size = len(out.stdout)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr[-300:]!r}")
    return statistics.median(times), size


# ---------------------------------------------------------------------------
# The two parts
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class LeaseFigures:
    leases: int = 0
    open_seconds: float = 0.0
    keepalives_per_s: float = 0.0
    keepalive_alone: dict[str, float] = field(default_factory=dict)
    keepalive_with_acquirers: dict[str, float] = field(default_factory=dict)
    server_cpu_idle: float = 0.0
    server_cpu_keepalives: float = 0.0
    server_cpu_per_keepalive_us: float = 0.0
    baseline: dict[str, Any] = field(default_factory=dict)
    with_leases: dict[str, Any] = field(default_factory=dict)
    leases_lost: int = 0
    keepalive_errors: int = 0
    elections: int = 0
    error: str = ""


def _cell_summary(r: CellResult) -> dict[str, Any]:
    return {
        "pairs_per_s": r.pairs_per_s,
        "pair_p50_ms": r.pair.p50_ms,
        "pair_p99_ms": r.pair.p99_ms,
        "server_cpu": r.server_cpu,
        "errors": r.errors,
        "first_error": r.first_error,
    }


def _latency(samples: Sequence[tuple[float, float]], lo: float, hi: float) -> dict[str, float]:
    chosen = sorted(lat for sent, lat in samples if lo <= sent < hi)
    return {
        "p50_ms": percentile(chosen, 0.5) * 1e3,
        "p99_ms": percentile(chosen, 0.99) * 1e3,
        "samples": float(len(chosen)),
    }


def bench_leases(args: argparse.Namespace, base_dir: str) -> LeaseFigures:
    out = LeaseFigures(leases=args.leases)
    cluster = DlmCluster(os.path.join(base_dir, "leases"))
    os.makedirs(cluster.base_dir)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    workers: list[Any] = []
    try:
        cluster.start()
        endpoints = _ordered(cluster)
        target = Target("dlm", tuple(endpoints))
        term_before = cluster.max_term()
        idle_before = cpu_seconds(cluster.pids)
        time.sleep(2.0)
        out.server_cpu_idle = (cpu_seconds(cluster.pids) - idle_before) / 2.0

        cell = Cell(False, ACQUIRERS, 2, args.warmup, args.seconds, f"scale/base/{os.getpid()}")
        baseline = run_cell(target, cell, cluster.pids)
        out.baseline = _cell_summary(baseline)
        print(f"  16 acquirers, no leases: {_pair_text(baseline)}", flush=True)

        results = ctx.Queue()
        shares = [
            args.leases // args.procs + (i < args.leases % args.procs) for i in range(args.procs)
        ]
        readies = [ctx.Event() for _ in shares]
        started = time.monotonic()
        for share, ready in zip(shares, readies, strict=True):
            proc = ctx.Process(
                target=_keepalive_process,
                args=(endpoints, share, ready, stop, results),
                daemon=True,
            )
            proc.start()
            workers.append(proc)
        for ready in readies:
            ready.wait(SETUP_TIMEOUT_S)
        out.open_seconds = time.monotonic() - started
        print(
            f"  {args.leases} leases open in {out.open_seconds:.1f} s; keep-alives running",
            flush=True,
        )

        time.sleep(args.warmup + KEEPALIVE_EVERY_S)  # every lease renewed once before measuring
        alone_from = time.monotonic()
        cpu_before = cpu_seconds(cluster.pids)
        time.sleep(args.seconds)
        alone_to = time.monotonic()
        out.server_cpu_keepalives = (cpu_seconds(cluster.pids) - cpu_before) / (
            alone_to - alone_from
        )

        cell = Cell(False, ACQUIRERS, 2, args.warmup, args.seconds, f"scale/with/{os.getpid()}")
        with_from = time.monotonic() + args.warmup
        with_leases = run_cell(target, cell, cluster.pids)
        with_to = time.monotonic()
        out.with_leases = _cell_summary(with_leases)
        print(f"  16 acquirers, {args.leases} leases: {_pair_text(with_leases)}", flush=True)
        stop.set()
        collected = [results.get(timeout=60) for _ in workers]
        samples = [s for r in collected for s in r["samples"]]
        out.leases_lost = sum(r["lost"] for r in collected)
        out.keepalive_errors = sum(r["errors"] for r in collected)
        out.error = "; ".join(r["error"] for r in collected if r.get("error"))
        out.keepalive_alone = _latency(samples, alone_from, alone_to)
        out.keepalive_with_acquirers = _latency(samples, with_from, with_to)
        out.keepalives_per_s = out.keepalive_alone["samples"] / (alone_to - alone_from)
        busy = out.server_cpu_keepalives - out.server_cpu_idle
        if out.keepalives_per_s:
            out.server_cpu_per_keepalive_us = busy / out.keepalives_per_s * 1e6
        out.elections = max(0, cluster.max_term() - term_before)
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        print(f"  leases: stopped early: {out.error}", flush=True)
    finally:
        stop.set()
        for proc in workers:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        cluster.stop()
    return out


def _pair_text(r: CellResult) -> str:
    errors = f", {r.errors} errors ({r.first_error})" if r.errors else ""
    return (
        f"{r.pairs_per_s:,.0f} pairs/s, pair p50 {r.pair.p50_ms:.2f} ms, "
        f"p99 {r.pair.p99_ms:.2f} ms{errors}"
    )


@dataclass(slots=True)
class LockFigures:
    locks: int = 0
    fill_seconds: float = 0.0
    fill_errors: int = 0
    leader_rss_before: int = 0
    leader_rss_after: int = 0
    rss_per_lock_bytes: float = 0.0
    replay_restart_s: float | None = None
    replay_entries: int = 0
    snapshot_index: int = 0
    snapshot_bytes: int = 0
    snapshot_write_ms: float = 0.0
    leader_stall_ms: float = 0.0
    probe_p50_ms: float = 0.0
    snapshot_restart_s: float | None = None
    join_catch_up_s: float | None = None
    dlm_locks_s: float = 0.0
    dlm_locks_bytes: int = 0
    dlm_status_s: float = 0.0
    elections: int = 0
    error: str = ""


def _fill(
    ctx: Any, endpoints: list[str], first: int, count: int, *, procs: int, prefix: str
) -> tuple[float, int]:
    results = ctx.Queue()
    shares = [count // procs + (i < count % procs) for i in range(procs)]
    workers, start = [], first
    for share in shares:
        proc = ctx.Process(
            target=_fill_process, args=(endpoints, start, share, f"{prefix}", results), daemon=True
        )
        start += share
        proc.start()
        workers.append(proc)
    started = time.monotonic()
    done = [results.get(timeout=SETUP_TIMEOUT_S) for _ in workers]
    elapsed = time.monotonic() - started
    for proc in workers:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    return elapsed, sum(int(r["errors"]) for r in done)


def bench_locks(args: argparse.Namespace, base_dir: str) -> LockFigures:
    out = LockFigures(locks=args.locks)
    cluster = DlmCluster(os.path.join(base_dir, "locks"))
    os.makedirs(cluster.base_dir)
    ctx = multiprocessing.get_context("spawn")
    probe_stop = ctx.Event()
    probe: Any = None
    probe_results = ctx.Queue()
    joiner: subprocess.Popen[bytes] | None = None
    saved_env = os.environ.get("DLM_SNAPSHOT_EVERY")
    term_before = 0
    os.environ["DLM_SNAPSHOT_EVERY"] = str(args.locks)
    try:
        cluster.start()
        endpoints = _ordered(cluster)
        leader = cluster.addrs.index(endpoints[0])
        term_before = cluster.max_term()
        out.leader_rss_before = _rss_bytes(_leader_pid(cluster))
        prefix = f"scale/lock/{os.getpid()}"
        # Up to just short of the snapshot: a follower restarted here replays its whole log.
        first_part = max(0, args.locks - max(2_000, args.locks // 50))
        seconds, errors = _fill(ctx, endpoints, 0, first_part, procs=args.procs, prefix=prefix)
        print(f"  {first_part:,} locks taken in {seconds:.1f} s ({errors} errors)", flush=True)
        _, commit = _leader_commit(cluster)
        _, out.replay_restart_s = _restart_follower(cluster, avoid=-1)
        out.replay_entries = commit
        print(
            f"  follower restart, replaying {commit:,} entries: {_secs(out.replay_restart_s)}",
            flush=True,
        )

        probe = ctx.Process(
            target=_probe_process, args=(endpoints[0], probe_stop, probe_results), daemon=True
        )
        probe.start()
        rest_seconds, rest_errors = _fill(
            ctx, endpoints, first_part, args.locks - first_part, procs=args.procs, prefix=prefix
        )
        out.fill_seconds, out.fill_errors = seconds + rest_seconds, errors + rest_errors
        print(f"  {args.locks:,} locks held ({out.fill_errors} errors)", flush=True)
        leader = cluster.leader_index(30)
        leader_log = os.path.join(cluster.base_dir, f"{cluster.names[leader]}.log")
        deadline = time.monotonic() + 60
        while (
            not (saved := _log_events(leader_log, "snapshot_written"))
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        time.sleep(1.0)
        probe_stop.set()
        samples: list[tuple[float, float]] = probe_results.get(timeout=60)
        # The leader now (an election on the way would have moved it; they are counted).
        out.leader_rss_after = _rss_bytes(_leader_pid(cluster))
        out.rss_per_lock_bytes = (out.leader_rss_after - out.leader_rss_before) / max(1, args.locks)
        if saved:
            event = saved[-1]
            out.snapshot_index = int(event["index"])
            out.snapshot_bytes = int(event["bytes"])
            out.snapshot_write_ms = float(event["ms"])
            taken = _log_events(leader_log, "snapshot_taken")
            around = float(taken[-1]["ts"]) if taken else float(event["ts"])
            near = [lat for wall, lat in samples if around - 5.0 <= wall <= around + 1.0]
            out.leader_stall_ms = max(near, default=0.0) * 1e3
        out.probe_p50_ms = summarize([lat for _, lat in samples]).p50_ms
        print(
            f"  snapshot at {out.snapshot_index:,}: {out.snapshot_bytes / 1e6:.1f} MB written in "
            f"{out.snapshot_write_ms:.0f} ms; leader's longest ping around it "
            f"{out.leader_stall_ms:.0f} ms (p50 {out.probe_p50_ms:.2f} ms)",
            flush=True,
        )

        _, out.snapshot_restart_s = _restart_follower(cluster, avoid=-1)
        print(f"  follower restart from the snapshot: {_secs(out.snapshot_restart_s)}", flush=True)

        env = {**os.environ, "DLM_CLUSTER": ",".join(_ordered(cluster))}
        env.pop("DLM_SNAPSHOT_EVERY", None)
        dlm = [sys.executable, "-m", "dlm"]
        out.dlm_locks_s, out.dlm_locks_bytes = _time_command([*dlm, "locks"], env)
        out.dlm_status_s, _ = _time_command([*dlm, "status"], env)
        print(
            f"  dlm locks (all {args.locks:,}, {out.dlm_locks_bytes / 1e6:.1f} MB printed): "
            f"{out.dlm_locks_s:.2f} s; dlm status: {out.dlm_status_s:.2f} s",
            flush=True,
        )

        (port,) = free_ports(1)
        address = f"127.0.0.1:{port}"
        _, commit = _leader_commit(cluster)
        started = time.monotonic()
        with open(os.path.join(cluster.base_dir, "n4.log"), "ab") as log:
            joiner = subprocess.Popen(
                [
                    *dlm,
                    "node",
                    "start",
                    "--id",
                    "n4",
                    "--listen",
                    address,
                    "--join",
                    ",".join(cluster.addrs),
                    "--data",
                    os.path.join(cluster.base_dir, "n4"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        out.join_catch_up_s = _wait_caught_up(cluster, address, commit, started)
        print(f"  new member (--join) caught up: {_secs(out.join_catch_up_s)}", flush=True)
        out.elections = max(0, cluster.max_term() - term_before)
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        print(f"  locks: stopped early: {out.error}", flush=True)
        with contextlib.suppress(Exception):
            out.elections = max(0, cluster.max_term() - term_before)
    finally:
        if saved_env is None:
            os.environ.pop("DLM_SNAPSHOT_EVERY", None)
        else:
            os.environ["DLM_SNAPSHOT_EVERY"] = saved_env
        probe_stop.set()
        if probe is not None:
            probe.join(timeout=10)
            if probe.is_alive():
                probe.kill()
        if joiner is not None and joiner.poll() is None:
            joiner.terminate()
            try:
                joiner.wait(timeout=10)
            except subprocess.TimeoutExpired:
                joiner.kill()
                joiner.wait(timeout=5)
        cluster.stop()
    return out


def _secs(value: float | None) -> str:
    if value is None:
        return "not measured"
    return "timed out" if math.isinf(value) else f"{value:.2f} s"


def _leader_pid(cluster: DlmCluster) -> int:
    proc = cluster.procs[cluster.leader_index(30)]
    assert proc is not None
    return proc.pid


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def render(floor: Floor, leases: LeaseFigures | None, locks: LockFigures | None) -> str:
    rtt, fsync = floor.rtt.p50_ms, floor.fsync.p50_ms
    lines = ["| figure | floor | dlm | target |", "|---|---:|---:|---|"]

    def row(name: str, floor_text: str, value: str, target: str = "") -> None:
        lines.append(f"| {name} | {floor_text} | {value} | {target} |")

    if leases is not None:
        n = f"{leases.leases:,}"
        ka, kb = leases.keepalive_alone, leases.keepalive_with_acquirers
        row(
            f"keep-alives/s ({n} leases, every {KEEPALIVE_EVERY_S:g} s)",
            "-",
            f"{leases.keepalives_per_s:,.0f}",
            f"{leases.leases / KEEPALIVE_EVERY_S:,.0f}",
        )
        row(
            "keep-alive p50 / p99, alone",
            f"{2 * rtt:.2f} ms (2 RTT)",
            f"{ka.get('p50_ms', 0):.2f} / {ka.get('p99_ms', 0):.2f} ms",
        )
        row(
            "keep-alive p50 / p99, with 16 acquirers",
            f"{2 * rtt:.2f} ms",
            f"{kb.get('p50_ms', 0):.2f} / {kb.get('p99_ms', 0):.2f} ms",
        )
        base, withl = leases.baseline, leases.with_leases
        row(
            "acquire pair p50 / p99, 16 clients, no leases",
            f"{floor.pair_p50_ms:.2f} ms",
            f"{base.get('pair_p50_ms', 0):.2f} / {base.get('pair_p99_ms', 0):.2f} ms",
        )
        row(
            f"acquire pair p50 / p99, 16 clients, {n} leases",
            f"{floor.pair_p50_ms:.2f} ms",
            f"{withl.get('pair_p50_ms', 0):.2f} / {withl.get('pair_p99_ms', 0):.2f} ms",
        )
        row(
            "pairs/s, 16 clients: no leases / with leases",
            "-",
            f"{base.get('pairs_per_s', 0):,.0f} / {withl.get('pairs_per_s', 0):,.0f}",
        )
        row(
            "server CPU (3 members) per keep-alive",
            "-",
            f"{leases.server_cpu_per_keepalive_us:.0f} us "
            f"({leases.server_cpu_keepalives:.2f} cores, idle {leases.server_cpu_idle:.2f})",
        )
        row(
            "leases lost / keep-alive errors",
            "-",
            f"{leases.leases_lost} / {leases.keepalive_errors}",
            "0 / 0",
        )
        row("elections (lease part)", "-", str(leases.elections), "0")
    if locks is not None:
        n = f"{locks.locks:,}"
        row(f"time to take {n} locks (100 B metadata)", "-", f"{locks.fill_seconds:.1f} s")
        row(
            "leader RSS per held lock",
            "-",
            f"{locks.rss_per_lock_bytes:,.0f} B",
        )
        row(
            f"snapshot at index {locks.snapshot_index:,}: size",
            "-",
            f"{locks.snapshot_bytes / 1e6:.1f} MB",
        )
        row(
            "snapshot write (disk thread)",
            f"{fsync:.2f} ms (fsync)",
            f"{locks.snapshot_write_ms:,.0f} ms",
        )
        row(
            "leader stall while the snapshot is taken (longest ping)",
            f"{rtt:.2f} ms (RTT)",
            f"{locks.leader_stall_ms:,.0f} ms (ping p50 {locks.probe_p50_ms:.2f} ms)",
        )
        row(
            f"follower restart, replaying {locks.replay_entries:,} entries",
            "-",
            _secs(locks.replay_restart_s),
            "<= 5 s",
        )
        row(
            f"follower restart from the snapshot ({n} locks)",
            "-",
            _secs(locks.snapshot_restart_s),
            "<= 5 s",
        )
        row("new member (--join) catch-up", "-", _secs(locks.join_catch_up_s))
        row(
            f"`dlm locks` (every page, {n} locks)",
            "-",
            f"{locks.dlm_locks_s:.2f} s ({locks.dlm_locks_bytes / 1e6:.1f} MB printed)",
        )
        row(f"`dlm status` ({n} locks)", "-", f"{locks.dlm_status_s:.2f} s")
        row("elections (lock part)", "-", str(locks.elections), "0")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--leases", type=int, default=LEASES)
    parser.add_argument("--locks", type=int, default=LOCKS)
    parser.add_argument("--seconds", type=float, default=5.0, help="each measuring window")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--procs", type=int, default=2, help="load processes")
    parser.add_argument("--only", choices=("all", "leases", "locks"), default="all")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR", help="'' to skip")
    parser.add_argument("--name", default="scale")
    parser.add_argument("--label", default="authentication and TLS off")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dlm-scale-", dir=args.data_dir) as base_dir:
        floor = measure_floor(base_dir)
        print(
            f"floor: fsync p50 {floor.fsync.p50_ms:.3f} ms; "
            f"loopback RTT p50 {floor.rtt.p50_ms:.3f} ms",
            flush=True,
        )
        leases = locks = None
        if args.only in ("all", "leases"):
            print(f"leases: {args.leases:,} kept alive every {KEEPALIVE_EVERY_S:g} s", flush=True)
            leases = bench_leases(args, base_dir)
        if args.only in ("all", "locks"):
            print(f"locks: {args.locks:,} held, {META_BYTES} B of owner metadata each", flush=True)
            locks = bench_locks(args, base_dir)
    load_after = os.getloadavg()
    heading = (
        f"dlm scale benchmark ({args.label}): 3 members on 127.0.0.1, fsync on; "
        f"{os.cpu_count()} CPUs; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; "
        f"{time.monotonic() - started:.0f} s"
    )
    table = render(floor, leases, locks)
    print()
    print(heading)
    print(table)
    notes = [
        f"{name}: {part.error}"
        for name, part in (("leases", leases), ("locks", locks))
        if part and part.error
    ]
    for note in notes:
        print(note)
    everything = {
        "label": args.label,
        "floor": asdict(floor),
        "settings": vars(args),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "leases": asdict(leases) if leases else None,
        "locks": asdict(locks) if locks else None,
    }
    if args.results:
        from bench import report

        written = report.write_scale_results(
            args.results,
            args.name,
            heading=heading,
            table=table,
            notes=notes,
            everything=everything,
            leases=leases,
            locks=locks,
        )
        print("results: " + ", ".join(written))
    return 0


if __name__ == "__main__":
    # Worker processes are spawned, so their functions must belong to bench.scale.
    from bench import scale  # noqa: PLW0406

    raise SystemExit(scale.main())
