"""Members of several partitions: a supervisor per member, one process per partition.

A 3-member cluster started with ``--partitions 4`` elects a leader in every
partition (each asked over its own connection, which names it with the
preamble); a partition process that is killed is started again by its
supervisor and rejoins its group; SIGTERM stops every process of a member;
kill -9 of a whole member leaves every partition with a leader among the other
two; a stranger's bad or missing preamble costs the member nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlm.node.runtime.supervisor import MAX_PENDING
from dlm.partitioning import partition_of
from tests.cluster.harness import (
    Cluster,
    NodeProc,
    RawConn,
    free_ports,
    partitioned_cluster,
    wait_for,
)

PARTITIONS = 4
TIMEOUT = 30.0


@pytest.fixture
def partitioned(tmp_path: Path) -> Iterator[Cluster]:
    """Three members of four partitions each, every partition with a leader."""
    with partitioned_cluster(tmp_path, PARTITIONS, timeout=TIMEOUT) as c:
        yield c


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


def test_a_restart_without_the_flag_keeps_the_count_and_another_count_is_refused(
    partitioned: Cluster,
) -> None:
    node = partitioned.nodes["n1"]
    node.kill()
    node.partitions = 2
    node.start()
    assert node.wait_exit(TIMEOUT) == 2
    lines = [line for line in node.log_tail(5).splitlines() if "created with" in line]
    assert lines and "this data dir was created with --partitions 4" in lines[-1]
    assert "to change the count restore a backup with --partitions" in lines[-1]
    node.partitions = None
    node.start()
    wait_for(lambda: len(node.child_pids()) == PARTITIONS, TIMEOUT, "four partition processes")
    for partition in range(PARTITIONS):
        wait_for(
            lambda p=partition: knows_leader(node, p),  # type: ignore[misc]
            TIMEOUT,
            f"n1's partition {partition} to know its leader",
        )


def knows_leader(node: NodeProc, partition: int) -> bool:
    status = node.status(partition=partition)
    return status is not None and bool(status.get("leader"))


def test_a_member_with_another_partition_count_is_refused(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, size=3, partitions=PARTITIONS)
    odd = cluster.nodes["n3"]
    odd.partitions = 2
    try:
        cluster.start_all()
        cluster.wait_for_leaders(timeout=TIMEOUT)

        def refused() -> bool:
            text = cluster.nodes["n1"].log_path.read_text(errors="replace")
            return "member n1 has --partitions 4, member n3 --partitions 2" in text

        wait_for(refused, TIMEOUT, "n1 to refuse n3 for its partition count")
        # n3 reaches nobody: none of its partitions has a leader.
        for partition in range(2):
            status = odd.status(partition=partition)
            assert status is not None and status["partitions"] == 2
            assert status["role"] != "leader"
    finally:
        cluster.stop_all()


def test_a_strangers_bad_or_missing_preamble_is_closed_and_costs_nothing(
    partitioned: Cluster,
) -> None:
    node = partitioned.nodes["n2"]
    host, port = node.address.rsplit(":", 1)
    # Malformed magic, a partition this member does not have, a partition number no
    # member has: each connection is closed, nothing is answered.
    for first in (b"\xffDLMX\x01", b"\xffDLMP\x07", b"\xffDLMP\x00", b"\xffDLMP\xff"):
        with RawConn(node.address, hello=False) as conn:
            conn.send_bytes(first + b"\x00" * 64)
            assert conn.closed_by_peer(timeout=10.0)
    wait_for(lambda: said(node, "a malformed preamble"), TIMEOUT, "the bad preambles said")
    # Half a preamble, then silence: closed after the supervisor's timeout.
    with RawConn(node.address, hello=False) as half:
        half.send_bytes(b"\xffDL")
        assert half.closed_by_peer(timeout=20.0)
    wait_for(lambda: said(node, "no preamble or hello"), TIMEOUT, "the timeout said")
    # More silent connections than may wait at once: the oldest are closed to make room
    # (said in the member's log), and the member keeps serving every partition meanwhile.
    silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(MANY)]
    try:
        wait_for(
            lambda: said(node, "too many connections waiting for their preamble"),
            TIMEOUT,
            "the supervisor to shed connections past its cap",
        )
        for partition in range(PARTITIONS):
            status = node.status(timeout=5.0, partition=partition)
            assert status is not None and status["partition"] == partition
        assert socket_closed(silent[0], timeout=20.0)
        assert socket_closed(silent[-1], timeout=20.0)  # and the rest time out
    finally:
        for sock in silent:
            sock.close()
    assert node.alive and len(node.child_pids()) == PARTITIONS


MANY = MAX_PENDING + 20
"""More connections than the supervisor lets wait for their preamble."""


def said(node: NodeProc, reason: str) -> bool:
    """Whether the member's supervisor logged shedding a connection for ``reason``."""
    return any(
        r.get("event") == "connection_shed" and str(r.get("reason", "")).startswith(reason)
        for r in records_of(node)
    )


def socket_closed(sock: socket.socket, timeout: float) -> bool:
    """Whether the other side closed ``sock`` (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_the_supervisor_serves_every_partitions_metrics_labelled_and_audit_names_it(
    tmp_path: Path,
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    ports = dict(zip(("n1", "n2", "n3"), free_ports(3), strict=True))

    def metrics_flag(node: NodeProc) -> list[str]:
        return ["--metrics-listen", f"127.0.0.1:{ports[node.node_id]}"]

    cluster = Cluster(tmp_path, size=3, partitions=PARTITIONS, node_args=metrics_flag)
    try:
        cluster.start_all()
        leaders = cluster.wait_for_leaders(timeout=TIMEOUT)
        node = cluster.nodes["n1"]
        url = f"http://127.0.0.1:{ports['n1']}/metrics"

        def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
            with urllib.request.urlopen(url, timeout=10.0) as response:
                text = response.read().decode()
            samples = {
                (s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            up = [
                samples.get(("dlm_partition_up", frozenset({("partition", str(p))})))
                for p in range(PARTITIONS)
            ]
            return samples if up == [1.0] * PARTITIONS else None

        samples = wait_for(scrape, TIMEOUT, "every partition's metrics")
        labelled = {
            dict(labels).get("partition") for (name, labels) in samples if name.startswith("dlm_")
        }
        assert labelled == {str(p) for p in range(PARTITIONS)}
        # Each partition process says its own role, once.
        for partition in range(PARTITIONS):
            roles = [
                dict(labels)["role"]
                for (name, labels), value in samples.items()
                if name == "dlm_raft_role"
                and value == 1.0
                and dict(labels).get("partition") == str(partition)
            ]
            assert len(roles) == 1, (partition, roles)
        # A lock in one partition: its audit events name that partition.
        key = "audit-me"
        home = partition_of(key, PARTITIONS)
        leader = leaders[home]
        with RawConn(leader.address, partition=home) as conn:
            opened = conn.request(
                {"t": "open_lease", "lease": "L1", "ttl_ms": 10_000, "client": "c1", "seq": 1}
            )
            assert opened["t"] == "ok", opened
            acquired = conn.request(
                {"t": "acquire", "lease": "L1", "key": key, "client": "c1", "seq": 2}
            )
            assert acquired["t"] == "ok", acquired

        def granted() -> list[dict[str, Any]]:
            return [
                r
                for r in records_of(node)
                if r.get("event") == "lock_granted" and r.get("key") == key
            ]

        events = wait_for(granted, TIMEOUT, "n1 to log the grant")
        assert all(r["partition"] == home for r in events)
        # Audit events (and every other line) of a partition process name the partition.
        started = [r for r in records_of(node) if r.get("event") == "node_started"]
        assert sorted(r["partition"] for r in started) == list(range(PARTITIONS))
    finally:
        cluster.stop_all()


def records_of(node: NodeProc) -> list[dict[str, Any]]:
    """The JSON lines a member (its supervisor and partition processes) logged."""
    return [
        json.loads(line)
        for line in node.log_path.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]


def test_systemd_hears_ready_once_when_every_partition_serves(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    cluster = Cluster(tmp_path, size=1, partitions=3, env={"NOTIFY_SOCKET": path})
    try:
        cluster.start_all()
        listener.settimeout(TIMEOUT)
        assert listener.recv(256) == b"READY=1"
        node = cluster.nodes["n1"]
        # Every partition serves by now (each said so before the supervisor said READY).
        for partition in range(3):
            assert node.status(timeout=5.0, partition=partition) is not None
        # The partition processes do not speak to systemd themselves: nothing more.
        listener.settimeout(1.0)
        with pytest.raises(TimeoutError):
            listener.recv(256)
        assert node.terminate(grace=20.0) == 0
        listener.settimeout(TIMEOUT)
        assert listener.recv(256) == b"STOPPING=1"
    finally:
        cluster.stop_all()
        listener.close()


def test_a_member_of_several_partitions_joins_every_partitions_group(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, size=3, partitions=2)
    try:
        cluster.start_all()
        cluster.wait_for_leaders(timeout=TIMEOUT)
        joined = cluster.add_node("n4")
        joined.start()

        def in_every_group() -> bool:
            for partition in range(2):
                leader = cluster.leader_now(partition)
                if leader is None:
                    return False
                view = leader.status(partition=partition)
                if view is None or "n4" not in {m["id"] for m in view["members"]}:
                    return False
                own = joined.status(partition=partition)
                if own is None or not own.get("leader"):
                    return False
            return True

        wait_for(in_every_group, 2 * TIMEOUT, "n4 in both partitions' groups")
        assert len(joined.child_pids()) == 2
    finally:
        cluster.stop_all()


def test_members_of_several_partitions_over_tls_with_a_peer_secret(tmp_path: Path) -> None:
    """The preamble goes before TLS: each partition's process does its own handshake,
    with the member's certificate, and its peers authenticate as for partition 0."""
    from dlm import tls
    from dlm.auth import write_secret_file
    from tests.pki import OPENSSL, make_pki

    if OPENSSL is None:
        pytest.skip("the openssl command is not installed")
    pki = make_pki(tmp_path / "pki", ["n1", "n2", "n3"])
    secret_file = str(tmp_path / "peer.secret")
    write_secret_file(secret_file)

    def flags(node: NodeProc) -> list[str]:
        name = node.node_id
        return [
            "--tls-cert", str(pki / f"{name}.crt"),
            "--tls-key", str(pki / f"{name}.key"),
            "--tls-ca", str(pki / "ca.crt"),
            "--peer-secret-file", secret_file,
        ]  # fmt: skip

    (tmp_path / "cluster").mkdir()
    cluster = Cluster(
        tmp_path / "cluster",
        size=3,
        partitions=3,
        node_args=flags,
        client_tls=tls.client_context(str(pki / "ca.crt")),
    )
    try:
        cluster.start_all()
        leaders = cluster.wait_for_leaders(timeout=TIMEOUT)
        assert sorted(leaders) == [0, 1, 2]
        # A stranger without the member's CA cannot get past TLS on any partition.
        node = cluster.nodes["n2"]
        for partition in range(3):
            with (
                pytest.raises((OSError, ConnectionError)),
                RawConn(node.address, partition=partition, tls=_untrusting()) as conn,
            ):
                conn.recv(timeout=5.0)
        # Every partition still serves a client that trusts the CA.
        for partition in range(3):
            assert node.status(timeout=5.0, partition=partition) is not None
    finally:
        cluster.stop_all()


def _untrusting() -> Any:
    """A TLS client context that trusts no CA: every member's certificate fails it."""
    import ssl

    return ssl.create_default_context(ssl.Purpose.SERVER_AUTH)


def test_a_partition_that_keeps_failing_to_start_stops_the_member_with_one_line(
    tmp_path: Path,
) -> None:
    import fcntl

    cluster = Cluster(tmp_path, size=1, partitions=2)
    node = cluster.nodes["n1"]
    try:
        cluster.start_all()
        cluster.wait_for_leaders(timeout=TIMEOUT)
        node.kill()
        # Another process holds partition 1's store: its process cannot open it, again
        # and again.
        with open(node.data_dir / "p1" / "LOCK", "a+b") as held:

            def taken() -> bool:
                # The killed partition process holds the lock until it has fully exited.
                try:
                    fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                return True

            wait_for(taken, TIMEOUT, "the killed partition process to let go of its store")
            node.start()
            assert node.wait_exit(TIMEOUT) == 1
        lines = node.log_tail(40).splitlines()
        said = [line for line in lines if line.startswith("dlm node: error: partition 1")]
        assert said == [
            "dlm node: error: partition 1 failed to start 5 times in a row (last exit code "
            "1): see its log lines above"
        ]
        assert not node.child_pids()
    finally:
        cluster.stop_all()
