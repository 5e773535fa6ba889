"""A NodeServer in the test's own event loop, and a client connection driven frame by frame.

``running_member`` starts a member on 127.0.0.1 port 0 with MemoryStorage (a
one-member cluster unless told otherwise) and stops it on exit; ``Wire`` is a
raw connection that sends exactly the bytes a test chooses and reads frames
with a bounded wait. Every wait here is bounded with ``anyio.fail_after``.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from dlm.node.machine import Timing
from dlm.node.raft.memory import MemoryStorage
from dlm.node.runtime.accepting import Limits
from dlm.node.runtime.config.node_config import NodeConfig
from dlm.node.runtime.log import Logger
from dlm.node.runtime.security import NodeSecurity
from dlm.node.runtime.server import NodeServer
from dlm.records import ConfState, Storage
from dlm.wire import PEER_FRAME_LIMIT, FrameDecoder, encode_frame

FAST = Timing(tick_s=0.01, election_ticks=3, heartbeat_ticks=1, expire_retry_s=0.2)
WAIT = 5.0
"""The longest any single step of these tests may take."""


@asynccontextmanager
async def running_member(
    *,
    storage: Storage | None = None,
    limits: Limits | None = None,
    peers: dict[str, tuple[str, int]] | None = None,
    elect: bool = True,
    security: NodeSecurity | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[NodeServer, int]]:
    """Yields (server, port) once the member leads and its log runs protocol version 2
    (unless ``elect`` is False); stops it after.

    ``peers`` adds members besides n1 (their addresses need not answer).
    """
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    members = {"n1": ("127.0.0.1", port), **(peers or {})}
    config = NodeConfig(
        node_id="n1",
        listen=("127.0.0.1", port),
        peers=members,
        data_dir=Path("unused-by-the-server"),
        cluster="unit",
        timing=FAST,
        **overrides,
    )
    storage = storage or MemoryStorage(ConfState(voters=tuple(sorted(members))))
    server = NodeServer(
        config, storage, log=Logger("n1", stream=io.StringIO()), limits=limits, security=security
    )
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(server.serve, listener)
        if elect:
            with anyio.fail_after(WAIT):
                await server.leader_seen.wait()
                # A lone member moves the log to version 2 at its first tick as leader.
                while server.machine.locks.version < 2:
                    await anyio.sleep(0.005)
        try:
            yield server, port
        finally:
            server.stopped.set()


def log_text(server: NodeServer) -> str:
    stream = server.log.stream
    assert isinstance(stream, io.StringIO)
    return stream.getvalue()


class Wire:
    """One connection to a member, spoken to frame by frame."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(PEER_FRAME_LIMIT)
        self.frames: list[Any] = []
        self._ids = 1000  # frames a test sends by hand use ids below this

    @classmethod
    async def connect(cls, port: int) -> Wire:
        with anyio.fail_after(WAIT):
            return cls(await anyio.connect_tcp("127.0.0.1", port))

    @classmethod
    async def client(cls, port: int, **hello: Any) -> Wire:
        """A client connection after a hello (version 1, max_version 2 unless given)."""
        wire = await cls.connect(port)
        await wire.send({"t": "hello", "role": "client", "version": 1, "max_version": 2, **hello})
        welcome = await wire.recv()
        assert welcome["t"] == "welcome", welcome
        return wire

    async def send(self, obj: Any) -> None:
        await self.send_bytes(encode_frame(obj))

    async def send_bytes(self, data: bytes) -> None:
        with anyio.fail_after(WAIT):
            await self.stream.send(data)

    async def recv(self) -> Any:
        with anyio.fail_after(WAIT):
            while not self.frames:
                self.frames.extend(self.decoder.frames())
                if self.frames:
                    break
                self.decoder.feed(await self.stream.receive())
        return self.frames.pop(0)

    async def request(self, t: str, **fields: Any) -> dict[str, Any]:
        """Sends a request and returns its reply; pushes that arrive meanwhile stay queued."""
        self._ids += 1
        rid = self._ids
        await self.send({"t": t, "id": rid, **fields})
        held: list[Any] = []
        try:
            while True:
                frame = await self.recv()
                if isinstance(frame, dict) and frame.get("id") == rid:
                    return frame
                held.append(frame)
        finally:
            self.frames[:0] = held

    async def closed(self) -> bytes:
        """Waits for the member to end the connection; returns the bytes read until then."""
        data = bytearray()
        with anyio.fail_after(WAIT):
            while True:
                try:
                    data += await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return bytes(data)

    async def aclose(self) -> None:
        await self.stream.aclose()
