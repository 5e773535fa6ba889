"""`dlm runs` (issue 28) in-process against a scripted cluster: the JSON shapes to the
letter, TSV when piped, the dead-man's switch's exit codes and its one line, usage errors;
and `dlm exec --on-busy`'s rules against the older flags."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from dlm.cli.exec_cmd import on_busy_option, run_end
from dlm.cli.exits import CliError
from dlm.cli.main import run
from dlm.cli.runs import rfc3339
from dlm.client.errors import LockHeld
from tests.unit.cli.conftest import FakeClient

Capture = pytest.CaptureFixture[str]
FIELDS = [
    "host", "user", "command", "start", "end", "duration_ms", "exit_code", "signal", "token",
    "outcome", "skips",
]  # fmt: skip


def rows(now_ms: int) -> list[dict[str, Any]]:
    done = {
        "key": "cron/backup", "host": "web-1", "user": "deploy", "command": "backup.sh",
        "start_ms": now_ms - 60_000, "end_ms": now_ms - 50_000, "exit_code": 0, "signal": None,
        "token": 7, "outcome": "finished", "skips": 4,
    }  # fmt: skip
    going = {**done, "token": 9, "start_ms": now_ms - 1_000, "end_ms": None, "exit_code": None,
             "outcome": "running", "skips": 0}  # fmt: skip
    return [going, done]


@pytest.fixture
def ledger(fake_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    shown = rows(int(time.time() * 1000))

    def runs(self: FakeClient, key: str | None = None) -> list[dict[str, Any]]:
        self._call("runs", key)
        return shown if key is not None else shown[:1]

    monkeypatch.setattr(FakeClient, "runs", runs)
    return shown


def test_json_of_a_key_is_exactly_key_and_runs_newest_first(ledger: Any, capsys: Capture) -> None:
    assert run(["runs", "cron/backup", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert list(obj) == ["key", "runs"] and obj["key"] == "cron/backup"
    assert [list(r) for r in obj["runs"]] == [FIELDS, FIELDS]
    going, done = obj["runs"]
    assert going["end"] is None and going["duration_ms"] is None and going["token"] == 9
    assert done["duration_ms"] == 10_000 and done["skips"] == 4
    assert done["start"].endswith("Z") and done["start"][10] == "T"


def test_all_is_runs_with_the_key_first(ledger: Any, capsys: Capture) -> None:
    assert run(["runs", "--all", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert list(obj) == ["runs"] and [list(r) for r in obj["runs"]] == [["key", *FIELDS]]


def test_piped_it_is_tsv_with_the_json_names(ledger: Any, capsys: Capture) -> None:
    assert run(["runs", "cron/backup"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == FIELDS and len(lines) == 3
    assert lines[1].split("\t")[4] == "-"  # no end yet


def test_the_check_exits_0_with_a_recent_success_and_1_saying_what_is_missing(
    ledger: Any, capsys: Capture
) -> None:
    assert run(["runs", "cron/backup", "--check", "--max-age", "25h", "--success"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    assert run(["runs", "cron/backup", "--check", "--max-age", "30s"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("missing: no run of 'cron/backup' ended in the last 30s")
    assert len(out.splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["runs", "k", "--all"],
        ["runs", "k", "--check"],
        ["runs", "k", "--max-age", "1h"],
        ["runs", "--all", "--check", "--max-age", "1h"],
        ["runs", "k", "--check", "--max-age", "soon"],
    ],
)
def test_usage_errors_exit_2(args: list[str], fake_cluster: Any, capsys: Capture) -> None:
    assert run(args) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_795_813_244_659) == "2026-11-27T21:00:44.659Z"
    assert rfc3339(None) is None


def test_on_busy_maps_onto_the_older_flags_and_refuses_contradictions() -> None:
    plain: dict[str, Any] = {
        "wait": None,
        "quiet": False,
        "verbose": False,
        "conflict_exit_code": None,
    }
    assert on_busy_option("skip", **plain) == (None, True, False)
    assert on_busy_option("fail", **plain) == (None, False, True)
    assert on_busy_option("wait=5m", **plain) == ("5m", False, False)
    assert on_busy_option("wait=5m", **{**plain, "wait": "5m"}) == ("5m", False, False)
    assert on_busy_option("skip", **{**plain, "quiet": True, "conflict_exit_code": 0})[1]
    for text, extra in (
        ("skip", {"wait": "1s"}),
        ("skip", {"verbose": True}),
        ("fail", {"quiet": True}),
        ("fail", {"wait": "1s"}),
        ("wait=1m", {"wait": "2m"}),
        ("wait=", {}),
        ("sometimes", {}),
    ):
        with pytest.raises(CliError) as caught:
            on_busy_option(text, **{**plain, **extra})
        assert caught.value.exit_code == 2


def test_the_report_of_a_run() -> None:
    assert run_end(0, started=True) == ("finished", 0, None)
    assert run_end(137, started=True) == ("finished", None, 9)
    assert run_end(None, started=False) == ("lock_lost", None, None)


def test_exec_reports_the_exit_code_with_the_close(fake_cluster: Any) -> None:
    assert run(["exec", "--lock", "job", "--", "sh", "-c", "exit 3"]) == 3
    (client,) = FakeClient.instances
    assert client.run_reports == [("finished", 3, None)]


def test_on_busy_skip_on_a_held_key_is_quiet_75_and_fail_says_who(
    fake_cluster: Any, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def acquire(self: FakeClient, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("acquire", args))
        raise LockHeld("lock 'job' is held by lease otherlease000001")

    monkeypatch.setattr(FakeClient, "acquire", acquire)
    assert run(["exec", "--lock", "job", "--on-busy", "skip", "--", "true"]) == 75
    assert capsys.readouterr() == ("", "")
    assert (
        run(["exec", "--lock", "job", "--min-hold", "1m", "--on-busy", "fail", "--", "true"]) == 75
    )
    err = capsys.readouterr().err
    assert err.startswith("dlm: ") and len(err.splitlines()) == 1
    # Nothing was granted: the close carries no run report.
    assert [c.run_reports for c in FakeClient.instances] == [[None], [None]]
