"""The node runtime in-process: a one-member cluster on MemoryStorage, spoken to over TCP."""

from __future__ import annotations

import io
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import cbor2
import pytest

from dlm.node import locks
from dlm.node.config import NodeConfig, Timing
from dlm.node.log import Logger
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import ConfState, Entry, Ready
from dlm.node.server import ClientConn, NodeServer, _Proposal
from dlm.wire import CLIENT_FRAME_LIMIT, Acquire, FrameDecoder, encode_frame

pytestmark = pytest.mark.anyio

FAST = Timing(tick_s=0.01, election_ticks=3, heartbeat_ticks=1, expire_retry_s=0.2)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Conn:
    """A client connection driven by hand."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(CLIENT_FRAME_LIMIT)
        self.frames: list[dict[str, Any]] = []
        self.next_id = 1

    @classmethod
    async def open(cls, port: int) -> Conn:
        conn = cls(await anyio.connect_tcp("127.0.0.1", port))
        await conn.send({"t": "hello", "role": "client", "version": 1})
        assert (await conn.recv())["t"] == "welcome"
        return conn

    async def send(self, obj: Any) -> None:
        await self.stream.send(encode_frame(obj))

    async def recv(self) -> dict[str, Any]:
        with anyio.fail_after(5):
            while not self.frames:
                self.frames.extend(self.decoder.frames())
                if self.frames:
                    break
                self.decoder.feed(await self.stream.receive())
        return self.frames.pop(0)

    async def request(self, **fields: Any) -> dict[str, Any]:
        rid = self.next_id
        self.next_id += 1
        await self.send({**fields, "id": rid})
        while True:
            frame = await self.recv()
            if frame.get("id") == rid:
                return frame
            self.frames.append(frame)  # a push: keep it for later
            if len([f for f in self.frames if f.get("id") is None]) > 10:
                raise AssertionError(f"no reply to {fields}: {self.frames}")

    async def closed(self) -> bool:
        with anyio.fail_after(5):
            try:
                while True:
                    await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return True


@asynccontextmanager
async def running_node(
    tmp_path: Path, storage: MemoryStorage | None = None, **overrides: Any
) -> AsyncIterator[tuple[NodeServer, int]]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    config = NodeConfig(
        node_id="n1",
        listen=("127.0.0.1", port),
        peers={"n1": ("127.0.0.1", port)},
        data_dir=tmp_path,
        cluster="unit",
        timing=FAST,
        **overrides,
    )
    storage = storage or MemoryStorage(ConfState(voters=("n1",)))
    server = NodeServer(config, storage, log=Logger("n1", stream=io.StringIO()))
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(server.serve, listener)
        with anyio.fail_after(5):
            await server.leader_seen.wait()
        try:
            yield server, port
        finally:
            server.stopped.set()


async def test_acquire_conflict_release(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, port):
        c = await Conn.open(port)
        assert (await c.request(t="open_lease", lease="a", ttl_ms=10_000))["t"] == "ok"
        assert (await c.request(t="open_lease", lease="b", ttl_ms=10_000))["t"] == "ok"
        granted = await c.request(t="acquire", lease="a", seq=1, key="k", meta={"pid": "7"})
        assert granted["result"] == "granted"
        assert granted["ttl_ms"] == 10_000
        token = granted["token"]
        locked = await c.request(t="acquire", lease="b", seq=1, key="k")
        assert locked["code"] == "LOCKED"
        assert [(h["lease"], h["token"], h["meta"]) for h in locked["holders"]] == [
            ("a", token, {"pid": "7"})
        ]
        assert locked["retry_after_ms"] > 0
        # A re-sent request (same seq) gets the same answer, not a second grant.
        again = await c.request(t="acquire", lease="a", seq=1, key="k", meta={"pid": "7"})
        assert again["token"] == token
        released = await c.request(t="release", lease="a", seq=2, key="k")
        assert released["released"] == "lock"
        not_holder = await c.request(t="release", lease="a", seq=3, key="k")
        assert not_holder["code"] == "NOT_HOLDER"
        gone = await c.request(t="acquire", lease="ghost", seq=1, key="k")
        assert gone["code"] == "SESSION_EXPIRED"


async def test_a_queued_waiter_is_pushed_its_grant(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, port):
        holder, waiter = await Conn.open(port), await Conn.open(port)
        await holder.request(t="open_lease", lease="h", ttl_ms=10_000)
        await waiter.request(t="open_lease", lease="w", ttl_ms=10_000)
        first = await holder.request(t="acquire", lease="h", seq=1, key="q")
        queued = await waiter.request(t="acquire", lease="w", seq=1, key="q", wait=True)
        assert (queued["result"], queued["position"]) == ("queued", 1)
        await holder.request(t="release", lease="h", seq=2, key="q")
        push = await waiter.recv()
        assert push == {"t": "grant", "lease": "w", "key": "q", "token": push["token"]}
        assert push["token"] > first["token"]
        # Re-sending the queued acquire now reports the grant.
        resent = await waiter.request(t="acquire", lease="w", seq=1, key="q", wait=True)
        assert (resent["result"], resent["token"]) == ("granted", push["token"])


async def test_reads_keepalives_and_close(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, port):
        c = await Conn.open(port)
        await c.request(t="open_lease", lease="a", ttl_ms=5_000)
        await c.request(t="acquire", lease="a", seq=1, key="x/1")
        kept = await c.request(t="keepalive", lease="a")
        assert (kept["t"], kept["ttl_ms"]) == ("ok", 5_000)
        assert (await c.request(t="keepalive", lease="nope"))["code"] == "SESSION_EXPIRED"
        got = await c.request(t="get", key="x/1")
        assert [h["lease"] for h in got["holders"]] == ["a"]
        assert 0 < got["holders"][0]["remaining_ms"] <= 5_000
        stale = await c.request(t="get", key="x/1", stale=True)
        assert stale["holders"][0]["token"] == got["holders"][0]["token"]
        listed = await c.request(t="list", prefix="x/")
        assert [lock["key"] for lock in listed["locks"]] == ["x/1"]
        info = await c.request(t="lease_info", lease="a")
        assert info["keys"] == ["x/1"]
        status = await c.request(t="status")
        assert (status["node"], status["role"], status["locks"]) == ("n1", "leader", 1)
        assert status["id"] == c.next_id - 1
        assert (await c.request(t="close_lease", lease="a", seq=9))["t"] == "ok"
        assert (await c.request(t="close_lease", lease="a", seq=9))["t"] == "ok"
        assert (await c.request(t="get", key="x/1"))["holders"] == []


async def test_an_unrenewed_lease_expires_and_the_waiter_is_granted(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, port):
        c = await Conn.open(port)
        await c.request(t="open_lease", lease="short", ttl_ms=1_000)
        await c.request(t="open_lease", lease="long", ttl_ms=60_000)
        await c.request(t="acquire", lease="short", seq=1, key="k")
        queued = await c.request(t="acquire", lease="long", seq=1, key="k", wait=True)
        assert queued["result"] == "queued"
        push = await c.recv()  # arrives once the leader expires "short", after ~1 s
        assert (push["t"], push["lease"]) == ("grant", "long")
        assert (await c.request(t="lease_info", lease="short"))["code"] == "SESSION_EXPIRED"


async def test_bad_frames_get_errors_and_the_node_keeps_serving(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (_, port):
        c = await Conn.open(port)
        await c.stream.send(struct.pack(">I", 3) + b"\xff\xff\xff")
        assert (await c.recv())["code"] == "BAD_REQUEST"
        await c.send({"t": "acquire", "id": 5, "lease": "a", "seq": "one", "key": "k"})
        reply = await c.recv()
        assert (reply["code"], reply["id"]) == ("BAD_REQUEST", 5)
        await c.send({"t": "warp", "id": 6})
        assert (await c.recv())["id"] == 6
        assert (await c.request(t="status", stale=True))["t"] == "ok"

        big = await Conn.open(port)
        await big.stream.send(struct.pack(">I", CLIENT_FRAME_LIMIT + 1) + b"\0" * 16)
        assert (await big.recv())["code"] == "TOO_LARGE"
        assert await big.closed()

        no_hello = await anyio.connect_tcp("127.0.0.1", port)
        await no_hello.send(encode_frame({"t": "status", "id": 1}))
        decoder = FrameDecoder(CLIENT_FRAME_LIMIT)
        decoder.feed(await no_hello.receive())
        assert next(decoder.frames())["t"] == "error"
        await no_hello.aclose()

        assert (await c.request(t="status", stale=True))["role"] == "leader"


async def test_snapshots_compact_the_log_and_restore_on_restart(tmp_path: Path) -> None:
    storage = MemoryStorage(ConfState(voters=("n1",)))
    async with running_node(tmp_path, storage, snapshot_every=20, snapshot_keep=5) as (_, port):
        c = await Conn.open(port)
        await c.request(t="open_lease", lease="a", ttl_ms=60_000)
        for seq in range(1, 30):
            await c.request(t="acquire", lease="a", seq=2 * seq, key="k")
            await c.request(t="release", lease="a", seq=2 * seq + 1, key="k")
        token = (await c.request(t="acquire", lease="a", seq=999, key="kept"))["token"]
    snap = storage.snapshot()
    assert snap is not None and snap.meta.index >= 40
    assert storage.first_index() > 1
    async with running_node(tmp_path, storage) as (server, port):
        assert server.machine.applied_index >= snap.meta.index
        c = await Conn.open(port)
        got = await c.request(t="get", key="kept")
        assert [(h["lease"], h["token"]) for h in got["holders"]] == [("a", token)]


class _RecordingTransport:
    """Just enough of an asyncio transport for ClientConn.send."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.written.append(data)


async def test_an_entry_that_replaced_our_proposal_answers_not_leader(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (server, _port):
        transport = _RecordingTransport()
        conn = ClientConn(transport, peer="test")  # type: ignore[arg-type]
        request = Acquire(id=77, lease="a", seq=1, key="k")
        ours = locks.encode_command(locks.Acquire("a", 1, "k", False, 1, {}, 0))
        theirs = locks.encode_command(locks.OpenLease("b", 5_000, 0))
        index = server.machine.applied_index + 1000
        server._proposals[index] = _Proposal(conn, request, ours, 0.0)
        server._apply(Ready(committed=(Entry(index, 99, theirs),)))
        decoder = FrameDecoder(CLIENT_FRAME_LIMIT)
        decoder.feed(b"".join(transport.written))
        sent = list(decoder.frames())
        assert [(r["id"], r["code"]) for r in sent] == [(77, "NOT_LEADER")]
        assert index not in server._proposals


def test_frames_are_plain_cbor() -> None:
    # The hand-driven connections above rely on this framing.
    assert encode_frame({"t": "x"}) == struct.pack(">I", 5) + cbor2.dumps({"t": "x"})
