"""The `dlm` command against a real 3-member cluster: exit codes, output formats, queueing.

One cluster serves the whole module (each test uses keys of its own); the
tests that freeze or kill members live in test_cli_exec.py with a cluster each.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import Cluster, free_ports, wait_for

pytestmark = pytest.mark.cluster


def holders(dlm: Dlm, key: str) -> list[dict[str, Any]]:
    state = dlm.json("status", key)
    assert state["key"] == key
    return list(state["holders"])


# --- exit codes --------------------------------------------------------------------


def test_acquire_then_conflict_75_then_release_0(dlm: Dlm) -> None:
    grant = dlm.json("acquire", "ec-deploy", "--ttl", "30s")
    assert set(grant) == {"key", "token", "lease", "ttl_ms"}
    assert grant["key"] == "ec-deploy"
    assert isinstance(grant["token"], int) and grant["token"] > 0
    assert isinstance(grant["lease"], str) and grant["lease"]
    assert grant["ttl_ms"] == 30000

    held = dlm.run("acquire", "ec-deploy")
    assert held.returncode == 75
    assert held.stdout == ""
    assert len(held.stderr.splitlines()) == 1
    # user@host (pid N) for T: the pid is the shell's that ran `dlm acquire`, here this test.
    assert f"'ec-deploy' is held by {os.environ.get('USER', '')}" in held.stderr
    assert f"(pid {os.getpid()}) for " in held.stderr
    error = dlm.json("acquire", "ec-deploy", code=75)["error"]
    assert error["code"] == "LOCKED"
    assert [h["lease"] for h in error["holders"]] == [grant["lease"]]
    assert set(error["holders"][0]["meta"]) >= {"host", "user", "pid"}

    released = dlm.run("release", "ec-deploy", "--lease", str(grant["lease"]))
    assert released.returncode == 0, released.stderr
    assert holders(dlm, "ec-deploy") == []


def test_release_by_the_wrong_lease_exits_77_and_names_the_holder(dlm: Dlm) -> None:
    mine = dlm.json("acquire", "ec-mine")
    other = dlm.json("acquire", "ec-other")
    wrong = dlm.run("release", "ec-mine", "--lease", str(other["lease"]))
    assert wrong.returncode == 77
    assert str(mine["lease"]) in wrong.stderr
    assert len(wrong.stderr.splitlines()) == 1
    error = dlm.json("release", "ec-mine", "--lease", str(other["lease"]), code=77)["error"]
    assert error["code"] == "NOT_HOLDER"
    assert [h["lease"] for h in error["holders"]] == [mine["lease"]]


def test_renew_and_release_of_a_lease_that_is_gone_exit_77(dlm: Dlm) -> None:
    assert dlm.run("renew", "nosuchlease0000").returncode == 77
    assert dlm.json("renew", "nosuchlease0000", code=77)["error"]["code"] == "SESSION_EXPIRED"
    released = dlm.run("release", "ec-gone", "--lease", "nosuchlease0000")
    assert released.returncode == 77


def test_no_member_reachable_exits_69(dlm: Dlm) -> None:
    (port,) = free_ports(1)
    nobody = f"127.0.0.1:{port}"
    for args in (["acquire", "k"], ["exec", "--lock", "k", "--", "true"], ["status"]):
        proc = dlm.run("--cluster", nobody, "--timeout", "300ms", *args)
        assert proc.returncode == 69, proc.stderr
        assert len(proc.stderr.splitlines()) == 1
        assert "Traceback" not in proc.stderr
    error = dlm.json("acquire", "k", "--cluster", nobody, "--timeout", "300ms", code=69)
    assert error["error"]["code"] == "UNAVAILABLE"


def test_usage_errors_exit_2(dlm: Dlm) -> None:
    for args in (["acquire", "k", "--ttl", "soon"], ["exec", "--lock", "k"], ["bogus"]):
        proc = dlm.run(*args)
        assert proc.returncode == 2
        assert len(proc.stderr.splitlines()) == 1
    assert dlm.json("acquire", "k", "--wait", "x", code=2)["error"]["code"] == "USAGE"


# --- renew ----------------------------------------------------------------------------


def test_renew_once_and_keep_alive(dlm: Dlm) -> None:
    grant = dlm.json("acquire", "rn-key", "--ttl", "2s")
    lease = str(grant["lease"])
    renewed = dlm.json("renew", lease)
    assert renewed == {"lease": lease, "ttl_ms": 2000}
    keeper = dlm.start("renew", lease, "--keep-alive", "--json")
    try:
        # Alive after several TTLs only if the keep-alive renews it.
        def held_long() -> bool:
            now = holders(dlm, "rn-key")
            assert now, "the lease expired although --keep-alive was running"
            return int(now[0]["held_ms"]) > 5000

        wait_for(held_long, 30.0, "the lock to outlive 2.5 TTLs")
        keeper.terminate()
        code, out, _ = finish(keeper)
    finally:
        stop(keeper)
    assert code == 0
    report = json.loads(out)
    assert report["lease"] == lease
    assert report["renewals"] >= 2


# --- formats -----------------------------------------------------------------------------


def test_format_env_evaluates_in_a_shell(dlm: Dlm) -> None:
    script = (
        'eval "$("$@" acquire "fmt key" --format env)" && '
        'printf "%s|%s|%s" "$DLM_LOCK_KEY" "$DLM_FENCING_TOKEN" "$DLM_LEASE_ID"'
    )
    proc = subprocess.run(
        ["sh", "-c", script, "sh", *dlm.command],
        env=dlm.env,
        cwd=dlm.cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    key, token, lease = proc.stdout.split("|")
    assert key == "fmt key"
    (holder,) = holders(dlm, "fmt key")
    assert (int(token), lease) == (holder["token"], holder["lease"])


def test_json_of_every_subcommand_parses(dlm: Dlm, shared: Cluster) -> None:
    grant = dlm.json("acquire", "js-key", "--meta", "job=nightly")
    lease = str(grant["lease"])
    assert dlm.json("renew", lease)["lease"] == lease

    state = dlm.json("status", "js-key")
    (holder,) = state["holders"]
    assert holder["lease"] == lease and holder["token"] == grant["token"]
    assert holder["meta"]["job"] == "nightly"
    assert {"host", "user"} <= set(holder["meta"])
    assert state["waiters"] == []

    listed = dlm.json("locks", "--prefix", "js-")
    assert [lock["key"] for lock in listed["locks"]] == ["js-key"]

    status = dlm.json("status")
    assert status["leader"] in shared.nodes
    assert isinstance(status["term"], int) and status["term"] >= 1
    assert {m["id"] for m in status["members"]} == set(shared.nodes)
    for member in status["members"]:
        assert set(member) >= {"id", "address", "role", "term", "commit", "applied", "lag",
                               "reachable"}  # fmt: skip
        assert member["reachable"] is True
        assert member["role"] in ("leader", "follower", "learner")
    assert [m["role"] for m in status["members"]].count("leader") == 1
    assert status["locks"] >= 1 and status["sessions"] >= 1 and status["waiters"] >= 0

    assert dlm.json("release", "js-key", "--lease", lease) == {
        "key": "js-key",
        "lease": lease,
        "released": True,
        "token": grant["token"],
        "lease_ended": True,
    }
    ran = dlm.json("exec", "--lock", "js-exec", "--", "true")
    assert ran["exit_code"] == 0 and ran["key"] == "js-exec"

    node = next(iter(shared.nodes.values()))
    inspected = dlm.json("store", "inspect", str(node.data_dir))
    assert inspected


def test_human_output_has_tables(dlm: Dlm) -> None:
    dlm.json("acquire", "hu-key")
    status = dlm.run("status", "--format", "table")
    assert status.returncode == 0
    assert "LAST CONTACT" in status.stdout and "leader" in status.stdout
    assert "healthy: survives 1 more member failure" in status.stdout
    locks = dlm.run("locks", "--prefix", "hu-", "--format", "table")
    assert locks.returncode == 0 and "hu-key" in locks.stdout
    key = dlm.run("status", "hu-key", "--format", "table")
    assert key.returncode == 0 and "token" in key.stdout and "held since" in key.stdout


def test_piped_locks_give_one_row_per_line_whatever_the_metadata(dlm: Dlm) -> None:
    hostile = "evil\x1b[2J\x1b]0;pwned\x07\tcol\nrow\rback"
    keys = ["pl-a", "pl-b\u202ebidi", "pl-c"]
    for key in keys:
        dlm.json("acquire", key, "--meta", f"note={hostile}")
    proc = dlm.run("locks", "--prefix", "pl-")  # stdout is a pipe: tsv
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[-1] == "" and len(lines) == 1 + len(keys) + 1
    assert lines[0] == "key\tlease\ttoken\theld_ms\tttl_left_ms\twaiters\towner"
    for line, key in zip(lines[1:-1], keys, strict=True):
        fields = line.split("\t")
        assert len(fields) == 7, line
        assert fields[0] == key.replace("\u202e", "\\u202e")
        assert "note=evil\\x1b[2J\\x1b]0;pwned\\x07\\tcol\\nrow\\rback" in fields[6]
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout and "\x07" not in proc.stdout
    exact = dlm.json("locks", "--prefix", "pl-")["locks"]
    assert [lock["holders"][0]["meta"]["note"] for lock in exact] == [hostile] * 3


# --- fail fast ---------------------------------------------------------------------------


def test_a_url_in_cluster_fails_at_once(dlm: Dlm) -> None:
    started = time.monotonic()
    proc = dlm.run("--cluster", "http://x", "acquire", "k")
    assert proc.returncode == 2
    assert time.monotonic() - started < 5.0  # a process start, no connection attempt
    line = proc.stderr.strip()
    assert line == ("dlm: --cluster takes HOST:PORT[,HOST:PORT...], not a URL (got 'http://x')")


def test_a_closed_port_gives_up_after_about_the_dial_timeout(dlm: Dlm) -> None:
    closed = [f"127.0.0.1:{port}" for port in free_ports(2)]
    for args in (["acquire", "dt-k"], ["status"]):
        started = time.monotonic()
        proc = dlm.run("--cluster", ",".join(closed), "--dial-timeout", "1s", *args)
        took = time.monotonic() - started
        assert proc.returncode == 69, proc.stderr
        assert 1.0 <= took < 5.0, took  # --timeout is 10s: the dial timeout ended it
        assert "no member answered within the dial timeout (1s)" in proc.stderr
        assert all(addr in proc.stderr for addr in closed)


# --- waiting ----------------------------------------------------------------------------


def test_wait_queues_fifo_and_times_out_with_75(dlm: Dlm) -> None:
    first = dlm.json("acquire", "q-key")
    timed_out = dlm.run("acquire", "q-key", "--wait", "300ms")
    assert timed_out.returncode == 75

    def waiters(n: int) -> bool:
        return len(dlm.json("status", "q-key")["waiters"]) == n

    a = dlm.start("acquire", "q-key", "--wait", "60s", "--json")
    b = None
    try:
        wait_for(lambda: waiters(1), 30.0, "the first waiter in the queue")
        b = dlm.start("acquire", "q-key", "--wait", "60s", "--json")
        wait_for(lambda: waiters(2), 30.0, "the second waiter in the queue")
        assert dlm.run("release", "q-key", "--lease", str(first["lease"])).returncode == 0
        code_a, out_a, err_a = finish(a)
        assert code_a == 0, err_a
        grant_a = json.loads(out_a)
        assert grant_a["token"] > first["token"]
        assert b.poll() is None  # still queued behind a
        assert dlm.run("release", "q-key", "--lease", grant_a["lease"]).returncode == 0
        code_b, out_b, err_b = finish(b)
        assert code_b == 0, err_b
        assert json.loads(out_b)["token"] > grant_a["token"]
    finally:
        stop(a)
        if b is not None:
            stop(b)


def test_exec_waits_for_the_lock(dlm: Dlm, tmp_path: Path) -> None:
    first = dlm.json("acquire", "qe-key")
    out = tmp_path / "token"
    proc = dlm.start(
        "exec", "--lock", "qe-key", "--wait", "60s", "--", "sh", "-c",
        f'echo "$DLM_FENCING_TOKEN" > {out}',
    )  # fmt: skip
    try:
        wait_for(lambda: dlm.json("status", "qe-key")["waiters"], 30.0, "exec in the queue")
        assert not out.exists()
        assert dlm.run("release", "qe-key", "--lease", str(first["lease"])).returncode == 0
        code, _, err = finish(proc)
    finally:
        stop(proc)
    assert code == 0, err
    assert int(out.read_text()) > int(first["token"])
    assert holders(dlm, "qe-key") == []


# --- status --check against a cluster that loses members -----------------------------------


def test_status_check_exits_0_then_1_then_69_as_members_stop(
    cluster: Cluster, tmp_path: Path
) -> None:
    dlm = Dlm(cluster.members_env, tmp_path)
    healthy = dlm.run("status", "--check")
    assert healthy.returncode == 0, healthy.stdout
    assert healthy.stdout.startswith("healthy: all 3 voters answer")
    assert len(healthy.stdout.splitlines()) == 1

    cluster.nodes["n3"].terminate()
    degraded = dlm.run("status", "--check", "--timeout", "10s")
    assert degraded.returncode == 1, (degraded.stdout, degraded.stderr)
    assert degraded.stdout.startswith("degraded: n3 (")
    assert "survives no further member failure (2 of 3 voters up, quorum 2)" in degraded.stdout
    assert len(degraded.stdout.splitlines()) == 1
    verdict = dlm.json("status", "--check", code=1)
    assert (verdict["healthy"], verdict["state"], verdict["tolerates"]) == (False, "degraded", 0)

    cluster.nodes["n2"].terminate()
    lost = dlm.run("status", "--check", "--timeout", "2s")
    assert lost.returncode == 69, (lost.stdout, lost.stderr)
    assert lost.stdout.startswith("no quorum: ")
    assert len(lost.stdout.splitlines()) == 1
