"""The adapter's peer side over real sockets: the peer hello, Raft frames in, our links out.

The member under test is n1 of a cluster whose other members are played by
the test (or are addresses nobody answers on), so nothing is elected unless a
test makes it so.
"""

from __future__ import annotations

import io
import random
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from dlm.node import server as server_module
from dlm.node.log import Logger
from dlm.node.peer_codec import decode_raft_frame, raft_frame
from dlm.node.peers import PeerLink
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import AppendEntries, ConfState, Entry, Heartbeat
from dlm.node.server import INLINE_SLOW_S
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


async def _link_to(
    listener: anyio.abc.Listener[anyio.abc.SocketStream], downs: list[tuple[str, bool]]
) -> tuple[PeerLink, anyio.Event]:
    """A PeerLink from n1 to the test's n2 at ``listener``; ``downs`` records its on_down."""
    gone = anyio.Event()

    def on_down(peer: str, is_gone: bool) -> None:
        downs.append((peer, is_gone))
        if is_gone:
            gone.set()

    link = PeerLink(
        local_id="n1",
        peer_id="n2",
        address=("127.0.0.1", listener.extra(anyio.abc.SocketAttribute.local_port)),
        cluster="unit",
        log=Logger("n1", stream=io.StringIO()),
        on_down=on_down,
        rng=random.Random(7),
    )
    return link, gone


async def _welcome(listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> Wire:
    wire = Wire(await _accept_one(listener))
    assert Hello.from_wire(await wire.recv()).node == "n1"
    await wire.send({"t": "welcome", "version": 2, "node": "n2", "cluster": "unit"})
    return wire


async def test_a_link_says_its_peer_is_gone_only_when_the_redial_after_a_break_is_refused() -> None:
    downs: list[tuple[str, bool]] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    link, gone = await _link_to(listener, downs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.run)
        with anyio.fail_after(WAIT):
            wire = await _welcome(listener)
            # The connection breaks and the peer answers the redial: a reset, not a death.
            await wire.aclose()
            wire = await _welcome(listener)
        assert downs == [("n2", False)]
        # Now the process dies: its connection breaks and nothing listens any more.
        await listener.aclose()
        await wire.aclose()
        with anyio.fail_after(WAIT):
            await gone.wait()
        assert downs == [("n2", False), ("n2", False), ("n2", True)]
        tg.cancel_scope.cancel()


class _SlowDisk(MemoryStorage):
    """Every append takes longer than INLINE_SLOW_S; records the thread that wrote it."""

    def __init__(self) -> None:
        super().__init__(ConfState(voters=("n1", "n2", "n3")))
        self.writers: list[str] = []
        self.written = [threading.Event() for _ in range(3)]
        """Set as the first, second and third append finish (from whichever thread wrote)."""

    def append(self, entries: Sequence[Entry]) -> None:
        time.sleep(2 * INLINE_SLOW_S)  # the disk's own slowness, not synchronisation
        super().append(entries)
        self.writers.append(threading.current_thread().name)
        self.written[len(self.writers) - 1].set()


async def test_a_follower_whose_fsync_was_slow_writes_on_the_disk_thread_after() -> None:
    disk = _SlowDisk()
    async with running_member(storage=disk, peers=others("n2", "n3"), elect=False) as (_, port):
        wire = await _peer(port)
        for index in (1, 2):
            append = AppendEntries(
                group=0,
                term=1,
                src="n2",
                dst="n1",
                prev_index=index - 1,
                prev_term=index - 1 and 1,
                entries=(Entry(index, 1),),
                commit=0,
            )
            await wire.send_bytes(raft_frame([append]))
            assert await anyio.to_thread.run_sync(disk.written[index - 1].wait, WAIT)
    # The first write ran on the loop (the follower's fast path) and was slow: the loop
    # must keep answering heartbeats, so the next one went to the disk thread.
    assert disk.writers[0] != "dlm-persist"
    assert disk.writers[1] == "dlm-persist"


async def test_a_follower_keeps_to_the_disk_thread_while_its_disk_stays_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the pause, a disk whose last write was slow still gets no write on the loop:
    one more 2 s fsync there would stop the follower answering heartbeats for 2 s."""
    monkeypatch.setattr(server_module, "INLINE_PAUSE_S", 0.0)
    disk = _SlowDisk()
    async with running_member(storage=disk, peers=others("n2", "n3"), elect=False) as (_, port):
        wire = await _peer(port)
        for index in (1, 2, 3):
            append = AppendEntries(
                group=0,
                term=1,
                src="n2",
                dst="n1",
                prev_index=index - 1,
                prev_term=index - 1 and 1,
                entries=(Entry(index, 1),),
                commit=0,
            )
            await wire.send_bytes(raft_frame([append]))
            assert await anyio.to_thread.run_sync(disk.written[index - 1].wait, WAIT)
    assert disk.writers[0] != "dlm-persist"
    assert disk.writers[1:] == ["dlm-persist", "dlm-persist"]
