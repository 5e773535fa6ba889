"""Elections end to end (issue 27 item 3, its done-when): two `dlm elect` candidates with
CMD on one cluster; the leader's `dlm elect` is killed with SIGKILL; the other takes over
with a higher token, and only after the old CMD stopped (each CMD appends wall-clock
heartbeats to a file of its own: one machine, one clock). `dlm leader` shows both
leaderships, and a candidate without CMD resigns on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlm.client.errors import LockHeld
from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import Cluster, wait_for

pytestmark = pytest.mark.cluster

# CMD: a heartbeat every 20 ms, SIGTERM ignored (only the guard's SIGKILL ends it).
HEARTBEAT = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = sys.argv[1] + "." + os.environ["DLM_FENCING_TOKEN"]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
end = time.monotonic() + 120
while time.monotonic() < end:
    os.write(fd, f"{time.time():.6f}\\n".encode())
    time.sleep(0.02)
"""


def _beats(path: Path) -> list[float]:
    out: list[float] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(float(line))
        except ValueError:  # a line cut short by SIGKILL
            continue
    return out


def _election_line(proc: Any) -> dict[str, Any]:
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.poll() is not None else "no election line"
    found = dict(json.loads(line))
    assert "name" in found, (found, proc.stderr.read() if proc.poll() is not None else "")
    return found


def test_the_next_candidate_leads_only_after_the_killed_leaders_cmd_stopped(
    dlm: Dlm, tmp_path: Path
) -> None:
    script = tmp_path / "beat.py"
    script.write_text(HEARTBEAT)
    beats = tmp_path / "beats"
    args = ("--ttl", "2s", "--kill-grace", "500ms", "--", sys.executable, str(script), str(beats))
    first = dlm.start("--json", "elect", "el-sched", "--value", "host-a", *args)
    second = None
    try:
        elected = _election_line(first)
        assert (elected["name"], elected["value"]) == ("el-sched", "host-a")
        token_a = int(elected["token"])
        now = dlm.json("leader", "el-sched")
        assert (now["value"], now["token"]) == ("host-a", token_a)
        second = dlm.start("--json", "elect", "el-sched", "--value", "host-b", *args)
        wait_for(lambda: len(dlm.json("status", "el-sched")["waiters"]) == 1, 30.0, "the candidate")
        wait_for(lambda: Path(f"{beats}.{token_a}").exists(), 30.0, "the first CMD")
        os.kill(first.pid, signal.SIGKILL)
        taken = _election_line(second)
        token_b = int(taken["token"])
        assert taken["value"] == "host-b" and token_b > token_a
        wait_for(lambda: _beats(Path(f"{beats}.{token_b}")), 30.0, "the second CMD")
        leads = dlm.json("leader", "el-sched")
        assert (leads["value"], leads["token"]) == ("host-b", token_b)
        # The old CMD's last heartbeat came before the new one's first: never both at once.
        last_a = max(_beats(Path(f"{beats}.{token_a}")))
        first_b = min(_beats(Path(f"{beats}.{token_b}")))
        assert last_a < first_b, (last_a, first_b)
        time.sleep(0)  # (no timing is asserted: the order of the two files is the proof)
    finally:
        stop(first)
        if second is not None:
            stop(second)
    assert first.wait(30) == -signal.SIGKILL


def test_a_candidate_without_cmd_leads_until_sigterm_then_resigns(dlm: Dlm) -> None:
    free = dlm.json("leader", "el-idle")
    assert free == {
        "name": "el-idle", "value": None, "token": None, "since": None, "index": None,
        "lease": None,
    }  # fmt: skip
    candidate = dlm.start("--json", "elect", "el-idle", "--value", "v1")
    try:
        elected = _election_line(candidate)
        leads = dlm.json("leader", "el-idle")
        assert (leads["value"], leads["token"]) == ("v1", elected["token"])
        assert dlm.run("leader", "el-idle").stdout.startswith("el-idle is led by lease")
        candidate.send_signal(signal.SIGTERM)
        code, _, err = finish(candidate)
    finally:
        stop(candidate)
    assert code == 0, err
    assert dlm.json("leader", "el-idle")["value"] is None
    assert dlm.run("leader", "el-idle").stdout == "nobody leads el-idle\n"


def test_the_library_campaigns_shows_the_leader_and_resigns(shared: Cluster) -> None:
    client = shared.client()
    try:
        first = client.open_lease(30_000)
        second = client.open_lease(30_000)
        grant = client.campaign(first, "el-lib", "one")
        assert client.leader("el-lib")["value"] == "one"
        with pytest.raises(LockHeld):
            client.campaign(second, "el-lib", "two")
        client.resign(first, "el-lib")
        assert client.leader("el-lib")["value"] is None
        taken = client.campaign(second, "el-lib", "two", wait=5.0)
        assert taken.token > grant.token
        now = client.leader("el-lib")
        assert (now["value"], now["token"], now["lease"]) == ("two", taken.token, second.id)
        client.close_lease(first)
        client.close_lease(second)
    finally:
        client.close()


def test_proclaim_changes_the_value_only_for_the_leaders_lease(dlm: Dlm) -> None:
    held = dlm.json("acquire", "el-proc", "--meta", "value=first")
    other = dlm.json("acquire", "el-proc-other")
    changed = dlm.json("proclaim", "el-proc", "--value", "second", "--lease", str(held["lease"]))
    assert (changed["value"], changed["token"]) == ("second", held["token"])
    leads = dlm.json("leader", "el-proc")
    assert (leads["value"], leads["token"]) == ("second", held["token"])
    refused = dlm.run("proclaim", "el-proc", "--value", "mine", "--lease", str(other["lease"]))
    assert refused.returncode == 77, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "does not lead" in refused.stderr
    assert dlm.json("leader", "el-proc")["value"] == "second"
    dlm.json("release", "el-proc", "--lease", str(held["lease"]))
    dlm.json("release", "el-proc-other", "--lease", str(other["lease"]))
