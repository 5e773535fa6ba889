"""Leader spread (dlm/node/spread.py): each partition's preference order, the leader's
choice of a successor, and the node machine handing leadership over on its tick."""

from __future__ import annotations

from collections import Counter

import pytest

from dlm.node.raft.types import Role
from dlm.node.spread import (
    CAUGHT_UP_LAG,
    SETTLE_ELECTION_TIMEOUTS,
    LeaderSpread,
    leader_counts_bound,
    preference,
)
from dlm.records import NodeId

from .machine_driver import Cluster

VOTERS = ("n1", "n2", "n3")


def test_partition_i_prefers_the_sorted_voters_rotated_left_by_i() -> None:
    assert preference(["n3", "n1", "n2"], 0) == ["n1", "n2", "n3"]
    assert preference(VOTERS, 1) == ["n2", "n3", "n1"]
    assert preference(VOTERS, 2) == ["n3", "n1", "n2"]
    assert preference(VOTERS, 4) == ["n2", "n3", "n1"]
    assert preference((), 3) == []


@pytest.mark.parametrize("members", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 7, 8, 16, 64])
def test_no_member_is_first_choice_of_more_than_ceil_p_over_n(
    partitions: int, members: int
) -> None:
    voters = [f"n{i}" for i in range(1, members + 1)]
    firsts = Counter(preference(voters, p)[0] for p in range(partitions))
    assert max(firsts.values()) <= leader_counts_bound(partitions, members)
    assert max(firsts.values()) - min(firsts.get(v, 0) for v in voters) <= 1


def _spread(partition: int, *, settle: float = 1.0) -> LeaderSpread:
    return LeaderSpread(partition, 4, settle_s=settle)


def _decide(
    spread: LeaderSpread,
    now: float,
    *,
    me: NodeId = "n1",
    healthy: frozenset[str] = frozenset(VOTERS),
    match: dict[NodeId, int] | None = None,
    transferring: bool = False,
    conf_pending: bool = False,
) -> NodeId | None:
    return spread.decide(
        me=me,
        voters=VOTERS,
        healthy=lambda m: m in healthy,
        match=match if match is not None else dict.fromkeys(VOTERS, 100),
        last_index=100,
        transferring=transferring,
        conf_pending=conf_pending,
        now=now,
    )


def test_a_leader_that_is_its_partitions_first_choice_keeps_leading() -> None:
    spread = _spread(0)
    assert _decide(spread, 0.0) is None
    assert _decide(spread, 5.0) is None


def test_a_leader_hands_over_to_the_first_choice_once_it_has_been_healthy_for_the_settle_time() -> (
    None
):
    spread = _spread(1)  # prefers n2, n3, n1
    assert _decide(spread, 0.0) is None  # n2 healthy since 0.0: not settled yet
    assert _decide(spread, 0.5) is None
    assert _decide(spread, 1.0) == "n2"


def test_an_unhealthy_or_lagging_first_choice_is_passed_over_for_the_next() -> None:
    spread = _spread(1)
    assert _decide(spread, 0.0, healthy=frozenset({"n1", "n3"})) is None
    assert _decide(spread, 1.0, healthy=frozenset({"n1", "n3"})) == "n3"
    spread = _spread(1)
    behind = {"n1": 100, "n2": 100 - CAUGHT_UP_LAG - 1, "n3": 100}
    _decide(spread, 0.0, match=behind)
    assert _decide(spread, 1.0, match=behind) == "n3"


def test_the_only_qualified_voters_rank_below_the_leader_so_it_stays() -> None:
    spread = _spread(2)  # prefers n3, n1, n2: n1 (the leader) is second
    assert _decide(spread, 0.0, healthy=frozenset({"n1", "n2"})) is None
    assert _decide(spread, 10.0, healthy=frozenset({"n1", "n2"})) is None


def test_a_flapping_voter_restarts_its_settle_time_each_time_it_drops() -> None:
    spread = _spread(1)  # prefers n2, n3, n1; n3 is down throughout
    up, down = frozenset({"n1", "n2"}), frozenset({"n1"})
    for t in (0.0, 0.8, 1.6, 2.4):
        assert _decide(spread, t, healthy=up) is None
        assert _decide(spread, t + 0.7, healthy=up) is None
        assert _decide(spread, t + 0.75, healthy=down) is None
    assert _decide(spread, 3.2, healthy=up) is None
    assert _decide(spread, 4.2, healthy=up) == "n2"  # up for a whole settle time at last


def test_nothing_is_decided_in_a_transfer_an_uncommitted_change_or_right_after_an_attempt() -> None:
    spread = _spread(1)
    _decide(spread, 0.0)
    assert _decide(spread, 1.0, transferring=True) is None
    assert _decide(spread, 1.0, conf_pending=True) is None
    assert _decide(spread, 1.0) == "n2"
    # The transfer did not happen (n1 still leads): the next attempt waits a settle time.
    assert _decide(spread, 1.5) is None
    assert _decide(spread, 2.0) == "n2"


def test_one_partition_has_no_spread() -> None:
    spread = LeaderSpread(1, 1, settle_s=0.0)
    assert not spread.active
    assert _decide(spread, 0.0) is None
    assert _decide(spread, 100.0) is None


def test_losing_leadership_forgets_what_the_leader_saw() -> None:
    spread = _spread(1)
    _decide(spread, 0.0)
    spread.left_office()
    assert _decide(spread, 0.9) is None  # n2 healthy again only from 0.9
    assert _decide(spread, 2.0) == "n2"


# -- the node machine ---------------------------------------------------------------


def _group(partition: int, partitions: int) -> Cluster:
    """Three machines of one partition's group."""
    return Cluster(3, partition=partition, partitions=partitions)


def _settle_s(cluster: Cluster) -> float:
    return cluster.timing.election_timeout_s * SETTLE_ELECTION_TIMEOUTS


def test_the_leader_of_partition_1_hands_leadership_to_n2() -> None:
    cluster = _group(partition=1, partitions=3)
    cluster.elect("n1")
    cluster.run_until(lambda: cluster["n2"].role is Role.LEADER, 3 * _settle_s(cluster), "n2 leads")
    assert cluster.leader.id == "n2"
    events = cluster["n1"].events
    assert any(e.event == "transfer_leadership" and e.fields.get("to") == "n2" for e in events)
    cluster.advance(3 * _settle_s(cluster))
    assert cluster.leader.id == "n2"  # and it keeps it: no churn


def test_with_one_partition_the_first_leader_keeps_leading() -> None:
    cluster = _group(partition=1, partitions=1)
    cluster.elect("n1")
    cluster.advance(3 * _settle_s(cluster))
    assert cluster.leader.id == "n1"


def test_the_spread_returns_once_the_preferred_member_is_back_and_settled() -> None:
    cluster = _group(partition=1, partitions=3)
    cluster.elect("n2")
    cluster.advance(_settle_s(cluster))
    assert cluster.leader.id == "n2"
    cluster.blocked = lambda msg: "n2" in (msg.src, msg.dst)
    cluster.run_until(
        lambda: any(cluster[n].role is Role.LEADER for n in ("n1", "n3")),
        _settle_s(cluster),
        "n1 or n3 takes over",
    )
    cluster.blocked = lambda msg: False
    cluster.run_until(
        lambda: cluster["n2"].role is Role.LEADER, 4 * _settle_s(cluster), "n2 leads again"
    )
    # Not before the settle time: n2 was heard again only after the cut ended.
    cluster.advance(2 * _settle_s(cluster))
    assert cluster.leader.id == "n2"
