"""Gateway processes and a round-robin TCP front for the cluster tests (tests/cluster).

``GatewayProc`` runs `dlm gateway` on a free 127.0.0.1 port and stops it by PID.
``RoundRobinFront`` stands for a TCP load balancer: one 127.0.0.1 address whose
connections go to each upstream in turn (one that refuses is skipped), relayed
by threads; ``stop()`` closes everything and joins them within a bounded time.
``unreachable_env`` is what makes a `dlm` command unable to reach the members
themselves (tests/cluster/unreachable/sitecustomize.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.cluster.harness import REPO, Cluster, free_ports, wait_for

UNREACHABLE = Path(__file__).resolve().parent / "unreachable"


def unreachable_env(cluster: Cluster) -> dict[str, str]:
    """The environment of a `dlm` command on a host that reaches no member directly."""
    ports = ",".join(str(node.port) for node in cluster.nodes.values())
    path = os.pathsep.join([str(UNREACHABLE), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "DLM_TEST_UNREACHABLE_PORTS": ports}


def _connects(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


class GatewayProc:
    """One `dlm gateway` process relaying to ``members``."""

    def __init__(
        self,
        base: Path,
        name: str,
        members: str,
        *,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = free_ports(1)[0]
        self.env = dict(env or {})
        """Added to its environment (e.g. OTEL_* to trace it)."""
        self.members = members
        self.log_path = base / f"{name}.log"
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> GatewayProc:
        env = dict(os.environ, PYTHONPATH=str(REPO), DLM_LOG_LEVEL="debug", **self.env)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dlm", "gateway", "--listen", self.address),
                    *("--cluster", self.members, *self.extra),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        wait_for(lambda: _connects(self.address), 20.0, f"the gateway on {self.address}")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self) -> int | None:
        """SIGTERM, then its exit code (SIGKILL if it is still running after 10 s)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class RoundRobinFront:
    """A test-only TCP load balancer on 127.0.0.1 in front of ``upstreams``."""

    def __init__(self, upstreams: Sequence[str]) -> None:
        self.upstreams = list(upstreams)
        self._turn = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def __enter__(self) -> RoundRobinFront:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = self._dial()
            if upstream is None:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
                for source, sink in ((client, upstream), (upstream, client)):
                    thread = threading.Thread(target=_pump, args=(source, sink), daemon=True)
                    self._threads.append(thread)
                    thread.start()

    def _dial(self) -> socket.socket | None:
        for _ in range(len(self.upstreams)):
            address = self.upstreams[self._turn % len(self.upstreams)]
            self._turn += 1
            host, port = address.rsplit(":", 1)
            try:
                return socket.create_connection((host, int(port)), timeout=2.0)
            except OSError:
                continue
        return None

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        self._accepting.join(5.0)
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            threads = list(self._threads)
        for thread in threads:
            thread.join(5.0)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        source.settimeout(None)
        while True:
            data = source.recv(65536)
            if not data:
                sink.shutdown(socket.SHUT_WR)
                return
            sink.sendall(data)
    except OSError:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
