"""The client on a cluster of several partitions (issue 25): `dlm` and the Python API
route each key to its partition, a lease holds keys in several partitions as one
lease, and a partition's trouble stays its own.

One module-wide cluster of 3 members x 4 partitions serves the tests that only add
their own keys; the tests that kill or revoke get a cluster of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import dlm
from dlm.client import Client, core
from dlm.client.errors import LeaseLost
from dlm.partitioning import partition_of
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, wait_for

P = 4
TIMEOUT = 30.0


def key_in(partition: int, stem: str) -> str:
    for n in range(10_000):
        key = f"{stem}-{n}"
        if partition_of(key, P) == partition:
            return key
    raise AssertionError("no key")


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("partitioned"), size=3, partitions=P)
    try:
        c.start_all()
        c.wait_for_leaders(timeout=TIMEOUT)
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def cli(partitioned: Cluster, tmp_path: Path) -> Dlm:
    return Dlm(partitioned.members_env, tmp_path)


def test_exec_takes_a_key_in_every_partition(cli: Dlm) -> None:
    for partition in range(P):
        key = key_in(partition, "exec")
        proc = cli.run(
            "exec", "--lock", key, "--", "sh", "-c", 'echo "$DLM_LOCK_KEY $DLM_FENCING_TOKEN"'
        )
        assert proc.returncode == 0, proc.stderr
        shown_key, token = proc.stdout.split()
        assert shown_key == key and int(token) > 0


def test_acquire_renew_release_in_every_partition(cli: Dlm) -> None:
    for partition in range(P):
        key = key_in(partition, "acq")
        got = cli.json("acquire", key, "--ttl", "30s")
        lease = got["lease"]
        renewed = cli.run("renew", lease)
        assert renewed.returncode == 0, renewed.stderr
        held = cli.run("acquire", key, "--ttl", "30s")
        assert held.returncode == 75, held.stderr  # held by the first lease
        released = cli.run("release", key, "--lease", lease)
        assert released.returncode == 0, released.stderr


def test_one_lease_holds_keys_of_two_partitions(partitioned: Cluster) -> None:
    a, b = key_in(1, "two"), key_in(3, "two")
    with Client(partitioned.addresses, timeout=10.0) as client:
        lease = client.open_lease(20_000)
        ga = client.acquire(lease, a)
        gb = client.acquire(lease, b)
        assert ga.lease == gb.lease == lease.id
        book = client._book.parts(lease.id)
        assert book is not None and {1, 3} <= set(book)
        assert client.keepalive(lease) > 0
        info = client.lease_info(lease)
        assert info.lease == lease.id
        assert sorted(client.close_lease(lease)) == sorted([a, b])
        assert client.get(a).holders == [] and client.get(b).holders == []


def test_the_python_api_locks_keys_of_every_partition(partitioned: Cluster) -> None:
    with dlm.Client(partitioned.addresses) as client:
        for partition in range(P):
            key = key_in(partition, "api")
            with client.lock(key, ttl=10.0) as held:
                assert held.token > 0
                assert client.lock(key, ttl=10.0).acquire(blocking=False) is False


def test_a_lease_spanning_two_partitions_is_lost_when_one_part_is_revoked(
    partitioned: Cluster,
) -> None:
    a, b = key_in(0, "span"), key_in(2, "span")
    with Client(partitioned.addresses, timeout=10.0) as client:
        lease = client.open_lease(20_000)
        client.acquire(lease, a)
        client.acquire(lease, b)
        lost: list[str] = []
        with client.keep_alive(lease, on_lost=lost.append) as keeper:
            # An operator revokes the part in partition 2 only.
            with Client(partitioned.addresses, timeout=10.0) as admin:
                admin._run(
                    core.close_lease_flow(
                        admin._ctx, lease.id, must_exist=True, revoke=True, partition=2
                    )
                )
            wait_for(keeper.lost.is_set, TIMEOUT, "the keeper to see the lease lost")
        assert lost
        # The client closed the other part: key a is free again.
        wait_for(lambda: client.get(a).holders == [], TIMEOUT, "the part in partition 0 closed")
        with pytest.raises(LeaseLost):
            client.keepalive(lease)


def test_json_of_a_lease_list_is_one_object(cli: Dlm) -> None:
    proc = cli.run("lease", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
