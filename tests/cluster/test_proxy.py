"""The fault-injecting proxy (tests/cluster/proxy.py) in front of a plain echo server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.cluster.proxy import DOWN, UP, Proxy

QUIET_S = 0.3
"""How long silence must last to count as "nothing came through"."""


class Echo:
    """Echoes every byte back on 127.0.0.1, and remembers what it received."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.1)
        self.received = bytearray()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                self.received += data
                conn.sendall(data)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self.sock.close()


@pytest.fixture
def link() -> Iterator[tuple[Proxy, Echo]]:
    echo = Echo()
    proxy = Proxy(echo.address).start()
    try:
        yield proxy, echo
    finally:
        proxy.stop()
        echo.stop()


def connect(proxy: Proxy) -> socket.socket:
    host, port = proxy.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def reply(sock: socket.socket, size: int, timeout: float = 5.0) -> bytes:
    """Up to ``size`` bytes, or fewer if that many do not arrive within ``timeout``."""
    sock.settimeout(timeout)
    data = b""
    try:
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        pass
    return data


def test_forwards_both_ways_and_binds_to_loopback(link: tuple[Proxy, Echo]) -> None:
    proxy, _ = link
    assert proxy.address.startswith("127.0.0.1:")
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        assert reply(sock, 5) == b"hello"
        assert proxy.connections == 1


def test_a_cut_drops_both_ways_and_heal_closes_the_damaged_connection(
    link: tuple[Proxy, Echo],
) -> None:
    proxy, echo = link
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert reply(sock, 1) == b"a"
        proxy.cut()
        sock.sendall(b"lost")
        assert reply(sock, 4, QUIET_S) == b""
        assert bytes(echo.received) == b"a"
        assert proxy.dropped[UP] == 4
        proxy.heal()
        assert reply(sock, 1) == b""  # closed: the stream lost bytes
    with connect(proxy) as fresh:
        fresh.sendall(b"back")
        assert reply(fresh, 4) == b"back"


def test_a_one_way_cut_lets_the_other_way_through(link: tuple[Proxy, Echo]) -> None:
    proxy, echo = link
    with connect(proxy) as sock:
        proxy.cut(DOWN)
        sock.sendall(b"ping")
        deadline = time.monotonic() + 5
        while bytes(echo.received) != b"ping":  # the upstream got it ...
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert reply(sock, 4, QUIET_S) == b""  # ... its echo was dropped
        assert proxy.dropped == {UP: 0, DOWN: 4}


def test_a_delay_holds_each_chunk_in_order(link: tuple[Proxy, Echo]) -> None:
    proxy, _ = link
    with connect(proxy) as sock:
        proxy.delay(0.15, UP)
        start = time.monotonic()
        sock.sendall(b"one")
        sock.sendall(b"two")
        assert reply(sock, 6) == b"onetwo"
        assert time.monotonic() - start >= 0.15
        proxy.heal()
        sock.sendall(b"x")
        assert reply(sock, 1) == b"x"  # a delay loses nothing: the connection stays


def test_stop_closes_every_connection_and_the_listener(link: tuple[Proxy, Echo]) -> None:
    proxy, _ = link
    address = proxy.address
    with connect(proxy) as sock:
        proxy.stop()
        assert reply(sock, 1) == b""
    host, port = address.rsplit(":", 1)
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_bad_arguments_are_refused(link: tuple[Proxy, Echo]) -> None:
    proxy, _ = link
    with pytest.raises(ValueError, match="direction"):
        proxy.cut("sideways")
    with pytest.raises(ValueError, match="negative"):
        proxy.delay(-1)
