"""`make run`: the dev cluster comes up, its paste line takes a lock, and Ctrl-C stops it all."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.harness import REPO, wait_for

pytestmark = pytest.mark.cluster

UP_TIMEOUT = 30.0


def _three_free_ports_after() -> int:
    """A base port whose next three ports are free on 127.0.0.1."""
    for base in range(27100, 27900, 10):
        socks = []
        try:
            for port in range(base + 1, base + 4):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no three consecutive free ports")


def _read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    """Everything devcluster printed up to ``marker`` (raw reads: select and a buffered
    reader do not mix)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while marker.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout}s; got:\n{seen.decode()}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"devcluster exited early ({proc.poll()}):\n{seen.decode()}"
            seen += chunk
    return seen.decode()


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (the members a devcluster started)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                found.append(int(entry))
    return found


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return True
    return False


def test_the_dev_cluster_serves_its_paste_line_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    base = _three_free_ports_after()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlm.node.devcluster", "--base-port", str(base),
         "--data", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        shown = _read_until(proc, "Ctrl-C stops", UP_TIMEOUT)
        line = next(ln.strip() for ln in shown.splitlines() if "exec --lock demo" in ln)
        out = subprocess.run(
            ["sh", "-c", line],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr
        assert re.fullmatch(r"hello, token \d+\n", out.stdout)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        for port in range(base + 1, base + 4):
            wait_for(lambda p=port: _refused(p), 10.0, f"127.0.0.1:{port} to close")
    finally:
        if proc.poll() is None:
            # The members run in their own session: a killed devcluster would orphan them.
            members = _children(proc.pid)
            proc.kill()
            proc.wait(timeout=10)
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
