"""`make run`: the dev cluster comes up, its paste line takes a lock, it outlives a killed member,
and Ctrl-C stops it all. After the README's member replacement, the next `make run` starts the
members there are now (n4 too), says in one line why n1 cannot come back, and keeps the events
its members apply again from their logs off its console."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from tests.cluster.harness import REPO, wait_for

# serial: its ports are chosen by probing, which a parallel test could race.
pytestmark = [pytest.mark.cluster, pytest.mark.serial("probed-ports")]

UP_TIMEOUT = 30.0


_PROBES = itertools.count()


def _three_free_ports_after() -> int:
    """A base port whose next three ports are free on 127.0.0.1, and the one after them
    (for a fourth member).

    The search starts at a place of this process's own (its PID), moved on at each call,
    so that test runs side by side (xdist workers, other checkouts on the machine) do not
    all probe, and take, the first free base (one could take the ports another probed
    before it binds them), and the next test does not meet a member of the last one that
    is still going away."""
    bases = range(27100, 27900, 10)
    start = (os.getpid() + 7 * next(_PROBES)) % len(bases)
    order: list[int] = [*bases[start:], *bases[:start]]
    for base in order:
        socks = []
        try:
            for port in range(base + 1, base + 5):
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


PASTE_MARKER = "exec --lock demo"


def _start(
    tmp_path: Path,
    base: int | None = None,
    console: Path | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], int, dict[str, str]]:
    """A devcluster on ``base`` (default: free ports), its stderr (the members' logs) in
    ``console`` if given; ``extra``: more of its flags."""
    base = _three_free_ports_after() if base is None else base
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DLM_NODE_LOG_FORMAT", None)
    with open(console or os.devnull, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dlm.devcluster", "--base-port", str(base),
             "--data", str(tmp_path / "data"), *extra],
            stdout=subprocess.PIPE, stderr=err, env=env, cwd=tmp_path,
        )  # fmt: skip
    return proc, base, env


def _banner(proc: subprocess.Popen[bytes]) -> str:
    """Everything devcluster printed up to the end of its start-up message."""
    shown = _read_until(proc, PASTE_MARKER, UP_TIMEOUT)
    while not shown.endswith("\n\n"):
        shown += _read_until(proc, "\n", UP_TIMEOUT)
    return shown


def _last_line(shown: str) -> str:
    """The paste line, which must be the last line of the start-up message."""
    lines = shown.rstrip("\n").splitlines()
    assert PASTE_MARKER in lines[-1], shown
    return lines[-1].strip()


def _paste_line(proc: subprocess.Popen[bytes]) -> str:
    return _last_line(_banner(proc))


def _take_the_demo_lock(line: str, env: dict[str, str], cwd: Path) -> None:
    out = subprocess.run(
        ["sh", "-c", line], check=False, capture_output=True, text=True, timeout=60,
        env=env, cwd=cwd,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"hello, token \d+\n", out.stdout)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        # The members run in their own session: a killed devcluster would orphan them.
        members = _children(proc.pid)
        proc.kill()
        proc.wait(timeout=10)
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _member_pids(devcluster_pid: int) -> dict[str, int]:
    found = {}
    for pid in _children(devcluster_pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        found[argv[argv.index("--id") + 1]] = pid
    return found


def test_the_dev_cluster_serves_its_paste_line_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    proc, base, env = _start(tmp_path)
    try:
        line = _paste_line(proc)
        # Absolute paths: it works from any directory.
        command = line.split()[1]
        assert os.path.isabs(command), line
        _take_the_demo_lock(line, env, Path("/"))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        for port in range(base + 1, base + 4):
            wait_for(partial(_refused, port), 10.0, f"127.0.0.1:{port} to close")
    finally:
        _stop(proc)


def test_the_dev_cluster_outlives_a_killed_member(tmp_path: Path) -> None:
    proc, base, env = _start(tmp_path)
    try:
        line = _paste_line(proc)
        members = _member_pids(proc.pid)
        assert sorted(members) == ["n1", "n2", "n3"]
        os.kill(members["n2"], signal.SIGKILL)
        report = _read_until(proc, "keep running", UP_TIMEOUT)
        assert f"n2 (pid {members['n2']}) was killed by SIGKILL; n1, n3 keep running" in report
        assert proc.poll() is None
        assert _member_pids(proc.pid).keys() == {"n1", "n3"}
        _take_the_demo_lock(line, env, tmp_path)  # two of three still make a quorum
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        for port in range(base + 1, base + 4):
            wait_for(partial(_refused, port), 10.0, f"127.0.0.1:{port} to close")
    finally:
        _stop(proc)


def test_the_dev_cluster_shows_its_pids_and_a_join_line_that_replaces_a_member(
    tmp_path: Path,
) -> None:
    proc, base, env = _start(tmp_path)
    fourth: subprocess.Popen[bytes] | None = None
    try:
        shown = _read_until(proc, PASTE_MARKER, UP_TIMEOUT)
        members = _member_pids(proc.pid)
        for node, pid in members.items():
            assert f"{node} pid {pid} on 127.0.0.1:" in shown
        leader_pid = int(re.findall(r"kill -9 (\d+)", shown)[0])
        assert leader_pid in members.values()
        [join_line] = [line.strip() for line in shown.splitlines() if "node start --id n4" in line]
        assert f"--listen 127.0.0.1:{base + 4}" in join_line
        assert os.path.isabs(join_line.split()[0])

        fourth = subprocess.Popen(
            ["sh", "-c", f"exec {join_line}"], cwd="/", env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        dlm = [sys.executable, "-m", "dlm", "members"]
        cluster = {**env, "DLM_CLUSTER": ",".join(f"127.0.0.1:{base + i}" for i in range(1, 5))}

        def members_now() -> dict[str, dict[str, object]]:
            out = subprocess.run(
                [*dlm, "list", "--json"], env=cluster, capture_output=True, text=True,
                timeout=60, check=False,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            return {m["id"]: m for m in json.loads(out.stdout)["members"]}

        wait_for(
            lambda: (members_now().get("n4") or {}).get("voter") is True, UP_TIMEOUT, "n4 a voter"
        )
        removed = subprocess.run(
            [*dlm, "remove", "n1"], env=cluster, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        report = _read_until(proc, "keep running", UP_TIMEOUT)
        assert f"n1 (pid {members['n1']}) exited with 0 (" in report
        assert "removed" in report and "; n2, n3 keep running" in report
        assert sorted(members_now()) == ["n2", "n3", "n4"]
        taken = subprocess.run(
            [sys.executable, "-m", "dlm", "exec", "--lock", "demo", "--", "true"], env=cluster,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert taken.returncode == 0, taken.stderr  # entries for the next run to replay
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0

        # The README's next `make run`, n4's terminal still open: n4 is left where it runs.
        proc, _, _ = _start(tmp_path, base)
        shown = _banner(proc)
        assert "devcluster: n1 cannot come back: " in shown and "removed" in shown
        assert f"devcluster: n4 cannot come back: 127.0.0.1:{base + 4} is already in use" in shown
        assert _member_pids(proc.pid).keys() == {"n2", "n3"}
        _take_the_demo_lock(_last_line(shown), env, tmp_path)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0

        # And with n4 stopped too: the dev cluster starts it, where it listened.
        os.kill(fourth.pid, signal.SIGTERM)
        assert fourth.wait(timeout=30) == 0
        console = tmp_path / "console.log"
        proc, _, _ = _start(tmp_path, base, console)
        shown = _banner(proc)
        [why_n1] = [line for line in shown.splitlines() if "cannot come back" in line]
        assert why_n1.startswith("devcluster: n1 cannot come back: ") and "removed" in why_n1
        assert _member_pids(proc.pid).keys() == {"n2", "n3", "n4"}
        assert f"n4 pid {_member_pids(proc.pid)['n4']} on 127.0.0.1:{base + 4}" in shown
        _take_the_demo_lock(_last_line(shown), env, tmp_path)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        logs = console.read_text()
        # The members restarted on logs that hold the earlier runs' grants: those events
        # are not news, and the console leaves them out (the new grant is there).
        assert "node_started" in logs and "lock_granted" in logs
        assert "replayed" not in logs
    finally:
        _stop(proc)
        if fourth is not None and fourth.poll() is None:
            os.kill(fourth.pid, signal.SIGKILL)
        if fourth is not None:
            fourth.wait(timeout=10)


def test_the_dev_cluster_of_four_partitions_elects_in_each_and_stops_every_process(
    tmp_path: Path,
) -> None:
    from dlm.testing.probe import partition_status

    proc, base, _env = _start(tmp_path, extra=("--partitions", "4"))
    try:
        banner = _banner(proc)
        assert "4 partitions, each with its own leader" in banner
        members = _member_pids(proc.pid)
        assert sorted(members) == ["n1", "n2", "n3"]
        processes = {node: _children(pid) for node, pid in members.items()}
        assert all(len(children) == 4 for children in processes.values()), processes

        def leader_of(partition: int) -> str | None:
            for port in range(base + 1, base + 4):
                view = partition_status(f"127.0.0.1:{port}", partition, secret=None)
                if view is not None and view.get("leader"):
                    return str(view["leader"])
            return None

        for partition in range(4):
            wait_for(partial(leader_of, partition), UP_TIMEOUT, f"partition {partition}'s leader")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        every = [pid for children in processes.values() for pid in children]
        wait_for(
            lambda: not any(Path(f"/proc/{pid}").exists() for pid in every),
            10.0,
            "every partition process to end",
        )
    finally:
        _stop(proc)
