"""The fenced store the chaos workload writes to: a counter per key behind a token check.

A small TCP server on 127.0.0.1 (a thread of the runner) that answers one JSON
line per request. It keeps, per key, the highest fencing token it has seen and
a counter, and refuses any request, read or write, whose token is lower than
that highest one: the check the README asks of a store behind dlm. A client
does a read-modify-write: ``read`` (which raises the highest token to its own),
then ``write`` of the value it read plus one, naming the value it read
(``expected``), so that a write built on a stale read (a lost update) is
visible in the log. Every request is logged as the store handled it, under its
lock, with ``time.monotonic()``: that log is what the checker trusts.

The client side (``StoreClient``) is standard library only: `dlm exec`'s command
uses it too.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

READ_TIMEOUT_S = 5.0


class StoreRefused(Exception):
    """The store refused the token: a higher one has been seen."""


class StoreServer:
    """The store; ``start()`` serves it from a thread, ``stop()`` ends it."""

    def __init__(self, log_path: str | os.PathLike[str], port: int = 0) -> None:
        self._log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in stop)
        self._lock = threading.Lock()
        self.highest: dict[str, int] = {}
        self.value: dict[str, int] = {}
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(128)
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._sock.getsockname()[1]}"

    def start(self) -> StoreServer:
        thread = threading.Thread(target=self._accept, name="chaos-store", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(5.0)
        with self._lock:
            self._log.close()

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request, atomically: the fencing rule, the counter, the log line."""
        op, key, token = request.get("op"), request.get("key"), request.get("token")
        if op not in ("read", "write") or not isinstance(key, str) or not isinstance(token, int):
            return {"ok": False, "why": "bad request"}
        with self._lock:
            highest = self.highest.get(key, 0)
            before = self.value.get(key, 0)
            accepted = token >= highest
            after = before
            expected = request.get("expected") if op == "write" else None
            if accepted:
                self.highest[key] = token
                if op == "write":
                    after = (expected if isinstance(expected, int) else before) + 1
                    self.value[key] = after
            record = {
                "k": "store", "op": op, "client_op": request.get("id", ""), "key": key,
                "token": token, "accepted": accepted, "highest_before": highest,
                "value_before": before, "value_after": after, "expected": expected,
                "t": time.monotonic(),
            }  # fmt: skip
            if not self._log.closed:
                self._log.write(json.dumps(record) + "\n")
                self._log.flush()
        if not accepted:
            return {"ok": False, "why": "refused", "highest": highest}
        return {"ok": True, "value": before if op == "read" else after}

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    try:
                        request = json.loads(line)
                    except ValueError:
                        return
                    reply = self.handle(request if isinstance(request, dict) else {})
                    stream.write((json.dumps(reply) + "\n").encode())
                    stream.flush()
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)


class StoreClient:
    """One connection to the store; reconnects after a failure."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self._target = (host, int(port))
        self._stream: Any = None
        self._sock: socket.socket | None = None

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            if self._stream is None:
                self._sock = socket.create_connection(self._target, timeout=READ_TIMEOUT_S)
                self._stream = self._sock.makefile("rwb")
            self._stream.write((json.dumps(request) + "\n").encode())
            self._stream.flush()
            line = self._stream.readline()
            if not line:
                raise OSError("the store closed the connection")
            reply = json.loads(line)
        except (OSError, ValueError):
            self.close()
            raise
        if not reply.get("ok"):
            if reply.get("why") == "refused":
                raise StoreRefused(f"token {request['token']} < {reply.get('highest')}")
            raise OSError(f"the store said {reply.get('why')}")
        return dict(reply)

    def read(self, key: str, token: int, op_id: str) -> int:
        return int(self._request({"op": "read", "key": key, "token": token, "id": op_id})["value"])

    def write(self, key: str, token: int, expected: int, op_id: str) -> int:
        request = {"op": "write", "key": key, "token": token, "expected": expected, "id": op_id}
        return int(self._request(request)["value"])

    def close(self) -> None:
        for thing in (self._stream, self._sock):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self._stream = self._sock = None
