"""What the run ledger (issue 28) costs: log bytes per run, `dlm exec` wall time and the
library's acquire/release pair before and after, and the state at 10,000 keys.

    python -m bench.ledger [--before-ref 2afbbb1] [--runs 21] [--pairs 200]

- log: the entries one `dlm exec` run writes (open, acquire, close), encoded as the
  members encode them, with and without the run's report on the close; a skip is the
  refused acquire's own entry;
- time: two 3-member clusters side by side, one running the members of ``--before-ref``
  (from ``git archive``) and one this checkout's, each driven by its own tree's `dlm`;
  ``dlm exec --lock K -- true`` and library acquire/release pairs alternate between them,
  so drift on a loaded machine hits both alike; medians;
- state: a ledger of 10,000 keys x 10 runs (its retention), with realistic fields: the
  CBOR bytes it adds to a snapshot image and the Python memory it takes.

Every process is stopped by PID; nothing is written but the report on stdout.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

import cbor2

from bench.locks import DlmCluster
from dlm.client import Client
from dlm.node import locks
from dlm.node.locks.ledger import RUNS_PER_KEY, RunLedger

ROOT = Path(__file__).resolve().parents[1]
META = {
    "host": "web-03.example",
    "user": "deploy",
    "pid": "41213",
    "cmd": "/usr/local/bin/backup.sh --full",
}


def log_bytes() -> list[str]:
    origin = locks.Origin("c-0123456789abcdef", 3, 2)
    entries = {
        "open2": locks.OpenLeaseCommand("a" * 16, 30_000, origin, 1_795_000_000_000, meta=META),
        "acquire2": locks.AcquireCommand(
            "a" * 16, "cron/backup", False, 1, META, origin, 1_795_000_000_000
        ),
        "close2 (before)": locks.CloseLeaseCommand("a" * 16, origin, 1_795_000_000_000),
        "close4 (with the run's report)": locks.CloseLeaseCommand(
            "a" * 16, origin, 1_795_000_000_000, report=locks.RunReport("finished", 0)
        ),
    }
    return [f"| {name} | {len(locks.encode_command(cmd))} |" for name, cmd in entries.items()]


def state_size(keys: int = 10_000) -> tuple[int, float, int]:
    tracemalloc.start()
    ledger = RunLedger()
    token = 0
    for run in range(RUNS_PER_KEY):
        for k in range(keys):
            token += 1
            lease = f"{token:016x}"
            ledger.started(f"cron/job-{k:05d}", token, lease, META, 1_795_000_000_000 + run)
            ledger.skipped(f"cron/job-{k:05d}", [token])
            ledger.ended(lease, 1_795_000_060_000 + run, locks.RunReport("finished", 0))
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    started = time.perf_counter()
    image = cbor2.dumps(ledger.image(), canonical=True)
    took = time.perf_counter() - started
    return len(image), took, memory


def archive(ref: str, where: Path) -> Path:
    data = subprocess.run(
        ["git", "archive", "--format=tar", ref, "dlm"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(where, filter="data")
    return where


def exec_once(code: Path | None, cluster: DlmCluster) -> float:
    env = {**os.environ, "DLM_CLUSTER": ",".join(cluster.addrs)}
    if code is not None:
        env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    key = f"bench/exec-{time.monotonic_ns()}"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dlm", "exec", "--lock", key, "--", "true"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench.ledger: dlm exec failed: {done.stderr.decode()[-300:]}")
    return took


def pair_once(client: Client) -> float:
    key = f"bench/pair-{time.monotonic_ns()}"
    started = time.perf_counter()
    lease = client.open_lease(30_000)
    client.acquire(lease, key, meta=META)
    client.close_lease(lease)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-ref", default="2afbbb1")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--pairs", type=int, default=200)
    args = parser.parse_args()
    print("| entry | bytes |\n|---|---:|")
    print("\n".join(log_bytes()))
    size, took, memory = state_size()
    print(f"\nledger of 10,000 keys x {RUNS_PER_KEY} runs: image {size:,} bytes, "
          f"encoded in {took * 1000:.0f} ms, {memory / 1e6:.0f} MB of Python memory")  # fmt: skip
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        before_code = archive(args.before_ref, Path(tmp) / "before")
        for name in ("cb", "ca"):
            os.makedirs(os.path.join(tmp, name))
        before = DlmCluster(os.path.join(tmp, "cb"))
        before.env = {
            **os.environ,
            "PYTHONPATH": str(before_code) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        after = DlmCluster(os.path.join(tmp, "ca"))
        try:
            before.start()
            after.start()
            times: dict[str, list[float]] = {"before": [], "after": []}
            pairs: dict[str, list[float]] = {"before": [], "after": []}
            clients = {"before": Client(before.addrs), "after": Client(after.addrs)}
            for i in range(args.runs):
                order = ("before", "after") if i % 2 == 0 else ("after", "before")
                for side in order:
                    cluster, code = (before, before_code) if side == "before" else (after, None)
                    times[side].append(exec_once(code, cluster))
            for i in range(args.pairs):
                order = ("before", "after") if i % 2 == 0 else ("after", "before")
                for side in order:
                    pairs[side].append(pair_once(clients[side]))
            for client in clients.values():
                client.close()
        finally:
            before.stop()
            after.stop()
    print(f"\nload average before the timed part: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("\n| figure | before | after | after/before |\n|---|---:|---:|---:|")
    for name, series in (
        ("dlm exec --lock K -- true (ms)", times),
        ("open+acquire+close pair (ms)", pairs),
    ):
        b, a = statistics.median(series["before"]) * 1000, statistics.median(series["after"]) * 1000
        print(f"| {name}, median of {len(series['before'])} | {b:.1f} | {a:.1f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
