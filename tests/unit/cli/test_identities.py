"""`dlm auth set` and `dlm auth list`'s limits, and `dlm auth remove`'s request id, against a
scripted client (tests/unit/cli/conftest.py): what the request carries, what a script sees."""

from __future__ import annotations

import json

import pytest

from dlm.cli.main import run
from dlm.wire import AuthRemove, AuthSet
from tests.unit.cli.conftest import FakeClient

Capture = pytest.CaptureFixture[str]


def sent(fake: type[FakeClient]) -> object:
    (client,) = fake.instances
    ((_name, (request,)),) = [c for c in client.calls if c[0] == "auth_change"]
    return request


def test_set_sends_the_named_limits_and_keeps_the_others(
    fake_cluster: type[FakeClient], capsys: Capture
) -> None:
    assert run(["auth", "set", "ci", "--max-leases", "2", "--max-inflight", "default"]) == 0
    request = sent(fake_cluster)
    assert isinstance(request, AuthSet)
    assert (request.name, request.max_leases, request.max_locks) == ("ci", 2, -1)
    assert (request.max_connections, request.max_inflight) == (-1, 0)
    out = capsys.readouterr().out
    assert "ci" in out and "--max-leases 2" in out and "--max-inflight default" in out


def test_set_in_json_names_what_changed(fake_cluster: type[FakeClient], capsys: Capture) -> None:
    assert run(["--json", "auth", "set", "ci", "--max-locks", "10", "--max-leases", "default"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "set": {"name": "ci", "max_leases": None, "max_locks": 10}
    }


def test_clear_puts_every_limit_back_to_the_default(
    fake_cluster: type[FakeClient], capsys: Capture
) -> None:
    assert run(["auth", "set", "ci", "--clear"]) == 0
    request = sent(fake_cluster)
    assert isinstance(request, AuthSet)
    limits = (request.max_leases, request.max_locks, request.max_connections, request.max_inflight)
    assert limits == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-leases", "0"], "bad --max-leases '0'"),
        (["--max-leases", "-3"], "bad --max-leases"),
        (["--max-locks", "many"], "bad --max-locks 'many'"),
        (["--max-inflight", "1000000001"], "from 1 to 1000000000"),
        ([], "name a limit"),
        (["--clear", "--max-leases", "2"], "--clear"),
    ],
)
def test_bad_settings_are_one_usage_line(
    fake_cluster: type[FakeClient], capsys: Capture, args: list[str], words: str
) -> None:
    assert run(["auth", "set", "ci", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err
    assert not [c for i in fake_cluster.instances for c in i.calls if c[0] == "auth_change"]


def test_set_refuses_the_built_in_admin(fake_cluster: type[FakeClient], capsys: Capture) -> None:
    assert run(["auth", "set", "admin", "--max-leases", "2"]) == 2
    assert "built-in admin" in capsys.readouterr().err


def test_list_shows_each_identitys_own_limits(
    fake_cluster: type[FakeClient], capsys: Capture
) -> None:
    assert run(["auth", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["identities"]
    assert [(r["name"], r["max_leases"], r["max_inflight"]) for r in rows] == [
        ("ci", 2, 64),
        ("ops", None, None),
    ]
    assert run(["auth", "list", "--format", "tsv"]) == 0
    header, ci, ops = capsys.readouterr().out.splitlines()
    assert header.split("\t")[-4:] == ["max_leases", "max_locks", "max_connections", "max_inflight"]
    assert ci.split("\t")[-4:] == ["2", "default", "default", "64"]
    assert ops.split("\t")[-4:] == ["default"] * 4
    assert run(["auth", "list", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert "LIMITS" in table and "leases 2, inflight 64" in table


def test_remove_draws_a_request_id_for_its_resends(
    fake_cluster: type[FakeClient], capsys: Capture
) -> None:
    assert run(["auth", "remove", "ci"]) == 0
    first = sent(fake_cluster)
    assert isinstance(first, AuthRemove) and len(first.request) == 8
    fake_cluster.instances.clear()
    assert run(["auth", "remove", "ci"]) == 0
    second = sent(fake_cluster)
    assert isinstance(second, AuthRemove) and second.request != first.request
