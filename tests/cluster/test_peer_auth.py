"""Peers and clients prove the cluster's secret: an attacker on the network gets nothing in.

One 3-member cluster (module-scoped) runs with ``--peer-secret-file`` and
``--client-secret-file``. Each attack is made by hand (``RawConn``), and then the
cluster must be as before: the same term on every member (a forged message with
a higher term that got through would have changed it), the same holder of a
lock, and a new grant's token above the old one.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from dlm import auth
from dlm.node.peer_codec import raft_frame, raft_to_wire
from dlm.node.raft.types import AppendEntries, InstallSnapshot, VoteRequest
from dlm.records import ConfState, Entry, SnapshotMeta
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, NodeProc, RawConn, wait_for

pytestmark = pytest.mark.cluster


class Secured:
    def __init__(self, cluster: Cluster, peer_secret: bytes, client_secret: bytes, base: Path):
        self.cluster = cluster
        self.peer_secret = peer_secret
        self.client_secret = client_secret
        self.base = base


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("secured")
    auth.write_secret_file(str(base / "peer.secret"))
    auth.write_secret_file(str(base / "client.secret"))
    peer_secret = auth.load_secret(str(base / "peer.secret"))
    client_secret = auth.load_secret(str(base / "client.secret"))

    def flags(_: NodeProc) -> list[str]:
        return [
            "--peer-secret-file",
            str(base / "peer.secret"),
            "--client-secret-file",
            str(base / "client.secret"),
        ]

    cluster = Cluster(base / "cluster", size=3, node_args=flags, client_secret=client_secret)
    (base / "cluster").mkdir()
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        yield Secured(cluster, peer_secret, client_secret, base)
    finally:
        cluster.stop_all()


def peer_hello(node: str, cluster: str = "test") -> dict[str, Any]:
    return {"t": "hello", "role": "peer", "version": 1, "max_version": 2, "cluster": cluster,
            "node": node}  # fmt: skip


def frame(obj: Any) -> bytes:
    body = cbor2.dumps(obj)
    return struct.pack(">I", len(body)) + body


def terms(cluster: Cluster) -> dict[str, int]:
    """Every member's term. A status that went unanswered (a member busy under a loaded
    machine) is asked again, for up to 10 s: only the terms are the test."""

    def every_view() -> dict[str, dict[str, Any]] | None:
        views = {n.node_id: n.status() for n in cluster.nodes.values()}
        return {k: v for k, v in views.items() if v is not None} if all(views.values()) else None

    views = wait_for(every_view, 10.0, "every member's status")
    return {node: view["term"] for node, view in views.items()}


def forgeries(src: str, dst: str, term: int) -> list[Any]:
    """Messages that would each change the member's term (and log, or state) if stepped."""
    junk = Entry(index=1, term=term, data=b"\xff" * 16)
    meta = SnapshotMeta(index=10_000, term=term, conf=ConfState(voters=(src,)))
    return [
        AppendEntries(group=0, term=term, src=src, dst=dst, prev_index=0, prev_term=0,
                      entries=(junk,), commit=1),
        InstallSnapshot(group=0, term=term, src=src, dst=dst, meta=meta, offset=0,
                        data=b"\x00" * 64, done=True),
        VoteRequest(group=0, term=term, src=src, dst=dst, last_log_index=10**9,
                    last_log_term=term),
    ]  # fmt: skip


class LockWitness:
    """A lock held before the attacks; afterwards its holder must be the same, and the next
    grant's token must be higher."""

    def __init__(self, cluster: Cluster, key: str) -> None:
        self.cluster = cluster
        self.key = key
        with cluster.client(timeout=10.0) as client:
            self.lease = client.open_lease(60_000)
            self.token = client.acquire(self.lease, key).token

        def agreed() -> dict[str, int] | None:
            seen = terms(cluster)
            return seen if len(set(seen.values())) == 1 else None

        # A member started a moment ago may not have heard of the leader's term yet.
        self.terms = wait_for(agreed, 10.0, "every member at the leader's term")

    def unchanged(self) -> None:
        assert terms(self.cluster) == self.terms
        with self.cluster.client(timeout=10.0) as client:
            state = client.get(self.key)
            assert [(h.lease, h.token) for h in state.holders] == [(self.lease.id, self.token)]
            lease = client.open_lease(5_000)
            assert client.acquire(lease, self.key + "-next").token > self.token
            client.close_lease(lease)


def test_a_peer_hello_without_the_secret_is_refused_and_nothing_gets_through(
    secured: Secured,
) -> None:
    cluster = secured.cluster
    leader = cluster.wait_for_leader()
    witness = LockWitness(cluster, "peer-no-secret")
    term = witness.terms[leader.node_id] + 5
    for target in cluster.nodes.values():
        claimed = next(n for n in cluster.nodes if n != target.node_id)
        attack = raft_frame(forgeries(claimed, target.node_id, term))
        # The hello names a real member; forged Raft messages follow in the same write.
        with RawConn(target.address, hello=False) as conn:
            conn.send_bytes(frame(peer_hello(claimed)) + attack)
            reply = conn.recv()
            assert (reply["t"], reply["code"]) == ("error", "AUTH_FAILED")
            assert "requires authentication" in reply["message"]
            assert conn.closed_by_peer()
        # With a nonce but not the secret: the member's proof arrives, a made-up one fails.
        asking = {**peer_hello(claimed), "auth": "hmac-sha256", "auth_nonce": os.urandom(32)}
        with RawConn(target.address, hello=asking) as conn:
            assert conn.welcome["t"] == "welcome" and "auth_proof" in conn.welcome
            conn.send_bytes(frame({"t": "auth", "proof": os.urandom(32)}) + attack)
            reply = conn.recv()
            assert (reply["t"], reply["code"]) == ("error", "AUTH_FAILED")
            assert conn.closed_by_peer()
    witness.unchanged()


def test_with_the_secret_messages_from_a_non_member_id_are_dropped(secured: Secured) -> None:
    cluster = secured.cluster
    witness = LockWitness(cluster, "peer-non-member")
    leader = cluster.wait_for_leader()
    term = witness.terms[leader.node_id] + 5
    for target in cluster.nodes.values():
        # A hello naming a non-member is refused even with the secret: after its proof,
        # sealed, so that the refusal proves who wrote it (admission.py).
        with RawConn(target.address, hello=peer_hello("n9"), secret=secured.peer_secret) as conn:
            assert conn.welcome["t"] == "welcome"
            refusal = conn.recv()
            assert (refusal["t"], refusal["code"]) == ("error", "BAD_REQUEST")
            assert "not a member" in refusal["message"]
        # Authenticated as a member, messages claiming another sender are dropped.
        member = next(n for n in cluster.nodes if n != target.node_id)
        hello = peer_hello(member)
        with RawConn(target.address, hello=hello, secret=secured.peer_secret) as conn:
            assert conn.welcome["t"] == "welcome"
            forged = forgeries("n9", target.node_id, term)
            conn.send({"t": "raft", "m": [raft_to_wire(m) for m in forged]})
            # A malformed frame after them: once the member closes, it has read them all.
            conn.send({"t": "raft", "m": [[3, 0, "x"]]})
            assert conn.closed_by_peer()
    witness.unchanged()


def test_a_recorded_handshake_cannot_be_replayed(secured: Secured) -> None:
    cluster = secured.cluster
    leader = cluster.wait_for_leader()
    witness = LockWitness(cluster, "peer-replay")
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    for hello, secret in (
        ({"t": "hello", "role": "client", "version": 1}, secured.client_secret),
        (peer_hello(leader.node_id), secured.peer_secret),
    ):
        with RawConn(follower.address, hello=hello, secret=secret) as recorded:
            assert recorded.welcome["t"] == "welcome"
            handshake = bytes(recorded.sent)  # the hello and the auth frame, as sent
            if hello["role"] == "client":
                assert recorded.request({"t": "status", "stale": True})["t"] == "ok"
        term = witness.terms[follower.node_id] + 5
        replayed = handshake + raft_frame(forgeries(leader.node_id, follower.node_id, term))
        with RawConn(follower.address, hello=False) as conn:
            conn.send_bytes(replayed)
            assert conn.recv()["t"] == "welcome"  # a fresh nonce: the old proof is worthless
            reply = conn.recv()
            assert (reply["t"], reply["code"]) == ("error", "AUTH_FAILED")
            assert conn.closed_by_peer()
    witness.unchanged()


@pytest.mark.parametrize("how", ["no tag", "wrong tag", "replayed frame"])
def test_a_frame_without_its_tag_after_the_handshake_closes_the_connection(
    secured: Secured, how: str
) -> None:
    cluster = secured.cluster
    leader = cluster.wait_for_leader()
    witness = LockWitness(cluster, f"peer-mac-{how.replace(' ', '-')}")
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    term = witness.terms[follower.node_id] + 5

    def tampered(conn: RawConn, obj: Any) -> bytes:
        body = cbor2.dumps(obj)
        if how == "no tag":
            return struct.pack(">I", len(body)) + body
        assert conn.sealer is not None, "the link was opened with the secret"
        sealed = conn.sealer.seal(body)
        if how == "wrong tag":
            return sealed[:-1] + bytes([sealed[-1] ^ 1])
        conn.send_bytes(sealed)  # delivered once, properly
        return sealed

    # A client connection: the member answers AUTH_FAILED and hangs up.
    with RawConn(follower.address, secret=secured.client_secret) as conn:
        assert conn.request({"t": "status", "stale": True})["t"] == "ok"
        conn.send_bytes(tampered(conn, {"t": "status", "stale": True, "id": 99}))
        if how == "replayed frame":
            assert conn.recv()["id"] == 99  # the genuine copy
        reply = conn.recv()
        assert (reply["t"], reply["code"]) == ("error", "AUTH_FAILED")
        assert conn.closed_by_peer()
    # A peer connection: a tampered Raft frame is never stepped, and the link is cut.
    hello = peer_hello(leader.node_id)
    with RawConn(follower.address, hello=hello, secret=secured.peer_secret) as conn:
        assert conn.welcome["t"] == "welcome"
        vote = forgeries(leader.node_id, follower.node_id, term)[2]
        message: dict[str, Any] = {"t": "raft", "m": [raft_to_wire(vote)]}
        if how == "replayed frame":
            # The genuine copy would be stepped (it comes from a member): send a harmless one.
            message = {"t": "raft", "m": []}
        conn.send_bytes(tampered(conn, message))
        assert conn.closed_by_peer()
    witness.unchanged()


def test_a_term_of_2_to_the_64_is_refused_by_the_decoder(secured: Secured) -> None:
    cluster = secured.cluster
    leader = cluster.wait_for_leader()
    witness = LockWitness(cluster, "peer-huge-term")
    for target in cluster.nodes.values():
        member = next(n for n in cluster.nodes if n != target.node_id)
        hello = peer_hello(member)
        with RawConn(target.address, hello=hello, secret=secured.peer_secret) as conn:
            assert conn.welcome["t"] == "welcome"
            append = [3, 0, 2**64, member, target.node_id, 0, 0, [], 0]
            conn.send({"t": "raft", "m": [append]})
            assert conn.closed_by_peer()
        assert target.alive
    assert cluster.wait_for_leader().node_id == leader.node_id
    witness.unchanged()


def test_a_client_without_the_secret_exits_78_naming_the_option(
    secured: Secured, tmp_path: Path
) -> None:
    dlm = Dlm(secured.cluster.members_env, tmp_path)
    dlm.env.pop("DLM_SECRET_FILE", None)
    proc = dlm.run("acquire", "cli-no-secret", "--timeout", "5s")
    assert proc.returncode == 78, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlm: "), proc.stderr
    assert "--secret-file" in lines[0] and "DLM_SECRET_FILE" in lines[0]
    assert dlm.json("acquire", "cli-no-secret", code=78)["error"]["code"] == "AUTH_FAILED"

    # The wrong secret: the members cannot prove ours, so dlm stops at once.
    wrong = tmp_path / "wrong.secret"
    auth.write_secret_file(str(wrong))
    proc = dlm.run("acquire", "cli-no-secret", "--secret-file", str(wrong))
    assert proc.returncode == 78, proc.stderr
    assert "--secret-file" in proc.stderr and "DLM_SECRET_FILE" in proc.stderr
    # A secret file others may read is refused before anything is sent.
    right = secured.base / "client.secret"
    loose = tmp_path / "loose.secret"
    loose.write_bytes(right.read_bytes())
    loose.chmod(0o644)
    proc = dlm.run("acquire", "cli-no-secret", env={"DLM_SECRET_FILE": str(loose)})
    assert proc.returncode == 78 and "chmod 600" in proc.stderr, proc.stderr

    # With it, by flag (the fast path) or variable, after or before the subcommand.
    ok = dlm.run("acquire", "cli-secret", "--secret-file", str(right), "--format", "env")
    assert ok.returncode == 0, ok.stderr
    ok = dlm.run("--secret-file", str(right), "status", "cli-secret")
    assert ok.returncode == 0, ok.stderr
    ok = dlm.run("status", env={"DLM_SECRET_FILE": str(right)})
    assert ok.returncode == 0, ok.stderr


def test_owner_metadata_with_escape_sequences_is_printed_escaped(
    secured: Secured, tmp_path: Path
) -> None:
    dlm = Dlm(secured.cluster.members_env, tmp_path)
    dlm.env["DLM_SECRET_FILE"] = str(secured.base / "client.secret")
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\ttab\nnewline"
    proc = dlm.run("acquire", "escape-me", "--meta", f"note={evil}")
    assert proc.returncode == 0, proc.stderr
    for fmt in ("table", "tsv"):
        proc = dlm.run("status", "escape-me", "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in proc.stdout
    view = dlm.json("status", "escape-me")
    assert view["holders"][0]["meta"]["note"] == evil  # --json keeps the exact bytes


def test_members_without_the_peer_secret_cannot_join(secured: Secured, tmp_path: Path) -> None:
    """A member started with another peer secret is refused by the others, and refuses them."""
    cluster = secured.cluster
    leader = cluster.wait_for_leader()
    witness = LockWitness(cluster, "peer-impostor")
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    follower.terminate()
    other = tmp_path / "other.secret"
    auth.write_secret_file(str(other))
    saved = cluster.node_args
    client_file = str(secured.base / "client.secret")
    cluster.node_args = lambda _: [
        "--peer-secret-file",
        str(other),
        "--client-secret-file",
        client_file,
    ]
    try:
        follower.start()
        # It cannot win an election (no one listens to it), nor disturb the others.
        wait_for(
            lambda: "peer_auth_failed" in follower.log_path.read_text(), 15.0, "a refused link"
        )
        assert cluster.wait_for_leader().node_id == leader.node_id
        with cluster.client(timeout=10.0) as client:
            lease = client.open_lease(5_000)
            assert client.acquire(lease, "impostor-cannot-block").token > witness.token
    finally:
        follower.terminate()
        cluster.node_args = saved
        follower.start()
    wait_for(lambda: (status := follower.status()) is not None and status["leader"], 15.0,
             "the member back with the right secret")  # fmt: skip
    witness.unchanged()


@pytest.mark.parametrize("native", [True, False], ids=["asyncio", "anyio"])
def test_the_async_client_authenticates_too(
    secured: Secured, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    import anyio

    from dlm.client import aio
    from dlm.client.errors import AuthFailed

    monkeypatch.setattr(aio, "NATIVE_ASYNCIO", native)
    addresses = secured.cluster.addresses

    async def scenario() -> None:
        async with aio.AsyncClient(addresses, secret=secured.client_secret) as client:
            lease = await client.open_lease(5_000)
            first = await client.acquire(lease, f"async-{native}")
            await client.release(lease, f"async-{native}")
            assert (await client.acquire(lease, f"async-{native}")).token > first.token
            assert await client.member_status(addresses[0]) is not None
        for secret in (None, auth.new_secret().encode()):
            async with aio.AsyncClient(addresses, secret=secret, timeout=5.0) as client:
                with pytest.raises(AuthFailed) as raised:
                    await client.status()
                assert "DLM_SECRET_FILE" in raised.value.message

    anyio.run(scenario)


def test_stalled_handshakes_and_frames_are_closed_within_seconds(secured: Secured) -> None:
    """Before the hello, between the welcome and the auth frame, and half-way through a
    frame: each is closed after the hello timeout or the stall timeout (5 s each)."""
    import time

    address = secured.cluster.wait_for_leader().address
    silent = RawConn(address, hello=False)
    asking = {"t": "hello", "role": "client", "version": 1, "auth": "hmac-sha256",
              "auth_nonce": os.urandom(32)}  # fmt: skip
    unproven = RawConn(address, hello=asking)
    assert unproven.welcome["t"] == "welcome"
    half = RawConn(address, secret=secured.client_secret)
    half.send_bytes(struct.pack(">I", 100) + b"\xa1")  # 1 byte of a 100-byte frame
    started = time.monotonic()
    try:
        for conn in (silent, unproven, half):
            assert conn.closed_by_peer(timeout=10.0)
        print(f"\nstalled handshakes closed after {time.monotonic() - started:.1f} s")
    finally:
        for conn in (silent, unproven, half):
            conn.close()
