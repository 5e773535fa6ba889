"""`dlm exec` end to end: env vars, exit codes, signals, the lost lock, conflicts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cluster.cli_harness import Dlm, Fifo, finish, first_line, group_members, stop
from tests.cluster.harness import Cluster, wait_for

pytestmark = pytest.mark.cluster


def test_exports_the_lock_to_the_child_over_inherited_values(dlm: Dlm, tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    probe = (
        "import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
        "if k.startswith('DLM_')}, open(sys.argv[1], 'w'))"
    )
    proc = dlm.run(
        "exec", "--lock", "ex-env", "--ttl", "20s", "--", "python3", "-c", probe, str(out),
        env={"DLM_LOCK_KEY": "inherited", "DLM_FENCING_TOKEN": "1", "DLM_LEASE_ID": "x"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    env = json.loads(out.read_text())
    assert env["DLM_LOCK_KEY"] == "ex-env"
    assert int(env["DLM_FENCING_TOKEN"]) > 1
    assert env["DLM_LEASE_ID"] not in ("", "x")
    assert env["DLM_LEASE_TTL_MS"] == "20000"
    # Released when the command ended.
    assert dlm.json("status", "ex-env")["holders"] == []


@pytest.mark.parametrize(
    ("script", "code"), [("exit 0", 0), ("exit 3", 3), ("kill -9 $$", 137), ("kill -15 $$", 143)]
)
def test_passes_the_exit_code_through(dlm: Dlm, script: str, code: int) -> None:
    proc = dlm.run("exec", "--lock", "ex-code", "--", "sh", "-c", script)
    assert proc.returncode == code, proc.stderr
    assert dlm.json("status", "ex-code")["holders"] == []


def test_a_held_lock_means_75_or_the_conflict_code_and_no_run(dlm: Dlm, tmp_path: Path) -> None:
    dlm.json("acquire", "ex-busy")
    marker = tmp_path / "ran"
    assert dlm.run("exec", "--lock", "ex-busy", "--", "touch", str(marker)).returncode == 75
    for code in ("0", "9"):
        args = ["exec", "--lock", "ex-busy", "--conflict-exit-code", code, "--", "touch"]
        assert dlm.run(*args, str(marker)).returncode == int(code)
    assert dlm.json("exec", "--lock", "ex-busy", "--", "true", code=75)["error"]["code"] == "LOCKED"
    assert not marker.exists()


def test_sigterm_is_forwarded_and_the_lock_released_after(dlm: Dlm, tmp_path: Path) -> None:
    ready = Fifo(tmp_path / "ready")
    got = tmp_path / "got"
    script = f'trap "echo TERM > {got}; exit 42" TERM; echo $$ > {ready.path}; sleep 60 & wait'
    proc = dlm.start("exec", "--lock", "ex-sig", "--", "sh", "-c", script)
    try:
        int(ready.read())
        os.kill(proc.pid, signal.SIGTERM)
        code, _, err = finish(proc)
    finally:
        stop(proc)
    assert code == 42, err
    assert got.read_text() == "TERM\n"
    assert dlm.json("status", "ex-sig")["holders"] == []


def test_no_descriptor_reaches_the_child_and_it_leads_its_own_group(
    dlm: Dlm, tmp_path: Path
) -> None:
    out = tmp_path / "fds"
    probe = (
        "import os, sys\n"
        "fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
        "open(sys.argv[1], 'w').write(f'{os.getpid()} {os.getpgid(0)} {fds}')\n"
    )
    assert (
        dlm.run("exec", "--lock", "ex-fd", "--", "python3", "-c", probe, str(out)).returncode == 0
    )
    pid, pgid, fds = out.read_text().split(" ", 2)
    assert pid == pgid
    # 0-2, plus the one listdir itself opened to read /proc/self/fd.
    assert len(eval(fds)) == 4


def test_losing_the_lease_stops_the_child_and_exits_77(tmp_path: Path) -> None:
    (tmp_path / "frozen").mkdir()
    (tmp_path / "cwd").mkdir()
    cluster = Cluster(tmp_path / "frozen", size=3)
    dlm = Dlm(cluster.members_env, tmp_path / "cwd")
    ready = Fifo(tmp_path / "ready")
    after = tmp_path / "after"
    script = f'trap "" TERM; echo $$ > {ready.path}; sleep 60; touch {after}'
    started: list[subprocess.Popen[str]] = []
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        held = dlm.json("acquire", "lost-keeper", "--ttl", "2s")
        keeper = dlm.start("renew", str(held["lease"]), "--keep-alive")
        started.append(keeper)
        assert "renewing every" in first_line(keeper)
        proc = dlm.start(
            "exec", "--lock", "lost", "--ttl", "2s", "--kill-grace", "300ms", "--", "sh", "-c",
            script,
        )  # fmt: skip
        started.append(proc)
        child = int(ready.read())
        for node in cluster.nodes.values():
            node.pause()
        code, _, err = finish(proc)
        keeper_code, _, keeper_err = finish(keeper)
        assert dlm.run("acquire", "k", "--timeout", "500ms").returncode == 69
    finally:
        for p in started:
            stop(p)
        cluster.stop_all()
    assert code == 77, err
    assert "lost the lock" in err
    assert group_members(child) == []  # the child and its sleep are gone
    assert not after.exists()
    assert keeper_code == 77, keeper_err


def test_an_interrupted_wait_leaves_the_queue(dlm: Dlm, tmp_path: Path) -> None:
    dlm.json("acquire", "ex-int")
    marker = tmp_path / "ran"
    proc = dlm.start("exec", "--lock", "ex-int", "--wait", "60s", "--", "touch", str(marker))
    try:
        wait_for(lambda: dlm.json("status", "ex-int")["waiters"], 30.0, "exec in the queue")
        os.kill(proc.pid, signal.SIGINT)
        code, _, _ = finish(proc)
    finally:
        stop(proc)
    assert code == 130
    assert dlm.json("status", "ex-int")["waiters"] == []
    assert not marker.exists()
