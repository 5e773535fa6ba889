"""Flame graphs of the members while one benchmark cell runs (py-spy, a bench-only tool).

``python -m bench.profile --clients 1`` starts a 3-member cluster, runs one
closed-loop cell of bench/locks.py on it and, meanwhile, samples the leader
and one follower with py-spy. It writes, under bench/results/profile/:
``c1-leader.svg`` and ``c1-follower.svg`` (flame graphs), the collapsed
stacks (``.txt``), and ``c1-top.md``: the functions that used the most
samples, on their own and with what they call. ``make bench`` installs
py-spy (the ``bench`` extra); py-spy needs permission to read another
process's memory (root, or ptrace allowed).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from bench.locks import DEFAULT_RESULTS, Cell, DlmCluster, Target, run_cell

RATE = 250
"""Samples per second per process."""


def _py_spy() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.path.exists(here) else shutil.which("py-spy")


def top_functions(
    collapsed: str, limit: int = 25
) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Samples in total, then (function, samples) on their own and with callees, most first."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return total, own.most_common(limit), inclusive.most_common(limit * 2)


_SCAFFOLD = (
    "runpy",
    "typer/",
    "dlm/__main__.py",
    "dlm/cli/",
    "dlm/node/runtime/main.py",
    "anyio/_core/_eventloop.py",
    "anyio/_backends/_asyncio.py",
    "asyncio/runners.py",
    "run_forever",
    "run_until_complete",
    "threading.py",
)
"""Frames every sample passes through on the way to the work (start-up, the loop's own run)."""


def render_top(title: str, collapsed: str) -> str:
    total, own, inclusive = top_functions(collapsed, limit=40)
    own = own[:25]
    inclusive = [(f, n) for f, n in inclusive if not any(s in f for s in _SCAFFOLD)][:40]
    lines = [f"### {title}: {total} samples", "", "| own | function |", "|---:|---|"]
    lines += [f"| {100 * n / max(total, 1):.1f}% | `{name}` |" for name, n in own]
    lines += ["", "| with callees | function |", "|---:|---|"]
    lines += [f"| {100 * n / max(total, 1):.1f}% | `{name}` |" for name, n in inclusive]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--hot", action="store_true", help="one hot key instead of distinct keys")
    parser.add_argument("--procs", type=int, default=1, help="load processes")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=os.path.join(DEFAULT_RESULTS, "profile"))
    args = parser.parse_args(argv)
    spy = _py_spy()
    if spy is None:
        print("py-spy is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    tag = f"c{args.clients}{'-hot' if args.hot else ''}"
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dlm-profile-") as base:
        cluster = DlmCluster(os.path.join(base, "dlm"))
        os.makedirs(cluster.base_dir)
        spies: list[tuple[str, subprocess.Popen[bytes]]] = []
        try:
            cluster.start()
            leader = cluster.leader_index(20)
            follower = next(i for i in range(len(cluster.names)) if i != leader)
            ordered = (
                cluster.addrs[leader],
                *(a for i, a in enumerate(cluster.addrs) if i != leader),
            )
            duration = str(int(args.seconds + 3))
            for role, i in (("leader", leader), ("follower", follower)):
                pid = str(cluster.procs[i].pid)  # type: ignore[union-attr]
                for fmt, suffix in (("flamegraph", "svg"), ("raw", "txt")):
                    path = os.path.join(args.out, f"{tag}-{role}.{suffix}")
                    command = [spy, "record", "--nonblocking", "-r", str(RATE), "-d", duration]
                    command += ["-f", fmt, "-o", path, "-p", pid]
                    spies.append(
                        (
                            path,
                            subprocess.Popen(
                                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                            ),
                        )
                    )
            cell = Cell(
                args.hot, args.clients, args.procs, 1.0, args.seconds, f"profile/{os.getpid()}"
            )
            result = run_cell(Target("dlm", ordered), cell, cluster.pids)
            for _, proc in spies:
                proc.wait(timeout=60)
        finally:
            for _, proc in spies:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=5)
            cluster.stop()
    summary = (
        f"{result.label}: {result.pairs_per_s:,.0f} pairs/s, pair p50 {result.pair.p50_ms:.2f} ms, "
        f"server CPU {result.server_cpu:.2f} cores ({result.server_cpu_per_pair_us:,.0f} us/pair); "
        f"load average {load[0]:.1f}; py-spy at {RATE} Hz (it slows the members a little)"
    )
    sections = [f"# Profile of the cell {result.label}", "", summary, ""]
    for role in ("leader", "follower"):
        path = os.path.join(args.out, f"{tag}-{role}.txt")
        if os.path.exists(path):
            with open(path) as f:
                sections += [render_top(role, f.read()), ""]
            sections.append(f"Flame graph: [{tag}-{role}.svg]({tag}-{role}.svg)")
            sections.append("")
    with open(os.path.join(args.out, f"{tag}-top.md"), "w") as f:
        f.write("\n".join(sections))
    print(summary)
    print(f"written under {args.out}: {tag}-leader.svg, {tag}-follower.svg, {tag}-top.md")
    return 0


if __name__ == "__main__":
    from bench import profile  # noqa: PLW0406

    raise SystemExit(profile.main())
