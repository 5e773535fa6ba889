"""Hostile load on one member, from a process of its own, for a bounded time.

    python -m tests.cluster.flood ADDR --kind tags|idle --seconds S [--connections N]

``tags``: connection after connection (``--connections`` at a time, one thread
each), each sending a hello and then frames of tagged CBOR (a 64 KiB bignum,
nested tags, a long map that ends in a tag, shared references) or such a frame
as its hello, or a peer hello claiming ``--peer-id`` without the secret; it
reads until the member hangs up, and starts over. ``idle``: opens
``--connections`` connections, half of them after a client hello, and keeps
them open doing nothing; any the member closes is opened again.

Stops by itself after ``--seconds`` and prints one JSON line: how many
connections it made and frames it sent. Tests start it with Popen and stop it by
PID if it overstays.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import threading
import time
from typing import Any

import cbor2


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _tag_bombs() -> list[bytes]:
    bignum = b"\xc2\x5a" + struct.pack(">I", 65_000) + b"\xff" * 65_000
    nested = b"\xd9\xd9\xf7" * 20_000 + b"\x00"  # self-describe tags, 20,000 deep
    items = 8_000
    long_map_then_tag = (
        b"\xa3"
        + cbor2.dumps("t")
        + cbor2.dumps("ping")
        + cbor2.dumps("id")
        + cbor2.dumps(1)
        + cbor2.dumps("pad")
        + b"\x99"
        + struct.pack(">H", items)
        + b"\x00" * (items - 1)
        + b"\xc1\x00"  # the last element: an epoch date
    )
    shared = b"\xd8\x1c" + cbor2.dumps([b"x" * 1000] * 50)  # value sharing
    return [frame(b) for b in (bignum, nested, long_map_then_tag, shared)]


CLIENT_HELLO = frame(cbor2.dumps({"t": "hello", "role": "client", "version": 1}))


def peer_hello(node: str) -> bytes:
    return frame(
        cbor2.dumps({"t": "hello", "role": "peer", "version": 1, "cluster": "test", "node": node})
    )


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.connections = 0
        self.frames = 0
        self.errors = 0

    def add(self, connections: int = 0, frames: int = 0, errors: int = 0) -> None:
        with self.lock:
            self.connections += connections
            self.frames += frames
            self.errors += errors


def _drain(sock: socket.socket, until: float) -> None:
    """Reads until the member hangs up (or the time is up)."""
    while time.monotonic() < until:
        sock.settimeout(max(0.01, min(1.0, until - time.monotonic())))
        try:
            if not sock.recv(65536):
                return
        except TimeoutError:
            continue
        except OSError:
            return


def tags(addr: tuple[str, int], deadline: float, counts: Counts, seed: int, peer: str) -> None:
    host, port = addr
    rng = random.Random(seed)
    bombs = _tag_bombs()
    hello_as_peer = peer_hello(peer)
    while time.monotonic() < deadline:
        how = rng.randrange(3)
        payload = [bombs[rng.randrange(len(bombs))] for _ in range(4)]
        if how == 0:
            data = CLIENT_HELLO + b"".join(payload)
        elif how == 1:
            data = b"".join(payload)  # a bomb as the hello
        else:
            data = hello_as_peer + b"".join(payload)  # a peer without the secret
        try:
            with socket.create_connection((host, port), timeout=2.0) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                counts.add(connections=1)
                try:
                    sock.sendall(data)
                    counts.add(frames=len(payload))
                except OSError:
                    counts.add(errors=1)
                _drain(sock, min(deadline, time.monotonic() + 2.0))
        except OSError:
            counts.add(errors=1)
            time.sleep(0.01)


def idle(host: str, port: int, deadline: float, counts: Counts, total: int) -> None:
    open_socks: list[socket.socket] = []
    try:
        while time.monotonic() < deadline:
            alive = []
            for sock in open_socks:
                try:
                    sock.setblocking(False)
                    data = sock.recv(65536)
                    if data:
                        alive.append(sock)  # a welcome or a refusal: keep it (or see it close)
                    else:
                        sock.close()
                except BlockingIOError:
                    alive.append(sock)
                except OSError:
                    sock.close()
            open_socks = alive
            while len(open_socks) < total and time.monotonic() < deadline:
                try:
                    sock = socket.create_connection((host, port), timeout=2.0)
                except OSError:
                    counts.add(errors=1)
                    break
                counts.add(connections=1)
                if counts.connections % 2:
                    try:
                        sock.sendall(CLIENT_HELLO)
                        counts.add(frames=1)
                    except OSError:
                        sock.close()
                        continue
                open_socks.append(sock)
            time.sleep(0.2)
    finally:
        for sock in open_socks:
            sock.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("addr")
    parser.add_argument("--kind", choices=("tags", "idle"), required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--peer-id", default="n1", help="the member id peer hellos claim")
    args = parser.parse_args()
    host, port = args.addr.rsplit(":", 1)
    deadline = time.monotonic() + args.seconds
    counts = Counts()
    threads: list[threading.Thread] = []
    if args.kind == "tags":
        for i in range(args.connections):
            seed = args.seed * 1000 + i
            target: Any = ((host, int(port)), deadline, counts, seed, args.peer_id)
            threads.append(threading.Thread(target=tags, args=target, daemon=True))
    else:
        target = (host, int(port), deadline, counts, args.connections)
        threads.append(threading.Thread(target=idle, args=target, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.seconds + 5)
    print(
        json.dumps(
            {"connections": counts.connections, "frames": counts.frames, "errors": counts.errors}
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
