"""The lock-service benchmark: dlm against the machine's floor and etcd 3.4, same run.

What it does (see bench/README.md for what each figure means):

1. Measures the floor (bench/floor.py): fsync of a 100-byte append in the
   data directory's filesystem, and a loopback TCP round trip.
2. Starts a 3-node dlm cluster on 127.0.0.1 (free ports, temporary data
   dirs, fsync on) and waits for a leader.
3. Runs closed-loop cells: c concurrent clients (default 1, 16, 64), each
   with its own connection and lease, doing acquire then release, either on
   a key of its own ("distinct") or all on one key ("hot", acquire waits in
   the FIFO queue). Each cell warms up, then measures for a fixed window:
   pairs/s, p50/p99 of acquire latency and of the whole pair, the CPU the
   load generator used and the CPU the three servers used.
   The load runs in worker processes, each an asyncio loop holding a share
   of the clients. With c >= 16 both a single loop and ``--procs`` loops are
   measured, because on a small machine the load generator itself may be
   the bottleneck; the table shows the better of the two and says which.
4. Failover: a client loops acquire/release, the leader is killed with
   SIGKILL, and the time from the kill to the first acquire issued after it
   that succeeds is recorded; the node is restarted and the run repeated.
5. The same cells and failovers against a 3-member etcd 3.4 cluster
   (bench/etcd.py) when etcd is installed, interleaved with dlm's: both
   clusters run side by side (idle while the other is measured), each cell
   runs on one system then the other, the order alternating from cell to
   cell, so load from the rest of a shared machine falls on both alike.

Every process started here is stopped by PID in a ``finally`` block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from bench import etcd as etcd_bench
from bench.floor import Floor, Percentiles, free_ports, measure_floor, summarize
from bench.procs import ProcessCluster, tree_usage
from dlm.client.sync import Client
from dlm.partitioning import check_partitions
from dlm.views import StatusView

if TYPE_CHECKING:
    from bench.loadgen import SecondRun

CLIENT_COUNTS = (1, 16, 64)
DEFAULT_SECONDS = 5.0
DEFAULT_WARMUP = 1.0
DEFAULT_SETTLE = 3.0
DEFAULT_PROCS = 2
DEFAULT_FAILOVERS = 5
DEFAULT_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
LEASE_TTL_MS = 30_000
HOT_WAIT_S = 30.0
OP_TIMEOUT_S = 10.0
SETUP_TIMEOUT_S = 30.0
LEADER_TIMEOUT_S = 20.0
FAILOVER_TIMEOUT_S = 20.0
# etcd drops a proposal made while it has no leader and answers only when its 7 s request
# timeout fires; a real client would give up sooner and try another member. 1 s is etcd's
# election timeout, so a retry after it usually finds the new leader.
ETCD_FAILOVER_ATTEMPT_S = 1.0
FAILOVER_KEY = "bench/failover"


# ---------------------------------------------------------------------------
# What the load talks to
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """Enough to reach a cluster from a fresh worker process (so it must pickle)."""

    system: str  # "dlm" or "etcd"
    endpoints: tuple[str, ...]  # HOST:PORT, the leader first
    # etcd only: re-send a request that stays silent this long to the next member.
    attempt_timeout_s: float | None = None
    # dlm only: the client secret's file, when the members require one (--auth secret).
    secret_file: str | None = None


class LockSession(Protocol):
    async def acquire(self, key: str, *, wait: bool) -> None: ...

    async def release(self, key: str) -> None: ...

    async def close(self) -> None: ...


class DlmSession:
    """One dlm client: its own AsyncClient (so its own connection) and its own lease.

    In a partitioned cluster the client finds its key's partition, and its lease gets a
    part there when the key is first taken (the client library's composite lease)."""

    def __init__(self, client: Any, lease: Any) -> None:
        self._client = client
        self._lease = lease

    @classmethod
    async def open(cls, endpoints: Sequence[str], secret_file: str | None = None) -> DlmSession:
        # Lazy: the etcd half of the benchmark runs without dlm's client.
        from dlm.client.aio import AsyncClient

        secret = None
        if secret_file is not None:
            from dlm import auth

            secret = auth.load_secret(secret_file)
        client = AsyncClient(list(endpoints), timeout=OP_TIMEOUT_S, secret=secret)
        try:
            lease = await client.open_lease(LEASE_TTL_MS)
        except BaseException:
            await client.aclose()
            raise
        return cls(client, lease)

    async def acquire(self, key: str, *, wait: bool) -> None:
        await self._client.acquire(self._lease, key, wait=HOT_WAIT_S if wait else None)

    async def release(self, key: str) -> None:
        await self._client.release(self._lease, key)

    async def close(self) -> None:
        try:
            await self._client.close_lease(self._lease)
        finally:
            await self._client.aclose()


async def open_session(target: Target) -> LockSession:
    if target.system == "dlm":
        return await DlmSession.open(target.endpoints, target.secret_file)
    return await etcd_bench.EtcdSession.open(
        target.endpoints, 0, op_timeout=OP_TIMEOUT_S, attempt_timeout=target.attempt_timeout_s
    )


class Cluster(Protocol):
    """What the harness needs from a running cluster, dlm's or etcd's."""

    @property
    def pids(self) -> list[int]: ...

    def leader_index(self, timeout: float) -> int: ...

    def wait_all_agree(self, timeout: float) -> None: ...

    def max_term(self) -> int:
        """The highest Raft term any live member reports (each election raises it)."""
        ...

    def kill(self, i: int) -> None: ...

    def restart(self, i: int) -> None: ...

    def stop(self) -> None: ...


# ---------------------------------------------------------------------------
# The dlm cluster
# ---------------------------------------------------------------------------


class DlmCluster(ProcessCluster):
    """Three `dlm node start` processes on 127.0.0.1, data under ``base_dir``."""

    def __init__(
        self, base_dir: str, size: int = 3, *, auth: bool = False, partitions: int = 1
    ) -> None:
        super().__init__(base_dir, [f"n{i + 1}" for i in range(size)])
        self.addrs = [f"127.0.0.1:{p}" for p in free_ports(size)]
        self.partitions = partitions
        """Raft groups per member (P > 1: each member is a supervisor and P children)."""
        self.secret_file: str | None = None
        self._peer_secret_file: str | None = None
        secret = None
        if auth:
            from dlm import auth as dlm_auth

            os.makedirs(base_dir, exist_ok=True)
            self.secret_file = os.path.join(base_dir, "client.secret")
            self._peer_secret_file = os.path.join(base_dir, "peer.secret")
            dlm_auth.write_secret_file(self.secret_file)
            dlm_auth.write_secret_file(self._peer_secret_file)
            secret = dlm_auth.load_secret(self.secret_file)
        self._client = Client(self.addrs, secret=secret)

    def _command(self, i: int) -> list[str]:
        peers = ",".join(f"{n}={a}" for n, a in zip(self.names, self.addrs, strict=True))
        data = os.path.join(self.base_dir, self.names[i])
        args = ["--id", self.names[i], "--listen", self.addrs[i], "--peers", peers, "--data", data]
        if self.secret_file is not None and self._peer_secret_file is not None:
            args += ["--client-secret-file", self.secret_file]
            args += ["--peer-secret-file", self._peer_secret_file]
        if self.partitions != 1:  # P = 1 stays today's command line, byte for byte
            args += ["--partitions", str(self.partitions)]
        return [sys.executable, "-m", "dlm", "node", "start", *args]

    def start(self) -> None:
        self.spawn_all()
        self.leader_index(LEADER_TIMEOUT_S)

    def _member_status(self, i: int, partition: int) -> StatusView | None:
        if partition == 0:
            return self._client.member_status(self.addrs[i], timeout=1.0)
        # Partition i > 0 of a member: its own view, over a connection dialled with the
        # partition's preamble (the client's connection, as its drivers use it).
        from dlm.client import core
        from dlm.client.core import ConnectionBroken, without_id
        from dlm.client.errors import AuthFailed
        from dlm.client.sync import _Connection
        from dlm.wire import Status

        deadline = time.monotonic() + 1.0
        try:
            conn, greeting = _Connection.open(
                self.addrs[i], deadline, self._client._secret, None, partition
            )
        except (ConnectionBroken, ValueError, AuthFailed):
            return None
        try:
            if greeting.get("t") != "welcome":
                return None
            reply = conn.request(without_id(Status(id=0, stale=True)), deadline)
        except ConnectionBroken:
            return None
        finally:
            conn.close()
        return core.own_view(reply)

    def _views(self, partition: int = 0) -> dict[int, StatusView]:
        views = {}
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                continue
            view = self._member_status(i, partition)
            if view is not None:
                views[i] = view
        return views

    def leader_of(self, key: str, timeout: float) -> int:
        """The member leading the partition of ``key``."""
        from dlm.partitioning import partition_of

        return self.leader_index(timeout, partition_of(key, self.partitions))

    def leader_index(self, timeout: float, partition: int = 0) -> int:
        """The member that says it leads (``partition``), in the highest term any live
        member reports."""
        deadline = time.monotonic() + timeout
        while True:
            views = self._views(partition)
            top_term = max((v.term or 0 for v in views.values()), default=0)
            for i, view in views.items():
                if view.role == "leader" and (view.term or 0) == top_term:
                    return i
            dead = [self.names[i] for i, p in enumerate(self.procs) if p and p.poll() is not None]
            if dead and len(dead) == len(self.names):
                raise RuntimeError(f"every dlm node exited; see the logs in {self.base_dir}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no dlm leader after {timeout:.0f} s (logs: {self.base_dir})")
            time.sleep(0.05)

    def max_term(self) -> int:
        """The highest term of each partition, summed: what it gains is how many elections
        there were, in any partition."""
        return sum(
            max((v.term or 0 for v in self._views(p).values()), default=0)
            for p in range(self.partitions)
        )

    def wait_all_agree(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for partition in range(self.partitions):
            while True:
                views = self._views(partition)
                leaders = {v.leader for v in views.values()}
                if len(views) == len(self.names) and len(leaders) == 1 and None not in leaders:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"dlm members do not agree on a leader of {partition}")
                time.sleep(0.05)


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time the given members have used so far, each member's whole
    process tree (a partitioned member's supervisor and partitions, snapshot children)."""
    return sum(usage.cpu_s for usage in tree_usage(pids))


# ---------------------------------------------------------------------------
# Closed-loop load
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cell:
    hot: bool
    clients: int
    procs: int
    warmup: float
    seconds: float
    key_prefix: str

    @property
    def label(self) -> str:
        return f"{'hot key' if self.hot else 'distinct keys'}, c={self.clients}"


@dataclass(slots=True)
class WorkerResult:
    acquire_s: list[float] = field(default_factory=list)
    pair_s: list[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    first_error: str = ""
    cpu_s: float = 0.0


async def _client_loop(
    session: LockSession, key: str, hot: bool, window: tuple[float, float], out: WorkerResult
) -> None:
    measure_from, stop_at = window
    while (start := time.monotonic()) < stop_at:
        try:
            await asyncio.wait_for(session.acquire(key, wait=hot), OP_TIMEOUT_S + HOT_WAIT_S)
            acquired = time.monotonic()
            await asyncio.wait_for(session.release(key), OP_TIMEOUT_S)
        except Exception as exc:
            out.errors += 1
            out.first_error = out.first_error or f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.01)  # an erroring cluster must not be spun on
            continue
        done = time.monotonic()
        if measure_from <= done <= stop_at:
            out.completed += 1
            if start >= measure_from:
                out.acquire_s.append(acquired - start)
                out.pair_s.append(done - start)


async def _drive(target: Target, cell: Cell, indices: Sequence[int], barrier: Any) -> WorkerResult:
    out = WorkerResult()
    keys = [f"{cell.key_prefix}/hot" if cell.hot else f"{cell.key_prefix}/{i}" for i in indices]
    sessions = await asyncio.wait_for(
        asyncio.gather(*(open_session(target) for _ in keys)), SETUP_TIMEOUT_S
    )
    try:
        await asyncio.to_thread(barrier.wait, SETUP_TIMEOUT_S)
        measure_from = time.monotonic() + cell.warmup
        window = (measure_from, measure_from + cell.seconds)

        async def sample_cpu() -> None:
            await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
            started = time.process_time()
            await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
            out.cpu_s = time.process_time() - started

        await asyncio.gather(
            sample_cpu(),
            *(
                _client_loop(s, k, cell.hot, window, out)
                for s, k in zip(sessions, keys, strict=True)
            ),
        )
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(s.close() for s in sessions), return_exceptions=True), 10.0
            )
    return out


def _worker(target: Target, cell: Cell, indices: list[int], barrier: Any, results: Any) -> None:
    try:
        result = asyncio.run(_drive(target, cell, indices, barrier))
    except BaseException as exc:
        barrier.abort()
        result = WorkerResult(errors=1, first_error=f"{type(exc).__name__}: {exc}")
    results.put(asdict(result))


@dataclass(slots=True)
class CellResult:
    label: str
    hot: bool
    clients: int
    procs: int
    seconds: float
    pairs_per_s: float
    acquire: Percentiles
    pair: Percentiles
    errors: int
    first_error: str
    client_cpu: float  # cores' worth: CPU seconds per wall second
    server_cpu: float
    elections: int = 0
    """Terms the cluster went through during the cell (warm-up included); 0 when steady."""
    partitions: int = 1
    """The partition count of the cluster measured (etcd: 1)."""
    server_cpu_members: list[float] = field(default_factory=list)
    """server_cpu of each member (its whole process tree), in the cluster's member order."""
    server_write_bytes: float = 0.0
    """Bytes per second the members handed to write/send calls (sockets and files)."""
    supervisor_cpu: float = 0.0
    """The members' top processes alone (P > 1: the supervisors, which accept connections)."""
    leader: int | None = None
    """The member that led (partition 0) when the cell started, an index into the above."""
    load_average: float = math.nan
    """The machine's 1-minute load average when the window ended (other work shows here)."""

    @property
    def server_cpu_per_pair_us(self) -> float:
        """Server CPU (every member) per completed pair, in microseconds."""
        return self.server_cpu / self.pairs_per_s * 1e6 if self.pairs_per_s else math.nan

    @property
    def write_bytes_per_pair(self) -> float:
        """Bytes the members wrote (network and log together) per completed pair."""
        return self.server_write_bytes / self.pairs_per_s if self.pairs_per_s else math.nan


def run_cell(target: Target, cell: Cell, server_pids: Sequence[int]) -> CellResult:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(cell.procs + 1)
    results = ctx.Queue()
    shares = [list(range(cell.clients))[k :: cell.procs] for k in range(cell.procs)]
    workers = [
        ctx.Process(target=_worker, args=(target, cell, share, barrier, results), daemon=True)
        for share in shares
        if share
    ]
    members = [0.0] * len(server_pids)
    written = supervisors = 0.0
    load_average = math.nan
    collected: list[WorkerResult] = []
    for w in workers:
        w.start()
    try:
        try:
            barrier.wait(SETUP_TIMEOUT_S)
            time.sleep(cell.warmup)
            before = tree_usage(server_pids)
            time.sleep(cell.seconds)
            after = tree_usage(server_pids)
            load_average = os.getloadavg()[0]
            members = [
                (a.cpu_s - b.cpu_s) / cell.seconds for a, b in zip(after, before, strict=True)
            ]
            written = sum(a.write_bytes - b.write_bytes for a, b in zip(after, before, strict=True))
            written /= cell.seconds
            supervisors = sum(
                a.root_cpu_s - b.root_cpu_s for a, b in zip(after, before, strict=True)
            )
            supervisors /= cell.seconds
        except threading.BrokenBarrierError:
            pass  # a worker failed its set-up; its result says why
        deadline = time.monotonic() + OP_TIMEOUT_S + HOT_WAIT_S + 15
        while len(collected) < len(workers) and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                collected.append(WorkerResult(**results.get(timeout=0.5)))
    finally:
        for w in workers:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
                w.join(timeout=5)
    acquire = [x for r in collected for x in r.acquire_s]
    pair = [x for r in collected for x in r.pair_s]
    missing = len(workers) - len(collected)
    first_error = next((r.first_error for r in collected if r.first_error), "")
    if missing:
        first_error = first_error or f"{missing} load process(es) sent no result"
    return CellResult(
        label=cell.label,
        hot=cell.hot,
        clients=cell.clients,
        procs=len(workers),
        seconds=cell.seconds,
        pairs_per_s=sum(r.completed for r in collected) / cell.seconds,
        acquire=summarize(acquire),
        pair=summarize(pair),
        errors=sum(r.errors for r in collected) + missing,
        first_error=first_error,
        client_cpu=sum(r.cpu_s for r in collected) / cell.seconds,
        server_cpu=sum(members),
        server_cpu_members=members,
        server_write_bytes=written,
        supervisor_cpu=supervisors,
        load_average=load_average,
    )


# ---------------------------------------------------------------------------
# Failover
# ---------------------------------------------------------------------------


async def _failover_once(target: Target, kill_leader: Callable[[], None]) -> float | None:
    session = await asyncio.wait_for(open_session(target), SETUP_TIMEOUT_S)
    kill_at: float | None = None
    recovered = asyncio.Event()
    recovered_at = 0.0
    steady = asyncio.Event()
    pairs = 0
    stop = False

    async def loop() -> None:
        nonlocal recovered_at, pairs
        while not stop:
            issued = time.monotonic()
            try:
                await session.acquire(FAILOVER_KEY, wait=True)
            except Exception:
                await asyncio.sleep(0.01)
                continue
            if kill_at is not None and issued >= kill_at and not recovered.is_set():
                recovered_at = time.monotonic()
                recovered.set()
            with contextlib.suppress(Exception):
                await session.release(FAILOVER_KEY)
            pairs += 1
            if pairs >= 20:
                steady.set()

    task = asyncio.create_task(loop())
    try:
        await asyncio.wait_for(steady.wait(), SETUP_TIMEOUT_S)
        kill_at = time.monotonic()
        kill_leader()
        await asyncio.wait_for(recovered.wait(), FAILOVER_TIMEOUT_S)
        return recovered_at - kill_at
    except TimeoutError:
        return None
    finally:
        stop = True
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(session.close(), 5.0)


def measure_failover(
    system: str, cluster: Cluster, endpoints: Sequence[str], repeats: int
) -> list[float | None]:
    samples: list[float | None] = []
    for _ in range(repeats):
        if isinstance(cluster, DlmCluster):  # the leader of the key's partition (P > 1)
            leader = cluster.leader_of(FAILOVER_KEY, LEADER_TIMEOUT_S)
        else:
            leader = cluster.leader_index(LEADER_TIMEOUT_S)
        ordered = (endpoints[leader], *(a for i, a in enumerate(endpoints) if i != leader))
        attempt = ETCD_FAILOVER_ATTEMPT_S if system == "etcd" else None
        target = Target(system, ordered, attempt, getattr(cluster, "secret_file", None))
        samples.append(asyncio.run(_failover_once(target, functools.partial(cluster.kill, leader))))
        cluster.restart(leader)
        cluster.wait_all_agree(LEADER_TIMEOUT_S)
    return samples


# ---------------------------------------------------------------------------
# One system, every cell
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class SystemRun:
    system: str
    version: str = ""
    error: str = ""
    cells: list[CellResult] = field(default_factory=list)
    kind: str = ""
    """Which client reaches it, "dlm" or "etcd" (default: ``system``; bench.ab names runs A, B)."""
    failover_s: list[float | None] = field(default_factory=list)

    def best(self, hot: bool, clients: int) -> CellResult | None:
        matching = [c for c in self.cells if c.hot == hot and c.clients == clients]
        return max(matching, key=lambda c: c.pairs_per_s, default=None)

    def __post_init__(self) -> None:
        self.kind = self.kind or self.system

    @property
    def failover_median(self) -> float | None:
        ok = [s for s in self.failover_s if s is not None]
        return statistics.median(ok) if ok else None


def cell_plan(args: argparse.Namespace) -> list[tuple[bool, int, int]]:
    """(hot, clients, load processes) of every cell, in the order they run."""
    plan = []
    kinds = {"distinct": (False,), "hot": (True,)}.get(args.keys, (False, True))
    for hot in kinds:
        for clients in args.clients:
            models = [1] if clients < 16 or args.procs <= 1 else [1, args.procs]
            if args.model == "loop":
                models = [1]
            elif args.model == "procs":
                models = [min(args.procs, clients)]
            plan += [(hot, clients, procs) for procs in models]
    return plan


@dataclass
class Contender:
    """One system under test: its cluster (running), its results, where its load goes."""

    run: SystemRun
    cluster: Cluster
    endpoints: list[str]
    target: Target | None = None
    leader: int | None = None
    """The member that led when ``target`` was made (partition 0's leader when P > 1)."""

    def run_cell(
        self, args: argparse.Namespace, hot: bool, clients: int, procs: int, record: bool = True
    ) -> None:
        """One cell on this system; ``record=False`` runs it only to settle the cluster."""
        if self.target is None:
            leader = self.leader = self.cluster.leader_index(LEADER_TIMEOUT_S)
            ordered = (
                self.endpoints[leader],
                *(a for i, a in enumerate(self.endpoints) if i != leader),
            )
            secret_file = getattr(self.cluster, "secret_file", None)
            self.target = Target(self.run.kind, ordered, secret_file=secret_file)
        system = self.run.system
        prefix = f"bench/{system}/{'h' if hot else 'd'}{clients}x{procs}/{os.getpid()}"
        seconds = args.seconds if record else args.settle
        cell = Cell(hot, clients, procs, args.warmup, seconds, prefix)
        term_before = self.cluster.max_term()
        result = run_cell(self.target, cell, self.cluster.pids)
        result.elections = max(0, self.cluster.max_term() - term_before)
        result.partitions = getattr(self.cluster, "partitions", 1)
        result.leader = self.leader
        if not record:
            settled = f"{result.pairs_per_s:.0f} pairs/s, not recorded"
            print(f"  {system}: settled ({settled})", flush=True)
            return
        self.run.cells.append(result)
        _progress(system, result)

    def failover_once(self) -> None:
        self.run.failover_s += measure_failover(self.run.kind, self.cluster, self.endpoints, 1)
        self.target = None  # the leader moved


def run_interleaved(
    contenders: Sequence[Contender],
    args: argparse.Namespace,
    after_step: Callable[[int], None] | None = None,
) -> None:
    """Every cell on each system in turn (the order alternating from cell to cell), then the
    failovers the same way: load from the rest of the machine that comes and goes then
    falls on both systems alike, and the ratios compare figures taken minutes apart at most.
    ``after_step(n)`` runs after step n of the cell plan (the second load generator's
    cells, bench/loadgen.py).
    """
    live = list(contenders)

    def attempt(contender: Contender, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:
            contender.run.error = f"{type(exc).__name__}: {exc}"
            print(f"{contender.run.system}: skipped the rest: {contender.run.error}", flush=True)
            live.remove(contender)

    if args.settle > 0:
        # A fresh cluster is slow for its first seconds (measured: a first c=1 cell's pair
        # p50 8.0 ms, the next ones 4.2-5.2 ms), which weighed on whichever cell came first.
        for contender in list(live):
            attempt(contender, functools.partial(contender.run_cell, args, False, 1, 1, False))
    for n, (hot, clients, procs) in enumerate(cell_plan(args)):
        for contender in live[:: 1 if n % 2 == 0 else -1]:
            attempt(contender, functools.partial(contender.run_cell, args, hot, clients, procs))
        if after_step is not None:
            after_step(n)
    for n in range(args.failovers):
        for contender in live[:: 1 if n % 2 == 0 else -1]:
            attempt(contender, contender.failover_once)
    for contender in contenders:
        samples = contender.run.failover_s
        if samples:
            shown = ", ".join("timeout" if s is None else f"{s:.2f}" for s in samples)
            print(f"  {contender.run.system}: kill -9 leader -> next acquire (s): {shown}")


def _progress(system: str, r: CellResult) -> None:
    note = f"  errors {r.errors} ({r.first_error})" if r.errors else ""
    print(
        f"  {system}: {r.label:20} procs={r.procs}  {r.pairs_per_s:8.0f} pairs/s"
        f"  acquire p50 {r.acquire.p50_ms:7.2f} p99 {r.acquire.p99_ms:7.2f} ms"
        f"  pair p50 {r.pair.p50_ms:7.2f} p99 {r.pair.p99_ms:7.2f} ms"
        f"  cpu client {r.client_cpu:4.2f} server {r.server_cpu:4.2f}"
        f" ({r.server_cpu_per_pair_us:5.0f} us/pair)  elections {r.elections}{note}",
        flush=True,
    )


def bench_both(
    args: argparse.Namespace, base_dir: str, second: SecondRun | None = None
) -> tuple[SystemRun, SystemRun]:
    """Starts dlm's cluster and etcd's (unless --only says otherwise), runs them
    interleaved, and stops every process by PID. ``second`` (a bench.loadgen.SecondRun):
    the second load generator runs item 4's cells on dlm's cluster, each right after
    this harness's, and fills it in."""
    dlm_run, etcd_run = SystemRun("dlm"), SystemRun("etcd")
    clusters: list[tuple[SystemRun, DlmCluster | etcd_bench.EtcdCluster, list[str], str]] = []
    if args.only in ("all", "dlm"):
        dlm = DlmCluster(os.path.join(base_dir, "dlm"), auth=args.auth, partitions=args.partitions)
        partitions = f", {args.partitions} partitions" if args.partitions > 1 else ""
        clusters.append((dlm_run, dlm, dlm.addrs, f"dlm: 3 nodes up{partitions}"))
    else:
        dlm_run.error = "not run (--only)"
    if args.only in ("dlm", "partitions"):
        etcd_run.error = "not run (--only)"
    elif (version := etcd_bench.etcd_version()) is None:
        etcd_run.error = "etcd is not installed (apt-get install etcd-server etcd-client)"
        print(f"etcd: skipped: {etcd_run.error}", flush=True)
    else:
        etcd_run.version = version
        etcd = etcd_bench.EtcdCluster(os.path.join(base_dir, "etcd"))
        clusters.append((etcd_run, etcd, etcd.client_addrs, f"etcd {version}: 3 members up"))
    contenders = []
    try:
        for run, cluster, addrs, up in clusters:
            os.makedirs(cluster.base_dir, exist_ok=True)
            try:
                cluster.start()
            except Exception as exc:
                run.error = f"{type(exc).__name__}: {exc}"
                print(f"{run.system}: did not start: {run.error}", flush=True)
                continue
            print(f"{up} on {', '.join(addrs)}", flush=True)
            contenders.append(Contender(run, cluster, addrs))
        run_interleaved(contenders, args, _second_generator(second, contenders, args))
    finally:
        for _, cluster, _, _ in clusters:
            cluster.stop()
    return dlm_run, etcd_run


def _second_generator(
    second: SecondRun | None, contenders: Sequence[Contender], args: argparse.Namespace
) -> Callable[[int], None] | None:
    """The hook that runs bench/loadgen.py's cells on dlm's cluster, or None."""
    dlm = next((c for c in contenders if c.run.system == "dlm"), None)
    if second is None or dlm is None:
        return None
    if args.partitions != 1:
        second.error = "not run: it drives clusters of one partition (item 4's cells are P = 1)"
        return None
    if args.auth:
        second.error = "not run: it does not authenticate (item 4's cells run without --auth)"
        return None
    from bench import loadgen

    def endpoints() -> Sequence[str]:
        return dlm.target.endpoints if dlm.target is not None else dlm.endpoints

    return loadgen.interleaved_hook(cell_plan(args), endpoints, lambda: dlm.cluster.pids, second)


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    figure: str
    floor: float | None
    etcd: float | None
    dlm: float | None
    unit: str
    target: str = ""
    """The goal from issue #14, in words."""
    goal: Callable[[Row], bool | None] | None = None
    """Whether this run met ``target`` (None: not measured)."""

    @property
    def ratio(self) -> float | None:
        if self.dlm is None or self.etcd is None or self.etcd == 0:
            return None
        if math.isnan(self.dlm) or math.isnan(self.etcd):
            return None
        return self.dlm / self.etcd

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.goal(self)


def _ratio_at_most(limit: float) -> Callable[[Row], bool | None]:
    return lambda row: None if row.ratio is None else row.ratio <= limit


def _ratio_at_least(limit: float) -> Callable[[Row], bool | None]:
    return lambda row: None if row.ratio is None else row.ratio >= limit


def _dlm_at_most(limit: float) -> Callable[[Row], bool | None]:
    return lambda row: None if row.dlm is None or math.isnan(row.dlm) else row.dlm <= limit


def build_rows(floor: Floor, dlm: SystemRun, etcd: SystemRun, clients: Sequence[int]) -> list[Row]:
    rows = [
        Row("fsync of a 100 B append, p50", floor.fsync.p50_ms, None, None, "ms"),
        Row("fsync of a 100 B append, p99", floor.fsync.p99_ms, None, None, "ms"),
        Row("loopback TCP round trip, p50", floor.rtt.p50_ms, None, None, "ms"),
        Row("loopback TCP round trip, p99", floor.rtt.p99_ms, None, None, "ms"),
    ]

    def value(run: SystemRun, hot: bool, c: int, pick: Callable[[CellResult], float]) -> Any:
        cell = run.best(hot, c)
        return None if cell is None else pick(cell)

    top = max(clients)
    dlm_hot_top = dlm.best(True, top)
    hot_p50 = dlm_hot_top.pair.p50_ms if dlm_hot_top is not None else math.nan

    Figure = tuple[str, Callable[[CellResult], float], float | None, str, str, Any]
    for hot in (False, True):
        for c in clients:
            where = f"c={c}, {'one hot key' if hot else 'distinct keys'}"
            single = c == 1 and not hot
            # Issue 29: distinct keys at the largest c >= 2x etcd's pairs/s; one hot key
            # >= 1x etcd's at c=1 and at the largest c.
            pairs_factor = (
                (1.0 if c in (1, top) else None) if hot else (2.0 if c == top and c > 1 else None)
            )
            pairs_target = f">= {pairs_factor:.0f} x etcd" if pairs_factor else ""
            figures: list[Figure] = [
                (
                    "pairs/s",
                    lambda r: r.pairs_per_s,
                    1e3 / floor.pair_p50_ms if single else None,
                    "/s",
                    pairs_target,
                    _ratio_at_least(pairs_factor) if pairs_factor else None,
                ),
                (
                    "acquire p50",
                    lambda r: r.acquire.p50_ms,
                    floor.commit_p50_ms if single else None,
                    "ms",
                    "",
                    None,
                ),
                ("acquire p99", lambda r: r.acquire.p99_ms, None, "ms", "", None),
                (
                    "pair p50",
                    lambda r: r.pair.p50_ms,
                    floor.pair_p50_ms if single else None,
                    "ms",
                    "<= 1.0 x etcd" if single else "",
                    _ratio_at_most(1.0) if single else None,
                ),
                (
                    "pair p99",
                    lambda r: r.pair.p99_ms,
                    None,
                    "ms",
                    f"<= 2 x p50 ({2 * hot_p50:.0f} ms)" if hot and c == top else "",
                    _dlm_at_most(2 * hot_p50) if hot and c == top else None,
                ),
                (
                    "server CPU per pair",
                    lambda r: r.server_cpu_per_pair_us,
                    None,
                    "us",
                    "<= 0.5 x etcd" if c == top and not hot else "",
                    _ratio_at_most(0.5) if c == top and not hot else None,
                ),
            ]
            for name, pick, floor_value, unit, target, goal in figures:
                rows.append(
                    Row(
                        f"{name}, {where}",
                        floor_value,
                        value(etcd, hot, c, pick),
                        value(dlm, hot, c, pick),
                        unit,
                        target,
                        goal,
                    )
                )
    for name, pick in (
        ("load generator CPU", lambda r: r.client_cpu),
        ("server CPU (3 members)", lambda r: r.server_cpu),
    ):
        rows.append(
            Row(
                f"{name}, c={top}, distinct keys",
                None,
                value(etcd, False, top, pick),
                value(dlm, False, top, pick),
                "cores",
            )
        )
    rows.append(
        Row(
            "kill -9 leader -> next acquire, median",
            None,
            etcd.failover_median,
            dlm.failover_median,
            "s",
            "<= 0.4 s",
            _dlm_at_most(0.4),
        )
    )
    rows.append(
        Row(
            "elections during the cells",
            None,
            float(sum(c.elections for c in etcd.cells)) if etcd.cells else None,
            float(sum(c.elections for c in dlm.cells)) if dlm.cells else None,
            "count",
            "0",
            _dlm_at_most(0),
        )
    )
    return rows


def _fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):  # NaN: no samples
        return "-"
    if unit == "/s":
        return f"{value:,.0f}"
    if unit == "cores":
        return f"{value:.2f}"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "us":
        return f"{value:,.0f} us"
    if unit == "count":
        return f"{value:.0f}"
    return f"{value:.2f} ms" if value < 100 else f"{value:,.0f} ms"


def render_table(rows: Sequence[Row]) -> str:
    lines = [
        "| figure | floor | etcd | dlm | dlm/etcd | target | met |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        met = {None: "", True: "yes", False: "**no**"}[r.met]
        lines.append(
            f"| {r.figure} | {_fmt(r.floor, r.unit)} | {_fmt(r.etcd, r.unit)} "
            f"| {_fmt(r.dlm, r.unit)} | {ratio} | {r.target} | {met} |"
        )
    return "\n".join(lines)


def render_cells(runs: Sequence[SystemRun]) -> str:
    """Every cell measured, with its elections: a cell with one is not a steady figure."""
    lines = [
        "| system | cell | procs | pairs/s | pair p50 | pair p99 | server CPU/pair | elections |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for r in run.cells:
            lines.append(
                f"| {run.system} | {r.label} | {r.procs} | {r.pairs_per_s:,.0f} "
                f"| {_fmt(r.pair.p50_ms, 'ms')} | {_fmt(r.pair.p99_ms, 'ms')} "
                f"| {_fmt(r.server_cpu_per_pair_us, 'us')} | {r.elections} |"
            )
    return "\n".join(lines)


def render_models(runs: Sequence[SystemRun]) -> str:
    """Pairs/s of each load model, so the better one is visible, not just used."""
    lines = [
        "| system | cell | 1 loop: pairs/s (client CPU) | N procs: pairs/s (client CPU) |",
        "|---|---|---:|---:|",
    ]
    for run in runs:
        seen: dict[tuple[bool, int], dict[int, CellResult]] = {}
        for cell in run.cells:
            seen.setdefault((cell.hot, cell.clients), {})[cell.procs] = cell
        for (_, _), by_procs in seen.items():
            if len(by_procs) < 2:
                continue
            single = by_procs[1]
            multi = max((p for p in by_procs if p > 1), default=1)
            many = by_procs[multi]
            lines.append(
                f"| {run.system} | {single.label} | {single.pairs_per_s:,.0f} "
                f"({single.client_cpu:.2f}) | {multi} procs: {many.pairs_per_s:,.0f} "
                f"({many.client_cpu:.2f}) |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def _jsonable(run: SystemRun) -> dict[str, Any]:
    out = asdict(run)
    out["failover_median_s"] = run.failover_median
    return out


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def _client_counts(text: str) -> list[int]:
    counts = sorted({int(x) for x in text.split(",") if x.strip()})
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("expected positive integers, e.g. 1,16,64")
    return counts


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.locks",
        description="dlm lock-service benchmark (closed loop, 3 local members, fsync on).",
    )
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="window per cell")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP, help="before each window")
    parser.add_argument(
        "--clients", type=_client_counts, default=list(CLIENT_COUNTS), help="e.g. 1,16,64"
    )
    parser.add_argument(
        "--procs", type=int, default=DEFAULT_PROCS, help="load processes in the multi-process model"
    )
    parser.add_argument(
        "--model",
        choices=("both", "loop", "procs"),
        default="both",
        help="load model for c >= 16: one asyncio loop, --procs processes, or both (best shown)",
    )
    parser.add_argument(
        "--keys", choices=("both", "distinct", "hot"), default="both", help="which cells run"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=DEFAULT_SETTLE,
        help="seconds of unrecorded c=1 load on each fresh cluster before the first cell (0: none)",
    )
    parser.add_argument("--failovers", type=int, default=DEFAULT_FAILOVERS, help="0 to skip")
    parser.add_argument(
        "--only",
        choices=("all", "dlm", "etcd", "partitions"),
        default="all",
        help="partitions: only the partitioned cells (dlm alone)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=1,
        metavar="P",
        help="partitions of the dlm cluster the main cells and failovers run on (default 1)",
    )
    parser.add_argument("--no-etcd", action="store_true", help="same as --only dlm")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    parser.add_argument(
        "--data-dir", default=None, help="where temporary data dirs go (default: the system tmp)"
    )
    parser.add_argument(
        "--results",
        default=DEFAULT_RESULTS,
        metavar="DIR",
        help="write NAME.md, NAME.png and NAME.json here ('' to skip)",
    )
    parser.add_argument("--name", default="locks", help="file name of the results (no suffix)")
    parser.add_argument(
        "--auth",
        action="store_true",
        help="dlm's members require a client secret and a peer secret (every frame carries a MAC)",
    )
    parser.add_argument("--label", default=None, help="what the heading says was run")
    from bench import partitions

    partitions.add_arguments(parser)
    from bench import loadgen

    loadgen.add_arguments(parser)
    args = parser.parse_args(argv)
    if (problem := check_partitions(args.partitions)) is not None:
        parser.error(problem)
    if args.no_etcd:
        args.only = "dlm"
    if args.label is None:
        args.label = "authentication on, TLS off" if args.auth else "authentication and TLS off"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    # Other work on the machine skews every figure; the load average makes that visible.
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dlm-bench-", dir=args.data_dir) as base_dir:
        floor = measure_floor(base_dir)
        print(
            f"floor: fsync p50 {floor.fsync.p50_ms:.3f} ms p99 {floor.fsync.p99_ms:.3f} ms; "
            f"loopback RTT p50 {floor.rtt.p50_ms:.3f} ms p99 {floor.rtt.p99_ms:.3f} ms",
            flush=True,
        )
        second = None
        if args.only in ("all", "dlm") and not args.no_second_generator:
            from bench import loadgen

            second = loadgen.SecondRun(args.second_seconds, args.second_warmup, args.second_procs)
        dlm, etcd = bench_both(args, base_dir, second)
        parted = None
        if args.only in ("all", "dlm", "partitions") and args.partition_cells:
            from bench import partitions

            # After the dlm/etcd cells, whose clusters are stopped by now: the partition
            # clusters run side by side with each other only.
            parted = partitions.run_phase(args, base_dir)
    load_after = os.getloadavg()
    rows = build_rows(floor, dlm, etcd, args.clients)
    members = (
        f"3 members ({args.partitions} partitions each)" if args.partitions > 1 else ("3 members")
    )
    heading = (
        f"dlm lock benchmark ({args.label}): {members} on 127.0.0.1, fsync on, "
        f"{args.seconds:g} s per cell after {args.warmup:g} s warm-up; {os.cpu_count()} CPUs; "
        f"etcd {etcd.version or '-'}; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after"
    )
    table = render_table(rows)
    cells = render_cells([dlm, etcd])
    models = render_models([dlm, etcd])
    errors = [f"{run.system}: {run.error}" for run in (dlm, etcd) if run.error]
    if args.only == "partitions":
        errors = []
    partition_sections: list[tuple[str, str]] = []
    if parted is not None:
        from bench import partitions

        partition_sections = [
            ("Partitioned cells", partitions.heading_line(parted)),
            *partitions.sections_of(parted, floor.fsync.p50_ms),
        ]
        errors += [f"partitions: {line}" for line in parted.errors]
    main_sections = [
        ("dlm beside etcd", table),
        ("Every cell", cells),
        ("Load generator models", models),
    ]
    if second is not None:
        from bench import loadgen

        main_sections.append(loadgen.section(second, dlm.best))
    if args.only == "partitions":  # no dlm/etcd cells: no empty tables either
        main_sections = []
    else:
        print()
        print(heading)
        print(table)
        print()
        print("Every cell (elections: terms the cluster went through during the cell):")
        print(cells)
        if models:
            print()
            print("Load generator models (the table above uses the better of the two):")
            print(models)
        if second is not None:
            print()
            print("Second load generator (bench/loadgen.py) beside bench.locks, same cells:")
            print(main_sections[-1][1])
    for name, body in partition_sections:
        if body:
            print(f"\n{name}:\n{body}")
    for line in errors:
        print(line)
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    everything = {
        "label": args.label,
        "floor": asdict(floor),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "dlm": _jsonable(dlm),
        "etcd": _jsonable(etcd),
        "partitions": None if parted is None else asdict(parted),
        "second_generator": None if second is None else loadgen.jsonable(second, dlm.best),
        "table": [
            {
                "figure": r.figure,
                "unit": r.unit,
                "floor": r.floor,
                "etcd": r.etcd,
                "dlm": r.dlm,
                "ratio": r.ratio,
                "target": r.target,
                "met": r.met,
            }
            for r in rows
        ],
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=2)
    if args.results:
        from bench import report

        written = report.write_lock_results(
            args.results,
            args.name,
            heading=heading,
            sections=[*main_sections, *partition_sections],
            notes=errors,
            runs=(dlm, etcd),
            everything=everything,
        )
        print("results: " + ", ".join(written))
    return 0


if __name__ == "__main__":
    # Worker processes are spawned, so their functions must belong to bench.locks, not __main__.
    from bench import locks  # noqa: PLW0406

    raise SystemExit(locks.main())
