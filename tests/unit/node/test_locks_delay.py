"""The lock-delay (issue 27 item 4, cluster version 4): a key whose holder's lease expires
or is revoked is granted to nobody until the leader's Expire of its ``~delay:KEY``
pseudo-lease; a release or the lease's own close delays nothing; the layout-4 image
carries the delays and layout 3 still opens."""

from __future__ import annotations

import cbor2
import pytest

from dlm.node.locks import (
    CloseLeaseCommand,
    ExpireCommand,
    Granted,
    Invalid,
    LeaseGone,
    Locked,
    LockStateMachine,
    OpenLeaseCommand,
    Origin,
    Queued,
    decode_command,
    delay_lease,
    encode_command,
    validate_command,
)

from .locks_driver import Driver


def _held_by_expiring_lease(delay_ms: int = 2_000) -> tuple[Driver, int]:
    """Lease a (with ``delay_ms``) holds k, lease b waits for it; then a expires.
    Returns the driver and the index of the expiry."""
    d = Driver(version=4)
    d.open("a", lock_delay_ms=delay_ms)
    d.open("b")
    assert isinstance(d.acquire("a", "k").result, Granted)
    assert isinstance(d.acquire("b", "k", wait=True).result, Queued)
    outcome = d.expire("a")
    return d, outcome.index


def test_an_expiry_delays_the_key_and_arms_its_pseudo_lease() -> None:
    d, index = _held_by_expiring_lease()
    outcome_delay = d.sm.get("k")
    assert outcome_delay is not None and outcome_delay.lock_delay is not None
    assert outcome_delay.lock_delay.ms == 2_000 and outcome_delay.lock_delay.lease == "a"
    assert d.holders("k") == [] and d.waiters("k") == ["b"]
    assert (delay_lease("k"), 2_000, index) in d.sm.leases()


def test_the_expire_of_the_delay_grants_the_next_waiter() -> None:
    d, index = _held_by_expiring_lease()
    outcome = d.run(ExpireCommand(delay_lease("k"), index, d.now()))
    assert [p.lease for p in outcome.promotions] == ["b"]
    assert delay_lease("k") in outcome.ended
    view = d.sm.get("k")
    assert view is not None and view.lock_delay is None
    assert all(lease != delay_lease("k") for lease, _, _ in d.sm.leases())


def test_an_acquire_during_the_delay_is_refused_or_queued() -> None:
    d, _ = _held_by_expiring_lease()
    d.open("c")
    locked = d.acquire("c", "k").result
    assert isinstance(locked, Locked) and locked.holders == ()
    assert isinstance(d.acquire("c", "k", wait=True).result, Queued)
    assert d.waiters("k") == ["b", "c"]


def test_a_delayed_key_with_nobody_waiting_stays_until_the_delay_ends() -> None:
    d = Driver(version=4)
    d.open("a", lock_delay_ms=1_000)
    d.acquire("a", "k")
    index = d.expire("a").index
    d.open("c")
    assert isinstance(d.acquire("c", "k").result, Locked)
    d.run(ExpireCommand(delay_lease("k"), index, d.now()))
    assert d.sm.get("k") is None
    assert isinstance(d.acquire("c", "k").result, Granted)


def test_a_stale_expire_of_an_earlier_delay_ends_nothing() -> None:
    d, index = _held_by_expiring_lease()
    result = d.run(ExpireCommand(delay_lease("k"), index - 1, d.now())).result
    assert isinstance(result, LeaseGone)
    assert d.holders("k") == []


def test_a_release_and_the_leases_own_close_delay_nothing() -> None:
    d = Driver(version=4)
    d.open("a", lock_delay_ms=5_000)
    d.open("b")
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    outcome = d.release("a", "k")
    assert [p.lease for p in outcome.promotions] == ["b"]
    d.open("c", lock_delay_ms=5_000)
    d.acquire("c", "j")
    d.acquire("b", "j", wait=True)
    assert [p.lease for p in d.close("c").promotions] == ["b"]
    assert d.sm.delays.get("k") is None and d.sm.delays.get("j") is None


def test_a_revocation_delays_as_an_expiry_does() -> None:
    d = Driver(version=4)
    d.open("a", lock_delay_ms=2_000)
    d.open("b")
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    outcome = d.close("a", client="admin", revoke=True)
    assert outcome.promotions == () and outcome.delayed == ("k",)
    assert d.holders("k") == [] and d.waiters("k") == ["b"]


def test_a_lease_without_a_delay_hands_over_at_once() -> None:
    d, _ = _held_by_expiring_lease(delay_ms=0)
    assert d.holders("k") == ["b"]


def test_before_version_4_a_lock_delay_is_refused_alike_everywhere() -> None:
    d = Driver(version=3)
    cmd = OpenLeaseCommand("a", 10_000, Origin("c1", 1), d.now(), lock_delay_ms=1_000)
    result = d.run(cmd).result
    assert isinstance(result, Invalid) and "version 4" in result.message
    assert d.sm.lease("a") is None


def test_the_new_entries_round_trip_and_are_bounded() -> None:
    opening = OpenLeaseCommand("a", 10_000, Origin("c1", 1), 5, lock_delay_ms=60_000)
    assert decode_command(encode_command(opening)) == opening
    revoke = CloseLeaseCommand("a", Origin("c1", 2), 6, revoke=True)
    assert decode_command(encode_command(revoke)) == revoke
    assert cbor2.loads(encode_command(revoke))[0] == "revoke4"
    too_long = OpenLeaseCommand("a", 10_000, Origin("c1", 1), 5, lock_delay_ms=60_001)
    assert "lock-delay" in (validate_command(too_long) or "")
    assert validate_command(ExpireCommand(delay_lease(""), 1, 5)) is not None


@pytest.mark.parametrize("delayed", [False, True])
def test_the_layout_4_image_carries_the_delays_and_restores_them(delayed: bool) -> None:
    d, index = _held_by_expiring_lease() if delayed else (Driver(version=4), 0)
    d.open("z", lock_delay_ms=3_000)
    image = d.sm.snapshot()
    assert cbor2.loads(image)[0] == 4
    back = LockStateMachine.restore(image)
    assert back.snapshot() == image
    assert back.leases() == d.sm.leases()
    view = back.lease_terms("z")
    assert view is not None and view.lock_delay_ms == 3_000
    if delayed:
        outcome = back.apply(d.index + 1, encode_command(ExpireCommand(delay_lease("k"), index, 1)))
        assert [p.lease for p in outcome.promotions] == ["b"]


def test_a_layout_3_image_still_opens() -> None:
    d = Driver(version=3)
    d.open("a")
    d.acquire("a", "k")
    image = d.sm.snapshot()
    assert cbor2.loads(image)[0] == 3
    back = LockStateMachine.restore(image)
    assert back.holds("a", "k") and back.snapshot() == image
