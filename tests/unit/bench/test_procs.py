"""bench/procs.py: a member's CPU is its whole process tree, and kill -9 takes the tree.

A partitioned member is a supervisor with a child per partition; the benchmark's
server CPU must count the children (also one that ended and was reaped), and a
kill -9 of the member must not leave its children running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.procs import ProcessCluster, process_trees, tree_usage

# The parent starts a child that burns CPU_S of CPU, says so, and waits for a line on
# its stdin; the parent relays the child's word and, after the child has ended, reaps
# it and says "reaped". Nothing is timed: each step waits for the one before.
CPU_S = 0.3
# /proc/PID/stat counts user and system time apart, each in whole clock ticks (10 ms).
TICKS_SLACK_S = 0.05
PARENT = f"""
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c",
     "import sys, time\\n"
     "while time.process_time() < {CPU_S}: pass\\n"
     "print('burnt', flush=True)\\n"
     "sys.stdin.readline()\\n"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
sys.stdin.readline()
child.stdin.write("end\\n"); child.stdin.flush()
child.wait()
print("reaped", flush=True)
sys.stdin.readline()
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie no one has reaped yet (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_cpu_of_a_member_counts_its_children_live_and_reaped() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdin is not None and parent.stdout is not None
    try:
        child_pid, word = parent.stdout.readline().split()
        assert word == "burnt"
        assert process_trees([parent.pid])[parent.pid] == [parent.pid, int(child_pid)]
        (live,) = tree_usage([parent.pid])
        assert live.processes == 2
        assert live.cpu_s >= CPU_S - TICKS_SLACK_S
        assert live.root_cpu_s < live.cpu_s - CPU_S / 2  # the parent itself burnt little

        parent.stdin.write("next\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "reaped"
        (reaped,) = tree_usage([parent.pid])
        assert reaped.processes == 1
        assert reaped.cpu_s >= CPU_S - TICKS_SLACK_S  # the reaped child's is still the member's
    finally:
        parent.kill()
        parent.wait(timeout=10)


# A member with one child that would outlive it: neither reads anything, both sleep
# (bounded, so a failing test leaves nothing running for long).
SLEEPING_PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
time.sleep(120)
"""


class _OneMember(ProcessCluster):
    def _command(self, i: int) -> list[str]:
        return [sys.executable, "-c", SLEEPING_PARENT]


def test_kill_takes_the_member_and_every_process_below_it(tmp_path: Path) -> None:
    cluster = _OneMember(str(tmp_path), ["n1"])
    cluster.spawn_all()
    child: int | None = None
    try:
        proc = cluster.procs[0]
        assert proc is not None
        # The member's output goes to its log; wait until its child is there.
        for _ in range(3000):
            tree = process_trees([proc.pid])[proc.pid]
            if len(tree) == 2:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the member never started its child")
        child = tree[1]
        cluster.kill(0)
        assert not cluster.alive(0)
        for _ in range(3000):
            if _gone(child):
                break
            time.sleep(0.01)
        assert _gone(child), "kill -9 of a member left its child running"
    finally:
        cluster.stop()
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)
