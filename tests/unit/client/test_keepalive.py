"""KeepAlive: renews in the background, and says promptly when the lease can't be trusted.

Against a real member (real_member.py): a frozen member plays every member
SIGSTOPped; a silent double plays a member that hangs on a renewal.
"""

from __future__ import annotations

import threading
import time

import pytest

from dlm.client import Client, KeepAlive, core, renewal
from dlm.client.clock import lease_clock
from dlm.node.machine import NodeMachine

from .doubles import silent_member
from .real_member import WAIT, RunningMember


def test_renews_on_its_own_connection_and_moves_the_deadline_forward(
    member: RunningMember,
) -> None:
    with Client(member.addr, timeout=2.0) as c:
        lease = c.open_lease(1000)
        first_deadline = core.lease_deadline(lease.confirmed_at, lease.ttl_ms)
        with KeepAlive(c, lease, interval=0.05) as ka:
            member.wait_for("keepalive", count=3)
            deadline = time.monotonic() + WAIT
            while ka.renewals < 3:  # the third answer may still be on its way
                assert time.monotonic() < deadline
                time.sleep(0.005)
            assert not ka.lost.is_set()
            assert ka.deadline > first_deadline
        assert not ka.lost.is_set()
        # Its own connection: the shared client's connection carries no keep-alive.
        assert set(member.conns_of("keepalive")).isdisjoint(member.conns_of("open_lease"))


def test_sets_lost_when_the_member_stops_answering(member: RunningMember) -> None:
    reasons: list[str] = []
    with Client(member.addr, timeout=2.0, attempt_timeout=1.0) as c:
        lease = c.open_lease(1000)
        ka = KeepAlive(c, lease, interval=0.05, on_lost=reasons.append).start()
        try:
            member.wait_for("keepalive", count=2)
            with member.frozen():  # as if every member were SIGSTOPped
                assert ka.lost.wait(WAIT)
            assert "deadline" in (ka.reason or "")
            assert reasons == [ka.reason]
            # Lost means: no confirmed renewal within the TTL before now.
            assert lease_clock() >= ka.deadline
        finally:
            ka.stop()


def test_sets_lost_when_the_lease_is_gone(member: RunningMember) -> None:
    with Client(member.addr, timeout=2.0) as c:
        lease = c.open_lease(10_000)
        fired = threading.Event()
        with KeepAlive(c, lease, interval=0.01, on_lost=lambda _: fired.set()) as ka:
            member.wait_for("keepalive")
            c.close_lease(lease)  # revoked: the member answers SESSION_EXPIRED from now on
            assert ka.lost.wait(WAIT)
            assert fired.is_set()
            assert "was closed" in (ka.reason or "")  # closed, not expired


def test_a_lease_closed_after_halt_is_not_reported_lost_and_stop_joins_after(
    member: RunningMember,
) -> None:
    # `dlm exec` halts the renewals, closes the lease, and joins the threads only then: a
    # renewal the member answers with SESSION_EXPIRED after the close must not count as
    # a loss (whose callback would close the client under the close).
    reasons: list[str] = []
    with Client(member.addr, timeout=2.0) as c:
        lease = c.open_lease(10_000)
        ka = KeepAlive(c, lease, interval=0.01, on_lost=reasons.append).start()
        try:
            member.wait_for("keepalive")
            ka.halt()
            renewals = ka.renewals
            c.close_lease(lease)
        finally:
            ka.stop(timeout=WAIT)
        assert not any(t.is_alive() for t in ka._threads)
        assert not ka.lost.is_set()
        assert reasons == []
        assert ka.renewals == renewals


def test_stop_is_prompt_while_a_renewal_hangs() -> None:
    with silent_member() as double, Client(double.addr, timeout=30.0) as c:
        ka = KeepAlive(
            c, "some-lease", ttl_ms=60_000, confirmed_at=lease_clock(), interval=0.01
        ).start()
        double.wait_for("keepalive")
        ka.stop(timeout=WAIT)
        assert not any(t.is_alive() for t in ka._threads)
        assert not ka.lost.is_set()


def test_needs_the_ttl_and_the_confirmation_time() -> None:
    with Client("127.0.0.1:1") as c:  # never connects
        with pytest.raises(ValueError, match="ttl_ms"):
            KeepAlive(c, "some-lease", confirmed_at=lease_clock())
        with pytest.raises(ValueError, match="confirmed_at"):
            KeepAlive(c, "some-lease", ttl_ms=1000)


def test_deadline_of_sets_when_the_lease_is_given_up_and_on_renewed_hears_each_renewal(
    member: RunningMember,
) -> None:
    renewed: list[tuple[float, int]] = []
    heard = threading.Event()

    def on_renewed(sent: float, ttl_ms: int) -> None:
        renewed.append((sent, ttl_ms))
        heard.set()

    def early(sent: float, ttl_ms: int) -> float:
        return sent + ttl_ms / 1000.0 - 1.0  # give up a second before the TTL is out

    with Client(member.addr, timeout=2.0) as c:
        lease = c.open_lease(3_000)
        with KeepAlive(c, lease, interval=0.05, deadline_of=early, on_renewed=on_renewed) as ka:
            assert ka.deadline == pytest.approx(lease.confirmed_at + 2.0)
            assert heard.wait(WAIT)
            sent, ttl_ms = renewed[0]
            assert ttl_ms == 3_000
            assert ka.confirmed_at >= sent
            assert ka.deadline >= early(sent, ttl_ms)


def test_a_renewal_confirmed_after_the_deadline_counts_for_nothing() -> None:
    with Client("127.0.0.1:1") as c:  # never connects: the renewals are the test's own
        heard: list[tuple[float, int]] = []
        ka = KeepAlive(
            c,
            "L",
            ttl_ms=60_000,
            confirmed_at=lease_clock(),
            on_renewed=lambda *r: heard.append(r),
        )
        assert ka.confirmed(time.monotonic(), 60_000)
        assert heard and ka.renewals == 1
        late = KeepAlive(
            c,
            "L",
            ttl_ms=60_000,
            confirmed_at=lease_clock() - 61.0,
            on_renewed=lambda *r: heard.append(r),
        )
        before = late.deadline
        assert not late.confirmed(time.monotonic(), 60_000)
        assert late.deadline == before
        assert len(heard) == 1


# -- TTL updates (issue 20, hole 3) ------------------------------------------------------


def _server_deadline(member: RunningMember, lease: str) -> float:
    """When the member expires ``lease`` unless renewed (its clock is ours: same process)."""

    def read(machine: NodeMachine) -> float:
        now = time.monotonic()
        remaining = machine.tracker.remaining_ms(lease, now)
        assert remaining is not None
        return now + remaining / 1000.0

    return member.inspect(read)


def test_a_shorter_ttl_reaches_the_keepalive_before_the_update_is_sent(
    member: RunningMember,
) -> None:
    """A 30 s lease updated to 1 s: the KeepAlive's deadline falls at once to what 1 s
    allows (never past the member's), and it renews by the new TTL, not in 10 s."""
    with Client(member.addr, timeout=2.0) as c:
        lease = c.open_lease(30_000)
        with KeepAlive(c, lease) as ka:
            before = time.monotonic()
            assert c.update_lease(lease, 1_000) == 1_000
            after = time.monotonic()
            assert ka.ttl_ms == 1_000
            assert ka.deadline <= core.lease_deadline(after, 1_000)
            assert ka.deadline <= _server_deadline(member, lease.id)
            # A reply to a renewal sent before the update (the old TTL) moves nothing.
            capped = ka.deadline
            assert ka.confirmed(before - 0.001, 30_000)
            assert ka.deadline == capped
            # The next renewal is due a third of a second after the last that counted
            # (long past), so it goes out now; its confirmation counts with the new TTL.
            limit = time.monotonic() + WAIT
            while ka.confirmed_at < before:
                assert time.monotonic() < limit, "no renewal by the new TTL"
                time.sleep(0.005)
            assert not ka.lost.is_set()
            assert ka.deadline == core.lease_deadline(ka.confirmed_at, 1_000)
            assert ka.deadline <= _server_deadline(member, lease.id)


def test_an_update_sent_through_another_client_reaches_only_its_family(
    member: RunningMember,
) -> None:
    """The KeepAlive hears of updates sent through its client and those it spawned."""
    with Client(member.addr, timeout=2.0) as c:
        lease = c.open_lease(30_000)
        sibling = c.spawn()
        try:
            with KeepAlive(c, lease) as ka:
                sibling.update_lease(lease, 1_000)
                assert ka.deadline <= core.lease_deadline(time.monotonic(), 1_000)
            assert c._watchers.of(lease.id) == []  # a stopped KeepAlive hears nothing more
        finally:
            sibling.close()


def test_a_deadline_that_passed_during_a_suspend_is_noticed_within_100ms_of_the_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A suspend, as the keep-alive sees it: its waits (on CLOCK_MONOTONIC) stood still
    # while the lease clock (CLOCK_BOOTTIME) ran on. Played by moving the lease clock an
    # hour on under a watcher that is waiting for a deadline a minute away.
    import dlm.client.sync as sync_module

    slept = [0.0]
    monkeypatch.setattr(sync_module, "lease_clock", lambda: lease_clock() + slept[0])
    with silent_member() as double, Client(double.addr, timeout=30.0) as c:
        ka = KeepAlive(c, "some-lease", ttl_ms=60_000, confirmed_at=lease_clock())
        ka.start()
        try:
            slept[0] = 3600.0
            # Without the 100 ms bound on its waits, the watcher would sleep ~59 s more.
            assert ka.lost.wait(WAIT)
            assert "deadline" in (ka.reason or "")
        finally:
            ka.stop(timeout=WAIT)


def test_pings_its_idle_connection_between_long_renewals(
    member: RunningMember, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(renewal, "PING_EVERY_S", 0.05)  # members drop connections idle for 2 min
    with Client(member.addr, timeout=2.0) as c:
        lease = c.open_lease(60_000)
        # Confirmed 19.9 s ago: the first renewal (every 20 s) is due at once, the next one
        # in 20 s; pings keep its connection wanted meanwhile.
        with c.keep_alive(lease, confirmed_at=lease.confirmed_at - 19.9) as ka:
            member.wait_for("keepalive")
            member.wait_for("ping", count=2)
            assert not ka.lost.is_set()
        assert set(member.conns_of("ping")) <= set(member.conns_of("keepalive"))


def test_a_part_opened_through_the_family_counts_before_the_next_round() -> None:
    # (Issue 30, seed 33 of the gateway simulation.) An acquire in another partition
    # opened the lease's part there; its open was first sent long before its answer came
    # (a retry through another gateway). The KeepAlive's deadline is that part's at once,
    # not only after its next renewal round.
    with Client("127.0.0.1:1") as c:  # never connects: nothing is renewed
        now = lease_clock()
        ka = KeepAlive(c, core.Lease("L", 60_000, now, partition=0))
        late = core.Lease("L", 60_000, now - 59.0, partition=1)
        c._book.opened(late)
        assert ka.deadline == core.lease_deadline(late.confirmed_at, 60_000)


def test_a_start_that_fails_half_way_raises_its_own_error_and_stop_still_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread that could not start (the process is out of threads) is not joined: the
    join would raise over start's own error, and the caller's clean-up after it (closing
    the lease, restoring signals) would be skipped."""
    with Client("127.0.0.1:1") as c:  # never connects
        ka = KeepAlive(c, "some-lease", ttl_ms=60_000, confirmed_at=lease_clock(), interval=10)
        second = ka._threads[1]

        def cannot_start() -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(second, "start", cannot_start)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            ka.start()
        ka.stop(timeout=WAIT)  # joins the first thread only; raises nothing
        assert not any(t.is_alive() for t in ka._threads)
