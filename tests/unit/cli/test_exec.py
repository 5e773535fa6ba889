"""`dlm exec` with real child processes and a scripted cluster.

The child tells the test it is running by writing to a FIFO, so nothing here
waits on a clock: the helper thread blocks on the FIFO, then plays the event
under test (a lease loss, a signal to dlm) while exec supervises the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dlm.cli.main import run
from dlm.client.clock import lease_clock
from dlm.client.errors import LockHeld
from dlm.views import LockState
from tests.unit.cli.conftest import FakeClient, FakeKeepAlive

Capture = pytest.CaptureFixture[str]
JOIN_S = 30.0


class Ready:
    """A FIFO the child writes one line to once it runs; ``then`` runs a step after that."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def then(self, step: Callable[[], None]) -> None:
        def wait_and_step() -> None:
            try:
                with open(self.path, encoding="utf-8") as fifo:
                    fifo.readline()
                step()
            except BaseException as exc:  # reported by the test, not lost in the thread
                self.error = exc

        self.thread = threading.Thread(target=wait_and_step, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        if self.thread is None:
            return
        if self.thread.is_alive():
            # The child never wrote: unblock the reader so the thread ends.
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, b"\n")
                os.close(fd)
            except OSError:
                pass
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.fixture
def ready(tmp_path: Path) -> Iterator[Ready]:
    r = Ready(tmp_path / "ready")
    yield r
    r.finish()


def calls(client: FakeClient) -> list[str]:
    return [name for name, _ in client.calls]


def test_env_vars_are_exported_over_inherited_ones(
    tmp_path: Path, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLM_LOCK_KEY", "inherited")
    monkeypatch.setenv("DLM_FENCING_TOKEN", "1")
    out = tmp_path / "env"
    script = (
        'printf "%s|%s|%s|%s|%s" "$DLM_LOCK_KEY" "$DLM_FENCING_TOKEN" "$DLM_LEASE_ID" '
        f'"$DLM_LEASE_TTL_MS" "$KEEP" > {out}'
    )
    monkeypatch.setenv("KEEP", "kept")
    assert run(["exec", "--lock", "job", "--ttl", "20s", "--", "sh", "-c", script]) == 0
    assert out.read_text() == "job|4242|fakelease0000001|20000|kept"
    (client,) = FakeClient.instances
    assert calls(client) == ["open_lease", "acquire", "close_lease"]
    assert client.closed
    (keeper,) = FakeKeepAlive.instances
    assert keeper.started.is_set() and keeper.stopped


@pytest.mark.parametrize(
    ("script", "code"),
    [("exit 0", 0), ("exit 3", 3), ("exit 255", 255), ("kill -TERM $$", 143), ("kill -9 $$", 137)],
)
def test_exit_code_passes_through_or_is_128_plus_the_signal(
    script: str, code: int, fake_cluster: Any
) -> None:
    assert run(["exec", "--lock", "job", "--", "sh", "-c", script]) == code
    assert calls(FakeClient.instances[0])[-1] == "close_lease"


def test_no_descriptor_of_dlm_reaches_the_child(tmp_path: Path, fake_cluster: Any) -> None:
    r, w = os.pipe()
    os.set_inheritable(r, True)
    os.set_inheritable(w, True)
    out = tmp_path / "fds"
    probe = (
        "import os\n"
        "def is_open(fd):\n"
        "    try:\n        os.fstat(fd)\n        return True\n"
        "    except OSError:\n        return False\n"
        f"open({str(out)!r}, 'w').write(repr([fd for fd in range(3, 1024) if is_open(fd)]))\n"
    )
    try:
        assert run(["exec", "--lock", "job", "--", sys.executable, "-I", "-c", probe]) == 0
    finally:
        os.close(r)
        os.close(w)
    fds = eval(out.read_text())
    assert fds in ([], [3])  # 3: the probe's own file, opened before listing


def test_the_child_runs_in_its_own_process_group(tmp_path: Path, fake_cluster: Any) -> None:
    out = tmp_path / "pgid"
    probe = f"import os; open({str(out)!r}, 'w').write(f'{{os.getpid()}} {{os.getpgid(0)}}')"
    assert run(["exec", "--lock", "job", "--", sys.executable, "-I", "-c", probe]) == 0
    pid, pgid = out.read_text().split()
    assert pid == pgid
    assert int(pgid) != os.getpgid(0)


HOLDER = {
    "lease": "otherlease000001",
    "token": 7,
    "granted_at_ms": 1_700_000_000_000,
    "held_ms": 133_000,
    "meta": {"host": "web-3", "user": "deploy", "pid": "4121", "cmd": "backup.sh --full"},
}


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> None:
    def acquire(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        raise LockHeld("lock 'job' is held by lease otherlease000001", holders=[HOLDER])

    monkeypatch.setattr(FakeClient, "acquire", acquire)


def test_a_held_lock_means_cmd_never_runs_and_one_line_names_the_holder(
    tmp_path: Path, capsys: Capture, fake_cluster: Any, held: None
) -> None:
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", "--", "touch", str(marker)]) == 75
    assert not marker.exists()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "dlm: 'job' is held by deploy@web-3 (pid 4121, backup.sh --full) for 2m13s; "
        "not running CMD\n"
    )
    assert calls(FakeClient.instances[0]) == ["open_lease", "acquire", "close_lease"]


@pytest.mark.parametrize(
    ("extra", "code"),
    [(["-q"], 75), (["--quiet"], 75), (["--conflict-exit-code", "9"], 9),
     (["--conflict-exit-code", "75"], 75), (["--conflict-exit-code=0", "-q"], 0)],
)  # fmt: skip
def test_a_conflict_is_silent_with_quiet_or_a_conflict_exit_code(  # noqa: PLR0917
    extra: list[str], code: int, tmp_path: Path, capsys: Capture, fake_cluster: Any, held: None
) -> None:
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", *extra, "--", "touch", str(marker)]) == code
    assert not marker.exists()
    assert capsys.readouterr() == ("", "")
    assert calls(FakeClient.instances[0]) == ["open_lease", "acquire", "close_lease"]


@pytest.mark.parametrize("extra", [["--min-hold", "5m"], ["--min-hold", "30s", "--wait", "10s"]])
def test_a_conflict_under_min_hold_is_the_expected_skip_and_prints_nothing(
    extra: list[str], tmp_path: Path, capsys: Capture, fake_cluster: Any, held: None
) -> None:
    """Every host but the first of a cron tick skips: cron would mail each one's line."""
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", *extra, "--", "touch", str(marker)]) == 75
    assert not marker.exists()
    assert capsys.readouterr() == ("", "")
    assert "get" not in calls(FakeClient.instances[0])  # silent: no question to ask


@pytest.mark.parametrize(
    ("extra", "code"),
    [(["--min-hold", "5m", "-v"], 75), (["--verbose", "--min-hold", "5m"], 75),
     (["-q", "-v"], 75), (["--conflict-exit-code", "0", "-v"], 0)],
)  # fmt: skip
def test_verbose_brings_the_conflict_line_back(  # noqa: PLR0917
    extra: list[str], code: int, tmp_path: Path, capsys: Capture, fake_cluster: Any, held: None
) -> None:
    assert run(["exec", "--lock", "job", *extra, "--", "true"]) == code
    assert capsys.readouterr() == (
        "",
        "dlm: 'job' is held by deploy@web-3 (pid 4121, backup.sh --full) for 2m13s; "
        "not running CMD\n",
    )


def test_a_holder_whose_command_finished_is_described_by_the_end_of_its_hold(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlm.cli.output import iso_local

    until_ms = 1_700_000_300_000
    finished = {**HOLDER, "finished_at_ms": 1_700_000_001_000, "hold_until_ms": until_ms}

    def acquire(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        raise LockHeld("lock 'job' is held by lease otherlease000001", holders=[finished])

    monkeypatch.setattr(FakeClient, "acquire", acquire)
    assert run(["exec", "--lock", "job", "--min-hold", "5m", "-v", "--", "true"]) == 75
    assert capsys.readouterr().err == (
        "dlm: 'job' is held by deploy@web-3 (backup.sh --full): the command finished; "
        f"held until {iso_local(until_ms)}; not running CMD\n"
    )


@pytest.mark.parametrize("extra", [[], ["-q"], ["--conflict-exit-code", "3"]])
def test_a_conflict_with_json_still_prints_its_one_object_with_every_holder_field(
    extra: list[str], capsys: Capture, fake_cluster: Any, held: None
) -> None:
    import json

    code = 3 if "3" in extra else 75
    assert run(["exec", "--lock", "job", "--json", *extra, "--", "true"]) == code
    captured = capsys.readouterr()
    assert captured.err == ""
    error = json.loads(captured.out)["error"]
    assert error["code"] == "LOCKED"
    assert error["holders"] == [HOLDER]
    assert "deploy@web-3" in error["message"]


def test_a_wait_that_runs_out_asks_who_holds_the_lock_now(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def acquire(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        raise LockHeld("lock 'job' is still held by someone else after waiting 2s")

    def get(self: FakeClient, key: str) -> LockState:
        self.calls.append(("get", key))
        return LockState.from_wire({"key": key, "limit": 1, "holders": [HOLDER], "waiters": []})

    monkeypatch.setattr(FakeClient, "acquire", acquire)
    monkeypatch.setattr(FakeClient, "get", get)
    assert run(["exec", "--lock", "job", "--wait", "2s", "--", "true"]) == 75
    assert capsys.readouterr().err == (
        "dlm: 'job' is still held by deploy@web-3 (pid 4121, backup.sh --full) for 2m13s "
        "after waiting 2s; not running CMD\n"
    )
    assert run(["exec", "--lock", "job", "--wait", "2s", "-q", "--", "true"]) == 75
    assert capsys.readouterr().err == ""
    assert "get" not in calls(FakeClient.instances[-1])  # quiet: no question to ask


def test_a_missing_command_exits_127_before_touching_the_cluster(
    capsys: Capture, fake_cluster: Any
) -> None:
    assert run(["exec", "--lock", "job", "--", "no-such-command-dlm-test"]) == 127
    assert "command not found" in capsys.readouterr().err
    assert FakeClient.instances == []


def test_wait_and_limit_reach_the_acquire(fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--wait", "2m", "--limit", "2", "--", "true"]) == 0
    _, (_lease, key, wait, limit, meta) = FakeClient.instances[0].calls[1]
    assert (key, wait, limit) == ("job", 120.0, 2)
    assert meta["cmd"] == "true"


@pytest.mark.parametrize("traps_term", [False, True])
def test_lost_lease_stops_the_child_and_exits_77(
    traps_term: bool, ready: Ready, capsys: Capture, fake_cluster: Any, tmp_path: Path
) -> None:
    after = tmp_path / "survived"
    trap = 'trap "" TERM; ' if traps_term else ""
    script = f"{trap}echo up > {ready.path}; sleep 60; touch {after}"
    ready.then(lambda: FakeKeepAlive.instances[0].lose("planted: renewal unconfirmed"))
    args = ["exec", "--lock", "job", "--kill-grace", "200ms", "--", "sh", "-c", script]
    assert run(args) == 77
    assert not after.exists()
    err = capsys.readouterr().err
    assert "lost the lock on 'job'" in err
    assert "planted" in err
    # The lease is gone (or unreachable): no attempt to give it back.
    assert "close_lease" not in calls(FakeClient.instances[0])


def test_signals_to_dlm_are_forwarded_and_the_lock_released_after(
    ready: Ready, fake_cluster: Any, tmp_path: Path
) -> None:
    got = tmp_path / "got"
    script = f'trap "echo TERM > {got}; exit 42" TERM; echo up > {ready.path}; sleep 60 & wait'
    ready.then(lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert run(["exec", "--lock", "job", "--", "sh", "-c", script]) == 42
    assert got.read_text() == "TERM\n"
    assert calls(FakeClient.instances[0])[-1] == "close_lease"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_signal_before_cmd_starts_gives_the_lease_back(
    tmp_path: Path, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        # To the main thread itself: the test process has helper threads of its own (a
        # process-directed signal may land on one, and its handler then runs late).
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGHUP)
        for _ in range(1000):  # the handler raises at the next check; bounded, 10 s
            time.sleep(0.01)
        raise AssertionError("the SIGHUP handler never ran")

    monkeypatch.setattr(FakeClient, "acquire", interrupted)
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", "--", "touch", str(marker)]) == 128 + signal.SIGHUP
    assert not marker.exists()
    assert calls(FakeClient.instances[0]) == ["open_lease", "acquire", "close_lease"]


def test_exec_json_reports_the_grant_and_the_exit_code(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--json", "--", "sh", "-c", "exit 5"]) == 5
    import json

    assert json.loads(capsys.readouterr().out) == {
        "key": "job",
        "token": 4242,
        "lease": "fakelease0000001",
        "ttl_ms": 30000,
        "exit_code": 5,
        "hold_until": None,
    }


def test_with_json_cmds_stdout_goes_to_stderr_and_stdout_holds_only_the_object(
    capfd: Capture, fake_cluster: Any
) -> None:
    import json

    script = "echo from-cmd-stdout; echo from-cmd-stderr >&2; exit 3"
    assert run(["exec", "--json", "--lock", "job", "--", "sh", "-c", script]) == 3
    out, err = capfd.readouterr()
    assert json.loads(out)["exit_code"] == 3  # one object, nothing else
    assert err.splitlines() == ["from-cmd-stdout", "from-cmd-stderr"]
    # Without --json CMD keeps its stdout.
    assert run(["exec", "--lock", "job", "--", "sh", "-c", script]) == 3
    assert capfd.readouterr() == ("from-cmd-stdout\n", "from-cmd-stderr\n")


def test_an_interrupted_run_with_json_still_prints_one_object(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(FakeClient, "acquire", interrupted)
    assert run(["exec", "--lock", "job", "--json", "--", "true"]) == 143
    import json

    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "INTERRUPTED"
    assert "SIGTERM" in error["message"]


def test_a_lease_lost_while_queued_exits_77_without_closing_it(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlm.client.errors import LeaseLost

    def expired(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        raise LeaseLost("lease fakelease0000001 has expired")

    monkeypatch.setattr(FakeClient, "acquire", expired)
    assert run(["exec", "--lock", "job", "--wait", "1m", "--", "true"]) == 77
    assert calls(FakeClient.instances[0]) == ["open_lease", "acquire"]
    assert "expired" in capsys.readouterr().err


def test_spawn_starts_a_new_session_with_default_sigpipe_and_no_inherited_fds() -> None:
    from dlm.cli.guard import spawn

    keep_r, keep_w = os.pipe()
    os.set_inheritable(keep_w, True)  # as if dlm had been given it by its parent
    probe = (
        "import os, signal, sys\n"
        f"try:\n    os.fstat({keep_w})\n    sys.exit(3)\nexcept OSError:\n    pass\n"
        "assert os.getsid(0) == os.getpid(), 'not a session leader'\n"
        "sys.exit(0 if os.environ.get('PROBE') == 'yes' else 4)\n"
    )
    try:
        pid = spawn(sys.executable, [sys.executable, "-c", probe], {**os.environ, "PROBE": "yes"})
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(keep_r)
        os.close(keep_w)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_spawn_gives_the_child_sigpipe_at_its_default(tmp_path: Path) -> None:
    from dlm.cli.guard import spawn

    out = tmp_path / "status"
    script = 'exec grep SigIgn /proc/self/status > "$OUT"'
    pid = spawn("/bin/sh", ["sh", "-c", script], {**os.environ, "OUT": str(out)})
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ignored = int(out.read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


def test_spawn_reports_a_missing_program_as_oserror() -> None:
    from dlm.cli.guard import spawn

    with pytest.raises(FileNotFoundError):
        spawn("/nonexistent/program", ["program"], dict(os.environ))


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait a moment for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _gone(pid: int) -> None:
    """SIGKILL has been sent by the time dlm returns; the kernel delivers it when it can."""
    deadline = time.monotonic() + JOIN_S
    while _running(pid):
        assert time.monotonic() < deadline, f"pid {pid} still running"
        time.sleep(0.01)


def test_processes_cmd_leaves_behind_are_stopped_before_the_lock_is_released(
    tmp_path: Path, fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "bg.pid"
    alive_at_release: list[bool] = []
    real_close = FakeClient.close_lease

    def close_lease(self: FakeClient, lease: Any, **kwargs: Any) -> None:
        alive_at_release.append(_running(int(pidfile.read_text())))
        real_close(self, lease, **kwargs)

    monkeypatch.setattr(FakeClient, "close_lease", close_lease)
    script = f"sleep 60 & echo $! > {pidfile}; exit 4"
    args = ["exec", "--lock", "job", "--kill-grace", "200ms", "--", "sh", "-c", script]
    assert run(args) == 4
    assert alive_at_release == [False]
    assert "sh ended but left processes running" in capsys.readouterr().err


def test_a_lost_lease_also_kills_group_members_that_outlive_the_leader(
    ready: Ready, fake_cluster: Any, tmp_path: Path
) -> None:
    pidfile = tmp_path / "bg.pid"
    # The leader dies at SIGTERM; its background child ignores SIGTERM and must get SIGKILL.
    script = f"(trap '' TERM; exec sleep 60) & echo $! > {pidfile}; echo up > {ready.path}; wait"
    ready.then(lambda: FakeKeepAlive.instances[0].lose("planted: renewal unconfirmed"))
    args = ["exec", "--lock", "job", "--kill-grace", "200ms", "--", "sh", "-c", script]
    assert run(args) == 77
    _gone(int(pidfile.read_text()))


def test_a_lease_lost_while_waiting_in_the_queue_ends_the_wait_at_once(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlm.client.errors import ClusterUnavailable

    closed = threading.Event()

    def close(self: FakeClient) -> None:
        self.closed = True
        closed.set()

    def queued(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        threading.Thread(target=FakeKeepAlive.instances[0].lose, daemon=True).start()
        # Queued for an hour: only the loss of the lease may end this wait.
        assert closed.wait(JOIN_S)
        raise ClusterUnavailable("the client was closed", code="CLOSED")

    monkeypatch.setattr(FakeClient, "close", close)
    monkeypatch.setattr(FakeClient, "acquire", queued)
    assert run(["exec", "--lock", "job", "--wait", "1h", "--", "true"]) == 77
    assert "the command was not started" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("ttl", "grace"), [("30s", "15s"), ("2s", "1s"), ("2s", "1500ms"), ("1m", "30s")]
)
def test_a_kill_grace_of_half_the_ttl_or_more_is_a_usage_error(
    ttl: str, grace: str, capsys: Capture, fake_cluster: Any
) -> None:
    assert run(["exec", "--lock", "job", "--ttl", ttl, "--kill-grace", grace, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert f"--kill-grace {grace} is too long" in err
    assert "less than half the TTL" in err
    assert FakeClient.instances == []


@pytest.mark.parametrize(
    ("default_ttl_ms", "grace", "shown"),
    [(8_000, None, "the default --kill-grace (5s)"), (60_000, "30s", "--kill-grace 30s")],
)
def test_without_ttl_the_kill_grace_is_checked_against_the_ttl_the_lease_got(
    default_ttl_ms: int,
    grace: str | None,
    shown: str,
    *,
    capsys: Capture,
    fake_cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(FakeClient, "default_ttl_ms", default_ttl_ms)
    flags = [] if grace is None else ["--kill-grace", grace]
    assert run(["exec", "--lock", "job", *flags, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"{shown} is too long for the cluster's default-ttl" in err, err
    (client,) = FakeClient.instances
    assert client.calls[0] == ("open_lease", (None,))
    assert not any(name == "acquire" for name, _ in client.calls)


def test_without_ttl_a_kill_grace_the_clusters_longer_default_allows_runs(
    tmp_path: Path, capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20 s is too long for 30 s, not for the cluster's 60 s: no refusal before the open.
    monkeypatch.setattr(FakeClient, "default_ttl_ms", 60_000)
    out = tmp_path / "ttl"
    probe = f"import os; open({str(out)!r}, 'w').write(os.environ['DLM_LEASE_TTL_MS'])"
    args = ["exec", "--lock", "job", "--kill-grace", "20s", "--", sys.executable, "-I", "-c"]
    assert run([*args, probe]) == 0
    assert out.read_text() == "60000"


@pytest.mark.parametrize(
    ("ttl", "grace", "seconds"),
    [("30s", None, 5.0), ("2s", None, 0.5), ("1m", None, 5.0), ("4s", None, 1.0),
     ("30s", "14.9s", 14.9), ("30s", "0", 0.0)],
)  # fmt: skip
def test_the_kill_grace_defaults_to_the_smaller_of_5s_and_a_quarter_ttl(
    ttl: str, grace: str | None, seconds: float
) -> None:
    from dlm.cli.exec_cmd import kill_grace_option
    from dlm.durations import parse_duration_ms

    assert kill_grace_option(grace, parse_duration_ms(ttl)) == pytest.approx(seconds)


def test_the_default_ttl_is_30s_renewed_every_10s(fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--", "true"]) == 0
    (client,) = FakeClient.instances
    assert client.calls[0] == ("open_lease", (None,))  # the cluster's default-ttl


def _lease_confirmed_long_ago(monkeypatch: pytest.MonkeyPatch, ago: float) -> None:
    from dlm.client.core import Lease

    def open_lease(
        self: FakeClient, ttl_ms: int | None, lease: str | None = None, **options: Any
    ) -> Lease:
        options.pop("near", None)
        self._call("open_lease", ttl_ms, **options)
        got = self.default_ttl_ms if ttl_ms is None else ttl_ms
        return Lease("fakelease0000001", got, confirmed_at=lease_clock() - ago)

    monkeypatch.setattr(FakeClient, "open_lease", open_lease)


def test_a_lease_short_of_time_is_renewed_before_cmd_starts(
    tmp_path: Path, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Confirmed 18 s ago under a 30 s TTL: SIGTERM would be due in ~6.7 s, less than the
    # 10 s renewal interval, so dlm renews before it starts CMD.
    _lease_confirmed_long_ago(monkeypatch, 18.0)
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", "--", "touch", str(marker)]) == 0
    assert marker.exists()
    assert calls(FakeClient.instances[0]) == ["open_lease", "acquire", "keepalive", "close_lease"]
    assert FakeKeepAlive.instances[0].renewals == 1


def test_a_lease_with_plenty_of_time_left_is_not_renewed_first(fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--", "true"]) == 0
    assert "keepalive" not in calls(FakeClient.instances[0])


def test_cmd_does_not_start_if_that_renewal_fails(
    tmp_path: Path, capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlm.client.errors import ClusterUnavailable

    _lease_confirmed_long_ago(monkeypatch, 18.0)
    real_init = FakeClient.__init__

    def init(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.fail["keepalive"] = ClusterUnavailable("no member answered")

    monkeypatch.setattr(FakeClient, "__init__", init)
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", "--", "touch", str(marker)]) == 69
    assert not marker.exists()
    assert "the command was not started" in capsys.readouterr().err


def test_cmd_does_not_start_once_its_stop_time_has_passed(
    tmp_path: Path, capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lease_confirmed_long_ago(monkeypatch, 29.0)  # past D - grace: presumed lost already
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", "--", "touch", str(marker)]) == 77
    assert not marker.exists()
    assert "the command was not started" in capsys.readouterr().err
    assert "close_lease" not in calls(FakeClient.instances[0])


def test_a_supervisor_paused_after_its_last_renewal_does_not_start_cmd(
    tmp_path: Path, capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # dlm checked its lease (plenty of time), then was paused (SIGSTOP, swap) past CMD's
    # SIGTERM time before it ordered the spawn: played by ageing the last confirmation,
    # which is all a pause changes from dlm's point of view.
    from dlm.cli import exec_cmd

    real_confirm = exec_cmd._Session._confirm_before_start

    def confirm_then_pause(self: Any, client: Any, keeper: Any, lease: Any) -> None:
        real_confirm(self, client, keeper, lease)
        keeper.confirmed_at -= 29.0  # of a 30 s TTL: D - grace is long gone

    monkeypatch.setattr(exec_cmd._Session, "_confirm_before_start", confirm_then_pause)
    from dlm.cli.guard import Guard

    orders: list[float] = []
    real_spawn = Guard.spawn

    def spawn(self: Guard, env: dict[str, str], deadline: float) -> None:
        orders.append(deadline)
        real_spawn(self, env, deadline)

    monkeypatch.setattr(Guard, "spawn", spawn)
    marker = tmp_path / "ran"
    assert run(["exec", "--lock", "job", "--", "touch", str(marker)]) == 77
    assert not marker.exists()
    assert orders == []  # the supervisor's own look, not the guard's, stopped it
    err = capsys.readouterr().err
    assert "lost the lock on 'job'" in err
    assert "time ran out before the command could start" in err
    assert "the command was not started" in err


def test_a_setsid_daemon_cmd_leaves_behind_is_stopped_before_the_lock_is_released(
    tmp_path: Path, fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "daemon.pid"
    alive_at_release: list[bool] = []
    real_close = FakeClient.close_lease

    def close_lease(self: FakeClient, lease: Any, **kwargs: Any) -> None:
        alive_at_release.append(_running(int(pidfile.read_text())))
        real_close(self, lease, **kwargs)

    monkeypatch.setattr(FakeClient, "close_lease", close_lease)
    # A classic daemon: fork, setsid, fork again, the middle one exits; it ignores SIGTERM.
    daemon = (
        "import os, signal, sys, time\n"
        "if os.fork(): sys.exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(pidfile)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"os.rename({str(pidfile)!r} + '.tmp', {str(pidfile)!r})\n"
        "time.sleep(60)\n"
    )
    script = f'"$0" -c "$1"; while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 3'
    args = ["exec", "--lock", "job", "--kill-grace", "200ms", "--", "sh", "-c", script]
    try:
        assert run([*args, sys.executable, daemon]) == 3
        assert alive_at_release == [False]
        assert "left processes running" in capsys.readouterr().err
    finally:
        if pidfile.exists():  # whatever happened, the daemon goes
            with contextlib.suppress(OSError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_a_signal_ignored_when_dlm_started_stays_ignored_in_cmd(
    tmp_path: Path, fake_cluster: Any
) -> None:
    out = tmp_path / "ignored"
    script = f"exec grep SigIgn /proc/self/status > {out}"
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        assert run(["exec", "--lock", "job", "--", "sh", "-c", script]) == 0
    finally:
        signal.signal(signal.SIGHUP, previous)
    ignored = int(out.read_text().split()[1], 16)
    assert ignored & (1 << (signal.SIGHUP - 1))
    assert not ignored & (1 << (signal.SIGTERM - 1))  # the guard ignores it; CMD must not
    assert not ignored & (1 << (signal.SIGPIPE - 1))


# --- --min-hold ------------------------------------------------------------------------


def test_the_lease_names_its_owner_and_is_not_ephemeral(fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--", "true"]) == 0
    opened = FakeClient.instances[0].options["open_lease"]
    assert opened["ephemeral"] is False  # exec closes it itself
    assert opened["meta"]["cmd"] == "true"
    assert {"host", "user", "pid"} <= set(opened["meta"])


def test_a_command_that_ends_within_the_hold_hands_the_rest_to_the_cluster(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    renewing_then: list[bool] = []
    real_update = FakeClient.update_lease

    def update_lease(self: FakeClient, *args: Any, **kwargs: Any) -> int:
        renewing_then.append(not FakeKeepAlive.instances[0].stopped)
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(FakeClient, "update_lease", update_lease)
    started = time.monotonic()
    assert run(["exec", "--lock", "job", "--min-hold", "3s", "--", "sh", "-c", "exit 3"]) == 3
    took = time.monotonic() - started
    (client,) = FakeClient.instances
    # Not closed: the lease runs out by itself when the hold is over.
    assert calls(client) == ["open_lease", "acquire", "update_lease"]
    _, (lease, hold_ms) = client.calls[-1]
    assert lease.id == "fakelease0000001"
    # 3 s stretched by 0.5% for clock rates, less what CMD took.
    assert 3015 - took * 1000 <= hold_ms <= 3015
    # The 30 s lease's last renewal covers the hold already: no reason to try for longer.
    assert client.options["update_lease"] == {"finished": True, "timeout": 10.0}
    assert renewing_then == [False]  # renewals stopped first
    assert capsys.readouterr() == ("", "")


def test_a_hold_over_by_the_time_cmd_ends_releases_as_usual(fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--min-hold", "50ms", "--", "sleep", "0.3"]) == 0
    assert calls(FakeClient.instances[0]) == ["open_lease", "acquire", "close_lease"]


def test_exec_json_says_until_when_the_lock_stays_taken(capsys: Capture, fake_cluster: Any) -> None:
    import json
    from datetime import datetime

    before = time.time()
    assert run(["exec", "--lock", "job", "--min-hold", "10s", "--json", "--", "true"]) == 0
    until = datetime.fromisoformat(json.loads(capsys.readouterr().out)["hold_until"])
    assert before + 9.0 < until.timestamp() <= time.time() + 10.05


@pytest.mark.parametrize(
    ("hold", "covered"), [("3s", True), ("1m", False)]
)  # a 30 s lease renewed every 10 s covers 3 s of hold, not a minute
def test_an_unconfirmed_hold_leaves_the_lease_to_expire_and_exits_with_cmds_code(
    hold: str, covered: bool, capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlm.client.errors import ClusterUnavailable

    real_init = FakeClient.__init__

    def init(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.fail["update_lease"] = ClusterUnavailable("no quorum within 10s")

    monkeypatch.setattr(FakeClient, "__init__", init)
    assert run(["exec", "--lock", "job", "--min-hold", hold, "--", "sh", "-c", "exit 4"]) == 4
    (client,) = FakeClient.instances
    assert "close_lease" not in calls(client)  # closing would end the hold at once
    line = capsys.readouterr().err
    assert len(line.splitlines()) == 1
    assert line.startswith("dlm: could not hand the rest of --min-hold on 'job' to the cluster")
    timeout = client.options["update_lease"]["timeout"]
    if covered:
        assert "which covers the hold" in line
        assert timeout == 10.0
    else:
        assert "may be free again up to" in line
        assert 25.0 < timeout < 30.0  # as long as the lease lasts, as then it may still help


def test_a_lease_gone_before_the_hold_is_handed_over_is_reported(
    capsys: Capture, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlm.client.errors import LeaseLost

    def gone(self: FakeClient, *args: Any, **kwargs: Any) -> int:
        raise LeaseLost("lease fakelease0000001 has expired or was closed")

    monkeypatch.setattr(FakeClient, "update_lease", gone)
    assert run(["exec", "--lock", "job", "--min-hold", "5s", "--", "true"]) == 0
    assert capsys.readouterr().err == (
        "dlm: could not keep 'job' taken for the rest of --min-hold: "
        "lease fakelease0000001 has expired or was closed\n"
    )
    assert "close_lease" not in calls(FakeClient.instances[0])


def test_a_wait_as_long_as_the_hold_is_warned_about(capsys: Capture, fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--wait", "30s", "--min-hold", "30s", "--", "true"]) == 0
    assert capsys.readouterr().err == (
        "dlm: warning: --wait 30s is not shorter than --min-hold 30s: a host that gets the "
        "lock after the hold ends runs CMD again in the same tick\n"
    )
    assert run(["exec", "--lock", "job", "--wait", "20s", "--min-hold", "30s", "--", "true"]) == 0
    assert capsys.readouterr().err == ""


# --- when the renewals start and stop (start-up time) ------------------------------------


def _record_keeper_at_acquire_and_spawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Whether the KeepAlive's threads had started when the acquire was sent and when the
    spawn order went to the guard."""
    from dlm.cli.guard import Guard

    seen: dict[str, bool] = {}
    real_acquire, real_spawn = FakeClient.acquire, Guard.spawn

    def acquire(self: FakeClient, *args: Any, **kwargs: Any) -> Any:
        seen["at_acquire"] = FakeKeepAlive.instances[0].started.is_set()
        return real_acquire(self, *args, **kwargs)

    def spawn(self: Guard, *args: Any, **kwargs: Any) -> None:
        seen["at_spawn_order"] = FakeKeepAlive.instances[0].started.is_set()
        real_spawn(self, *args, **kwargs)

    monkeypatch.setattr(FakeClient, "acquire", acquire)
    monkeypatch.setattr(Guard, "spawn", spawn)
    return seen


def test_without_wait_a_short_cmd_runs_without_starting_the_renewals(
    fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 30 s TTL, --timeout 10s + --dial-timeout 2s: the acquire ends long before a renewal
    # is due, and CMD ends long before half a renewal interval (5 s) is over.
    seen = _record_keeper_at_acquire_and_spawn(monkeypatch)
    assert run(["exec", "--lock", "job", "--", "true"]) == 0
    assert seen == {"at_acquire": False, "at_spawn_order": False}
    (keeper,) = FakeKeepAlive.instances
    assert not keeper.started.is_set() and keeper.stopped
    assert calls(FakeClient.instances[0]) == ["open_lease", "acquire", "close_lease"]


# A 2 s TTL and an acquire bound of 400 ms: renewals left for later, due from 667 ms after
# the open; the threads start half an interval after it (333 ms) if CMD still runs.
SHORT_BUDGET = ["--ttl", "2s", "--timeout", "200ms", "--dial-timeout", "200ms"]


def test_renewals_left_for_later_start_while_a_longer_cmd_runs(
    tmp_path: Path, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CMD ends only once the renewals have started (the keeper's start opens the FIFO
    # CMD reads); without them it gives up after 20 s, and exec exits 124.
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    real_start = FakeKeepAlive.start

    def start(self: FakeKeepAlive) -> FakeKeepAlive:
        real_start(self)
        with open(fifo, "w") as f:
            f.write("go\n")
        return self

    monkeypatch.setattr(FakeKeepAlive, "start", start)
    seen = _record_keeper_at_acquire_and_spawn(monkeypatch)
    cmd = ["timeout", "20", "sh", "-c", f"read line < {fifo}"]
    assert run(["exec", "--lock", "job", *SHORT_BUDGET, "--", *cmd]) == 0
    assert seen == {"at_acquire": False, "at_spawn_order": False}
    (keeper,) = FakeKeepAlive.instances
    assert keeper.started.is_set() and keeper.stopped


@pytest.mark.parametrize(
    "options",
    [
        ["--wait", "5s"],  # a queued acquire may outlast any renewal interval
        ["--ttl", "20s"],  # 10 s + 2 s of acquire is more than half the TTL
        ["--ttl", "30s", "--timeout", "14s"],
    ],
)
def test_renewals_start_before_an_acquire_that_may_outlast_half_the_ttl(
    options: list[str], fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _record_keeper_at_acquire_and_spawn(monkeypatch)
    assert run(["exec", "--lock", "job", *options, "--", "true"]) == 0
    assert seen == {"at_acquire": True, "at_spawn_order": True}


def test_several_locks_or_partitions_have_the_renewals_start_before_the_acquire(
    fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More keys (or a part of the lease to open in another partition) are a call each,
    # each with its own --timeout: the acquire's bound is no longer one call's.
    seen = _record_keeper_at_acquire_and_spawn(monkeypatch)
    monkeypatch.setattr(FakeClient, "partitions", 4)
    assert run(["exec", "--lock", "job", "--", "true"]) == 0
    assert seen == {"at_acquire": True, "at_spawn_order": True}


def test_an_acquire_bound_under_half_the_ttl_leaves_the_renewals_for_later(
    fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _record_keeper_at_acquire_and_spawn(monkeypatch)
    assert run(["exec", "--lock", "job", "--ttl", "30s", "--timeout", "12s", "--", "true"]) == 0
    assert seen == {"at_acquire": False, "at_spawn_order": False}


def test_a_conflict_never_starts_the_renewals(
    fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = LockHeld("held by someone else", key="job", holders=[])

    def acquire(self: FakeClient, *args: Any, **kwargs: Any) -> Any:
        raise held

    monkeypatch.setattr(FakeClient, "acquire", acquire)
    assert run(["exec", "--lock", "job", "--", "true"]) == 75
    (keeper,) = FakeKeepAlive.instances
    assert not keeper.started.is_set() and keeper.stopped
    assert calls(FakeClient.instances[0])[-1] == "close_lease"


def test_the_lease_is_given_back_after_renewals_halt_and_before_the_threads_are_joined(
    fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_close: list[tuple[bool, bool]] = []
    real_close = FakeClient.close_lease

    def close_lease(self: FakeClient, *args: Any, **kwargs: Any) -> list[str]:
        keeper = FakeKeepAlive.instances[0]
        at_close.append((keeper.halted, keeper.stopped))
        return real_close(self, *args, **kwargs)

    monkeypatch.setattr(FakeClient, "close_lease", close_lease)
    assert run(["exec", "--lock", "job", "--", "true"]) == 0
    assert at_close == [(True, False)]
    assert FakeKeepAlive.instances[0].stopped


def test_renewals_that_cannot_start_once_cmd_runs_leave_the_lease_to_lapse(
    fake_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The threads start after CMD did: if they cannot (no threads left), CMD may still
    # run, so the lease must not be closed under it; the guard stops CMD on hang-up.
    def start(self: FakeKeepAlive) -> FakeKeepAlive:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(FakeKeepAlive, "start", start)
    assert run(["exec", "--lock", "job", *SHORT_BUDGET, "--", "sleep", "30"]) == 70
    assert "close_lease" not in calls(FakeClient.instances[0])
