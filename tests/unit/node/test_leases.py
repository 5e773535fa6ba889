"""The leader's lease deadlines, driven by made-up clock readings."""

from __future__ import annotations

import random

from dlm.node.leases import LeaseTracker


def leader(now: float = 100.0, leases: list[tuple[str, int]] | None = None) -> LeaseTracker:
    tracker = LeaseTracker(expire_retry=1.0)
    tracker.take_office(now, leases or [])
    return tracker


def test_follower_tracks_nothing() -> None:
    tracker = LeaseTracker()
    tracker.opened("a", 1000, now=0.0)
    assert "a" not in tracker
    assert tracker.due(1e9) == []
    assert tracker.next_timer() is None
    assert not tracker.renew("a", 0.0)


def test_taking_office_gives_every_lease_a_full_ttl_from_that_moment() -> None:
    tracker = leader(now=50.0, leases=[("a", 2000), ("b", 5000)])
    assert tracker.remaining_ms("a", 50.0) == 2000
    assert tracker.remaining_ms("b", 50.0) == 5000
    assert tracker.due(51.999) == []
    assert tracker.due(52.0) == ["a"]
    assert tracker.next_timer() == 53.0  # a's retry and b's deadline coincide at 53 and 55
    assert tracker.due(54.9) == ["a"]  # still tracked a second later: report again
    assert tracker.due(55.0) == ["b"]


def test_a_lease_is_reported_once_then_again_only_after_the_retry_interval() -> None:
    tracker = leader()
    tracker.opened("a", 1000, now=100.0)
    assert tracker.due(101.0) == ["a"]
    assert tracker.due(101.5) == []
    assert tracker.due(102.0) == ["a"]
    tracker.ended("a")
    assert tracker.due(200.0) == []
    assert tracker.next_timer() is None


def test_renew_moves_the_deadline_from_the_receipt_time_and_never_backwards() -> None:
    tracker = leader()
    tracker.opened("a", 1000, now=100.0)
    assert tracker.renew("a", received_at=100.6)
    assert tracker.remaining_ms("a", 100.6) == 1000
    assert tracker.renew("a", received_at=100.2)  # older receipt: no change
    assert tracker.remaining_ms("a", 100.6) == 1000
    assert tracker.due(101.5) == []
    assert tracker.due(101.6) == ["a"]


def test_a_lease_being_expired_cannot_be_renewed() -> None:
    tracker = leader()
    tracker.opened("a", 1000, now=0.0)
    assert tracker.due(1.0) == ["a"]
    assert tracker.is_expiring("a")
    assert not tracker.renew("a", 1.0)
    tracker.opened("a", 1000, now=1.0)  # a late re-open does not rescue it either
    assert tracker.is_expiring("a")


def test_unknown_leases_are_not_renewed() -> None:
    tracker = leader()
    assert not tracker.renew("ghost", 1.0)
    assert tracker.remaining_ms("ghost", 1.0) is None


def test_leaving_office_forgets_everything() -> None:
    tracker = leader(leases=[("a", 1000)])
    tracker.leave_office()
    assert not tracker.leading
    assert len(tracker) == 0
    assert tracker.due(1e9) == []


def test_many_renewals_keep_the_heap_bounded_and_deadlines_right() -> None:
    rng = random.Random(7)
    tracker = leader(now=0.0)
    names = [f"l{i}" for i in range(50)]
    for name in names:
        tracker.opened(name, 3000, now=0.0)
    now = 0.0
    for _ in range(5000):
        now += 0.001
        tracker.renew(rng.choice(names), now)
    assert len(tracker._heap) <= 4 * len(tracker) + 65
    expected = sorted(names, key=lambda n: (tracker.remaining_ms(n, now), n))
    reported: list[str] = []
    t = now
    for _ in range(100):
        timer = tracker.next_timer()
        assert timer is not None
        t = max(t, timer)
        reported.extend(tracker.due(t))
        if len(set(reported)) == len(names):
            break
    assert set(reported) == set(names)
    # First reports come in deadline order.
    first_seen = list(dict.fromkeys(reported))
    assert [tracker.remaining_ms(n, now) for n in first_seen] == sorted(
        tracker.remaining_ms(n, now) or 0 for n in expected
    )
