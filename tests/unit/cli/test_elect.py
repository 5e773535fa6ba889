"""`dlm elect` and `dlm leader` without a cluster: the leadership JSON, the value's bounds,
and a resignation by signal being a success only without CMD."""

from __future__ import annotations

from typing import Any

import pytest

from dlm.cli import elect
from dlm.cli.main import run
from dlm.client.core import leadership
from dlm.views import LockState
from tests.unit.cli.conftest import FakeClient


def _state(holders: list[dict[str, Any]]) -> LockState:
    return LockState.from_wire({"key": "e", "limit": 1, "holders": holders, "waiters": []})


def test_the_leadership_of_a_held_key_and_of_a_free_one() -> None:
    held = _state(
        [
            {
                "lease": "L1",
                "token": 42,
                "granted_at_ms": 1_700_000_000_000,
                "held_ms": 5,
                "meta": {"value": "host-a", "host": "h"},
            }
        ]
    )
    assert leadership("e", held) == {
        "name": "e",
        "value": "host-a",
        "token": 42,
        "since": "2023-11-14T22:13:20.000Z",
        "index": 42,
        "lease": "L1",
    }
    assert leadership("e", _state([])) == {
        "name": "e", "value": None, "token": None, "since": None, "index": None, "lease": None,
    }  # fmt: skip


def test_a_holder_without_a_value_leads_with_the_empty_value() -> None:
    state = _state([{"lease": "L", "token": 3, "granted_at_ms": 0, "held_ms": 0, "meta": {}}])
    assert leadership("e", state)["value"] == ""


def test_a_resignation_by_signal_is_a_success_only_without_cmd() -> None:
    idle = elect.Election("e", "v", has_command=False)
    assert [idle.exit_code(c) for c in (130, 143, 0, 77)] == [0, 0, 0, 77]
    busy = elect.Election("e", "v", has_command=True)
    assert [busy.exit_code(c) for c in (130, 143, 3)] == [130, 143, 3]
    assert idle.meta() == {"value": "v"}
    assert idle.placeholder()[1] == "-c"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["elect", "e", "--value", "x" * 300], "--value"),
        (["elect", "e", "--lock-delay", "2m"], "--lock-delay"),
        (["elect", "", "--value", "v"], "NAME"),
    ],
)
def test_bad_elect_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], fake_cluster: Any
) -> None:
    assert run(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_leader_of_a_free_key_prints_null_and_exits_0(
    capsys: pytest.CaptureFixture[str], fake_cluster: Any
) -> None:
    assert run(["leader", "e", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"value": null' in out
    assert FakeClient.instances[0].calls[0][0] == "get"
