"""Running `dlm` as a user would, for the CLI tests against real nodes.

``Dlm`` runs ``python -m dlm ARGS`` (or a zipapp) with DLM_CLUSTER pointing at
a cluster, in an empty working directory, and returns what a script sees.
``Fifo`` is how a child started by ``dlm exec`` tells the test it is running,
so no test waits on a clock for that.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.cluster.harness import REPO

RUN_TIMEOUT_S = 60.0


class Dlm:
    def __init__(self, cluster_env: str, cwd: Path, command: Sequence[str] | None = None) -> None:
        self.command = list(command) if command is not None else [sys.executable, "-m", "dlm"]
        self.cwd = cwd
        self.env = dict(os.environ)
        self.env["DLM_CLUSTER"] = cluster_env
        self.env["PYTHONPATH"] = str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")
        for name in ("DLM_LOCK_KEY", "DLM_FENCING_TOKEN", "DLM_LEASE_ID", "DLM_LEASE_TTL_MS"):
            self.env.pop(name, None)

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.command, *args],
            cwd=self.cwd,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def json(self, *args: str, code: int = 0) -> dict[str, Any]:
        """Runs with --json; checks the exit code and that stdout is exactly one object."""
        proc = self.run(*args, "--json") if "--" not in args else self.run(*_json_before(args))
        assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, proc.stdout
        obj = json.loads(lines[0])
        assert isinstance(obj, dict)
        return obj

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*self.command, *args],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _json_before(args: Sequence[str]) -> list[str]:
    cut = list(args).index("--")
    return [*args[:cut], "--json", *args[cut:]]


def finish(proc: subprocess.Popen[str], timeout: float = RUN_TIMEOUT_S) -> tuple[int, str, str]:
    """Waits for a started dlm; kills it (by PID) if it overstays."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"dlm did not finish within {timeout}s: {err}") from None
    return proc.returncode, out, err


class Fifo:
    """A named pipe a child writes one line to; ``read`` blocks until it does (bounded)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)

    def read(self, timeout: float = 30.0) -> str:
        result: list[str] = []

        def reader() -> None:
            with open(self.path, encoding="utf-8") as f:
                result.append(f.readline().strip())

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            # Unblock the reader: open the write end ourselves.
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            thread.join(5)
            raise AssertionError(f"nothing written to {self.path} within {timeout}s")
        return result[0]


def group_members(pgid: int) -> list[int]:
    """PIDs of live (not zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            members.append(int(entry))
    return members


def first_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The first line a started dlm prints on stdout (bounded wait)."""
    assert proc.stdout is not None
    stream = proc.stdout
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert result and result[0], f"no output from dlm within {timeout}s"
    return result[0]


def stop(proc: subprocess.Popen[str]) -> None:
    """Teardown for a background dlm: SIGKILL by PID if still running, then reap."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
