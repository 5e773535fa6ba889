"""Real `dlm node` processes on 127.0.0.1 for the cluster tests.

``Cluster`` starts N members on free ports with their data under a temp dir,
and can kill -9, pause (SIGSTOP), resume and restart each one by PID. Every
process it starts it also stops, by PID, in ``stop_all`` (the fixture's
teardown). Waiting is always polling a condition with a deadline.

``RawConn`` speaks the wire protocol by hand, for tests that need exact
control over frames (malformed input, pushes on one connection), with or
without the authentication handshake and TLS. ``Cluster(node_args=...)`` gives
members extra flags (secrets, certificates); ``client_secret`` and
``client_tls`` are what the harness itself connects with.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import cbor2

from dlm.partitioning import preamble
from dlm.testing import processes

free_ports = processes.free_ports
"""Ports free now, all different: dlm.testing's picker, which these tests share."""

if TYPE_CHECKING:
    from dlm.auth import FrameOpener, FrameSealer
    from dlm.client import Client

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02
) -> T:
    """Polls ``condition`` until it returns something truthy; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class RawConn:
    """A hand-driven protocol connection (blocking socket, bounded waits).

    With ``secret`` the hello carries the initiator's nonce and, if the member
    proves the secret in its welcome, the ``auth`` frame follows: every later
    frame is sealed and opened (``send_raw_body`` and ``send_bytes`` stay raw).
    ``tls`` is an ssl.SSLContext to wrap the socket with (``server_hostname``:
    the name to verify, default the host). ``sent`` records every byte written.
    ``partition``: the partition of a member of several to reach (its preamble is sent
    first, before TLS and the hello).
    """

    def __init__(
        self,
        addr: str,
        *,
        hello: dict[str, Any] | bool | None = None,
        timeout: float = 5.0,
        secret: bytes | None = None,
        tls: Any = None,
        server_hostname: str | None = None,
        partition: int = 0,
    ):
        host, port = addr.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if partition:
            sock.sendall(preamble(partition))
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=server_hostname or host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self._buf = b""
        self._next_id = 1
        self.pushes: list[dict[str, Any]] = []
        self.welcome: dict[str, Any] = {}
        self.sent = bytearray()
        self.sealer: FrameSealer | None = None
        self.opener: FrameOpener | None = None
        if hello is not False:
            greeting = dict(hello) if isinstance(hello, dict) else None
            greeting = greeting or {"t": "hello", "role": "client", "version": 1}
            initiator = None
            if secret is not None:
                from dlm.auth import Initiator, new_nonce

                initiator = Initiator(
                    secret,
                    new_nonce(),
                    role=greeting.get("role", ""),
                    cluster=greeting.get("cluster", ""),
                    node=greeting.get("node", ""),
                    version=greeting.get("version", 1),
                )
                greeting.update(initiator.hello_fields())
            self.send(greeting)
            self.welcome = self.recv()
            if initiator is not None and self.welcome.get("t") == "welcome":
                self.send(initiator.check_welcome(self.welcome))
                self.sealer, self.opener = initiator.keys()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, obj: Any) -> None:
        body = cbor2.dumps(obj)
        if self.sealer is not None:
            self.send_bytes(self.sealer.seal(body))
        else:
            self.send_raw_body(body)

    def send_raw_body(self, body: bytes) -> None:
        self.send_bytes(struct.pack(">I", len(body)) + body)

    def send_bytes(self, data: bytes) -> None:
        self.sent += data
        self.sock.sendall(data)

    def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        """The next frame; raises ConnectionError when the node hung up."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buf) >= 4:
                (n,) = struct.unpack(">I", self._buf[:4])
                if len(self._buf) >= 4 + n:
                    payload = self._buf[4 : 4 + n]
                    self._buf = self._buf[4 + n :]
                    if self.opener is not None:
                        payload = self.opener.open(payload)
                    return dict(cbor2.loads(payload))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame in time")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the node")
            self._buf += data

    def request(self, obj: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """Sends a request with a fresh id; returns its reply (pushes meanwhile are kept)."""
        rid = self._next_id
        self._next_id += 1
        self.send({**obj, "id": rid})
        deadline = time.monotonic() + timeout
        while True:
            frame = self.recv(max(0.01, deadline - time.monotonic()))
            if frame.get("id") == rid:
                return frame
            if frame.get("t") == "grant":
                self.pushes.append(frame)

    def await_push(self, lease: str, key: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for push in self.pushes:
                if push.get("lease") == lease and push.get("key") == key:
                    self.pushes.remove(push)
                    return push
            frame = self.recv(max(0.01, deadline - time.monotonic()))
            if frame.get("t") == "grant":
                self.pushes.append(frame)

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        try:
            while True:
                self.recv(timeout)
        except ConnectionError:
            return True
        except (TimeoutError, OSError):
            return False
        except ValueError:  # a frame that does not open (an error sent before the keys)
            return self.closed_by_peer(timeout)


_LOWER_AND_EXEC = (
    "import os, resource, sys\n"
    "n = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
"""Sets the open-files limit (soft and hard), then becomes the command after it."""


def _wait_gone(pids: Sequence[int], timeout: float = 10.0) -> None:
    """Waits (bounded) until none of ``pids`` (a member's partition processes, reaped by
    their supervisor or by init) is running any more."""

    def gone() -> bool:
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                return False
        return True

    wait_for(gone, timeout, f"processes {list(pids)} to end")


class NodeProc:
    def __init__(
        self,
        cluster: Cluster,
        node_id: str,
        port: int,
        *,
        join: Sequence[str] = (),
        flags: Sequence[str] = (),
    ) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.port = port
        self.join = tuple(join)
        """Members to ask to add this one (``--join``); empty: one of the first members."""
        self.flags = tuple(flags)
        """More `dlm node start` flags (``--auto-promote off``)."""
        self.data_dir = cluster.base / node_id
        self.log_path = cluster.base / f"{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.release: Path | None = None
        """Where another release's ``dlm`` package lives (tests/compat), to run it instead."""
        self.partitions: int | None = cluster.partitions if cluster.partitions > 1 else None
        """The --partitions this member is started with (None: the flag is not given)."""
        self.by_hand = False
        """Start with --id, --data and --cluster-id only (and ``flags``): no --listen, no
        --peers or --join, as an operator restarts a member whose data directory exists."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        partitions = self.partitions
        more = ["--partitions", str(partitions)] if partitions is not None else []
        return [*self._base_command(), *more, *self.cluster.node_args(self)]

    def child_pids(self) -> list[int]:
        """The PIDs of this member's partition processes (none for a member of one)."""
        if not self.alive:
            return []
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def _signal_all(self, signum: int) -> None:
        """``signum`` to the member's process and, for a member of several partitions,
        to each of its partition processes (children first, as read before)."""
        children = self.child_pids()
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def _base_command(self) -> list[str]:
        members = (
            ["--join", ",".join(self.join)] if self.join else ["--peers", self.cluster.peers_flag]
        )
        where = [] if self.by_hand else ["--listen", self.address, *members]
        return [
            sys.executable,
            "-m",
            "dlm",
            "node",
            "start",
            "--id",
            self.node_id,
            *where,
            "--data",
            str(self.data_dir),
            "--cluster-id",
            self.cluster.cluster_id,
            *self.flags,
        ]

    def start(self) -> None:
        assert not self.alive, f"{self.node_id} is already running"
        env = dict(os.environ)
        env.setdefault("DLM_LOG_LEVEL", "info")
        code = self.release if self.release is not None else REPO
        env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(self.cluster.env)
        command = self.command()
        if self.cluster.open_files is not None:
            # Through a launcher that lowers the limit and execs the member (same PID).
            command = [
                sys.executable,
                "-c",
                _LOWER_AND_EXEC,
                str(self.cluster.open_files),
                *command,
            ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=log, cwd=self.cluster.base, env=env
            )
        self.paused = False

    def kill(self) -> None:
        """kill -9 (of every process of the member), and reap."""
        if self.proc is None:
            return
        children = self.child_pids()
        if self.proc.poll() is None:
            self._signal_all(signal.SIGKILL)
        self.proc.wait(timeout=10)
        _wait_gone(children)
        self.paused = False

    def terminate(self, grace: float = 5.0) -> int | None:
        """SIGTERM; SIGKILL after ``grace``. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if self.paused:
                self._signal_all(signal.SIGCONT)
            children = self.child_pids()
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_all(signal.SIGKILL)
                self.proc.wait(timeout=10)
                for pid in children:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            _wait_gone(children)
        return self.proc.returncode

    def pause(self) -> None:
        self._signal_all(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)
        self.paused = False

    def restart(self) -> None:
        self.kill()
        self.start()

    def wait_exit(self, timeout: float) -> int:
        """The exit code of a member expected to stop on its own (killed if it does not)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.node_id} did not exit within {timeout}s\n{self.log_tail()}"
            ) from None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def status(self, timeout: float = 1.0, *, partition: int = 0) -> dict[str, Any] | None:
        """This member's own view (a stale read) of ``partition``, or None if it does not
        answer."""
        if not self.alive or self.paused:
            return None
        try:
            with RawConn(
                self.address,
                timeout=timeout,
                secret=self.cluster.client_secret,
                tls=self.cluster.client_tls,
                partition=partition,
            ) as conn:
                reply = conn.request({"t": "status", "stale": True}, timeout=timeout)
        except (OSError, ConnectionError, TimeoutError, ValueError):
            return None
        return reply if reply.get("t") == "ok" else None


class Cluster:
    def __init__(
        self,
        base: Path,
        size: int = 3,
        cluster_id: str = "test",
        env: dict[str, str] | None = None,
        *,
        node_args: Callable[[NodeProc], list[str]] | None = None,
        client_secret: bytes | None = None,
        client_tls: Any = None,
        open_files: int | None = None,
        partitions: int = 1,
    ) -> None:
        """``open_files``: the members' open-files limit (soft and hard), when given;
        ``partitions``: the members' --partitions (1: not given)."""
        self.base = base
        self.partitions = partitions
        self.env = env or {}
        self.node_args: Callable[[NodeProc], list[str]] = node_args or (lambda _: [])
        self.client_secret = client_secret
        self.client_tls = client_tls
        self.open_files = open_files
        self.cluster_id = cluster_id
        ports = free_ports(size)
        self.nodes = {
            f"n{i + 1}": NodeProc(self, f"n{i + 1}", port) for i, port in enumerate(ports)
        }
        """The members: the first ones, then those added, less those retired."""
        self.retired: dict[str, NodeProc] = {}
        """Members removed from the cluster (still stopped by ``stop_all``, if running)."""
        self.peers_flag = ",".join(f"{n.node_id}={n.address}" for n in self.nodes.values())

    def add_node(
        self,
        node_id: str,
        *,
        port: int | None = None,
        join: Sequence[str] | None = None,
        flags: Sequence[str] = (),
    ) -> NodeProc:
        """A new member (not started) that joins through ``join`` (default: every member)."""
        assert node_id not in self.nodes and node_id not in self.retired, node_id
        node = NodeProc(
            self,
            node_id,
            port if port is not None else free_ports(1)[0],
            join=join if join is not None else self.addresses,
            flags=flags,
        )
        self.nodes[node_id] = node
        return node

    def retire(self, node_id: str) -> NodeProc:
        """``node_id`` is no longer a member: leader elections no longer count it."""
        node = self.nodes.pop(node_id)
        self.retired[node_id] = node
        return node

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes.values()]

    @property
    def members_env(self) -> str:
        return ",".join(self.addresses)

    def start_all(self) -> None:
        for node in self.nodes.values():
            node.start()

    def stop_all(self) -> None:
        """SIGTERM every member at once (retired ones too), then reap each (SIGKILL after a
        grace)."""
        every = [*self.nodes.values(), *self.retired.values()]
        for node in every:
            if node.alive:
                if node.paused:
                    node.resume()
                os.kill(node.pid, signal.SIGTERM)  # a supervisor stops its children itself
        for node in every:
            node.terminate(grace=5.0)

    def kill_all(self) -> None:
        for node in [*self.nodes.values(), *self.retired.values()]:
            node.kill()

    def leader_now(self, partition: int = 0) -> NodeProc | None:
        """The member a majority of the live members name as ``partition``'s leader in its
        newest term."""
        views = [
            s for s in (n.status(partition=partition) for n in self.nodes.values()) if s is not None
        ]
        if not views:
            return None
        term = max(v["term"] for v in views)
        named = [v["leader"] for v in views if v["term"] == term and v["leader"]]
        majority = len(self.nodes) // 2 + 1
        for view in views:
            if (
                view["role"] == "leader"
                and view["term"] == term
                and named.count(view["node"]) >= majority
            ):
                return self.nodes[view["node"]]
        return None

    def wait_for_leader(
        self, timeout: float = 10.0, *, not_: str | None = None, partition: int = 0
    ) -> NodeProc:
        def found() -> NodeProc | None:
            leader = self.leader_now(partition)
            if leader is not None and leader.node_id != not_:
                return leader
            return None

        try:
            return wait_for(found, timeout, "a leader")
        except AssertionError:
            logs = "\n".join(f"--- {n.node_id}\n{n.log_tail(15)}" for n in self.nodes.values())
            raise AssertionError(
                f"no leader of partition {partition} within {timeout}s\n{logs}"
            ) from None

    def wait_for_leaders(
        self, timeout: float = 20.0, *, not_: str | None = None
    ) -> dict[int, NodeProc]:
        """Every partition's leader (``not_``: other than that member), by partition."""
        deadline = time.monotonic() + timeout
        return {
            p: self.wait_for_leader(max(0.5, deadline - time.monotonic()), not_=not_, partition=p)
            for p in range(self.partitions)
        }

    def client(self, **kwargs: Any) -> Client:
        from dlm.client import Client

        kwargs.setdefault("secret", self.client_secret)
        kwargs.setdefault("tls", self.client_tls)
        return Client(self.addresses, **kwargs)


@contextmanager
def partitioned_cluster(
    base: Path, partitions: int, *, size: int = 3, timeout: float = 30.0
) -> Iterator[Cluster]:
    """``size`` members of ``partitions`` partitions each, started, every partition with a
    leader; every process stopped (by its PID) on the way out."""
    c = Cluster(base, size=size, partitions=partitions)
    try:
        c.start_all()
        c.wait_for_leaders(timeout=timeout)
        yield c
    finally:
        c.stop_all()
