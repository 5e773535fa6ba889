"""The guard of `dlm exec`: its timing rules with a fake clock, then the process itself.

The process tests drive a real guard through its handle (dlm.cli.guard.Guard)
the way the supervisor does, without a cluster: they hand it a deadline, let
it start a CMD, and watch what happens to CMD's processes. A CMD says it is
running by writing its pid to a file the test polls (bounded); every process
a test starts is killed by PID at the end, whatever happened.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlm.cli import guard as g
from dlm.cli.guard import Guard
from dlm.client.core import LEASE_SLACK_S, lease_deadline

WAIT_S = 20.0


# ---------------------------------------------------------------------------
# Timing rules
# ---------------------------------------------------------------------------


def test_the_deadline_is_the_renewal_send_time_plus_ttl_less_the_drift_margin() -> None:
    assert lease_deadline(100.0, 30_000) == pytest.approx(100.0 + 30.0 - 0.3 - 0.05)
    assert lease_deadline(100.0, 2_000) == pytest.approx(100.0 + 2.0 - 0.02 - 0.05)


@pytest.mark.parametrize("ttl_ms", [1_000, 2_000, 10_000, 30_000, 3_600_000])
def test_the_deadline_falls_before_the_leaders_expiry_at_the_worst_clock_rates(
    ttl_ms: int,
) -> None:
    # The leader receives the renewal no earlier than we sent it, and counts the TTL on a
    # clock up to 0.5% fast while ours may be 0.5% slow: in our seconds its TTL lasts
    # ttl * 0.995 / 1.005. D must come first, by at least the fixed slack.
    sent = 1_000.0
    leader_expiry = sent + ttl_ms / 1000.0 * 0.995 / 1.005
    assert lease_deadline(sent, ttl_ms) <= leader_expiry - LEASE_SLACK_S


@pytest.mark.parametrize(
    ("ttl_ms", "grace"), [(1_000, 0.25), (2_000, 0.5), (20_000, 5.0), (30_000, 5.0)]
)
def test_default_grace_is_the_smaller_of_5s_and_a_quarter_ttl(ttl_ms: int, grace: float) -> None:
    assert g.default_grace(ttl_ms) == grace
    assert g.grace_problem(grace, ttl_ms) is None


@pytest.mark.parametrize(("grace", "ttl_ms"), [(1.0, 2_000), (15.0, 30_000), (20.0, 30_000)])
def test_a_grace_of_half_the_ttl_or_more_is_refused(grace: float, ttl_ms: int) -> None:
    assert g.grace_problem(grace, ttl_ms) == "it must be less than half the TTL"


def test_sigterm_at_deadline_less_grace_sigkill_just_before_the_deadline() -> None:
    d = 100.0
    assert g.term_time(d, 5.0) == 95.0
    assert g.kill_time(d, 5.0) == d - g.KILL_LEAD_S
    # A grace shorter than the SIGKILL lead: both at once, still before D.
    assert g.term_time(d, 0.0) == g.kill_time(d, 0.0) == d - g.KILL_LEAD_S


def test_an_immediate_stop_sigterms_now_and_sigkills_after_the_grace_but_never_after_d() -> None:
    d = 100.0
    assert g.term_time(d, 5.0, stop_at=50.0) == 50.0
    assert g.kill_time(d, 5.0, stop_at=50.0) == 55.0
    # Asked to stop 2 s before D: SIGKILL cannot wait out the grace.
    assert g.term_time(d, 5.0, stop_at=98.0) == 95.0  # the deadline's SIGTERM came first
    assert g.kill_time(d, 5.0, stop_at=98.0) == d - g.KILL_LEAD_S


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def test_next_signal_walks_the_timeline_with_a_fake_clock() -> None:
    clock = FakeClock(0.0)
    d, grace = 10.0, 2.0
    assert g.next_signal(clock.now, d, grace, None, False) == (None, 8.0)
    clock.advance(7.999)
    assert g.next_signal(clock.now, d, grace, None, False) == (None, 8.0)
    clock.advance(0.001)
    assert g.next_signal(clock.now, d, grace, None, False) == (signal.SIGTERM, d - g.KILL_LEAD_S)
    # Once SIGTERM is out, nothing until SIGKILL ...
    assert g.next_signal(clock.now, d, grace, None, True) == (None, d - g.KILL_LEAD_S)
    clock.advance(2.0 - g.KILL_LEAD_S)
    due, again = g.next_signal(clock.now, d, grace, None, True)
    # ... which repeats until nothing is left, every KILL_REPEAT_S,
    assert due == signal.SIGKILL and again == pytest.approx(clock.now + g.KILL_REPEAT_S)
    # then, a second on (a process in uninterruptible sleep), less eagerly.
    clock.advance(1.0)
    due, again = g.next_signal(clock.now, d, grace, None, True)
    assert due == signal.SIGKILL and again == pytest.approx(clock.now + g.KILL_REPEAT_SLOW_S)


def test_a_renewal_extends_the_deadline_only_before_sigterm() -> None:
    assert g.extended(10.0, 20.0, term_sent=False) == 20.0
    assert g.extended(10.0, 5.0, term_sent=False) == 10.0  # never backwards
    assert g.extended(10.0, 20.0, term_sent=True) == 10.0  # too late: nothing is taken back


def test_exit_codes_read_as_a_shell_reads_them() -> None:
    assert g.exit_code_of(0) == 0
    assert g.exit_code_of(3) == 3
    assert g.exit_code_of(-signal.SIGKILL) == 137


# ---------------------------------------------------------------------------
# The guard process
# ---------------------------------------------------------------------------


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _poll(condition: object, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Run:
    """One guard and whatever it starts; ``cleanup`` kills all of it by PID."""

    def __init__(self, tmp: Path, grace: float, script: str) -> None:
        self.tmp = tmp
        self.pids = tmp / "pids"
        self.guard = Guard.start(sys.executable, [sys.executable, "-c", script], grace)
        self.started: list[int] = [self.guard.pid]

    def spawn(self, deadline: float) -> int:
        self.guard.spawn({"DLM_TEST_PIDS": str(self.pids)}, deadline)
        report = self.guard.next_report()
        assert report is not None and report[0] == g.STARTED, report
        pid = int(report[1])
        self.started.append(pid)
        return pid

    def reported_pids(self, count: int) -> list[int]:
        """The pids the CMD's processes wrote, one per line, once ``count`` are there."""

        def enough() -> bool:
            return self.pids.exists() and len(self.pids.read_text().split()) >= count

        _poll(enough, f"{count} pids in {self.pids}")
        pids = [int(p) for p in self.pids.read_text().split()]
        self.started.extend(pids)
        return pids

    def reports_until(self, kind: str) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        end = time.monotonic() + WAIT_S
        while not any(k == kind for k, _ in seen):
            assert time.monotonic() < end, f"no {kind!r} report; got {seen}"
            report = self.guard.next_report()
            assert report is not None, f"guard ended before {kind!r}; got {seen}"
            seen.append(report)
        return seen

    def cleanup(self) -> None:
        for pid in reversed(self.started):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.guard.close(wait=True)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Run]]:
    made: list[Run] = []
    yield made
    for r in made:
        r.cleanup()


def _run(runs: list[Run], tmp: Path, grace: float, script: str) -> Run:
    r = Run(tmp, grace, script)
    runs.append(r)
    return r


# The test CMDs: each process appends its pid to $DLM_TEST_PIDS and ignores SIGTERM.
PROLOGUE = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "fd = os.open(os.environ['DLM_TEST_PIDS'], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
    "def say_pid(): os.write(fd, f'{os.getpid()}\\n'.encode())\n"
)
STUBBORN = PROLOGUE + "say_pid()\ntime.sleep(60)\n"
# A classic daemon: fork, setsid, fork again, the middle one exits at once.
DAEMON = (
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork():\n"
    "        os._exit(0)\n"
    "    say_pid()\n"
    "    time.sleep(60)\n"
    "    os._exit(0)\n"
)
WITH_DAEMON = PROLOGUE + DAEMON + "say_pid()\ntime.sleep(60)\n"
LEAVES_DAEMON = PROLOGUE + DAEMON + "say_pid()\nsys.exit(5)\n"


def test_the_guard_reports_cmds_exit_code(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 1.0, "import sys; sys.exit(7)")
    r.spawn(time.monotonic() + 60)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "7")


def test_the_guard_reports_a_signal_as_128_plus_n(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 1.0, "import os; os.kill(os.getpid(), 9)")
    r.spawn(time.monotonic() + 60)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "137")


def test_the_guard_is_cmds_parent_and_leads_a_group_of_its_own(
    tmp_path: Path, runs: list[Run]
) -> None:
    r = _run(runs, tmp_path, 1.0, STUBBORN)
    r.spawn(time.monotonic() + 60)
    (cmd,) = r.reported_pids(1)
    assert _parent_of(cmd) == r.guard.pid
    assert os.getpgid(r.guard.pid) == r.guard.pid
    assert os.getpgid(cmd) == cmd == os.getsid(cmd)


def test_a_spawn_failure_is_reported_with_its_errno(tmp_path: Path) -> None:
    guard = Guard.start("/nonexistent/program", ["program"], 1.0)
    try:
        guard.spawn({}, time.monotonic() + 60)
        assert guard.next_report() == (g.SPAWN_FAILED, "2")  # ENOENT
    finally:
        guard.close(wait=True)


def test_without_renewals_cmd_is_killed_before_the_deadline(
    tmp_path: Path, runs: list[Run]
) -> None:
    grace = 0.3
    r = _run(runs, tmp_path, grace, STUBBORN)
    deadline = time.monotonic() + 1.5
    r.spawn(deadline)
    (cmd,) = r.reported_pids(1)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "137")  # SIGTERM ignored: SIGKILL
    assert not _running(cmd)
    assert time.monotonic() < deadline  # reaped, hence gone, before D


def test_a_renewal_before_sigterm_postpones_it(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 0.3, STUBBORN)
    first = time.monotonic() + 1.0
    r.spawn(first)
    (cmd,) = r.reported_pids(1)
    r.guard.extend(time.monotonic() + 60)
    # What is tested is that nothing happens: let the first deadline pass, then look.
    _poll(lambda: time.monotonic() > first + 0.2, "the first deadline to pass")
    assert _running(cmd)


def test_when_dlm_hangs_up_the_guard_stops_cmd_at_once(tmp_path: Path, runs: list[Run]) -> None:
    grace = 0.3
    r = _run(runs, tmp_path, grace, STUBBORN)
    r.spawn(time.monotonic() + 60)
    (cmd,) = r.reported_pids(1)
    hung_up = time.monotonic()
    os.close(r.guard.control)  # as when dlm is SIGKILLed
    _poll(lambda: not _running(cmd), "CMD to die")
    assert time.monotonic() - hung_up < grace + 2.0  # SIGKILL after the grace, not at D
    _poll(lambda: not _running(r.guard.pid), "the guard to exit")


def test_stop_now_sigterms_and_then_sigkills_after_the_grace(
    tmp_path: Path, runs: list[Run]
) -> None:
    r = _run(runs, tmp_path, 0.2, STUBBORN)
    r.spawn(time.monotonic() + 60)
    (cmd,) = r.reported_pids(1)
    r.guard.stop_now()
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "137")
    assert not _running(cmd)


def test_a_forwarded_signal_reaches_cmds_group(tmp_path: Path, runs: list[Run]) -> None:
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGHUP, lambda *_: sys.exit(42))\n"
        "fd = os.open(os.environ['DLM_TEST_PIDS'], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
        "time.sleep(60)\n"
    )
    r = _run(runs, tmp_path, 1.0, script)
    r.spawn(time.monotonic() + 60)
    r.reported_pids(1)
    r.guard.forward(signal.SIGHUP)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "42")


def test_a_setsid_daemon_is_reparented_to_the_guard_and_killed_with_cmd(
    tmp_path: Path, runs: list[Run]
) -> None:
    r = _run(runs, tmp_path, 0.2, WITH_DAEMON)
    cmd = r.spawn(time.monotonic() + 60)
    pids = r.reported_pids(2)
    (daemon,) = set(pids) - {cmd}
    _poll(lambda: _parent_of(daemon) == r.guard.pid, "the daemon to be reparented to the guard")
    assert os.getsid(daemon) != os.getsid(cmd)  # it left CMD's session and group
    r.guard.stop_now()
    assert r.reports_until(g.DONE)[-1][0] == g.DONE
    assert not any(_running(p) for p in pids)


def test_leftovers_are_stopped_when_cmd_ends_and_reported(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 0.2, LEAVES_DAEMON)
    r.spawn(time.monotonic() + 60)
    pids = r.reported_pids(2)
    seen = r.reports_until(g.DONE)
    assert (g.LEFTOVERS, "") in seen
    assert seen[-1] == (g.DONE, "5")
    assert not any(_running(p) for p in pids)


def test_descendants_lists_the_whole_tree_below_a_process(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 1.0, WITH_DAEMON)
    r.spawn(time.monotonic() + 60)
    pids = r.reported_pids(2)
    _poll(
        lambda: set(pids) <= {pid for pid, _ in g.descendants(r.guard.pid)},
        "both processes below the guard",
    )
    # The walk through the children files and the full scan of /proc agree.
    assert sorted(g.descendants(r.guard.pid)) == sorted(g._descendants_by_scan(r.guard.pid))
    groups = dict(g.descendants(r.guard.pid))
    cmd = r.started[1]
    (daemon,) = set(pids) - {cmd}
    assert groups[cmd] == cmd
    assert groups[daemon] not in (cmd, daemon)  # its group is the one its setsid parent made
    assert r.guard.pid in {pid for pid, _ in g.descendants(os.getpid())}


def test_the_heap_frozen_for_the_fork_is_given_back() -> None:
    import gc

    assert gc.get_freeze_count() == 0
    guard = Guard.start("/bin/true", ["true"], 1.0)
    assert gc.get_freeze_count() > 0  # out of the collector's reach while the guard lives
    guard.close(wait=True)
    assert gc.get_freeze_count() == 0
