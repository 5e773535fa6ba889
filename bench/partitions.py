"""The partitioned cells of the lock benchmark: one workload against clusters of 1, 2 and 4
partitions, same run, and the scale model the figures feed (bench/README.md).

``make bench`` (``python -m bench.locks``) runs these after its dlm/etcd cells;
``python -m bench.partitions`` runs them alone. What happens:

1. One 3-member cluster per partition count in ``--partition-cells`` (default
   1,2,4), and with ``--scale-members 5`` one 5-member P = 1 cluster as well
   (the scale model's hosts hold every partition, so a partition there has
   five voters: this cluster measures what a leader and a follower cost
   with four followers). All run side by side for the whole phase, idle
   while another is measured; their idle CPU is measured first and shown.
2. Every partition of every cluster is warmed: a key of each partition is
   read from its leader, so each partition has a leader before any window.
3. Cells: c clients (default 64) on distinct keys, closed loop, ``--procs``
   load processes, ``--partition-rounds`` rounds (default 2), each round in
   the opposite order of the one before (1, 2, 4, then 4, 2, 1), so load from
   the rest of the machine falls on every count alike.
4. Server CPU of a member is its whole process tree: with P > 1 the supervisor
   and its P partition processes, read from /proc by PID (bench/procs.py).
   The 1-minute load average when each window ended is kept beside it.
5. With P > 1, the supervisor's accept path alone: ``CONNECTS`` connections,
   one after another, each sending the preamble of partition 1 and closing;
   the supervisors' own CPU per connection.

Every cell's JSON says its ``partitions`` (and ``members``). Every process
started here is stopped by PID (bench/procs.py), also on errors.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.floor import measure_floor
from bench.locks import (
    DEFAULT_PROCS,
    DEFAULT_RESULTS,
    DEFAULT_SECONDS,
    DEFAULT_WARMUP,
    CellResult,
    Contender,
    DlmCluster,
    SystemRun,
    cpu_seconds,
)
from bench.procs import thread_cpu_s
from dlm.partitioning import MAX_PARTITIONS, partition_of, preamble

DEFAULT_COUNTS = (1, 2, 4)
DEFAULT_CLIENTS = 64
DEFAULT_ROUNDS = 2
DEFAULT_SCALE_MEMBERS = 5
IDLE_SAMPLE_S = 2.0
CONNECTS = 1000
WARM_TIMEOUT_S = 30.0

# The cluster the scale model describes (bench/README.md, "Partitions: a scale model").
MODEL_HOSTS = 5
MODEL_CORES = 16
MODEL_RESERVED_CORES = 1  # per host: the OS, the supervisor, interrupts
MODEL_NIC_BYTES_S = 1.25e9  # 10 Gbit/s


@dataclass(frozen=True, slots=True)
class Setup:
    """One cluster of the phase."""

    members: int
    partitions: int

    @property
    def name(self) -> str:
        return f"{self.members} members, P={self.partitions}"

    @property
    def slug(self) -> str:
        return f"m{self.members}p{self.partitions}"


@dataclass(slots=True)
class PartitionRun:
    """Everything the phase measured (it becomes the JSON's ``partitions`` object)."""

    counts: list[int]
    clients: int
    procs: int
    rounds: int
    seconds: float
    scale_members: int
    cells: list[dict[str, Any]] = field(default_factory=list)
    """asdict(CellResult) of each cell plus ``members``, ``round`` and the derived figures."""
    idle_cpu: dict[str, float] = field(default_factory=dict)
    """Server CPU (cores) of each cluster while every cluster was idle, by setup name."""
    supervisor_us_per_connect: dict[str, float] = field(default_factory=dict)
    """With P > 1: the supervisors' CPU per connection handed to partition 1, by setup name."""
    errors: list[str] = field(default_factory=list)
    load_average_before: float = math.nan
    load_average_after: float = math.nan


def _counts(text: str) -> list[int]:
    if text.strip().lower() in ("", "none", "0"):
        return []
    counts = sorted({int(x) for x in text.split(",") if x.strip()})
    if not counts or min(counts) < 1 or max(counts) > MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"expected partition counts 1 to {MAX_PARTITIONS}")
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of this phase, shared by bench.locks and ``python -m bench.partitions``."""
    parser.add_argument(
        "--partition-cells",
        type=_counts,
        default=list(DEFAULT_COUNTS),
        metavar="LIST",
        help="partition counts measured side by side, c clients on distinct keys ('' skips)",
    )
    parser.add_argument(
        "--partition-clients", type=int, default=DEFAULT_CLIENTS, help="c of the partition cells"
    )
    parser.add_argument(
        "--partition-rounds", type=int, default=DEFAULT_ROUNDS, help="rounds of partition cells"
    )
    parser.add_argument(
        "--scale-members",
        type=int,
        default=DEFAULT_SCALE_MEMBERS,
        help="also measure a P=1 cluster of this many members for the scale model (0 skips)",
    )


# ---------------------------------------------------------------------------
# Running the phase
# ---------------------------------------------------------------------------


def _warm_every_partition(cluster: DlmCluster, secret_file: str | None) -> None:
    """Reads a key of each partition from its leader, so each has one before any cell."""
    from dlm.client.sync import Client

    secret = None
    if secret_file is not None:
        from dlm import auth

        secret = auth.load_secret(secret_file)
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < cluster.partitions:
        key = f"bench/warm/{n}"
        keys.setdefault(partition_of(key, cluster.partitions), key)
        n += 1
    with Client(cluster.addrs, timeout=WARM_TIMEOUT_S, secret=secret) as client:
        for key in keys.values():
            client.get(key)  # a read that is not stale: that partition's leader answers it


def _measure_idle(clusters: dict[Setup, DlmCluster]) -> dict[str, float]:
    """Server CPU of each cluster over the same IDLE_SAMPLE_S, all of them idle."""
    before = {s: cpu_seconds(c.pids) for s, c in clusters.items()}
    time.sleep(IDLE_SAMPLE_S)
    return {s.name: (cpu_seconds(c.pids) - before[s]) / IDLE_SAMPLE_S for s, c in clusters.items()}


def _measure_connects(cluster: DlmCluster) -> float:
    """The supervisors' own CPU (microseconds) per connection to partition 1: each
    connection sends the preamble and closes, so the supervisor accepts it, reads the
    preamble and hands the socket over; nothing else."""
    pids = cluster.pids
    before = sum(thread_cpu_s(pid) for pid in pids)
    first = preamble(1)
    for n in range(CONNECTS):
        host, port = cluster.addrs[n % len(cluster.addrs)].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5.0) as sock:
            sock.sendall(first)
    time.sleep(0.5)  # let the last hand-overs finish before reading the CPU
    after = sum(thread_cpu_s(pid) for pid in pids)
    return (after - before) / CONNECTS * 1e6


def _cell_record(result: CellResult, setup: Setup, round_no: int) -> dict[str, Any]:
    record = asdict(result)
    record.update(
        members=setup.members,
        round=round_no,
        server_cpu_per_pair_us=result.server_cpu_per_pair_us,
        write_bytes_per_pair=result.write_bytes_per_pair,
    )
    return record


def run_phase(args: argparse.Namespace, base_dir: str) -> PartitionRun:
    """Starts the clusters, runs the cells, stops every process by PID."""
    run = PartitionRun(
        counts=list(args.partition_cells),
        clients=args.partition_clients,
        procs=min(args.procs, args.partition_clients),
        rounds=args.partition_rounds,
        seconds=args.seconds,
        scale_members=args.scale_members,
    )
    setups = [Setup(3, p) for p in args.partition_cells]
    if args.scale_members and args.scale_members != 3 and setups:
        setups.append(Setup(args.scale_members, 1))
    if not setups:
        return run
    run.load_average_before = os.getloadavg()[0]
    clusters: dict[Setup, DlmCluster] = {}
    contenders: dict[Setup, Contender] = {}
    try:
        for setup in setups:
            cluster = DlmCluster(
                os.path.join(base_dir, setup.slug),
                setup.members,
                auth=args.auth,
                partitions=setup.partitions,
            )
            clusters[setup] = cluster
            os.makedirs(cluster.base_dir, exist_ok=True)
            try:
                cluster.start()
                _warm_every_partition(cluster, cluster.secret_file)
            except Exception as exc:
                run.errors.append(f"{setup.name}: did not start: {type(exc).__name__}: {exc}")
                print(run.errors[-1], flush=True)
                continue
            print(f"{setup.name}: up on {', '.join(cluster.addrs)}", flush=True)
            contenders[setup] = Contender(
                SystemRun(f"dlm-{setup.slug}", kind="dlm"), cluster, cluster.addrs
            )
        live = {s: clusters[s] for s in contenders}
        run.idle_cpu = _measure_idle(live)
        print(
            "idle server CPU: "
            + ", ".join(f"{name} {cpu:.2f}" for name, cpu in run.idle_cpu.items()),
            flush=True,
        )
        order = list(contenders)
        for round_no in range(1, args.partition_rounds + 1):
            for setup in order if round_no % 2 == 1 else order[::-1]:
                contender = contenders.get(setup)
                if contender is None:
                    continue
                try:
                    contender.run_cell(args, False, run.clients, run.procs)
                except Exception as exc:
                    run.errors.append(f"{setup.name}: {type(exc).__name__}: {exc}")
                    print(f"{setup.name}: skipped the rest: {run.errors[-1]}", flush=True)
                    del contenders[setup]
                    continue
                result = contender.run.cells[-1]
                run.cells.append(_cell_record(result, setup, round_no))
                supervisors = (
                    f", supervisors {result.supervisor_cpu:.3f} cores"
                    if setup.partitions > 1
                    else ""
                )
                print(
                    f"    ({setup.name}, round {round_no}: load average"
                    f" {result.load_average:.1f}{supervisors})",
                    flush=True,
                )
        for setup in contenders:
            if setup.partitions > 1:
                try:
                    us = _measure_connects(clusters[setup])
                except OSError as exc:
                    run.errors.append(f"{setup.name}: connects: {exc}")
                    continue
                run.supervisor_us_per_connect[setup.name] = us
                print(f"{setup.name}: supervisor CPU per connection {us:.0f} us", flush=True)
    finally:
        for cluster in clusters.values():
            cluster.stop()
        run.load_average_after = os.getloadavg()[0]
    return run


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """One setup's cells taken together (every round)."""

    setup: Setup
    cells: int
    pairs_per_s: float
    """Mean over the rounds."""
    server_cpu: float
    """Mean cores, every member's tree."""
    cpu_per_pair_us: float
    """All the rounds' server CPU over all their pairs."""
    leader_cpu_per_pair_us: float
    """P = 1: the leading member's CPU per pair (NaN when P > 1: every member leads some)."""
    follower_cpu_per_pair_us: float
    """P = 1: a following member's CPU per pair, the mean of the followers."""
    write_bytes_per_pair: float
    pair_p50_ms: float
    pair_p99_ms: float
    client_cpu: float
    supervisor_cpu: float
    load_averages: list[float]
    elections: int


def _mean(values: Sequence[float]) -> float:
    ok = [v for v in values if not math.isnan(v)]
    return statistics.fmean(ok) if ok else math.nan


def summarize_setups(run: PartitionRun) -> list[Summary]:
    out = []
    seen: list[Setup] = []
    for record in run.cells:
        setup = Setup(record["members"], record["partitions"])
        if setup not in seen:
            seen.append(setup)
    for setup in seen:
        cells = [
            r
            for r in run.cells
            if r["members"] == setup.members and r["partitions"] == setup.partitions
        ]
        pairs = sum(r["pairs_per_s"] * r["seconds"] for r in cells)
        cpu = sum(r["server_cpu"] * r["seconds"] for r in cells)
        written = sum(r["server_write_bytes"] * r["seconds"] for r in cells)
        leader_cpu = follower_cpu = math.nan
        if setup.partitions == 1:
            lead = [
                (r["server_cpu_members"][r["leader"]] * r["seconds"], r)
                for r in cells
                if r["leader"] is not None and len(r["server_cpu_members"]) == setup.members
            ]
            if lead and pairs:
                leader_cpu = sum(x for x, _ in lead) / pairs * 1e6
                rest = sum(r["server_cpu"] * r["seconds"] for _, r in lead) - sum(
                    x for x, _ in lead
                )
                follower_cpu = rest / (setup.members - 1) / pairs * 1e6
        out.append(
            Summary(
                setup=setup,
                cells=len(cells),
                pairs_per_s=_mean([r["pairs_per_s"] for r in cells]),
                server_cpu=_mean([r["server_cpu"] for r in cells]),
                cpu_per_pair_us=cpu / pairs * 1e6 if pairs else math.nan,
                leader_cpu_per_pair_us=leader_cpu,
                follower_cpu_per_pair_us=follower_cpu,
                write_bytes_per_pair=written / pairs if pairs else math.nan,
                pair_p50_ms=statistics.median(r["pair"]["p50_ms"] for r in cells),
                pair_p99_ms=statistics.median(r["pair"]["p99_ms"] for r in cells),
                client_cpu=_mean([r["client_cpu"] for r in cells]),
                supervisor_cpu=_mean([r["supervisor_cpu"] for r in cells]),
                load_averages=[r["load_average"] for r in cells],
                elections=sum(r["elections"] for r in cells),
            )
        )
    return out


def _num(value: float, fmt: str = ",.0f", unit: str = "") -> str:
    return "-" if value is None or math.isnan(value) else f"{value:{fmt}}{unit}"


def render_table(run: PartitionRun) -> str:
    """Each partition count beside P = 1 (same run, same workload)."""
    summaries = summarize_setups(run)
    base = next((s for s in summaries if s.setup == Setup(3, 1)), None)
    lines = [
        "| cluster | pairs/s | x P=1 | pairs/s per partition | server CPU (cores) "
        "| server CPU per pair | x P=1 | of which supervisors | bytes written per pair "
        "| pair p50 | pair p99 | idle server CPU | load average (1 min) | elections |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for s in summaries:
        ratio = cpu_ratio = math.nan
        if base is not None and s.setup.members == base.setup.members:
            ratio = s.pairs_per_s / base.pairs_per_s if base.pairs_per_s else math.nan
            cpu_ratio = s.cpu_per_pair_us / base.cpu_per_pair_us
        supervisors = (
            f"{s.supervisor_cpu / s.pairs_per_s * 1e6:,.0f} us"
            if s.setup.partitions > 1 and s.pairs_per_s
            else "-"
        )
        loads = ", ".join(f"{x:.1f}" for x in s.load_averages)
        lines.append(
            f"| {s.setup.name} | {_num(s.pairs_per_s)} | {_num(ratio, '.2f')} "
            f"| {_num(s.pairs_per_s / s.setup.partitions)} | {_num(s.server_cpu, '.2f')} "
            f"| {_num(s.cpu_per_pair_us, ',.0f', ' us')} | {_num(cpu_ratio, '.2f')} "
            f"| {supervisors} | {_num(s.write_bytes_per_pair, ',.0f', ' B')} "
            f"| {_num(s.pair_p50_ms, '.2f', ' ms')} | {_num(s.pair_p99_ms, '.2f', ' ms')} "
            f"| {_num(run.idle_cpu.get(s.setup.name, math.nan), '.2f')} | {loads} "
            f"| {s.elections} |"
        )
    return "\n".join(lines)


def render_cells(run: PartitionRun) -> str:
    lines = [
        "| round | cluster | pairs/s | pair p50 | pair p99 | server CPU (cores) "
        "| per member (cores) | CPU per pair | load generator CPU | load average | elections |",
        "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in run.cells:
        setup = Setup(r["members"], r["partitions"])
        per_member = " / ".join(
            f"{'*' if i == r['leader'] and setup.partitions == 1 else ''}{x:.2f}"
            for i, x in enumerate(r["server_cpu_members"])
        )
        lines.append(
            f"| {r['round']} | {setup.name} | {r['pairs_per_s']:,.0f} "
            f"| {r['pair']['p50_ms']:.2f} ms | {r['pair']['p99_ms']:.2f} ms "
            f"| {r['server_cpu']:.2f} | {per_member} "
            f"| {_num(r['server_cpu_per_pair_us'], ',.0f', ' us')} | {r['client_cpu']:.2f} "
            f"| {r['load_average']:.1f} | {r['elections']} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The scale model (bench/README.md explains it; this computes it from the run)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleModel:
    """What a cluster of MODEL_HOSTS hosts x MODEL_CORES cores would do, from this run."""

    leader_us: float
    """A partition leader's CPU per pair with four followers (5-member cell, or scaled)."""
    follower_us: float
    pair_us: float
    """Every replica's CPU per pair: leader + 4 followers."""
    idle_process_cores: float
    """What one idle partition process costs (heartbeats, timers), from the widest cluster."""
    overhead: float
    """CPU per pair at the largest P over P = 1, same run (3 members): what partitioning
    cost here, where each of P partitions carried 1/P of the load."""
    widest: int
    """That largest P."""
    partitions: int
    usable_cores_per_host: float
    cpu_bound_pairs_s: float
    partition_bound_pairs_s: float
    """What one partition does when its leader process has a whole core."""
    pairs_s: float
    pessimistic_pairs_s: float
    """``pairs_s`` if every pair also cost ``overhead`` times more."""
    bytes_per_pair: float
    nic_share: float
    """A host's bytes written per second over its NIC's capacity."""
    log_entries_per_host_s: float
    note: str


def scale_model(run: PartitionRun) -> ScaleModel | None:
    summaries = {s.setup: s for s in summarize_setups(run)}
    p1 = summaries.get(Setup(3, 1))
    if p1 is None or math.isnan(p1.cpu_per_pair_us) or math.isnan(p1.leader_cpu_per_pair_us):
        return None
    widest = max(
        (s for s in summaries.values() if s.setup.members == 3), key=lambda s: s.setup.partitions
    )
    overhead = widest.cpu_per_pair_us / p1.cpu_per_pair_us
    idle = run.idle_cpu.get(widest.setup.name, math.nan)
    idle_process = idle / (3 * widest.setup.partitions) if not math.isnan(idle) else 0.0
    five = summaries.get(Setup(5, 1))
    if five is not None and not math.isnan(five.leader_cpu_per_pair_us):
        leader, follower = five.leader_cpu_per_pair_us, five.follower_cpu_per_pair_us
        bytes_per_pair = five.write_bytes_per_pair
        note = "leader and follower CPU per pair measured with 5 members, P = 1"
    else:
        # Without the 5-member cell: a follower costs what it costs with 3 members, and the
        # leader's work grows with what it sends: assume half its CPU is per follower.
        follower = p1.follower_cpu_per_pair_us
        leader = p1.leader_cpu_per_pair_us * (0.5 + 0.5 * 4 / 2)
        bytes_per_pair = p1.write_bytes_per_pair * 5 / 3
        note = "5-member figures extrapolated from 3 members (no 5-member cell)"
    pair_us = leader + 4 * follower
    partition_bound = 1e6 / leader
    # The partition count and the cores left for pairs depend on each other (every
    # partition process costs its idle share on every host): a few rounds settle it.
    partitions = MODEL_HOSTS
    usable = cpu_bound = 0.0
    for _ in range(8):
        usable = MODEL_CORES - MODEL_RESERVED_CORES - partitions * idle_process
        cpu_bound = MODEL_HOSTS * usable * 1e6 / pair_us
        wanted = MODEL_HOSTS * math.ceil(cpu_bound / partition_bound / MODEL_HOSTS)
        wanted = min(MAX_PARTITIONS - MAX_PARTITIONS % MODEL_HOSTS, max(MODEL_HOSTS, wanted))
        if wanted == partitions:
            break
        partitions = wanted
    pairs_s = min(cpu_bound, partitions * partition_bound)
    per_host_bytes = pairs_s * bytes_per_pair / MODEL_HOSTS
    return ScaleModel(
        leader_us=leader,
        follower_us=follower,
        pair_us=pair_us,
        idle_process_cores=idle_process,
        overhead=overhead,
        widest=widest.setup.partitions,
        partitions=partitions,
        usable_cores_per_host=usable,
        cpu_bound_pairs_s=cpu_bound,
        partition_bound_pairs_s=partition_bound,
        pairs_s=pairs_s,
        pessimistic_pairs_s=min(cpu_bound, partitions * partition_bound) / overhead,
        bytes_per_pair=bytes_per_pair,
        nic_share=per_host_bytes / MODEL_NIC_BYTES_S,
        log_entries_per_host_s=2 * pairs_s,
        note=note,
    )


def render_scale_model(
    run: PartitionRun, fsync_ms: float | None, connect_us: float | None = None
) -> str:
    m = scale_model(run)
    if m is None:
        return ""
    h, k, r = MODEL_HOSTS, MODEL_CORES, MODEL_RESERVED_CORES
    lines = [
        f"From this run ({m.note}); bench/README.md states the assumptions.",
        "",
        f"- CPU per pair, every replica of a 5-voter partition: leader {m.leader_us:,.0f} us"
        f" + 4 x follower {m.follower_us:,.0f} us = {m.pair_us:,.0f} us",
        f"- One partition (its leader's process on one core): 1e6 / {m.leader_us:,.0f}"
        f" = {m.partition_bound_pairs_s:,.0f} pairs/s",
        f"- An idle partition process costs {m.idle_process_cores:.3f} cores (idle CPU of the"
        f" P = {m.widest} cluster / its {3 * m.widest} partition processes)",
        f"- Cores for pairs per host: {k} - {r} reserved - P x {m.idle_process_cores:.3f}"
        f" = {m.usable_cores_per_host:.1f}; CPU bound {h} x {m.usable_cores_per_host:.1f}"
        f" x 1e6 / {m.pair_us:,.0f} = {m.cpu_bound_pairs_s:,.0f} pairs/s",
        f"- Partitions: {m.cpu_bound_pairs_s:,.0f} / {m.partition_bound_pairs_s:,.0f} rounded up"
        f" to a multiple of {h} (leaders spread evenly): P = {m.partitions}, i.e. {m.partitions}"
        f" partition processes on every host, {m.partitions // h} of them leading",
        f"- Throughput: min(CPU bound, P x one partition) = {m.pairs_s:,.0f} pairs/s;"
        f" if every pair cost {m.overhead:.2f} x more, as at P = {m.widest} here (each partition"
        f" at 1/{m.widest} of the load, smaller batches): {m.pessimistic_pairs_s:,.0f} pairs/s",
        f"- Network: {m.bytes_per_pair:,.0f} B written per pair (5 members; log and sockets"
        f" together, an upper bound for the network) x {m.pairs_s:,.0f} / {h} hosts"
        f" = {m.pairs_s * m.bytes_per_pair / h / 1e6:,.0f} MB/s per host,"
        f" {m.nic_share:.1%} of 10 Gbit/s",
        f"- Log: every host appends every entry, 2 per pair: 2 x {m.pairs_s:,.0f}"
        f" = {m.log_entries_per_host_s:,.0f} entries/s per host over {m.partitions} logs"
        f" ({m.log_entries_per_host_s / m.partitions:,.0f} per log)",
    ]
    if fsync_ms:
        serial = 1e3 / fsync_ms
        lines.append(
            f"- fsync: {fsync_ms:.2f} ms here (p50 of the floor). A log that syncs back to back"
            f" does {serial:,.0f} fsyncs/s, so each of its fsyncs carries"
            f" {m.log_entries_per_host_s / m.partitions / serial:,.1f} entries; a device that"
            f" flushes one file at a time does {serial:,.0f} for the whole host, so each"
            f" fsync would carry {m.log_entries_per_host_s / serial:,.0f} entries and a commit"
            f" could wait for the other {m.partitions - 1} logs' flushes"
            f" ({(m.partitions - 1) * fsync_ms:,.0f} ms)"
        )
    if connect_us is not None:
        lines.append(
            f"- Supervisor accept path: {connect_us:,.0f} us of CPU per connection: one"
            f" supervisor per host accepts at most {1e6 / connect_us:,.0f} connections/s"
            f" ({h * 1e6 / connect_us:,.0f} for the cluster); a connection is handed over once,"
            f" requests never pass through it"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Alone: python -m bench.partitions
# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.partitions",
        description="dlm partitioned cells alone: P = 1, 2, 4 side by side (3 members, fsync on).",
    )
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="window per cell")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP, help="before each window")
    parser.add_argument("--procs", type=int, default=DEFAULT_PROCS, help="load processes")
    parser.add_argument("--auth", action="store_true", help="members require secrets")
    parser.add_argument("--data-dir", default=None, help="where temporary data dirs go")
    parser.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR", help="'' skips")
    parser.add_argument("--name", default="partitions", help="file name of the results")
    add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.partition_cells:
        print(
            "bench.partitions: no partition counts to measure (--partition-cells)", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="dlm-bench-", dir=args.data_dir) as base_dir:
        floor = measure_floor(base_dir)
        run = run_phase(args, base_dir)
    heading = heading_line(run)
    sections = sections_of(run, floor.fsync.p50_ms)
    print()
    print(heading)
    for name, body in sections:
        if body:
            print(f"\n{name}:\n{body}")
    for line in run.errors:
        print(line)
    if args.results:
        import json

        from bench import report

        os.makedirs(args.results, exist_ok=True)
        base = os.path.join(args.results, args.name)
        with open(base + ".json", "w") as f:
            json.dump({"floor": asdict(floor), "partitions": asdict(run)}, f, indent=2)
        with open(base + ".md", "w") as f:
            f.write(report.markdown_page("Partition benchmark", heading, sections, run.errors, ""))
        print(f"results: {base}.md, {base}.json")
    return 0


def heading_line(run: PartitionRun) -> str:
    return (
        f"c={run.clients} clients on distinct keys, {run.procs} load processes,"
        f" {run.seconds:g} s per cell, {run.rounds} rounds (order reversed each round);"
        f" {os.cpu_count()} CPUs; load average {run.load_average_before:.1f} before,"
        f" {run.load_average_after:.1f} after"
    )


def sections_of(run: PartitionRun, fsync_ms: float | None) -> list[tuple[str, str]]:
    connects = ", ".join(
        f"{name}: {us:,.0f} us" for name, us in run.supervisor_us_per_connect.items()
    )
    return [
        ("Partitions: each P beside P = 1", render_table(run)),
        ("Every partition cell (* marks the leading member when P = 1)", render_cells(run)),
        (
            "Supervisor accept path",
            f"Supervisors' CPU per connection handed to partition 1 ({CONNECTS} connections, "
            f"one at a time): {connects}"
            if connects
            else "",
        ),
        (
            "Scale model: 5 hosts x 16 cores",
            render_scale_model(
                run,
                fsync_ms,
                max(run.supervisor_us_per_connect.values(), default=None),
            ),
        ),
    ]


if __name__ == "__main__":
    from bench import partitions  # noqa: PLW0406

    raise SystemExit(partitions.main())
