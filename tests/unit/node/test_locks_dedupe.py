"""At most once: how the lock machine answers re-sent, stale and late requests.

docs/PROTOCOL.md, "Requests that change state": each (lease, client) keeps the
results of the client's requests above its acknowledged floor; a re-send gets
its first answer, a request at or below the floor is stale, and an ended lease
leaves a tombstone that answers the request that ended it and refuses the rest.
Version-1 requests (no client id) keep the previous release's rule instead: the
last 32 results per lease.
"""

from __future__ import annotations

import pytest

from dlm.node.locks import (
    MAX_UNANSWERED,
    Granted,
    Invalid,
    LeaseClosed,
    LeaseGone,
    LeaseOpened,
    Locked,
    LockStateMachine,
    NotHeld,
    Queued,
    Released,
    StaleRequest,
)

from .locks_driver import LEGACY, Driver


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    for lease in ("a", "b", "c"):
        driver.open(lease, client="opener")
    return driver


# ------------------------------------------------------------ re-sent requests


def test_a_resent_request_gets_its_first_result_without_running_again(d: Driver) -> None:
    first = d.acquire("a", "k", client="p", seq=500).result
    assert isinstance(first, Granted)
    d.release("a", "k", client="p", seq=501)
    d.acquire("b", "k", client="q", seq=1)
    assert d.acquire("a", "k", client="p", seq=500).result == first
    assert d.holders("k") == ["b"]
    released = Released("k", held=True, token=first.token)
    assert d.release("a", "k", client="p", seq=501).result == released
    assert d.holders("k") == ["b"]


def test_a_resent_open_is_answered_from_memory_and_does_not_restart_the_clock() -> None:
    d = Driver()
    first = d.open("a", 5_000, client="p", seq=1)
    again = d.open("a", 5_000, client="p", seq=1)
    assert again.result == first.result == LeaseOpened("a", 5_000, first.index)
    assert again.armed == ()


def test_a_resent_locked_acquire_does_not_take_a_freed_lock(d: Driver) -> None:
    d.acquire("a", "k")
    locked = d.acquire("b", "k", client="p", seq=77).result
    assert isinstance(locked, Locked)
    d.release("a", "k")
    assert d.acquire("b", "k", client="p", seq=77).result == locked
    assert d.holders("k") == []


def test_a_resent_waiting_acquire_reports_the_present(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    d.open("w", client="opener")
    assert d.acquire("w", "k", wait=True, client="p", seq=900).result == Queued("k", 2)
    d.release("b", "k")
    assert d.acquire("w", "k", wait=True, client="p", seq=900).result == Queued("k", 1)
    granted_at = d.release("a", "k").promotions[0].token
    assert d.acquire("w", "k", wait=True, client="p", seq=900).result == Granted(
        "k", granted_at, "w"
    )
    assert d.holders("k") == ["w"]


def test_two_clients_sharing_a_lease_do_not_see_each_others_results_even_with_equal_seqs(
    d: Driver,
) -> None:
    granted = d.acquire("a", "k", client="p", seq=5).result
    assert isinstance(granted, Granted)
    assert d.release("a", "k", client="q", seq=5).result == Released(
        "k", held=True, token=granted.token
    )
    assert d.sm.get("k") is None
    assert d.acquire("a", "k", client="p", seq=5).result == granted
    assert d.sm.get("k") is None


def test_a_version_1_request_is_not_answered_from_a_clients_memory(d: Driver) -> None:
    d.acquire("a", "k", client="p", seq=5)
    assert d.release("a", "k", client=LEGACY, seq=5).result == Released(
        "k", held=True, token=d.index - 1
    )


# ----------------------------------------------------- the acknowledged floor


def test_a_request_at_or_below_the_floor_is_stale_and_changes_nothing(d: Driver) -> None:
    d.acquire("a", "k", client="p", seq=10)
    d.release("a", "k", client="p", seq=11, acked=10)
    before = d.image()
    assert d.acquire("a", "k", client="p", seq=9, acked=8).result == StaleRequest(9)
    assert d.acquire("a", "k", client="p", seq=10, acked=9).result == StaleRequest(10)
    assert d.image() == before


def test_a_duplicate_delivered_after_the_client_acknowledged_it_is_refused_without_effect(
    d: Driver,
) -> None:
    d.acquire("a", "k", client="p", seq=1)
    d.release("a", "k", client="p", seq=2, acked=1)
    d.acquire("b", "k", client="q", seq=1)
    before = d.image()
    # The first acquire's answer was acknowledged and dropped: its late copy must not run.
    assert d.acquire("a", "k", client="p", seq=1).result == StaleRequest(1)
    assert d.holders("k") == ["b"]
    assert d.image() == before


def test_acked_drops_the_results_at_or_below_it(d: Driver) -> None:
    for seq, key in enumerate(["k1", "k2", "k3"], start=1):
        d.acquire("a", key, client="p", seq=seq)
    d.release("a", "free", client="p", seq=4, acked=2)
    assert d.acquire("a", "k3", client="p", seq=3).result == Granted("k3", d.index - 2, "a")
    assert d.acquire("a", "k2", client="p", seq=2).result == StaleRequest(2)


def test_acked_drops_the_results_at_or_below_it_whatever_order_they_arrived_in(
    d: Driver,
) -> None:
    # Requests of one client may reach the log out of seq order (retries, several
    # connections); every answered one at or below the floor must go, or they crowd
    # out the room for unanswered ones.
    last = MAX_UNANSWERED
    d.release("a", "free", client="p", seq=last)
    for seq in range(1, last):
        d.release("a", "free", client="p", seq=seq)
    assert d.release("a", "free", client="p", seq=last + 1, acked=last - 1).result == NotHeld(
        "free", ()
    )


def test_the_floor_never_falls(d: Driver) -> None:
    d.release("a", "free", client="p", seq=6, acked=5)
    d.release("a", "free", client="p", seq=7, acked=2)
    assert d.release("a", "free", client="p", seq=4, acked=2).result == StaleRequest(4)


def test_an_acknowledgement_leaves_other_clients_results_alone(d: Driver) -> None:
    first = d.acquire("a", "k", client="q", seq=5).result
    d.release("a", "free", client="p", seq=100, acked=99)
    assert d.acquire("a", "k", client="q", seq=5).result == first


def test_a_clients_floor_belongs_to_one_lease(d: Driver) -> None:
    d.release("a", "free", client="p", seq=10, acked=9)
    assert d.acquire("b", "k", client="p", seq=5).result == Granted("k", d.index, "b")


def test_at_most_max_unanswered_results_are_kept_per_client_and_lease(d: Driver) -> None:
    for seq in range(1, MAX_UNANSWERED + 1):
        d.release("a", "free", client="p", seq=seq)
    before = d.image()
    refused = d.acquire("a", "k", client="p", seq=MAX_UNANSWERED + 1).result
    assert isinstance(refused, Invalid) and "unanswered" in refused.message
    assert d.image() == before
    # The remembered answers still serve re-sends; other clients and leases are not limited.
    assert d.release("a", "free", client="p", seq=5).result == NotHeld("free", ())
    assert isinstance(d.acquire("a", "k", client="q", seq=1).result, Granted)
    assert isinstance(d.acquire("b", "k2", client="p", seq=1).result, Granted)
    # Acknowledging makes room; the refused request was not remembered, so it now runs.
    again = d.acquire("a", "k3", client="p", seq=MAX_UNANSWERED + 1, acked=MAX_UNANSWERED)
    assert isinstance(again.result, Granted)


# ------------------------------------------------------------------ version 1


def test_version_1_requests_remember_the_last_32_results_per_lease() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.acquire("a", "k", client=LEGACY, seq=1)
    d.release("a", "k", client=LEGACY, seq=2)
    for seq in range(3, 35):
        d.release("a", "nothing", client=LEGACY, seq=seq)
    # seq 2 is the 33rd newest: forgotten, so it runs again (and finds nothing).
    assert d.release("a", "k", client=LEGACY, seq=2).result == NotHeld("k", ())
    assert d.release("a", "nothing", client=LEGACY, seq=34).result == NotHeld("nothing", ())


def test_version_1_seqs_need_not_increase() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    assert isinstance(d.acquire("a", "k1", client=LEGACY, seq=2**62).result, Granted)
    assert isinstance(d.acquire("a", "k2", client=LEGACY, seq=5).result, Granted)
    assert isinstance(d.acquire("a", "k3", client=LEGACY, seq=0).result, Granted)
    assert d.holders("k3") == ["a"]


def test_version_1_results_are_per_lease() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.open("b", client=LEGACY)
    d.acquire("a", "k", client=LEGACY, seq=1)
    assert isinstance(d.acquire("b", "k", client=LEGACY, seq=1).result, Locked)


# ----------------------------------------------------------------- tombstones


def test_a_resent_close_gets_its_original_answer(d: Driver) -> None:
    d.acquire("a", "k1")
    d.acquire("a", "k2")
    first = d.close("a", client="p", seq=9)
    assert first.result == LeaseClosed("a", released=("k1", "k2"))
    again = d.close("a", client="p", seq=9)
    assert again.result == first.result
    assert again.ended == () and again.promotions == ()


def test_a_resent_release_that_ended_an_ephemeral_lease_gets_its_original_answer() -> None:
    d = Driver()
    d.open("e", ephemeral=True, client="p", seq=1)
    token = d.acquire("e", "k", client="p", seq=2).index
    first = d.release("e", "k", client="p", seq=3).result
    assert first == Released("k", held=True, token=token, lease_ended=True)
    assert d.release("e", "k", client="p", seq=3).result == first


def test_any_other_request_for_an_ended_lease_is_lease_gone(d: Driver) -> None:
    d.close("a", client="p", seq=9)
    before = d.image()
    assert d.close("a", client="p", seq=10).result == LeaseGone("a")
    assert d.close("a", client="q", seq=9).result == LeaseGone("a")
    assert d.close("a", client=LEGACY, seq=9).result == LeaseGone("a")
    assert d.image() == before
    d.expire("b")
    assert d.close("b", client="p", seq=11).result == LeaseGone("b")


def test_a_delayed_duplicate_open_cannot_revive_a_closed_lease() -> None:
    d = Driver()
    d.open("a", client="p", seq=1)
    d.close("a", client="p", seq=2, acked=1)
    outcome = d.open("a", client="p", seq=1)
    assert outcome.result == LeaseGone("a")
    assert outcome.armed == ()
    assert d.sm.lease("a") is None


def test_a_delayed_duplicate_open_cannot_revive_an_expired_lease() -> None:
    d = Driver()
    d.open("a", client="p", seq=1)
    d.expire("a")
    assert d.open("a", client="p", seq=1).result == LeaseGone("a")
    assert d.open("a", client="q", seq=1).result == LeaseGone("a")
    assert d.sm.lease("a") is None


def test_tombstones_are_kept_for_tombstone_ms_of_log_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(LockStateMachine, "tombstone_ms", 1_000)
    d = Driver()
    d.open("old")
    d.close("old")
    d.at_ms += 500
    d.open("young")
    d.close("young")
    assert d.open("old").result == LeaseGone("old")  # 500 ms old: still remembered
    d.at_ms += 600
    d.open("other")
    d.close("other")  # this end is over 1,000 ms after "old"'s: it goes
    assert d.open("old").result == LeaseOpened("old", 10_000, d.index)
    assert d.open("young").result == LeaseGone("young")


def test_a_leader_whose_clock_runs_hours_ahead_does_not_age_the_tombstones() -> None:
    # A client opened "a" (its answer was lost), the lease ended, and the client re-sends
    # its open; meanwhile a new leader, its wall clock nine hours ahead, ended another lease.
    d = Driver()
    d.open("a", client="p", seq=1)
    d.close("a", client="p", seq=2)
    d.at_ms += 9 * 3_600_000
    d.open("b")
    d.close("b")
    assert d.open("a", client="p", seq=1).result == LeaseGone("a")


def test_log_time_never_runs_backwards(monkeypatch: pytest.MonkeyPatch) -> None:
    # A leader whose clock runs an hour behind the last one's: its entries move log time
    # from where it was, neither back (which would keep tombstones for an hour more than
    # the bound) nor by the size of the jump.
    monkeypatch.setattr(LockStateMachine, "tombstone_ms", 1_000)
    d = Driver()
    d.at_ms += 2 * 3_600_000
    d.open("x")
    d.close("x")
    d.at_ms -= 3_600_000
    d.open("y")
    d.at_ms += 1_100
    d.close("y")  # 1,100 ms of log time (and a few 10 ms steps) after "x" ended: it goes
    assert d.open("x").result == LeaseOpened("x", 10_000, d.index)


def test_log_time_travels_in_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LockStateMachine, "tombstone_ms", 1_000)
    d = Driver()
    d.at_ms += 5 * 3_600_000  # log time and the stamps part: a jump counts at most 10 s
    d.open("old")
    d.close("old")
    d.at_ms += 700
    image = d.sm.snapshot()
    restored = LockStateMachine.restore(image)
    assert restored.snapshot() == image
    d.sm = restored
    d.at_ms += 400
    d.open("other")
    d.close("other")  # over 1,000 ms of log time after "old" ended, counted across the restore
    assert d.open("old").result == LeaseOpened("old", 10_000, d.index)


def test_tombstones_are_at_most_tombstone_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LockStateMachine, "tombstone_capacity", 3)
    d = Driver()
    for lease in ("t1", "t2", "t3", "t4"):
        d.open(lease)
        d.close(lease)
    assert d.open("t1").result == LeaseOpened("t1", 10_000, d.index)
    for lease in ("t2", "t3", "t4"):
        assert d.open(lease).result == LeaseGone(lease)


# ------------------------------------------------------------ how a lease ended


def test_a_gone_lease_says_how_it_ended_from_its_tombstone(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "expired" only for an Expire's tombstone; "unknown" (no such lease) without one."""
    monkeypatch.setattr(LockStateMachine, "tombstone_ms", 1_000)
    d = Driver()
    for lease in ("closed", "expired", "released", "revoked"):
        d.open(lease, client="p", ephemeral=lease == "released")
    d.close("closed", client="p")
    d.expire("expired")
    d.acquire("released", "k", client="p")
    assert d.release("released", "k", client="p").result.lease_ended  # type: ignore[union-attr]
    d.close("revoked", client="operator")
    endings = {
        lease: d.acquire(lease, "k2").result
        for lease in ("closed", "expired", "released", "revoked", "never-opened")
    }
    assert {lease: result.ended for lease, result in endings.items()} == {  # type: ignore[union-attr]
        "closed": "closed",
        "expired": "expired",
        "released": "closed",
        "revoked": "closed",
        "never-opened": "unknown",
    }
    assert d.open("expired", client="q").result.ended == "expired"  # type: ignore[union-attr]
    assert d.sm.lease_ending("expired") == "expired"
    d.at_ms += 1_100
    d.open("x")
    d.close("x")  # a second later, the older tombstones are forgotten
    assert d.sm.lease_ending("expired") == "unknown"
    assert d.update("closed", 5_000).result.ended == "unknown"  # type: ignore[union-attr]


def test_version_1_keeps_no_tombstones_and_does_not_guess() -> None:
    d = Driver(version=1)
    d.open("a", client=LEGACY)
    d.expire("a")
    assert d.acquire("a", "k", client=LEGACY).result.ended == ""  # type: ignore[union-attr]


def test_how_a_lease_ended_is_no_part_of_the_state() -> None:
    gone = LeaseGone("a", "expired")
    assert gone == LeaseGone("a")
    assert gone.to_dict() == {"type": "session_expired", "lease": "a"}  # images as before
