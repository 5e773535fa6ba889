"""The JSON the status and members commands print, pinned byte for byte: `dlm status
--json` (leader or follower answering, a member down, a member of an older release, no
quorum), `dlm status --check --json`, `dlm members list|add|remove|promote --json`.

The commands run against a real ``dlm.client.sync.Client`` whose connections are
canned (``CannedConnection``: each member's wire replies), so the client's own reading of
the replies is on the path: the golden file was written (``python -m
tests.unit.cli.test_views_json_golden``) before ``status()``, ``members_view()`` and
``member_status()`` returned typed views instead of the reply maps, and pins that the
change left every byte of the output as it was (issue 22).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from dlm.wire import ok

GOLDEN = Path(__file__).parent / "testdata" / "views_json_golden.json"

ADDRS = {"n1": "127.0.0.1:7701", "n2": "127.0.0.1:7702", "n3": "127.0.0.1:7703"}
N4 = "127.0.0.1:7704"


def _leader_status(**extra: Any) -> dict[str, Any]:
    return {
        "node": "n1",
        "address": ADDRS["n1"],
        "cluster": "prod",
        "role": "leader",
        "term": 4,
        "leader": "n1",
        "leader_address": ADDRS["n1"],
        "commit": 500,
        "applied": 500,
        "first_index": 1,
        "last_index": 502,
        "members": [
            {"id": "n1", "address": ADDRS["n1"], "role": "voter"},
            {"id": "n2", "address": ADDRS["n2"], "role": "voter"},
            {"id": "n3", "address": ADDRS["n3"], "role": "voter"},
            {"id": "n4", "address": N4, "role": "learner"},
        ],
        "sessions": 3,
        "locks": 2,
        "waiters": 1,
        "version": 4,
        "cluster_version": 4,
        "progress": {
            "n1": {"match": 502, "next": 503, "active": True, "last_contact_ms": 0},
            "n2": {"match": 499, "next": 500, "active": True, "last_contact_ms": 40},
            "n3": {"match": 100, "next": 101, "active": False, "last_contact_ms": 9000},
            "n4": {"match": 120, "next": 121, "active": True, "last_contact_ms": 70},
        },
        **extra,
    }


def _own(node: str, role: str, applied: int, **extra: Any) -> dict[str, Any]:
    return {"node": node, "role": role, "term": 4, "commit": 500, "applied": applied, **extra}


def _members_view() -> dict[str, Any]:
    def row(node: str, address: str, role: str, match: int, lag: int, **extra: Any) -> Any:
        return {
            "id": node,
            "address": address,
            "role": role,
            "match": match,
            "lag": lag,
            "reachable": True,
            "last_contact_ms": 40,
            **extra,
        }

    return {
        "members": [
            row("n1", ADDRS["n1"], "leader", 502, 0),
            row("n2", ADDRS["n2"], "follower", 499, 3),
            {**row("n3", ADDRS["n3"], "follower", 100, 402), "reachable": False},
            row("n4", N4, "learner", 120, 382, reason="catching up (382 entries behind)"),
        ],
        "leader": "n1",
        "bootstrap": dict(ADDRS),
    }


SCENARIOS: dict[str, tuple[list[str], dict[tuple[str, str], Any]]] = {
    # name: (the command's arguments, what each member answers: (address, request t) -> body)
    "status, the leader answers, n3 is down": (
        ["status", "--json"],
        {
            (ADDRS["n1"], "status"): _leader_status(),
            ("own", ADDRS["n1"]): _own("n1", "leader", 500, last_index=502),
            ("own", ADDRS["n2"]): _own("n2", "follower", 497),
            ("own", N4): _own("n4", "learner", 120),
        },
    ),
    "status --check, degraded": (
        ["status", "--check", "--json"],
        {
            (ADDRS["n1"], "status"): _leader_status(),
            ("own", ADDRS["n1"]): _own("n1", "leader", 500),
            ("own", ADDRS["n2"]): _own("n2", "follower", 500),
            ("own", N4): _own("n4", "learner", 500),
        },
    ),
    "status, a follower answers and the leader's own view has the progress": (
        ["status", "--json"],
        {
            (ADDRS["n1"], "status"): {
                **_leader_status(),
                "node": "n2",
                "address": ADDRS["n2"],
                "role": "follower",
                "progress": None,
            },
            ("own", ADDRS["n1"]): _leader_status(),
            ("own", ADDRS["n2"]): _own("n2", "follower", 500),
            ("own", ADDRS["n3"]): _own("n3", "candidate", 90),
            ("own", N4): _own("n4", "learner", 480),
        },
    ),
    "status from members of an older release (fields missing, waiters listed, extras)": (
        ["status", "--json"],
        {
            (ADDRS["n1"], "status"): {
                "node": "n1",
                "role": "leader",
                "term": 2,
                "leader": "n1",
                "commit": 12,
                "members": [{"id": n, "address": a} for n, a in ADDRS.items()],
                "waiters": [{"lease": "x"}],
                "something_new": {"a": 1},
            },
            ("own", ADDRS["n1"]): _own("n1", "leader", 12),
            ("own", ADDRS["n2"]): {"node": "n2", "role": "follower"},
            ("own", ADDRS["n3"]): _own("n3", "follower", 11, quarantine_ms=5),
        },
    ),
    "status while quarantined after a restore": (
        ["status", "--json"],
        {
            (ADDRS["n1"], "status"): _leader_status(
                incarnation=4294967300, quarantine_ms=30000, quarantined_until_ms=1700000000000
            ),
            ("own", ADDRS["n1"]): _own("n1", "leader", 500),
            ("own", ADDRS["n2"]): _own("n2", "follower", 500),
            ("own", ADDRS["n3"]): _own("n3", "follower", 500),
        },
    ),
    "status without a quorum": (
        ["--timeout", "0.3", "status", "--json"],
        {
            ("own", ADDRS["n1"]): _own("n1", "candidate", 500),
            ("own", ADDRS["n2"]): _own("n2", "follower", 499),
        },
    ),
    "members list": (
        ["members", "list", "--json"],
        {
            (ADDRS["n1"], "members"): _members_view(),
            ("own", ADDRS["n1"]): _own("n1", "leader", 500),
            ("own", ADDRS["n2"]): _own("n2", "follower", 500),
            ("own", N4): _own("n4", "learner", 120),
        },
    ),
    "members add": (
        ["members", "add", "n4", N4, "--json"],
        {
            (ADDRS["n1"], "member_add"): _members_view(),
            ("own", ADDRS["n1"]): _own("n1", "leader", 500),
            ("own", ADDRS["n2"]): _own("n2", "follower", 500),
        },
    ),
    "members remove": (
        ["members", "remove", "n3", "--force", "--json"],
        {
            (ADDRS["n1"], "member_remove"): _members_view(),
            ("own", ADDRS["n1"]): _own("n1", "leader", 500),
            ("own", ADDRS["n2"]): _own("n2", "follower", 500),
            ("own", N4): _own("n4", "learner", 120),
        },
    ),
    "members promote": (
        ["members", "promote", "n4", "--json"],
        {
            (ADDRS["n1"], "member_promote"): _members_view(),
            ("own", ADDRS["n1"]): _own("n1", "leader", 500),
            ("own", N4): _own("n4", "follower", 500),
        },
    ),
}


TIMED = {"status without a quorum"}
"""Scenarios whose error message names the last member tried (pinned without it)."""


class CannedConnection:
    """Stands in for ``dlm.client.sync._Connection``: answers from a scenario's table;
    a member with nothing in it does not answer (ConnectionBroken at connect)."""

    answers: dict[Any, Any] = {}

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.framed = True
        self.partitions, self.partition = 1, 0  # a cluster of one partition
        self.via_gateway = False  # straight to the member (no gateway's notice)

    @classmethod
    def start(
        cls,
        addr: str,
        deadline: float,
        secret: Any = None,
        tls: Any = None,
        partition: int = 0,
        *,
        trace: str | None = None,
    ) -> Any:
        """A connection for the cluster's requests: only to a member that answers some."""
        from dlm.client.core import ConnectionBroken

        if not any(key[0] == addr for key in cls.answers):
            raise ConnectionBroken(f"{addr}: connection refused")
        return cls(addr)

    @classmethod
    def open(
        cls, addr: str, deadline: float, secret: Any = None, tls: Any = None, partition: int = 0
    ) -> Any:
        """A direct connection for a member's own view (``member_status``)."""
        from dlm.client.core import ConnectionBroken

        if ("own", addr) not in cls.answers:
            raise ConnectionBroken(f"{addr}: connection refused")
        return cls(addr), {"t": "welcome", "version": 4}

    def request(self, request: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        rid = request.get("id", 0)
        if request.get("t") == "status" and request.get("stale"):
            body = self.answers.get(("own", self.addr))
        else:
            body = self.answers.get((self.addr, request.get("t")))
        if body is None:
            return None
        return ok(rid, **body)

    def drop_pushes(self, *args: Any) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


def run_scenario(name: str) -> dict[str, Any]:
    from dlm.cli.main import run
    from dlm.client import sync

    args, answers = SCENARIOS[name]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sync, "_Connection", CannedConnection)
        patch.setattr(CannedConnection, "answers", answers)
        patch.setenv("DLM_CLUSTER", ",".join(ADDRS.values()))
        patch.setattr("dlm.cli.output.stdout_is_terminal", lambda: False)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run(args)
    stdout = out.getvalue()
    if name in TIMED:
        # Which member the client tried last within the timeout depends on the clock.
        stdout = re.sub(r"\(127\.0\.0\.1:\d+: [^)]*\)", "(the last one tried)", stdout)
    return {"exit": code, "stdout": stdout}


def current() -> dict[str, Any]:
    return {name: run_scenario(name) for name in SCENARIOS}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_json_is_what_it_was(name: str) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert run_scenario(name) == golden[name]


def test_every_scenario_is_pinned_and_prints_one_json_object() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == set(SCENARIOS)
    for name, result in golden.items():
        lines = result["stdout"].splitlines()
        assert len(lines) == 1 and isinstance(json.loads(lines[0]), dict), name


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    sys.exit(0)
