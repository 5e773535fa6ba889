"""bench/partitions.py: the figures of the partitioned cells and the scale model's arithmetic,
from cells made up here (no cluster)."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from bench import partitions
from bench.floor import Percentiles
from bench.locks import CellResult, parse_args


def _cell(partitions_: int, pairs_s: float, members_cpu: list[float], leader: int) -> CellResult:
    return CellResult(
        label="distinct keys, c=64",
        hot=False,
        clients=64,
        procs=2,
        seconds=2.0,
        pairs_per_s=pairs_s,
        acquire=Percentiles(10.0, 20.0, 100),
        pair=Percentiles(20.0, 40.0, 100),
        errors=0,
        first_error="",
        client_cpu=0.4,
        server_cpu=sum(members_cpu),
        partitions=partitions_,
        server_cpu_members=members_cpu,
        server_write_bytes=pairs_s * 3000,
        leader=leader,
        load_average=2.5,
    )


def _record(cell: CellResult, members: int, round_no: int) -> dict[str, object]:
    out = asdict(cell)
    out.update(
        members=members,
        round=round_no,
        server_cpu_per_pair_us=cell.server_cpu_per_pair_us,
        write_bytes_per_pair=cell.write_bytes_per_pair,
    )
    return out


def _run() -> partitions.PartitionRun:
    run = partitions.PartitionRun(
        counts=[1, 4], clients=64, procs=2, rounds=1, seconds=2.0, scale_members=5
    )
    # P = 1: 2,000 pairs/s; the leader (member 1) 0.8 cores, the followers 0.3 each:
    # 400 us + 2 x 150 us = 700 us per pair.
    run.cells.append(_record(_cell(1, 2000.0, [0.3, 0.8, 0.3], 1), 3, 1))
    # P = 4: the same pairs/s for 1.54 cores: 770 us per pair, overhead 1.1.
    run.cells.append(_record(_cell(4, 2000.0, [0.5, 0.52, 0.52], 0), 3, 1))
    # 5 members, P = 1: 1,000 pairs/s; leader 0.5 cores (500 us), followers 0.2 (200 us).
    run.cells.append(_record(_cell(1, 1000.0, [0.5, 0.2, 0.2, 0.2, 0.2], 0), 5, 1))
    return run


def test_a_setups_cpu_per_pair_and_the_leaders_share() -> None:
    by_setup = {s.setup: s for s in partitions.summarize_setups(_run())}
    p1 = by_setup[partitions.Setup(3, 1)]
    assert p1.cpu_per_pair_us == pytest.approx(700)
    assert p1.leader_cpu_per_pair_us == pytest.approx(400)
    assert p1.follower_cpu_per_pair_us == pytest.approx(150)
    assert p1.write_bytes_per_pair == pytest.approx(3000)
    p4 = by_setup[partitions.Setup(3, 4)]
    assert p4.cpu_per_pair_us == pytest.approx(770)
    assert math.isnan(p4.leader_cpu_per_pair_us)  # every member leads some partition


def test_the_scale_model_shows_its_arithmetic() -> None:
    run = _run()
    run.idle_cpu["3 members, P=4"] = 0.12  # 12 partition processes: 0.01 cores each
    model = partitions.scale_model(run)
    assert model is not None
    assert model.pair_us == pytest.approx(500 + 4 * 200)  # the 5-member cell: 1,300 us
    assert model.partition_bound_pairs_s == pytest.approx(2000)  # 1e6 / 500 us
    assert model.idle_process_cores == pytest.approx(0.01)
    # 30 partitions on every host cost 0.3 cores idle: 16 - 1 - 0.3 = 14.7 cores for pairs.
    assert model.usable_cores_per_host == pytest.approx(14.7)
    assert model.cpu_bound_pairs_s == pytest.approx(5 * 14.7e6 / 1300)  # 56,538
    # 56,538 / 2,000 = 28.3 partitions: 30, a multiple of the 5 hosts.
    assert model.partitions == 30
    assert model.pairs_s == pytest.approx(5 * 14.7e6 / 1300)
    assert model.overhead == pytest.approx(1.1)
    assert model.pessimistic_pairs_s == pytest.approx(5 * 14.7e6 / 1300 / 1.1)
    text = partitions.render_scale_model(run, fsync_ms=0.2, connect_us=50.0)
    assert "P = 30" in text and "5,000 fsyncs/s" in text and "20,000 connections/s" in text


def test_the_table_puts_each_count_beside_p_1() -> None:
    table = partitions.render_table(_run())
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert rows["3 members, P=4"].split("|")[3].strip() == "1.00"  # pairs/s x P=1
    assert rows["3 members, P=4"].split("|")[7].strip() == "1.10"  # CPU per pair x P=1


def test_bench_locks_runs_one_partition_unless_told() -> None:
    args = parse_args([])
    assert args.partitions == 1
    assert args.partition_cells == [1, 2, 4]
    assert parse_args(["--partitions", "4", "--partition-cells", ""]).partition_cells == []
    with pytest.raises(SystemExit):
        parse_args(["--partitions", "65"])
