"""The adapter's peer side over real sockets: the peer hello, Raft frames in, our links out.

The member under test is n1 of a cluster whose other members are played by
the test (or are addresses nobody answers on), so nothing is elected unless a
test makes it so.
"""

from __future__ import annotations

import socket
from typing import Any

import anyio
import anyio.abc
import pytest

from dlm.node.peer_codec import decode_raft_frame, raft_frame
from dlm.node.raft.types import Heartbeat
from dlm.wire import Hello, HelloRole

from .server_harness import WAIT, Wire, log_text, running_member

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def dead_address() -> tuple[str, int]:
    """An address on 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1", s.getsockname()[1]


def others(*names: str) -> dict[str, tuple[str, int]]:
    return {name: dead_address() for name in names}


def peer_hello(node: str, cluster: str = "unit", **fields: Any) -> dict[str, Any]:
    return {"t": "hello", "role": "peer", "version": 1, "cluster": cluster, "node": node, **fields}


@pytest.mark.parametrize(("fields", "version"), [({}, 1), ({"max_version": 2}, 2)])
async def test_a_peer_is_welcomed_with_the_lower_version_and_the_member_learns_it(
    fields: dict[str, Any], version: int
) -> None:
    async with running_member(peers=others("n2", "n3"), elect=False) as (server, port):
        wire = await Wire.connect(port)
        await wire.send(peer_hello("n2", **fields))
        assert await wire.recv() == {
            "t": "welcome",
            "version": version,
            "node": "n1",
            "cluster": "unit",
        }
        assert server.machine._peer_versions["n2"] == version


@pytest.mark.parametrize(
    ("node", "cluster", "reason"),
    [
        ("n9", "unit", "not a member"),
        ("n1", "unit", "own id"),
        ("n2", "other", "cluster id mismatch"),
    ],
    ids=["unknown-member", "our-own-id", "another-cluster"],
)
async def test_a_peer_hello_from_outside_the_cluster_is_refused(
    node: str, cluster: str, reason: str
) -> None:
    async with running_member(peers=others("n2", "n3"), elect=False) as (server, port):
        wire = await Wire.connect(port)
        await wire.send(peer_hello(node, cluster))
        refusal = await wire.recv()
        assert refusal["code"] == "BAD_REQUEST" and reason in refusal["message"]
        await wire.closed()
        assert "peer_refused" in log_text(server)


async def _peer(port: int, node: str = "n2") -> Wire:
    wire = await Wire.connect(port)
    await wire.send(peer_hello(node, max_version=2))
    assert (await wire.recv())["t"] == "welcome"
    return wire


async def test_raft_messages_from_a_peer_reach_the_machine() -> None:
    async with running_member(peers=others("n2", "n3"), elect=False) as (server, port):
        wire = await _peer(port)
        heartbeat = Heartbeat(group=0, term=7, src="n2", dst="n1", commit=0)
        await wire.send_bytes(raft_frame([heartbeat]))
        with anyio.fail_after(WAIT):
            while server.machine.leader != "n2":
                await anyio.sleep(0.005)
        assert server.machine.raft.term == 7
        assert server.counters.peer_frames["n2"] == 1


async def test_a_message_claiming_another_sender_is_dropped() -> None:
    async with running_member(peers=others("n2", "n3"), elect=False) as (server, port):
        wire = await _peer(port, "n2")
        forged = Heartbeat(group=0, term=7, src="n3", dst="n1", commit=0)
        await wire.send_bytes(raft_frame([forged]))
        with anyio.fail_after(WAIT):
            while server.machine.stats.rejected_frames == 0:
                await anyio.sleep(0.005)
        assert server.machine.raft.term < 7 and server.machine.leader is None


async def test_a_peer_frame_that_is_not_raft_ends_the_connection() -> None:
    async with running_member(peers=others("n2", "n3"), elect=False) as (server, port):
        wire = await _peer(port)
        await wire.send({"t": "acquire", "id": 1, "lease": "L", "key": "k", "seq": 1})
        await wire.closed()
        assert "peer_bad_frame" in log_text(server)


async def test_the_member_dials_each_peer_with_a_peer_hello_and_then_sends_raft_frames() -> None:
    async with await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0) as listener:
        peer_port = listener.extra(anyio.abc.SocketAttribute.local_port)
        peers = {"n2": ("127.0.0.1", peer_port), **others("n3")}
        async with running_member(peers=peers, elect=False) as (server, _):
            with anyio.fail_after(WAIT):
                stream = await _accept_one(listener)
            link = Wire(stream)
            hello = Hello.from_wire(await link.recv())
            assert (hello.role, hello.node, hello.cluster) == (HelloRole.PEER, "n1", "unit")
            assert (hello.version, hello.max_version) == (1, 2)
            await link.send({"t": "welcome", "version": 2, "node": "n2", "cluster": "unit"})
            # n1 cannot win alone; it asks n2 for its vote over this link.
            messages = decode_raft_frame(await link.recv())
            assert messages and all((m.src, m.dst) == ("n1", "n2") for m in messages)
            assert server.machine._peer_versions["n2"] == 2
            await link.aclose()


async def _accept_one(
    listener: anyio.abc.Listener[anyio.abc.SocketStream],
) -> anyio.abc.SocketStream:
    accepted: list[anyio.abc.SocketStream] = []
    async with anyio.create_task_group() as tg:

        async def handler(stream: anyio.abc.SocketStream) -> None:
            accepted.append(stream)
            tg.cancel_scope.cancel()
            await anyio.sleep_forever()

        tg.start_soon(listener.serve, handler)
    return accepted[0]
