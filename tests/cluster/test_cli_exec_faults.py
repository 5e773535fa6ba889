"""`dlm exec` loses the cluster while a second client waits: CMD must be gone before the grant.

The cluster is healthy (three real members); only `dlm exec` is cut off or
killed or stopped. Its ``--cluster`` is a fault-injecting proxy in front of
the leader (a follower would redirect it to the leader's real address, around
the proxy), and a second client waits for the same key, straight to the
members. CMD ignores SIGTERM and appends a wall-clock timestamp to a file
every 20 ms; one machine, so one clock. The checks: CMD's last heartbeat comes
before the leader granted the lock to the second client (``granted_at_ms``,
stamped when the leader proposed the expiry that granted it), and nothing of
CMD is running by then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from dlm.client import Client
from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.proxy import Proxy

pytestmark = pytest.mark.cluster

TTL = "2s"
WAIT_S = 20.0

HEARTBEAT = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out, pids, mode = sys.argv[1], sys.argv[2], sys.argv[3]

def note_pid(role):
    fd = os.open(pids, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, f"{role} {os.getpid()}\\n".encode())
    os.close(fd)

def beat(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        os.write(fd, f"{time.time():.6f}\\n".encode())
        time.sleep(0.02)

if mode == "daemon" and os.fork() == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    note_pid("daemon")
    beat(out + ".daemon")
    os._exit(0)
note_pid("cmd")
beat(out)
"""


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def has_beats(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def last_beat(path: Path) -> float:
    beats = []
    for line in path.read_text().splitlines():
        try:
            beats.append(float(line))
        except ValueError:  # a line cut short by SIGKILL
            continue
    assert beats, f"no heartbeat in {path}"
    return max(beats)


class Waiter:
    """The second client: queues for ``key`` straight to the members, from a thread."""

    def __init__(self, cluster: Cluster, key: str) -> None:
        self.key = key
        self.client: Client = cluster.client()
        self.lease = self.client.open_lease(30_000)
        self.granted_wall: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        try:
            self.client.acquire(self.lease, self.key, wait=WAIT_S)
            self.granted_wall = time.time()
        except BaseException as exc:
            self.error = exc

    def granted_at(self) -> float:
        """When the leader granted it (its wall clock, seconds), once it has."""
        self.thread.join(WAIT_S + 5)
        assert not self.thread.is_alive() and self.error is None, self.error
        with Client(self.client.members) as probe:
            holders = probe.get(self.key).holders
        (mine,) = [h for h in holders if h.lease == self.lease.id]
        assert mine.granted_at_ms is not None
        return mine.granted_at_ms / 1000.0

    def close(self) -> None:
        try:
            self.client.close_lease(self.lease)
        except Exception:
            pass
        self.client.close()


class Run:
    """`dlm exec` through a proxy, its CMD, and a waiter; every process killed by PID after."""

    def __init__(self, cluster: Cluster, tmp: Path, key: str, mode: str) -> None:
        self.cluster = cluster
        self.key = key
        self.out = tmp / "beats"
        self.pids = tmp / "pids"
        self.mode = mode
        (tmp / "cwd").mkdir()
        leader = cluster.wait_for_leader(timeout=15.0)
        status = leader.status()
        assert status is not None
        self.term = status["term"]
        self.link = Proxy(leader.address).start()
        self.dlm = Dlm(self.link.address, tmp / "cwd")
        self.proc: subprocess.Popen[str] | None = None
        self.extra_pids: list[int] = []
        self.waiter: Waiter | None = None

    def start(self) -> None:
        self.proc = self.dlm.start(
            "exec", "--lock", self.key, "--ttl", TTL, "--",
            sys.executable, "-c", HEARTBEAT, str(self.out), str(self.pids), self.mode,
        )  # fmt: skip
        roles = {"cmd", "daemon"} if self.mode == "daemon" else {"cmd"}
        wait_for(lambda: roles <= set(self.roles()), WAIT_S, "CMD's processes to start")
        for role in roles:
            path = self.out if role == "cmd" else Path(f"{self.out}.daemon")
            wait_for(partial(has_beats, path), WAIT_S, f"{role} beats")
        guard = parent_of(self.roles()["cmd"])
        self.extra_pids = [*self.roles().values(), *([guard] if guard else [])]
        self.waiter = Waiter(self.cluster, self.key)
        with self.cluster.client() as probe:
            wait_for(lambda: probe.get(self.key).waiting, WAIT_S, "the second client to queue")

    def roles(self) -> dict[str, int]:
        if not self.pids.exists():
            return {}
        return {r: int(p) for r, p in (line.split() for line in self.pids.read_text().splitlines())}

    def gaps(self) -> dict[str, float]:
        """Seconds from each process's last heartbeat to the grant; asserts they are dead."""
        assert self.waiter is not None
        granted = self.waiter.granted_at()
        assert self.waiter.granted_wall is not None
        alive = {role: pid for role, pid in self.roles().items() if running(pid)}
        assert alive == {}, f"still running when the lock was granted again: {alive}"
        gaps = {"cmd": granted - last_beat(self.out)}
        if self.mode == "daemon":
            gaps["daemon"] = granted - last_beat(Path(f"{self.out}.daemon"))
        return gaps

    def check_leader_stayed(self) -> None:
        leader = self.cluster.leader_now()
        status = leader.status() if leader is not None else None
        assert status is not None and status["term"] == self.term, (
            "the leader changed during the test; the proxy setup needs a stable leader"
        )

    def cleanup(self) -> None:
        for pid in self.extra_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.proc is not None:
            stop(self.proc)
        if self.waiter is not None:
            self.waiter.close()
        self.link.stop()


@pytest.fixture
def make_run(shared: Cluster, tmp_path: Path) -> Iterator[Callable[[str, str], Run]]:
    made: list[Run] = []

    def make(key: str, mode: str = "plain") -> Run:
        run = Run(shared, tmp_path, key, mode)
        made.append(run)
        run.start()
        return run

    yield make
    for run in made:
        run.cleanup()


def report(what: str, gaps: dict[str, Any]) -> None:
    shown = ", ".join(f"{role} {gap * 1000:.0f} ms" for role, gap in gaps.items())
    print(f"\n{what}: last heartbeat to the next grant: {shown}")


def test_a_cut_link_stops_cmd_before_the_lock_is_granted_again(
    make_run: Callable[[str, str], Run],
) -> None:
    run = make_run("faults-cut", "plain")
    run.link.cut()
    gaps = run.gaps()
    assert run.proc is not None
    code, _, err = finish(run.proc)
    run.check_leader_stayed()
    report("cut link", gaps)
    assert gaps["cmd"] > 0
    assert code == 77, err
    assert "lost the lock on 'faults-cut'" in err


def test_a_sigkilled_dlm_exec_still_stops_cmd_in_time(make_run: Callable[[str, str], Run]) -> None:
    run = make_run("faults-kill", "plain")
    assert run.proc is not None
    os.kill(run.proc.pid, signal.SIGKILL)
    gaps = run.gaps()
    run.check_leader_stayed()
    report("dlm exec SIGKILLed", gaps)
    assert gaps["cmd"] > 0
    assert run.proc.wait(WAIT_S) == -signal.SIGKILL


def test_a_sigstopped_dlm_exec_still_stops_cmd_in_time(make_run: Callable[[str, str], Run]) -> None:
    run = make_run("faults-stop", "plain")
    assert run.proc is not None
    os.kill(run.proc.pid, signal.SIGSTOP)
    try:
        gaps = run.gaps()
    finally:
        os.kill(run.proc.pid, signal.SIGCONT)
    code, _, err = finish(run.proc)
    run.check_leader_stayed()
    report("dlm exec SIGSTOPped", gaps)
    assert gaps["cmd"] > 0
    assert code == 77, err


def test_a_setsid_daemon_of_cmd_is_gone_before_the_lock_is_granted_again(
    make_run: Callable[[str, str], Run],
) -> None:
    run = make_run("faults-daemon", "daemon")
    run.link.cut()
    gaps = run.gaps()
    assert run.proc is not None
    code, _, err = finish(run.proc)
    run.check_leader_stayed()
    report("cut link, CMD with a setsid daemon", gaps)
    assert gaps["cmd"] > 0
    assert gaps["daemon"] > 0
    assert code == 77, err
