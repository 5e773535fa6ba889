"""The one-page report of a chaos run, and its availability plot.

``text(result)`` is the page: the schedule and how to replay it, every fault
with its target and window, faults by kind, operations by kind and outcome,
the store's figures, unavailability windows (when the prober could not take
its lock), lock unavailability after each leader kill, how soon each key was
granted again after its holder died, and the checker's verdict.
``plot(result, path)`` draws the prober's success rate over time with the
fault windows marked; matplotlib is imported there only (`make chaos` installs
it; `make test` does without, and its short runs skip the plot).
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.chaos.runner import RunResult

UNAVAILABLE_MIN_S = 0.3
"""Gaps between successful probes up to this long are the probe's own rhythm (one every
100 ms, each a round trip or two), not an outage."""


def unavailability(probes: list[tuple[float, float, bool]]) -> list[tuple[float, float]]:
    """Windows (start, end) in which no probe succeeded: from one success to the next,
    when they are more than UNAVAILABLE_MIN_S apart."""
    done = sorted(ret for _, ret, ok in probes if ok)
    return [(a, b) for a, b in itertools.pairwise(done) if b - a > UNAVAILABLE_MIN_S]


def after(probes: list[tuple[float, float, bool]], moment: float) -> float | None:
    """Seconds from ``moment`` until a probe sent after it succeeded."""
    done = [ret for call, ret, ok in probes if ok and call >= moment]
    return min(done) - moment if done else None


def leader_kill_gaps(result: RunResult) -> list[float]:
    gaps = []
    for fault in result.faults:
        if fault["kind"] == "kill-leader" and not str(fault["target"]).startswith("skipped"):
            gap = after(result.probes, fault["start"])
            if gap is not None:
                gaps.append(gap)
    return gaps


def text(result: RunResult) -> str:
    s = result.schedule
    v = result.verdict
    t0 = result.started
    verdict = "PASS" if v.ok else f"FAIL ({len(v.violations)} violations)"
    lines = [
        f"dlm chaos run: seed {s.seed} ({s.profile}), {s.size} members, "
        f"{result.ended - result.started:.1f}s: {verdict}",
        f"replay: {s.replay_hint()}",
        "",
        "faults (times from the start of the run):",
    ]
    for f in result.faults:
        line = (
            f"  +{f['start'] - t0:6.1f}s  {f['kind']:<17} {str(f['target'])[:40]:<40} "
            f"{f['end'] - f['start']:5.1f}s"
        )
        if f["kind"] == "kill-leader":
            gap = after(result.probes, f["start"])
            line += f"  lock unavailable {gap:.2f}s" if gap is not None else ""
        lines.append(line)
    by_kind = Counter(f["kind"] for f in result.faults if not str(f["target"]).startswith("skip"))
    skipped = [f["kind"] for f in result.faults if str(f["target"]).startswith("skip")]
    lines.append("faults by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
    if skipped:
        lines.append("skipped (no target at the time): " + ", ".join(skipped))
    ops = Counter((op.f, op.outcome) for op in result.history.ops)
    kinds = sorted({f for f, _ in ops})
    lines += ["", f"operations: {sum(ops.values())}"]
    for f in kinds:
        parts = ", ".join(f"{o} {ops[(f, o)]}" for o in ("ok", "fail", "unknown") if ops[(f, o)])
        lines.append(f"  {f:<8} {sum(n for (g, _), n in ops.items() if g == f):>6}  ({parts})")
    st = v.stats
    lines += [
        "",
        f"store: {st['store_accepted']} accepted, {st['store_refused']} refused; zombie "
        f"accesses (after their section ended): {st['zombie_refused']} refused, "
        f"{st['zombie_accepted']} accepted before any later holder came; final counters sum "
        f"{st['store_final_value']}",
        f"checked: {st['lock_ops_checked']} lock operations for linearizability "
        f"({st['linearizability_steps']} search steps), {st['sections']} critical sections, "
        f"{st['grants_told']} grants against the audit logs",
    ]
    windows = unavailability(result.probes)
    total = sum(b - a for a, b in windows)
    lines += ["", f"unavailability (no probe served): {len(windows)} windows, {total:.1f}s in all"]
    for a, b in windows:
        lines.append(f"  +{a - t0:6.1f}s .. +{b - t0:6.1f}s  ({b - a:.2f}s)")
    gaps = leader_kill_gaps(result)
    if gaps:
        lines.append(
            f"lock unavailability after a leader kill: median {statistics.median(gaps):.2f}s, "
            f"max {max(gaps):.2f}s ({len(gaps)} kills)"
        )
    recov = [
        f"{r.key} {r.available - max(r.died, r.healed):.2f}s" if r.available else f"{r.key} never"
        for r in result.history.recoveries
    ]
    if result.history.recoveries:
        bound = result.history.recoveries[0].bound
        lines.append(
            f"granted again after every holder was killed (bound {bound:.1f}s): " + ", ".join(recov)
        )
    lines += ["", "verdict: " + ("PASS" if v.ok else "FAIL")]
    lines += [f"  {violation}" for violation in v.violations[:30]]
    if len(v.violations) > 30:
        lines.append(f"  ... and {len(v.violations) - 30} more")
    if v.inconclusive:
        lines.append("  linearizability search gave up (budget) on: " + ", ".join(v.inconclusive))
    if result.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in result.notes]
    lines.append(f"data: {result.workdir}")
    return "\n".join(lines) + "\n"


def plot(result: RunResult, path: Path, step_s: float = 0.05) -> bool:
    """Writes the availability plot; False when matplotlib is not installed.

    The line is how long ago a probe last succeeded (sampled every ``step_s``): flat near
    the probe interval while the cluster serves, a ramp through every outage; the dots
    are each successful probe's latency; the bands are the fault windows, and the dashed
    line is when every fault had healed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t0 = result.started
    end = result.ended - t0
    done = sorted((ret - t0, 1000 * (ret - call)) for call, ret, ok in result.probes if ok)
    xs: list[float] = []
    ys: list[float] = []
    if done:
        last, i, x = done[0][0], 0, done[0][0]
        while x <= done[-1][0]:
            while i < len(done) and done[i][0] <= x:
                last = done[i][0]
                i += 1
            xs.append(x)
            ys.append(x - last)
            x += step_s
    top = max([*ys, 1.0]) * 1.25
    fig, ax = plt.subplots(figsize=(11, 3.4))
    colours = plt.get_cmap("tab20")
    kinds = sorted({f["kind"] for f in result.faults})
    for f in result.faults:
        colour = colours(kinds.index(f["kind"]) % 20)
        start, stop = f["start"] - t0, max(f["end"] - t0, f["start"] - t0 + 0.15)
        ax.axvspan(start, stop, color=colour, alpha=0.3, lw=0)
        ax.text(start, top * 0.82, f["kind"], rotation=30, fontsize=7, va="bottom")
    ax.axvline(result.healed - t0, color="black", lw=0.8, ls="--")
    ax.plot(xs, ys, color="tab:blue", lw=1.2)
    slow = ax.twinx()
    slow.scatter([t for t, _ in done], [ms for _, ms in done], s=2, color="tab:red")
    slow.set_yscale("log")
    slow.set_ylabel("probe latency, ms", color="tab:red", fontsize=8)
    ax.set_ylim(0, top)
    ax.set_xlim(0, end)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("s since a probe succeeded", color="tab:blue", fontsize=8)
    verdict = "PASS" if result.verdict.ok else "FAIL"
    ax.set_title(
        f"seed {result.schedule.seed}, {result.schedule.size} members: {verdict}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
