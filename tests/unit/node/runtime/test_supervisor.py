"""supervisor.py's routing, in one process: each accepted connection reaches the channel
of the partition its preamble names, preamble read and the rest untouched; a connection
without one reaches partition 0 with nothing read; a bad one reaches nobody."""

from __future__ import annotations

import asyncio
import io
import socket
from pathlib import Path

from dlm.node.runtime.config.node_config import NodeConfig
from dlm.node.runtime.log import Logger
from dlm.node.runtime.supervisor import Supervisor
from dlm.partitioning import preamble

PARTITIONS = 3


def routed(first: bytes, rest: bytes) -> tuple[int | None, bytes]:
    """Which partition's channel a connection that sends ``first + rest`` reaches, and
    what that partition's process then reads from it (None, b"": none)."""

    async def main() -> tuple[int | None, bytes]:
        config = NodeConfig.from_flags(
            node_id="n1", listen="127.0.0.1:7700", peers=None, data=str(Path("d")), cluster="c"
        )
        supervisor = Supervisor(
            config, {}, PARTITIONS, Logger("n1", stream=io.StringIO()), child_module="x"
        )
        ends = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
        for child, (ours, _theirs) in zip(supervisor.children, ends, strict=True):
            ours.setblocking(False)
            child.channel = ours
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        loop = asyncio.get_running_loop()
        supervisor._loop = loop
        supervisor._listener = listener
        loop.add_reader(listener.fileno(), supervisor._accept)
        client = socket.create_connection(listener.getsockname())
        try:
            client.sendall(first + rest)
            for _ in range(200):  # bounded: 2 s
                await asyncio.sleep(0.01)
                for partition, (_ours, theirs) in enumerate(ends):
                    theirs.setblocking(False)
                    try:
                        _data, fds, _flags, _addr = socket.recv_fds(theirs, 16, 1)
                    except BlockingIOError:
                        continue
                    with socket.socket(fileno=fds[0]) as handed:
                        handed.settimeout(2.0)
                        return partition, handed.recv(1024)
                if _closed(client):
                    return None, b""  # closed by the supervisor
            return -1, b""  # neither routed nor closed: a test failure
        finally:
            loop.remove_reader(listener.fileno())
            client.close()
            listener.close()
            for ours, theirs in ends:
                ours.close()
                theirs.close()

    return asyncio.run(main())


def _closed(client: socket.socket) -> bool:
    try:
        return client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True  # closed with bytes it had not read


def test_a_connection_without_a_preamble_reaches_partition_0_untouched() -> None:
    hello = b"\x00\x00\x00\x05hello"
    assert routed(hello, b"") == (0, hello)
    tls = b"\x16\x03\x01\x00\x05hello"
    assert routed(tls, b"") == (0, tls)


def test_a_preamble_sends_the_connection_to_its_partition_without_the_preamble() -> None:
    assert routed(preamble(2), b"\x00\x00\x00\x02hi") == (2, b"\x00\x00\x00\x02hi")
    assert routed(preamble(1), b"\x16rest") == (1, b"\x16rest")


def test_a_bad_preamble_reaches_no_partition() -> None:
    assert routed(b"\xffDLMX\x01", b"more") == (None, b"")
    assert routed(preamble(5), b"more") == (None, b"")  # this member has 3
    assert routed(b"\xffDLMP\x00", b"more") == (None, b"")
