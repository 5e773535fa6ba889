"""Unit tests of the lock state machine, one rule at a time (ARCHITECTURE.md 1, 2, 5, 6)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import cbor2
import pytest

from dlm.node.locks import (
    Acquire,
    ApplyOutcome,
    BadRequest,
    CloseLease,
    Command,
    CommandError,
    Counts,
    Expire,
    Grant,
    Granted,
    Holder,
    LeaseClosed,
    LeaseOpened,
    Locked,
    LockStateMachine,
    NotHolder,
    OpenLease,
    Queued,
    Release,
    Released,
    SessionExpired,
    decode_command,
    encode_command,
    result_from_dict,
    validate_command,
)


class Driver:
    """A machine fed through the same bytes path the server uses, one log index per command."""

    def __init__(self) -> None:
        self.sm = LockStateMachine()
        self.index = 0
        self.seqs = itertools.count(1)
        self.at_ms = 1_000

    def run(self, cmd: Command) -> ApplyOutcome:
        self.index += 1
        return self.sm.apply(self.index, encode_command(cmd))

    def now(self) -> int:
        self.at_ms += 10
        return self.at_ms

    def open(self, lease: str, ttl_ms: int = 10_000) -> ApplyOutcome:
        return self.run(OpenLease(lease, ttl_ms, self.now()))

    def acquire(
        self,
        lease: str,
        key: str,
        *,
        wait: bool = False,
        limit: int = 1,
        meta: Mapping[str, str] | None = None,
        seq: int | None = None,
    ) -> ApplyOutcome:
        seq = next(self.seqs) if seq is None else seq
        return self.run(Acquire(lease, seq, key, wait, limit, dict(meta or {}), self.now()))

    def release(self, lease: str, key: str, *, seq: int | None = None) -> ApplyOutcome:
        seq = next(self.seqs) if seq is None else seq
        return self.run(Release(lease, seq, key, self.now()))

    def close(self, lease: str) -> ApplyOutcome:
        return self.run(CloseLease(lease, next(self.seqs), self.now()))

    def expire(self, lease: str) -> ApplyOutcome:
        return self.run(Expire(lease, self.now()))

    def holders(self, key: str) -> list[str]:
        state = self.sm.get(key)
        return [] if state is None else [h.lease for h in state.holders]

    def waiters(self, key: str) -> list[str]:
        state = self.sm.get(key)
        return [] if state is None else [w.lease for w in state.waiters]


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    for lease in ("a", "b", "c", "d"):
        driver.open(lease)
    return driver


# ------------------------------------------------------------------ commands


COMMANDS: list[Command] = [
    OpenLease("lease-1", 5_000, 17),
    CloseLease("lease_2", 3, 18),
    Acquire("L", 9, "jobs/nightly backup", True, 3, {"host": "h1", "pid": "42"}, 19),
    Release("L", 10, "ключ", 20),
    Expire("L", 21),
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: type(c).__name__)
def test_commands_round_trip_through_bytes(cmd: Command) -> None:
    assert decode_command(encode_command(cmd)) == cmd
    assert validate_command(cmd) is None


def test_encoding_is_canonical() -> None:
    a = Acquire("L", 1, "k", False, 1, {"b": "2", "a": "1"}, 0)
    b = Acquire("L", 1, "k", False, 1, {"a": "1", "b": "2"}, 0)
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
        b"\x9f" * 10_000,
        b"x" * 70_000,
    ],
)
def test_malformed_payload_is_a_bad_request_not_a_crash(payload: bytes) -> None:
    with pytest.raises(CommandError):
        decode_command(payload)
    sm = LockStateMachine()
    outcome = sm.apply(1, payload)
    assert isinstance(outcome.result, BadRequest)
    assert sm.applied_index == 1
    assert sm.counts() == Counts(0, 0, 0)


def test_empty_payload_is_a_noop_entry() -> None:
    sm = LockStateMachine()
    assert sm.apply(1, b"") == ApplyOutcome(1, None)
    assert sm.applied_index == 1


def test_indices_must_increase_but_may_skip() -> None:
    sm = LockStateMachine()
    sm.apply(3, b"")
    sm.apply(7, b"")
    with pytest.raises(ValueError, match="out of order"):
        sm.apply(7, b"")


@pytest.mark.parametrize(
    ("cmd", "words"),
    [
        (OpenLease("", 5_000, 0), "lease id"),
        (OpenLease("a b", 5_000, 0), "lease id"),
        (OpenLease("x" * 65, 5_000, 0), "lease id"),
        (OpenLease("a", 999, 0), "ttl_ms"),
        (OpenLease("a", 86_400_001, 0), "ttl_ms"),
        (OpenLease("a", 5_000, -1), "at_ms"),
        (Acquire("a", 1, "", False, 1, {}, 0), "key"),
        (Acquire("a", 1, "k" * 513, False, 1, {}, 0), "key"),
        (Acquire("a", 1, "bad\nkey", False, 1, {}, 0), "control"),
        (Acquire("a", 1, "k", False, 0, {}, 0), "limit"),
        (Acquire("a", 1, "k", False, 1025, {}, 0), "limit"),
        (Acquire("a", 1, "k", False, 1, {str(i): "" for i in range(17)}, 0), "metadata"),
        (Acquire("a", 1, "k", False, 1, {"n" * 65: "v"}, 0), "metadata name"),
        (Acquire("a", 1, "k", False, 1, {"n": "v" * 257}, 0), "metadata value"),
        (Acquire("a", -1, "k", False, 1, {}, 0), "seq"),
        (Release("a", 1, "", 0), "key"),
    ],
)
def test_out_of_range_fields_are_refused_with_a_message(cmd: Command, words: str) -> None:
    message = validate_command(cmd)
    assert message is not None and words in message
    d = Driver()
    d.open("a")
    before = (d.sm.leases(), d.sm.lease("a"), d.sm.list_locks())
    outcome = d.run(cmd)
    assert outcome.result == BadRequest(message)
    assert (d.sm.leases(), d.sm.lease("a"), d.sm.list_locks()) == before


def test_limits_at_the_edges_are_accepted() -> None:
    assert validate_command(OpenLease("a" * 64, 1_000, 0)) is None
    assert validate_command(OpenLease("a", 86_400_000, 0)) is None
    meta = {f"{i:02d}" + "n" * 62: "v" * 256 for i in range(16)}
    assert validate_command(Acquire("a", 0, "k" * 512, False, 1024, meta, 0)) is None


# -------------------------------------------------------------------- leases


def test_open_lease_reports_ttl_and_arms_the_tracker() -> None:
    d = Driver()
    outcome = d.open("a", 7_000)
    assert outcome.result == LeaseOpened("a", 7_000)
    assert outcome.opened == (("a", 7_000),)
    assert d.sm.leases() == [("a", 7_000)]


def test_reopening_a_live_lease_is_idempotent() -> None:
    d = Driver()
    d.open("a", 7_000)
    d.acquire("a", "k")
    outcome = d.open("a", 9_000)
    assert outcome.result == LeaseOpened("a", 7_000)
    assert outcome.opened == (("a", 7_000),)
    assert d.holders("k") == ["a"]


def test_requests_from_unknown_lease_are_session_expired(d: Driver) -> None:
    assert d.acquire("zz", "k").result == SessionExpired("zz")
    assert d.release("zz", "k").result == SessionExpired("zz")
    assert d.close("zz").result == SessionExpired("zz")
    assert d.expire("zz").result == SessionExpired("zz")
    assert d.sm.get("k") is None


def test_close_releases_locks_and_queue_places_and_grants_next(d: Driver) -> None:
    d.acquire("a", "k1")
    d.acquire("a", "k2")
    d.acquire("b", "k1", wait=True)
    d.acquire("b", "k2")  # Locked: b does not wait here
    d.acquire("c", "k2", wait=True)
    d.acquire("b", "k3")
    d.acquire("a", "k3", wait=True)
    outcome = d.close("a")
    assert outcome.result == LeaseClosed("a")
    assert outcome.closed == ("a",)
    assert outcome.expired == ()
    assert outcome.grants == (
        Grant("b", "k1", d.index, d.at_ms),
        Grant("c", "k2", d.index, d.at_ms),
    )
    assert d.holders("k1") == ["b"] and d.holders("k2") == ["c"]
    assert d.waiters("k3") == []
    assert d.sm.lease("a") is None
    assert d.acquire("a", "k9").result == SessionExpired("a")


def test_expire_acts_like_close_and_is_reported_as_expired(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    outcome = d.expire("a")
    assert outcome.result == LeaseClosed("a")
    assert outcome.expired == ("a",) and outcome.closed == ()
    assert outcome.grants == (Grant("b", "k", d.index, d.at_ms),)
    assert d.sm.leases() == [("b", 10_000), ("c", 10_000), ("d", 10_000)]


def test_a_lease_can_be_reopened_after_it_expired(d: Driver) -> None:
    d.acquire("a", "k")
    d.expire("a")
    d.open("a")
    assert d.acquire("a", "k").result == Granted("k", d.index, "a")


# ------------------------------------------------------------------- acquire


def test_free_key_is_granted_with_the_entry_index_as_token(d: Driver) -> None:
    outcome = d.acquire("a", "k", meta={"host": "h1"})
    assert outcome.result == Granted("k", d.index, "a")
    assert outcome.grants == ()
    state = d.sm.get("k")
    assert state is not None
    assert state.holders == (Holder("a", d.index, d.at_ms, {"host": "h1"}),)
    assert state.limit == 1


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
    again = d.acquire("a", "k", wait=True).result
    assert again == first
    assert d.holders("k") == ["a"] and d.waiters("k") == []


def test_a_lease_cannot_wait_twice_for_one_key(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    d.acquire("c", "k", wait=True)
    assert d.acquire("c", "k", wait=True).result == Queued("k", 2)
    assert d.acquire("c", "k", wait=False).result == Queued("k", 2)
    assert d.waiters("k") == ["b", "c"]


def test_waiters_are_granted_in_arrival_order(d: Driver) -> None:
    d.acquire("a", "k")
    for position, lease in enumerate(["b", "c", "d"], start=1):
        assert d.acquire(lease, "k", wait=True).result == Queued("k", position)
    order = []
    tokens = []
    holder = "a"
    for _ in range(3):
        outcome = d.release(holder, "k")
        assert outcome.result == Released("k", held=True)
        (grant,) = outcome.grants
        assert grant.token == d.index
        order.append(grant.lease)
        tokens.append(grant.token)
        holder = grant.lease
    assert order == ["b", "c", "d"]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_semaphore_admits_limit_holders_then_queues(d: Driver) -> None:
    assert isinstance(d.acquire("a", "s", limit=2).result, Granted)
    assert isinstance(d.acquire("b", "s", limit=2).result, Granted)
    assert isinstance(d.acquire("c", "s", limit=2).result, Locked)
    assert d.acquire("c", "s", limit=2, wait=True).result == Queued("s", 1)
    outcome = d.release("a", "s")
    assert [g.lease for g in outcome.grants] == ["c"]
    assert d.holders("s") == ["b", "c"]


def test_mismatched_limit_is_a_bad_request_until_the_key_is_idle(d: Driver) -> None:
    d.acquire("a", "s", limit=3)
    result = d.acquire("b", "s", limit=1).result
    assert isinstance(result, BadRequest)
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
    info = d.sm.lease("b")
    assert info is not None
    assert info.holding == ("k3",) and info.waiting == ("k1", "k2")
    assert d.sm.counts() == Counts(sessions=4, locks=3, waiters=2)


# ------------------------------------------------------------------- release


def test_release_by_a_non_holder_is_not_holder(d: Driver) -> None:
    d.acquire("a", "k")
    result = d.release("b", "k").result
    assert isinstance(result, NotHolder) and [h.lease for h in result.holders] == ["a"]
    assert d.release("b", "free").result == NotHolder("free", ())


def test_release_by_a_waiter_leaves_the_queue(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    d.acquire("c", "k", wait=True)
    outcome = d.release("b", "k")
    assert outcome.result == Released("k", held=False)
    assert outcome.grants == ()
    assert d.waiters("k") == ["c"]
    assert d.release("a", "k").grants[0].lease == "c"


def test_idle_key_is_forgotten(d: Driver) -> None:
    d.acquire("a", "k")
    d.release("a", "k")
    assert d.sm.get("k") is None
    assert d.sm.list_locks() == []


def test_tokens_rise_per_key_across_release_and_reacquire(d: Driver) -> None:
    tokens = []
    for lease in ["a", "b", "a", "c"]:
        result = d.acquire(lease, "k").result
        assert isinstance(result, Granted)
        tokens.append(result.token)
        d.release(lease, "k")
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


# --------------------------------------------------------------- idempotency


def test_resent_request_returns_original_result_without_running_again(d: Driver) -> None:
    first = d.acquire("a", "k", seq=500).result
    d.release("a", "k", seq=501)
    d.acquire("b", "k", seq=502)
    again = d.acquire("a", "k", seq=500)
    assert again.result == first
    assert d.holders("k") == ["b"]
    assert d.release("a", "k", seq=501).result == Released("k", held=True)
    assert d.holders("k") == ["b"]


def test_resent_locked_acquire_does_not_take_a_freed_lock(d: Driver) -> None:
    d.acquire("a", "k")
    locked = d.acquire("b", "k", seq=77).result
    d.release("a", "k")
    assert d.acquire("b", "k", seq=77).result == locked
    assert d.holders("k") == []


def test_resent_waiting_acquire_reports_the_present(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True)
    assert d.acquire("c", "k", wait=True, seq=900).result == Queued("k", 2)
    d.release("b", "k")
    assert d.acquire("c", "k", wait=True, seq=900).result == Queued("k", 1)
    granted_at = d.release("a", "k").grants[0].token
    assert d.acquire("c", "k", wait=True, seq=900).result == Granted("k", granted_at, "c")
    assert d.holders("k") == ["c"]


def test_request_ids_need_not_increase(d: Driver) -> None:
    assert isinstance(d.acquire("a", "k1", seq=2**62).result, Granted)
    assert isinstance(d.acquire("a", "k2", seq=5).result, Granted)
    assert isinstance(d.acquire("a", "k3", seq=0).result, Granted)
    assert d.holders("k3") == ["a"]


def test_only_the_last_32_results_are_remembered(d: Driver) -> None:
    d.acquire("a", "k", seq=1)
    d.release("a", "k", seq=2)
    for seq in range(3, 35):
        d.release("a", "nothing", seq=seq)
    # seq 2 is the 33rd newest: forgotten, so it runs again (and finds nothing).
    assert d.release("a", "k", seq=2).result == NotHolder("k", ())
    assert d.release("a", "nothing", seq=34).result == NotHolder("nothing", ())


def test_results_are_per_lease(d: Driver) -> None:
    d.acquire("a", "k", seq=1)
    assert isinstance(d.acquire("b", "k", seq=1).result, Locked)


# ------------------------------------------------------------- queries, wire


def test_list_locks_by_prefix_sorted(d: Driver) -> None:
    for key in ["jobs/b", "jobs/a", "other", "jobs/c"]:
        d.acquire("a", key)
    assert [s.key for s in d.sm.list_locks("jobs/")] == ["jobs/a", "jobs/b", "jobs/c"]
    assert len(d.sm.list_locks()) == 4


def test_get_shows_waiters_with_since_and_meta(d: Driver) -> None:
    d.acquire("a", "k")
    d.acquire("b", "k", wait=True, meta={"cmd": "make deploy"})
    state = d.sm.get("k")
    assert state is not None
    (waiter,) = state.waiters
    assert (waiter.lease, waiter.since_ms, dict(waiter.meta)) == (
        "b",
        d.at_ms,
        {"cmd": "make deploy"},
    )
    assert state.to_dict()["waiters"] == [
        {"lease": "b", "since_ms": d.at_ms, "meta": {"cmd": "make deploy"}}
    ]


def test_results_have_plain_dicts_with_a_type_and_a_code(d: Driver) -> None:
    d.acquire("a", "k", meta={"h": "x"})
    locked = d.acquire("b", "k").result
    assert isinstance(locked, Locked)
    assert locked.code == "LOCKED" and not locked.ok
    assert locked.to_dict() == {
        "type": "locked",
        "key": "k",
        "holders": [
            {"lease": "a", "token": d.index - 1, "granted_at_ms": d.at_ms - 10, "meta": {"h": "x"}}
        ],
        "retry_after_ms": 10_000,
    }
    assert Granted("k", 3, "a").to_dict() == {
        "type": "granted",
        "key": "k",
        "token": 3,
        "lease": "a",
    }
    assert Granted("k", 3, "a").code == "OK"
    assert result_from_dict(locked.to_dict()) == locked
    assert SessionExpired("a").code == "SESSION_EXPIRED"
    assert NotHolder("k", ()).code == "NOT_HOLDER"
    assert BadRequest("x").code == "BAD_REQUEST"


# ------------------------------------------------------------------ snapshot


def test_snapshot_round_trip_keeps_state_and_behaviour(d: Driver) -> None:
    d.acquire("a", "k", meta={"host": "h"})
    d.acquire("b", "k", wait=True, seq=4242)
    d.acquire("c", "k", wait=True)
    d.acquire("a", "s", limit=3)
    data = d.sm.snapshot()
    restored = LockStateMachine.restore(data)
    assert restored.snapshot() == data
    assert restored.applied_index == d.sm.applied_index
    assert restored.list_locks() == d.sm.list_locks()
    assert restored.leases() == d.sm.leases()
    assert restored.lease("b") == d.sm.lease("b")
    assert restored.counts() == d.sm.counts()
    # The restored replica then behaves exactly like the live one.
    later: list[Command] = [
        Acquire("b", 4242, "k", True, 1, {}, 1),
        CloseLease("a", 99, 2),
        Acquire("b", 4242, "k", True, 1, {}, 3),
    ]
    for cmd in later:
        index = d.sm.applied_index + 1
        assert restored.apply_command(index, cmd) == d.sm.apply_command(index, cmd)
    assert restored.snapshot() == d.sm.snapshot()


def test_equal_states_reached_in_different_orders_give_equal_snapshots() -> None:
    one, two = LockStateMachine(), LockStateMachine()
    one.apply_command(1, OpenLease("a", 5_000, 0))
    one.apply_command(2, OpenLease("b", 5_000, 0))
    two.apply_command(1, OpenLease("b", 5_000, 0))
    two.apply_command(2, OpenLease("a", 5_000, 0))
    for sm in (one, two):
        sm.apply_command(3, Acquire("b", 1, "y", False, 1, {"z": "1", "a": "2"}, 0))
        sm.apply_command(4, Acquire("a", 1, "x", False, 1, {}, 0))
    assert one.snapshot() == two.snapshot()


@pytest.mark.parametrize(
    "data", [b"", b"\xff", cbor2.dumps([9, 0, [], []]), cbor2.dumps([1, 0, [["a"]], []])]
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
    item[3][0][2] = []  # waiters with no holder
    with pytest.raises(ValueError, match="impossible"):
        LockStateMachine.restore(cbor2.dumps(item))
