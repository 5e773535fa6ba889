"""The verdict on a cluster's figures: healthy, degraded or no quorum, and how many failures it
survives. Voters only: learners never count."""

from __future__ import annotations

from typing import Any

import pytest

from dlm.cli import health
from dlm.views import StatusView


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


# -- partitions ---------------------------------------------------------------------------


def partition_view(
    commit: int = 500,
    matches: dict[str, int] | None = None,
    contacts: dict[str, int] | None = None,
    role: str = "leader",
    learners: tuple[str, ...] = (),
) -> StatusView:
    matches = matches if matches is not None else {"n1": 500, "n2": 500, "n3": 500}
    contacts = contacts or {}
    return StatusView.from_wire(
        {
            "node": "n1",
            "role": role,
            "leader": "n1",
            "term": 3,
            "commit": commit,
            "members": [
                {
                    "id": n,
                    "address": f"10.0.0.{n[-1]}:7700",
                    "role": "learner" if n in learners else "voter",
                }
                for n in matches
            ],
            "progress": {
                n: {
                    "match": m,
                    "next": m + 1,
                    "active": True,
                    "last_contact_ms": contacts.get(n, 10),
                }
                for n, m in matches.items()
            },
        }
    )


def test_lag_is_the_leader_s_commit_minus_the_slowest_voter_s_match() -> None:
    view = partition_view(
        commit=500, matches={"n1": 502, "n2": 480, "n3": 499, "n4": 3}, learners=("n4",)
    )
    # n4 is a learner: it takes no part in a quorum, so its 497 entries do not count.
    assert health.replication_lag(view) == 20
    assert health.replication_lag(partition_view(matches={"n1": 510, "n2": 505})) == 0
    # Only the leader knows the voters' match indexes.
    assert health.replication_lag(partition_view(role="follower")) is None
    assert health.replication_lag(None) is None


def test_a_partition_entry_has_exactly_the_five_fields() -> None:
    entry = health.partition_entry(2, partition_view(matches={"n1": 500, "n2": 490}))
    assert entry == {"partition": 2, "leader": "n1", "term": 3, "commit": 500, "lag": 10}
    assert health.partition_entry(3, None) == {
        "partition": 3, "leader": None, "term": None, "commit": None, "lag": None,
    }  # fmt: skip


def test_each_partition_problem_names_its_partition() -> None:
    leaderless = health.partition_entry(3, None)
    assert health.partition_problems(leaderless, None, "no quorum within 5s") == [
        "partition 3 has no leader (no quorum within 5s)"
    ]
    behind = partition_view(matches={"n1": 5000, "n2": 5000, "n3": 100}, commit=5000)
    problems = health.partition_problems(health.partition_entry(1, behind), behind)
    assert problems == ["partition 1: its slowest voter is 4900 entries behind the leader"]
    silent = partition_view(contacts={"n3": 9000})
    problems = health.partition_problems(health.partition_entry(2, silent), silent)
    assert problems == ["partition 2: its leader has not heard from n3 for 9s"]
    # A member every partition misses is reported once, with partition 0's members.
    assert (
        health.partition_problems(
            health.partition_entry(2, silent), silent, known_down=frozenset({"n3"})
        )
        == []
    )
    fine = partition_view()
    assert health.partition_problems(health.partition_entry(1, fine), fine) == []


def test_any_partition_s_problem_makes_the_cluster_degraded() -> None:
    healthy = health.assess([member("n1"), member("n2"), member("n3")], "n1")
    assert health.with_partitions(healthy, [], serving=True) is healthy
    verdict = health.with_partitions(healthy, ["partition 2 has no leader"], serving=True)
    assert verdict["state"] == "degraded" and verdict["healthy"] is False
    assert health.check_line(verdict).startswith("degraded: partition 2 has no leader; survives")
    down = health.assess([member("n1"), member("n2"), member("n3", reachable=False)], "n1")
    both = health.with_partitions(down, ["partition 1: x"], serving=True)
    assert both["reason"].endswith("does not answer; partition 1: x")
    # Partition 0 without a leader while others serve: degraded, not without a quorum.
    rows = [member("n1"), member("n2"), member("n3")]
    lost = health.no_quorum(rows, "no leader answered")
    partial = health.with_partitions(
        lost, ["partition 0 has no leader (no leader answered)"], serving=True
    )
    assert partial["state"] == "degraded"
    assert (
        health.with_partitions(lost, ["partition 0 has no leader"], serving=False)["state"]
        == "no_quorum"
    )


def test_a_partition_s_leader_that_does_not_answer_is_named_unless_already_down() -> None:
    entry = health.partition_entry(1, partition_view(role="follower"))
    assert health.partition_problems(entry, None, leader_silent=True) == [
        "partition 1: its leader n1 does not answer"
    ]
    assert health.partition_problems(entry, None, None, frozenset({"n1"}), leader_silent=True) == []
