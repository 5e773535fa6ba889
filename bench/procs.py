"""Local server processes for the benchmarks: start, kill -9, restart and stop them by PID.

dlm's and etcd's benchmark clusters differ only in the command line of a
member and in how they find the leader; this is the part they share.
"""

from __future__ import annotations

import os
import signal
import subprocess


class ProcessCluster:
    """Members named ``names``, each one process logging to ``base_dir/NAME.log``."""

    def __init__(self, base_dir: str, names: list[str]) -> None:
        self.base_dir = base_dir
        self.names = names
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(names)
        self.env: dict[str, str] | None = None
        """The members' environment (None: this process's)."""

    def _command(self, i: int) -> list[str]:
        raise NotImplementedError

    def _spawn(self, i: int) -> None:
        with open(os.path.join(self.base_dir, f"{self.names[i]}.log"), "ab") as log:
            self.procs[i] = subprocess.Popen(
                self._command(i), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env
            )

    def spawn_all(self) -> None:
        for i in range(len(self.names)):
            self._spawn(i)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.poll() is None]

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        return proc is not None and proc.poll() is None

    def kill(self, i: int) -> None:
        """kill -9 member ``i`` and reap it."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self, i: int) -> None:
        self._spawn(i)

    def stop(self) -> None:
        """SIGTERM every member, then SIGKILL any still running after 5 s."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
