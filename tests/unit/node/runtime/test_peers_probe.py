"""peers.py's kernel probes (TCP_INFO for LinkWatch, TCP_USER_TIMEOUT) on a connection that is
already closed, on both event loops: nothing to probe, never an exception.

A link's watch probes its transport after each wait, also the wait that ended because the
connection was lost. On uvloop the socket of a closed transport reports descriptor -1 and
answers getsockopt with ValueError (asyncio's answers with OSError), which used to stop the
member."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import pytest

from dlm import event_loop
from dlm.node.runtime.peers import bound_stalls, tcp_acknowledgements

LOOPS = [
    event_loop.ASYNCIO,
    pytest.param(
        event_loop.UVLOOP,
        marks=pytest.mark.skipif(not event_loop.uvloop_installed(), reason="no uvloop"),
    ),
]


class _Ends(asyncio.Protocol):
    def __init__(self, lost: asyncio.Future[None]) -> None:
        self.lost = lost

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


async def _probe_before_and_after_close() -> tuple[Any, Any]:
    """What the probe says on an open loopback connection, then on the same one closed
    (after its connection_lost, as the link's watch sees it); TCP_USER_TIMEOUT is set
    on the closed one too."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        lost: asyncio.Future[None] = loop.create_future()
        transport, _ = await loop.create_connection(lambda: _Ends(lost), "127.0.0.1", port)
        stream: Any = transport
        while_open = tcp_acknowledgements(stream)
        transport.close()
        await asyncio.wait_for(lost, 5.0)
        after_close = tcp_acknowledgements(stream)
        bound_stalls(stream, 0.5)
        return while_open, after_close
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_closed_connection_has_nothing_to_probe(loop: str) -> None:
    while_open, after_close = event_loop.run(loop, _probe_before_and_after_close)
    if sys.platform.startswith("linux"):
        assert while_open is not None  # the probe works on this loop's open connections
    assert after_close is None


class _GoneSocket:
    """A socket whose descriptor is gone, answering as uvloop's does."""

    def fileno(self) -> int:
        return -1

    def getsockopt(self, *_: Any) -> bytes:
        raise ValueError("negative file descriptor")

    def setsockopt(self, *_: Any) -> None:
        raise ValueError("negative file descriptor")


class _Transport:
    def __init__(self, closing: bool) -> None:
        self.closing = closing

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return _GoneSocket() if name == "socket" else default

    def get_write_buffer_size(self) -> int:
        return 0


@pytest.mark.parametrize("closing", [False, True])
def test_a_socket_whose_descriptor_is_gone_is_not_probed(closing: bool) -> None:
    # Whatever the transport says of itself, a descriptor of -1 has nothing to tell.
    transport: Any = _Transport(closing)
    assert tcp_acknowledgements(transport) is None
    bound_stalls(transport, 0.5)


def test_the_probe_reads_what_the_kernel_says_of_an_open_connection() -> None:
    """The open side still works through the new guard (a real socket, asyncio)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):
        pytest.skip("TCP_INFO is Linux's")
    while_open, _ = event_loop.run(event_loop.ASYNCIO, _probe_before_and_after_close)
    assert while_open.retransmit_after > 0
