"""What tracing costs (issue 30): absent, installed but off, and on.

    python -m bench.tracing [--runs 21] [--pairs 300] [--results bench/results]

For each mode, a fresh 3-member cluster from dlm.testing (127.0.0.1, fsync on, client
secret) started with the mode's environment, so the members run in the mode too, and:

- the start-up of `dlm exec KEY -- true` (fork to exit, median of ``--runs``, a fresh key
  each run), as a cron job pays it;
- the time of one lock pair from Python (``with client.lock(key): pass``: open a lease,
  acquire, release; median of ``--pairs``, one client, in a child process of the mode).

The modes:

- **absent**: the extra not installed. An OTLP endpoint is named (the worst case:
  configured, then not found), and a directory first on PYTHONPATH holds an
  ``opentelemetry`` package that refuses to import, as if nothing were installed;
- **off**: installed, no endpoint named (no TRACEPARENT either: a job that traces nothing);
- **off+TRACEPARENT**: installed, no endpoint, the job's TRACEPARENT set: the client
  passes it on, the members record the spans and drop them;
- **on**: installed, the endpoint of an OTLP receiver started here (tests/otlp_receiver.py,
  which decodes every export as a backend would), TRACEPARENT set: the command's span is
  sent before it exits, the members export theirs in batches.

The machine, its load and the time are in the heading: with 2 CPUs shared, the
figures move by a few ms from run to run; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dlm.testing

ROOT = Path(__file__).resolve().parent.parent
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
RUN_TIMEOUT_S = 60.0
MODES = ("absent", "off", "off+TRACEPARENT", "on")

_PAIRS = """
import json, statistics, sys, time
import dlm
pairs = int(sys.argv[1])
samples = []
with dlm.Client(timeout="10s") as client:
    for i in range(pairs + 10):
        start = time.perf_counter()
        with client.lock(f"bench/tracing/pair-{i}", ttl="30s", wait="5s"):
            pass
        if i >= 10:  # the first pairs warm the connections up
            samples.append((time.perf_counter() - start) * 1000)
traced = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
print(json.dumps({"median_ms": statistics.median(samples), "otel_modules": len(traced)}))
"""

_ABSENT_PACKAGE = 'raise ImportError("opentelemetry is not installed (bench.tracing: absent)")\n'


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


@contextmanager
def _receiver() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT))
    from tests.otlp_receiver import OtlpReceiver

    with OtlpReceiver() as receiver:
        yield receiver


def _mode_env(mode: str, scratch: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEPARENT"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if mode == "absent":
        shadow = scratch / "absent"
        (shadow / "opentelemetry").mkdir(parents=True, exist_ok=True)
        (shadow / "opentelemetry" / "__init__.py").write_text(_ABSENT_PACKAGE)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow), env.get("PYTHONPATH")]))
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    elif mode == "off+TRACEPARENT":
        env["TRACEPARENT"] = TRACEPARENT
    elif mode == "on":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        env["TRACEPARENT"] = TRACEPARENT
    return env


def _time_exec(env: dict[str, str], key: str, cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "dlm", "exec", "--lock", key, "--", "true"],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    elapsed = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"dlm exec failed ({proc.returncode}): {proc.stderr.decode()[-300:]}")
    return elapsed


def measure_mode(mode: str, runs: int, pairs: int, scratch: Path, endpoint: str) -> dict[str, Any]:
    scratch.mkdir(parents=True, exist_ok=True)
    env = _mode_env(mode, scratch, endpoint)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the members start with the mode's environment
    try:
        with dlm.testing.cluster(3, fsync=True, base_dir=str(scratch)) as cluster:
            env |= cluster.env
            exec_ms = [
                _time_exec(env, f"bench/tracing/exec-{i}", str(scratch)) for i in range(runs)
            ]
            out = subprocess.run(
                [sys.executable, "-c", _PAIRS, str(pairs)],
                env=env,
                cwd=str(scratch),
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S * 5,
                check=True,
            )
            pair = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {
        "mode": mode,
        "exec_median_ms": statistics.median(exec_ms),
        "exec_p90_ms": statistics.quantiles(exec_ms, n=10)[-1] if len(exec_ms) > 1 else exec_ms[0],
        "pair_median_ms": pair["median_ms"],
        "opentelemetry_loaded_by_client": pair["otel_modules"] > 0,
    }


_SDK_IMPORT = (
    "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter"
)


def sdk_import_ms(runs: int = 11) -> float:
    """What importing the SDK and its OTLP/HTTP exporter adds to a process's start (the
    median of ``runs`` interpreters that import them, less that of ``runs`` that do not)."""

    def median_ms(code: str) -> float:
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, timeout=RUN_TIMEOUT_S)
            samples.append((time.perf_counter() - start) * 1000)
        return statistics.median(samples)

    return median_ms(_SDK_IMPORT) - median_ms("pass")


def render(rows: list[dict[str, Any]], heading: str, spans: int, sdk_ms: float) -> str:
    lines = [
        "# What tracing costs",
        "",
        heading,
        "",
        "| mode | `dlm exec KEY -- true`, median (p90) | lock pair from Python, median "
        "| client loaded OpenTelemetry |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['mode']} | {row['exec_median_ms']:.1f} ms ({row['exec_p90_ms']:.1f} ms) "
            f"| {row['pair_median_ms']:.2f} ms "
            f"| {'yes' if row['opentelemetry_loaded_by_client'] else 'no'} |"
        )
    lines += [
        "",
        f"The receiver of the `on` rows took {spans} spans. Importing the SDK and its "
        f"OTLP/HTTP exporter alone adds {sdk_ms:.0f} ms to a process's start (median of "
        "11 interpreters, less that of 11 that import nothing): most of what `on` adds "
        "to `dlm exec`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--results", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--name", default="tracing")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="the modes to run, in this order (the first cluster of a run starts colder)",
    )
    args = parser.parse_args(argv)
    before = _load_average()
    scratch = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    rows: list[dict[str, Any]] = []
    try:
        with _receiver() as receiver:
            for mode in args.modes.split(","):
                row = measure_mode(mode, args.runs, args.pairs, scratch / mode, receiver.endpoint)
                rows.append(row)
                print(
                    f"{mode:18} exec {row['exec_median_ms']:7.1f} ms   "
                    f"pair {row['pair_median_ms']:6.2f} ms",
                    flush=True,
                )
            spans = len(receiver.spans)
        sdk_ms = sdk_import_ms()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    heading = (
        f"3 members from dlm.testing on 127.0.0.1, fsync on, client secret; a fresh cluster "
        f"per mode; {args.runs} `dlm exec` runs and {args.pairs} pairs per mode; "
        f"{os.cpu_count()} CPUs; load average {before} before, {_load_average()} after; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    table = render(rows, heading, spans, sdk_ms)
    print("\n" + table)
    os.makedirs(args.results, exist_ok=True)
    Path(args.results, f"{args.name}.md").write_text(table)
    Path(args.results, f"{args.name}.json").write_text(
        json.dumps(
            {"heading": heading, "rows": rows, "spans_received": spans, "sdk_import_ms": sdk_ms},
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
