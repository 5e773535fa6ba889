"""etcd 3.4 as the yardstick: a local 3-member cluster and a stdlib lock client.

The comparison runs the same workload shape as the dlm benchmark through
etcd's own lock service (``v3lock``), reached over the v3 JSON gateway:
``POST /v3/lease/grant``, ``/v3/lock/lock`` (which queues behind earlier
lockers of the same name, so the hot key is FIFO here too) and
``/v3/lock/unlock``; names are base64. The client uses only the standard
library: one keep-alive HTTP/1.1 connection per simulated client, spoken over
asyncio streams so that many clients share one event loop like dlm's async
client does. Clients talk to the leader first (the shortest path etcd offers)
and move to the next member when a connection fails.

etcd keeps its default of fsync on every commit, like dlm.

Run alone: ``python -m bench.etcd [--seconds S]`` (the dlm harness drives the
load; this module only knows etcd).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from bench.floor import free_ports
from bench.procs import ProcessCluster

ETCD_BINARY = "etcd"
START_TIMEOUT_S = 20.0
# etcd's gateway answers these while a leader is being elected or a proposal was dropped.
_RETRYABLE_GRPC_CODES = {
    4,
    8,
    10,
    14,
}  # DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE


def etcd_version() -> str | None:
    """The installed etcd's version string, or None when there is no usable etcd."""
    path = shutil.which(ETCD_BINARY)
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('message') or body.get('error') or body}")
        self.status = status
        self.grpc_code = body.get("code")

    @property
    def retryable(self) -> bool:
        return self.grpc_code in _RETRYABLE_GRPC_CODES or self.status in (502, 503)


# ---------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------


def _post_sync(addr: str, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = json.loads(response.read() or b"{}")
        if response.status != 200:
            raise EtcdError(response.status, payload)
        return dict(payload)
    finally:
        conn.close()


class EtcdCluster(ProcessCluster):
    """Three etcd members on 127.0.0.1 with data in ``base_dir``; stopped by PID."""

    def __init__(self, base_dir: str, size: int = 3) -> None:
        super().__init__(base_dir, [f"e{i}" for i in range(size)])
        ports = free_ports(2 * size)
        self.client_addrs = [f"127.0.0.1:{p}" for p in ports[:size]]
        self.peer_urls = [f"http://127.0.0.1:{p}" for p in ports[size:]]
        self.token = f"dlm-bench-{os.getpid()}-{time.monotonic_ns()}"
        self._member_ids: dict[str, int] = {}

    def _command(self, i: int) -> list[str]:
        initial = ",".join(f"{n}={u}" for n, u in zip(self.names, self.peer_urls, strict=True))
        client_url = f"http://{self.client_addrs[i]}"
        return [
            ETCD_BINARY,
            f"--name={self.names[i]}",
            f"--data-dir={os.path.join(self.base_dir, self.names[i])}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={self.peer_urls[i]}",
            f"--initial-advertise-peer-urls={self.peer_urls[i]}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self.token}",
            "--logger=zap",
            "--log-level=error",
        ]

    def start(self) -> None:
        self.spawn_all()
        self.leader_index(START_TIMEOUT_S)

    def status(self, i: int, timeout: float = 1.0) -> dict[str, Any] | None:
        if not self.alive(i):
            return None
        try:
            return _post_sync(self.client_addrs[i], "/v3/maintenance/status", {}, timeout)
        except (OSError, EtcdError, ValueError, http.client.HTTPException):
            return None

    def leader_index(self, timeout: float) -> int:
        """Index of the member every live member names as leader; waits up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            views: dict[int, int] = {}
            for i in range(len(self.names)):
                status = self.status(i)
                if status is None:
                    continue
                self._member_ids[self.names[i]] = int(status["header"]["member_id"])
                views[i] = int(status.get("leader", 0))
            leaders = set(views.values())
            if len(views) * 2 > len(self.names) and len(leaders) == 1 and 0 not in leaders:
                (leader_id,) = leaders
                for i, name in enumerate(self.names):
                    if self._member_ids.get(name) == leader_id and i in views:
                        return i
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd has no agreed leader after {timeout:.0f} s: {views}")
            time.sleep(0.05)

    def max_term(self) -> int:
        """The highest Raft term any live member reports (each election raises it)."""
        statuses = (self.status(i) for i in range(len(self.names)))
        return max((int(s.get("raftTerm", 0)) for s in statuses if s), default=0)

    def wait_all_agree(self, timeout: float) -> None:
        """Every member is up and names the same leader."""
        deadline = time.monotonic() + timeout
        while True:
            views = [self.status(i) for i in range(len(self.names))]
            leaders = {int(v.get("leader", 0)) if v else -1 for v in views}
            if len(leaders) == 1 and -1 not in leaders and 0 not in leaders:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("etcd members do not agree on a leader")
            time.sleep(0.05)


class _HttpConnection:
    """One keep-alive HTTP/1.1 connection that fails over to the next endpoint."""

    def __init__(self, endpoints: Sequence[str], first: int) -> None:
        self._endpoints = list(endpoints)
        self._current = first % len(self._endpoints)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            host, port = self._endpoints[self._current].rsplit(":", 1)
            self._reader, self._writer = await asyncio.open_connection(host, int(port))
        return self._reader, self._writer

    def _drop(self, move_on: bool) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        if move_on:
            self._current = (self._current + 1) % len(self._endpoints)

    async def close(self) -> None:
        writer = self._writer
        self._drop(move_on=False)
        if writer is not None:
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _exchange(self, path: str, body: bytes) -> tuple[int, bytes]:
        reader, writer = await self._connect()
        host = self._endpoints[self._current]
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionResetError("etcd closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length = -1
        chunked = close = False
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                close = True
        if chunked:
            parts = []
            while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
                parts.append(await reader.readexactly(size + 2))
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            payload = b"".join(p[:-2] for p in parts)
        elif length >= 0:
            payload = await reader.readexactly(length)
        else:
            payload = await reader.read()
            close = True
        if close:
            self._drop(move_on=False)
        return status, payload

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        timeout: float,
        attempt_timeout: float | None = None,
    ) -> dict[str, Any]:
        """POST with retries on lost connections and elections, until ``timeout`` runs out.

        With ``attempt_timeout``, an attempt that stays silent that long is abandoned and
        re-sent to the next member (safe: v3lock is idempotent per lease, unlock is a delete).
        """
        encoded = json.dumps(body).encode()
        deadline = time.monotonic() + timeout
        backoff = 0.01
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"etcd {path} did not succeed within {timeout} s")
            patience = remaining if attempt_timeout is None else min(remaining, attempt_timeout)
            try:
                status, payload = await asyncio.wait_for(self._exchange(path, encoded), patience)
                answer = json.loads(payload or b"{}")
                if status == 200:
                    return dict(answer)
                error = EtcdError(status, answer)
                if not error.retryable:
                    raise error
                self._drop(move_on=False)
            except TimeoutError:  # before OSError, of which it is a subclass
                self._drop(move_on=True)
                if patience >= remaining:
                    raise
                continue
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                self._drop(move_on=True)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.2)


class EtcdSession:
    """One simulated client: its own connection and lease; locks through v3lock."""

    def __init__(
        self, conn: _HttpConnection, lease: str, op_timeout: float, attempt_timeout: float | None
    ) -> None:
        self._conn = conn
        self._lease = lease
        self._op_timeout = op_timeout
        self._attempt_timeout = attempt_timeout
        self._held: dict[str, str] = {}

    @classmethod
    async def open(
        cls,
        endpoints: Sequence[str],
        first: int,
        ttl_s: int = 60,
        op_timeout: float = 10.0,
        attempt_timeout: float | None = None,
    ) -> EtcdSession:
        """``attempt_timeout``: give up on a silent attempt and try the next member; only for
        a key nobody else wants (a queued lock is silent for as long as it waits)."""
        conn = _HttpConnection(endpoints, first)
        answer = await conn.post("/v3/lease/grant", {"TTL": ttl_s}, op_timeout, attempt_timeout)
        return cls(conn, str(answer["ID"]), op_timeout, attempt_timeout)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._conn.post(path, body, self._op_timeout, self._attempt_timeout)

    async def acquire(self, key: str, *, wait: bool) -> None:
        # v3lock always queues; `wait` matters only to dlm, where a busy key would fail fast.
        del wait
        answer = await self._post("/v3/lock/lock", {"name": _b64(key), "lease": self._lease})
        self._held[key] = answer["key"]

    async def release(self, key: str) -> None:
        await self._post("/v3/lock/unlock", {"key": self._held.pop(key)})

    async def close(self) -> None:
        try:
            await self._conn.post("/v3/lease/revoke", {"ID": self._lease}, 2.0)
        except (EtcdError, TimeoutError):
            pass
        finally:
            await self._conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    # The load harness lives with the dlm benchmark; importing it here avoids a cycle.
    from bench.locks import main as locks_main

    return locks_main(["--only", "etcd", *(argv or [])])


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
