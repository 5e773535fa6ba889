"""`dlm gateway` with real processes: clients that reach only gateways, across a leader
kill and a gateway kill, two gateways behind one address, P = 2, and a gateway that is
never an open relay."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import cbor2
import pytest

from dlm import tls
from dlm.client import Client
from dlm.client.core import split_route
from dlm.client.errors import DlmError
from dlm.partitioning import target_preamble
from dlm.wire import Hello, HelloRole, encode_frame
from tests.cluster.cli_harness import Dlm, Fifo, finish
from tests.cluster.gateways import GatewayProc, RoundRobinFront, unreachable_env
from tests.cluster.harness import Cluster, NodeProc, partitioned_cluster, wait_for
from tests.pki import OPENSSL, make_pki

JOB_TTL = "6s"


@pytest.fixture
def gateway(cluster: Cluster, tmp_path: Path) -> Iterator[GatewayProc]:
    gw = GatewayProc(tmp_path, "gw1", cluster.members_env).start()
    try:
        yield gw
    finally:
        gw.terminate()


def _only_gateway(cluster: Cluster, address: str, cwd: Path) -> Dlm:
    """`dlm` on a host that reaches ``address`` and no member."""
    dlm = Dlm(address, cwd)
    dlm.env.update(unreachable_env(cluster))
    return dlm


def _wait_renewed(client: Client, lease: str, what: str) -> None:
    """Until the lease's remaining time at the leader goes up: a renewal got through."""
    seen: list[int] = []

    def renewed() -> bool:
        try:
            remaining = client.lease_info(lease).remaining_ms
        except DlmError:
            return False
        if remaining is None:
            return False
        went_up = bool(seen) and remaining > seen[-1] + 100
        seen.append(remaining)
        return went_up

    wait_for(renewed, 40.0, f"a renewal of {lease} {what}", interval=0.1)


def _job(tmp_path: Path, name: str) -> tuple[Fifo, Path, list[str]]:
    """A `dlm exec` command line whose child says its token and lease on a fifo, then waits
    (at most 60 s) for a file to appear and exits 0 only if it did."""
    fifo = Fifo(tmp_path / f"{name}.started")
    done = tmp_path / f"{name}.done"
    script = (
        f'echo "$DLM_FENCING_TOKEN $DLM_LEASE_ID" > {fifo.path}; i=0; '
        f"while [ ! -e {done} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
        f"[ -e {done} ]"
    )
    return fifo, done, ["exec", "--lock", name, "--ttl", JOB_TTL, "--", "sh", "-c", script]


def test_exec_through_two_gateways_across_a_leader_kill_and_a_gateway_kill(
    cluster: Cluster, tmp_path: Path
) -> None:
    gateways = [GatewayProc(tmp_path, f"gw{i}", cluster.members_env) for i in (1, 2)]
    direct = cluster.client(timeout=30.0)
    try:
        for gw in gateways:
            gw.start()
        with RoundRobinFront([gw.address for gw in gateways]) as front:
            dlm = _only_gateway(cluster, front.address, tmp_path)
            fifo, done, command = _job(tmp_path, "gw-job")
            proc = dlm.start(*command)
            try:
                token_text, lease = fifo.read(60.0).split()
                _wait_renewed(direct, lease, "before any kill")

                old = cluster.wait_for_leader()
                old.kill()
                cluster.wait_for_leader(timeout=30.0, not_=old.node_id)
                _wait_renewed(direct, lease, "after the leader was killed")

                for dead, alive in ((0, 1), (1, 0)):
                    gateways[dead].kill()
                    _wait_renewed(direct, lease, f"after gateway {dead + 1} was killed")
                    gateways[dead].start()
                    assert gateways[alive].alive
                done.touch()
                code, _, err = finish(proc)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            assert code == 0, err
            again = dlm.run("exec", "--lock", "gw-job", "--", "sh", "-c", "echo $DLM_FENCING_TOKEN")
            assert again.returncode == 0, again.stderr
            assert int(again.stdout.strip()) > int(token_text)
    finally:
        direct.close()
        for gw in gateways:
            gw.terminate()
    for gw in gateways:
        assert "gateway_listening" in gw.log()


def test_views_work_through_a_gateway_alone(
    cluster: Cluster, gateway: GatewayProc, tmp_path: Path
) -> None:
    dlm = _only_gateway(cluster, gateway.address, tmp_path)
    # The harness's own check: this host cannot reach the members themselves.
    direct = dlm.run("status", "--dial-timeout", "2s", env={"DLM_CLUSTER": cluster.members_env})
    assert direct.returncode != 0
    status = dlm.json("status")
    assert status["leader"]
    reachable = [m for m in status["members"] if m.get("reachable")]
    assert len(reachable) == 3, status  # each member asked through the gateway
    acquired = dlm.json("acquire", "gw-view", "--ttl", "30s")
    locks = dlm.json("locks")
    assert "gw-view" in json.dumps(locks)
    released = dlm.run("release", "gw-view", "--lease", str(acquired["lease"]))
    assert released.returncode == 0, released.stderr
    # A gateway said explicitly (as TLS clients must) works the same.
    marked = dlm.run(
        "exec", "--lock", "gw-view", "--", "true", env={"DLM_CLUSTER": f"gateway:{gateway.address}"}
    )
    assert marked.returncode == 0, marked.stderr


def test_a_partitioned_cluster_through_a_gateway(tmp_path: Path) -> None:
    with partitioned_cluster(tmp_path, 2) as cluster:
        gw = GatewayProc(tmp_path, "gw", cluster.members_env).start()
        try:
            dlm = _only_gateway(cluster, gw.address, tmp_path)
            from dlm.partitioning import partition_of

            keys = [f"p-key-{i}" for i in range(8)]
            assert {partition_of(k, 2) for k in keys} == {0, 1}
            for key in keys:
                run = dlm.run("exec", "--lock", key, "--", "true")
                assert run.returncode == 0, run.stderr
            many = dlm.run("exec", *[a for k in keys[:4] for a in ("--lock", k)], "--", "true")
            assert many.returncode == 0, many.stderr
            status = dlm.json("status")
            assert [p["partition"] for p in status["partitions"]] == [0, 1]
            assert all(p["leader"] for p in status["partitions"]), status
        finally:
            gw.terminate()


def _recv_some(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_the_gateway_is_never_an_open_relay(
    cluster: Cluster, gateway: GatewayProc, tmp_path: Path
) -> None:
    host, port = gateway.address.split(":")
    outsider = socket.create_server(("127.0.0.1", 0))  # a non-member that would accept
    outsider.settimeout(0.5)
    try:
        outsider_address = f"127.0.0.1:{outsider.getsockname()[1]}"
        for first in (target_preamble(0, outsider_address), b"\xffDLMX\x00"):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(first + encode_frame(Hello(role=HelloRole.CLIENT).to_wire()))
                assert _recv_some(sock, 1) == b""  # closed without a word
        with pytest.raises(TimeoutError):
            outsider.accept()
    finally:
        outsider.close()
    # A named member is reached, after the notice.
    member = cluster.nodes["n2"].address
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(target_preamble(0, member))
        sock.sendall(encode_frame(Hello(role=HelloRole.CLIENT).to_wire()))
        frames = []
        for _ in range(2):
            (size,) = struct.unpack(">I", _recv_some(sock, 4))
            frames.append(cbor2.loads(_recv_some(sock, size)))
        assert frames[0] == {"t": "gateway", "version": 1}
        assert frames[1]["t"] == "welcome" and frames[1]["node"] == "n2"
    # A TLS client's first byte gets no notice: the member's own bytes come first.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01\x00\x05hello")
        assert not _recv_some(sock, 5).startswith(encode_frame({"t": "gateway", "version": 1})[:5])
    assert "gateway_target_refused" in gateway.log()


def test_gateway_flags_and_a_clean_stop(cluster: Cluster, tmp_path: Path) -> None:
    dlm = Dlm(cluster.members_env, tmp_path)
    missing = dlm.run("gateway")
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "--listen" in missing.stderr
    bad = dlm.run("gateway", "--listen", "127.0.0.1:1", "--max-clients", "none")
    assert bad.returncode == 2 and "--max-clients" in bad.stderr
    gw = GatewayProc(tmp_path, "gw", cluster.members_env).start()
    busy = dlm.run("gateway", "--listen", gw.address)
    assert busy.returncode == 1 and "already in use" in busy.stderr, busy.stderr
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5):
        assert gw.terminate() == 0


def test_permissions_hold_through_a_gateway(
    cluster: Cluster, gateway: GatewayProc, tmp_path: Path
) -> None:
    """The member authenticates the client end to end: an identity limited to ``ci/``
    locks there through the gateway and is refused elsewhere, named as itself."""
    admin = _only_gateway(cluster, gateway.address, tmp_path)
    credential = tmp_path / "ci.cred"
    admin.json("auth", "add", "ci", "--role", "client", "--prefix", "ci/", "--out", str(credential))
    ci = _only_gateway(cluster, gateway.address, tmp_path)
    ci.env["DLM_SECRET_FILE"] = str(credential)
    allowed = ci.run("exec", "--lock", "ci/build", "--", "true")
    assert allowed.returncode == 0, allowed.stderr
    error = ci.json("acquire", "prod/deploy", code=77)["error"]
    assert error["code"] == "PERMISSION_DENIED", error
    assert "ci" in error["message"]
    forged = tmp_path / "forged.cred"
    forged.write_text(credential.read_text().replace("ci", "admin", 1))
    ci.env["DLM_SECRET_FILE"] = str(forged)
    assert ci.run("members", "remove", "n1").returncode != 0


def test_grant_pushes_and_watches_through_a_gateway(cluster: Cluster, gateway: GatewayProc) -> None:
    """A queued acquire's grant and a watch's changes are pushed over relayed connections."""
    import threading

    holder = Client([gateway.address], secret=cluster.client_secret, timeout=20.0)
    waiter = holder.spawn()
    watcher = holder.spawn()
    events: list[tuple[str, str]] = []
    try:
        first = holder.open_lease(30_000)
        second = waiter.open_lease(30_000)
        grant = holder.acquire(first, "gw-push")
        changes = watcher.watch("gw-push", after=grant.token - 1)

        def watch() -> None:
            for change in changes:
                events.append((change.event, change.lease))
                if len(events) == 3:
                    return

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        granted: list[int] = []
        queued = threading.Thread(
            target=lambda: granted.append(waiter.acquire(second, "gw-push", wait=30).token),
            daemon=True,
        )
        queued.start()
        wait_for(lambda: holder.get("gw-push").waiting == 1, 20.0, "the second lease queued")
        holder.release(first, "gw-push")
        queued.join(30)
        watching.join(30)
        assert granted and granted[0] > grant.token
        assert events == [
            ("granted", first.id),
            ("queued", second.id),
            ("released", first.id),
        ]
        assert waiter.connected_to is not None
        assert split_route(waiter.connected_to)[0] == gateway.address
    finally:
        for client in (holder, waiter, watcher):
            client.close()


def test_the_async_client_follows_a_new_leader_through_the_gateway(
    cluster: Cluster, gateway: GatewayProc
) -> None:
    """The anyio/asyncio driver reads the notice and redials the gateway with the target."""
    import asyncio

    from dlm.client.aio import AsyncClient

    async def scenario() -> list[str]:
        seen: list[str] = []
        async with AsyncClient([gateway.address], timeout=30.0) as client:
            for round_number in range(2):
                lease = await client.open_lease(10_000)
                grant = await client.acquire(lease, "gw-async")
                await client.release(lease, "gw-async", token=grant.token)
                await client.close_lease(lease)
                assert client.connected_to is not None
                seen.append(client.connected_to)
                if round_number == 0:
                    old = cluster.wait_for_leader()
                    old.kill()
                    await asyncio.to_thread(cluster.wait_for_leader, 30.0, not_=old.node_id)
        return seen

    seen = asyncio.run(scenario())
    assert all(split_route(address)[0] == gateway.address for address in seen), seen


@pytest.mark.skipif(OPENSSL is None, reason="the openssl command is not installed")
def test_tls_clients_name_the_gateway_and_verify_the_members_through_it(tmp_path: Path) -> None:
    """TLS hides the notice: `gateway:HOST:PORT` says it; the member's certificate is still
    what the client verifies, end to end through the relay."""
    pki = make_pki(tmp_path / "pki", ["n1", "n2", "n3"])

    def flags(node: NodeProc) -> list[str]:
        return [
            *("--tls-cert", str(pki / f"{node.node_id}.crt")),
            *("--tls-key", str(pki / f"{node.node_id}.key")),
            *("--tls-ca", str(pki / "ca.crt")),
        ]

    (tmp_path / "cluster").mkdir()
    cluster = Cluster(
        tmp_path / "cluster",
        size=3,
        node_args=flags,
        client_tls=tls.client_context(str(pki / "ca.crt")),
    )
    gw = GatewayProc(tmp_path, "gw", cluster.members_env)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=20.0)
        gw.start()
        dlm = _only_gateway(cluster, f"gateway:{gw.address}", tmp_path)
        dlm.env["DLM_TLS_CA"] = str(pki / "ca.crt")
        status = dlm.json("status")
        assert len([m for m in status["members"] if m.get("reachable")]) == 3, status
        for _ in range(3):  # the gateway's rotation lands on followers too: redirects
            run = dlm.run("exec", "--lock", "gw-tls", "--", "true")
            assert run.returncode == 0, run.stderr
        rogue = dlm.run("acquire", "gw-tls", env={"DLM_TLS_CA": str(pki / "rogue-ca.crt")})
        assert rogue.returncode == 78, rogue.stderr
    finally:
        gw.terminate()
        cluster.stop_all()
