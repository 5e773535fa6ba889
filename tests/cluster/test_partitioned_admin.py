"""Cluster-wide state of a partitioned cluster with real members (issue 25 item 5).

Three members of four partitions each: `dlm auth add` and `dlm auth set` reach every
partition (a limited identity is refused, and held to its quota, by each partition on
its own copy); `dlm members add` adds a fourth member to every partition's group, and
it joins them all; `dlm snapshot save` takes every partition into one file, which
`dlm node restore --partitions` turns into a cluster of two partitions and of one:
every lock is there with its token, and new grants' tokens are above every old one.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlm.partitioning import partition_of
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, RawConn, partitioned_cluster, wait_for

pytestmark = pytest.mark.cluster

PARTITIONS = 4
TIMEOUT = 30.0
SEQS = itertools.count(2)


def key_in(partition: int, partitions: int, prefix: str, skip: int = 0) -> str:
    """A key of ``partition`` (the ``skip``-th one) among ``prefix``0, ``prefix``1, ..."""
    found = 0
    for n in range(10_000):
        key = f"{prefix}{n}"
        if partition_of(key, partitions) == partition:
            if found == skip:
                return key
            found += 1
    raise AssertionError("no such key")


@pytest.fixture
def partitioned(tmp_path: Path) -> Iterator[Cluster]:
    (tmp_path / "c").mkdir()
    with partitioned_cluster(tmp_path / "c", PARTITIONS, timeout=TIMEOUT) as c:
        yield c


def as_identity(admin: Dlm, credential: Path) -> Dlm:
    dlm = Dlm(admin.env["DLM_CLUSTER"], admin.cwd)
    dlm.env["DLM_SECRET_FILE"] = str(credential)
    return dlm


def error_of(dlm: Dlm, *args: str, code: int) -> dict[str, Any]:
    error = dlm.json(*args, code=code)["error"]
    assert isinstance(error, dict)
    return error


def test_auth_changes_reach_every_partition(partitioned: Cluster, tmp_path: Path) -> None:
    admin = Dlm(partitioned.members_env, tmp_path)
    credential = tmp_path / "ci.cred"
    admin.json("auth", "add", "ci", "--role", "client", "--prefix", "ci/", "--out", str(credential))
    ci = as_identity(admin, credential)
    for p in range(PARTITIONS):
        # Outside its prefix: refused by every partition, each on its own copy.
        error = error_of(ci, "acquire", key_in(p, PARTITIONS, "prod/"), "--ttl", "20s", code=77)
        assert error["code"] == "PERMISSION_DENIED", (p, error)
    admin.json("auth", "set", "ci", "--max-locks", "1")
    # Every partition's own copy of the table has the limit.
    assert [identities_in(partitioned, p).get("ci", {}).get("max_locks") for p in PARTS] == [
        1
    ] * PARTITIONS
    for p in PARTS:
        taken = ci.json("acquire", key_in(p, PARTITIONS, "ci/"), "--ttl", "20s")
        assert taken["token"] > 0
        # Each partition holds ci to its own copy of the limit (counted per partition).
        error = error_of(ci, "acquire", key_in(p, PARTITIONS, "ci/", 1), "--ttl", "20s", code=77)
        assert error["code"] == "QUOTA_EXCEEDED", (p, error)
    # Removed everywhere: no partition knows it any more.
    admin.json("auth", "remove", "ci")
    assert all("ci" not in identities_in(partitioned, p) for p in PARTS)
    proc = ci.run("acquire", key_in(0, PARTITIONS, "ci/"), "--ttl", "5s")
    assert proc.returncode == 78, (proc.stdout, proc.stderr)


PARTS = range(PARTITIONS)


def identities_in(cluster: Cluster, partition: int) -> dict[str, dict[str, Any]]:
    """The identity table as ``partition``'s leader has it (asked directly, as the
    built-in admin of a cluster without a client secret)."""

    def listed() -> dict[str, dict[str, Any]] | None:
        leader = cluster.leader_now(partition)
        if leader is None:
            return None
        with RawConn(leader.address, partition=partition, timeout=10.0) as conn:
            reply = conn.request({"t": "auth_list"})
        if reply.get("t") != "ok":
            return None
        return {row["name"]: row for row in reply["identities"]}

    table: dict[str, dict[str, Any]] | None = None

    def got() -> bool:
        nonlocal table
        table = listed()
        return table is not None

    wait_for(got, TIMEOUT, f"partition {partition}'s identities")
    assert table is not None
    return table


def test_members_add_joins_a_fourth_member_to_every_group(
    partitioned: Cluster, tmp_path: Path
) -> None:
    admin = Dlm(partitioned.members_env, tmp_path)
    n4 = partitioned.add_node("n4")
    added = admin.json("members", "add", "n4", n4.address)
    assert added["partitions"] == PARTITIONS and added["added"]["id"] == "n4"
    n4.start()

    def a_voter_everywhere() -> bool:
        for p in range(PARTITIONS):
            leader = partitioned.leader_now(p)
            if leader is None:
                return False
            with RawConn(leader.address, partition=p) as conn:
                view = conn.request({"t": "members"})
            if "members" not in view:
                # Not the leader any more: adding n4 changes every partition's preferred
                # leader, so leaderships move while the member joins.
                return False
            roles = {m["id"]: m["role"] for m in view["members"]}
            if roles.get("n4") in (None, "learner"):
                return False
        return True

    wait_for(a_voter_everywhere, 60.0, "n4 to be a voter in every partition's group")
    listed = admin.json("members", "list")
    assert listed["partitions"] == PARTITIONS and listed["disagree"] == []
    assert "n4" in {m["id"] for m in listed["members"]}


def restore_into(cluster: Cluster, dlm: Dlm, backup: Path, partitions: int) -> list[dict[str, Any]]:
    """Every member stopped, its data gone, rebuilt from ``backup`` with ``partitions``
    partitions and started again (without --partitions: the directory says it)."""
    cluster.stop_all()
    reports = []
    for node in cluster.nodes.values():
        shutil.rmtree(node.data_dir, ignore_errors=True)
        report = dlm.json(
            "node",
            "restore",
            str(backup),
            "--data",
            str(node.data_dir),
            "--id",
            node.node_id,
            "--peers",
            cluster.peers_flag,
            "--partitions",
            str(partitions),
            "--quarantine",
            "1s",
        )["restored"]
        reports.append(report)
        node.partitions = None
    cluster.partitions = partitions
    cluster.start_all()
    cluster.wait_for_leaders(timeout=TIMEOUT)
    return reports


def hold(cluster: Cluster, key: str, ttl_ms: int) -> int:
    """``key`` taken by a lease of its own in its partition (asked of that partition's
    leader directly); the grant's token."""
    partition = partition_of(key, cluster.partitions)
    lease = f"lease-{key}".replace("/", "-")

    def granted() -> int | None:
        leader = cluster.leader_now(partition)
        if leader is None:
            return None
        with RawConn(leader.address, partition=partition, timeout=10.0) as conn:
            opened = conn.request({"t": "open_lease", "lease": lease, "ttl_ms": ttl_ms})
            if opened.get("t") != "ok":
                return None
            # A new seq each try: a re-sent seq is answered from the lease's memory.
            seq = next(SEQS)
            reply = conn.request({"t": "acquire", "lease": lease, "seq": seq, "key": key})
        return int(reply["token"]) if reply.get("t") == "ok" else None

    token: int = wait_for(granted, TIMEOUT, f"{key} to be granted")
    return token


def test_a_backup_of_four_partitions_restores_into_two_and_into_one(
    partitioned: Cluster, tmp_path: Path
) -> None:
    dlm = Dlm(partitioned.members_env, tmp_path)
    held: dict[str, int] = {}
    for p in range(PARTITIONS):
        for skip in range(2):
            key = key_in(p, PARTITIONS, "job/", skip)
            held[key] = hold(partitioned, key, 600_000)
    backup = tmp_path / "p4.dlmbackup"
    saved = dlm.json("snapshot", "save", str(backup))
    assert saved["partitions"] == PARTITIONS and len(saved["parts"]) == PARTITIONS
    top = max(part["index"] for part in saved["parts"])
    inspected = dlm.json("snapshot", "inspect", str(backup))
    assert inspected["format"] == 2 and inspected["locks"] == len(held)
    assert [row["locks"] for row in inspected["parts"]] == [2] * PARTITIONS

    for partitions in (2, 1):
        reports = restore_into(partitioned, dlm, backup, partitions)
        assert {r["first_index"] for r in reports} == {top + 2**32 + 1}
        assert all(r["locks"] == len(held) for r in reports)
        with partitioned.client(timeout=TIMEOUT) as client:
            for key, token in held.items():
                state = client.get(key)
                assert [h.token for h in state.holders] == [token], (partitions, key, state)
        # New grants, in every new partition, are above every token the old cluster gave.
        for p in range(partitions):
            token = hold(partitioned, key_in(p, partitions, f"fresh{partitions}/"), 30_000)
            assert token > top + 2**32 > max(held.values())
