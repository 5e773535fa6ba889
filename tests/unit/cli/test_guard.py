"""The guard of `dlm exec`: its timing rules with a fake clock, then the process itself.

The process tests drive a real guard through its handle (dlm.cli.guard.Guard)
the way the supervisor does, without a cluster: they hand it a deadline, let
it start a CMD, and watch what happens to CMD's processes. A CMD says it is
running by writing its pid to a file the test polls (bounded); every process
a test starts is killed by PID at the end, whatever happened.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlm.cli import exec_rules as rules
from dlm.cli import guard as g
from dlm.cli.guard import Guard
from dlm.client.clock import lease_clock
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
    assert rules.default_grace(ttl_ms) == grace
    assert rules.grace_problem(grace, ttl_ms) is None


@pytest.mark.parametrize(("grace", "ttl_ms"), [(1.0, 2_000), (15.0, 30_000), (20.0, 30_000)])
def test_a_grace_of_half_the_ttl_or_more_is_refused(grace: float, ttl_ms: int) -> None:
    assert rules.grace_problem(grace, ttl_ms) == "it must be less than half the TTL"


def test_sigterm_at_deadline_less_grace_sigkill_just_before_the_deadline() -> None:
    d = 100.0
    assert rules.term_time(d, 5.0) == 95.0
    assert rules.kill_time(d, 5.0) == d - rules.KILL_LEAD_S
    # A grace shorter than the SIGKILL lead: both at once, still before D.
    assert rules.term_time(d, 0.0) == rules.kill_time(d, 0.0) == d - rules.KILL_LEAD_S


def test_an_immediate_stop_sigterms_now_and_sigkills_after_the_grace_but_never_after_d() -> None:
    d = 100.0
    assert rules.term_time(d, 5.0, stop_at=50.0) == 50.0
    assert rules.kill_time(d, 5.0, stop_at=50.0) == 55.0
    # Asked to stop 2 s before D: SIGKILL cannot wait out the grace.
    assert rules.term_time(d, 5.0, stop_at=98.0) == 95.0  # the deadline's SIGTERM came first
    assert rules.kill_time(d, 5.0, stop_at=98.0) == d - rules.KILL_LEAD_S


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def test_next_signal_walks_the_timeline_with_a_fake_clock() -> None:
    clock = FakeClock(0.0)
    d, grace = 10.0, 2.0
    guard = rules.GuardRules(grace)
    guard.offer(d)
    # Nothing due: look again at the SIGTERM time, or within RECHECK_S, whichever is first.
    assert guard.next_signal(clock.now) == (None, rules.RECHECK_S)
    clock.advance(7.95)
    assert guard.next_signal(clock.now) == (None, 8.0)
    clock.advance(0.05)
    due, again = guard.next_signal(clock.now)
    assert due == rules.TERM and again == pytest.approx(8.0 + rules.RECHECK_S)
    # Once SIGTERM is out, nothing until SIGKILL ...
    clock.advance(2.0 - rules.KILL_LEAD_S - 0.05)
    assert guard.next_signal(clock.now) == (None, d - rules.KILL_LEAD_S)
    clock.advance(0.05)
    due, again = guard.next_signal(clock.now)
    # ... which repeats until nothing is left, every KILL_REPEAT_S,
    assert due == rules.KILL and again == pytest.approx(clock.now + rules.KILL_REPEAT_S)
    # then, a second on (a process in uninterruptible sleep), less eagerly.
    clock.advance(1.0)
    due, again = guard.next_signal(clock.now)
    assert due == rules.KILL and again == pytest.approx(clock.now + rules.KILL_REPEAT_SLOW_S)


def test_the_guard_starts_cmd_only_before_its_sigterm_time() -> None:
    guard = rules.GuardRules(grace=2.0)
    assert guard.may_spawn(now=7.9, deadline=10.0)
    assert guard.spawned(now=7.95)
    assert guard.next_signal(7.95)[0] is None
    late = rules.GuardRules(grace=2.0)
    assert not late.may_spawn(now=8.0, deadline=10.0)  # at D - grace: too late to start


def test_a_cmd_that_started_past_its_sigterm_time_is_sigkilled_at_once() -> None:
    guard = rules.GuardRules(grace=2.0)
    assert guard.may_spawn(now=7.9, deadline=10.0)
    # The guard was paused between its look at the clock and the spawn.
    assert not guard.spawned(now=8.5)
    assert guard.next_signal(8.5)[0] == rules.KILL  # no grace: it should never have run
    assert guard.deadline_passed(8.5)


def test_a_deadline_that_passed_in_a_suspend_is_seen_on_the_first_wake_up() -> None:
    guard = rules.GuardRules(grace=2.0)
    guard.offer(100.0)
    due, wake_at = guard.next_signal(0.0)
    assert due is None and wake_at == rules.RECHECK_S <= 0.1
    # A suspend of an hour: select slept RECHECK_S of monotonic time, the lease clock ran on.
    assert guard.next_signal(3600.0)[0] == rules.KILL


def test_the_supervisor_orders_the_spawn_only_before_cmds_sigterm_time() -> None:
    gate = rules.StartGate(grace=2.0)
    d, interval = 30.0, 10.0
    assert gate.before_start(now=0.0, deadline=d, interval=interval) == rules.START
    assert gate.before_start(now=20.0, deadline=d, interval=interval) == rules.RENEW
    assert gate.before_start(now=28.0, deadline=d, interval=interval) == rules.TOO_LATE
    assert gate.may_order_spawn(now=27.9, deadline=d)
    assert not gate.may_order_spawn(now=28.0, deadline=d)  # paused after the renewal


def test_a_renewal_extends_the_deadline_only_before_sigterm() -> None:
    assert rules.extended(10.0, 20.0, term_sent=False) == 20.0
    assert rules.extended(10.0, 5.0, term_sent=False) == 10.0  # never backwards
    assert rules.extended(10.0, 20.0, term_sent=True) == 10.0  # too late: nothing is taken back


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
    deadline = lease_clock() + timeout
    while not condition():  # type: ignore[operator]
        assert lease_clock() < deadline, f"timed out waiting for {what}"
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
        end = lease_clock() + WAIT_S
        while not any(k == kind for k, _ in seen):
            assert lease_clock() < end, f"no {kind!r} report; got {seen}"
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
    r.spawn(lease_clock() + 60)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "7")


def test_the_guard_reports_a_signal_as_128_plus_n(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 1.0, "import os; os.kill(os.getpid(), 9)")
    r.spawn(lease_clock() + 60)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "137")


def test_the_guard_is_cmds_parent_and_leads_a_group_of_its_own(
    tmp_path: Path, runs: list[Run]
) -> None:
    r = _run(runs, tmp_path, 1.0, STUBBORN)
    r.spawn(lease_clock() + 60)
    (cmd,) = r.reported_pids(1)
    assert _parent_of(cmd) == r.guard.pid
    assert os.getpgid(r.guard.pid) == r.guard.pid
    assert os.getpgid(cmd) == cmd == os.getsid(cmd)


def test_a_spawn_failure_is_reported_with_its_errno(tmp_path: Path) -> None:
    guard = Guard.start("/nonexistent/program", ["program"], 1.0)
    try:
        guard.spawn({}, lease_clock() + 60)
        assert guard.next_report() == (g.SPAWN_FAILED, "2")  # ENOENT
    finally:
        guard.close(wait=True)


def test_a_guard_given_a_past_deadline_does_not_start_cmd(tmp_path: Path, runs: list[Run]) -> None:
    # The spawn order came after CMD's SIGTERM time (a supervisor paused after its own
    # check, an order that waited in the pipe): CMD must not run at all.
    r = _run(runs, tmp_path, 0.3, STUBBORN)
    r.guard.spawn({"DLM_TEST_PIDS": str(r.pids)}, lease_clock() - 1.0)
    assert r.guard.next_report() == (g.NOT_STARTED, "")
    assert r.guard.next_report() is None  # the guard exits, having started nothing
    assert not r.pids.exists()


def test_a_cmd_started_past_its_sigterm_time_is_sigkilled_at_once(
    tmp_path: Path, runs: list[Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A guard paused between its look at the clock and the spawn, played by a seam that
    # lets the SIGTERM time pass before it spawns. With a 5 s grace, SIGTERM would be the
    # timeline's next step: CMD must get SIGKILL instead, and never see a SIGTERM.
    grace = 5.0
    deadline = lease_clock() + grace + 0.3
    stop_time = rules.term_time(deadline, grace)
    real_spawn = g.spawn

    def paused_spawn(*args: Any) -> int:
        while lease_clock() < stop_time:  # the pause: bounded by stop_time
            select.select([], [], [], 0.01)
        return real_spawn(*args)

    monkeypatch.setattr(g, "_spawn_seam", paused_spawn)
    termed = tmp_path / "termed"
    script = (
        "import os, signal, time\n"
        f"def on_term(*_): open({str(termed)!r}, 'w').close()\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "fd = os.open(os.environ['DLM_TEST_PIDS'], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
        "time.sleep(60)\n"
    )
    r = _run(runs, tmp_path, grace, script)
    r.spawn(deadline)
    reports = r.reports_until(g.DONE)
    assert reports[-1] == (g.DONE, "137")
    assert (g.DEADLINE, "") in reports  # the supervisor hears the lock is lost
    assert not termed.exists()


def test_without_renewals_cmd_is_killed_before_the_deadline(
    tmp_path: Path, runs: list[Run]
) -> None:
    grace = 0.3
    r = _run(runs, tmp_path, grace, STUBBORN)
    deadline = lease_clock() + 1.5
    r.spawn(deadline)
    (cmd,) = r.reported_pids(1)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "137")  # SIGTERM ignored: SIGKILL
    assert not _running(cmd)
    assert lease_clock() < deadline  # reaped, hence gone, before D


def test_a_renewal_before_sigterm_postpones_it(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 0.3, STUBBORN)
    first = lease_clock() + 1.0
    r.spawn(first)
    (cmd,) = r.reported_pids(1)
    r.guard.extend(lease_clock() + 60)
    # What is tested is that nothing happens: let the first deadline pass, then look.
    _poll(lambda: lease_clock() > first + 0.2, "the first deadline to pass")
    assert _running(cmd)


def test_when_dlm_hangs_up_the_guard_stops_cmd_at_once(tmp_path: Path, runs: list[Run]) -> None:
    grace = 0.3
    r = _run(runs, tmp_path, grace, STUBBORN)
    r.spawn(lease_clock() + 60)
    (cmd,) = r.reported_pids(1)
    hung_up = lease_clock()
    os.close(r.guard.control)  # as when dlm is SIGKILLed
    _poll(lambda: not _running(cmd), "CMD to die")
    assert lease_clock() - hung_up < grace + 2.0  # SIGKILL after the grace, not at D
    _poll(lambda: not _running(r.guard.pid), "the guard to exit")


def test_stop_now_sigterms_and_then_sigkills_after_the_grace(
    tmp_path: Path, runs: list[Run]
) -> None:
    r = _run(runs, tmp_path, 0.2, STUBBORN)
    r.spawn(lease_clock() + 60)
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
    r.spawn(lease_clock() + 60)
    r.reported_pids(1)
    r.guard.forward(signal.SIGHUP)
    assert r.reports_until(g.DONE)[-1] == (g.DONE, "42")


def test_a_setsid_daemon_is_reparented_to_the_guard_and_killed_with_cmd(
    tmp_path: Path, runs: list[Run]
) -> None:
    r = _run(runs, tmp_path, 0.2, WITH_DAEMON)
    cmd = r.spawn(lease_clock() + 60)
    pids = r.reported_pids(2)
    (daemon,) = set(pids) - {cmd}
    _poll(lambda: _parent_of(daemon) == r.guard.pid, "the daemon to be reparented to the guard")
    assert os.getsid(daemon) != os.getsid(cmd)  # it left CMD's session and group
    r.guard.stop_now()
    assert r.reports_until(g.DONE)[-1][0] == g.DONE
    assert not any(_running(p) for p in pids)


def test_leftovers_are_stopped_when_cmd_ends_and_reported(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 0.2, LEAVES_DAEMON)
    r.spawn(lease_clock() + 60)
    pids = r.reported_pids(2)
    seen = r.reports_until(g.DONE)
    assert (g.LEFTOVERS, "") in seen
    assert seen[-1] == (g.DONE, "5")
    assert not any(_running(p) for p in pids)


def test_descendants_lists_the_whole_tree_below_a_process(tmp_path: Path, runs: list[Run]) -> None:
    r = _run(runs, tmp_path, 1.0, WITH_DAEMON)
    r.spawn(lease_clock() + 60)
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


def test_the_guard_becomes_the_subreaper_of_cmds_orphans_without_the_ctypes_package() -> None:
    # In a fresh interpreter: a subreaper test process would adopt every orphan of the
    # tests after it. waitpid of the grandchild succeeds only if it was reparented to the
    # probe when its parent exited.
    import subprocess

    probe = """
import os, sys
from dlm.cli import guard
assert guard._become_subreaper() is True
assert "ctypes" not in sys.modules, "the ctypes package was imported"
hold_r, hold_w = os.pipe()
said_r, said_w = os.pipe()
child = os.fork()
if child == 0:
    grandchild = os.fork()
    if grandchild == 0:
        os.close(hold_w)
        os.read(hold_r, 1)  # until the probe closes its end
        os._exit(0)
    os.write(said_w, grandchild.to_bytes(4, "big"))
    os._exit(0)
os.close(hold_r)
os.close(said_w)
grandchild = int.from_bytes(os.read(said_r, 4), "big")
os.waitpid(child, 0)  # the grandchild is an orphan now: ours, if we are its subreaper
os.close(hold_w)
pid, status = os.waitpid(grandchild, 0)
print("adopted" if pid == grandchild and os.waitstatus_to_exitcode(status) == 0 else "lost")
"""
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "adopted"
