"""Peer links: one outbound TCP connection per peer, carrying batched Raft messages.

Each member dials every other member and only *sends* on that connection;
what a peer says back arrives on the connection the peer dialled to us
(server.py feeds those messages to ``RaftNode.step``). So each pair of members
shares two connections, one per direction, and neither side ever waits for
the other to read before it can write.

The runtime queues a Ready's messages with ``send`` and then calls ``flush``
once per link: everything queued goes out as one frame (several when the
payload is large) in one write, straight from the driver. Commit news (an
AppendEntries with no entries) waits up to ``COMMIT_NEWS_DELAY`` for the next
append, which makes it redundant (see ``PeerLink.send``). There is no writer
task to wake, so a message leaves in the same event-loop step that produced
it. The connection is a plain asyncio transport rather than an anyio stream:
anyio's stream re-arms the socket in the selector and yields to the loop on
every receive and send, which on this path cost more than the rest of the
hop. A link that is down, or whose socket buffer is already long, drops
messages: Raft is built to survive loss, and a backlog of stale appends
would only delay recovery. When a connection breaks, ``on_down`` lets the
runtime tell the core (``report_unreachable``), which then probes the peer
gently instead of streaming to it; when the redial that follows is refused
(nothing listens: the process died), ``on_down`` says the peer is gone, and a
follower of it campaigns without waiting out a whole election timeout.
Reconnects back off exponentially with jitter, so members restarting
together do not dial in lockstep.

Because nothing comes back on our own connection, a connection that stopped
delivering (it lost packets for a while and sits in TCP's retransmission
back-off, long after the network healed) would go unnoticed: the peer's
replies keep arriving on the other one. So while a link is up it reads the
kernel's acknowledgement counters (``TCP_INFO``) every ``stall_after / 4``
and asks linkwatch.py's ``LinkWatch`` whether the connection must be
replaced: something written, nothing acknowledged, for ``stall_after`` (an
election timeout), with the kernel's retransmission timer (``tcpi_rto``) backed
off past what a new connection would cost. ``TCP_USER_TIMEOUT`` bounds a stalled
connection in the kernel too, where the option exists, well behind LinkWatch.

With a peer secret, the link is the initiator of dlm/auth.py's handshake: its
hello carries a fresh nonce, it checks the peer's proof in the welcome before
it sends anything else, answers with its own proof, and seals every frame
after. With TLS, it dials with this member's certificate and requires the
peer's to be signed by the cluster's CA and to name the peer's member id.
The decisions of that exchange are admission.py's ``Dialing`` (the simulator
drives the same object): a refusal reaches the member (``on_refused``, which
may stop it as removed) only when the peer proved who wrote it: sealed after
the handshake, or over TLS. An ``error`` frame before the welcome's proof is
just a failed dial, whatever it says (anyone on a dead member's port can send
one).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import anyio

from dlm.event_loop import open_socket
from dlm.node.admission import Dialing, Failed, Refused
from dlm.node.linkwatch import LinkWatch
from dlm.node.machine import REMOVED
from dlm.node.peer_codec import raft_frame
from dlm.node.raft.types import AppendEntries, InstallSnapshot, Message
from dlm.node.runtime.log import Logger
from dlm.partitioning import preamble
from dlm.wire import (
    CLIENT_FRAME_LIMIT,
    PEER_FRAME_LIMIT,
    ErrorCode,
    FrameDecoder,
    Hello,
    HelloRole,
    ProtocolError,
    decode_body,
    encode_frame,
    format_addr,
)

MAX_BUFFERED_BYTES = 2 * PEER_FRAME_LIMIT
"""Bytes waiting in one link's socket buffer beyond which new messages are dropped."""
FRAME_BUDGET = PEER_FRAME_LIMIT // 2
"""Estimated payload per frame; leaves ample room for CBOR overhead under the hard limit."""
CONNECT_TIMEOUT = 1.0
CONNECT_TIMEOUT_MIN = 0.25
"""A link with a ``stall_after`` gives a dial up after that long (within these two): a
dial whose SYN was lost would wait a second for the kernel's retransmission, and after
a network heals the link must be back within an election timeout or two."""
HELLO_TIMEOUT = 2.0
BACKOFF_MIN = 0.05
BACKOFF_MAX = 0.5
AFTER_WELCOME_LIMIT = 4096
"""Bytes a peer may send after its welcome: room for a refusal, nothing else is expected."""
COMMIT_NEWS_DELAY = 0.002
"""How long an AppendEntries without entries (commit news) may wait for company."""
_LENGTH = struct.Struct(">I")
USER_TIMEOUT_FACTOR = 8
"""TCP_USER_TIMEOUT is this many times ``stall_after`` (at least ``USER_TIMEOUT_MIN``):
the kernel's bound on a stalled connection, well behind LinkWatch's. Not sooner: on a
lossy link a segment may wait several retransmissions (0.2 + 0.4 + 0.8 s) on a
connection that is still the best one to wait on, and the kernel would abort it."""
USER_TIMEOUT_MIN = 4.0
_TCP_INFO_BYTES = 128
_TCPI_RTO = struct.Struct("=I")  # the retransmission timeout now, µs, at offset 8
_TCPI_UNACKED = struct.Struct("=I")  # segments sent and not acknowledged, at offset 24
_TCPI_BYTES_ACKED = struct.Struct("=Q")  # bytes the peer acknowledged in all, at offset 120


class TcpProgress(NamedTuple):
    """What the kernel says about our data on a connection."""

    outstanding: bool
    """Something written is not acknowledged yet."""
    acknowledged: int
    """Bytes the peer acknowledged in all."""
    retransmit_after: float
    """The retransmission timeout now, in seconds (doubled at each unanswered one)."""


AckProbe = Callable[[asyncio.Transport], "TcpProgress | None"]
"""What a connection's sender knows of its progress; None: cannot tell."""


def tcp_acknowledgements(transport: asyncio.Transport) -> TcpProgress | None:
    """What the kernel says about our data on ``transport``; None where TCP_INFO is not
    available (then only TCP_USER_TIMEOUT, or nothing, bounds a stalled connection), and
    on a connection already closing or closed, which has nothing to tell."""
    sock = open_socket(transport)
    option = getattr(socket, "TCP_INFO", None)
    if sock is None or option is None or not sys.platform.startswith("linux"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_BYTES)
    except (OSError, ValueError):  # ValueError: uvloop's word for a descriptor gone
        return None
    if len(info) < _TCP_INFO_BYTES:
        return None  # a kernel older than 4.1 has no tcpi_bytes_acked
    (rto_us,) = _TCPI_RTO.unpack_from(info, 8)
    (unacked,) = _TCPI_UNACKED.unpack_from(info, 24)
    (acked,) = _TCPI_BYTES_ACKED.unpack_from(info, 120)
    unsent = transport.get_write_buffer_size()
    return TcpProgress(bool(unacked or unsent), acked, rto_us / 1_000_000)


def bound_stalls(transport: asyncio.Transport, stall_after: float) -> None:
    """Has the kernel abort the connection when data stays unacknowledged for too long
    (nothing to do on a connection already closing)."""
    sock = open_socket(transport)
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if sock is None or option is None:
        return
    timeout_ms = int(max(USER_TIMEOUT_MIN, USER_TIMEOUT_FACTOR * stall_after) * 1000)
    with contextlib.suppress(OSError, ValueError):
        sock.setsockopt(socket.IPPROTO_TCP, option, timeout_ms)


def split_first_frame(buf: bytearray, limit: int = CLIENT_FRAME_LIMIT) -> tuple[Any, bytes] | None:
    """The first frame of ``buf`` decoded, and the bytes after it; None until it is complete.

    Used for the hello and the welcome, before the connection knows its role
    (and hence its frame limit). Raises ProtocolError.
    """
    if len(buf) < 4:
        return None
    (length,) = _LENGTH.unpack_from(buf)
    if length > limit:
        raise ProtocolError(
            f"frame of {length} bytes exceeds the limit of {limit}", ErrorCode.TOO_LARGE
        )
    if len(buf) < 4 + length:
        return None
    return decode_body(bytes(buf[4 : 4 + length])), bytes(buf[4 + length :])


def _estimated_bytes(msg: Message) -> int:
    if isinstance(msg, AppendEntries):
        return 64 + sum(len(e.data) + 24 for e in msg.entries)
    if isinstance(msg, InstallSnapshot):
        return 96 + len(msg.data)
    return 64


def encode_batches(messages: list[Message], sealer: Any = None) -> list[bytes]:
    """Frames for ``messages`` in order, each well under the peer frame limit (sealed, in
    that order, by ``sealer`` when given)."""
    frames: list[bytes] = []
    start = 0
    size = 0
    for i, msg in enumerate(messages):
        cost = _estimated_bytes(msg)
        if i > start and size + cost > FRAME_BUDGET:
            frames.append(raft_frame(messages[start:i], sealer))
            start, size = i, 0
        size += cost
    if start < len(messages):
        frames.append(raft_frame(messages[start:], sealer))
    return frames


def dial_refused(exc: OSError) -> bool:
    """Every address of the peer refused the connection: nothing listens there."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    # For a name with several addresses asyncio raises one OSError, without an errno,
    # whose text joins each address's error.
    text = str(exc)
    if exc.errno is not None or not text.startswith("Multiple exceptions: "):
        return False
    errors = text.count("[Errno ")
    return errors > 0 and errors == text.count(f"[Errno {errno.ECONNREFUSED}]")


def _is_tls_error(exc: OSError) -> bool:
    # ssl is loaded whenever a TLS link exists; looked up, not imported, for plain links.
    import ssl

    return isinstance(exc, ssl.SSLError | ssl.CertificateError)


def _supersedes(msg: Message, news: AppendEntries) -> bool:
    """Does ``msg`` tell the follower everything the commit news ``news`` would?"""
    return (
        type(msg) is AppendEntries
        and bool(msg.entries)
        and msg.term == news.term
        and msg.commit >= news.commit
    )


class _LinkProtocol(asyncio.Protocol):
    """Our end of an outbound peer connection: waits for the welcome, then for the end.

    After the welcome the peer writes only to refuse us (sealed, with a peer secret):
    ``listen(opener, on_frame)`` hands each such frame on; anything that fails to
    open, or more than a refusal's worth of bytes, ends the connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.welcome: asyncio.Future[Any] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self._buf = bytearray()
        self._later: FrameDecoder | None = None
        self._on_later: Callable[[Any], None] | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though on uvloop not an asyncio.Transport by class.
        self._transport = cast(asyncio.Transport, transport)

    def listen(self, opener: Any, on_frame: Callable[[Any], None]) -> None:
        """From now on, frames after the welcome (opened by ``opener``) go to ``on_frame``."""
        self._later = FrameDecoder(AFTER_WELCOME_LIMIT, opener)
        self._on_later = on_frame
        buffered, self._buf = bytes(self._buf), bytearray()
        if buffered:
            self._after_welcome(buffered)

    def data_received(self, data: bytes) -> None:
        if self.welcome.done():
            self._after_welcome(data)
            return
        self._buf += data
        try:
            first = split_first_frame(self._buf)
        except ProtocolError as exc:
            self.welcome.set_exception(exc)
            return
        if first is not None:
            self.welcome.set_result(first[0])
            self._buf = bytearray(first[1])

    def _after_welcome(self, data: bytes) -> None:
        decoder, transport = self._later, self._transport
        if decoder is None:
            if len(self._buf) + len(data) > AFTER_WELCOME_LIMIT:
                self._buf = bytearray()
                if transport is not None:
                    transport.abort()
                return
            self._buf += data
            return
        decoder.feed(data)
        try:
            for frame in decoder.frames():
                if self._on_later is not None:
                    self._on_later(frame)
        except ProtocolError:
            # Not sealed by the peer we proved (forged, replayed, damaged): drop the link.
            if transport is not None:
                transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionError("closed before the welcome"))
        if not self.lost.done():
            self.lost.set_result(None)


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
        on_down: Callable[[str, bool], None],
        incarnation: int = 0,
        on_welcome: Callable[[str, int], None] | None = None,
        on_refused: Callable[[str, str], None] | None = None,
        rng: random.Random | None = None,
        secret: bytes | None = None,
        tls: Any = None,
        advertise: str = "",
        previous_secret: bytes | None = None,
        stall_after: float | None = None,
        ack_probe: AckProbe = tcp_acknowledgements,
        partition: int = 0,
        partitions: int = 1,
    ) -> None:
        """``secret``: the peer secret (None: no handshake); ``tls``: the ssl.SSLContext
        to dial with (None: plain TCP); ``advertise``: our own address, told in the hello;
        ``stall_after``: seconds without an acknowledgement after which a connection
        with unacknowledged data is replaced (None: never); ``ack_probe``: reads a
        connection's acknowledgements (``tcp_acknowledgements``)."""
        self.peer_id = peer_id
        self.address = address
        self._preamble = preamble(partition)
        """What the connection sends before anything else: which of the peer's partition
        processes it is for (nothing for partition 0)."""
        self._local_id = local_id
        self._cluster = cluster
        self._incarnation = incarnation
        self._hello = Hello(
            role=HelloRole.PEER,
            cluster=cluster,
            node=local_id,
            addr=advertise,
            incarnation=incarnation,
            partitions=partitions,
        ).to_wire()
        self._secret = secret
        self._previous_secret = previous_secret
        """The peer secret a reload replaced: a peer that has not reloaded yet proves the
        old one, which this link accepts until the next reload (reload.py)."""
        self._tls = tls
        self._sealer: Any = None
        self._problem: str | None = None
        """Why the last attempt failed, said once until it changes or a connection works."""
        self._unproved_removal_said = False
        """An unproved "you were removed" was logged (once until a connection works)."""
        self._refused_late = False
        """The last connection was refused after its handshake (sealed, by the peer)."""
        self._log = log
        self._on_down = on_down
        self._refused = False
        """The last dial was refused: nothing listens at the peer's address."""
        self._on_welcome = on_welcome
        self._on_refused = on_refused
        self._rng = rng or random.Random()
        self._transport: asyncio.Transport | None = None
        self._queued: list[Message] = []
        self._held: AppendEntries | None = None
        self._held_timer: asyncio.TimerHandle | None = None
        self.connected = False
        self.dropped = 0
        self.sent_frames = 0
        self._watch = LinkWatch(stall_after) if stall_after is not None else None
        self._connect_timeout = CONNECT_TIMEOUT
        if stall_after is not None:
            self._connect_timeout = min(CONNECT_TIMEOUT, max(CONNECT_TIMEOUT_MIN, stall_after))
        self._ack_probe = ack_probe
        self.replaced = 0
        """Connections replaced because they stopped delivering."""

    def use_credentials(self, secret: bytes | None, previous: bytes | None, tls: Any) -> None:
        """A reload's peer secret (and the one it replaced) and TLS context: for the next
        connection (the one up now stays: it proved itself already)."""
        self._secret = secret
        self._previous_secret = previous
        self._tls = tls

    def send(self, msg: Message) -> None:
        """Queues ``msg`` for the next ``flush``."""
        if not self.connected:
            self.dropped += 1
            return
        if type(msg) is AppendEntries and not msg.entries:
            # Commit news. Under load the next append follows within a
            # millisecond and carries a commit index at least as high, so this
            # one waits briefly: if an append comes, it is dropped (newer news
            # is on its way) or rides in the same frame; if not, a timer sends
            # it. That spares the follower a step, an answer and a Ready per
            # commit. A newer piece of news replaces an older one.
            self._held = msg
            return
        self._queued.append(msg)

    def flush(self) -> None:
        """Writes everything queued, batched into as few frames as fit."""
        messages = self._queued
        held = self._held
        if held is not None:
            if not messages:
                if self._held_timer is None:
                    loop = asyncio.get_running_loop()
                    self._held_timer = loop.call_later(COMMIT_NEWS_DELAY, self._send_held)
                return
            self._held = None
            if self._held_timer is not None:
                self._held_timer.cancel()
                self._held_timer = None
            if not any(_supersedes(m, held) for m in messages):
                messages.insert(0, held)
        if not messages:
            return
        self._queued = []
        transport = self._transport
        if (
            transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size() > MAX_BUFFERED_BYTES
        ):
            self.dropped += len(messages)
            return
        sealer = self._sealer
        if len(messages) == 1:
            frames = [raft_frame(messages, sealer)]
        else:
            frames = encode_batches(messages, sealer)
        transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
        self.sent_frames += len(frames)

    async def run(self) -> None:
        """Keeps the link up until cancelled."""
        backoff = BACKOFF_MIN
        failures = 0
        lost = False
        while True:
            connected = await self._connect()
            if connected is None:
                failures += 1
                if lost and self._refused:
                    # The connection broke and nothing listens there any more: the
                    # process is gone (killed, crashed), not just the connection. Said
                    # once per outage, so that a follower's early election is not
                    # pushed back by every refused redial.
                    lost = False
                    self._on_down(self.peer_id, True)
                # One line when a peer first goes missing, then quiet until it returns.
                if failures == 1:
                    self._log.info("peer_unreachable", peer=self.peer_id, addr=self._addr)
                await anyio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            transport, protocol = connected
            refusing = self._refused_late
            self._refused_late = False
            if not refusing:
                backoff = BACKOFF_MIN
                if failures or not self.sent_frames:
                    self._log.info("peer_connected", peer=self.peer_id, addr=self._addr)
                self._problem = None
                self._unproved_removal_said = False
            failures = 0
            lost = False
            self._transport = transport
            self.connected = True
            stalled = False
            try:
                stalled = await self._until_lost(transport, protocol)
            finally:
                self.connected = False
                self._transport = None
                self._sealer = None
                self._queued = []
                self._held = None
                if self._held_timer is not None:
                    self._held_timer.cancel()
                    self._held_timer = None
                transport.abort()
                self._on_down(self.peer_id, False)
            if self._refused_late:
                # The peer refused us after the handshake (sealed): a failed dial, backed
                # off and said once like any other, not a link that came and went.
                failures = 1
                await anyio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            reason = "stopped delivering" if stalled else "connection closed"
            self._log.info("peer_disconnected", peer=self.peer_id, reason=reason)
            failures = 1
            lost = True
            await anyio.sleep(BACKOFF_MIN * (0.5 + self._rng.random()))

    async def _until_lost(self, transport: asyncio.Transport, protocol: _LinkProtocol) -> bool:
        """Waits for the connection to end; True if it was ended here because it stalled."""
        watch = self._watch
        if watch is not None:
            bound_stalls(transport, watch.stall_after)
        if watch is None or self._ack_probe(transport) is None:
            await protocol.lost
            return False
        watch.connected()
        every = watch.stall_after / 4
        while not protocol.lost.done():
            # asyncio.wait, not a timeout around the future: a cancelled wait must not
            # cancel the future itself.
            await asyncio.wait((protocol.lost,), timeout=every)
            seen = self._ack_probe(transport)
            if seen is None or protocol.lost.done():
                continue
            now = time.monotonic()
            if watch.observe(
                now,
                outstanding=seen.outstanding,
                acknowledged=seen.acknowledged,
                retransmit_after=seen.retransmit_after,
            ):
                since = watch.waiting_since or now
                self.replaced += 1
                self._log.warning(
                    "peer_link_stalled",
                    peer=self.peer_id,
                    addr=self._addr,
                    unacknowledged_ms=int((now - since) * 1000),
                    retransmit_ms=int(seen.retransmit_after * 1000),
                )
                transport.abort()
                await protocol.lost
                return True
        return False

    def _send_held(self) -> None:
        self._held_timer = None
        held, self._held = self._held, None
        if held is not None and self.connected:
            self._queued.insert(0, held)
            self.flush()

    @property
    def _addr(self) -> str:
        return format_addr(*self.address)

    def _failed(self, event: str, problem: str) -> None:
        """Logs why a connection attempt failed, once until the reason changes."""
        if problem != self._problem:
            self._problem = problem
            self._log.warning(event, peer=self.peer_id, addr=self._addr, error=problem[:300])

    async def _connect(self) -> tuple[asyncio.Transport, _LinkProtocol] | None:
        host, port = self.address
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self._tls is not None:
            # The peer's certificate must name its member id (dlm/tls.py).
            tls = {
                "ssl": self._tls,
                "server_hostname": self.peer_id,
                "ssl_handshake_timeout": HELLO_TIMEOUT,
            }
        self._refused = False
        try:
            with anyio.fail_after(self._connect_timeout + (HELLO_TIMEOUT if tls else 0.0)):
                if self._preamble:
                    transport, protocol = await self._dial_partition(loop, tls)
                else:
                    transport, protocol = await loop.create_connection(
                        lambda: _LinkProtocol(loop), host, port, **tls
                    )
        except TimeoutError:
            return None
        except OSError as exc:
            self._refused = dial_refused(exc)
            if tls and _is_tls_error(exc):
                self._failed("peer_tls_failed", str(exc))
            return None
        initiator = None
        if self._secret is not None:
            from dlm.auth import Initiator, new_nonce

            initiator = Initiator(
                self._secret,
                new_nonce(),
                role="peer",
                cluster=self._cluster,
                node=self._local_id,
                previous=self._previous_secret,
            )
        dialing = Dialing(
            peer_id=self.peer_id,
            hello=self._hello,
            initiator=initiator,
            tls=bool(tls),
            incarnation=self._incarnation,
        )
        try:
            transport.write(encode_frame(dialing.hello))
            with anyio.fail_after(HELLO_TIMEOUT):
                reply = await protocol.welcome
        except (OSError, TimeoutError, ProtocolError):
            transport.abort()
            return None
        except BaseException:
            transport.abort()
            raise
        outcome = dialing.reply(reply)
        if isinstance(outcome, Refused):
            self._refused_by_peer(outcome)
            transport.abort()
            return None
        if isinstance(outcome, Failed):
            self._failed(outcome.event, outcome.problem)
            transport.abort()
            return None
        if outcome.auth_frame is not None:
            transport.write(encode_frame(outcome.auth_frame))
        self._sealer = outcome.sealer

        def later(frame: Any) -> None:
            refusal = dialing.later(frame)
            if refusal is not None:
                self._refused_late = True
                self._refused_by_peer(refusal)
                transport.abort()

        protocol.listen(outcome.opener, later)
        if self._on_welcome is not None and outcome.version is not None:
            self._on_welcome(self.peer_id, outcome.version)
        return transport, protocol

    async def _dial_partition(
        self, loop: asyncio.AbstractEventLoop, tls: dict[str, Any]
    ) -> tuple[asyncio.Transport, _LinkProtocol]:
        """A connection to one of the peer's partition processes: the TCP connection, the
        preamble its supervisor reads to pick the process, then TLS and the hello."""
        host, port = self.address
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(errno.EHOSTUNREACH, f"no address for {host}")
        family, kind, proto, _name, where = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, where)
            await loop.sock_sendall(sock, self._preamble)
            return await loop.create_connection(lambda: _LinkProtocol(loop), sock=sock, **tls)
        except BaseException:
            sock.close()
            raise

    def _refused_by_peer(self, refusal: Refused) -> None:
        """Only a refusal the peer proved it wrote reaches the member (admission.py)."""
        self._failed("peer_refused", refusal.message)
        if refusal.authenticated:
            if self._on_refused is not None:
                self._on_refused(self.peer_id, refusal.message)
        elif REMOVED in refusal.message and not self._unproved_removal_said:
            self._unproved_removal_said = True
            self._log.warning(
                "peer_refusal_unproved",
                peer=self.peer_id,
                addr=self._addr,
                note="the peer says this member was removed, but did not prove who it is "
                "(no peer secret or TLS, or it refused before its proof): this member keeps "
                "running; if it was removed, stop it",
            )
