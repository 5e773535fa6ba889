"""The leader's lease deadlines, driven by made-up clock readings."""

from __future__ import annotations

import random

from dlm.node.leases import LeaseTracker


def leader(now: float = 100.0, leases: list[tuple[str, int, int]] | None = None) -> LeaseTracker:
    tracker = LeaseTracker(expire_retry=1.0)
    tracker.take_office(now, leases or [])
    return tracker


def test_a_follower_tracks_nothing() -> None:
    tracker = LeaseTracker()
    tracker.arm("a", 1000, 7, now=0.0)
    assert "a" not in tracker
    assert tracker.due(1e9) == []
    assert tracker.next_timer() is None
    assert not tracker.renew("a", 0.0)


def test_taking_office_gives_every_lease_a_full_ttl_from_that_moment() -> None:
    tracker = leader(now=50.0, leases=[("a", 2000, 3), ("b", 5000, 0)])
    assert tracker.remaining_ms("a", 50.0) == 2000
    assert tracker.remaining_ms("b", 50.0) == 5000
    assert tracker.due(51.999) == []
    assert tracker.due(52.0) == [("a", 3)]
    assert tracker.next_timer() == 53.0  # a's retry; b's deadline is at 55
    assert tracker.due(54.9) == [("a", 3)]  # still tracked a second later: report again
    assert tracker.due(55.0) == [("b", 0)]


def test_taking_office_again_forgets_what_was_tracked_before() -> None:
    tracker = leader(now=0.0, leases=[("a", 1000, 3)])
    tracker.take_office(10.0, [("b", 1000, 4)])
    assert "a" not in tracker
    assert tracker.due(11.0) == [("b", 4)]


def test_due_names_the_incarnation_that_was_armed() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 42, now=100.0)
    assert tracker.due(101.0) == [("a", 42)]


def test_a_lease_is_reported_once_then_again_only_after_the_retry_interval() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=100.0)
    assert tracker.due(101.0) == [("a", 1)]
    assert tracker.due(101.5) == []
    assert tracker.due(102.0) == [("a", 1)]
    tracker.ended("a")
    assert tracker.due(200.0) == []
    assert tracker.next_timer() is None


def test_renew_moves_the_deadline_from_the_receipt_time_and_never_backwards() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=100.0)
    assert tracker.renew("a", received_at=100.6)
    assert tracker.remaining_ms("a", 100.6) == 1000
    assert tracker.renew("a", received_at=100.2)  # older receipt: no change
    assert tracker.remaining_ms("a", 100.6) == 1000
    assert tracker.due(101.5) == []
    assert tracker.due(101.6) == [("a", 1)]


def test_a_keepalive_seq_extends_the_lease_at_most_once() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=100.0)
    assert tracker.renew("a", 100.5, client="p", seq=7)
    assert tracker.renew("a", 100.9, client="p", seq=7)  # a copy: acknowledged, no extension
    assert tracker.remaining_ms("a", 100.5) == 1000


def test_an_older_keepalive_seq_is_acknowledged_without_extending() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=100.0)
    assert tracker.renew("a", 100.5, client="p", seq=7)
    assert tracker.renew("a", 100.9, client="p", seq=6)
    assert tracker.remaining_ms("a", 100.5) == 1000
    assert tracker.renew("a", 100.9, client="p", seq=8)
    assert tracker.remaining_ms("a", 100.9) == 1000


def test_keepalive_seqs_are_counted_per_client() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=100.0)
    tracker.renew("a", 100.5, client="p", seq=7)
    assert tracker.renew("a", 100.9, client="q", seq=3)
    assert tracker.remaining_ms("a", 100.9) == 1000


def test_a_keepalive_without_a_client_extends_every_time() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=100.0)
    tracker.renew("a", 100.5)
    assert tracker.renew("a", 100.9)
    assert tracker.remaining_ms("a", 100.9) == 1000


def test_a_lease_being_expired_cannot_be_renewed() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=0.0)
    assert tracker.due(1.0) == [("a", 1)]
    assert tracker.is_expiring("a")
    assert not tracker.renew("a", 1.0)
    assert not tracker.renew("a", 1.0, client="p", seq=99)


def test_arming_a_doomed_incarnation_does_not_rescue_it() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=0.0)
    tracker.due(1.0)
    tracker.arm("a", 1000, 1, now=1.0)  # a join or update applied after the Expire was proposed
    assert tracker.is_expiring("a")
    assert tracker.due(2.0) == [("a", 1)]  # the retry still comes


def test_arming_a_new_incarnation_of_a_doomed_id_tracks_the_new_lease() -> None:
    tracker = leader()
    tracker.arm("a", 1000, 1, now=0.0)
    tracker.due(1.0)
    tracker.arm("a", 5000, 9, now=1.5)
    assert not tracker.is_expiring("a")
    assert tracker.remaining_ms("a", 1.5) == 5000
    assert tracker.due(2.0) == []  # no retry for the old one
    assert tracker.renew("a", 2.0)
    assert tracker.due(7.0) == [("a", 9)]


def test_arming_a_live_lease_restarts_its_clock_with_the_new_ttl() -> None:
    tracker = leader()
    tracker.arm("a", 10_000, 1, now=100.0)
    tracker.arm("a", 250, 1, now=101.0)  # lease_update finishing a minimum hold
    assert tracker.remaining_ms("a", 101.0) == 250
    assert tracker.due(101.25) == [("a", 1)]


def test_an_ended_lease_is_forgotten() -> None:
    tracker = leader(leases=[("a", 1000, 1)])
    tracker.ended("a")
    assert "a" not in tracker
    assert not tracker.renew("a", 100.5)
    assert tracker.due(1e9) == []


def test_unknown_leases_are_not_renewed() -> None:
    tracker = leader()
    assert not tracker.renew("ghost", 1.0)
    assert tracker.remaining_ms("ghost", 1.0) is None


def test_leaving_office_forgets_everything() -> None:
    tracker = leader(leases=[("a", 1000, 1)])
    tracker.leave_office()
    assert not tracker.leading
    assert len(tracker) == 0
    assert tracker.due(1e9) == []


def test_many_renewals_keep_the_heap_bounded_and_deadlines_right() -> None:
    rng = random.Random(7)
    tracker = leader(now=0.0)
    names = [f"l{i}" for i in range(50)]
    for incarnation, name in enumerate(names, start=1):
        tracker.arm(name, 3000, incarnation, now=0.0)
    now = 0.0
    for seq in range(5000):
        now += 0.001
        tracker.renew(rng.choice(names), now, client="p", seq=seq)
    assert len(tracker._heap) <= 4 * len(tracker) + 65
    deadlines = {n: tracker.remaining_ms(n, now) or 0 for n in names}
    reported: list[str] = []
    t = now
    for _ in range(100):
        timer = tracker.next_timer()
        assert timer is not None
        t = max(t, timer)
        reported.extend(lease for lease, _ in tracker.due(t))
        if len(set(reported)) == len(names):
            break
    assert set(reported) == set(names)
    # First reports come in deadline order.
    first_seen = list(dict.fromkeys(reported))
    assert [deadlines[n] for n in first_seen] == sorted(deadlines.values())
