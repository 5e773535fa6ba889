"""The lock-delay end to end (issue 27 item 4): a lease opened with `--lock-delay 2s` that
is revoked while holding a key leaves the key to nobody for 2 s, `dlm status` says so, and
the next waiter is granted no earlier; a release hands the key on at once."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import Cluster, wait_for

pytestmark = pytest.mark.cluster


def _queued(dlm: Dlm, key: str, count: int) -> bool:
    return len(dlm.json("status", key)["waiters"]) == count


def _first_logged(cluster: Cluster, event: str, **fields: object) -> dict[str, Any]:
    """The earliest audit record of ``event`` with ``fields`` any member logged (the
    members share this host's clock)."""
    found = []
    for node in cluster.nodes.values():
        for line in node.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("event") == event and all(
                    record.get(k) == v for k, v in fields.items()
                ):
                    found.append(record)
    assert found, f"no member logged {event} {fields}"
    return min(found, key=lambda r: float(r["ts"]))


def test_a_revoked_lease_delays_its_key_and_a_release_does_not(dlm: Dlm, shared: Cluster) -> None:
    held = dlm.json("acquire", "ld-key", "--lock-delay", "2s")
    waiter = dlm.start("--json", "acquire", "ld-key", "--wait", "60s")
    try:
        wait_for(lambda: _queued(dlm, "ld-key", 1), 30.0, "the waiter in the queue")
        revoked_at = time.monotonic()
        assert dlm.json("lease", "revoke", str(held["lease"]))["released"] == ["ld-key"]
        state = dlm.json("status", "ld-key")
        if not state["holders"]:
            # (Under a heavy load the read may come after the delay: then only the end counts.)
            assert state["delayed"] is True and state["lock_delay_ms"] == 2000
            assert state["lock_delay_lease"] == held["lease"]
            human = dlm.run("status", "ld-key", "--format", "table").stdout
            assert "is in a lock-delay of 2s" in human or "lock, held" in human, human
        code, out, err = finish(waiter)
        granted_after = time.monotonic() - revoked_at
    finally:
        stop(waiter)
    assert code == 0, err
    second = json.loads(out)
    # The waiter's grant came no earlier than the delay after the revocation was sent,
    assert granted_after >= 2.0, granted_after
    assert second["token"] > held["token"]
    after = dlm.json("status", "ld-key")
    assert after["delayed"] is False
    # ... and, on the cluster's own clock (this host's, for every member): the grant's
    # stamp is 2 s or more after the first member applied the revocation.
    closed = _first_logged(shared, "lease_closed", lease=held["lease"])
    (holder,) = after["holders"]
    assert holder["lease"] == second["lease"]
    assert holder["granted_at_ms"] / 1000 - float(closed["ts"]) >= 2.0 - 0.005
    started = _first_logged(shared, "lock_delay_started", key="ld-key", lease=held["lease"])
    assert started["delay_ms"] == 2000

    # A release is not a vanishing holder: the next waiter is granted in the same step.
    third = dlm.start("--json", "acquire", "ld-key", "--wait", "60s")
    try:
        wait_for(lambda: _queued(dlm, "ld-key", 1), 30.0, "the third in the queue")
        dlm.json("release", "ld-key", "--lease", str(second["lease"]))
        state = dlm.json("status", "ld-key")
        assert state["delayed"] is False
        assert len(state["holders"]) == 1 and state["holders"][0]["lease"] != second["lease"]
        code, out, err = finish(third)
    finally:
        stop(third)
    assert code == 0, err
    dlm.json("release", "ld-key", "--lease", str(json.loads(out)["lease"]))


def test_a_bad_lock_delay_is_refused_in_one_line(dlm: Dlm) -> None:
    for value in ("61s", "-1s", "soon"):
        proc = dlm.run("exec", "--lock", "ld-bad", "--lock-delay", value, "--", "true")
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "--lock-delay" in proc.stderr
