"""An in-process stand-in for a dlm member, for testing the client without a cluster.

A thread accepts connections on 127.0.0.1 (port 0), answers the hello, and
hands every request to a handler that returns the reply (or None to stay
silent). Handlers can push frames, drop the connection, or redirect to
another fake. Every request is recorded so tests can wait for one with a
bounded timeout instead of sleeping.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from dlm.wire import (
    CLIENT_FRAME_LIMIT,
    ErrorCode,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    error,
    grant_push,
    ok,
    welcome,
)

Request = dict[str, Any]


class FakeConn:
    def __init__(self, server: FakeServer, sock: socket.socket, number: int) -> None:
        self.server = server
        self.sock = sock
        self.number = number
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, obj: Any) -> None:
        with self._send_lock:
            if not self.closed:
                try:
                    self.sock.sendall(encode_frame(obj))
                except OSError:
                    self.closed = True

    def drop(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


Handler = Callable[[FakeConn, Request], dict[str, Any] | None]


class FakeServer:
    def __init__(
        self,
        handler: Handler | None = None,
        *,
        name: str = "n1",
        greeting: dict[str, Any] | None = None,
        welcome_after_request: bool = False,
    ) -> None:
        self.name = name
        self.handler: Handler = handler or LockModel()
        self.greeting = greeting
        # Greet only once the first request is in: a client that waited for the
        # greeting before sending anything would never get one.
        self.welcome_after_request = welcome_after_request
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.addr = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.requests: list[tuple[int, Request]] = []
        self.conns: list[FakeConn] = []
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.handler_errors: list[Exception] = []

    # -- control ----------------------------------------------------------------

    def __enter__(self) -> FakeServer:
        t = threading.Thread(target=self._accept_loop, name=f"fake-{self.name}", daemon=True)
        self._threads.append(t)
        t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:
            conns = list(self.conns)
        for c in conns:
            c.drop()
        for t in list(self._threads):
            t.join(5.0)
        self._listener.close()
        for c in conns:
            c.sock.close()
        if self.handler_errors:
            raise self.handler_errors[0]

    def of_type(self, kind: str) -> list[Request]:
        with self._cond:
            return [r for _, r in self.requests if r.get("t") == kind]

    def wait_for(self, kind: str, count: int = 1, timeout: float = 5.0) -> list[Request]:
        """Waits until ``count`` requests of type ``kind`` have arrived; returns them."""
        with self._cond:
            self._cond.wait_for(
                lambda: len([r for _, r in self.requests if r.get("t") == kind]) >= count,
                timeout,
            )
            return [r for _, r in self.requests if r.get("t") == kind]

    # -- serving ----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            readable, _, _ = select.select([self._listener], [], [], 0.05)
            if not readable:
                continue
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._cond:
                conn = FakeConn(self, sock, len(self.conns))
                self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: FakeConn) -> None:
        decoder = FrameDecoder(CLIENT_FRAME_LIMIT)
        greeted = False
        greeting_owed = False
        while not self._stopping.is_set() and not conn.closed:
            try:
                readable, _, _ = select.select([conn.sock], [], [], 0.05)
                if not readable:
                    continue
                data = conn.sock.recv(65536)
            except (OSError, ValueError):
                return
            if not data:
                return
            decoder.feed(data)
            try:
                frames = list(decoder.frames())
            except ProtocolError:
                conn.drop()
                return
            for frame in frames:
                if not greeted:
                    greeted = True
                    greeting_owed = self.welcome_after_request
                    if not greeting_owed:
                        conn.send(self.greeting or welcome(self.name, "test-cluster"))
                    continue
                if greeting_owed:
                    greeting_owed = False
                    conn.send(self.greeting or welcome(self.name, "test-cluster"))
                with self._cond:
                    self.requests.append((conn.number, frame))
                    self._cond.notify_all()
                try:
                    reply = self.handler(conn, frame)
                except Exception as exc:  # surfaced by stop(), so a broken fake fails loudly
                    self.handler_errors.append(exc)
                    reply = error(frame.get("id"), ErrorCode.BAD_REQUEST, f"fake failed: {exc!r}")
                if reply is not None:
                    conn.send(reply)


# ---------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------


class LockModel:
    """A tiny single-node lock service: enough to exercise every client call."""

    def __init__(self, name: str = "n1") -> None:
        self.name = name
        self.lock = threading.Lock()
        self.index = 0
        self.leases: dict[str, int] = {}
        self.holders: dict[str, list[tuple[str, int]]] = {}
        self.waiters: dict[str, list[tuple[str, FakeConn]]] = {}
        self.expire_keepalives = False

    def __call__(self, conn: FakeConn, req: Request) -> dict[str, Any] | None:
        with self.lock:
            return self._handle(conn, req)

    def _holder_maps(self, key: str) -> list[dict[str, Any]]:
        return [
            {"lease": lease, "token": token, "granted_at_ms": 0, "held_ms": 0, "meta": {}}
            for lease, token in self.holders.get(key, [])
        ]

    def _handle(self, conn: FakeConn, req: Request) -> dict[str, Any] | None:
        rid, kind = req["id"], req["t"]
        self.index += 1
        if kind == "open_lease":
            self.leases[req["lease"]] = req["ttl_ms"]
            return ok(rid, lease=req["lease"], ttl_ms=req["ttl_ms"])
        if kind in ("keepalive", "lease_info", "close_lease", "acquire", "release") and (
            req["lease"] not in self.leases or (kind == "keepalive" and self.expire_keepalives)
        ):
            return error(rid, ErrorCode.SESSION_EXPIRED, "no such lease")
        if kind == "keepalive":
            return ok(rid, lease=req["lease"], ttl_ms=self.leases[req["lease"]])
        if kind == "close_lease":
            del self.leases[req["lease"]]
            return ok(rid, lease=req["lease"])
        if kind == "lease_info":
            keys = [k for k, hs in self.holders.items() if any(h[0] == req["lease"] for h in hs)]
            ttl = self.leases[req["lease"]]
            return ok(rid, lease=req["lease"], ttl_ms=ttl, remaining_ms=ttl, keys=keys)
        if kind == "acquire":
            key = req["key"]
            held = self.holders.setdefault(key, [])
            mine = [token for lease, token in held if lease == req["lease"]]
            if mine:  # a re-sent acquire of a lock this lease already holds
                return ok(
                    rid,
                    result="granted",
                    key=key,
                    token=mine[0],
                    lease=req["lease"],
                    ttl_ms=self.leases[req["lease"]],
                )
            if len(held) < req.get("limit", 1):
                held.append((req["lease"], self.index))
                return ok(
                    rid,
                    result="granted",
                    key=key,
                    token=self.index,
                    lease=req["lease"],
                    ttl_ms=self.leases[req["lease"]],
                )
            if req.get("wait"):
                queue = self.waiters.setdefault(key, [])
                queue.append((req["lease"], conn))
                return ok(rid, result="queued", key=key, lease=req["lease"], position=len(queue))
            return error(
                rid,
                ErrorCode.LOCKED,
                "held",
                holders=self._holder_maps(key),
                retry_after_ms=100,
            )
        if kind == "release":
            key, lease = req["key"], req["lease"]
            held = self.holders.get(key, [])
            mine = [h for h in held if h[0] == lease]
            queue = self.waiters.get(key, [])
            if mine:
                held.remove(mine[0])
                if queue:
                    next_lease, next_conn = queue.pop(0)
                    held.append((next_lease, self.index))
                    next_conn.send(grant_push(next_lease, key, self.index))
                return ok(rid, key=key, released="lock")
            if any(w[0] == lease for w in queue):
                self.waiters[key] = [w for w in queue if w[0] != lease]
                return ok(rid, key=key, released="queue")
            return error(rid, ErrorCode.NOT_HOLDER, "not yours", holders=self._holder_maps(key))
        if kind == "get":
            key = req["key"]
            return ok(rid, key=key, limit=1, holders=self._holder_maps(key), waiters=[])
        if kind == "list":
            locks = [
                {"key": k, "limit": 1, "holders": self._holder_maps(k), "waiters": 0}
                for k, hs in sorted(self.holders.items())
                if hs and k.startswith(req.get("prefix", ""))
            ]
            return ok(rid, locks=locks)
        if kind == "status":
            return ok(
                rid, node=self.name, role="leader", term=1, leader=self.name, commit=self.index
            )
        return error(rid, ErrorCode.BAD_REQUEST, f"unknown request {kind}")


def redirect_to(leader_addr: str | None) -> Handler:
    """A follower that sends everything to ``leader_addr``."""

    def handler(conn: FakeConn, req: Request) -> dict[str, Any]:
        return error(
            req["id"],
            ErrorCode.NOT_LEADER,
            "not the leader",
            leader=None,
            leader_address=leader_addr,
        )

    return handler
