"""Backups and snapshots at 10,000 and 100,000 held locks: how long the leader stalls.

Run with ``python -m bench.backup`` (``--code DIR`` runs the members from another
checkout, e.g. the commit before images were built off the event loop). Not a test:
it prints what it measured and writes bench/results/backup.md and .json.

A 3-member cluster (fsync on) runs with the default ``DLM_SNAPSHOT_EVERY`` (10,000
entries); load processes take locks (100 bytes of owner metadata each, under a
hundred long leases) up to ``--small`` and then ``--large`` locks. A probe process
asks the leader for a key (stale: answered from its own state at once) every 5 ms
the whole time. Measured at each size:

* the periodic snapshot: the probe's longest answer from 1 s before the leader's
  ``snapshot_taken`` of the last snapshot of the fill until 3 s after it (the load
  processes are still taking locks then, as in production; the probe's p99 over the
  fill is given beside it);
* a backup (``dlm snapshot save``, when the members' code has it): taken after the
  fill, with only the probe running; the probe's longest answer while it ran, the
  file's size, and the command's wall time.

Elections during the run are counted (the term at the end against the start).
Every process started here is stopped by its PID; data lives in a temporary
directory that is removed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.floor import percentile
from bench.locks import DEFAULT_RESULTS, DlmCluster
from bench.scale import _fill, _log_events, _ordered, _probe_process

SMALL = 10_000
LARGE = 100_000
STALL_BEFORE_S = 1.0
STALL_AFTER_S = 3.0
CHURN_LIMIT_S = 180.0


class _Members(DlmCluster):
    """DlmCluster whose members run the ``dlm`` package found in ``code`` (None: ours)."""

    def __init__(self, base_dir: str, code: str | None) -> None:
        super().__init__(base_dir)
        self.code = code

    def _command(self, i: int) -> list[str]:
        command = super()._command(i)
        if self.code is None:
            return command
        boot = f"import sys, runpy; sys.path.insert(0, {self.code!r}); "
        boot += "runpy.run_module('dlm', run_name='__main__', alter_sys=True)"
        return [sys.executable, "-c", boot, *command[3:]]


@dataclass
class SizeFigures:
    locks: int
    fill_seconds: float = 0.0
    snapshot_index: int = 0
    snapshot_bytes: int = 0
    snapshot_image_ms: float | None = None
    snapshot_fork_ms: float | None = None
    snapshot_stall_ms: float = 0.0
    probe_p99_during_fill_ms: float = 0.0
    quiet_snapshot_index: int = 0
    quiet_snapshot_stall_ms: float = 0.0
    """The probe's longest answer around a periodic snapshot taken while one client takes
    and releases a lock in a loop (no fill load)."""
    probe_p99_quiet_ms: float = 0.0
    quiet_snapshot_fork_ms: float | None = None
    backup_stall_ms: float | None = None
    backup_seconds: float | None = None
    backup_bytes: int | None = None
    backup_index: int | None = None
    backup_fork_ms: float | None = None
    backup_error: str | None = None
    elections_during_fill: int = 0
    leader_changed: bool = False
    """The leader at the end of the fill is not the one the probe asked during it: the
    periodic snapshot's figure is then a follower's."""


@dataclass
class Figures:
    code: str
    sizes: list[SizeFigures] = field(default_factory=list)
    elections: int = 0
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _window_max(samples: list[tuple[float, float]], start: float, end: float) -> float:
    near = [lat for wall, lat in samples if start <= wall <= end]
    return max(near, default=0.0) * 1e3


def _drain(results: Any, into: list[tuple[float, float]]) -> None:
    while True:
        try:
            into.extend(results.get_nowait())
        except Exception:
            return


def _churn_until_snapshot(address: str, log: str, since: float) -> dict[str, Any] | None:
    """One client takes and releases a lock in a loop at the leader until its log says it
    took a snapshot (at most CHURN_LIMIT_S); that ``snapshot_taken`` event."""
    from dlm.client import Client
    from dlm.client.errors import DlmError

    deadline = time.monotonic() + CHURN_LIMIT_S
    with Client([address], timeout=30.0) as client:
        lease = client.open_lease(600_000)
        while time.monotonic() < deadline:
            try:
                for _ in range(100):
                    client.acquire(lease, "bench/churn")
                    client.release(lease, "bench/churn")
            except DlmError:
                lease = client.open_lease(600_000)  # lost in an election the stall caused
            taken = [e for e in _log_events(log, "snapshot_taken") if e["ts"] >= since]
            if taken:
                return taken[0]
    return None


def run(args: argparse.Namespace, base_dir: str) -> Figures:
    figures = Figures(code=args.code or "this tree")
    figures.load_before = os.getloadavg()
    cluster = _Members(os.path.join(base_dir, "cluster"), args.code)
    os.makedirs(cluster.base_dir)
    ctx = multiprocessing.get_context("spawn")
    samples: list[tuple[float, float]] = []
    probe: Any = None
    probe_stop = ctx.Event()
    probe_results = ctx.Queue()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    try:
        cluster.start()
        term_before = cluster.max_term()
        endpoints = _ordered(cluster)
        leader = cluster.leader_index(30)
        probe = ctx.Process(
            target=_probe_process, args=(endpoints[0], probe_stop, probe_results), daemon=True
        )
        probe.start()
        prefix = f"bench/backup/{os.getpid()}"
        taken = 0
        for size in (args.small, args.large):
            out = SizeFigures(locks=size)
            term_at_start = cluster.max_term()
            fill_started = time.time()
            seconds, errors = _fill(
                ctx, endpoints, taken, size - taken, procs=args.procs, prefix=prefix
            )
            fill_ended = time.time()
            taken = size
            out.fill_seconds = seconds
            out.elections_during_fill = cluster.max_term() - term_at_start
            probed_leader = leader
            leader = cluster.leader_index(30)
            out.leader_changed = leader != probed_leader
            leader_log = os.path.join(cluster.base_dir, f"{cluster.names[probed_leader]}.log")
            print(f"  {size:,} locks held ({errors} errors, {seconds:.1f} s)", flush=True)
            # Let the last snapshot of the fill finish, then measure the backup alone.
            time.sleep(STALL_AFTER_S)
            if out.leader_changed:
                # The backup goes to the new leader: the probe must ask it, not the old one.
                probe_stop.set()
                samples.extend(probe_results.get(timeout=60))
                probe.join(timeout=30)
                probe_stop = ctx.Event()
                probe = ctx.Process(
                    target=_probe_process,
                    args=(cluster.addrs[leader], probe_stop, probe_results),
                    daemon=True,
                )
                probe.start()
                time.sleep(1.0)
            started_wall, started = time.time(), time.monotonic()
            path = os.path.join(base_dir, f"backup-{size}.dlm")
            if args.backup:
                proc = subprocess.run(
                    [sys.executable, "-m", "dlm", "snapshot", "save", path, "--json"],
                    env={**env, "DLM_CLUSTER": ",".join(endpoints)},
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
                ended_wall = time.time()
                if proc.returncode == 0:
                    report = json.loads(proc.stdout)
                    out.backup_seconds = time.monotonic() - started
                    out.backup_bytes = int(report["bytes"])
                    out.backup_index = int(report["index"])
                else:
                    out.backup_error = (proc.stderr or proc.stdout).strip()[:300]
                time.sleep(1.0)
            quiet_started = time.time()
            leader_now_log = os.path.join(cluster.base_dir, f"{cluster.names[leader]}.log")
            quiet_taken = _churn_until_snapshot(
                cluster.addrs[leader], leader_now_log, quiet_started
            )
            time.sleep(STALL_AFTER_S)
            # The probe reports its samples when stopped: restart it (at the leader) to read them.
            probe_stop.set()
            samples.extend(probe_results.get(timeout=60))
            probe.join(timeout=30)
            probe_stop = ctx.Event()
            probe = ctx.Process(
                target=_probe_process,
                args=(cluster.addrs[leader], probe_stop, probe_results),
                daemon=True,
            )
            probe.start()
            if args.backup:
                out.backup_stall_ms = _window_max(samples, started_wall, ended_wall)
                backup_log = os.path.join(cluster.base_dir, f"{cluster.names[leader]}.log")
                for saved in _log_events(backup_log, "snapshot_saved"):
                    if saved.get("index") == out.backup_index and "fork_ms" in saved:
                        out.backup_fork_ms = float(saved["fork_ms"])
            snaps = [
                e
                for e in _log_events(leader_log, "snapshot_taken")
                if fill_started <= e["ts"] <= fill_ended
            ]
            if snaps:
                last = snaps[-1]
                out.snapshot_index = int(last["index"])
                out.snapshot_stall_ms = _window_max(
                    samples, last["ts"] - STALL_BEFORE_S, last["ts"] + STALL_AFTER_S
                )
                for event in ("snapshot_written", "snapshot_saved"):
                    for written in _log_events(leader_log, event):
                        if written.get("index") == out.snapshot_index and "term" not in written:
                            out.snapshot_bytes = int(written["bytes"])
                            image_ms = written.get("image_ms")
                            out.snapshot_image_ms = None if image_ms is None else float(image_ms)
                            fork_ms = written.get("fork_ms")
                            out.snapshot_fork_ms = None if fork_ms is None else float(fork_ms)
            if quiet_taken is not None:
                out.quiet_snapshot_index = int(quiet_taken["index"])
                at = float(quiet_taken["ts"])
                out.quiet_snapshot_stall_ms = _window_max(
                    samples, at - STALL_BEFORE_S, at + STALL_AFTER_S
                )
                quiet = sorted(lat for wall, lat in samples if quiet_started <= wall < at)
                out.probe_p99_quiet_ms = percentile(quiet, 0.99) * 1e3 if quiet else 0.0
                for written in _log_events(leader_now_log, "snapshot_written"):
                    if written.get("index") == out.quiet_snapshot_index and "fork_ms" in written:
                        out.quiet_snapshot_fork_ms = float(written["fork_ms"])
            fill = sorted(lat for wall, lat in samples if fill_started <= wall <= fill_ended)
            out.probe_p99_during_fill_ms = percentile(fill, 0.99) * 1e3 if fill else 0.0
            print(f"  {asdict(out)}", flush=True)
            figures.sizes.append(out)
        figures.elections = cluster.max_term() - term_before
    finally:
        probe_stop.set()
        if probe is not None:
            probe.join(timeout=30)
            if probe.is_alive():
                probe.kill()
        cluster.stop()
        figures.load_after = os.getloadavg()
    return figures


def render(figures: Figures) -> str:
    lines = [
        f"members' code: {figures.code}; load average {figures.load_before[0]:.1f} before, "
        f"{figures.load_after[0]:.1f} after; elections: {figures.elections}",
        "",
        "| locks | elections during the fill | periodic snapshot during the fill: longest "
        "probe answer | probe p99 during the fill | periodic snapshot, one client: longest "
        "probe answer (fork) | probe p99, one client "
        "| image built off the loop in (fork) | snapshot bytes | backup: longest probe answer "
        "(fork) | backup time | backup bytes |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in figures.sizes:
        image = (
            "on the loop"
            if s.snapshot_image_ms is None
            else f"{s.snapshot_image_ms:,.0f} ms ({s.snapshot_fork_ms or 0:.1f} ms)"
        )
        if s.backup_error is not None:
            backup = ("(no backup: " + s.backup_error.splitlines()[-1][:60] + ")", "-", "-")
        elif s.backup_stall_ms is None:
            backup = ("-", "-", "-")
        else:
            backup = (
                f"{s.backup_stall_ms:,.0f} ms ({s.backup_fork_ms or 0:.1f} ms)",
                f"{s.backup_seconds or 0:.2f} s",
                f"{(s.backup_bytes or 0) / 1e6:.1f} MB",
            )
        moved = " (leader changed: a follower's)" if s.leader_changed else ""
        quiet_fork = (
            "on the loop"
            if s.quiet_snapshot_fork_ms is None
            else f"fork {s.quiet_snapshot_fork_ms:.1f} ms"
        )
        lines.append(
            f"| {s.locks:,} | {s.elections_during_fill} "
            f"| {s.snapshot_stall_ms:,.0f} ms (index {s.snapshot_index:,}){moved} "
            f"| {s.probe_p99_during_fill_ms:,.1f} ms "
            f"| {s.quiet_snapshot_stall_ms:,.0f} ms ({quiet_fork}, index "
            f"{s.quiet_snapshot_index:,}) | {s.probe_p99_quiet_ms:,.1f} ms | {image} "
            f"| {s.snapshot_bytes / 1e6:.1f} MB | {backup[0]} | {backup[1]} | {backup[2]} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.backup", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--small", type=int, default=SMALL)
    parser.add_argument("--large", type=int, default=LARGE)
    parser.add_argument("--procs", type=int, default=2, help="load processes")
    parser.add_argument("--code", default=None, help="run the members from this checkout")
    parser.add_argument(
        "--no-backup", dest="backup", action="store_false", help="the members cannot take one"
    )
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR", help="'' to skip")
    parser.add_argument("--name", default="backup")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dlm-backup-", dir=args.data_dir) as base_dir:
        figures = run(args, base_dir)
    table = render(figures)
    print()
    print(table)
    if args.results:
        os.makedirs(args.results, exist_ok=True)
        with open(os.path.join(args.results, f"{args.name}.md"), "w") as f:
            f.write(f"# Backup and snapshot stalls\n\n{table}\n")
        with open(os.path.join(args.results, f"{args.name}.json"), "w") as f:
            json.dump(asdict(figures), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
