"""Peer links: one outbound TCP stream per peer, carrying batched Raft messages.

Each member dials every other member and only *sends* on that stream; what a
peer says back arrives on the stream the peer dialled to us (server.py feeds
those messages to ``RaftNode.step``). So each pair of members shares two
connections, one per direction, and neither side ever waits for the other to
read before it can write.

A link queues messages while its writer is busy and sends everything queued
as one frame (several frames when the payload is large), so a Ready that
carries one AppendEntries per follower costs one write per follower. A link
that is down, or whose queue is already long, drops messages: Raft is built
to survive loss, and a backlog of stale appends would only delay recovery.
When a connection breaks, ``on_down`` lets the runtime tell the core
(``report_unreachable``), which then probes the peer gently instead of
streaming to it. Reconnects back off exponentially with jitter, so members
restarting together do not dial in lockstep.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc

from dlm.node.log import Logger
from dlm.node.peer_codec import raft_frame
from dlm.node.raft.types import AppendEntries, InstallSnapshot, Message
from dlm.wire import (
    CLIENT_FRAME_LIMIT,
    PEER_FRAME_LIMIT,
    ErrorCode,
    Hello,
    ProtocolError,
    Role,
    decode_body,
    encode_frame,
    format_addr,
)

T = TypeVar("T")

MAX_QUEUED = 4096
"""Messages waiting for one peer beyond which new ones are dropped."""
FRAME_BUDGET = PEER_FRAME_LIMIT // 2
"""Estimated payload per frame; leaves ample room for CBOR overhead under the hard limit."""
CONNECT_TIMEOUT = 1.0
HELLO_TIMEOUT = 2.0
BACKOFF_MIN = 0.05
BACKOFF_MAX = 0.5
_LENGTH = struct.Struct(">I")


class Outbox(Generic[T]):
    """A list that one writer task drains in batches; ``put`` never blocks."""

    __slots__ = ("_event", "_items")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._event: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        self._items.append(item)
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    def clear(self) -> None:
        self._items = []

    async def take(self) -> list[T]:
        """Everything queued so far, waiting until there is at least one item."""
        while not self._items:
            event = anyio.Event()
            self._event = event
            await event.wait()
        items = self._items
        self._items = []
        return items


async def read_first_frame(
    stream: anyio.abc.ByteReceiveStream, timeout: float, limit: int = CLIENT_FRAME_LIMIT
) -> tuple[Any, bytes]:
    """Reads exactly one frame; returns it decoded and whatever bytes followed it.

    Used for the hello and the welcome, before the connection knows its role
    (and hence its frame limit). Raises TimeoutError, ProtocolError or the
    stream's own errors.
    """
    buf = bytearray()
    with anyio.fail_after(timeout):
        while True:
            if len(buf) >= 4:
                (length,) = _LENGTH.unpack_from(buf)
                if length > limit:
                    raise ProtocolError(
                        f"frame of {length} bytes exceeds the limit of {limit}",
                        ErrorCode.TOO_LARGE,
                    )
                if len(buf) >= 4 + length:
                    return decode_body(bytes(buf[4 : 4 + length])), bytes(buf[4 + length :])
            buf += await stream.receive()


def _estimated_bytes(msg: Message) -> int:
    if isinstance(msg, AppendEntries):
        return 64 + sum(len(e.data) + 24 for e in msg.entries)
    if isinstance(msg, InstallSnapshot):
        return 96 + len(msg.data)
    return 64


def encode_batches(messages: list[Message]) -> list[bytes]:
    """Frames for ``messages`` in order, each well under the peer frame limit."""
    frames: list[bytes] = []
    start = 0
    size = 0
    for i, msg in enumerate(messages):
        cost = _estimated_bytes(msg)
        if i > start and size + cost > FRAME_BUDGET:
            frames.append(raft_frame(messages[start:i]))
            start, size = i, 0
        size += cost
    if start < len(messages):
        frames.append(raft_frame(messages[start:]))
    return frames


class PeerLink:
    """The outbound half of our connection with one peer."""

    def __init__(
        self,
        *,
        local_id: str,
        peer_id: str,
        address: tuple[str, int],
        cluster: str,
        log: Logger,
        on_down: Callable[[str], None],
        rng: random.Random | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.address = address
        self._hello = encode_frame(Hello(role=Role.PEER, cluster=cluster, node=local_id).to_wire())
        self._log = log
        self._on_down = on_down
        self._rng = rng or random.Random()
        self._outbox: Outbox[Message] = Outbox()
        self.connected = False
        self.dropped = 0
        self.sent_frames = 0

    def send(self, msg: Message) -> None:
        if not self.connected or len(self._outbox) >= MAX_QUEUED:
            self.dropped += 1
            return
        self._outbox.put(msg)

    async def run(self) -> None:
        """Keeps the link up until cancelled."""
        backoff = BACKOFF_MIN
        failures = 0
        while True:
            stream = await self._connect()
            if stream is None:
                failures += 1
                # One line when a peer first goes missing, then quiet until it returns.
                if failures == 1:
                    self._log.info("peer_unreachable", peer=self.peer_id, addr=self._addr)
                await anyio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            backoff = BACKOFF_MIN
            if failures or not self.sent_frames:
                self._log.info("peer_connected", peer=self.peer_id, addr=self._addr)
            failures = 0
            reason = "closed by the peer"
            try:
                await self._pump(stream)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                reason = repr(exc)
            finally:
                self.connected = False
                self._outbox.clear()
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                self._on_down(self.peer_id)
            self._log.info("peer_disconnected", peer=self.peer_id, reason=reason)
            failures = 1
            await anyio.sleep(BACKOFF_MIN * (0.5 + self._rng.random()))

    @property
    def _addr(self) -> str:
        return format_addr(*self.address)

    async def _connect(self) -> anyio.abc.SocketStream | None:
        host, port = self.address
        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                stream = await anyio.connect_tcp(host, port)
        except (OSError, TimeoutError):
            return None
        try:
            await stream.send(self._hello)
            reply, _ = await read_first_frame(stream, HELLO_TIMEOUT)
        except (OSError, TimeoutError, ProtocolError, anyio.EndOfStream, anyio.BrokenResourceError):
            await stream.aclose()
            return None
        if not isinstance(reply, dict) or reply.get("t") != "welcome":
            message = reply.get("message") if isinstance(reply, dict) else None
            self._log.warning("peer_refused", peer=self.peer_id, message=str(message)[:200])
            await stream.aclose()
            return None
        self.connected = True
        return stream

    async def _pump(self, stream: anyio.abc.SocketStream) -> None:
        async with anyio.create_task_group() as tg:
            # The peer never writes on this stream; reading only tells us when it goes away.
            tg.start_soon(self._watch, stream, tg.cancel_scope)
            try:
                while True:
                    messages = await self._outbox.take()
                    if len(messages) == 1:
                        await stream.send(raft_frame(messages))
                        self.sent_frames += 1
                        continue
                    for frame in encode_batches(messages):
                        await stream.send(frame)
                        self.sent_frames += 1
            finally:
                tg.cancel_scope.cancel()

    async def _watch(self, stream: anyio.abc.SocketStream, scope: anyio.CancelScope) -> None:
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()
