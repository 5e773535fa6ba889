"""`proclaim` (issue 27 item 3, cluster version 4): the leading lease replaces its grant's
election value in place (same token, no new grant); any other lease is refused and
changes nothing; the entry round-trips and is refused alike before version 4."""

from __future__ import annotations

from dlm.node.locks import (
    Granted,
    Invalid,
    NotHeld,
    Origin,
    ProclaimCommand,
    decode_command,
    encode_command,
)

from .locks_driver import Driver


def _proclaim(d: Driver, lease: str, key: str, value: str) -> object:
    return d.run(ProclaimCommand(lease, key, value, d.origin("c1", None, 0), d.now())).result


def test_the_leader_changes_its_value_in_place() -> None:
    d = Driver(version=4)
    d.open("a")
    d.open("b")
    token = d.acquire("a", "e", meta={"value": "one", "host": "h"}).result
    assert isinstance(token, Granted)
    d.acquire("b", "e", wait=True, meta={"value": "two"})
    result = _proclaim(d, "a", "e", "uno")
    assert result == Granted("e", token.token, "a")
    view = d.sm.get("e")
    assert view is not None
    (holder,) = view.holders
    assert (holder.token, dict(holder.meta)) == (token.token, {"value": "uno", "host": "h"})
    assert d.waiters("e") == ["b"]


def test_a_lease_that_does_not_lead_is_refused_and_changes_nothing() -> None:
    d = Driver(version=4)
    d.open("a")
    d.open("b")
    d.acquire("a", "e", meta={"value": "one"})
    d.acquire("b", "e", wait=True)
    before = d.image()
    assert isinstance(_proclaim(d, "b", "e", "mine"), NotHeld)
    assert isinstance(_proclaim(d, "a", "other", "x"), NotHeld)
    assert d.image()[4] == before[4]  # type: ignore[index]  # the keys, holders and values


def test_before_version_4_a_proclaim_is_refused_alike_everywhere() -> None:
    d = Driver(version=3)
    d.open("a")
    d.acquire("a", "e")
    result = _proclaim(d, "a", "e", "x")
    assert isinstance(result, Invalid) and "version 4" in result.message


def test_the_entry_round_trips() -> None:
    cmd = ProclaimCommand("a", "e", "v", Origin("c1", 3, 1), 5, "ops")
    assert decode_command(encode_command(cmd)) == cmd
