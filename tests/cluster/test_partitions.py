"""Members of several partitions: a supervisor per member, one process per partition.

A 3-member cluster started with ``--partitions 4`` elects a leader in every
partition (each asked over its own connection, which names it with the
preamble); a partition process that is killed is started again by its
supervisor and rejoins its group; SIGTERM stops every process of a member;
kill -9 of a whole member leaves every partition with a leader among the other
two; a stranger's bad or missing preamble costs the member nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, RawConn, wait_for

PARTITIONS = 4
TIMEOUT = 30.0


@pytest.fixture
def partitioned(tmp_path: Path) -> Iterator[Cluster]:
    """Three members of four partitions each, every partition with a leader."""
    c = Cluster(tmp_path, size=3, partitions=PARTITIONS)
    try:
        c.start_all()
        c.wait_for_leaders(timeout=TIMEOUT)
        yield c
    finally:
        c.stop_all()


def test_every_partition_elects_and_says_which_it_is(partitioned: Cluster) -> None:
    leaders = partitioned.wait_for_leaders(timeout=TIMEOUT)
    assert sorted(leaders) == list(range(PARTITIONS))
    for node in partitioned.nodes.values():
        assert len(node.child_pids()) == PARTITIONS
        for partition in range(PARTITIONS):
            with RawConn(node.address, partition=partition) as conn:
                assert conn.welcome["partitions"] == PARTITIONS
                assert conn.welcome.get("partition", 0) == partition
                status = conn.request({"t": "status", "stale": True})
            assert status["partition"] == partition
            assert status["partitions"] == PARTITIONS


def test_a_killed_partition_process_is_restarted_and_rejoins(partitioned: Cluster) -> None:
    node = partitioned.nodes["n2"]
    children = node.child_pids()
    victim = children[1]
    os.kill(victim, signal.SIGKILL)

    def restarted() -> bool:
        now = node.child_pids()
        return len(now) == PARTITIONS and victim not in now

    wait_for(restarted, TIMEOUT, "the supervisor to start partition 1 again")
    assert node.alive
    # The new process serves partition 1 and follows its group's leader again.
    wait_for(
        lambda: (s := node.status(partition=1)) is not None and s.get("leader"),
        TIMEOUT,
        "the restarted partition to know its leader",
    )
    partitioned.wait_for_leaders(timeout=TIMEOUT)


def test_sigterm_stops_every_partition_process(partitioned: Cluster) -> None:
    node = partitioned.nodes["n3"]
    children = node.child_pids()
    assert len(children) == PARTITIONS
    assert node.terminate(grace=20.0) == 0

    def all_gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() for pid in children)

    wait_for(all_gone, TIMEOUT, "every partition process to exit")


def test_kill_9_of_a_whole_member_leaves_a_leader_in_every_partition(
    partitioned: Cluster,
) -> None:
    leaders = partitioned.wait_for_leaders(timeout=TIMEOUT)
    # The member that leads the most partitions: the others must elect without it.
    counts = {n: sum(1 for v in leaders.values() if v.node_id == n) for n in partitioned.nodes}
    victim = max(counts, key=lambda n: counts[n])
    partitioned.nodes[victim].kill()
    after = partitioned.wait_for_leaders(timeout=TIMEOUT, not_=victim)
    assert all(leader.node_id != victim for leader in after.values())
