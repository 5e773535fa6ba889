"""The lock machine after a restore or recovery (issue 24): the longest TTL it records, the
quarantine that grants nothing until its Expire, and the layout-3 image that carries both.
"""

from __future__ import annotations

import cbor2

from dlm.node.locks import (
    QUARANTINE_LEASE,
    ExpireCommand,
    Granted,
    LeaseGone,
    Locked,
    LockStateMachine,
    QuarantineCommand,
    Queued,
    decode_command,
    encode_command,
    longest_ttl_ms,
    result_from_dict,
    start_incarnation,
    validate_command,
)

from .locks_driver import Driver


def restored(driver: Driver, quarantine_ms: int = 30_000, bump: int = 1_000) -> Driver:
    """``driver``'s state as the first state of a new incarnation ``bump`` entries on."""
    machine = LockStateMachine.restore(driver.sm.snapshot())
    start_incarnation(machine, driver.index + bump, quarantine_ms)
    out = Driver.__new__(Driver)
    out.sm = LockStateMachine.restore(machine.snapshot())  # through the image, as a member
    out.index = driver.index + bump
    out.at_ms = driver.at_ms
    out._seqs = {}
    return out


def test_from_version_3_the_longest_ttl_given_is_recorded_min_hold_updates_included() -> None:
    d = Driver(version=3)
    d.open("a", 5_000)
    d.open("b", 20_000)
    d.close("b")
    d.update("a", 90_000, finished=True)  # a --min-hold hands its hold to the cluster
    d.update("a", 1_000)
    assert d.sm.max_ttl_ms == 90_000
    assert longest_ttl_ms(d.sm) == 90_000


def test_at_version_2_nothing_is_recorded_so_restored_and_replayed_members_agree() -> None:
    d = Driver(version=2)
    d.open("a", 50_000)
    assert d.sm.max_ttl_ms == 0
    # ... but a live lease still counts when a quarantine is chosen.
    assert longest_ttl_ms(d.sm) == 50_000


def test_a_quarantined_machine_grants_nothing_and_queues_waiters() -> None:
    old = Driver(version=3)
    old.open("a")
    r = restored(old)
    r.open("b")
    r.open("c")
    locked = r.acquire("b", "k").result
    assert isinstance(locked, Locked) and locked.holders == ()
    assert locked.quarantined_until_ms == 0  # no leader said when yet
    assert r.sm.get("k") is None  # a refused acquire leaves no key behind
    assert isinstance(r.acquire("b", "k", wait=True).result, Queued)
    assert isinstance(r.acquire("c", "k", wait=True).result, Queued)
    r.run(QuarantineCommand(1_234_567, r.now()))
    again = r.acquire("a", "k").result
    assert isinstance(again, Locked) and again.quarantined_until_ms == 1_234_567


def test_the_expire_of_the_quarantine_grants_the_first_waiter_of_each_key() -> None:
    old = Driver(version=3)
    r = restored(old)
    for lease in ("b", "c"):
        r.open(lease)
        r.acquire(lease, "k", wait=True)
    r.acquire("c", "j", wait=True)
    (_, _, incarnation) = r.sm.leases()[-1]
    end = r.run(ExpireCommand(QUARANTINE_LEASE, incarnation, r.now()))
    assert end.quarantine_ended and QUARANTINE_LEASE in end.ended
    assert [(p.lease, p.key, p.token) for p in end.promotions] == [
        ("c", "j", r.index),
        ("b", "k", r.index),
    ]
    assert r.sm.quarantine is None
    assert isinstance(r.acquire("b", "free").result, Granted)


def test_an_expire_of_another_quarantine_does_nothing() -> None:
    r = restored(Driver(version=3))
    stale = r.run(ExpireCommand(QUARANTINE_LEASE, 5, r.now()))
    assert isinstance(stale.result, LeaseGone) and not stale.quarantine_ended
    assert r.sm.quarantine is not None


def test_the_quarantine_is_listed_last_among_the_leases_for_the_leaders_deadlines() -> None:
    old = Driver(version=3)
    old.open("zz", 7_000)
    r = restored(old, quarantine_ms=45_000, bump=10)
    assert r.sm.leases() == [
        ("zz", 7_000, old.sm.leases()[0][2]),
        (QUARANTINE_LEASE, 45_000, old.index + 10),
    ]


def test_restored_holders_keep_their_locks_and_a_release_grants_nobody_while_quarantined() -> None:
    old = Driver(version=3)
    old.open("a")
    old.open("b")
    token = old.acquire("a", "k").result
    assert isinstance(token, Granted)
    r = restored(old)
    assert r.sm.holds("a", "k")
    r.acquire("b", "k", wait=True)
    released = r.release("a", "k", keep_lease=True)
    assert released.promotions == ()
    view = r.sm.get("k")
    assert view is not None and view.holders == () and [w.lease for w in view.waiters] == ["b"]
    # The image of a free key with waiters (possible only while quarantined) restores.
    assert LockStateMachine.restore(r.sm.snapshot()).get("k") == view


def test_new_tokens_are_above_the_old_index_plus_the_bump() -> None:
    old = Driver(version=3)
    old.open("a")
    r = restored(old, quarantine_ms=0, bump=2**32)
    r.open("b")
    granted = r.acquire("b", "k").result
    assert isinstance(granted, Granted) and granted.token > old.index + 2**32


def test_the_quarantine_command_and_the_locked_result_round_trip() -> None:
    cmd = QuarantineCommand(99, 12)
    assert decode_command(encode_command(cmd)) == cmd
    assert validate_command(cmd) is None
    assert validate_command(ExpireCommand(QUARANTINE_LEASE, 3, 0)) is None
    locked = Locked("k", (), 5, 77)
    assert result_from_dict(locked.to_dict()) == locked
    plain = Locked("k", (), 5)
    assert "quarantined_until_ms" not in plain.to_dict()  # version-2 images keep their bytes


def test_layout_3_images_carry_the_record_and_the_quarantine() -> None:
    r = restored(Driver(version=3), quarantine_ms=12_000)
    r.run(QuarantineCommand(5_555, r.now()))
    image = r.sm.snapshot()
    assert cbor2.loads(image)[0] == 3
    back = LockStateMachine.restore(image)
    assert back.quarantine == r.sm.quarantine
    assert back.max_ttl_ms == r.sm.max_ttl_ms
    assert back.snapshot() == image
