"""What `dlm` says to a newcomer, against real members: cron lines that skip say nothing,
and each failure names what happened (issue 21, item 3 and 4).

The crontab lines are read from README.md itself, so the README cannot promise a
quiet skip that the program does not keep. Each line runs as it would on five
hosts of one cron tick (one after the other, all inside the hold): the first
takes the lock and runs the job (here `true`), and the four that skip must
print nothing at all, since cron mails any output.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import REPO, Cluster, free_ports

pytestmark = pytest.mark.cluster

HOSTS = 5
CRON_LINE = re.compile(r"^(?:\S+\s+){5}(?:\w+=\S+\s+)*dlm exec .*$")


def readme_cron_exec_lines() -> list[str]:
    """Every crontab line of README.md that runs `dlm exec`."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if CRON_LINE.match(line.strip())]


def as_run_here(line: str, key_prefix: str) -> list[str]:
    """The line's dlm arguments, with its own key (prefixed) and `true` as the job."""
    words = shlex.split(line)[5:]
    while "=" in words[0]:
        words.pop(0)  # DLM_CLUSTER=...: the test's cluster stands in for the fleet's
    assert words[:2] == ["dlm", "exec"], line
    args = words[1:]
    cut = args.index("--")
    args = [*args[:cut], "--", "true"]
    lock = args.index("--lock") + 1
    args[lock] = key_prefix + args[lock]
    return args


def skip_code(args: list[str]) -> int:
    if "--conflict-exit-code" in args:
        return int(args[args.index("--conflict-exit-code") + 1])
    return 75


def test_the_readme_has_cron_lines_that_skip() -> None:
    lines = readme_cron_exec_lines()
    assert len([line for line in lines if "--min-hold" in line]) >= 3, lines


@pytest.mark.parametrize(
    "line", [line for line in readme_cron_exec_lines() if "--wait" not in line]
)
def test_a_readme_cron_line_prints_nothing_on_the_hosts_that_skip(dlm: Dlm, line: str) -> None:
    args = as_run_here(line, "cron-quiet-")
    first = dlm.run(*args)
    assert (first.returncode, first.stdout, first.stderr) == (0, "", "")
    for _host in range(HOSTS - 1):
        skipped = dlm.run(*args)
        assert (skipped.returncode, skipped.stdout, skipped.stderr) == (skip_code(args), "", "")
    # Asked, it still says who holds the lock (`--on-busy fail` where the line says
    # `--on-busy skip`: with -v as well it would say two things, a usage error).
    head = args[: args.index("--")]
    if "--on-busy" in head:
        at = head.index("--on-busy") + 1
        told = dlm.run(*head[:at], "fail", *head[at + 1 :], "--", "true")
    else:
        told = dlm.run(*head, "-v", "--", "true")
    assert told.returncode == skip_code(args)
    assert told.stderr.startswith("dlm: ") and "not running CMD" in told.stderr


def test_a_cron_line_becomes_a_run_here() -> None:
    args = as_run_here(
        "*/15 * * * * DLM_CLUSTER=10.0.0.1:7700 dlm exec --lock backup --min-hold 5m -- "
        "/usr/local/bin/backup.sh",
        "p-",
    )
    assert args == ["exec", "--lock", "p-backup", "--min-hold", "5m", "--", "true"]


def test_exec_json_keeps_cmds_output_off_stdout(dlm: Dlm) -> None:
    """A CI step reads the object from stdout; the job's own output lands in the log."""
    proc = dlm.run(
        "exec", "--json", "--lock", "json-apart", "--", "sh", "-c", "echo job-says-hi; exit 4"
    )
    assert proc.returncode == 4
    assert json.loads(proc.stdout)["exit_code"] == 4
    assert proc.stderr == "job-says-hi\n"


def test_a_web_server_did_not_answer_as_a_dlm_member(dlm: Dlm) -> None:
    """The README's own example: `python3 -m http.server` at the address given."""
    (port,) = free_ports(1)
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        addr = f"127.0.0.1:{port}"
        said = f"{addr} did not answer as a dlm member within 2s: check --cluster (or DLM_CLUSTER)"
        proc = dlm.run("--cluster", addr, "locks")
        assert (proc.returncode, proc.stdout, proc.stderr) == (69, "", f"dlm: {said}\n")
        check = dlm.run("--cluster", addr, "status", "--check")
        assert check.returncode == 69
        assert said in check.stdout
    finally:
        server.kill()
        server.wait(10)


def wait_listening(port: int, timeout: float = 30.0) -> None:
    """Until something accepts connections on 127.0.0.1:port (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)  # polling a port another process opens: no event to wait on
    raise AssertionError(f"nothing listens on port {port} after {timeout}s")


def test_a_mistyped_lease_id_is_no_such_lease_and_expired_only_when_it_expired(
    dlm: Dlm,
) -> None:
    lease = json.loads(dlm.run("acquire", "typo-key", "--json").stdout)["lease"]
    for typo in (lease[:-1], lease.upper()):
        proc = dlm.run("renew", typo)
        assert proc.returncode == 77, proc.stderr
        assert proc.stderr.startswith(f"dlm: no such lease {typo}: "), proc.stderr
        assert "expired" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1
    # Released (the release ends a lease `dlm acquire` opened): closed, not expired.
    assert dlm.run("release", "typo-key", "--lease", lease).returncode == 0
    closed = dlm.run("renew", lease)
    assert closed.returncode == 77
    assert closed.stderr.startswith(f"dlm: lease {lease} was closed (released or revoked)")
    # A lease whose TTL ran out: expired.
    short = json.loads(dlm.run("acquire", "typo-short", "--ttl", "1s", "--json").stdout)["lease"]
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:  # listing does not renew it
        leases = json.loads(dlm.run("lease", "list", "--json").stdout)["leases"]
        if short not in [item["id"] for item in leases]:
            break
        time.sleep(0.1)  # polling the cluster's view: the expiry is not announced to us
    expired = dlm.run("renew", short)
    assert expired.returncode == 77
    assert expired.stderr.startswith(f"dlm: lease {short} has expired"), expired.stderr


def test_with_one_voter_of_three_up_exec_and_status_check_say_who_is_missing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A cluster that cannot elect a leader is reported after the dial timeout (2s), not
    after the 10 s --timeout, naming what the other voters did."""
    for node_id in ("n2", "n3"):
        cluster.nodes[node_id].terminate()
    run = Dlm(cluster.members_env, tmp_path)
    missing = "1 of 3 voters answer; n2, n3 refused"
    started = time.monotonic()
    ran = run.run("exec", "--lock", "no-leader", "--", "true")
    took = time.monotonic() - started
    print(f"dlm exec gave up after {took:.2f} s")
    assert ran.returncode == 69, ran.stderr
    assert missing in ran.stderr and len(ran.stderr.splitlines()) == 1, ran.stderr
    check = run.run("status", "--check")
    assert check.returncode == 69
    assert check.stdout.startswith("no quorum: ") and missing in check.stdout, check.stdout
