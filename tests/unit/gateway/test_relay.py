"""The gateway's relay against a fake member on 127.0.0.1: what each side receives."""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from dlm.gateway.relay import NOTICE, Gateway
from dlm.node.runtime.log import Logger
from dlm.partitioning import preamble, target_preamble

WAIT_S = 10.0


@dataclass
class FakeMember:
    """Says "hi" to each connection, then echoes every byte back upper-cased and closes
    its side after the client's EOF; keeps what each connection sent."""

    address: str = ""
    received: list[bytes] = field(default_factory=list)
    connections: asyncio.Queue[int] = field(default_factory=asyncio.Queue)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.received)
        self.received.append(b"")
        self.connections.put_nowait(index)
        writer.write(b"hi")
        while data := await reader.read(1024):
            self.received[index] += data
            writer.write(data.upper())
            await writer.drain()
        writer.close()


@asynccontextmanager
async def relay(
    max_clients: int = 16, max_routing: int = 16
) -> AsyncIterator[tuple[str, FakeMember, Gateway]]:
    member = FakeMember()
    server = await asyncio.start_server(member.serve, "127.0.0.1", 0)
    member.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    gateway = Gateway(
        [member.address],
        Logger("gw", stream=io.StringIO()),
        max_clients=max_clients,
        max_routing=max_routing,
    )
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    running = asyncio.ensure_future(gateway.run(listener, signals=False))
    try:
        yield address, member, gateway
    finally:
        gateway.stop()
        assert await asyncio.wait_for(running, WAIT_S) == 0
        listener.close()
        server.close()
        await server.wait_closed()


async def _open(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.split(":")
    return await asyncio.wait_for(asyncio.open_connection(host, int(port)), WAIT_S)


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), WAIT_S)


def test_a_plain_client_gets_the_notice_then_the_members_bytes() -> None:
    async def scenario() -> None:
        async with relay() as (address, member, _):
            reader, writer = await _open(address)
            writer.write(b"\x00\x00hello")
            writer.write_eof()  # the half-close reaches the member, its answer comes back
            assert await _read_all(reader) == NOTICE + b"hi" + b"\x00\x00HELLO"
            writer.close()
            assert member.received == [b"\x00\x00hello"]

    asyncio.run(scenario())


def test_preambles_are_read_and_the_member_gets_its_own() -> None:
    async def scenario() -> None:
        async with relay() as (address, member, gateway):
            for first in (preamble(3), target_preamble(3, member.address)):
                reader, writer = await _open(address)
                writer.write(first + b"\x16tls")
                writer.write_eof()
                # A TLS client gets no notice: the member's bytes come first.
                assert await _read_all(reader) == b"hi" + (preamble(3) + b"\x16tls").upper()
                writer.close()
            assert member.received == [preamble(3) + b"\x16tls"] * 2
            assert gateway.router.hint(3) == member.address

    asyncio.run(scenario())


def test_outsiders_malformed_routing_and_the_cap_are_closed_without_a_word() -> None:
    async def scenario() -> None:
        async with relay(max_clients=1) as (address, member, gateway):
            for first in (target_preamble(0, "127.0.0.1:1"), b"\xffDLMX\x00\x00"):
                reader, writer = await _open(address)
                writer.write(first + b"\x00\x00hello")
                assert await _read_all(reader) == b""
                writer.close()
            held_reader, held_writer = await _open(address)
            held_writer.write(b"\x00")
            assert await asyncio.wait_for(held_reader.readexactly(len(NOTICE)), WAIT_S) == NOTICE
            extra_reader, extra_writer = await _open(address)
            assert await _read_all(extra_reader) == b""  # one more than --max-clients
            extra_writer.close()
            held_writer.close()
            assert member.received == [b"\x00"]
            assert gateway.refused == 3

    asyncio.run(scenario())


def test_connections_that_say_nothing_are_capped() -> None:
    async def scenario() -> None:
        async with relay(max_routing=1) as (address, member, gateway):
            _, silent = await _open(address)  # holds the one routing seat
            await _until(lambda: gateway.routing == 1)
            shed_reader, shed_writer = await _open(address)
            assert await _read_all(shed_reader) == b""
            shed_writer.close()
            silent.write(b"\x00")  # its routing done, the seat is free again
            await _until(lambda: gateway.routing == 0)
            reader, writer = await _open(address)
            writer.write(b"\x01")
            assert await asyncio.wait_for(reader.readexactly(len(NOTICE)), WAIT_S) == NOTICE
            await _until(lambda: sorted(member.received) == [b"\x00", b"\x01"])
            writer.close()
            silent.close()
            assert gateway.refused == 1

    asyncio.run(scenario())


async def _until(condition: Callable[[], bool]) -> None:
    """Lets the gateway's tasks run until ``condition`` holds (a bounded number of turns)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the gateway never got there")
