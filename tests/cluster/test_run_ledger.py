"""The run ledger against real members: `dlm exec` records its runs, `dlm runs` shows
them, the dead-man's switch (`dlm runs KEY --check`) flips, `--on-busy` decides a held
key's outcome.

A tick is five `dlm exec` processes started at once, each with its own DLM_HOST (five
simulated hosts), as cron fires the same line on five machines.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from dlm.wire import PROTOCOL_VERSION
from tests.cluster.cli_harness import Dlm, finish
from tests.cluster.harness import Cluster, wait_for

HOSTS = 5


@pytest.fixture
def ledger_dlm(dlm: Dlm, shared: Cluster) -> Dlm:
    """The shared cluster's `dlm`, once the cluster runs the version that keeps the ledger."""
    with shared.client() as client:
        wait_for(
            lambda: client.status().cluster_version == PROTOCOL_VERSION,
            30.0,
            "the cluster at the ledger's version",
        )
    return dlm


def tick(dlm: Dlm, *args: str) -> list[tuple[int, str, str]]:
    """Five simulated hosts run the same `dlm exec` line at once."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for host in range(1, HOSTS + 1):
            env = {**dlm.env, "DLM_HOST": f"host-{host}"}
            procs.append(
                subprocess.Popen(
                    [*dlm.command, *args],
                    cwd=dlm.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
    finally:
        results = [finish(p) for p in procs]
    return results


def runs(dlm: Dlm, key: str) -> list[dict[str, Any]]:
    obj = dlm.json("runs", key)
    assert set(obj) == {"key", "runs"} and obj["key"] == key
    rows: list[dict[str, Any]] = obj["runs"]
    return rows


RUN_FIELDS = {
    "host", "user", "command", "start", "end", "duration_ms", "exit_code", "signal", "token",
    "outcome", "skips",
}  # fmt: skip


def test_a_tick_of_five_hosts_is_one_run_and_four_skips(ledger_dlm: Dlm) -> None:
    dlm = ledger_dlm
    line = ("exec", "--lock", "ledger/tick", "--min-hold", "3s", "--", "sh", "-c", "exit 3")
    results = tick(dlm, *line)
    assert sorted(code for code, _, _ in results) == [3, 75, 75, 75, 75], results
    assert all(not out and not err for code, out, err in results if code == 75), results
    [run] = runs(dlm, "ledger/tick")
    assert set(run) == RUN_FIELDS
    assert run["skips"] == HOSTS - 1
    assert run["outcome"] == "finished" and run["exit_code"] == 3 and run["signal"] is None
    assert run["host"].startswith("host-") and run["command"] == "sh -c exit 3"
    assert run["start"].endswith("Z") and run["end"].endswith("Z")
    assert isinstance(run["duration_ms"], int) and run["duration_ms"] >= 0
    assert isinstance(run["token"], int)


def test_runs_are_newest_first_with_their_own_tokens(ledger_dlm: Dlm) -> None:
    dlm = ledger_dlm
    tokens = []
    for code in (0, 4):
        proc = dlm.run("exec", "--lock", "ledger/order", "--", "sh", "-c", f"exit {code}")
        assert proc.returncode == code, proc.stderr
    for proc_out in runs(dlm, "ledger/order"):
        tokens.append(proc_out["token"])
    shown = runs(dlm, "ledger/order")
    assert [r["exit_code"] for r in shown] == [4, 0]
    assert tokens[0] > tokens[1]
    every = dlm.json("runs", "--all")
    assert set(every) == {"runs"}
    [last] = [r for r in every["runs"] if r["key"] == "ledger/order"]
    assert last["exit_code"] == 4 and set(last) == RUN_FIELDS | {"key"}


def test_the_check_flips_to_1_when_no_run_ended_within_the_age(ledger_dlm: Dlm) -> None:
    dlm = ledger_dlm
    key = "ledger/check"
    never = dlm.run("runs", key, "--check", "--max-age", "25h")
    assert never.returncode == 1 and len(never.stdout.splitlines()) == 1, never
    ran = dlm.run("exec", "--lock", key, "--", "true")
    assert ran.returncode == 0, ran.stderr
    ok = dlm.run("runs", key, "--check", "--max-age", "25h", "--success")
    assert ok.returncode == 0, (ok.stdout, ok.stderr)
    # The job stops running: once the age has passed, the check says so.
    wait_for(
        # The same age as the last check below: a shorter one left the successful run
        # still under that age there when the machine was quick (a race in CI).
        lambda: dlm.run("runs", key, "--check", "--max-age", "1s").returncode == 1,
        30.0,
        "the check to see the last run as too old",
    )
    failed = dlm.run("exec", "--lock", key, "--", "false")
    assert failed.returncode == 1
    assert dlm.run("runs", key, "--check", "--max-age", "25h").returncode == 0
    assert dlm.run("runs", key, "--check", "--max-age", "1s", "--success").returncode == 1


def test_on_busy_skip_is_quiet_and_fail_says_who_holds_it(ledger_dlm: Dlm, tmp_path: Path) -> None:
    dlm = ledger_dlm
    key = "ledger/busy"
    held = dlm.run("acquire", key, "--ttl", "30s", "--format", "env")
    assert held.returncode == 0, held.stderr
    skip = dlm.run("exec", "--lock", key, "--on-busy", "skip", "--", "true")
    assert (skip.returncode, skip.stdout, skip.stderr) == (75, "", "")
    fail = dlm.run("exec", "--lock", key, "--on-busy", "fail", "--", "true")
    assert fail.returncode == 75 and len(fail.stderr.strip().splitlines()) == 1, fail
    waited = dlm.run("exec", "--lock", key, "--on-busy", "wait=200ms", "--", "true")
    assert waited.returncode == 75
    for bad in (
        ("--on-busy", "skip", "--wait", "1s"),
        ("--on-busy", "fail", "-q"),
        ("--on-busy", "later"),
        ("--on-busy", "wait=1s", "--wait", "2s"),
    ):
        proc = dlm.run("exec", "--lock", key, *bad, "--", "true")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (bad, proc)
