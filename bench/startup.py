"""How long `dlm` takes from a shell: the cost a cron job pays on every lock.

    python -m bench.startup [--runs 21] [--cluster ADDR,...] [--zipapp dist/dlm.pyz] [--json]

Times whole processes (fork to exit, median of ``--runs``, at least 20) in
one run, so every figure stands beside ``python3 -c pass`` measured on the
same machine at the same moment:

- ``dlm --help``, ``dlm acquire`` (a fresh key each time) and
  ``dlm exec --lock k -- true`` from the venv, against a local 3-node cluster
  (started here on free 127.0.0.1 ports, fsync on, and stopped by PID at the
  end) unless ``--cluster`` names one;
- the same through the zipapp with ``python3 -I dist/dlm.pyz`` (built with
  ``make zipapp``), where cbor2 runs its pure-Python codec;
- ``etcdctl lock k -- true`` against one local etcd member, and ``flock``,
  when installed: the yardsticks of the targets (issue #29: exec within 1.5x
  etcdctl, acquire within 1.3x; ``--help`` within 60 ms; ``ssl`` never
  imported without TLS).

Then, in-process, what the pure-Python cbor2 fallback costs per frame
against its C extension, and which imports make up a run's start-up
(``python -X importtime``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MIN_RUNS = 20
HELP_TARGET_MS = 60.0
ETCD_FACTORS = {"dlm acquire": 1.3, "dlm exec -- true": 1.5}
"""Issue #29: `dlm exec --lock k -- true` within 1.5x `etcdctl lock k -- true` (one local
etcd member), `dlm acquire` within 1.3x; the zipapp's rows are shown beside them."""
ETCD_MEMBERS = 1
RUN_TIMEOUT_S = 60.0


@dataclass
class Row:
    name: str
    command: list[str]
    samples_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    """User + system time of each run, its waited-for descendants included (a loaded
    machine stretches the wall time with waits for a core; the CPU time stays)."""
    failures: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_ms) if self.cpu_ms else float("nan")

    def summary(self) -> dict[str, float]:
        return {
            "median_ms": self.median,
            "cpu_median_ms": self.cpu_median,
            "p10_ms": self.quantile(0.1),
            "p90_ms": self.quantile(0.9),
            "failures": self.failures,
        }

    def quantile(self, q: float) -> float:
        if len(self.samples_ms) < 2:
            return self.median
        cuts = statistics.quantiles(self.samples_ms, n=10, method="inclusive")
        return cuts[0] if q < 0.5 else cuts[-1]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    # Measure warm runs: bytecode cached, as on any machine after the first run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("DLM_CLUSTER", None)
    return env


def time_once(command: Sequence[str], env: dict[str, str], cwd: str) -> tuple[float, float, int]:
    """(wall ms, CPU ms, exit code) of one run.

    Popen.wait() with a timeout polls with sleeps of up to 50 ms, which would round
    every figure up to its schedule; wait4 blocks instead, and a timer kills (by PID)
    a run that hangs. wait4's usage covers the process and the descendants it waited
    for (dlm exec's guard, and CMD, which the guard reaps).
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watchdog = threading.Timer(RUN_TIMEOUT_S, proc.kill)
    watchdog.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
        wall_ms = (time.perf_counter() - start) * 1000.0
    finally:
        watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall_ms, (usage.ru_utime + usage.ru_stime) * 1000.0, proc.returncode


def measure(rows: list[Row], runs: int, env: dict[str, str], cwd: str, expect_ok: bool) -> None:
    """Interleaves the commands run by run, so load drifts hit every row alike."""
    for row in rows:  # one warm-up each: pyc files, page cache
        time_once(_fresh(row.command, -1), env, cwd)
    for i in range(runs):
        for row in rows:
            ms, cpu_ms, code = time_once(_fresh(row.command, i), env, cwd)
            if code != 0 and expect_ok:
                row.failures += 1
            else:
                row.samples_ms.append(ms)
                row.cpu_ms.append(cpu_ms)


def _fresh(command: list[str], i: int) -> list[str]:
    """``{n}`` in an argument becomes a per-run number (a fresh key for acquire)."""
    tag = f"{os.getpid()}-{i + 1}"
    return [part.replace("{n}", tag) for part in command]


# ---------------------------------------------------------------------------
# Clusters
# ---------------------------------------------------------------------------


def start_dlm(base: str) -> Any:
    from bench.locks import DlmCluster

    cluster = DlmCluster(os.path.join(base, "dlm"), 3)
    os.makedirs(cluster.base_dir)
    try:
        cluster.start()
        cluster.wait_all_agree(20.0)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_etcd(base: str) -> Any | None:
    if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
        return None
    from bench.etcd import EtcdCluster

    cluster = EtcdCluster(os.path.join(base, "etcd"), ETCD_MEMBERS)
    os.makedirs(cluster.base_dir)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


# ---------------------------------------------------------------------------
# In-process figures
# ---------------------------------------------------------------------------


def cbor_costs() -> dict[str, float]:
    """Microseconds per encode and decode of a typical client frame, C and pure Python."""
    from cbor2 import _decoder, _encoder

    frame = {
        "t": "acquire",
        "id": 7,
        "lease": "k3j9x0c2m4p8q1z7",
        "seq": 0x3FFF_FFFF_FFFF_FFF1,
        "key": "nightly-backup",
        "wait": False,
        "limit": 1,
        "meta": {"host": "build-07", "user": "ci", "pid": "41234", "cmd": "/usr/bin/backup.sh"},
    }
    out: dict[str, float] = {}
    variants: list[tuple[str, Callable[[Any], bytes], Callable[[bytes], Any]]] = [
        ("pure", _encoder.dumps, _decoder.loads)
    ]
    try:
        import _cbor2  # type: ignore[import-not-found]

        variants.insert(0, ("c", _cbor2.dumps, _cbor2.loads))
    except ImportError:
        pass
    for name, dumps, loads in variants:
        body = dumps(frame)
        assert loads(body) == frame
        out[f"{name}_encode_us"] = _per_op_us(functools.partial(dumps, frame))
        out[f"{name}_decode_us"] = _per_op_us(functools.partial(loads, body))
    out["frame_bytes"] = float(len(_encoder.dumps(frame)))
    return out


def _per_op_us(op: Callable[[], Any], number: int = 2000) -> float:
    return min(timeit.repeat(op, number=number, repeat=5)) / number * 1e6


# Port 1 refuses at once: the acquire runs its whole import path, then exits 69.
BREAKDOWN_LINES = (
    ("acquire", "k", "--cluster", "127.0.0.1:1", "--timeout", "50ms"),
    ("exec", "--lock", "k", "--cluster", "127.0.0.1:1", "--timeout", "50ms", "--", "true"),
    ("--help",),
)
# The modules that matter, and those the fast path keeps out (listed only if imported).
IMPORTS_OF_INTEREST = (
    "typer", "dlm.cli.app", "dlm.cli.fastpath", "dlm.cli.ops", "dlm.cli.exec_cmd",
    "dlm.client.core", "dlm.client.sync", "dlm.wire", "dlm.cbor_codec", "_cbor2", "cbor2", "typing",
    "dataclasses", "re", "socket", "subprocess", "json", "rich", "asyncio", "ssl",
)  # fmt: skip


def import_breakdown(
    python: str, args: Sequence[str], env: dict[str, str], cwd: str
) -> list[tuple[str, float]]:
    """Cumulative import time (ms) of the modules that matter, for one command line."""
    proc = subprocess.run(
        [python, "-X", "importtime", "-m", "dlm", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    found: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line.split("|")
        name = parts[-1].strip()
        if name in IMPORTS_OF_INTEREST:
            found[name] = int(parts[1]) / 1000.0
    return [(name, found[name]) for name in IMPORTS_OF_INTEREST if name in found]


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def real_python3() -> str:
    """The python3 a user's shell would run, past any version-manager shim (a pyenv shim
    is a shell script that costs ~150 ms, which is the shim's cost, not ours)."""
    found = shutil.which("python3")
    if found is None:
        return sys.executable
    proc = subprocess.run(
        [found, "-I", "-c", "import sys; print(sys.executable)"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    path = proc.stdout.strip()
    return path if proc.returncode == 0 and path else found


def build_rows(
    dlm_cmd: list[str], zip_cmd: list[str] | None, members: str, etcd: Any | None
) -> list[Row]:
    python = sys.executable
    system_python = real_python3()
    rows = [
        Row("python -c pass (venv)", [python, "-c", "pass"]),
        Row("python3 -I -c pass", [system_python, "-I", "-c", "pass"]),
        Row("dlm --help", [*dlm_cmd, "--help"]),
        Row("dlm acquire", [*dlm_cmd, "--cluster", members, "acquire", "b-{n}", "--ttl", "2s"]),
        Row("dlm exec -- true", [*dlm_cmd, "--cluster", members, "exec", "--lock", "k", "--",
                                 "true"]),
    ]  # fmt: skip
    if zip_cmd is not None:
        rows += [
            Row("zipapp --help", [*zip_cmd, "--help"]),
            Row("zipapp acquire", [*zip_cmd, "--cluster", members, "acquire", "z-{n}", "--ttl",
                                   "2s"]),
            Row("zipapp exec -- true", [*zip_cmd, "--cluster", members, "exec", "--lock", "k",
                                        "--", "true"]),
        ]  # fmt: skip
    if etcd is not None:
        endpoints = ",".join(f"http://{a}" for a in etcd.client_addrs)
        rows.append(Row("etcdctl lock k -- true", ["etcdctl", f"--endpoints={endpoints}", "lock",
                                                   "k", "true"]))  # fmt: skip
    flock = shutil.which("flock")
    if flock is not None:
        lock_file = os.path.join(tempfile.gettempdir(), "dlm-bench.flock")
        rows.append(Row("flock -- true", [flock, lock_file, "true"]))
    return rows


def verdicts(rows: dict[str, Row]) -> list[str]:
    out = []
    helped = rows.get("dlm --help")
    if helped is not None:
        ok = helped.median <= HELP_TARGET_MS
        out.append(
            f"dlm --help {helped.median:.0f} ms: {'meets' if ok else 'MISSES'} "
            f"the {HELP_TARGET_MS:.0f} ms target"
        )
    etcd = rows.get("etcdctl lock k -- true")
    if etcd is not None:
        for name in ("dlm acquire", "dlm exec -- true", "zipapp acquire", "zipapp exec -- true"):
            row = rows.get(name)
            if row is None:
                continue
            ratio = f"{name} {row.median:.0f} ms = {row.median / etcd.median:.2f}x etcdctl"
            factor = ETCD_FACTORS.get(name)
            if factor is None:
                out.append(f"{ratio} ({etcd.median:.0f} ms)")
                continue
            ok = row.median <= factor * etcd.median
            cpu = f"; CPU {row.cpu_median / etcd.cpu_median:.2f}x" if etcd.cpu_median > 0 else ""
            out.append(
                f"{ratio} ({etcd.median:.0f} ms): {'meets' if ok else 'MISSES'} the "
                f"{factor:g}x target{cpu}"
            )
    return out


def ssl_verdicts(breakdown: dict[str, list[tuple[str, float]]]) -> list[str]:
    """TLS must not cost the plain path: no command line here configures it."""
    out = []
    for line, modules in breakdown.items():
        imported = any(name == "ssl" for name, _ in modules)
        out.append(f"dlm {line}: {'IMPORTS ssl without TLS' if imported else 'no ssl import'}")
    return out


def print_table(rows: list[Row], base: float) -> None:
    print(
        f"{'command':<26} {'median':>8} {'p10':>8} {'p90':>8} {'x pass':>7} {'cpu':>8} {'fail':>5}"
    )
    for row in rows:
        print(
            f"{row.name:<26} {row.median:>6.1f}ms {row.quantile(0.1):>6.1f}ms "
            f"{row.quantile(0.9):>6.1f}ms {row.median / base:>7.2f} {row.cpu_median:>6.1f}ms "
            f"{row.failures:>5}"
        )


RESULTS_MARKER = "bench.startup"
"""startup.md holds this run's figures between ``<!-- bench.startup:begin/end -->``; the
before/after sections a person adds around them survive the next run."""


def write_startup_page(path: str, text: str) -> None:
    from bench.report import write_marked_region

    body = f"`make bench-startup`\n\n```\n{text}```"
    write_marked_region(path, RESULTS_MARKER, body, title="Start-up benchmark")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--cluster", help="use this dlm cluster instead of starting one")
    parser.add_argument("--zipapp", type=Path, default=ROOT / "dist" / "dlm.pyz")
    parser.add_argument("--no-etcd", action="store_true", help="skip the etcdctl yardstick")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument(
        "--results",
        default=str(ROOT / "bench" / "results"),
        metavar="DIR",
        help="also write DIR/startup.md ('' to skip)",
    )
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    runs = max(args.runs, MIN_RUNS)

    import compileall

    compileall.compile_dir(str(ROOT / "dlm"), quiet=1)  # warm pycs for the venv runs
    env = child_env()
    dlm_script = Path(sys.executable).with_name("dlm")
    dlm_cmd = [str(dlm_script)] if dlm_script.exists() else [sys.executable, "-m", "dlm"]
    system_python = real_python3()
    zip_cmd = [system_python, "-I", str(args.zipapp)] if args.zipapp.exists() else None
    if zip_cmd is None:
        print(f"no {args.zipapp}: run `make zipapp` to measure it too", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="dlm-bench-startup-") as base:
        empty = os.path.join(base, "cwd")
        os.makedirs(empty)
        dlm_cluster = etcd = None
        try:
            if args.cluster:
                members = args.cluster
            else:
                dlm_cluster = start_dlm(base)
                members = ",".join(dlm_cluster.addrs)
            if not args.no_etcd:
                etcd = start_etcd(base)
            rows = build_rows(dlm_cmd, zip_cmd, members, etcd)
            measure(rows, runs, env, empty, expect_ok=True)
            breakdown = {
                " ".join(line): import_breakdown(sys.executable, line, env, empty)
                for line in BREAKDOWN_LINES
            }
        finally:
            if etcd is not None:
                etcd.stop()
            if dlm_cluster is not None:
                dlm_cluster.stop()
    cbor = cbor_costs()

    by_name = {row.name: row for row in rows}
    base_ms = by_name["python -c pass (venv)"].median
    if args.json:
        print(
            json.dumps(
                {
                    "runs": runs,
                    "rows": {r.name: r.summary() for r in rows},
                    "imports_ms": {line: dict(mods) for line, mods in breakdown.items()},
                    "cbor": cbor,
                    "verdicts": verdicts(by_name) + ssl_verdicts(breakdown),
                }
            )
        )
        return 0
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print(
            f"start-up, whole processes, median of {runs} runs (interleaved; cpu: user + system, "
            "descendants waited for included); "
            f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after\n"
        )
        print_table(rows, base_ms)
        print()
        for line in verdicts(by_name) + ssl_verdicts(breakdown):
            print(line)
        for line, modules in breakdown.items():
            print(f"\ncumulative import time (ms), `python -X importtime -m dlm {line}`:")
            print("  " + ", ".join(f"{name} {ms:.1f}" for name, ms in modules))
        print(f"\ncbor2, one {int(cbor['frame_bytes'])}-byte acquire frame, microseconds per op:")
        for op in ("encode", "decode"):
            pure = cbor[f"pure_{op}_us"]
            c = cbor.get(f"c_{op}_us")
            vs = f"  C {c:6.1f}  (pure is {pure / c:.1f}x)" if c else ""
            print(f"  {op}: pure {pure:6.1f}{vs}")
    text = out.getvalue()
    print(text, end="")
    if args.results:
        os.makedirs(args.results, exist_ok=True)
        path = os.path.join(args.results, "startup.md")
        write_startup_page(path, text)
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
