"""partition_guard.py and the machine: a request about another partition's key is refused
with WRONG_PARTITION and the partition count; the others are served."""

from __future__ import annotations

from dlm.node.partition_guard import named_key, partition_refusal
from dlm.partitioning import partition_of
from dlm.wire import Acquire, ErrorCode, Get, ListLocks, Release, Runs, Status, Watch
from tests.unit.node.machine_driver import Cluster


def keys_in(partition: int, partitions: int, count: int = 3) -> list[str]:
    found: list[str] = []
    i = 0
    while len(found) < count:
        key = f"key-{i}"
        if partition_of(key, partitions) == partition:
            found.append(key)
        i += 1
    return found


def test_a_key_of_this_partition_is_served_and_one_of_another_is_refused() -> None:
    mine = keys_in(1, 4)
    theirs = keys_in(3, 4)
    for key in mine:
        assert partition_refusal(Get(id=5, key=key), 1, 4) is None
    refusal = partition_refusal(Acquire(id=7, client="c", seq=1, lease="l", key=theirs[0]), 1, 4)
    assert refusal is not None
    assert refusal["t"] == "error" and refusal["id"] == 7
    assert refusal["code"] == ErrorCode.WRONG_PARTITION.value
    assert refusal["partitions"] == 4
    assert "partition 3 of 4" in refusal["message"]


def test_requests_that_name_no_key_are_answered_by_any_partition() -> None:
    for request in (Status(id=1), ListLocks(id=2), Runs(id=3), Watch(id=4, prefix="a/")):
        assert named_key(request) is None
        assert partition_refusal(request, 2, 4) is None


def test_one_partition_serves_every_key() -> None:
    for key in keys_in(0, 4) + keys_in(2, 4):
        assert partition_refusal(Release(id=1, client="c", seq=2, lease="l", key=key), 0, 1) is None


def test_keyed_runs_and_watches_are_checked() -> None:
    other = keys_in(0, 2)[0]
    assert partition_refusal(Runs(id=1, key=other), 1, 2) is not None
    assert partition_refusal(Watch(id=1, key=other), 1, 2) is not None


def test_the_machine_of_one_partition_refuses_another_partitions_key_and_serves_its_own() -> None:
    cluster = Cluster(1, partition=1, partitions=4)
    cluster.elect("n1")
    client = cluster.connect("n1")
    assert client.call("open_lease", lease="L", ttl_ms=5_000)["t"] == "ok"
    mine, theirs = keys_in(1, 4)[0], keys_in(2, 4)[0]
    assert client.call("acquire", lease="L", key=mine)["t"] == "ok"
    refused = client.call("acquire", lease="L", key=theirs)
    assert refused["code"] == ErrorCode.WRONG_PARTITION.value and refused["partitions"] == 4
    assert client.call("get", key=theirs)["code"] == ErrorCode.WRONG_PARTITION.value
    assert cluster["n1"].machine.locks.counts().locks == 1
    status = client.call("status")
    assert status["partition"] == 1 and status["partitions"] == 4


def test_the_machine_of_one_partition_says_nothing_of_partitions() -> None:
    cluster = Cluster(1)
    cluster.elect("n1")
    client = cluster.connect("n1")
    status = client.call("status")
    assert "partition" not in status and "partitions" not in status
    assert client.call("get", key=keys_in(3, 4)[0])["t"] != "error"
