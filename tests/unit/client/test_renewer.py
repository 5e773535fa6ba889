"""core.Renewer on a fake clock: when a kept-alive lease renews, pings and is given up."""

from __future__ import annotations

import pytest

from dlm.client import core


def renewer(ttl_ms: int = 3_000, at: float = 0.0, interval: float | None = None) -> core.Renewer:
    return core.Renewer(core.LeaseClock(ttl_ms, at), at, interval=interval)


def renew_time(r: core.Renewer, now: float) -> float:
    step = r.next_step(now)
    assert isinstance(step, core.RenewAt)
    return step.at


def test_renews_every_third_of_the_ttl_from_the_last_renewal_that_counted() -> None:
    r = renewer(3_000)
    assert r.next_step(0.0) == core.RenewAt(1.0)
    assert r.next_step(1.0) == core.RenewAt(1.0)  # due: perform it now
    assert r.renewed(1.0, 3_000, now=1.2) == 3_000
    assert r.next_step(1.2) == core.RenewAt(2.0)
    assert r.renewals == 1
    assert r.clock.deadline == core.lease_deadline(1.0, 3_000)


def test_a_fixed_interval_overrides_the_third() -> None:
    r = renewer(3_000, interval=0.05)
    assert r.next_step(0.0) == core.RenewAt(0.05)


def test_a_failed_renewal_is_retried_within_a_quarter_interval_at_most_250ms() -> None:
    r = renewer(3_000)
    # The renewal was due at 1.0 and failed at 1.1: it goes again after a pause, not at
    # once (an error that retrying cannot mend would otherwise have it resent in a loop).
    r.renewal_failed(1.1)
    assert renew_time(r, 1.1) == pytest.approx(1.35)
    r.renewal_failed(1.35)
    assert renew_time(r, 1.35) == pytest.approx(1.6)
    # A renewal made elsewhere counts; the retry stays where it was.
    assert r.confirmed(1.5, 3_000, now=1.55) == 3_000
    assert renew_time(r, 1.55) == pytest.approx(1.6)
    short = renewer(300)
    short.confirmed(0.09, 300, now=0.095)
    short.renewal_failed(0.1)
    assert renew_time(short, 0.1) == pytest.approx(0.1 + 0.025)
    # A success forgets the retry.
    assert r.renewed(1.6, 3_000, now=1.65) == 3_000
    assert renew_time(r, 1.65) == pytest.approx(2.6)


def test_an_idle_connection_pings_between_long_renewals() -> None:
    r = renewer(300_000)  # renews every 100 s; a member drops a connection silent for 120 s
    assert r.next_step(0.0) == core.PingAt(core.PING_EVERY_S)
    assert r.next_step(core.PING_EVERY_S) == core.PingAt(core.PING_EVERY_S)
    r.pinged(30.0)
    assert r.next_step(30.0) == core.PingAt(60.0)
    r.pinged(60.0)
    r.pinged(90.0)
    assert r.next_step(99.0) == core.RenewAt(100.0)
    # Both due: the renewal carries a request, so it does the ping's work.
    assert r.next_step(125.0) == core.RenewAt(100.0)
    assert r.renewed(125.0, 300_000, now=125.5) == 300_000
    assert r.next_step(125.5) == core.PingAt(155.5)


def test_a_short_ttl_never_pings() -> None:
    r = renewer(3_000)
    now = 0.0
    for _ in range(100):
        step = r.next_step(now)
        assert isinstance(step, core.RenewAt)
        now = step.at
        assert r.renewed(now, 3_000, now=now + 0.01) == 3_000


def test_lost_once_the_deadline_passes_unconfirmed() -> None:
    r = renewer(3_000)
    r.renewal_failed(1.0)
    deadline = r.clock.deadline
    assert isinstance(r.next_step(deadline - 0.001), core.RenewAt)
    assert r.next_step(deadline) == core.Lost()
    assert "could not be renewed before its deadline (3000 ms" in r.lost_reason("L")


def test_a_renewal_answered_after_the_deadline_counts_for_nothing() -> None:
    r = renewer(3_000)
    deadline = r.clock.deadline
    assert r.renewed(1.0, 3_000, now=deadline + 0.001) is None
    assert r.next_step(deadline + 0.002) == core.Lost()
    assert r.clock.deadline == deadline and r.renewals == 0


def test_a_renewal_sent_before_a_ttl_update_moves_nothing_and_pacing_follows_the_update() -> None:
    r = renewer(30_000)
    assert r.next_step(1.0) == core.RenewAt(10.0)
    ticket = r.clock.update_sent(2.0, 3_000)
    # The update brings the renewal forward at once, and the deadline down.
    assert r.next_step(2.0) == core.RenewAt(1.0)
    assert r.clock.deadline == core.lease_deadline(2.0, 3_000)
    assert r.renewed(1.5, 30_000, now=2.1) == 0  # sent before the update
    assert r.renewals == 0
    r.clock.update_settled(ticket, 3_000, 2.2, applied=True)
    assert r.next_step(2.2) == core.RenewAt(3.0)


def test_a_renewal_made_elsewhere_counts_without_touching_the_connection_pace() -> None:
    r = renewer(300_000)
    r.pinged(20.0)
    assert r.confirmed(25.0, 300_000, now=25.1) == 300_000
    assert r.renewals == 1
    # The renewing connection has been idle since 20 all the same.
    assert r.next_step(25.1) == core.PingAt(20.0 + core.PING_EVERY_S)
