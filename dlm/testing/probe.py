"""One partition's own view of itself, asked of one member, for the test cluster's waits.

A member started with ``--partitions P`` serves partition i on the same address as
partition 0; a connection to partition i sends its preamble first
(dlm.partitioning). The client library routes by partition on its own; the test
cluster only needs to ask one member about one partition, which this does by hand:
the preamble, TLS if the members use it, the hello with the client secret's
handshake, and one stale ``status``. Every wait is bounded by ``timeout``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from typing import Any

from dlm.partitioning import preamble
from dlm.wire import CLIENT_FRAME_LIMIT, FrameDecoder, Hello, HelloRole, ProtocolError, encode_frame


def partition_status(
    address: str,
    partition: int,
    *,
    secret: bytes | None,
    tls_ca: str | None = None,
    timeout: float = 0.5,
) -> dict[str, Any] | None:
    """The member's stale ``status`` of ``partition`` (the reply frame), or None if it
    does not answer in time."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    try:
        raw = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except (OSError, ValueError):
        return None
    sock: socket.socket = raw
    try:
        sock.sendall(preamble(partition))
        if tls_ca is not None:
            context = ssl.create_default_context(cafile=tls_ca)
            context.check_hostname = False
            sock = context.wrap_socket(raw, server_hostname=host.strip("[]"))
        return _ask(sock, secret, deadline)
    except (OSError, ProtocolError, ValueError, TimeoutError, ssl.SSLError):
        return None
    finally:
        with contextlib.suppress(OSError):
            sock.close()
        with contextlib.suppress(OSError):
            raw.close()


def _ask(sock: socket.socket, secret: bytes | None, deadline: float) -> dict[str, Any] | None:
    hello = Hello(HelloRole.CLIENT).to_wire()
    initiator = None
    if secret is not None:
        from dlm.auth import Initiator, new_nonce

        initiator = Initiator(secret, new_nonce(), role="client", cluster="", node="")
        hello.update(initiator.hello_fields())
    sock.sendall(encode_frame(hello))
    decoder = FrameDecoder(CLIENT_FRAME_LIMIT)
    welcome = _next(sock, decoder, deadline)
    if not isinstance(welcome, dict) or welcome.get("t") != "welcome":
        return None
    sealer = None
    if initiator is not None:
        sock.sendall(encode_frame(initiator.check_welcome(welcome)))
        sealer, opener = initiator.keys()
        decoder = FrameDecoder(CLIENT_FRAME_LIMIT, opener)
    sock.sendall(encode_frame({"t": "status", "id": 1, "stale": True}, sealer))
    reply = _next(sock, decoder, deadline)
    return reply if isinstance(reply, dict) and reply.get("t") == "ok" else None


def _next(sock: socket.socket, decoder: FrameDecoder, deadline: float) -> Any:
    while True:
        for frame in decoder.frames():
            return frame
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        data = sock.recv(65536)
        if not data:
            raise OSError("closed")
        decoder.feed(data)
