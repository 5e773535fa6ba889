"""Lock pairs per second from Python, in-process: dlm's client API beside the `dlm` command and
beside redis-py's lock on a local Redis server, in one run.

Each *cell* is a closed loop of c workers (threads for the blocking API, asyncio tasks for
the async one), each taking and releasing a lock on a key of its own as fast as the answers
come back; the figure is the pairs completed in the measured window divided by its length
(after a warm-up). Cells of the different systems alternate, so load that comes and goes
on a shared machine falls on all of them alike.

- **dlm, API**: a 3-member cluster from dlm.testing (child processes on loopback, fsync
  on, a client secret, as in production). ``dlm``: the public API, each pair ``with
  client.lock(key, ttl=...)`` on a ``dlm.Client`` (``async with`` on a ``dlm.AsyncClient``):
  a lease opened, the key taken, the renewal started, the lease closed. ``dlm-lease``:
  dlm.client's internal client on one lease per worker, kept alive, each pair only an
  acquire and a release (what a lock costs when its lease is reused). "shared" cells use
  one client for every worker, as a program normally does; "per worker" cells give each
  worker a client of its own.
- **dlm, CLI**: each pair is two processes, ``dlm acquire KEY --format json`` and ``dlm
  release KEY --lease ID``, against the same cluster (the command's start-up included).
- **redis-py**: ``Redis.lock(name, timeout=30)`` (SET NX PX, and a script that deletes
  the key if it still holds the lock's random token) against one redis-server on
  loopback, twice: without persistence (Redis's speed as most deployments run it), and
  with ``appendfsync always`` (every write fsynced before the answer, as dlm does).
  Measured only when redis-server (Debian: ``apt-get install redis-server``) and the
  ``redis`` package (the ``bench`` extra, never a dependency of dlm itself) are installed.

What each guarantees differs, and the table says it: a dlm grant is replicated to a
majority of three members and fsynced before it is answered, carries a fencing token, and
the holder learns when its lease can no longer be trusted; a Redis lock lives on one node,
gives no fencing token, and without persistence is forgotten by a restart.

``python -m bench.api`` writes bench/results/api.md and api.json (``--results ''``: not).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import dlm.testing
from bench.floor import free_ports

DEFAULT_SECONDS = 3.0
DEFAULT_WARMUP = 1.0
DEFAULT_CLIENTS = (1, 64)
DEFAULT_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TTL_S = 30
OP_TIMEOUT_S = 20.0
STOP_S = 30.0

GUARANTEES = {
    "dlm": "replicated to 2 of 3 members and fsynced before the grant; fencing token; "
    "the holder learns when its lease is no longer certain. Each pair is a whole lock "
    "object's life: `with client.lock(key)` opens a lease, takes the key, starts the "
    "renewal and closes the lease",
    "dlm-lease": "as dlm; each pair an acquire and a release under one lease per worker, "
    "opened once and kept alive (dlm.client's internal client, the way the CLI works)",
    "dlm-cli": "as dlm (the same cluster), each pair two `dlm` processes",
    "redis": "one node, in memory (no persistence): a restart forgets the lock; no fencing token",
    "redis-fsync": "one node, appendfsync always: fsynced before the answer, but not "
    "replicated; no fencing token",
}


@dataclass
class Cell:
    system: str
    api: str
    """sync | async | cli"""
    clients: int
    sharing: str
    """shared (one client for every worker) | per worker | process"""
    pairs: int
    seconds: float
    errors: int
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.pairs / self.seconds if self.seconds > 0 else 0.0


class Counts:
    """Pairs done per worker; read at the window's edges."""

    def __init__(self, workers: int) -> None:
        self.done = [0] * workers
        self.errors = 0
        self.first_error = ""

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:200]


# ---------------------------------------------------------------------------
# Closed loops
# ---------------------------------------------------------------------------


def run_threads(
    workers: Sequence[Callable[[], None]], warmup: float, seconds: float
) -> tuple[int, float, Counts]:
    """Each worker's ``pair`` in a loop on a thread of its own; the pairs in the window."""
    counts = Counts(len(workers))
    stop = threading.Event()

    def loop(i: int, pair: Callable[[], None]) -> None:
        while not stop.is_set():
            try:
                pair()
            except Exception as exc:
                counts.failed(exc)
                stop.wait(0.05)
                continue
            counts.done[i] += 1

    threads = [
        threading.Thread(target=loop, args=(i, w), daemon=True) for i, w in enumerate(workers)
    ]
    for t in threads:
        t.start()
    time.sleep(warmup)
    start, began = sum(counts.done), time.monotonic()
    time.sleep(seconds)
    end, took = sum(counts.done), time.monotonic() - began
    stop.set()
    for t in threads:
        t.join(STOP_S)
    return end - start, took, counts


async def run_tasks(
    workers: Sequence[Callable[[], Awaitable[None]]], warmup: float, seconds: float
) -> tuple[int, float, Counts]:
    counts = Counts(len(workers))
    stop = asyncio.Event()

    async def loop(i: int, pair: Callable[[], Awaitable[None]]) -> None:
        while not stop.is_set():
            try:
                await pair()
            except Exception as exc:
                counts.failed(exc)
                await asyncio.sleep(0.05)
                continue
            counts.done[i] += 1

    tasks = [asyncio.create_task(loop(i, w)) for i, w in enumerate(workers)]
    await asyncio.sleep(warmup)
    start, began = sum(counts.done), time.monotonic()
    await asyncio.sleep(seconds)
    end, took = sum(counts.done), time.monotonic() - began
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), STOP_S)
    return end - start, took, counts


# ---------------------------------------------------------------------------
# dlm through its Python API
# ---------------------------------------------------------------------------


def dlm_sync_cell(
    c: dlm.testing.Cluster,
    clients: int,
    warmup: float,
    seconds: float,
    *,
    public: bool,
    shared: bool,
) -> Cell:
    """Blocking: with ``public``, each pair is ``with client.lock(key)`` on a dlm.Client;
    else dlm.client's internal client on a lease per worker (kept alive), each pair an
    acquire and a release."""
    made: list[Any] = []
    workers: list[Callable[[], None]] = []
    client: Any
    with contextlib.ExitStack() as stack:
        if public:
            one = stack.enter_context(c.client(timeout=OP_TIMEOUT_S)) if shared else None
            for i in range(clients):
                client = one or stack.enter_context(c.client(timeout=OP_TIMEOUT_S))

                def pair(client: Any = client, key: str = f"api-sync-{clients}-{i}") -> None:
                    with client.lock(key, ttl=TTL_S):
                        pass

                workers.append(pair)
        else:
            from dlm.client.sync import KeepAlive

            one_raw = stack.enter_context(c.raw_client(timeout=OP_TIMEOUT_S)) if shared else None
            for i in range(clients):
                client = one_raw or stack.enter_context(c.raw_client(timeout=OP_TIMEOUT_S))
                lease = client.open_lease(TTL_S * 1000)
                stack.enter_context(KeepAlive(client, lease))
                made.append((client, lease))

                def internal_pair(client: Any = client, lease: Any = lease, i: int = i) -> None:
                    key = f"lease-sync-{clients}-{i}"
                    client.acquire(lease, key)
                    client.release(lease, key)

                workers.append(internal_pair)
        pairs, took, counts = run_threads(workers, warmup, seconds)
        for client, lease in made:
            with contextlib.suppress(Exception):
                client.close_lease(lease)
    return Cell(
        "dlm" if public else "dlm-lease",
        "sync",
        clients,
        "shared" if shared else "per worker",
        pairs,
        took,
        counts.errors,
        counts.first_error,
    )


def dlm_async_cell(
    c: dlm.testing.Cluster,
    clients: int,
    warmup: float,
    seconds: float,
    *,
    public: bool,
    shared: bool,
) -> Cell:
    """As dlm_sync_cell, with asyncio tasks: ``async with client.lock(key)`` on a
    dlm.AsyncClient, or the internal async client on a lease per worker."""

    async def main() -> tuple[int, float, Counts]:
        async with contextlib.AsyncExitStack() as stack:
            workers: list[Callable[[], Awaitable[None]]] = []
            made: list[Any] = []
            client: Any
            if public:
                one = (
                    await stack.enter_async_context(c.async_client(timeout=OP_TIMEOUT_S))
                    if shared
                    else None
                )
                for i in range(clients):
                    client = one or await stack.enter_async_context(
                        c.async_client(timeout=OP_TIMEOUT_S)
                    )

                    async def pair(
                        client: Any = client, key: str = f"api-async-{clients}-{i}"
                    ) -> None:
                        async with client.lock(key, ttl=TTL_S):
                            pass

                    workers.append(pair)
            else:
                from dlm.client.aio import AsyncClient

                def raw() -> AsyncClient:
                    return AsyncClient(c.cluster, timeout=OP_TIMEOUT_S, secret=c.secret())

                one_raw = await stack.enter_async_context(raw()) if shared else None
                for i in range(clients):
                    client = one_raw or await stack.enter_async_context(raw())
                    lease = await client.open_lease(TTL_S * 1000)
                    await stack.enter_async_context(client.keep_alive(lease))
                    made.append((client, lease))

                    async def internal_pair(
                        client: Any = client, lease: Any = lease, i: int = i
                    ) -> None:
                        key = f"lease-async-{clients}-{i}"
                        await client.acquire(lease, key)
                        await client.release(lease, key)

                    workers.append(internal_pair)
            result = await run_tasks(workers, warmup, seconds)
            for client, lease in made:
                with contextlib.suppress(Exception):
                    await client.close_lease(lease)
            return result

    pairs, took, counts = asyncio.run(main())
    return Cell(
        "dlm" if public else "dlm-lease",
        "async",
        clients,
        "shared" if shared else "per worker",
        pairs,
        took,
        counts.errors,
        counts.first_error,
    )


def dlm_cli_cell(c: dlm.testing.Cluster, clients: int, warmup: float, seconds: float) -> Cell:
    dlm_command = [sys.executable, "-m", "dlm"]
    beside = os.path.join(os.path.dirname(sys.executable), "dlm")
    if os.path.exists(beside):
        dlm_command = [beside]
    env = {**os.environ, **c.env}

    def worker(i: int) -> Callable[[], None]:
        key = f"api-cli-{clients}-{i}"

        def pair() -> None:
            got = subprocess.run(
                [*dlm_command, "acquire", key, "--ttl", f"{TTL_S}s", "--format", "json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=OP_TIMEOUT_S,
                check=True,
            )
            lease = json.loads(got.stdout)["lease"]
            subprocess.run(
                [*dlm_command, "release", key, "--lease", lease],
                env=env,
                capture_output=True,
                timeout=OP_TIMEOUT_S,
                check=True,
            )

        return pair

    pairs, took, counts = run_threads([worker(i) for i in range(clients)], warmup, seconds)
    return Cell(
        "dlm-cli", "cli", clients, "process", pairs, took, counts.errors, counts.first_error
    )


# ---------------------------------------------------------------------------
# redis-py against a local redis-server
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(fsync: bool, base: str) -> Iterator[int]:
    """One redis-server on a free loopback port, stopped by PID afterwards."""
    port = free_ports(1)[0]
    data = tempfile.mkdtemp(prefix="redis-", dir=base)
    persistence = (
        ["--appendonly", "yes", "--appendfsync", "always"] if fsync else ["--appendonly", "no"]
    )
    proc = subprocess.Popen(
        [
            "redis-server",
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", data),
            *("--daemonize", "no", *persistence),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def redis_sync_cell(system: str, port: int, clients: int, warmup: float, seconds: float) -> Cell:
    import redis

    r = redis.Redis(port=port, max_connections=clients + 4)

    def worker(i: int) -> Callable[[], None]:
        lock = r.lock(f"api-sync-{clients}-{i}", timeout=TTL_S, blocking_timeout=OP_TIMEOUT_S)

        def pair() -> None:
            if not lock.acquire():
                raise RuntimeError("not acquired")
            lock.release()

        return pair

    try:
        pairs, took, counts = run_threads([worker(i) for i in range(clients)], warmup, seconds)
    finally:
        r.close()
    return Cell(system, "sync", clients, "shared", pairs, took, counts.errors, counts.first_error)


def redis_async_cell(system: str, port: int, clients: int, warmup: float, seconds: float) -> Cell:
    async def main() -> tuple[int, float, Counts]:
        import redis.asyncio

        r = redis.asyncio.Redis(port=port, max_connections=clients + 4)
        try:

            def worker(i: int) -> Callable[[], Awaitable[None]]:
                lock = r.lock(
                    f"api-async-{clients}-{i}", timeout=TTL_S, blocking_timeout=OP_TIMEOUT_S
                )

                async def pair() -> None:
                    if not await lock.acquire():
                        raise RuntimeError("not acquired")
                    await lock.release()

                return pair

            return await run_tasks([worker(i) for i in range(clients)], warmup, seconds)
        finally:
            await r.aclose()

    pairs, took, counts = asyncio.run(main())
    return Cell(system, "async", clients, "shared", pairs, took, counts.errors, counts.first_error)


def redis_available() -> str | None:
    """Why redis cannot be measured here (None: it can)."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis package is not installed (pip install redis)"
    return None


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP)
    parser.add_argument("--clients", default=",".join(map(str, DEFAULT_CLIENTS)), help="e.g. 1,64")
    parser.add_argument("--cli-clients", default="1,4", help="concurrent `dlm` command loops")
    parser.add_argument(
        "--cli-seconds", type=float, default=10.0, help="window of the CLI's cells (slow pairs)"
    )
    parser.add_argument("--no-redis", action="store_true")
    parser.add_argument("--results", default=DEFAULT_RESULTS, help="'' writes nothing")
    parser.add_argument("--name", default="api")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.clients.split(",") if x]
    cli_counts = [int(x) for x in args.cli_clients.split(",") if x]
    w, s = args.warmup, args.seconds

    no_redis = "--no-redis given" if args.no_redis else redis_available()
    before = load_average()
    cells: list[Cell] = []

    def done(cell: Cell) -> None:
        cells.append(cell)
        err = f" ({cell.errors} errors: {cell.first_error})" if cell.errors else ""
        print(
            f"{cell.system:12} {cell.api:5} c={cell.clients:<3} {cell.sharing:10} "
            f"{_rate(cell.rate):>10} pairs/s{err}",
            flush=True,
        )

    base = tempfile.mkdtemp(prefix="bench-api-")
    try:
        with contextlib.ExitStack() as stack:
            c = stack.enter_context(dlm.testing.cluster(3, fsync=True, base_dir=base))
            ports: dict[str, int] = {}
            if no_redis is None:
                ports["redis"] = stack.enter_context(redis_server(False, base))
                ports["redis-fsync"] = stack.enter_context(redis_server(True, base))
            plan: list[Callable[[], Cell]] = []
            for n in counts:
                rounds: list[list[Callable[[], Cell]]] = [
                    [
                        partial(dlm_sync_cell, c, n, w, s, public=True, shared=True),
                        *(
                            [partial(dlm_sync_cell, c, n, w, s, public=True, shared=False)]
                            if n > 1
                            else []
                        ),
                        partial(dlm_async_cell, c, n, w, s, public=True, shared=True),
                        *(
                            [partial(dlm_async_cell, c, n, w, s, public=True, shared=False)]
                            if n > 1
                            else []
                        ),
                        partial(dlm_sync_cell, c, n, w, s, public=False, shared=False),
                        partial(dlm_async_cell, c, n, w, s, public=False, shared=False),
                    ]
                ]
                for system, port in ports.items():
                    rounds.append(
                        [
                            partial(redis_sync_cell, system, port, n, w, s),
                            partial(redis_async_cell, system, port, n, w, s),
                        ]
                    )
                # Alternate: a dlm cell, a redis cell, a redis-fsync cell, and so on.
                width = max(len(r) for r in rounds)
                for k in range(width):
                    plan.extend(r[k] for r in rounds if k < len(r))
            plan.extend(partial(dlm_cli_cell, c, n, w, args.cli_seconds) for n in cli_counts)
            for step in plan:
                done(step())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    after = load_average()

    heading = (
        f"dlm: 3 members from dlm.testing on 127.0.0.1, fsync on, client secret; "
        f"{s:g} s per cell after {w:g} s of warm-up; {os.cpu_count()} CPUs; "
        f"load average {before} before, {after} after"
    )
    table = render(cells, heading, no_redis)
    print("\n" + table)
    if args.results:
        os.makedirs(args.results, exist_ok=True)
        with open(os.path.join(args.results, f"{args.name}.md"), "w") as f:
            f.write(table)
        with open(os.path.join(args.results, f"{args.name}.json"), "w") as f:
            json.dump(
                {
                    "heading": heading,
                    "redis_skipped": no_redis,
                    "cells": [{**asdict(x), "pairs_per_s": x.rate} for x in cells],
                },
                f,
                indent=2,
            )
    return 0


def _rate(rate: float) -> str:
    return f"{rate:,.1f}" if rate < 100 else f"{rate:,.0f}"


def render(cells: Sequence[Cell], heading: str, no_redis: str | None) -> str:
    lines = [
        "# Lock pairs per second from Python",
        "",
        heading,
        "",
        "Closed loop, a key per worker, acquire then release as fast as the answers come "
        "(bench/api.py; what each system guarantees is listed below the table). The "
        "machine was shared with other work: compare figures of this run with each other, not "
        "with other runs.",
        "",
        "| system | API | workers | clients | pairs/s | errors |",
        "|---|---|---:|---|---:|---:|",
    ]
    for cell in cells:
        lines.append(
            f"| {cell.system} | {cell.api} | {cell.clients} | {cell.sharing} | "
            f"{_rate(cell.rate)} | {cell.errors} |"
        )
    lines += [
        "",
        "The CLI's cells measure a window of their own (`--cli-seconds`). The closed loop "
        "of dlm's raw protocol client (no lock objects, one lease per client, on asyncio "
        "streams in load processes of their own) is in [locks.md](locks.md), from another "
        "run.",
    ]
    lines += ["", "What a pair of each system guarantees:", ""]
    lines += [f"- **{system}**: {said}" for system, said in GUARANTEES.items()]
    if no_redis:
        lines += ["", f"Redis not measured: {no_redis}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
