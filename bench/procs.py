"""Local server processes for the benchmarks: start, kill -9, restart and stop them by PID,
and what a member's whole process tree has used (CPU, bytes written), read from /proc.

dlm's and etcd's benchmark clusters differ only in the command line of a
member and in how they find the leader; this is the part they share.

A member is the process the benchmark started and every process below it: a
partitioned dlm member (``--partitions P``, P > 1) is a supervisor with P
children, and any member may fork a short-lived child to write a snapshot.
The CPU a member used is therefore summed over its tree: user + system time of
each live process in it, plus the time of the children each has already
reaped (``cutime``/``cstime``), so a child that ended during a measurement
still counts. Killing a member (kill -9) kills its tree, as a host that
crashes would.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3 onwards), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _parents() -> dict[int, int]:
    """Every process's parent PID, from one pass over /proc."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None and len(fields) > 1:
            parents[int(name)] = int(fields[1])
    return parents


def process_trees(roots: Iterable[int]) -> dict[int, list[int]]:
    """Each root PID with every live descendant of it (the root first)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    trees = {}
    for root in roots:
        tree, todo = [], [root]
        while todo:
            pid = todo.pop()
            if pid in tree:  # a PID reused while we read /proc; never loop
                continue
            tree.append(pid)
            todo.extend(children.get(pid, ()))
        trees[root] = tree
    return trees


@dataclass(frozen=True, slots=True)
class TreeUsage:
    """What one member's process tree has used since its processes started."""

    cpu_s: float
    """User + system CPU seconds of every process in the tree and the children it reaped."""
    write_bytes: int
    """Bytes the live processes handed to write/send calls (sockets and files alike)."""
    processes: int
    root_cpu_s: float
    """The root process's own CPU seconds (a partitioned member's supervisor alone)."""


def _own_usage(pid: int) -> tuple[int, int, int] | None:
    """(clock ticks of its own CPU, of its reaped children's, bytes written) of one process."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 15:
        return None
    own = int(fields[11]) + int(fields[12])  # utime, stime
    reaped = int(fields[13]) + int(fields[14])  # cutime, cstime
    written = 0
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    written = int(line.split()[1])
    except (OSError, ValueError):
        pass  # not ours to read (or gone): CPU still counts
    return own, reaped, written


def tree_usage(roots: Sequence[int]) -> list[TreeUsage]:
    """What each root's process tree has used, in the order of ``roots``."""
    trees = process_trees(roots)
    out = []
    for root in roots:
        ticks = written = count = root_ticks = 0
        for pid in trees[root]:
            own = _own_usage(pid)
            if own is None:
                continue
            ticks += own[0] + own[1]
            written += own[2]
            count += 1
            if pid == root:
                root_ticks = own[0]
        out.append(TreeUsage(ticks / _CLK_TCK, written, count, root_ticks / _CLK_TCK))
    return out


def thread_cpu_s(pid: int) -> float:
    """CPU seconds of the live threads of one process, to the nanosecond (schedstat),
    for short measurements where /proc/PID/stat's clock ticks (10 ms) are too coarse.
    Threads that have ended are not counted."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _kill_recorded(recorded: Sequence[tuple[int, str | None]], sig: int) -> None:
    """Signals the processes recorded earlier, each only if it is still the same process
    (same PID and start time), so a PID the kernel gave to someone else is left alone."""
    for pid, started in recorded:
        if started is not None and _start_time(pid) == started:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


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

    def _descendants(self, proc: subprocess.Popen[bytes]) -> list[tuple[int, str | None]]:
        """The processes below ``proc`` (PID, start time), the deepest last."""
        tree = process_trees([proc.pid])[proc.pid][1:]
        return [(pid, _start_time(pid)) for pid in tree]

    def kill(self, i: int) -> None:
        """kill -9 member ``i`` (the process and every process below it) and reap it."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            below = self._descendants(proc)
            os.kill(proc.pid, signal.SIGKILL)
            _kill_recorded(below, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self, i: int) -> None:
        self._spawn(i)

    def stop(self) -> None:
        """SIGTERM every member, then SIGKILL any still running after 10 s; a member's own
        children (a partitioned member's partitions) are its to stop, and any still
        running once it has exited are killed by PID."""
        below: list[tuple[int, str | None]] = []
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                below += self._descendants(proc)
                proc.terminate()
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        _kill_recorded(below, signal.SIGKILL)
