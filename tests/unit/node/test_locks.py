"""Unit tests of the lock state machine, one rule at a time (ARCHITECTURE.md 1, 2, 5, 6).

The machine runs at cluster version 2 unless a test says otherwise. At-most-once
rules live in test_locks_dedupe.py, versions and compatibility with the previous
release in test_locks_versions.py, random walks against a model in
test_locks_stateful.py.
"""

from __future__ import annotations

import cbor2
import pytest

from dlm.node.locks import (
    AcquireCommand,
    ApplyOutcome,
    CloseLeaseCommand,
    ClusterVersionCommand,
    Command,
    CommandError,
    Counts,
    ExpireCommand,
    Granted,
    Holder,
    Invalid,
    LeaseClosed,
    LeaseGone,
    LeaseOpened,
    LeaseUpdated,
    LeaseView,
    Locked,
    LockStateMachine,
    NotHeld,
    OpenLeaseCommand,
    Origin,
    Promotion,
    Queued,
    ReleaseCommand,
    Released,
    Result,
    StaleRequest,
    UpdateLeaseCommand,
    decode_command,
    encode_command,
    held_count,
    holder_meta,
    result_from_dict,
    validate_command,
)

from .locks_driver import LEGACY, Driver

C = Origin("c1", 7, 3)
"""A version-2 origin for commands built by hand."""


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    for lease in ("a", "b", "c", "d"):
        driver.open(lease)
    return driver


# ------------------------------------------------------------------ commands


COMMANDS: list[Command] = [
    OpenLeaseCommand("lease-1", 5_000, Origin(LEGACY, 0), 17),
    OpenLeaseCommand("lease-1", 5_000, C, 17, ephemeral=True, meta={"host": "h1"}),
    CloseLeaseCommand("lease_2", Origin(LEGACY, 3), 18),
    CloseLeaseCommand("lease_2", C, 18),
    AcquireCommand("L", "jobs/nightly backup", True, 3, {"host": "h1"}, Origin(LEGACY, 9), 19),
    AcquireCommand("L", "jobs/nightly backup", True, 3, {"host": "h1"}, C, 19),
    ReleaseCommand("L", "ключ", None, True, Origin(LEGACY, 10), 20),
    ReleaseCommand("L", "ключ", 41, False, C, 20),
    ReleaseCommand("L", "ключ", None, True, C, 20),
    ReleaseCommand("L", "ключ", None, False, Origin(LEGACY, 10), 20),  # no version-1 form
    UpdateLeaseCommand("L", 1, True, C, 21),
    ExpireCommand("L", 0, 22),
    ExpireCommand("L", 9, 22),
    ClusterVersionCommand(2, 23),
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=repr)
def test_commands_round_trip_through_bytes(cmd: Command) -> None:
    assert decode_command(encode_command(cmd)) == cmd
    assert validate_command(cmd) is None


def test_encoding_is_canonical() -> None:
    a = AcquireCommand("L", "k", False, 1, {"b": "2", "a": "1"}, C, 0)
    b = AcquireCommand("L", "k", False, 1, {"a": "1", "b": "2"}, C, 0)
    assert encode_command(a) == encode_command(b)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff",
        b"\x00\x01\x02",
        cbor2.dumps({"t": "open"}),
        cbor2.dumps([]),
        cbor2.dumps(["nope", 1]),
        cbor2.dumps(["open", "a", 5000]),
        cbor2.dumps(["open", "a", "5000", 0]),
        cbor2.dumps(["open", "a", True, 0]),
        cbor2.dumps(["open", "a", 2**70, 0]),
        cbor2.dumps(["acquire", "a", 1, "k", 1, 1, {}, 0]),
        cbor2.dumps(["acquire", "a", 1, "k", False, 1, {"x": 1}, 0]),
        cbor2.dumps(["acquire", "a", 1, "k", False, 1, [], 0]),
        cbor2.dumps(["release", "a", 1, b"k", 0]),
        cbor2.dumps(["expire", "a", 1.5]),
        cbor2.dumps(["open2", "a", 5000, False, {}, "c", 1, 0]),
        cbor2.dumps(["close2", "a", "c", 1, 1.5, 0]),
        cbor2.dumps(["acquire2", "a", "k", False, 1, {}, 7, 1, 0, 0]),
        cbor2.dumps(["release2", "a", "k", True, False, "c", 1, 0, 0]),
        cbor2.dumps(["update2", "a", 1000, 0, "c", 1, 0, 0]),
        cbor2.dumps(["expire2", "a", "1", 0]),
        cbor2.dumps(["version", "2", 0]),
        b"\x9f" * 10_000,
        b"x" * 70_000,
    ],
)
def test_malformed_payload_is_invalid_and_changes_nothing(payload: bytes) -> None:
    with pytest.raises(CommandError):
        decode_command(payload)
    d = Driver()
    d.open("a")
    d.acquire("a", "k")
    before = d.image()
    d.index += 1
    outcome = d.sm.apply(d.index, payload)
    assert isinstance(outcome.result, Invalid)
    assert d.sm.applied_index == d.index
    assert d.image() == before


def test_empty_payload_is_a_noop_entry() -> None:
    sm = LockStateMachine()
    assert sm.apply(1, b"") == ApplyOutcome(1, None)
    assert sm.applied_index == 1


def test_an_outcome_carries_the_command_it_applied() -> None:
    d = Driver()
    cmd = OpenLeaseCommand("a", 5_000, C, 17)
    assert d.run(cmd).command == cmd
    refused = AcquireCommand("a", "", False, 1, {}, C, 18)
    assert d.run(refused).command == refused  # well formed, out of range
    d.index += 1
    assert d.sm.apply(d.index, b"\xff").command is None  # not a command at all


def test_indices_must_increase_but_may_skip() -> None:
    sm = LockStateMachine()
    sm.apply(3, b"")
    sm.skip(5)  # a membership entry: not ours, but it takes its index
    sm.apply(7, b"")
    assert sm.applied_index == 7
    with pytest.raises(ValueError, match="out of order"):
        sm.apply(7, b"")


@pytest.mark.parametrize(
    ("cmd", "words"),
    [
        (OpenLeaseCommand("", 5_000, C, 0), "lease id"),
        (OpenLeaseCommand("a b", 5_000, C, 0), "lease id"),
        (OpenLeaseCommand("x" * 65, 5_000, C, 0), "lease id"),
        (OpenLeaseCommand("a", 999, C, 0), "TTL"),
        (OpenLeaseCommand("a", 86_400_001, C, 0), "TTL"),
        (OpenLeaseCommand("a", 5_000, C, -1), "at_ms"),
        (OpenLeaseCommand("a", 5_000, C, 0, meta={"n": "v" * 257}), "metadata value"),
        (OpenLeaseCommand("a", 5_000, Origin("bad client", 1), 0), "client id"),
        (OpenLeaseCommand("a", 5_000, Origin("c" * 65, 1), 0), "client id"),
        (AcquireCommand("a", "", False, 1, {}, C, 0), "key"),
        (AcquireCommand("a", "k" * 513, False, 1, {}, C, 0), "512 bytes"),
        (AcquireCommand("a", "é" * 257, False, 1, {}, C, 0), "512 bytes"),
        (AcquireCommand("a", "bad\nkey", False, 1, {}, C, 0), "control"),
        (AcquireCommand("a", "k", False, 0, {}, C, 0), "limit"),
        (AcquireCommand("a", "k", False, 1025, {}, C, 0), "limit"),
        (AcquireCommand("a", "k", False, 1, {str(i): "" for i in range(17)}, C, 0), "metadata"),
        (AcquireCommand("a", "k", False, 1, {"n" * 65: "v"}, C, 0), "metadata name"),
        (AcquireCommand("a", "k", False, 1, {"n": "v" * 257}, C, 0), "metadata value"),
        (AcquireCommand("a", "k", False, 1, {}, Origin("c1", -1), 0), "sequence"),
        (AcquireCommand("a", "k", False, 1, {}, Origin("c1", 1, -1), 0), "sequence"),
        (ReleaseCommand("a", "", None, False, C, 0), "key"),
        (ReleaseCommand("a", "k", 0, False, C, 0), "fencing token"),
        (ReleaseCommand("a", "k", -3, False, C, 0), "fencing token"),
        (UpdateLeaseCommand("a", 0, False, C, 0), "hold"),
        (UpdateLeaseCommand("a", 86_400_001, False, C, 0), "hold"),
        (ExpireCommand("a", -1, 0), "incarnation"),
        (ClusterVersionCommand(6, 0), "cluster version"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_out_of_range_fields_are_refused_with_a_message_and_change_nothing(
    cmd: Command, words: str
) -> None:
    message = validate_command(cmd)
    assert message is not None and words in message
    d = Driver()
    d.open("a")
    before = d.image()
    outcome = d.run(cmd)
    assert outcome.result == Invalid(message)
    assert d.image() == before


def test_limits_at_the_edges_are_accepted() -> None:
    assert validate_command(OpenLeaseCommand("a" * 64, 1_000, C, 0)) is None
    assert validate_command(OpenLeaseCommand("a", 86_400_000, Origin("c" * 64, 0), 0)) is None
    meta = {f"{i:02d}" + "n" * 62: "v" * 256 for i in range(16)}
    assert validate_command(AcquireCommand("a", "k" * 512, False, 1024, meta, C, 0)) is None
    assert validate_command(AcquireCommand("a", "é" * 256, False, 1, {}, C, 0)) is None
    assert validate_command(UpdateLeaseCommand("a", 1, True, C, 0)) is None
    assert validate_command(UpdateLeaseCommand("a", 86_400_000, False, C, 0)) is None
    assert validate_command(ReleaseCommand("a", "k", 2**63 - 1, False, C, 0)) is None


# -------------------------------------------------------------------- leases


def test_open_lease_reports_ttl_and_incarnation_and_arms_the_tracker() -> None:
    d = Driver()
    outcome = d.open("a", 7_000)
    assert outcome.result == LeaseOpened("a", 7_000, incarnation=d.index)
    assert outcome.armed == (("a", 7_000, d.index),)
    assert d.sm.leases() == [("a", 7_000, d.index)]


def test_opening_a_live_lease_joins_it_with_its_own_ttl() -> None:
    d = Driver()
    d.open("a", 7_000)
    opened_at = d.index
    d.acquire("a", "k")
    outcome = d.open("a", 9_000, client="other-process")
    assert outcome.result == LeaseOpened("a", 7_000, opened_at, joined=True)
    assert outcome.armed == (("a", 7_000, opened_at),)
    assert d.holders("k") == ["a"]


def test_an_open_records_who_opened_the_lease_and_how() -> None:
    d = Driver()
    d.open("a", 7_000, ephemeral=True, meta={"host": "h1", "pid": "42"})
    assert d.sm.lease("a") == LeaseView(
        lease="a",
        ttl_ms=7_000,
        opened_at_ms=d.at_ms,
        incarnation=d.index,
        ephemeral=True,
        meta={"host": "h1", "pid": "42"},
        finished_at_ms=None,
        holding=(),
        waiting=(),
    )


def test_requests_for_an_unknown_lease_are_lease_gone(d: Driver) -> None:
    before = d.image()
    assert d.acquire("zz", "k").result == LeaseGone("zz")
    assert d.release("zz", "k").result == LeaseGone("zz")
    assert d.update("zz", 5_000).result == LeaseGone("zz")
    assert d.close("zz").result == LeaseGone("zz")
    assert d.expire("zz").result == LeaseGone("zz")
    assert d.image() == before


def test_close_releases_locks_and_queue_places_and_grants_next(d: Driver) -> None:
    d.acquire("a", "k1")
    d.acquire("a", "k2")
    d.acquire("b", "k1", wait=True)
    d.acquire("b", "k2")  # Locked: b does not wait here
    d.acquire("c", "k2", wait=True)
    d.acquire("b", "k3")
    d.acquire("a", "k3", wait=True)
    outcome = d.close("a")
    assert outcome.result == LeaseClosed("a", released=("k1", "k2"))
    assert outcome.ended == ("a",)
    assert outcome.expired == ()
    assert outcome.promotions == (
        Promotion("b", "k1", d.index, d.at_ms),
        Promotion("c", "k2", d.index, d.at_ms),
    )
    assert d.holders("k1") == ["b"] and d.holders("k2") == ["c"]
    assert d.waiters("k3") == []
    assert d.sm.lease("a") is None
    assert d.acquire("a", "k9").result == LeaseGone("a")


def test_expire_acts_like_close_and_is_reported_as_expired(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    outcome = d.expire("a")
    assert outcome.result == LeaseClosed("a", released=("k",))
    assert outcome.expired == ("a",) and outcome.ended == ("a",)
    assert outcome.promotions == (Promotion("b", "k", d.index, d.at_ms),)
    assert [lease for lease, _, _ in d.sm.leases()] == ["b", "c", "d"]


def test_update_sets_the_ttl_and_restarts_the_lease_clock(d: Driver) -> None:
    incarnation = d.sm.leases()[0][2]
    outcome = d.update("a", 2_500)
    assert outcome.result == LeaseUpdated("a", 2_500)
    assert outcome.armed == (("a", 2_500, incarnation),)
    view = d.sm.lease("a")
    assert view is not None and view.ttl_ms == 2_500 and view.finished_at_ms is None


def test_update_may_set_a_ttl_below_the_open_minimum_to_finish_a_hold(d: Driver) -> None:
    assert d.update("a", 1, finished=True).result == LeaseUpdated("a", 1)
    view = d.sm.lease("a")
    assert view is not None and view.ttl_ms == 1


def test_update_with_finished_records_when_the_command_finished(d: Driver) -> None:
    d.update("a", 3_000, finished=True)
    finished_at = d.at_ms
    d.update("a", 4_000)  # a later update without `finished` keeps the record
    view = d.sm.lease("a")
    assert view is not None and view.finished_at_ms == finished_at


def test_a_release_that_leaves_an_ephemeral_lease_idle_ends_it() -> None:
    d = Driver()
    d.open("e", ephemeral=True)
    token = d.acquire("e", "k").index
    outcome = d.release("e", "k")
    assert outcome.result == Released("k", held=True, token=token, lease_ended=True)
    assert outcome.ended == ("e",) and outcome.expired == ()
    assert d.sm.lease("e") is None


def test_leaving_a_queue_that_leaves_an_ephemeral_lease_idle_ends_it() -> None:
    d = Driver()
    d.open("a")
    d.open("e", ephemeral=True)
    d.acquire("a", "k")
    d.acquire("e", "k", wait=True)
    outcome = d.release("e", "k")
    assert outcome.result == Released("k", held=False, token=None, lease_ended=True)
    assert d.sm.lease("e") is None and d.waiters("k") == []


def test_keep_lease_keeps_an_idle_ephemeral_lease() -> None:
    d = Driver()
    d.open("e", ephemeral=True)
    token = d.acquire("e", "k").index
    outcome = d.release("e", "k", keep_lease=True)
    assert outcome.result == Released("k", held=True, token=token, lease_ended=False)
    assert outcome.ended == ()
    assert d.sm.lease("e") is not None


def test_an_ephemeral_lease_that_still_holds_a_key_lives_on() -> None:
    d = Driver()
    d.open("e", ephemeral=True)
    d.acquire("e", "k1")
    d.acquire("e", "k2")
    released = d.release("e", "k1").result
    assert isinstance(released, Released) and not released.lease_ended
    assert d.sm.lease("e") is not None


def test_a_release_that_leaves_an_ordinary_lease_idle_keeps_it() -> None:
    d = Driver()
    d.open("a")
    d.acquire("a", "k")
    released = d.release("a", "k").result
    assert isinstance(released, Released) and not released.lease_ended
    assert d.sm.lease("a") is not None


def test_a_refused_release_does_not_end_an_idle_ephemeral_lease() -> None:
    d = Driver()
    d.open("e", ephemeral=True)
    assert d.release("e", "k").result == NotHeld("k", ())
    assert d.sm.lease("e") is not None


# ------------------------------------------------------------------- acquire


def test_free_key_is_granted_with_the_entry_index_as_token(d: Driver) -> None:
    outcome = d.acquire("a", "k", meta={"host": "h1"})
    assert outcome.result == Granted("k", d.index, "a")
    assert outcome.promotions == ()
    view = d.sm.get("k")
    assert view is not None
    assert view.holders == (Holder("a", d.index, d.at_ms, {"host": "h1"}),)
    assert view.limit == 1


def test_held_key_without_wait_is_locked_with_holder_and_hint(d: Driver) -> None:
    d.acquire("a", "k", meta={"pid": "1"})
    token = d.index
    outcome = d.acquire("b", "k")
    assert outcome.result == Locked("k", (Holder("a", token, d.at_ms - 10, {"pid": "1"}),), 10_000)
    assert d.waiters("k") == []


def test_retry_hint_is_shortest_holder_ttl_capped() -> None:
    d = Driver()
    d.open("a", 86_400_000)
    d.open("b", 2_000)
    d.open("c")
    d.acquire("a", "big")
    d.acquire("b", "sem", limit=2)
    d.acquire("a", "sem", limit=2)
    locked = d.acquire("c", "big").result
    assert isinstance(locked, Locked) and locked.retry_after_ms == 30_000
    locked = d.acquire("c", "sem", limit=2).result
    assert isinstance(locked, Locked) and locked.retry_after_ms == 2_000


def test_acquiring_a_held_key_again_returns_the_same_grant(d: Driver) -> None:
    first = d.acquire("a", "k").result
    again = d.acquire("a", "k", wait=True, client="another-process").result
    assert again == first
    assert d.holders("k") == ["a"] and d.waiters("k") == []


def test_a_lease_cannot_wait_twice_for_one_key(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    d.acquire("c", "k", wait=True)
    assert d.acquire("c", "k", wait=True).result == Queued("k", 2)
    assert d.acquire("c", "k", wait=False).result == Queued("k", 2)
    assert d.waiters("k") == ["b", "c"]


def test_waiters_are_granted_in_arrival_order_in_the_releasing_step(d: Driver) -> None:
    d.acquire("a", "k")
    for position, lease in enumerate(["b", "c", "d"], start=1):
        assert d.acquire(lease, "k", wait=True).result == Queued("k", position)
    order = []
    holder = "a"
    for _ in range(3):
        outcome = d.release(holder, "k")
        assert isinstance(outcome.result, Released) and outcome.result.held
        (promotion,) = outcome.promotions
        assert promotion.token == d.index
        assert d.holders("k") == [promotion.lease]
        order.append(promotion.lease)
        holder = promotion.lease
    assert order == ["b", "c", "d"]


def test_semaphore_admits_limit_holders_then_queues(d: Driver) -> None:
    assert isinstance(d.acquire("a", "s", limit=2).result, Granted)
    assert isinstance(d.acquire("b", "s", limit=2).result, Granted)
    assert isinstance(d.acquire("c", "s", limit=2).result, Locked)
    assert d.acquire("c", "s", limit=2, wait=True).result == Queued("s", 1)
    outcome = d.release("a", "s")
    assert [p.lease for p in outcome.promotions] == ["c"]
    assert d.holders("s") == ["b", "c"]


def test_mismatched_limit_is_invalid_until_the_key_is_idle(d: Driver) -> None:
    d.acquire("a", "s", limit=3)
    result = d.acquire("b", "s", limit=1).result
    assert isinstance(result, Invalid)
    assert "limit=3" in result.message
    d.release("a", "s")
    assert d.sm.get("s") is None
    assert isinstance(d.acquire("b", "s", limit=1).result, Granted)


def test_one_lease_holds_many_and_waits_on_many(d: Driver) -> None:
    d.acquire("a", "k1")
    d.acquire("a", "k2")
    d.acquire("b", "k3")
    d.acquire("b", "k1", wait=True)
    d.acquire("b", "k2", wait=True)
    view = d.sm.lease("b")
    assert view is not None
    assert view.holding == ("k3",) and view.waiting == ("k1", "k2")
    assert d.sm.counts() == Counts(sessions=4, locks=3, waiters=2)


# ------------------------------------------------------------------- release


def test_release_frees_the_slot_and_reports_the_token_of_the_grant(d: Driver) -> None:
    token = d.acquire("a", "k").index
    assert d.release("a", "k").result == Released("k", held=True, token=token)
    assert d.sm.get("k") is None


def test_release_by_a_non_holder_is_not_held(d: Driver) -> None:
    d.acquire("a", "k")
    result = d.release("b", "k").result
    assert isinstance(result, NotHeld) and [h.lease for h in result.holders] == ["a"]
    assert d.release("b", "free").result == NotHeld("free", ())


def test_release_by_a_waiter_leaves_the_queue(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    d.acquire("c", "k", wait=True)
    outcome = d.release("b", "k")
    assert outcome.result == Released("k", held=False, token=None)
    assert outcome.promotions == ()
    assert d.waiters("k") == ["c"]
    assert d.release("a", "k").promotions[0].lease == "c"


def test_release_with_the_grant_token_frees_that_grant(d: Driver) -> None:
    token = d.acquire("a", "k").index
    assert d.release("a", "k", token=token).result == Released("k", held=True, token=token)
    assert d.sm.get("k") is None


def test_a_release_with_an_old_token_leaves_a_newer_grant_to_the_same_lease_alone(
    d: Driver,
) -> None:
    old = d.acquire("a", "k").index
    d.release("a", "k")
    new = d.acquire("a", "k").index
    before = d.table()
    result = d.release("a", "k", token=old).result
    assert result == NotHeld("k", (Holder("a", new, d.at_ms - 10, {}),))
    assert d.table() == before


def test_a_release_with_a_token_does_not_give_up_a_place_in_the_queue(d: Driver) -> None:
    old = d.acquire("b", "k").index
    d.release("b", "k")
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    assert isinstance(d.release("b", "k", token=old).result, NotHeld)
    assert d.waiters("k") == ["b"]


def test_idle_key_is_forgotten(d: Driver) -> None:
    d.acquire("a", "k", limit=3)
    d.release("a", "k")
    assert d.sm.get("k") is None
    assert d.sm.list_locks() == ([], None)


def test_tokens_rise_per_key_across_release_and_reacquire(d: Driver) -> None:
    tokens = []
    for lease in ["a", "b", "a", "c"]:
        result = d.acquire(lease, "k").result
        assert isinstance(result, Granted)
        tokens.append(result.token)
        d.release(lease, "k")
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


# --------------------------------------------------------------------- counts


def test_counts_follow_grants_queues_promotions_and_ends(d: Driver) -> None:
    d.acquire("a", "s", limit=2)
    d.acquire("b", "s", limit=2)
    d.acquire("c", "s", limit=2, wait=True)
    d.acquire("d", "s", limit=2, wait=True)
    d.acquire("c", "x")
    assert d.sm.counts() == Counts(sessions=4, locks=3, waiters=2)
    d.close("a")  # c is promoted on s
    assert d.sm.counts() == Counts(sessions=3, locks=3, waiters=1)
    d.release("d", "s")  # d leaves the queue
    assert d.sm.counts() == Counts(sessions=3, locks=3, waiters=0)
    d.expire("c")
    assert d.sm.counts() == Counts(sessions=2, locks=1, waiters=0)


# -------------------------------------------------------------------- queries


def test_list_locks_by_prefix_sorted(d: Driver) -> None:
    for key in ["jobs/b", "jobs/a", "other", "jobs/c", "jobs"]:
        d.acquire("a", key)
    page, cursor = d.sm.list_locks("jobs/")
    assert [v.key for v in page] == ["jobs/a", "jobs/b", "jobs/c"] and cursor is None
    assert len(d.sm.list_locks()[0]) == 5


def test_list_locks_pages_after_a_cursor(d: Driver) -> None:
    for key in ["jobs/b", "jobs/a", "other", "jobs/c", "jobs/d"]:
        d.acquire("a", key)
    page, cursor = d.sm.list_locks("jobs/", limit=2)
    assert [v.key for v in page] == ["jobs/a", "jobs/b"] and cursor == "jobs/b"
    page, cursor = d.sm.list_locks("jobs/", after=cursor, limit=2)
    assert [v.key for v in page] == ["jobs/c", "jobs/d"] and cursor is None
    page, cursor = d.sm.list_locks(after="jobs/d", limit=2)
    assert [v.key for v in page] == ["other"] and cursor is None


def test_list_leases_pages_after_a_cursor(d: Driver) -> None:
    page, cursor = d.sm.list_leases(limit=3)
    assert [v.lease for v in page] == ["a", "b", "c"] and cursor == "c"
    page, cursor = d.sm.list_leases(after=cursor, limit=3)
    assert [v.lease for v in page] == ["d"] and cursor is None
    page, cursor = d.sm.list_leases(limit=4)
    assert len(page) == 4 and cursor is None


def test_paging_sees_keys_and_leases_that_came_and_went(d: Driver) -> None:
    d.acquire("a", "k2")
    assert [v.key for v in d.sm.list_locks()[0]] == ["k2"]
    d.acquire("a", "k1")
    d.release("a", "k2")
    assert [v.key for v in d.sm.list_locks()[0]] == ["k1"]
    d.close("b")
    d.open("e")
    assert [v.lease for v in d.sm.list_leases()[0]] == ["a", "c", "d", "e"]


def test_get_shows_waiters_with_since_and_meta(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True, meta={"cmd": "make deploy"})
    view = d.sm.get("k")
    assert view is not None
    (waiter,) = view.waiters
    assert (waiter.lease, waiter.since_ms, dict(waiter.meta)) == (
        "b",
        d.at_ms,
        {"cmd": "make deploy"},
    )
    assert view.to_dict()["waiters"] == [
        {"lease": "b", "since_ms": d.at_ms, "meta": {"cmd": "make deploy"}}
    ]


def test_holder_meta_is_a_copy_of_what_the_holder_holds_with(d: Driver) -> None:
    d.acquire("a", "k", meta={"cmd": "make deploy"})
    d.acquire("b", "k", wait=True, meta={"cmd": "queued"})
    view = d.sm.get("k")
    assert view is not None
    assert holder_meta(d.sm, "a", "k") == dict(view.holders[0].meta) == {"cmd": "make deploy"}
    holder_meta(d.sm, "a", "k")["cmd"] = "changed"  # a copy: the table is untouched
    assert holder_meta(d.sm, "a", "k") == {"cmd": "make deploy"}
    assert holder_meta(d.sm, "b", "k") == {}  # waiting, not holding
    assert holder_meta(d.sm, "a", "other") == {}
    assert holder_meta(d.sm, "gone", "k") == {}
    assert held_count(d.sm) == d.sm.counts().locks == 1


RESULTS: list[Result] = [
    Granted("k", 3, "a"),
    Queued("k", 2),
    Locked("k", (Holder("a", 3, 1_000, {"h": "x"}),), 2_000),
    Released("k", held=True, token=3, lease_ended=True),
    Released("k", held=False),
    NotHeld("k", (Holder("a", 3, 1_000, {}),)),
    LeaseGone("a"),
    LeaseOpened("a", 5_000, incarnation=7, joined=True),
    LeaseClosed("a", released=("k1", "k2")),
    LeaseUpdated("a", 1),
    StaleRequest(41),
    Invalid("why"),
]


@pytest.mark.parametrize("result", RESULTS, ids=repr)
def test_results_are_plain_dicts_that_read_back(result: Result) -> None:
    plain = result.to_dict()
    assert cbor2.loads(cbor2.dumps(plain)) == plain
    assert result_from_dict(plain) == result


@pytest.mark.parametrize(
    ("result", "code"),
    [
        (Granted("k", 3, "a"), "OK"),
        (Queued("k", 1), "OK"),
        (Released("k"), "OK"),
        (LeaseOpened("a", 5_000), "OK"),
        (LeaseClosed("a"), "OK"),
        (LeaseUpdated("a", 5_000), "OK"),
        (Locked("k", (), 1), "LOCKED"),
        (NotHeld("k", ()), "NOT_HOLDER"),
        (LeaseGone("a"), "SESSION_EXPIRED"),
        (StaleRequest(1), "STALE_REQUEST"),
        (Invalid("x"), "BAD_REQUEST"),
    ],
    ids=repr,
)
def test_each_result_carries_its_wire_code(result: Result, code: str) -> None:
    assert result.code == code
    assert result.ok == (code == "OK")


def test_a_locked_result_lists_its_holders_on_the_wire(d: Driver) -> None:
    d.acquire("a", "k", meta={"h": "x"})
    locked = d.acquire("b", "k").result
    assert isinstance(locked, Locked)
    assert locked.to_dict() == {
        "type": "locked",
        "key": "k",
        "holders": [
            {"lease": "a", "token": d.index - 1, "granted_at_ms": d.at_ms - 10, "meta": {"h": "x"}}
        ],
        "retry_after_ms": 10_000,
    }


# ------------------------------------------------------------------ snapshot


def test_snapshot_round_trip_keeps_state_and_behaviour(d: Driver) -> None:
    d.acquire("a", "k", meta={"host": "h"})
    d.acquire("b", "k", wait=True, seq=4242)
    d.acquire("c", "k", wait=True)
    d.acquire("a", "s", limit=3)
    d.update("d", 3_000, finished=True)
    d.close("c")
    data = d.sm.snapshot()
    restored = LockStateMachine.restore(data)
    assert restored.snapshot() == data
    assert restored.applied_index == d.sm.applied_index
    assert restored.version == d.sm.version == 2
    assert restored.list_locks() == d.sm.list_locks()
    assert restored.list_leases() == d.sm.list_leases()
    assert restored.counts() == d.sm.counts()
    # The restored replica then behaves exactly like the live one.
    later: list[Command] = [
        AcquireCommand("b", "k", True, 1, {}, Origin("c1", 4242), 1),  # re-sent: the present
        CloseLeaseCommand("a", Origin("c1", 9_000), 2),
        AcquireCommand("b", "k", True, 1, {}, Origin("c1", 4242), 3),  # now granted
        OpenLeaseCommand("c", 5_000, Origin("c1", 9_001), 4),  # closed: refused
    ]
    for cmd in later:
        index = d.sm.applied_index + 1
        data = encode_command(cmd)
        assert restored.apply(index, data) == d.sm.apply(index, data)
    assert restored.snapshot() == d.sm.snapshot()


def test_equal_states_reached_in_different_orders_give_equal_snapshots() -> None:
    one, two = Driver(), Driver()
    for d in (one, two):
        d.open("a")
    for d, clients in ((one, ("p", "q")), (two, ("q", "p"))):
        for client in clients:
            d.release("a", "free", client=client, seq=5)
    one.acquire("a", "y", meta={"z": "1", "a": "2"})
    two.acquire("a", "y", meta={"a": "2", "z": "1"})
    assert one.sm.snapshot() == two.sm.snapshot()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff",
        cbor2.dumps([9, 0, [], []]),
        cbor2.dumps([1, 0, [["a"]], []]),
        cbor2.dumps([2, 0, 2, [], []]),
        cbor2.dumps([2, 0, 2, [], [["k", 1, [["ghost", 1, 0, {}]], []]], []]),
    ],
)
def test_restore_refuses_garbage(data: bytes) -> None:
    with pytest.raises(ValueError):
        LockStateMachine.restore(data)


def test_restore_refuses_an_impossible_queue() -> None:
    d = Driver()
    d.open("a")
    d.open("b")
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    item = cbor2.loads(d.sm.snapshot())
    item[4][0][2] = []  # waiters with no holder
    with pytest.raises(ValueError, match="impossible"):
        LockStateMachine.restore(cbor2.dumps(item))


def test_lease_terms_holds_and_waits_answer_without_copying_the_leases_keys() -> None:
    from dlm.node.locks import LeaseTerms, LockStateMachine
    from dlm.node.locks.commands import AcquireCommand, ClusterVersionCommand, OpenLeaseCommand

    table = LockStateMachine()
    table.apply_command(1, ClusterVersionCommand(2, 0))
    table.apply_command(2, OpenLeaseCommand("A", 30_000, Origin("c1", 1, 0), 0))
    table.apply_command(3, OpenLeaseCommand("B", 30_000, Origin("c2", 1, 0), 0))
    table.apply_command(4, AcquireCommand("A", "k", True, 1, {}, Origin("c1", 2, 1), 0))
    table.apply_command(5, AcquireCommand("B", "k", True, 1, {}, Origin("c2", 2, 1), 0))
    view = table.lease("A")
    assert view is not None
    assert table.lease_terms("A") == LeaseTerms("A", view.ttl_ms, view.incarnation, None)
    assert table.lease_terms("nope") is None
    assert table.holds("A", "k") and not table.waits("A", "k")
    assert table.waits("B", "k") and not table.holds("B", "k")
    assert not table.holds("nope", "k") and not table.waits("nope", "k")
