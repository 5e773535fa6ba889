"""`make run`: the dev cluster comes up, its paste line takes a lock, and Ctrl-C stops it all."""

from __future__ import annotations

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


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> str:
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout}s; got:\n{seen}"
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            line = proc.stdout.readline()
            assert line, f"devcluster exited early ({proc.poll()}):\n{seen}"
            seen += line
    return seen


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
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path,
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
            proc.kill()
            proc.wait(timeout=10)
