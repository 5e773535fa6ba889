"""The adapter's peer side over real sockets: the peer hello, Raft frames in, our links out.

The member under test is n1 of a cluster whose other members are played by
the test (or are addresses nobody answers on), so nothing is elected unless a
test makes it so.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from dlm import auth
from dlm.node.peer_codec import decode_raft_frame, raft_frame
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import AppendEntries, Heartbeat
from dlm.node.runtime import server as server_module
from dlm.node.runtime.log import Logger
from dlm.node.runtime.peers import PeerLink, TcpProgress, bound_stalls, tcp_acknowledgements
from dlm.node.runtime.security import NodeSecurity
from dlm.node.runtime.server import INLINE_SLOW_S
from dlm.records import ConfState, Entry
from dlm.wire import PROTOCOL_VERSION, ErrorCode, Hello, HelloRole, encode_frame, error

from .server_harness import WAIT, Wire, log_text, running_member

pytestmark = pytest.mark.anyio


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
        assert server.machine.health.versions["n2"] == version


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
            assert (hello.version, hello.max_version) == (1, PROTOCOL_VERSION)
            await link.send({"t": "welcome", "version": 2, "node": "n2", "cluster": "unit"})
            # n1 cannot win alone; it asks n2 for its vote over this link.
            messages = decode_raft_frame(await link.recv())
            assert messages and all((m.src, m.dst) == ("n1", "n2") for m in messages)
            assert server.machine.health.versions["n2"] == 2
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


def _watched_link(
    listener: anyio.abc.Listener[anyio.abc.SocketStream],
    probe: Callable[[Any], TcpProgress],
    *,
    stall_after: float | None = 0.05,
    out: io.StringIO | None = None,
    downs: list[tuple[str, bool]] | None = None,
) -> PeerLink:
    """n1's link to n2 at ``listener``, whose acknowledgements ``probe`` reports."""
    return PeerLink(
        local_id="n1",
        peer_id="n2",
        address=("127.0.0.1", listener.extra(anyio.abc.SocketAttribute.local_port)),
        cluster="unit",
        log=Logger("n1", stream=out or io.StringIO()),
        on_down=lambda peer, gone: None if downs is None else downs.append((peer, gone)),
        rng=random.Random(7),
        stall_after=stall_after,
        ack_probe=probe,
    )


async def test_a_link_whose_connection_stopped_delivering_is_replaced() -> None:
    """Something waits for an acknowledgement and none comes, and the kernel has backed
    its retransmissions off to 3.2 s (the probe says so): after ``stall_after`` the link
    drops the connection and dials a new one."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    downs: list[tuple[str, bool]] = []
    out = io.StringIO()

    def stuck(transport: Any) -> TcpProgress:
        return TcpProgress(outstanding=True, acknowledged=0, retransmit_after=3.2)

    link = _watched_link(listener, stuck, out=out, downs=downs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.run)
        with anyio.fail_after(WAIT):
            first = await _welcome(listener)
            second = await _welcome(listener)
        assert link.replaced == 1
        assert downs == [("n2", False)]
        text = out.getvalue()
        assert "peer_link_stalled" in text
        assert "stopped delivering" in text
        tg.cancel_scope.cancel()
    await first.aclose()
    await second.aclose()
    await listener.aclose()


async def test_a_link_still_retransmitting_at_its_first_pace_keeps_its_connection() -> None:
    """Nothing acknowledged for many times ``stall_after``, but the kernel's next
    retransmission is 0.2 s away (a lossy link, not a dead one): a new connection would
    wait longer for its own lost SYN, so the link keeps the one it has."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    asked = anyio.Event()
    looks: list[int] = []

    def retrying(transport: Any) -> TcpProgress:
        looks.append(1)
        if len(looks) >= 40:  # 40 looks, every stall_after / 4: ten stall_afters
            asked.set()
        return TcpProgress(outstanding=True, acknowledged=0, retransmit_after=0.2)

    link = _watched_link(listener, retrying)
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.run)
        with anyio.fail_after(WAIT):
            wire = await _welcome(listener)
            await asked.wait()
        assert link.replaced == 0
        assert link.connected
        tg.cancel_scope.cancel()
    await wire.aclose()
    await listener.aclose()


async def test_a_link_without_a_stall_bound_keeps_its_connection() -> None:
    """The same stuck probe, but no ``stall_after``: the probe is never even asked."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    asked: list[int] = []

    def stuck(transport: Any) -> TcpProgress:
        asked.append(1)
        return TcpProgress(outstanding=True, acknowledged=0, retransmit_after=3.2)

    link = _watched_link(listener, stuck, stall_after=None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.run)
        with anyio.fail_after(WAIT):
            wire = await _welcome(listener)
            while not link.connected:
                await anyio.sleep(0.01)
        assert asked == []
        tg.cancel_scope.cancel()
    await wire.aclose()
    await listener.aclose()


async def test_the_kernel_counts_what_a_link_s_peer_acknowledged() -> None:
    """tcp_acknowledgements reads TCP_INFO: bytes written to a peer that reads them come
    back acknowledged, and nothing is left outstanding; TCP_USER_TIMEOUT is set."""
    if not sys.platform.startswith("linux"):
        pytest.skip("TCP_INFO's byte counters are Linux's")
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    loop = asyncio.get_running_loop()
    async with anyio.create_task_group() as tg:
        accepted: list[anyio.abc.SocketStream] = []
        got = anyio.Event()

        async def handler(stream: anyio.abc.SocketStream) -> None:
            accepted.append(stream)
            received = 0
            while received < 5000:
                received += len(await stream.receive())
            got.set()
            await anyio.sleep_forever()

        tg.start_soon(listener.serve, handler)
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        bound_stalls(transport, 0.3)
        sock = transport.get_extra_info("socket")
        # 8 x 0.3 s is below the 4 s floor.
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 4000
        seen = tcp_acknowledgements(transport)
        assert seen is not None
        before = seen.acknowledged
        transport.write(b"x" * 5000)
        with anyio.fail_after(WAIT):
            await got.wait()
            # The receiver has the bytes; its kernel's acknowledgement is on its way.
            while True:
                seen = tcp_acknowledgements(transport)
                assert seen is not None
                if seen.acknowledged - before >= 5000:
                    break
                await anyio.sleep(0.01)
        assert (seen.outstanding, seen.acknowledged) == (False, before + 5000)
        # Loopback's round trip is microseconds: the timeout is Linux's floor, 200 ms
        # (plus the clock tick it is kept in), far from a backed-off one.
        assert 0.2 <= seen.retransmit_after < 0.5
        transport.abort()
        tg.cancel_scope.cancel()
    await listener.aclose()


# ---------------------------------------------------------------------------
# Nothing before the proof (issue 20; ARCHITECTURE.md invariant 9)
# ---------------------------------------------------------------------------

PEER_SECRET = b"peer-secret-for-the-unit-tests!!"
REMOVED_TEXT = "member n2 was removed from this cluster: remove its data directory"


async def test_an_unproved_peer_hello_leaves_the_members_address_book_alone() -> None:
    """A stranger's hello names an id the log does not know and an address: before its
    proof the member keeps neither (it would redirect the address used for that leader)."""
    security = NodeSecurity(peer_secret=PEER_SECRET)
    async with running_member(peers=others("n2", "n3"), elect=False, security=security) as (
        server,
        port,
    ):
        unlisted = server.machine.membership.unlisted
        stranger = peer_hello(
            "n7", addr="10.9.9.9:7700", max_version=2, auth="hmac-sha256", auth_nonce=os.urandom(32)
        )
        wire = await Wire.connect(port)
        await wire.send(stranger)
        assert (await wire.recv())["t"] == "welcome"
        assert "n7" not in unlisted
        await wire.send({"t": "auth", "proof": os.urandom(32)})
        assert (await wire.recv())["code"] == "AUTH_FAILED"
        await wire.closed()
        assert "n7" not in unlisted
        # A hello that is all the stranger sends changes nothing either.
        wire = await Wire.connect(port)
        await wire.send(peer_hello("n8", addr="10.9.9.8:7700"))
        assert (await wire.recv())["code"] == "AUTH_FAILED"
        assert "n8" not in unlisted
        # The same hello from a holder of the secret is taken once it proves it.
        initiator = auth.Initiator(
            PEER_SECRET, auth.new_nonce(), role="peer", cluster="unit", node="n7"
        )
        wire = await Wire.connect(port)
        await wire.send({**peer_hello("n7", addr="10.9.9.9:7700"), **initiator.hello_fields()})
        await wire.send(initiator.check_welcome(await wire.recv()))
        with anyio.fail_after(WAIT):
            while "n7" not in unlisted:
                await anyio.sleep(0.005)
        assert unlisted["n7"] == "10.9.9.9:7700"


async def _impostor(
    listener: anyio.abc.Listener[anyio.abc.SocketStream], answered: list[int]
) -> None:
    """Answers every connection's first bytes with the refusal a removed member gets."""

    async def handler(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with anyio.move_on_after(WAIT):
                await stream.receive()
                await stream.send(encode_frame(error(None, ErrorCode.BAD_REQUEST, REMOVED_TEXT)))
                answered.append(1)

    await listener.serve(handler)


@pytest.mark.parametrize("secret", [PEER_SECRET, None], ids=["peer-secret", "no-auth"])
async def test_a_refusal_before_the_proof_never_reaches_the_member(secret: bytes | None) -> None:
    answered: list[int] = []
    refused: list[tuple[str, str]] = []
    stream = io.StringIO()
    async with await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0) as listener:
        link = PeerLink(
            local_id="n2",
            peer_id="n3",
            address=("127.0.0.1", listener.extra(anyio.abc.SocketAttribute.local_port)),
            cluster="unit",
            log=Logger("n2", stream=stream),
            on_down=lambda peer, gone: None,
            on_refused=lambda peer, message: refused.append((peer, message)),
            rng=random.Random(7),
            secret=secret,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(_impostor, listener, answered)
            tg.start_soon(link.run)
            with anyio.fail_after(WAIT):
                while len(answered) < 3:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    assert refused == []
    text = stream.getvalue()
    assert "peer_refused" in text and text.count("peer_refusal_unproved") == 1


async def test_a_member_refuses_a_removed_peer_after_the_proof_and_the_peer_believes_it() -> None:
    security = NodeSecurity(peer_secret=PEER_SECRET)
    refused: list[tuple[str, str]] = []
    async with running_member(peers=others("n2", "n3"), elect=False, security=security) as (
        server,
        port,
    ):
        server.machine.membership.removed.add("n2")
        link = PeerLink(
            local_id="n2",
            peer_id="n1",
            address=("127.0.0.1", port),
            cluster="unit",
            log=Logger("n2", stream=io.StringIO()),
            on_down=lambda peer, gone: None,
            on_refused=lambda peer, message: refused.append((peer, message)),
            rng=random.Random(7),
            secret=PEER_SECRET,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.run)
            with anyio.fail_after(WAIT):
                while not refused:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    peer, message = refused[0]
    assert peer == "n1" and "n2 was removed from this cluster" in message


async def test_a_link_refused_after_the_handshake_backs_off_and_says_so_once() -> None:
    """A sealed refusal for another reason (here: not a member) is a failed dial like any
    other: no stop, no line per attempt, backed off."""
    security = NodeSecurity(peer_secret=PEER_SECRET)
    refused: list[tuple[str, str]] = []
    downs: list[bool] = []
    stream = io.StringIO()
    async with running_member(peers=others("n2", "n3"), elect=False, security=security) as (
        _,
        port,
    ):
        link = PeerLink(
            local_id="n9",
            peer_id="n1",
            address=("127.0.0.1", port),
            cluster="unit",
            log=Logger("n9", stream=stream),
            on_down=lambda peer, gone: downs.append(gone),
            on_refused=lambda peer, message: refused.append((peer, message)),
            rng=random.Random(7),
            secret=PEER_SECRET,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.run)
            with anyio.fail_after(WAIT):
                while len(downs) < 4:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    assert len(refused) >= 4 and all("not a member" in m for _, m in refused)
    text = stream.getvalue()
    assert text.count('"peer_refused"') == 1, text
    assert text.count('"peer_connected"') <= 1 and '"peer_disconnected"' not in text, text


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


async def test_an_action_that_fails_half_way_through_a_batch_stops_the_member() -> None:
    """The actions after the failed one are lost (a write among them, then a later write
    acknowledged, would claim entries the disk lacks), so the member stops as it does on
    a failed write, instead of serving on with a hole in what it did."""
    n2 = dead_address()
    async with running_member() as (server, port):
        broken = RuntimeError("opening the link failed")

        def fail(peers: dict[str, str]) -> None:
            raise broken

        server._reconcile_links = fail  # type: ignore[method-assign]
        wire = await Wire.client(port)
        await wire.send(
            {
                "t": "member_add",
                "id": 1,
                "member": "n2",
                "address": f"{n2[0]}:{n2[1]}",
                "client": "c",
                "seq": 1,
            }
        )
        with anyio.fail_after(WAIT):
            await server.stopped.wait()
        assert server.failure is broken
        assert '"event":"actions_failed"' in log_text(server)
