"""Peer health on its own: who answers, and silence said once per silence."""

from __future__ import annotations

from dlm.node.outbox import Instant
from dlm.node.peer_health import PeerHealth

START = Instant(100.0, 0)
TIMEOUT = 0.3


def _at(mono: float) -> Instant:
    return Instant(mono, 0)


def test_a_member_answers_until_its_link_drops_or_it_is_quiet_too_long() -> None:
    health = PeerHealth("n1", TIMEOUT, START)
    assert health.answers("n1", START)  # this member
    assert not health.answers("n2", START)  # never heard
    health.heard_from("n2", START)
    assert health.answers("n2", _at(100.0 + 2 * TIMEOUT))
    assert not health.answers("n2", _at(100.0 + 2 * TIMEOUT + 0.01))
    health.links_down.add("n2")
    assert not health.answers("n2", START)
    health.heard_from("n2", _at(101.0))  # heard again: the link is back
    assert health.answers("n2", _at(101.0))
    assert health.last_contact_ms("n2", _at(101.25)) == 250


def test_the_leader_says_a_silent_member_once_and_again_only_after_it_returns() -> None:
    health = PeerHealth("n1", TIMEOUT, START)
    members = ("n1", "n2", "n3")
    health.heard_from("n3", _at(100.2))
    assert health.newly_silent(members, True, _at(100.25)) == []
    silent = health.newly_silent(members, True, _at(100.35))
    assert [m for m, _ in silent] == ["n2"]
    assert [m for m, _ in health.newly_silent(members, True, _at(100.6))] == ["n3"]
    assert health.newly_silent(members, True, _at(100.9)) == []  # each said once
    assert health.heard_from("n2", _at(101.0)) is not None  # regained, with how long
    assert health.heard_from("n2", _at(101.1)) is None
    assert health.newly_silent(members, False, _at(200.0)) == []  # not leading: nothing
    assert not health.silent
