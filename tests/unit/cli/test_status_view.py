"""`dlm status`, `dlm status KEY` and `dlm locks` on canned cluster replies: formats, escaping,
the --check verdict and its exit code, --watch."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dlm.cli import health, status_view
from dlm.cli.main import run
from dlm.client.errors import ClusterUnavailable
from dlm.views import LeaseSummary, LockState, StatusView
from tests.unit.cli.conftest import FakeClient

Capture = pytest.CaptureFixture[str]

ADDRS = {"n1": "127.0.0.1:7701", "n2": "127.0.0.1:7702", "n3": "127.0.0.1:7703"}
HOSTILE_KEY = "deploy/\u202eprod"
HOSTILE_META = {"note": "evil\x1b[31m\ttab\nnewline\r", "host": "h\x07"}


def leader_view(
    progress: dict[str, dict[str, Any]] | None = None,
    members: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
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
        "last_index": 500,
        "members": members or [{"id": n, "address": a} for n, a in ADDRS.items()],
        "sessions": 1,
        "locks": 1,
        "waiters": 0,
        **({"progress": progress} if progress is not None else {}),
    }


def own_view(node: str, role: str = "follower", applied: int = 500) -> dict[str, Any]:
    return {"node": node, "role": role, "term": 4, "commit": 500, "applied": applied}


class Canned:
    """What the fake cluster answers: the leader's status, and each member's own view."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.status: dict[str, Any] | Exception = leader_view()
        self.partition_status: dict[int, dict[str, Any] | Exception] = {}
        """Partitions 1..P-1's answers (a cluster of ``partitions`` P)."""
        self.partition_views: dict[int, dict[str, dict[str, Any] | None]] = {}
        """Partitions 1..P-1's members' own views, by address."""
        self.views: dict[str, dict[str, Any] | None] = {
            ADDRS["n1"]: own_view("n1", "leader"),
            ADDRS["n2"]: own_view("n2"),
            ADDRS["n3"]: own_view("n3"),
        }
        canned = self

        def status(self: FakeClient, *, partition: int = 0) -> StatusView:
            self.calls.append(("status", (partition,)))
            answer = canned.status if partition == 0 else canned.partition_status[partition]
            if isinstance(answer, Exception):
                raise answer
            return StatusView.from_wire(answer)

        def member_status(
            self: FakeClient, addr: str, timeout: float = 2.0, *, partition: int = 0
        ) -> Any:
            views = canned.views if partition == 0 else canned.partition_views[partition]
            view = views.get(addr)
            return None if view is None else StatusView.from_wire(view)

        monkeypatch.setattr(FakeClient, "status", status)
        monkeypatch.setattr(FakeClient, "partitions", 1)
        monkeypatch.setattr(FakeClient, "member_status", member_status)


@pytest.fixture
def canned(fake_cluster: type[FakeClient], monkeypatch: pytest.MonkeyPatch) -> Canned:
    monkeypatch.setenv("DLM_CLUSTER", ",".join(ADDRS.values()))
    return Canned(monkeypatch)


@pytest.fixture
def india_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time at +05:30, so an offset that is not a whole hour must show."""
    monkeypatch.setenv("TZ", "XST-05:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def one_line(out: str) -> str:
    lines = out.splitlines()
    assert len(lines) == 1, out
    return lines[0]


# --- --check ---------------------------------------------------------------------


def test_check_healthy_exits_0_with_one_line(canned: Canned, capsys: Capture) -> None:
    assert run(["status", "--check"]) == 0
    line = one_line(capsys.readouterr().out)
    assert line.startswith("healthy: all 3 voters answer, leader n1")
    assert "survives 1 more member failure" in line


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda c: c.views.update({ADDRS["n3"]: None}), "n3 (127.0.0.1:7703) does not answer"),
        (
            lambda c: c.views.update({ADDRS["n3"]: own_view("n3", applied=400)}),
            "n3 (127.0.0.1:7703) is 100",
        ),
        (
            lambda c: setattr(
                c, "status", leader_view({"n1": {"match": 500}, "n2": {"match": 500},
                                          "n3": {"match": 10, "last_contact_ms": 30}})
            ),
            "n3 (127.0.0.1:7703) is 490 entries behind",
        ),
        (
            lambda c: setattr(
                c, "status", leader_view({"n2": {"match": 500, "last_contact_ms": 1500}})
            ),
            "has not heard from n2 (127.0.0.1:7702) for 1.5s",
        ),
    ],
)  # fmt: skip
def test_check_degraded_exits_1_and_says_why(
    canned: Canned, capsys: Capture, change: Any, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 100 entries behind is too few to degrade at the real threshold; lower it for that case.
    monkeypatch.setattr(health, "MAX_BEHIND_ENTRIES", 50)
    change(canned)
    assert run(["status", "--check"]) == 1
    line = one_line(capsys.readouterr().out)
    assert line.startswith("degraded: ")
    assert needle in line


def test_check_without_quorum_exits_69_with_one_line(canned: Canned, capsys: Capture) -> None:
    canned.status = ClusterUnavailable("no leader with a quorum within 10s", code="NO_QUORUM")
    canned.views[ADDRS["n2"]] = canned.views[ADDRS["n3"]] = None
    assert run(["status", "--check"]) == 69
    captured = capsys.readouterr()
    assert one_line(captured.out) == "no quorum: no leader with a quorum within 10s"
    assert captured.err == ""


def test_check_ignores_learners(canned: Canned, capsys: Capture) -> None:
    members = [{"id": n, "address": a} for n, a in ADDRS.items()]
    members.append({"id": "n4", "address": "127.0.0.1:7704", "role": "learner"})
    canned.status = leader_view({"n4": {"match": 1, "last_contact_ms": 60_000}}, members)
    assert run(["status", "--check"]) == 0
    assert "all 3 voters answer" in capsys.readouterr().out


def test_learners_are_marked_and_only_voters_count_towards_failures_survived(
    canned: Canned, capsys: Capture
) -> None:
    members = [{"id": n, "address": a, "role": "voter"} for n, a in ADDRS.items()]
    members += [
        {"id": "n4", "address": "127.0.0.1:7704", "role": "learner"},
        {"id": "n5", "address": "127.0.0.1:7705", "role": "learner"},
    ]
    canned.status = leader_view(members=members)
    canned.views["127.0.0.1:7704"] = own_view("n4", "learner")  # n5 does not answer
    # n3 was promoted a moment ago: the leader's list says so before n3 itself does.
    canned.views[ADDRS["n3"]] = own_view("n3", "learner")
    assert run(["status", "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "survives 1 more member failure (3 of 3 voters up, quorum 2)" in out
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"n\d", line)}
    assert "learner (learner)" not in out
    assert re.search(r"\blearner\b", rows["n4"]) and "unreachable" not in rows["n4"]
    assert "learner (unreachable)" in rows["n5"]
    assert run(["status", "--json"]) == 0
    obj = json.loads(one_line(capsys.readouterr().out))
    voters = {m["id"]: m["voter"] for m in obj["members"]}
    assert voters == {"n1": True, "n2": True, "n3": True, "n4": False, "n5": False}
    assert obj["health"]["voters"] == 3


def test_check_json(canned: Canned, capsys: Capture) -> None:
    canned.views[ADDRS["n2"]] = None
    assert run(["status", "--check", "--json"]) == 1
    obj = json.loads(one_line(capsys.readouterr().out))
    assert obj["healthy"] is False
    assert obj["state"] == "degraded"
    assert "n2" in obj["reason"]
    assert (obj["voters"], obj["voters_up"], obj["quorum"], obj["tolerates"]) == (3, 2, 2, 0)
    canned.status = ClusterUnavailable("no quorum", code="NO_QUORUM")
    assert run(["status", "--check", "--json"]) == 69
    obj = json.loads(one_line(capsys.readouterr().out))
    assert (obj["healthy"], obj["state"]) == (False, "no_quorum")


# --- the members view ----------------------------------------------------------------


def test_human_views_say_candidate_and_mark_the_leader_and_the_unreachable(
    canned: Canned, capsys: Capture
) -> None:
    canned.views[ADDRS["n2"]] = own_view("n2", "pre_candidate")
    canned.views[ADDRS["n3"]] = None
    canned.status = leader_view({"n2": {"match": 500, "last_contact_ms": 120}})
    assert run(["status", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert "pre_candidate" not in table
    assert re.search(r"n1 \*\s+127\.0\.0\.1:7701\s+leader", table)
    assert re.search(r"n2\s+127\.0\.0\.1:7702\s+candidate", table)
    assert re.search(r"n3\s+127\.0\.0\.1:7703\s+\(unreachable\)", table)
    assert "120ms ago" in table
    assert "degraded: n3 (127.0.0.1:7703) does not answer" in table
    assert "survives no further member failure (2 of 3 voters up, quorum 2)" in table

    assert run(["status"]) == 0  # not a terminal: tsv
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == list(status_view.MEMBER_FIELDS)
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert rows["n2"][2] == "candidate" and rows["n2"][7] == "120"
    assert rows["n3"][-1] == "no" and rows["n1"][2] == "leader"

    assert run(["status", "--json"]) == 0  # exact: Raft's own word
    members = json.loads(capsys.readouterr().out)["members"]
    assert [m["role"] for m in members] == ["leader", "pre_candidate", None]
    assert members[1]["last_contact_ms"] == 120


def test_status_without_quorum_shows_members_then_exits_69(canned: Canned, capsys: Capture) -> None:
    canned.status = ClusterUnavailable("no leader with a quorum", code="NO_QUORUM")
    assert run(["status"]) == 69
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 4  # header and three members
    assert one_line(captured.err).startswith("dlm: no leader with a quorum")


def test_watch_prints_a_snapshot_per_interval_until_ctrl_c(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) % 3 == 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    assert run(["status", "--watch", "--interval", "250ms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 * 4  # three tsv snapshots of a header and three members
    assert all(0 <= nap <= 0.25 for nap in naps)
    assert run(["status", "--watch", "--json"]) == 0
    snapshots = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(snapshots) == 3 and snapshots[0]["leader"] == "n1"


@pytest.mark.parametrize(
    "args",
    [
        ["status", "k", "--check"],
        ["status", "k", "--watch", "--interval", "1s"],
        ["status", "--check", "--watch"],
        ["status", "--interval", "1s"],
        ["status", "--watch", "--interval", "0s"],
        ["status", "--format", "yaml"],
        ["locks", "--format", "csv"],
    ],
)
def test_status_usage_errors(args: list[str], canned: Canned, capsys: Capture) -> None:
    assert run(args) == 2
    assert capsys.readouterr().err.startswith("dlm: ")
    assert not any(c.calls for c in FakeClient.instances)


# --- dlm locks -------------------------------------------------------------------------


def hostile_locks(waiters: Any) -> list[dict[str, Any]]:
    return [
        {
            "key": HOSTILE_KEY,
            "limit": 1,
            "holders": [
                {"lease": "lease1", "token": 11, "held_ms": 1500, "remaining_ms": 28_500,
                 "granted_at_ms": 1_700_000_000_000, "meta": HOSTILE_META}
            ],
            "waiters": waiters,
        },
        {
            "key": "jobs\tq\nx",
            "limit": 2,
            "holders": [
                {"lease": "lease2", "token": 12, "held_ms": 10, "meta": {"a": "1"}},
                {"lease": "lease3", "token": 13, "held_ms": 20, "meta": {"b": "2\n3"}},
            ],
            "waiters": 0,
        },
    ]  # fmt: skip


@pytest.mark.parametrize("waiters", [2, [{"lease": "w1", "since_ms": 1, "position": 1,
                                          "meta": {}}, {"lease": "w2", "since_ms": 2,
                                                       "position": 2, "meta": {}}]])  # fmt: skip
def test_locks_piped_is_one_row_per_line_whatever_the_keys_and_metadata(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch, waiters: Any
) -> None:
    monkeypatch.setattr(
        FakeClient,
        "list_locks",
        lambda self, prefix="": [LockState.from_wire(lock) for lock in hostile_locks(waiters)],
    )
    assert run(["locks"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1 + 3  # header, one row per holder
    assert out.count("\n") == 4 and "\r" not in out and "\x1b" not in out and "\x07" not in out
    header = lines[0].split("\t")
    assert header == ["key", "lease", "token", "held_ms", "ttl_left_ms", "waiters", "owner"]
    first = dict(zip(header, lines[1].split("\t"), strict=True))
    assert first["key"] == "deploy/\\u202eprod"
    assert first["waiters"] == "2"
    assert first["ttl_left_ms"] == "28500"
    assert first["owner"] == "note=evil\\x1b[31m\\ttab\\nnewline\\r host=h\\x07"
    assert lines[2].split("\t")[0] == "jobs\\tq\\nx"

    assert run(["locks", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert len(table.splitlines()) == 2 + 3 and "\x1b" not in table

    assert run(["locks", "--json"]) == 0  # exact, waiters as the cluster sent them
    out = capsys.readouterr().out
    assert json.loads(out)["locks"] == hostile_locks(waiters)
    assert "\\u001b" in out


# --- dlm status KEY --------------------------------------------------------------------


def key_state() -> dict[str, Any]:
    return {
        "key": HOSTILE_KEY,
        "limit": 1,
        "holders": [
            {"lease": "lease1", "token": 11, "granted_at_ms": 1_700_000_000_000,
             "held_ms": 90_000, "ttl_ms": 30_000, "remaining_ms": 20_000, "meta": HOSTILE_META}
        ],
        "waiters": [
            {"lease": "w1", "since_ms": 1_700_000_060_000, "position": 1, "meta": HOSTILE_META},
            {"lease": "w2", "since_ms": 1_700_000_080_000, "position": 2, "meta": {}},
        ],
    }  # fmt: skip


def test_key_status_shows_absolute_times_beside_durations(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch, india_time: None
) -> None:
    monkeypatch.setattr(FakeClient, "get", lambda self, key: LockState.from_wire(key_state()))
    assert run(["status", HOSTILE_KEY, "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert out.splitlines()[0] == (
        "deploy/\\u202eprod: lock, held, 2 waiting (as of 2023-11-15T03:44:50+05:30)"
    )
    assert "held since  2023-11-15T03:43:20+05:30, for 1m30s" in out  # granted 1.7e12 ms
    assert "TTL left    20s, until 2023-11-15T03:45:10+05:30" in out
    assert "owner       note=evil\\x1b[31m\\ttab\\nnewline\\r host=h\\x07" in out
    assert re.search(r"1\s+w1\s+2023-11-15T03:44:20\+05:30\s+30s", out)
    assert re.search(r"2\s+w2\s+2023-11-15T03:44:40\+05:30\s+10s", out)

    assert run(["status", HOSTILE_KEY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 1 + 2
    holder = lines[1].split("\t")
    assert holder[:4] == ["deploy/\\u202eprod", "holder", "lease1", "11"]
    assert holder[5] == "2023-11-15T03:43:20+05:30" and holder[8] == "2023-11-15T03:45:10+05:30"
    assert lines[2].split("\t")[1:5] == ["waiter", "w1", "-", "1"]

    assert run(["status", HOSTILE_KEY, "--json"]) == 0
    state = key_state()
    state["holders"][0].update(command_finished=False, hold_until=None)
    assert json.loads(capsys.readouterr().out) == {
        **state,
        "command_finished": False,
        "hold_until": None,
        "delayed": False,
    }


def held_after_its_command() -> dict[str, Any]:
    """A lock whose `dlm exec --min-hold` command finished 10 s ago; 20 s of hold are left."""
    state = key_state()
    state["waiters"] = []
    state["holders"][0].update(
        ttl_ms=25_000, finished_at_ms=1_700_000_080_000, hold_until_ms=1_700_000_110_000
    )
    return state


def test_key_status_shows_a_lock_held_after_its_command_finished_and_until_when(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch, india_time: None
) -> None:
    monkeypatch.setattr(
        FakeClient, "get", lambda self, key: LockState.from_wire(held_after_its_command())
    )
    assert run(["status", HOSTILE_KEY, "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    (holder,) = state["holders"]
    assert holder["command_finished"] is True
    assert holder["hold_until"] == "2023-11-15T03:45:10.000+05:30"
    assert holder["hold_until_ms"] == 1_700_000_110_000  # the cluster's fields stay
    assert state["command_finished"] is True
    assert state["hold_until"] == holder["hold_until"]

    assert run(["status", HOSTILE_KEY, "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "deploy/\\u202eprod: lock, held after its command finished (--min-hold) until "
        "2023-11-15T03:45:10+05:30, nobody waiting (as of 2023-11-15T03:44:50+05:30)"
    )
    assert (
        "min hold    command finished 2023-11-15T03:44:40+05:30; held until "
        "2023-11-15T03:45:10+05:30"
    ) in out

    assert run(["status", HOSTILE_KEY]) == 0
    header, row = (line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert dict(zip(header, row, strict=True))["command_finished"] == "yes"
    assert dict(zip(header, row, strict=True))["hold_until"] == "2023-11-15T03:45:10+05:30"


def test_a_semaphore_is_in_a_hold_only_when_every_holder_is(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch, india_time: None
) -> None:
    state = held_after_its_command()
    later = {**state["holders"][0], "lease": "lease2", "hold_until_ms": 1_700_000_120_000}
    running = {k: v for k, v in later.items() if not k.endswith("_ms") or k == "held_ms"}
    for holders, finished, until in (
        ([state["holders"][0], later], True, "2023-11-15T03:45:20.000+05:30"),
        ([state["holders"][0], running], False, None),
    ):
        answer = {**state, "limit": 2, "holders": holders}
        monkeypatch.setattr(
            FakeClient, "get", lambda self, key, answer=answer: LockState.from_wire(answer)
        )
        assert run(["status", "k", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert (shown["command_finished"], shown["hold_until"]) == (finished, until)


def test_key_validation_happens_before_connecting(fake_cluster: Any, capsys: Capture) -> None:
    assert run(["status", ""]) == 2
    assert "KEY" in capsys.readouterr().err
    assert not any(c.calls for c in FakeClient.instances)


# --- dlm lease list -----------------------------------------------------------------------


def hostile_leases() -> list[dict[str, Any]]:
    return [
        {"id": "lease1", "ttl_ms": 30_000, "left_ms": 21_000, "holding": [HOSTILE_KEY, "b"],
         "waiting": ["jobs\tq\nx"], "meta": HOSTILE_META, "owner": "team-a"},
        {"id": "lease2", "ttl_ms": 5_000, "left_ms": None, "holding": [], "waiting": [],
         "meta": {}},
    ]  # fmt: skip


def test_lease_list_in_each_format(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        FakeClient,
        "list_leases",
        lambda self: [LeaseSummary.from_wire(lease) for lease in hostile_leases()],
    )
    assert run(["lease", "list", "--json"]) == 0
    out = capsys.readouterr().out
    # A member of an earlier release sends no owner: the lease shows owner "".
    assert json.loads(out) == {"leases": [{"owner": "", **lease} for lease in hostile_leases()]}

    assert run(["lease", "list"]) == 0  # piped: tsv, one row per line whatever the keys
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out and "\x07" not in out
    header, first, second = (line.split("\t") for line in out.splitlines())
    assert header == ["id", "ttl_ms", "left_ms", "holding", "waiting", "owner"]
    assert first == [
        "lease1", "30000", "21000", "deploy/\\u202eprod,b", "jobs\\tq\\nx",
        "note=evil\\x1b[31m\\ttab\\nnewline\\r host=h\\x07",
    ]  # fmt: skip
    assert second == ["lease2", "5000", "-", "", "", ""]

    assert run(["lease", "list", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert "\x1b" not in table and "\u202e" not in table
    lines = table.splitlines()
    assert len(lines) == 2 + 2
    assert lines[0].split() == ["LEASE", "TTL", "LEFT", "HOLDING", "WAITING", "FOR", "OWNER"]
    assert lines[2].split()[:5] == ["lease1", "30s", "21s", "deploy/\\u202eprod,b", "jobs\\tq\\nx"]
    assert lines[3].split()[:5] == ["lease2", "5s", "-", "-", "-"]


def test_lease_list_without_leases(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(["lease", "list", "--format", "table"]) == 0
    assert capsys.readouterr().out == "no leases\n"
    assert run(["lease", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"leases": []}


def test_last_contact_comes_from_the_leader_when_a_follower_answered_first(
    canned: Canned, capsys: Capture
) -> None:
    # The first address in DLM_CLUSTER is a follower: its status view has no progress,
    # but the leader's own view, asked for its row, does.
    progress = {
        "n1": {"match": 500, "last_contact_ms": 0},
        "n2": {"match": 500, "last_contact_ms": 40},
        "n3": {"match": 498, "last_contact_ms": 3000},
    }
    follower = {**leader_view(), "node": "n2", "role": "follower", "address": ADDRS["n2"]}
    canned.status = follower
    canned.views[ADDRS["n1"]] = leader_view(progress)
    assert run(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["members"]
    assert [r["last_contact_ms"] for r in rows] == [0, 40, 3000]
    assert [r["lag"] for r in rows] == [0, 0, 2]


def test_key_status_says_when_the_key_is_in_a_lock_delay() -> None:
    state = LockState.from_wire(
        {
            "key": "k",
            "limit": 1,
            "holders": [],
            "waiters": [],
            "lock_delay_ms": 2000,
            "lock_delay_lease": "gone1",
            "lock_delay_until_ms": 1_700_000_000_000,
            "lock_delay_remaining_ms": 1500,
        }
    )
    line = status_view.delay_line("k", state)
    assert line is not None
    assert "lock-delay of 2s" in line and "gone1" in line and "1.5s more" in line
    assert status_view.with_holds(state)["delayed"] is True
    free = LockState.from_wire({"key": "k", "limit": 1, "holders": [], "waiters": []})
    assert status_view.delay_line("k", free) is None


# --- a cluster of several partitions ------------------------------------------------------


def partitioned(canned: Canned, monkeypatch: pytest.MonkeyPatch, count: int = 4) -> None:
    """P = ``count``: partition p led by n1, n2, n3 in turn, each with its own figures."""
    monkeypatch.setattr(FakeClient, "partitions", count)
    progress = {n: {"match": 500, "last_contact_ms": 20} for n in ADDRS}
    canned.status = leader_view(progress)
    for p in range(1, count):
        node = f"n{p % 3 + 1}"
        canned.partition_status[p] = {
            **leader_view({n: {"match": 90 + p, "last_contact_ms": 20} for n in ADDRS}),
            "node": node,
            "leader": node,
            "leader_address": ADDRS[node],
            "term": 2 + p,
            "commit": 100 + p,
            "locks": p,
            "waiters": 1,
            "sessions": 2,
        }


def test_status_json_lists_partition_0_for_a_cluster_of_one_partition(
    canned: Canned, capsys: Capture
) -> None:
    canned.status = leader_view({"n1": {"match": 500}, "n2": {"match": 497}, "n3": {"match": 499}})
    assert run(["status", "--json"]) == 0
    obj = json.loads(one_line(capsys.readouterr().out))
    # lag: the leader's commit (500) minus the slowest voter's match (497).
    assert obj["partitions"] == [
        {"partition": 0, "leader": "n1", "term": 4, "commit": 500, "lag": 3}
    ]
    assert (obj["leader"], obj["term"], obj["commit"], obj["locks"]) == ("n1", 4, 500, 1)
    assert ("status", (1,)) not in FakeClient.instances[-1].calls


def test_status_shows_every_partition(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitioned(canned, monkeypatch)
    assert run(["status", "--json"]) == 0
    obj = json.loads(one_line(capsys.readouterr().out))
    assert obj["partitions"] == [
        {"partition": 0, "leader": "n1", "term": 4, "commit": 500, "lag": 0},
        {"partition": 1, "leader": "n2", "term": 3, "commit": 101, "lag": 10},
        {"partition": 2, "leader": "n3", "term": 4, "commit": 102, "lag": 10},
        {"partition": 3, "leader": "n1", "term": 5, "commit": 103, "lag": 10},
    ]
    # Partition 0's leader, term and commit; the counts of the whole cluster.
    assert (obj["leader"], obj["term"], obj["commit"]) == ("n1", 4, 500)
    assert (obj["locks"], obj["waiters"], obj["sessions"]) == (1 + 1 + 2 + 3, 3, 1 + 6)
    assert obj["health"]["state"] == "healthy"
    assert run(["status", "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "cluster prod, 4 partitions; partition 0: leader n1, term 4" in out
    assert re.search(r"PARTITION\s+LEADER\s+TERM\s+COMMIT\s+LAG", out)
    assert re.search(r"\b2\s+n3\s+4\s+102\s+10\b", out)
    assert run(["status", "--check"]) == 0
    assert one_line(capsys.readouterr().out).startswith(
        "healthy: all 3 voters answer, leader n1; all 4 partitions led; survives 1 more"
    )


def test_check_is_degraded_when_one_partition_has_no_leader_and_names_it(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitioned(canned, monkeypatch)
    canned.partition_status[2] = ClusterUnavailable("no leader with a quorum within 3s")
    assert run(["status", "--check"]) == 1
    line = one_line(capsys.readouterr().out)
    assert line.startswith(
        "degraded: partition 2 has no leader (no leader with a quorum within 3s); survives"
    )
    assert run(["status", "--check", "--json"]) == 1
    obj = json.loads(one_line(capsys.readouterr().out))
    assert obj["state"] == "degraded" and "partition 2" in obj["reason"]
    assert obj["partitions"][2] == {
        "partition": 2, "leader": None, "term": None, "commit": None, "lag": None,
    }  # fmt: skip
    assert run(["status", "--format", "table"]) == 0
    assert re.search(r"\b2\s+\(no leader\)", capsys.readouterr().out)


def test_check_is_degraded_when_a_partition_s_voter_lags_or_is_silent(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitioned(canned, monkeypatch)
    behind = dict(canned.partition_status[3])  # type: ignore[arg-type]
    behind["commit"] = 5000
    behind["progress"] = {
        "n1": {"match": 5000}, "n2": {"match": 5000}, "n3": {"match": 100, "last_contact_ms": 2500},
    }  # fmt: skip
    canned.partition_status[3] = behind
    assert run(["status", "--check"]) == 1
    line = one_line(capsys.readouterr().out)
    assert "partition 3: its slowest voter is 4900 entries behind the leader" in line
    assert "partition 3: its leader has not heard from n3 for 2.5s" in line


def test_a_member_that_is_down_is_named_once_not_once_per_partition(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitioned(canned, monkeypatch)
    canned.views[ADDRS["n3"]] = None
    for p in (1, 2, 3):
        answer = dict(canned.partition_status[p])  # type: ignore[arg-type]
        answer["progress"] = {**answer["progress"], "n3": {"match": 1, "last_contact_ms": 9000}}
        answer["commit"] = 1
        canned.partition_status[p] = answer
    assert run(["status", "--check"]) == 1
    line = one_line(capsys.readouterr().out)
    assert line.count("n3") == 1 and "n3 (127.0.0.1:7703) does not answer" in line


def test_partition_0_without_a_leader_is_degraded_while_the_others_serve(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitioned(canned, monkeypatch)
    canned.status = ClusterUnavailable("no leader with a quorum within 3s", code="NO_QUORUM")
    assert run(["status", "--check"]) == 1
    assert one_line(capsys.readouterr().out).startswith(
        "degraded: partition 0 has no leader (no leader with a quorum within 3s)"
    )
    assert run(["status", "--json"]) == 69  # partition 0's figures are missing: as before
    obj = json.loads(one_line(capsys.readouterr().out))
    assert [e["leader"] for e in obj["partitions"]] == [None, "n2", "n3", "n1"]
    for p in (1, 2, 3):
        canned.partition_status[p] = ClusterUnavailable("no quorum")
    assert run(["status", "--check"]) == 69
    assert one_line(capsys.readouterr().out).startswith("no quorum: ")


def test_a_partition_s_lag_comes_from_its_leader_when_a_follower_answered(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitioned(canned, monkeypatch, count=2)
    leader_own = dict(canned.partition_status[1])  # type: ignore[arg-type]
    follower = {**leader_own, "node": "n3", "role": "follower"}
    del follower["progress"]
    canned.partition_status[1] = follower
    canned.partition_views[1] = {ADDRS["n2"]: leader_own}
    assert run(["status", "--json"]) == 0
    entry = json.loads(one_line(capsys.readouterr().out))["partitions"][1]
    assert entry == {"partition": 1, "leader": "n2", "term": 3, "commit": 101, "lag": 10}
    canned.partition_views[1] = {}  # the leader does not answer directly: lag unknown
    assert run(["status", "--json"]) == 0
    assert json.loads(one_line(capsys.readouterr().out))["partitions"][1]["lag"] is None
    assert run(["status", "--check"]) == 1
    assert "partition 1: its leader n2 does not answer" in one_line(capsys.readouterr().out)


def test_a_partition_whose_members_answer_without_a_leader_has_none(
    canned: Canned, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitioned(canned, monkeypatch, count=3)
    canned.partition_status[1] = {**own_view("n2", "candidate"), "leader": None}
    assert run(["status", "--check"]) == 1
    assert "partition 1 has no leader" in one_line(capsys.readouterr().out)
