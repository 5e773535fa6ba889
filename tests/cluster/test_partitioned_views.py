"""Every view of a cluster of four partitions sees all of it: `dlm status` lists each
partition with its leader, `--check` is degraded while one partition has no leader (its
processes stopped on two of the three members) and healthy again after, `dlm locks` and
the client's paged listing give every key once across partitions, and `dlm lease list`
shows a lease with parts in two partitions once, with both keys.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlm.partitioning import partition_of
from dlm.wire import ListLocks
from tests.cluster.cli_harness import Dlm, stop
from tests.cluster.harness import Cluster, NodeProc, RawConn, partitioned_cluster, wait_for

pytestmark = pytest.mark.cluster

PARTITIONS = 4
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with partitioned_cluster(tmp_path_factory.mktemp("views"), PARTITIONS, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture
def dlm(partitioned: Cluster, tmp_path: Path) -> Dlm:
    return Dlm(partitioned.members_env, tmp_path)


class JsonLines:
    """A started dlm's stdout, one JSON object a line, read by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        stream = proc.stdout
        assert stream is not None

        def pump() -> None:
            for line in stream:
                self._lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def drain(self, timeout: float) -> list[dict[str, Any]]:
        """The lines that came before the next pause of ``timeout`` seconds (bounded)."""
        out = []
        for _ in range(10_000):
            try:
                out.append(json.loads(self._lines.get(timeout=timeout)))
            except queue.Empty:
                break
        return out


def partition_pid(node: NodeProc, partition: int) -> int:
    """The PID of ``node``'s process for ``partition`` (its supervisor starts each with the
    partition number second to last on its command line)."""
    for pid in node.child_pids():
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if args[-1] == b"":
            args = args[:-1]
        if int(args[-2]) == partition:
            return pid
    raise AssertionError(f"{node.node_id} has no process for partition {partition}")


def keys_in_every_partition(count: int) -> list[str]:
    """``count`` keys, each partition holding some."""
    keys = [f"pv/{i:03d}" for i in range(count)]
    assert {partition_of(k, PARTITIONS) for k in keys} == set(range(PARTITIONS))
    return keys


class LeaderConns:
    """A connection to each partition's leader that follows a leader that moved: leader
    spread hands partitions over after a start or a recovery, and a request the old
    leader answered NOT_LEADER did nothing there, so it is sent again to the new one."""

    def __init__(self, partitioned: Cluster) -> None:
        self._cluster = partitioned
        self._conns: dict[int, RawConn] = {}

    def request(self, partition: int, frame: dict[str, Any]) -> dict[str, Any]:
        for _ in range(10):
            conn = self._conns.get(partition)
            if conn is None:
                leader = self._cluster.wait_for_leader(TIMEOUT, partition=partition)
                conn = self._conns[partition] = RawConn(leader.address, partition=partition)
            reply: dict[str, Any] = conn.request(frame)
            if reply.get("code") != "NOT_LEADER":
                return reply
            conn.close()
            del self._conns[partition]
        raise AssertionError(f"partition {partition}'s leader kept moving")

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def hold(partitioned: Cluster, lease: str, keys: list[str]) -> LeaderConns:
    """``keys`` held by ``lease``: a part of it opened in each partition the keys are in,
    on a connection to that partition's leader (the connections must stay open)."""
    conns = LeaderConns(partitioned)
    for partition in sorted({partition_of(k, PARTITIONS) for k in keys}):
        opened = conns.request(partition, {"t": "open_lease", "lease": lease, "ttl_ms": 60_000})
        assert opened["t"] == "ok", opened
        for seq, key in enumerate((k for k in keys if partition_of(k, PARTITIONS) == partition), 1):
            frame = {"t": "acquire", "lease": lease, "seq": seq, "key": key}
            granted = conns.request(partition, frame)
            assert granted.get("result") == "granted", granted
    return conns


def test_status_json_lists_every_partition_with_its_leader(dlm: Dlm) -> None:
    status = dlm.json("status")
    entries = status["partitions"]
    assert [e["partition"] for e in entries] == list(range(PARTITIONS))
    for entry in entries:
        assert set(entry) == {"partition", "leader", "term", "commit", "lag"}
        assert entry["leader"] in {"n1", "n2", "n3"}
        assert isinstance(entry["term"], int) and isinstance(entry["commit"], int)
        assert isinstance(entry["lag"], int) and entry["lag"] >= 0
    # The top level is partition 0's, as a reader of the earlier object expects.
    assert (status["leader"], status["term"]) == (entries[0]["leader"], entries[0]["term"])
    table = dlm.run("status", "--format", "table")
    assert table.returncode == 0, table.stderr
    assert "PARTITION" in table.stdout and "4 partitions" in table.stdout


def test_check_is_degraded_while_a_partition_has_no_leader(partitioned: Cluster, dlm: Dlm) -> None:
    healthy = dlm.run("status", "--check")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    stopped = [partition_pid(partitioned.nodes[n], 2) for n in ("n1", "n2")]
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        seen: list[str] = []

        def says_partition_2_has_no_leader() -> bool:
            # Until its remaining member's election timeout it may still name a leader
            # (one that does not answer us, or has not heard from the others yet).
            check = dlm.run("status", "--check", "--timeout", "2s")
            seen.append(f"{check.returncode}: {check.stdout}{check.stderr}")
            return check.returncode == 1 and "partition 2 has no leader" in check.stdout

        wait_for(says_partition_2_has_no_leader, TIMEOUT, "dlm status --check to name partition 2")
        assert seen[-1].startswith("1: degraded: "), seen
        verdict = dlm.json("status", "--check", "--timeout", "2s", code=1)
        assert verdict["state"] == "degraded"
        assert verdict["partitions"][2]["leader"] is None
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    partitioned.wait_for_leaders(timeout=TIMEOUT)
    wait_for(
        lambda: dlm.run("status", "--check").returncode == 0,
        TIMEOUT,
        "the cluster to be healthy again once partition 2 runs on",
    )


def test_locks_list_every_key_once_across_partitions_page_by_page(
    partitioned: Cluster, dlm: Dlm
) -> None:
    keys = keys_in_every_partition(23)
    conns = hold(partitioned, "pv-locks", keys)
    try:
        listed = dlm.json("locks", "--prefix", "pv/")
        assert [lock["key"] for lock in listed["locks"]] == keys
        # Pages of three: every partition is paged through with its own cursor.
        with partitioned.client() as client:
            from dlm.client import core
            from dlm.views import LocksPage

            request = core.without_id(ListLocks(id=0, prefix="pv/", max=3))
            read = core._page_of(LocksPage, lambda page: page.locks)
            flow = core.merged_listing_flow(client._ctx, request, read, core._lock_key)
            paged = client._run(flow)
        assert [lock.key for lock in paged] == keys
    finally:
        conns.close()


def test_a_lease_with_parts_in_two_partitions_is_listed_once(
    partitioned: Cluster, dlm: Dlm
) -> None:
    first = next(k for k in (f"lv/{i}" for i in range(100)) if partition_of(k, PARTITIONS) == 1)
    second = next(k for k in (f"lv/{i}" for i in range(100)) if partition_of(k, PARTITIONS) == 3)
    conns = hold(partitioned, "pv-two-parts", [first, second])
    try:
        listed = list(dlm.json("lease", "list")["leases"])
        mine = [item for item in listed if item["id"] == "pv-two-parts"]
        assert len(mine) == 1, listed
        assert mine[0]["holding"] == sorted([first, second])
        assert isinstance(mine[0]["left_ms"], int) and 0 < mine[0]["left_ms"] <= 60_000
    finally:
        conns.close()


def test_watch_of_a_prefix_sees_the_changes_of_every_partition(
    partitioned: Cluster, dlm: Dlm
) -> None:
    probes = {
        p: next(
            k for k in (f"pw/probe-{i}" for i in range(200)) if partition_of(k, PARTITIONS) == p
        )
        for p in range(PARTITIONS)
    }
    conns = LeaderConns(partitioned)
    proc = dlm.start("watch", "--prefix", "pw/", "--json")
    try:
        lines = JsonLines(proc)
        for p in range(PARTITIONS):
            opened = conns.request(p, {"t": "open_lease", "lease": "pw-probe", "ttl_ms": 60_000})
            assert opened["t"] == "ok", opened
        # The watch starts from now in each partition, on its own: change a probe key of
        # every partition not yet heard from until each has been, so that every change
        # made after that is one the watch must show.
        unheard, seq = set(range(PARTITIONS)), 0
        for _ in range(30):
            if not unheard:
                break
            for p in sorted(unheard):
                for t in ("acquire", "release"):
                    seq += 1
                    conns.request(p, {"t": t, "lease": "pw-probe", "seq": seq, "key": probes[p]})
            for event in lines.drain(timeout=1.0):
                unheard.discard(partition_of(event["key"], PARTITIONS))
        assert not unheard, f"partitions {sorted(unheard)} never watched"
        keys = keys_in_every_partition(12)
        held = hold(partitioned, "pw-real", [k.replace("pv/", "pw/") for k in keys])
        try:
            wanted = {k.replace("pv/", "pw/") for k in keys}
            granted: list[str] = []
            for _ in range(100):
                if wanted <= set(granted):
                    break
                granted += [
                    e["key"] for e in lines.drain(timeout=1.0)
                    if e["event"] == "granted" and e["lease"] == "pw-real"
                ]  # fmt: skip
            assert sorted(granted) == sorted(wanted)
        finally:
            held.close()
    finally:
        stop(proc)
        conns.close()


def test_watch_of_a_prefix_after_an_index_is_refused_in_one_line(dlm: Dlm) -> None:
    refused = dlm.run("watch", "--prefix", "pw/", "--after", "5")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "one partition" in refused.stderr


def test_the_async_client_watches_a_prefix_in_every_partition(partitioned: Cluster) -> None:
    import anyio

    from dlm.client import aio

    probes = {
        p: next(k for k in (f"pa/{i}" for i in range(200)) if partition_of(k, PARTITIONS) == p)
        for p in range(PARTITIONS)
    }
    conns = LeaderConns(partitioned)
    seq = 0

    def probe(partition: int) -> None:
        nonlocal seq
        for kind in ("acquire", "release"):
            seq += 1
            request = {"t": kind, "lease": "pa-probe", "seq": seq, "key": probes[partition]}
            assert conns.request(partition, request)["t"] == "ok"

    async def main() -> set[int]:
        heard: set[int] = set()
        everywhere = anyio.Event()
        async with aio.AsyncClient(partitioned.addresses, timeout=TIMEOUT) as client:

            async def consume() -> None:
                events = client.watch(prefix="pa/")
                try:
                    async for event in events:
                        heard.add(partition_of(event.key, PARTITIONS))
                        if len(heard) == PARTITIONS:
                            everywhere.set()
                            return
                finally:
                    await events.aclose()  # type: ignore[attr-defined]

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(consume)
                # Probe every partition not yet heard from until each has been (bounded).
                for _ in range(30):
                    for p in set(range(PARTITIONS)) - heard:
                        await anyio.to_thread.run_sync(probe, p)
                    with anyio.move_on_after(1.0):
                        await everywhere.wait()
                    if everywhere.is_set():
                        break
                tasks.cancel_scope.cancel()
        return heard

    try:
        for p in range(PARTITIONS):
            opened = conns.request(p, {"t": "open_lease", "lease": "pa-probe", "ttl_ms": 60_000})
            assert opened["t"] == "ok"
        assert anyio.run(main) == set(range(PARTITIONS))
    finally:
        conns.close()


def test_a_lease_the_client_spread_over_two_partitions_is_listed_once(
    partitioned: Cluster, dlm: Dlm
) -> None:
    from dlm.client import Client

    first = next(k for k in (f"lc/{i}" for i in range(100)) if partition_of(k, PARTITIONS) == 0)
    second = next(k for k in (f"lc/{i}" for i in range(100)) if partition_of(k, PARTITIONS) == 2)
    with Client(partitioned.addresses, timeout=10.0) as client:
        lease = client.open_lease(30_000)
        client.acquire(lease, first)
        client.acquire(lease, second)
        try:
            listed = dlm.json("lease", "list")["leases"]
            mine = [item for item in listed if item["id"] == lease.id]
            assert len(mine) == 1, listed
            assert mine[0]["holding"] == sorted([first, second])
            locks = dlm.json("locks", "--prefix", "lc/")["locks"]
            assert [lock["key"] for lock in locks] == sorted([first, second])
            rows = dlm.run("lease", "list", "--format", "tsv").stdout.splitlines()
            assert sum(1 for row in rows if row.startswith(lease.id)) == 1
        finally:
            client.close_lease(lease)


def test_runs_of_every_partition_come_as_one_ledger(dlm: Dlm) -> None:
    keys = sorted(
        next(k for k in (f"lr/{i}" for i in range(200)) if partition_of(k, PARTITIONS) == p)
        for p in range(PARTITIONS)
    )
    for key in keys:
        ran = dlm.run("exec", "--lock", key, "--", "true")
        assert ran.returncode == 0, ran.stderr
    every = dlm.json("runs", "--all")["runs"]
    assert [run["key"] for run in every if run["key"].startswith("lr/")] == keys
    for key in keys:
        (run,) = dlm.json("runs", key)["runs"]
        assert (run["outcome"], run["exit_code"]) == ("finished", 0)
