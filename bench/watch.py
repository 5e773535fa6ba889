"""The watch fan-out benchmark: how many watchers one member serves, and how late.

Starts a 3-member dlm cluster on 127.0.0.1, connects W watchers (one asyncio loop,
``AsyncClient.watch`` on a prefix) to one follower, and runs a writer that takes and
releases keys under that prefix as fast as it can on the leader for a fixed window.
For each W it reports the changes the cluster made per second, the changes pushed per
second (made x W), and the push latency: from the entry's stamp (the leader's wall
clock when it proposed the change) to the watcher reading it, so it includes the
commit; all on one host, so the clocks agree. The writer and the watchers share one
process, as a loaded client host would.

    python -m bench.watch [--watchers 1,100,500] [--seconds 5] [--out bench/results/watch.md]

Every process started here is stopped by PID in a ``finally`` block.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

from bench.locks import DlmCluster


@dataclass
class Row:
    watchers: int
    changes_per_s: float
    pushed_per_s: float
    p50_ms: float
    p99_ms: float
    missing: int


async def _cell(cluster: DlmCluster, leader: int, watchers: int, seconds: float) -> Row:
    from dlm.client.aio import AsyncClient

    follower = next(i for i in range(len(cluster.addrs)) if i != leader)
    prefix = f"bw{watchers}/"
    latencies: list[float] = []
    received = [0] * watchers
    clients = [AsyncClient([cluster.addrs[follower]], timeout=30) for _ in range(watchers)]

    async def watch(n: int) -> None:
        async for event in clients[n].watch(prefix=prefix):
            received[n] += 1
            latencies.append(time.time() * 1000 - event.at_ms)

    tasks = [asyncio.create_task(watch(n)) for n in range(watchers)]
    await asyncio.sleep(1.0 + watchers / 100)  # every watch connects and starts
    writer = AsyncClient([cluster.addrs[leader]], timeout=30)
    changes = 0
    try:
        lease = await writer.open_lease(30_000)
        deadline = time.monotonic() + seconds
        began = time.monotonic()
        n = 0
        while time.monotonic() < deadline:
            key = f"{prefix}{n % 64}"
            await writer.acquire(lease, key)
            await writer.release(lease, key)
            changes += 2
            n += 1
        elapsed = time.monotonic() - began
        await asyncio.sleep(1.0)  # the last pushes arrive
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await writer.aclose()
        for client in clients:
            await client.aclose()
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
    args = parser.parse_args()
    counts = [int(w) for w in args.watchers.split(",")]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dlm-bench-watch-") as base:
        cluster = DlmCluster(base)
        try:
            cluster.start()
            leader = cluster.leader_index(15.0)
            for count in counts:
                rows.append(asyncio.run(_cell(cluster, leader, count, args.seconds)))
                print(rows[-1], flush=True)
        finally:
            cluster.stop()
    lines = [
        "| watchers on one follower | changes/s made | changes/s pushed | push p50 | push p99 "
        "| changes not received |",
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
            out.write(_report(table, args.seconds, os.cpu_count() or 0))


def _report(table: str, seconds: float, cpus: int) -> str:
    return f"""# Watch fan-out

`python -m bench.watch` (bench/watch.py): a 3-member cluster on 127.0.0.1 (fsync on),
W watchers of one prefix on one follower (one asyncio process), and one writer taking
and releasing keys under the prefix on the leader as fast as it can for {seconds:g} s
per row (each acquire and each release is one change). Push latency is from the
entry's stamp (the leader's clock when it proposed the change) to a watcher reading it,
so it includes the commit round and the follower's apply.

Run once, on a shared machine ({cpus} cores) loaded by other work at the same time
(other builds and a soak run): the figures are a floor on what a member does, not a
measurement on quiet hardware. The watchers and the writer share one client process,
so at large W the client side, not the member, sets the pace.

{table}
"""


if __name__ == "__main__":
    main()
