"""What a gateway hop costs and how many clients one gateway holds (`make bench-gateway`).

1. Starts a 3-member cluster (dlm.testing, fsync on, a client secret) and one
   `dlm gateway` in front of it, all on 127.0.0.1.
2. Closed-loop cells of c clients (threads, each with its own Client, connection
   and lease, on a key of its own): acquire then release, for a fixed window,
   once straight to the members and once through the gateway, the two modes
   interleaved round by round in the same run, so load from the rest of the
   machine falls on both alike. Each cell records pairs/s, p50/p99 of the pair,
   the CPU the members used per pair and the CPU the gateway used per pair.
3. Capacity: opens N idle client connections through the gateway (each one
   finished its handshake with a member and then says nothing) and reads the
   gateway's resident memory and open descriptors before and after: memory and
   descriptors per client. Every such connection also holds one descriptor on
   the member it reached, so the member's open-files limit counts too.

Writes bench/results/gateway.md and .json. Every process started here is stopped
by PID on the way out (the cluster's members by dlm.testing, the gateway here).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.procs import tree_usage
from dlm.auth import load_secret
from dlm.client import Client
from dlm.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class GatewayProcess:
    def __init__(self, members: str) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "dlm", "gateway", "--listen", self.address),
                *("--cluster", members, "--max-clients", "100000"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("the gateway did not start listening within 20 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def run_cell(
    *,
    target: list[str],
    secret: bytes,
    clients: int,
    seconds: float,
    member_pids: list[int],
    gateway_pid: int,
    label: str,
) -> dict[str, Any]:
    """``clients`` threads doing acquire/release on keys of their own for ``seconds``."""
    stop = threading.Event()
    measuring = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []

    def worker(i: int) -> None:
        try:
            with Client(target, secret=secret, timeout=10.0) as client:
                lease = client.open_lease(30_000)
                key = f"bench-gw-{label}-{i}"
                while not stop.is_set():
                    started = time.perf_counter()
                    grant = client.acquire(lease, key)
                    client.release(lease, key, token=grant.token)
                    if measuring.is_set():
                        latencies[i].append(time.perf_counter() - started)
                client.close_lease(lease)
        except Exception as exc:  # reported in the results, never hidden
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # warm-up: connections made, leases open
    members_before = sum(u.cpu_s for u in tree_usage(member_pids))
    gateway_before = tree_usage([gateway_pid])[0].cpu_s
    measuring.set()
    started = time.monotonic()
    time.sleep(seconds)
    measuring.clear()
    elapsed = time.monotonic() - started
    members_cpu = sum(u.cpu_s for u in tree_usage(member_pids)) - members_before
    gateway_cpu = tree_usage([gateway_pid])[0].cpu_s - gateway_before
    stop.set()
    for thread in threads:
        thread.join(30)
    pairs = [x for per in latencies for x in per]
    count = len(pairs)
    ordered = sorted(pairs)
    return {
        "mode": label,
        "clients": clients,
        "pairs": count,
        "pairs_per_s": count / elapsed,
        "pair_p50_ms": statistics.median(ordered) * 1000 if ordered else None,
        "pair_p99_ms": ordered[int(0.99 * (count - 1))] * 1000 if ordered else None,
        "members_cpu_ms_per_pair": members_cpu * 1000 / count if count else None,
        "gateway_cpu_ms_per_pair": gateway_cpu * 1000 / count if count else None,
        "errors": errors[:3],
    }


def capacity(gateway: GatewayProcess, secret: bytes, connections: int) -> dict[str, Any]:
    """Gateway memory and descriptors per idle client connection (handshake done)."""
    pid = gateway.proc.pid
    rss_before, fds_before = _status_kb(pid, "VmRSS"), _fds(pid)
    clients = []
    try:
        for _ in range(connections):
            client = Client([gateway.address], secret=secret, timeout=10.0)
            client.status(stale=True)  # connects and authenticates with a member through it
            clients.append(client)
        time.sleep(0.5)
        rss_after, fds_after = _status_kb(pid, "VmRSS"), _fds(pid)
    finally:
        for client in clients:
            client.close()
    return {
        "connections": connections,
        "gateway_rss_kb_before": rss_before,
        "gateway_rss_kb_after": rss_after,
        "rss_kb_per_connection": (rss_after - rss_before) / connections,
        "fds_per_connection": (fds_after - fds_before) / connections,
    }


def _table(cells: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| clients | path | pairs/s | pair p50 ms | pair p99 ms | members CPU ms/pair "
        "| gateway CPU ms/pair |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for cell in cells:
        lines.append(
            f"| {cell['clients']} | {cell['mode']} | {cell['pairs_per_s']:.0f} "
            f"| {cell['pair_p50_ms']:.2f} | {cell['pair_p99_ms']:.2f} "
            f"| {cell['members_cpu_ms_per_pair']:.3f} "
            f"| {cell['gateway_cpu_ms_per_pair'] if cell['mode'] == 'gateway' else 0:.3f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,8", help="comma-separated client counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring window per cell")
    parser.add_argument("--rounds", type=int, default=2, help="direct/gateway pairs per count")
    parser.add_argument(
        "--idle", type=int, default=800, help="idle connections for capacity (under 1024: select)"
    )
    parser.add_argument("--out", default=str(RESULTS / "gateway"), help="results path stem")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",") if c]
    cells: list[dict[str, Any]] = []
    with Cluster(3, fsync=True) as cluster:
        secret = load_secret(cluster.secret_file)
        members = [m.address for m in cluster.members]
        member_pids = [m.pid for m in cluster.members if m.pid is not None]
        gateway = GatewayProcess(cluster.cluster)
        try:
            for clients in counts:
                for round_number in range(args.rounds):
                    modes = (
                        ("direct", "gateway") if round_number % 2 == 0 else ("gateway", "direct")
                    )
                    for mode in modes:
                        target = members if mode == "direct" else [gateway.address]
                        cell = run_cell(
                            target=target,
                            secret=secret,
                            clients=clients,
                            seconds=args.seconds,
                            member_pids=member_pids,
                            gateway_pid=gateway.proc.pid,
                            label=mode,
                        )
                        cell["round"] = round_number
                        print(json.dumps(cell), flush=True)
                        cells.append(cell)
            held = capacity(gateway, secret, args.idle)
            print(json.dumps(held), flush=True)
        finally:
            gateway.stop()
    merged = _merge(cells)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"cells": cells, "merged": merged, "capacity": held}, indent=2) + "\n"
    )
    lines = [
        "# Gateway: what a hop costs, how many clients one holds",
        "",
        f"`make bench-gateway` on {os.cpu_count()} CPU(s), 3 members (fsync on, client "
        f"secret) and one gateway on 127.0.0.1; {args.seconds:g} s per cell, "
        f"{args.rounds} rounds per count, direct and gateway interleaved (means of the rounds).",
        "",
        *_table(merged),
        "",
        f"Capacity: {held['connections']} idle client connections through the gateway cost "
        f"{held['rss_kb_per_connection']:.1f} KiB of gateway memory and "
        f"{held['fds_per_connection']:.2f} descriptors each (RSS "
        f"{held['gateway_rss_kb_before'] / 1024:.1f} -> {held['gateway_rss_kb_after'] / 1024:.1f}"
        " MiB); each also holds one descriptor on its member.",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def _merge(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The mean of each (clients, mode) over its rounds."""
    merged: list[dict[str, Any]] = []
    keys = sorted(
        {(c["clients"], c["mode"]) for c in cells}, key=lambda k: (k[0], k[1] != "direct")
    )
    for clients, mode in keys:
        group = [c for c in cells if c["clients"] == clients and c["mode"] == mode]
        row: dict[str, Any] = {"clients": clients, "mode": mode}
        for name in (
            "pairs_per_s",
            "pair_p50_ms",
            "pair_p99_ms",
            "members_cpu_ms_per_pair",
            "gateway_cpu_ms_per_pair",
        ):
            values = [c[name] for c in group if c[name] is not None]
            row[name] = statistics.fmean(values) if values else 0.0
        merged.append(row)
    return merged


if __name__ == "__main__":
    sys.exit(main())
