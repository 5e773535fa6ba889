"""The verdict on a cluster's figures: healthy, degraded or no quorum, and how many failures it
survives. Voters only: learners never count."""

from __future__ import annotations

from typing import Any

import pytest

from dlm.cli import health


def member(
    node: str,
    *,
    reachable: bool = True,
    lag: int | None = 0,
    last_contact_ms: int | None = None,
    voter: bool = True,
) -> dict[str, Any]:
    return {
        "id": node,
        "address": f"10.0.0.{node[-1]}:7700",
        "reachable": reachable,
        "lag": lag,
        "last_contact_ms": last_contact_ms,
        "voter": voter,
    }


def test_all_voters_up_is_healthy_and_survives_a_minority() -> None:
    verdict = health.assess([member("n1"), member("n2"), member("n3")], "n1")
    assert verdict["state"] == "healthy" and verdict["healthy"] is True
    assert (verdict["voters"], verdict["voters_up"], verdict["quorum"]) == (3, 3, 2)
    assert verdict["tolerates"] == 1
    assert "survives 1 more member failure" in health.tolerance_line(verdict)
    five = health.assess([member(f"n{i}") for i in range(1, 6)], "n1")
    assert five["tolerates"] == 2


@pytest.mark.parametrize(
    ("n3", "needle"),
    [
        (member("n3", reachable=False), "n3 (10.0.0.3:7700) does not answer"),
        (member("n3", lag=1001), "1001 entries behind"),
        (member("n3", last_contact_ms=1201), "has not heard from n3"),
    ],
)
def test_one_voter_in_trouble_is_degraded_and_says_which(n3: dict[str, Any], needle: str) -> None:
    verdict = health.assess([member("n1"), member("n2"), n3], "n1")
    assert verdict["state"] == "degraded" and verdict["healthy"] is False
    assert needle in verdict["reason"]
    assert needle in health.check_line(verdict)


def test_the_thresholds_are_inclusive_of_the_limit() -> None:
    at_limit = [member("n1"), member("n2", lag=1000), member("n3", last_contact_ms=1200)]
    assert health.assess(at_limit, "n1")["state"] == "healthy"


def test_a_lagging_voter_still_counts_towards_the_quorum_but_a_silent_one_does_not() -> None:
    lagging = health.assess([member("n1"), member("n2"), member("n3", lag=5000)], "n1")
    assert lagging["tolerates"] == 1
    silent = health.assess([member("n1"), member("n2"), member("n3", last_contact_ms=9000)], "n1")
    assert (silent["voters_up"], silent["tolerates"]) == (2, 0)
    assert "survives no further member failure" in health.tolerance_line(silent)


def test_the_leader_itself_is_never_silent() -> None:
    verdict = health.assess([member("n1", last_contact_ms=99_999), member("n2")], "n1")
    assert verdict["state"] == "healthy"


def test_learners_never_count() -> None:
    rows = [
        member("n1"),
        member("n2"),
        member("n3"),
        member("n4", reachable=False, voter=False),
        member("n5", lag=10**6, last_contact_ms=10**6, voter=False),
    ]
    verdict = health.assess(rows, "n1")
    assert verdict["state"] == "healthy"
    assert (verdict["voters"], verdict["quorum"], verdict["tolerates"]) == (3, 2, 1)


def test_no_quorum() -> None:
    rows = [member("n1"), member("n2", reachable=False), member("n3", reachable=False)]
    verdict = health.no_quorum(rows, "no leader with a quorum within 10s")
    assert verdict["state"] == "no_quorum" and verdict["healthy"] is False
    assert (verdict["voters_up"], verdict["quorum"], verdict["tolerates"]) == (1, 2, 0)
    assert health.check_line(verdict) == "no quorum: no leader with a quorum within 10s"


def test_member_names_are_escaped_in_the_reason() -> None:
    odd = {**member("n3", reachable=False), "id": "n3\x1b[2J"}
    verdict = health.assess([member("n1"), member("n2"), odd], "n1")
    assert "\x1b" not in verdict["reason"] and "n3\\x1b[2J" in verdict["reason"]
