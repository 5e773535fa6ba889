"""Leader spread on real members (issue 25, item 2; dlm/node/spread.py).

Three members of four partitions: once every member is healthy, partition i is led by
its first choice, the voters sorted by id rotated left by i (n1, n2, n3, n1), so no
member leads more than ceil(4/3) = 2; after kill -9 of a member and its restart, the
partitions it led come back to it once it has been healthy for the settle time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlm.node.spread import leader_counts_bound, preference
from tests.cluster.harness import Cluster, partitioned_cluster, wait_for

PARTITIONS = 4
TIMEOUT = 60.0
"""Elections, then a settle time (10 election timeouts: 3 s) and a transfer per partition,
on a machine other tests load too."""


@pytest.fixture
def partitioned(tmp_path: Path) -> Iterator[Cluster]:
    with partitioned_cluster(tmp_path, PARTITIONS, timeout=TIMEOUT) as c:
        yield c


def _leaders(cluster: Cluster) -> dict[int, str]:
    found = {}
    for partition in range(PARTITIONS):
        leader = cluster.leader_now(partition)
        if leader is not None:
            found[partition] = leader.node_id
    return found


def _spread(cluster: Cluster) -> dict[int, str]:
    voters = sorted(cluster.nodes)
    return {p: preference(voters, p)[0] for p in range(PARTITIONS)}


def test_each_partition_ends_up_led_by_its_first_choice(partitioned: Cluster) -> None:
    wanted = _spread(partitioned)
    assert wanted == {0: "n1", 1: "n2", 2: "n3", 3: "n1"}
    wait_for(
        lambda: _leaders(partitioned) == wanted,
        TIMEOUT,
        f"every partition led by its first choice {wanted}",
        interval=0.25,
    )
    counts = Counter(_leaders(partitioned).values())
    assert max(counts.values()) <= leader_counts_bound(PARTITIONS, 3)


def test_the_spread_returns_after_a_member_comes_back(partitioned: Cluster) -> None:
    wanted = _spread(partitioned)
    wait_for(lambda: _leaders(partitioned) == wanted, TIMEOUT, "the spread", interval=0.25)
    n2 = partitioned.nodes["n2"]
    n2.kill()
    # Partition 1 (n2's) elects another leader; the others keep theirs or move off n2.
    partitioned.wait_for_leaders(timeout=TIMEOUT, not_="n2")
    n2.start()
    wait_for(
        lambda: _leaders(partitioned) == wanted,
        TIMEOUT,
        f"every partition led by its first choice {wanted} again after n2 came back",
        interval=0.25,
    )
