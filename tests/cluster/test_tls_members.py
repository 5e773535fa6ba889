"""Members and clients over TLS: peers verify each other's certificates against the CA, and a
certificate must name the member it speaks for; clients verify the members'.

A throwaway CA from the ``openssl`` command (tests/pki.py); skipped where it is
missing. The cluster runs with ``--tls-cert``, ``--tls-key``, ``--tls-ca`` and no secret.
"""

from __future__ import annotations

import ssl
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from dlm import tls
from dlm.node.peer_codec import raft_frame
from dlm.node.raft.types import VoteRequest
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, NodeProc, RawConn
from tests.pki import OPENSSL, make_pki

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(OPENSSL is None, reason="the openssl command is not installed"),
]


class TlsCluster:
    def __init__(self, cluster: Cluster, pki: Path) -> None:
        self.cluster = cluster
        self.pki = pki

    def file(self, name: str) -> str:
        return str(self.pki / name)

    def context(self, cert: str | None = None, ca: str = "ca") -> ssl.SSLContext:
        """A client context trusting ``ca``, presenting ``cert`` (a name in the PKI)."""
        if cert is None:
            return tls.client_context(self.file(f"{ca}.crt"))
        return tls.client_context(
            self.file(f"{ca}.crt"), self.file(f"{cert}.crt"), self.file(f"{cert}.key")
        )


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    base = tmp_path_factory.mktemp("tls")
    pki = make_pki(base / "pki", ["n1", "n2", "n3"])

    def flags(node: NodeProc) -> list[str]:
        name = node.node_id
        return [
            "--tls-cert", str(pki / f"{name}.crt"),
            "--tls-key", str(pki / f"{name}.key"),
            "--tls-ca", str(pki / "ca.crt"),
        ]  # fmt: skip

    client_tls = tls.client_context(str(pki / "ca.crt"))
    (base / "cluster").mkdir()
    cluster = Cluster(base / "cluster", size=3, node_args=flags, client_tls=client_tls)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        yield TlsCluster(cluster, pki)
    finally:
        cluster.stop_all()


def peer_hello(node: str) -> dict[str, Any]:
    return {"t": "hello", "role": "peer", "version": 1, "max_version": 2, "cluster": "test",
            "node": node}  # fmt: skip


def frame(obj: Any) -> bytes:
    body = cbor2.dumps(obj)
    return struct.pack(">I", len(body)) + body


def test_members_elect_a_leader_and_clients_take_locks_over_tls(tls_cluster: TlsCluster) -> None:
    with tls_cluster.cluster.client(timeout=10.0) as client:
        lease = client.open_lease(10_000)
        first = client.acquire(lease, "tls-k").token
        client.release(lease, "tls-k")
        assert client.acquire(lease, "tls-k").token > first


def test_a_peer_certificate_naming_another_member_is_refused(tls_cluster: TlsCluster) -> None:
    cluster = tls_cluster.cluster
    leader = cluster.wait_for_leader()
    term_before = leader.status()
    assert term_before is not None
    # Whoever leads, the impostor claims to be one follower with the other one's certificate.
    victim, other = sorted(n for n in ("n1", "n2", "n3") if n != leader.node_id)
    vote = VoteRequest(group=0, term=term_before["term"] + 5, src=victim, dst=leader.node_id,
                       last_log_index=10**9, last_log_term=term_before["term"] + 5)  # fmt: skip
    # A genuine certificate of another member, claiming to be the victim: refused, and
    # nothing it sent is stepped.
    for cert, expected in ((other, f"names {other}"), ("client", "no DNS name"), (None, "no TLS")):
        context = tls_cluster.context(cert)
        with RawConn(leader.address, hello=False, tls=context) as conn:
            conn.send_bytes(frame(peer_hello(victim)) + raft_frame([vote]))
            reply = conn.recv()
            assert (reply["t"], reply["code"]) == ("error", "AUTH_FAILED"), reply
            assert expected in reply["message"]
            assert conn.closed_by_peer()
    # A certificate from another CA, naming n2: the TLS handshake itself fails.
    rogue = tls_cluster.context("rogue-n2")
    with (
        pytest.raises((ssl.SSLError, ConnectionError, OSError)),
        RawConn(leader.address, hello=False, tls=rogue) as conn,
    ):
        conn.send_bytes(frame(peer_hello(victim)))
        conn.recv()
    # The victim's genuine certificate gets in (and is the only way to speak for it).
    genuine = tls_cluster.context(victim)
    with RawConn(leader.address, hello=peer_hello(victim), tls=genuine) as conn:
        assert conn.welcome["t"] == "welcome", conn.welcome
    after = cluster.wait_for_leader()
    status = after.status()
    assert after.node_id == leader.node_id and status is not None
    assert status["term"] == term_before["term"]


def test_a_client_that_cannot_verify_the_members_exits_78(
    tls_cluster: TlsCluster, tmp_path: Path
) -> None:
    dlm = Dlm(tls_cluster.cluster.members_env, tmp_path)
    for name in ("DLM_TLS_CA", "DLM_TLS_CERT", "DLM_TLS_KEY", "DLM_SECRET_FILE"):
        dlm.env.pop(name, None)
    # The wrong CA: the members' certificates cannot be verified.
    proc = dlm.run("acquire", "tls-cli", "--tls-ca", tls_cluster.file("rogue-ca.crt"))
    assert proc.returncode == 78, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "--tls-ca" in lines[0] and "DLM_TLS_CA" in lines[0], lines
    obj = dlm.json("acquire", "tls-cli", "--tls-ca", tls_cluster.file("rogue-ca.crt"), code=78)
    assert obj["error"]["code"] == "AUTH_FAILED"
    # Dialled by a name their certificates do not hold.
    port = tls_cluster.cluster.nodes["n1"].port
    proc = dlm.run(
        "status", "--cluster", f"localhost:{port}", "--tls-ca", tls_cluster.file("ca.crt")
    )
    assert proc.returncode == 78 and "DLM_TLS_CA" in proc.stderr, proc.stderr
    # A file that is not a CA certificate.
    proc = dlm.run("acquire", "tls-cli", env={"DLM_TLS_CA": tls_cluster.file("n1.key")})
    assert proc.returncode == 78 and "n1.key" in proc.stderr, proc.stderr
    # Right: by flag (fast path), by variable, with a client certificate too.
    ok = dlm.run("acquire", "tls-cli", "--tls-ca", tls_cluster.file("ca.crt"))
    assert ok.returncode == 0, ok.stderr
    ok = dlm.run("status", env={"DLM_TLS_CA": tls_cluster.file("ca.crt")})
    assert ok.returncode == 0, ok.stderr
    env = {
        "DLM_TLS_CA": tls_cluster.file("ca.crt"),
        "DLM_TLS_CERT": tls_cluster.file("client.crt"),
        "DLM_TLS_KEY": tls_cluster.file("client.key"),
    }
    ok = dlm.run("exec", "--lock", "tls-exec", "--", "true", env=env)
    assert ok.returncode == 0, ok.stderr


def test_a_plain_client_is_told_about_tls(tls_cluster: TlsCluster, tmp_path: Path) -> None:
    dlm = Dlm(tls_cluster.cluster.members_env, tmp_path)
    for name in ("DLM_TLS_CA", "DLM_TLS_CERT", "DLM_TLS_KEY"):
        dlm.env.pop(name, None)
    proc = dlm.run("acquire", "plain", "--dial-timeout", "1s", "--timeout", "2s")
    assert proc.returncode == 69, proc.stderr
    assert "DLM_TLS_CA" in proc.stderr


@pytest.mark.parametrize("native", [True, False], ids=["asyncio", "anyio"])
def test_the_async_client_speaks_tls_too(
    tls_cluster: TlsCluster, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    import anyio

    from dlm.client import aio
    from dlm.client.errors import AuthFailed

    monkeypatch.setattr(aio, "NATIVE_ASYNCIO", native)
    addresses = tls_cluster.cluster.addresses

    async def scenario() -> None:
        async with aio.AsyncClient(addresses, tls=tls_cluster.context("client")) as client:
            lease = await client.open_lease(5_000)
            await client.acquire(lease, f"async-tls-{native}")
            assert await client.member_status(addresses[0]) is not None
        rogue = tls_cluster.context(ca="rogue-ca")
        async with aio.AsyncClient(addresses, tls=rogue, timeout=5.0) as client:
            with pytest.raises(AuthFailed) as raised:
                await client.status()
            assert "DLM_TLS_CA" in raised.value.message

    anyio.run(scenario)


def test_tls_and_secrets_together(tmp_path: Path) -> None:
    """Both layers at once: the handshake runs inside TLS, on peer links and for clients."""
    from dlm import auth

    pki = make_pki(tmp_path / "pki", ["n1", "n2", "n3"])
    for name in ("peer", "client"):
        auth.write_secret_file(str(tmp_path / f"{name}.secret"))

    def flags(node: NodeProc) -> list[str]:
        return [
            "--tls-cert", str(pki / f"{node.node_id}.crt"),
            "--tls-key", str(pki / f"{node.node_id}.key"),
            "--tls-ca", str(pki / "ca.crt"),
            "--peer-secret-file", str(tmp_path / "peer.secret"),
            "--client-secret-file", str(tmp_path / "client.secret"),
        ]  # fmt: skip

    (tmp_path / "c").mkdir()
    cluster = Cluster(
        tmp_path / "c",
        size=3,
        node_args=flags,
        client_secret=auth.load_secret(str(tmp_path / "client.secret")),
        client_tls=tls.client_context(str(pki / "ca.crt")),
    )
    try:
        cluster.start_all()
        leader = cluster.wait_for_leader(timeout=15.0)
        with cluster.client(timeout=10.0) as client:
            lease = client.open_lease(5_000)
            assert client.acquire(lease, "both").token > 0
        # A genuine certificate without the peer secret still does not get in.
        follower = next(n for n in cluster.nodes.values() if n is not leader)
        context = tls.client_context(str(pki / "ca.crt"), str(pki / "n2.crt"), str(pki / "n2.key"))
        hello = peer_hello("n2") if follower.node_id != "n2" else peer_hello("n3")
        if hello["node"] == "n3":
            context = tls.client_context(
                str(pki / "ca.crt"), str(pki / "n3.crt"), str(pki / "n3.key")
            )
        with RawConn(follower.address, hello=hello, tls=context) as conn:
            assert (conn.welcome["t"], conn.welcome["code"]) == ("error", "AUTH_FAILED")
    finally:
        cluster.stop_all()
