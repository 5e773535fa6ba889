"""The client's routes through a gateway (dlm gateway): it never dials a member itself."""

from __future__ import annotations

from typing import Any

from dlm.client import core
from dlm.partitioning import preamble, target_preamble
from dlm.wire import ok
from tests.unit.client.test_core import drive, not_leader, settings


def test_marked_gateways_parse_and_split() -> None:
    members = core.parse_members("gateway:gw.example:7100, a:1")
    assert members == ["gateway:gw.example:7100", "a:1"]
    assert core.split_route("a:1") == ("a:1", None, False)
    assert core.split_route("gateway:g:7") == ("g:7", None, True)
    route = core.gateway_route("g:7", "10.0.0.1:7000")
    assert route == "gateway:g:7>10.0.0.1:7000"
    assert core.split_route(route) == ("g:7", "10.0.0.1:7000", True)


def test_dial_plan_sends_the_target_preamble_through_a_gateway() -> None:
    assert core.dial_plan("a:1", 0) == ("a", 1, b"", "a")
    assert core.dial_plan("a:1", 2) == ("a", 1, preamble(2), "a")
    route = core.gateway_route("g:7", "m.example:7000")
    assert core.dial_plan(route, 3) == ("g", 7, target_preamble(3, "m.example:7000"), "m.example")


def test_through_a_known_gateway_a_redirect_names_the_leader_to_the_gateway() -> None:
    s, clock = settings(["g:7"])
    s.gateways.add("g:7")  # the driver saw the gateway's notice
    leader = core.gateway_route("g:7", "l:3")
    chain = {"g:7": not_leader("l:3"), leader: ok(1, lease="x")}
    sent: list[str] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.addr)
        return chain[action.addr]

    addr, _ = drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert sent == ["g:7", leader]
    assert addr == leader
    # A redirect from the leader reached through the gateway stays behind the gateway too.
    chain[leader] = not_leader("m:4")
    chain[core.gateway_route("g:7", "m:4")] = ok(2, lease="x")
    sent.clear()
    drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert sent == [leader, "gateway:g:7>m:4"]


def test_a_marked_gateway_is_known_without_a_notice_and_a_dead_leader_leads_back_to_it() -> None:
    s, clock = settings(["gateway:g:7"])
    leader = core.gateway_route("g:7", "l:3")
    outcomes = iter([not_leader("l:3"), core.Failed("connection refused"), ok(1)])
    sent: list[str] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.addr)
        return next(outcomes)

    drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert sent == ["gateway:g:7", leader, "gateway:g:7"]


def test_without_a_gateway_redirects_go_to_the_member() -> None:
    s, clock = settings(["a:1"])
    chain = {"a:1": not_leader("b:2"), "b:2": ok(1)}
    sent: list[str] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.addr)
        return chain[action.addr]

    drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert sent == ["a:1", "b:2"]
    assert s.member_route("b:2") == "b:2"


def test_status_views_reach_members_through_the_gateway() -> None:
    s, _ = settings(["g:7"])
    s.gateways.add("g:7")
    assert s.member_route("m:4") == "gateway:g:7>m:4"


def test_the_notice_and_the_replies_that_send_a_client_back_to_its_gateway() -> None:
    assert core.is_gateway_notice({"t": "gateway", "version": 1})
    assert not core.is_gateway_notice({"t": "welcome"})
    assert core.redial_through_gateway(not_leader("l:3"))
    assert not core.redial_through_gateway(ok(1))
