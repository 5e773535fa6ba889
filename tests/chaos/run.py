"""`make chaos`: run chaos schedules against real clusters and write a report per run.

``python -m tests.chaos.run --seeds START:COUNT [--profile long|short] [--results DIR]``

Each seed is one schedule (schedule.py): its run's directory under
``DIR/<time>/seed-N/`` keeps the histories, the members' logs, ``report.txt`` and
``availability.png``; ``DIR/<time>/summary.txt`` adds them up. The seed and the
command that replays it are printed before each run starts and in its report.
Exit status 1 if any run found a violation. ``--recheck DIR`` checks a finished
run's directory again and rewrites its report.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from tests.chaos import report
from tests.chaos.record import read_records
from tests.chaos.runner import ChaosRun, RunResult, judge
from tests.chaos.schedule import make_schedule


def _seeds(text: str) -> range:
    start, sep, count = text.partition(":")
    if not sep or not start.isdigit() or not count.isdigit():
        raise SystemExit(f"--seeds wants START:COUNT (two numbers), got {text!r}")
    return range(int(start), int(start) + int(count))


def run_one(seed: int, profile: str, workdir: Path) -> RunResult:
    schedule = make_schedule(seed, profile)
    print(f"seed {seed} ({profile}, {schedule.size} members): replay with "
          f"{schedule.replay_hint()}", flush=True)  # fmt: skip
    result = ChaosRun(schedule, workdir).run()
    (workdir / "report.txt").write_text(report.text(result))
    try:
        report.plot(result, workdir / "availability.png")
    except Exception as exc:  # a plot is not worth the rest of the schedules
        print(f"seed {seed}: no plot: {exc!r}", flush=True)
    # The members' data directories are large and say nothing the logs do not.
    for member in (workdir / "cluster").iterdir():
        if member.is_dir():
            shutil.rmtree(member, ignore_errors=True)
    return result


def summary(results: list[RunResult]) -> str:
    faults = Counter(
        f["kind"] for r in results for f in r.faults if not str(f["target"]).startswith("skip")
    )
    outcomes = Counter(op.outcome for r in results for op in r.history.ops)
    gaps = [g for r in results for g in report.leader_kill_gaps(r)]
    failed = [r for r in results if not r.verdict.ok]
    sizes = Counter(r.schedule.size for r in results)
    by_size = ", ".join(f"{n} of {s} members" for s, n in sorted(sizes.items()))
    lines = [
        f"{len(results)} schedules ({by_size}), "
        f"{sum(len(r.faults) for r in results)} faults, "
        f"{sum(outcomes.values())} operations checked",
        "faults by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())),
        "operations by outcome: " + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())),
        "zombie store accesses refused: "
        + str(sum(r.verdict.stats["zombie_refused"] for r in results)),
    ]
    if gaps:
        lines.append(
            f"lock unavailability after a leader kill: median {statistics.median(gaps):.2f}s, "
            f"max {max(gaps):.2f}s over {len(gaps)} kills"
        )
    lines.append(f"violations: {sum(len(r.verdict.violations) for r in results)}")
    for r in failed:
        lines.append(f"  seed {r.schedule.seed}: {r.schedule.replay_hint()}")
        lines += [f"    {v}" for v in r.verdict.violations[:10]]
    return "\n".join(lines) + "\n"


def recheck(workdir: Path, profile: str) -> int:
    """Checks a finished run's directory again (after a change to the checker, say) and
    rewrites its report and plot."""
    records = read_records(workdir / "hist" / "runner.jsonl")
    if not records:
        raise SystemExit(f"{workdir} holds no chaos run (no hist/runner.jsonl)")
    started = next((r for r in records if r["k"] == "run_started"), None)
    if started is not None:
        seed, profile = int(started["seed"]), str(started["profile"])
    elif workdir.name.startswith("seed-") and workdir.name[5:].isdigit():
        seed = int(workdir.name[5:])
    else:
        raise SystemExit(f"cannot tell the seed of {workdir}: name it seed-N")
    result = judge(make_schedule(seed, profile), workdir)
    (workdir / "report.txt").write_text(report.text(result))
    report.plot(result, workdir / "availability.png")
    print(report.text(result))
    return 0 if result.verdict.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--seeds", default="100:30", help="START:COUNT (default 100:30)")
    parser.add_argument("--profile", default="long", choices=("long", "short"))
    parser.add_argument("--results", default="chaos-results", type=Path)
    parser.add_argument("--recheck", type=Path, help="check a finished run's directory again")
    args = parser.parse_args(argv)
    if args.recheck is not None:
        return recheck(args.recheck, args.profile)
    root = args.results / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in _seeds(args.seeds):
        result = run_one(seed, args.profile, root / f"seed-{seed}")
        results.append(result)
        print(report.text(result), flush=True)
    text = summary(results)
    (root / "summary.txt").write_text(text)
    print(text)
    print(f"reports: {root}")
    return 0 if all(r.verdict.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
