"""The machine's floor, and the small measuring tools the benchmarks share.

A replicated lock cannot be granted faster than the disk can make a record
durable and the network can carry a message there and back, so the
benchmark measures both on this machine, in the same run, and prints them
beside the service figures:

- ``fsync``: append 100 bytes to a file in the data directory's filesystem
  and fsync it (what a Raft log append costs at the very least);
- ``rtt``: send 16 bytes over a loopback TCP connection (TCP_NODELAY) to an
  echo server in another process and read them back.

A replicated write seen by a client costs at least one fsync and two round
trips (client to leader, leader to follower), so a pair (acquire, then
release) costs at least ``2 x (fsync + 2 RTT)``.

Run alone: ``python -m bench.floor [--samples N] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_SAMPLES = 2000
_RECORD = b"r" * 100
_PING = b"p" * 16


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Latency summary in milliseconds."""

    p50_ms: float
    p99_ms: float
    samples: int


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (NaN when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, int(fraction * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def summarize(seconds: Sequence[float]) -> Percentiles:
    ordered = sorted(seconds)
    return Percentiles(
        p50_ms=percentile(ordered, 0.50) * 1e3,
        p99_ms=percentile(ordered, 0.99) * 1e3,
        samples=len(ordered),
    )


def free_ports(count: int) -> list[int]:
    """Ports the kernel just handed out on 127.0.0.1 (held open together so they differ)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def measure_fsync(directory: str, samples: int = DEFAULT_SAMPLES) -> Percentiles:
    """Latency of one 100-byte append plus fsync, in a fresh file under ``directory``."""
    with tempfile.TemporaryDirectory(prefix="floor-", dir=directory) as scratch:
        fd = os.open(os.path.join(scratch, "wal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # The first fsync of a new file also commits its directory entry; keep it out.
            os.write(fd, _RECORD)
            os.fsync(fd)
            timings = []
            for _ in range(samples):
                start = time.perf_counter()
                os.write(fd, _RECORD)
                os.fsync(fd)
                timings.append(time.perf_counter() - start)
        finally:
            os.close(fd)
    return summarize(timings)


def _echo_server(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def _recv_exactly(sock: socket.socket, size: int) -> None:
    remaining = size
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            raise ConnectionError("echo server closed the connection")
        remaining -= len(chunk)


def measure_loopback_rtt(samples: int = DEFAULT_SAMPLES) -> Percentiles:
    """Round trip of a 16-byte message to an echo server in a separate process."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    # fork keeps the listening socket; the echo side must not share our GIL.
    server = multiprocessing.get_context("fork").Process(
        target=_echo_server, args=(listener,), daemon=True
    )
    server.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=5.0) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(50):  # warm the path (page faults, scheduler) before timing
                sock.sendall(_PING)
                _recv_exactly(sock, len(_PING))
            timings = []
            for _ in range(samples):
                start = time.perf_counter()
                sock.sendall(_PING)
                _recv_exactly(sock, len(_PING))
                timings.append(time.perf_counter() - start)
    finally:
        listener.close()
        server.join(timeout=5.0)
        if server.is_alive():
            server.kill()
            server.join(timeout=5.0)
    return summarize(timings)


@dataclass(frozen=True, slots=True)
class Floor:
    fsync: Percentiles
    rtt: Percentiles

    @property
    def commit_p50_ms(self) -> float:
        """One replicated write seen by a client: a durable append plus two round trips
        (client to leader, leader to a follower and back; the leader's own fsync runs
        beside the follower's, so only one fsync is in series)."""
        return self.fsync.p50_ms + 2 * self.rtt.p50_ms

    @property
    def pair_p50_ms(self) -> float:
        """Acquire then release: two replicated writes, one after the other."""
        return 2 * self.commit_p50_ms


def measure_floor(directory: str, samples: int = DEFAULT_SAMPLES) -> Floor:
    return Floor(fsync=measure_fsync(directory, samples), rtt=measure_loopback_rtt(samples))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="directory on the data FS")
    args = parser.parse_args(argv)
    floor = measure_floor(args.dir, args.samples)
    for name, p in (("fsync 100 B", floor.fsync), ("loopback RTT", floor.rtt)):
        print(f"{name:13} p50 {p.p50_ms:.3f} ms  p99 {p.p99_ms:.3f} ms  ({p.samples} samples)")
    print(f"pair floor    p50 {floor.pair_p50_ms:.3f} ms  (2 x (fsync + 2 RTT))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
