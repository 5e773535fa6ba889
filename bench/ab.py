"""A/B of dlm's members: this checkout beside another revision (or this one with other
settings), same load generator, same run, cells interleaved.

What each optimisation step bought is a difference between two trees, and on a
shared 2-core machine the figures drift by 10-20 % from one minute to the next;
run one after the other, two benchmarks measure the drift as much as the change.
Here both clusters run side by side (idle while the other is measured), every
cell runs on one then the other, the order alternating, and ``--rounds`` repeats
the whole plan so the noise is visible beside the difference.

    python -m bench.ab --b-ref 2572e15^            # B: the members of that revision
    python -m bench.ab --b-ref 0.1.0               # B: the previous release (tests/compat)
    python -m bench.ab --b-env DLM_LOG_LEVEL=warning   # B: this checkout, no audit lines

The other revision's ``dlm`` package comes from ``git archive`` (or the release
archive under tests/compat) into a temporary directory put first on the
members' PYTHONPATH; the load generator is always this checkout's client. Every
process is stopped by PID; nothing is written unless ``--json`` says where.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.floor import measure_floor
from bench.locks import (
    DEFAULT_SETTLE,
    LEADER_TIMEOUT_S,
    CellResult,
    Contender,
    DlmCluster,
    SystemRun,
    _client_counts,
    run_interleaved,
)

ROOT = Path(__file__).resolve().parents[1]
RELEASE_ARCHIVE = ROOT / "tests" / "compat" / "dlm-0.1.0.tar.gz"


def unpack_members(ref: str, where: Path) -> Path:
    """The ``dlm`` package of ``ref`` under ``where`` (a git revision, or ``0.1.0``)."""
    if ref == "0.1.0":
        data = RELEASE_ARCHIVE.read_bytes()
    else:
        try:
            data = subprocess.run(
                ["git", "archive", "--format=tar", ref, "dlm"],
                cwd=ROOT,
                capture_output=True,
                check=True,
                timeout=60,
            ).stdout
        except subprocess.CalledProcessError as exc:
            message = exc.stderr.decode(errors="replace").strip()
            raise SystemExit(f"bench.ab: cannot read {ref!r} from git: {message}") from None
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(where, filter="data")
    return where


def _env_pairs(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"bench.ab: --a-env/--b-env want NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def member_env(code: Path | None, extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra}
    if code is not None:
        env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def describe(ref: str | None, env: dict[str, str]) -> str:
    parts = [ref or "this checkout"]
    parts += [f"{k}={v}" for k, v in env.items()]
    return " ".join(parts)


def _median(cells: list[CellResult], pick: str) -> float:
    values = []
    for cell in cells:
        if pick == "pairs":
            values.append(cell.pairs_per_s)
        elif pick == "p50":
            values.append(cell.pair.p50_ms)
        else:
            values.append(cell.server_cpu_per_pair_us)
    return statistics.median(values) if values else float("nan")


def render(a: SystemRun, b: SystemRun) -> str:
    keys = sorted({(c.hot, c.clients) for c in a.cells}, key=lambda k: (k[0], k[1]))
    lines = [
        "| cell | figure | A | B | B/A | A per round | B per round |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for hot, clients in keys:
        label = f"{'hot key' if hot else 'distinct keys'}, c={clients}"
        cells_a = [c for c in a.cells if (c.hot, c.clients) == (hot, clients)]
        cells_b = [c for c in b.cells if (c.hot, c.clients) == (hot, clients)]
        for pick, name, fmt in (
            ("pairs", "pairs/s", "{:,.0f}"),
            ("p50", "pair p50 (ms)", "{:.2f}"),
            ("cpu", "server CPU/pair (us)", "{:,.0f}"),
        ):
            va, vb = _median(cells_a, pick), _median(cells_b, pick)
            ratio = vb / va if va else float("nan")

            def rounds(cells: list[CellResult], pick: str = pick, fmt: str = fmt) -> str:
                return ", ".join(fmt.format(_median([c], pick)) for c in cells)

            lines.append(
                f"| {label} | {name} | {fmt.format(va)} | {fmt.format(vb)} | {ratio:.2f} "
                f"| {rounds(cells_a)} | {rounds(cells_b)} |"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab",
        description="dlm's members from two trees (or two settings), interleaved, same run.",
    )
    parser.add_argument("--a-ref", default=None, help="A's revision (default: this checkout)")
    parser.add_argument("--b-ref", default=None, help="B's revision, or 0.1.0 (the release)")
    parser.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--clients", type=_client_counts, default=[1, 64], help="e.g. 1,64")
    parser.add_argument(
        "--keys", choices=("both", "distinct", "hot"), default="distinct", help="which cells run"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="window per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="before each window")
    parser.add_argument("--rounds", type=int, default=3, help="times the whole plan runs")
    parser.add_argument(
        "--settle",
        type=float,
        default=DEFAULT_SETTLE,
        help="seconds of unrecorded load on each fresh cluster before round 1 (0: none)",
    )
    parser.add_argument(
        "--failovers", type=int, default=0, help="kill -9 of the leader, per side, after the cells"
    )
    parser.add_argument("--json", metavar="FILE", help="also write every cell to FILE")
    args = parser.parse_args(argv)
    if args.a_ref is None and args.b_ref is None and args.a_env == args.b_env:
        parser.error("A and B are the same: give --b-ref or --b-env")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    # What run_interleaved and cell_plan read (the failovers run once, after the rounds).
    args.procs, args.model = 1, "loop"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    a_env, b_env = _env_pairs(args.a_env), _env_pairs(args.b_env)
    runs = (
        SystemRun(f"A: {describe(args.a_ref, a_env)}", kind="dlm"),
        SystemRun(f"B: {describe(args.b_ref, b_env)}", kind="dlm"),
    )
    with tempfile.TemporaryDirectory(prefix="dlm-ab-") as base:
        base_dir = Path(base)
        floor = measure_floor(str(base_dir))
        print(
            f"floor: fsync p50 {floor.fsync.p50_ms:.3f} ms; loopback RTT p50 "
            f"{floor.rtt.p50_ms:.3f} ms; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        clusters = []
        try:
            for side, (ref, env, run) in enumerate(
                ((args.a_ref, a_env, runs[0]), (args.b_ref, b_env, runs[1]))
            ):
                code = unpack_members(ref, base_dir / f"code{side}") if ref else None
                cluster = DlmCluster(str(base_dir / f"dlm{side}"))
                cluster.env = member_env(code, env)
                os.makedirs(cluster.base_dir, exist_ok=True)
                clusters.append(cluster)
                cluster.spawn_all()
                cluster.leader_index(LEADER_TIMEOUT_S)
                print(f"{run.system}: 3 nodes up on {', '.join(cluster.addrs)}", flush=True)
            contenders = [
                Contender(run, cluster, cluster.addrs)
                for run, cluster in zip(runs, clusters, strict=True)
            ]
            for round_no in range(args.rounds):
                print(f"round {round_no + 1} of {args.rounds}", flush=True)
                # Only the first round settles the fresh clusters (bench.locks --settle).
                settle = args.settle if round_no == 0 else 0.0
                cells_only = argparse.Namespace(**{**vars(args), "failovers": 0, "settle": settle})
                # run_interleaved alternates the order from cell to cell, starting again with
                # each round; swapping the starter too means no side is always measured second.
                run_interleaved(contenders[:: 1 if round_no % 2 == 0 else -1], cells_only)
            if args.failovers:
                failovers_only = {**vars(args), "clients": [], "settle": 0.0}
                run_interleaved(contenders, argparse.Namespace(**failovers_only))
        finally:
            for cluster in clusters:
                cluster.stop()
    print()
    for run in runs:
        if run.error:
            print(f"{run.system}: {run.error}")
    print(f"A = {runs[0].system}; B = {runs[1].system}; medians over {args.rounds} rounds")
    print(render(*runs))
    for run in runs:
        if run.failover_s:
            ok = sorted(s for s in run.failover_s if s is not None)
            median = f"{run.failover_median:.2f} s" if run.failover_median is not None else "-"
            print(
                f"{run.system}: kill -9 leader -> next acquire, median {median} over "
                f"{len(ok)} (timeouts {len(run.failover_s) - len(ok)}); "
                + ", ".join(f"{s:.2f}" for s in ok)
            )
    if args.json:
        with open(args.json, "w") as out:
            everything = {
                run.system: {"cells": [asdict(c) for c in run.cells], "failover_s": run.failover_s}
                for run in runs
            }
            json.dump(everything, out, indent=1)
    return 0 if not any(run.error for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
