"""Accepting connections: the hello, the handshake, and the limits on what a stranger holds.

One listening port serves clients and peers. An ``AcceptedConnection`` reads the
hello, which names the role; with a secret for that role the connection must
then pass the handshake of dlm/auth.py. Until then nothing it sends reaches the
node machine (not even its claimed id and address: ``peer_verdict``, which asks
the machine, comes after the proof), and a timer closes it if it dawdles. The
decisions are admission.py's ``Acceptance``, which the simulator drives too;
this class only moves bytes and logs. The transport limits live
here too (``Limits``, and ``Budget``: how many descriptors connections may take),
so that every resource a stranger can make a member hold has a cap and a
deadline. What the member does with a connection is the ``Admissions``
protocol, which NodeServer (server.py) implements.
Tested by tests/unit/node/test_accepting.py and test_server.py, and
tests/cluster/test_peer_auth.py.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import Any, Protocol, cast

from dlm.node.admission import Acceptance, Admit, Ask, Refuse, Send, hello_problem
from dlm.node.runtime.config.node_config import NodeConfig
from dlm.node.runtime.peers import split_first_frame
from dlm.node.runtime.quiet import QuietLog
from dlm.node.runtime.security import NodeSecurity
from dlm.wire import (
    PEER_FRAME_LIMIT,
    ErrorCode,
    FrameDecoder,
    Hello,
    HelloRole,
    ProtocolError,
    encode_frame,
    error,
)

HELLO_TIMEOUT = 5.0
"""A connection that has not completed its hello (and its handshake) by then is closed."""
FRAME_STALL_TIMEOUT = 5.0
"""A client connection holding half a frame this long is closed (a slow-loris)."""
IDLE_TIMEOUT = 120.0
"""A client connection silent this long is closed (idle clients ping every 30 s)."""
EVICT_IDLE_AFTER = 5.0
"""When the client cap is reached, a new client takes the place of the one silent the
longest, if that one has been silent at least this long (it reconnects when it needs to)."""
MAX_CONNECTIONS = 8192
"""Client connections per member; peers always get in (they are few)."""
FD_RESERVE = 128
"""Descriptors kept from connections: log segments, snapshots, the metrics listener's
scrapers (64), the event loop's own."""
HANDSHAKE_ROOM = 64
"""Descriptors kept beyond the client cap for connections still saying hello, so that a
full cap never stops the member from accepting (peers, and replies saying it is full)."""
AUTH_FRAME_LIMIT = 1024
"""The ``auth`` frame is a proof of 32 bytes: anything longer is not one."""


@dataclass(slots=True)
class Limits:
    """Transport limits (the tests lower them)."""

    hello_timeout: float = HELLO_TIMEOUT
    frame_stall_timeout: float = FRAME_STALL_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    evict_idle_after: float = EVICT_IDLE_AFTER


class Budget:
    """How many connections this member takes, from its open-files limit.

    Every accepted connection holds a descriptor, and a member out of descriptors
    cannot accept anyone, not even a peer. So the member keeps FD_RESERVE for its
    files, one per outbound peer link, and counts the rest: ``transports`` is how
    many connections may be open at once (beyond it the oldest one still saying
    hello is dropped), ``clients`` how many of them may be admitted clients, which
    leaves room for the inbound peer connections and HANDSHAKE_ROOM for newcomers.
    """

    __slots__ = ("clients", "transports")

    def __init__(self, open_files: int, peers: int, max_clients: int) -> None:
        self.transports = max(8, open_files - FD_RESERVE - peers)
        self.clients = max(1, min(max_clients, self.transports - peers - HANDSHAKE_ROOM))

    @classmethod
    def for_process(cls, peers: int, max_clients: int) -> Budget:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return cls(1 << 30 if soft == resource.RLIM_INFINITY else soft, peers, max_clients)


@dataclass(slots=True, eq=False)
class ClientConnection:
    """An admitted client: its transport, its frame decoder, and when it was last heard."""

    number: int
    transport: asyncio.Transport
    decoder: FrameDecoder
    last_heard: float
    partial_since: float | None = None
    sealer: Any = None
    """dlm.auth.FrameSealer for what we send, once the client authenticated (None: plain)."""


class Admissions(Protocol):
    """What an accepted connection asks of the member that accepted it."""

    limits: Limits
    quiet: QuietLog
    config: NodeConfig
    security: NodeSecurity
    other_incarnations: set[str]
    """Members of another cluster incarnation refused so far (each is said once)."""

    def connection_opened(self, conn: AcceptedConnection, transport: asyncio.Transport) -> None:
        """Counts a new connection (and may shed the oldest one still saying hello)."""

    def connection_admitted(self, conn: AcceptedConnection) -> None:
        """``conn`` finished its hello and handshake."""

    def connection_ended(
        self, conn: AcceptedConnection, transport: asyncio.Transport | None
    ) -> None:
        """``conn`` closed, admitted or not."""

    def client_verdict(self, where: str, identity: str = "") -> dict[str, Any] | None:
        """The error that refuses an authenticated (or unauthenticatable) client, or None;
        ``identity``: who its handshake proved it is ("" when nothing names anyone)."""

    def peer_verdict(self, hello: Hello) -> dict[str, Any] | None:
        """The error that refuses an authenticated (or unauthenticatable) peer, or None.
        Only now may the member learn anything from the hello (invariant 9)."""

    def auth_failed(self, role: str, where: str, node: str, message: str) -> None:
        """A handshake failed (counted and logged, rate-limited)."""

    def identity_known(self, name: str) -> bool | None:
        """Whether the applied identity table has ``name``; None: the table is empty (a TLS
        client certificate may name a client's identity: admission.py)."""

    def client_opened(
        self,
        transport: asyncio.Transport,
        where: str,
        sealer: Any,
        opener: Any,
        identity: str = "admin",
    ) -> ClientConnection:
        """Registers an admitted client, authenticated as ``identity``."""

    def identity_verifier(self, name: str, key_id: bytes) -> tuple[bytes, bytes] | None:
        """(stored_key, server_key) the member's identity table keeps for that key, now."""

    def client_data(self, client: ClientConnection) -> bool:
        """Hands the client's complete frames on; False when the connection must close."""

    def client_closed(self, client: ClientConnection) -> None:
        """The client's connection is gone."""

    def peer_admitted(self, conn: AcceptedConnection, node: str, speaks: int) -> None:
        """``conn`` proved it speaks for member ``node``."""

    def peer_frames(self, src: str, decoder: FrameDecoder) -> None:
        """Steps the Raft messages buffered from ``src``; ProtocolError ends the connection."""

    def peer_closed(self, conn: AcceptedConnection, node: str) -> None:
        """An admitted peer connection is gone."""


class AcceptedConnection(asyncio.Protocol):
    """One accepted connection. Its hello decides whether a client or a peer speaks.

    hello -> (with a secret for that role: welcome + proof, then the ``auth``
    frame) -> admitted as a client or a peer. Until admitted, what it sends goes
    nowhere but this object, and the hello timer runs. Everything runs in the
    transport's callbacks, on the loop thread: frames are handled as they arrive.
    """

    def __init__(self, server: Admissions) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self.where = "?"
        self._hello_buf: bytearray | None = bytearray()
        self._hello_timer: asyncio.TimerHandle | None = None
        self._admission: Acceptance | None = None
        """What the connection has proved so far (None once admitted)."""
        self._auth_buf: bytearray | None = None
        """Bytes of the ``auth`` frame, while the proof is awaited."""
        self._client: ClientConnection | None = None
        self._peer: str | None = None
        self._peer_decoder: FrameDecoder | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though on uvloop not an asyncio.Transport by class.
        stream = self._transport = cast(asyncio.Transport, transport)
        self.where = remote_text(stream.get_extra_info("peername"))
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(self._server.limits.hello_timeout, self.abort)
        self._server.connection_opened(self, stream)

    def connection_lost(self, exc: Exception | None) -> None:
        server = self._server
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        server.connection_ended(self, self._transport)
        if self._client is not None:
            server.client_closed(self._client)
        if self._peer is not None:
            server.peer_closed(self, self._peer)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        server = self._server
        if self._client is not None:
            self._client.decoder.feed(data)
            if not server.client_data(self._client):
                transport.close()  # after the final error is flushed
            return
        if self._peer is not None:
            assert self._peer_decoder is not None
            self._peer_decoder.feed(data)
            self._peer_data()
            return
        if self._auth_buf is not None:
            self._auth_data(data)
            return
        self._hello(data)

    def _peer_data(self) -> None:
        assert self._peer is not None and self._peer_decoder is not None
        try:
            self._server.peer_frames(self._peer, self._peer_decoder)
        except ProtocolError as exc:
            self._server.quiet.warning(
                "peer_bad_frame", peer=self._peer, remote=self.where, error=str(exc)
            )
            self.abort()

    def _hello(self, data: bytes) -> None:
        """Consumes the hello; then the connection knows its role."""
        assert self._transport is not None and self._hello_buf is not None
        self._hello_buf += data
        try:
            first = split_first_frame(self._hello_buf)
        except ProtocolError as exc:
            self._refuse(Refuse(error(None, exc.code, hello_problem(exc)), "hello"), None)
            return
        if first is None:
            return
        self._hello_buf = None
        admission = self._admission = self._new_admission()
        self._step(admission.hello(first[0]), first[1])

    def _new_admission(self) -> Acceptance:
        server, transport = self._server, self._transport
        assert transport is not None
        config, security = server.config, server.security

        def responder_for(role: HelloRole) -> Any:
            peer = role is HelloRole.PEER
            secret = security.peer_secret if peer else security.client_secret
            if secret is None:
                return None
            from dlm.auth import Responder, new_nonce

            # The secret a reload replaced is still accepted until the next (reload.py).
            previous = security.previous_peer_secret if peer else security.previous_client_secret
            return Responder(secret, new_nonce(), node=config.node_id, previous=previous)

        peer_identity = None
        client_certificate = None
        if security.server_tls is not None:
            from dlm.tls import certificate_names, peer_certificate_problem

            def peer_identity(node: str) -> str | None:
                return peer_certificate_problem(transport.get_extra_info("peercert"), node)

            def client_certificate() -> tuple[tuple[str, ...], bool]:
                names = certificate_names(transport.get_extra_info("peercert"))
                return names, server.identity_known("") is not None

        def identity_responder() -> Any:
            from dlm.auth import IdentityResponder, new_nonce

            return IdentityResponder(server.identity_verifier, new_nonce(), node=config.node_id)

        return Acceptance(
            node_id=config.node_id,
            cluster=config.cluster,
            responder_for=responder_for,
            peer_identity=peer_identity,
            incarnation=config.incarnation,
            partition=config.partition,
            partitions=config.partitions,
            identity_responder=identity_responder,
            client_certificate=client_certificate,
            known=lambda name: bool(server.identity_known(name)),
        )

    def _step(self, outcome: Send | Ask | Refuse, rest: bytes) -> None:
        """Carries out what the admission decided; ``rest``: bytes after its frame."""
        transport, admission = self._transport, self._admission
        assert transport is not None and admission is not None
        if isinstance(outcome, Send):
            transport.write(encode_frame(outcome.frame))
            self._auth_buf = bytearray()
            if rest:
                self._auth_data(rest)
            return
        if isinstance(outcome, Refuse):
            self._refuse(outcome, admission.hello_seen)
            return
        # The other side is authenticated, or nothing could authenticate it: only now
        # may the member hear of it.
        hello = outcome.hello
        if hello.role is HelloRole.PEER:
            refusal = self._server.peer_verdict(hello)
        else:
            # Its identity's connection quota counts (quotas.py): known once it proved it.
            refusal = self._server.client_verdict(self.where, admission.identity)
        decision = admission.verdict(refusal)
        if isinstance(decision, Refuse):
            self._refuse(decision, hello)
            return
        self._admit(decision, rest)

    def _auth_data(self, data: bytes) -> None:
        """The initiator's ``auth`` frame: its proof, checked before anything else counts."""
        admission, buf = self._admission, self._auth_buf
        assert admission is not None and buf is not None
        buf += data
        try:
            first = split_first_frame(buf, AUTH_FRAME_LIMIT)
        except ProtocolError as exc:
            refusal = Refuse(error(None, ErrorCode.AUTH_FAILED, str(exc)), "auth")
            self._refuse(refusal, admission.hello_seen)
            return
        if first is None:
            return
        self._auth_buf = None
        self._step(admission.proof(first[0]), first[1])

    def _refuse(self, refusal: Refuse, hello: Hello | None) -> None:
        """Logs why (rate-limited), sends the refusal and closes."""
        assert self._transport is not None
        server, where = self._server, self.where
        node = hello.node if hello is not None else ""
        if refusal.why == "auth":
            role = hello.role.value if hello is not None else "?"
            server.auth_failed(role, where, node, refusal.reason)
        elif refusal.why == "hello":
            server.quiet.warning("bad_hello", remote=where, error=refusal.reason)
        elif refusal.why == "incarnation":
            # Said once per member: it redials for as long as its operator lets it run.
            if node not in server.other_incarnations:
                server.other_incarnations.add(node)
                server.quiet.warning("peer_refused", remote=where, peer=node, reason=refusal.reason)
        elif hello is not None and hello.role is HelloRole.PEER:
            server.quiet.warning("peer_refused", remote=where, peer=node, reason=refusal.reason)
        self._transport.write(encode_frame(refusal.frame, refusal.sealer))
        self._transport.close()

    def _admit(self, admit: Admit, rest: bytes) -> None:
        """The hello (and handshake, if any) is done: from now on the machine listens."""
        transport, server, hello = self._transport, self._server, admit.hello
        assert transport is not None
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        self._admission = None
        server.connection_admitted(self)
        if admit.greeting is not None:
            transport.write(encode_frame(admit.greeting))
        if hello.role is HelloRole.PEER:
            server.peer_admitted(self, hello.node, hello.speaks)
            self._peer = hello.node
            self._peer_decoder = FrameDecoder(PEER_FRAME_LIMIT, admit.opener)
            if rest:
                self._peer_decoder.feed(rest)
                self._peer_data()
            return
        self._client = client = server.client_opened(
            transport, self.where, admit.sealer, admit.opener, admit.identity
        )
        if rest:
            client.decoder.feed(rest)
            if not server.client_data(client):
                transport.close()


def remote_text(addr: object) -> str:
    """A peer address as logs show it."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return "?" if addr is None else str(addr)
