"""The IO-free decisions: redirects, retries with the same request, backoff, error mapping,
request identity (Sequencer, change), the client's lease clock, paging, the open budget."""

from __future__ import annotations

import contextlib
import random
import re
from typing import Any

import pytest

from dlm import views, wire
from dlm.client import core
from dlm.client.errors import (
    BadRequest,
    ChangeInProgress,
    ClusterUnavailable,
    DlmError,
    LeaseLost,
    LockHeld,
    NotHolder,
    ServerError,
    UnsafeChange,
)
from dlm.wire import ErrorCode, error, ok


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def settings(members: list[str], timeout: float = 5.0) -> tuple[core.Context, FakeClock]:
    clock = FakeClock()
    s = core.Context(
        members=members,
        router=core.Router(members),
        backoff=core.Backoff(random.Random(7)),
        clock=clock,
        timeout=timeout,
        attempt_timeout=1.0,
        client="me",
        seqs=core.Sequencer(start=100),
    )
    return s, clock


def drive(flow: Any, answer: Any, clock: FakeClock, max_steps: int = 10_000) -> Any:
    """Runs a flow; ``answer(action)`` gives each Send's outcome. Sleeps advance the clock."""
    action = next(flow)
    for _ in range(max_steps):
        if isinstance(action, core.Sleep):
            clock.now += action.seconds
            outcome = None
        else:
            clock.now += 0.001
            outcome = answer(action)
        try:
            action = flow.send(outcome)
        except StopIteration as done:
            return done.value
    raise AssertionError("flow did not finish")


def not_leader(addr: str | None) -> dict[str, Any]:
    return error(1, ErrorCode.NOT_LEADER, "no", leader=None, leader_address=addr)


def test_follows_redirects_over_several_hops_with_the_same_request() -> None:
    s, clock = settings(["a:1"])
    chain = {"a:1": not_leader("b:2"), "b:2": not_leader("c:3"), "c:3": ok(1, lease="x")}
    sent: list[core.Send] = []

    def answer(action: core.Send) -> Any:
        sent.append(action)
        return chain[action.addr]

    addr, reply = drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert (addr, reply["lease"]) == ("c:3", "x")
    assert [a.addr for a in sent] == ["a:1", "b:2", "c:3"]
    assert all(a.request is sent[0].request for a in sent)
    # The leader is remembered: the next call goes straight there.
    assert s.router.target() == "c:3"


def test_redirect_loop_is_bounded_and_ends_in_cluster_unavailable() -> None:
    s, clock = settings(["a:1", "b:2"], timeout=2.0)
    loop = {"a:1": not_leader("b:2"), "b:2": not_leader("a:1")}
    sends = 0

    def answer(action: core.Send) -> Any:
        nonlocal sends
        sends += 1
        return loop[action.addr]

    with pytest.raises(ClusterUnavailable, match="no leader with a quorum"):
        drive(core.call(s, {"t": "status"}), answer, clock)
    assert sends < 2000


def test_a_stale_redirect_does_not_trap_the_client_between_two_members() -> None:
    # c:3 was removed and never learned it: it still names b:2, which lost its leadership
    # and knows no leader. The leader, a:1, must still be found.
    s, clock = settings(["b:2", "c:3", "a:1"], timeout=5.0)
    answers = {"b:2": not_leader(None), "c:3": not_leader("b:2"), "a:1": ok(1, lease="x")}
    sent: list[str] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.addr)
        return answers[action.addr]

    addr, _ = drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert addr == "a:1"
    assert sent == ["b:2", "c:3", "b:2", "a:1"]


def test_a_leader_found_through_a_redirect_that_dies_is_not_asked_twice() -> None:
    s, clock = settings(["a:1", "b:2", "c:3"], timeout=5.0)
    answers: dict[str, Any] = {"a:1": not_leader("b:2"), "b:2": ok(1, lease="x")}
    sent: list[str] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.addr)
        return answers[action.addr]

    drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert sent == ["a:1", "b:2"]
    # b dies; c was elected.
    answers.update({"b:2": core.Failed("refused"), "c:3": ok(1, lease="x")})
    sent.clear()
    addr, _ = drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert (addr, sent) == ("c:3", ["b:2", "c:3"])


def test_connection_failures_retry_the_same_seq_on_the_next_member() -> None:
    s, clock = settings(["a:1", "b:2"])
    seen: list[tuple[str, int]] = []

    def answer(action: core.Send) -> Any:
        seen.append((action.addr, action.request["seq"]))
        if action.addr == "a:1":
            return core.Failed("refused")
        return ok(1, key="k", released="lock", token=5, lease_ended=False)

    released = drive(core.release_flow(s, "lease1", "k"), answer, clock)
    assert released == core.ReleaseOutcome("k", held=True, token=5, lease_ended=False)
    assert [addr for addr, _ in seen] == ["a:1", "b:2"]
    assert len({seq for _, seq in seen}) == 1


def test_unreachable_cluster_message_names_members_and_what_to_do() -> None:
    s, clock = settings(["127.0.0.1:7700"], timeout=3.0)
    with pytest.raises(ClusterUnavailable) as info:
        drive(core.call(s, {"t": "status"}), lambda a: core.Failed("connection refused"), clock)
    message = str(info.value)
    assert "no member of 127.0.0.1:7700 answered within 3s" in message
    assert "DLM_CLUSTER" in message
    assert "\n" not in message
    assert info.value.exit_code == 69


@pytest.mark.parametrize(
    "code", ["NO_QUORUM", "TIMEOUT", "SHUTTING_DOWN", "UNAVAILABLE", "NOT_LEADER"]
)
def test_retryable_codes_are_retried_until_the_deadline(code: str) -> None:
    s, clock = settings(["a:1", "b:2", "c:3"], timeout=4.0)
    start = clock.now
    replies = 0

    def answer(action: core.Send) -> Any:
        nonlocal replies
        replies += 1
        return error(1, ErrorCode(code), "busy", retry_after_ms=50)

    with pytest.raises(ClusterUnavailable):
        drive(core.call(s, {"t": "status"}), answer, clock)
    assert replies > 3
    # It gives up close to the deadline, never long after it.
    assert start + 4.0 <= clock.now <= start + 4.0 + 0.1


def test_transient_error_then_success() -> None:
    s, clock = settings(["a:1"])
    replies = iter([error(1, ErrorCode.NO_QUORUM, "wait", retry_after_ms=200), ok(1, x=1)])
    _, reply = drive(core.call(s, {"t": "status"}), lambda a: next(replies), clock)
    assert reply["x"] == 1


def test_backoff_is_full_jitter_capped_and_honours_retry_after() -> None:
    backoff = core.Backoff(random.Random(1), base=0.01, cap=0.5)
    for attempt in range(40):
        for _ in range(20):
            d = backoff.delay(attempt)
            assert 0.0 <= d <= min(0.5, 0.01 * 2**attempt)
    assert all(backoff.delay(0, retry_after_ms=300) >= 0.3 for _ in range(20))
    # A server asking for absurd waits is not obeyed beyond ten caps.
    assert backoff.delay(0, retry_after_ms=10**9) <= 5.0
    # Same seed, same delays: runs replay.
    a = core.Backoff(random.Random(5))
    b = core.Backoff(random.Random(5))
    assert [a.delay(i) for i in range(10)] == [b.delay(i) for i in range(10)]


ERROR_CASES = [
    ("LOCKED", LockHeld, 75),
    ("NOT_HOLDER", NotHolder, 77),
    ("SESSION_EXPIRED", LeaseLost, 77),
    ("BAD_REQUEST", BadRequest, 2),
    ("TOO_LARGE", BadRequest, 2),
    ("CONFLICT", ChangeInProgress, 75),
    ("UNSAFE", UnsafeChange, 2),
    ("SOMETHING_NEW", ServerError, 70),  # the command exits 70 for it
]


@pytest.mark.parametrize(("code", "cls", "exit_code"), ERROR_CASES)
def test_error_replies_map_to_exceptions(code: str, cls: type, exit_code: int) -> None:
    holders = [{"lease": "other", "token": 42}]
    reply = {
        "t": "error",
        "id": 1,
        "code": code,
        "message": "server\nsays",
        "holders": holders,
        "retry_after_ms": 250,
    }
    exc = core.error_from_reply(reply, {"key": "jobs/nightly", "lease": "mine"})
    assert isinstance(exc, cls)
    assert exc.code == code
    assert exc.exit_code == exit_code
    assert "\n" not in str(exc)
    if isinstance(exc, LockHeld):
        assert exc.holders == holders and exc.retry_after_ms == 250
        assert "other" in str(exc) and "jobs/nightly" in str(exc)
    if isinstance(exc, NotHolder):
        assert exc.holders == holders and "mine" in str(exc)


@pytest.mark.parametrize(
    ("ended", "says"),
    [
        ("expired", "lease Abc12 has expired, and its locks are gone"),
        ("closed", "lease Abc12 was closed (released or revoked), and its locks are gone"),
        ("unknown", "no such lease Abc12: the cluster has no live lease with that id"),
        (None, "lease Abc12 is not live (ended, or never opened), and its locks are gone"),
        ("garbage", "lease Abc12 is not live (ended, or never opened)"),
    ],
)
def test_a_gone_lease_is_worded_by_how_the_cluster_says_it_ended(
    ended: str | None, says: str
) -> None:
    reply = {"t": "error", "id": 1, "code": "SESSION_EXPIRED", "message": "lease gone"}
    if ended is not None:
        reply["ended"] = ended
    exc = core.error_from_reply(reply, {"lease": "Abc12"})
    assert isinstance(exc, LeaseLost) and exc.exit_code == 77
    assert str(exc).startswith(says)
    # "expired" only when a tombstone says so
    assert ("expired" in str(exc)) == (ended == "expired")
    assert exc.ended == (ended if ended in ("expired", "closed", "unknown") else None)


def test_non_retryable_error_is_raised_at_once() -> None:
    s, clock = settings(["a:1"])
    calls = 0

    def answer(action: core.Send) -> Any:
        nonlocal calls
        calls += 1
        return error(1, ErrorCode.SESSION_EXPIRED, "gone")

    with pytest.raises(LeaseLost):
        drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert calls == 1


def test_parse_members_and_ids() -> None:
    assert core.parse_members("a:1, b:2,a:1") == ["a:1", "b:2"]
    assert core.parse_members(["h"]) == ["h:7700"]
    with pytest.raises(ValueError):
        core.parse_members(" , ")
    ids = {core.new_lease_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[a-z0-9]{16}", i) for i in ids)
    seqs = [core.new_seq() for _ in range(200)]
    assert all(0 <= q < 2**63 for q in seqs)
    assert len(set(seqs)) == 200
    counter = core.RequestIds()
    assert [counter.next() for _ in range(3)] == [1, 2, 3]


def test_waiting_acquire_flow_times_out_and_leaves_the_queue() -> None:
    s, clock = settings(["a:1"])
    sent: list[dict[str, Any]] = []

    def answer(action: Any) -> Any:
        if isinstance(action, core.AwaitGrant):
            clock.now += action.timeout
            return None
        sent.append(action.request)
        if action.request["t"] == "acquire":
            return ok(1, result="queued", key="k", lease="l", position=1)
        return ok(1, key="k", released="queue")

    flow = core.acquire_flow(s, "l", "k", wait=2.0, limit=1, meta=None, known_ttl_ms=1000)
    with pytest.raises(LockHeld, match="after waiting 2s"):
        drive(flow, answer, clock)
    assert [r["t"] for r in sent] == ["acquire", "release"]
    assert sent[0]["wait"] is True


def test_waiting_acquire_flow_resends_the_same_seq_after_a_drop() -> None:
    s, clock = settings(["a:1"])
    acquires: list[dict[str, Any]] = []
    dropped = False

    def answer(action: Any) -> Any:
        nonlocal dropped
        if isinstance(action, core.AwaitGrant):
            dropped = True
            return core.Failed("connection closed")
        acquires.append(action.request)
        if not dropped:
            return ok(1, result="queued", key="k", lease="l", position=1)
        return ok(1, result="granted", key="k", lease="l", token=9, ttl_ms=1000)

    flow = core.acquire_flow(s, "l", "k", wait=5.0, limit=1, meta=None, known_ttl_ms=None)
    grant = drive(flow, answer, clock)
    assert grant == core.Grant(key="k", token=9, lease="l", ttl_ms=1000)
    assert len(acquires) == 2 and acquires[0]["seq"] == acquires[1]["seq"]


def test_lease_and_grant_are_values_and_lease_equality_ignores_confirmed_at() -> None:
    assert core.Lease("l", 1000, confirmed_at=1.0) == core.Lease(id="l", ttl_ms=1000)
    assert hash(core.Lease("l", 1000, 1.0)) == hash(core.Lease("l", 1000, 2.0))
    assert core.Lease("l", 1000) != core.Lease("l", 2000)
    assert "confirmed_at=1.5" in repr(core.Lease("l", 1000, 1.5))
    grant = core.Grant("k", 9, "l", 1000)
    assert grant == core.Grant(key="k", token=9, lease="l", ttl_ms=1000)
    assert repr(grant) == "Grant(key='k', token=9, lease='l', ttl_ms=1000)"
    with pytest.raises(AttributeError):
        grant.token = 10


# --- the dial timeout (dlm --dial-timeout) ----------------------------------------------


def dial_settings(members: list[str], dial: float) -> tuple[core.Context, FakeClock]:
    s, clock = settings(members, timeout=10.0)
    s.dial_timeout = dial
    return s, clock


def test_gives_up_after_the_dial_timeout_when_no_member_answers_at_all() -> None:
    s, clock = dial_settings(["a:1", "b:2"], 2.0)
    start = clock.now
    tried: set[str] = set()

    def refused(action: core.Send) -> Any:
        tried.add(action.addr)
        return core.Failed("Connection refused")

    with pytest.raises(ClusterUnavailable) as info:
        drive(core.call(s, {"t": "status"}), refused, clock)
    assert 2.0 <= clock.now - start < 2.1  # not the 10 s --timeout
    assert tried == {"a:1", "b:2"}
    message = str(info.value)
    assert "no member answered within the dial timeout (2s)" in message
    assert "a:1: Connection refused" in message and "b:2: Connection refused" in message


def test_silent_members_share_the_dial_budget() -> None:
    s, clock = dial_settings(["a:1", "b:2", "c:3"], 1.5)
    start = clock.now
    timeouts: list[float] = []

    def silent(action: core.Send) -> Any:
        timeouts.append(action.timeout)
        clock.now += action.timeout  # it waited that long for nothing
        return core.Failed(f"no reply within {action.timeout:g}s")

    with pytest.raises(ClusterUnavailable, match="dial timeout"):
        drive(core.call(s, {"t": "status"}), silent, clock)
    assert timeouts[:3] == [0.5, 0.5, 0.5]  # every member was tried within the budget
    assert clock.now - start < 1.6


VOTERS = {"n1": "a:1", "n2": "b:2", "n3": "c:3"}


def leaderless_member(action: core.Send) -> Any:
    """n1 (a:1) runs but knows no leader; n2 and n3 are down."""
    if action.addr == "a:1":
        return error(1, ErrorCode.NOT_LEADER, "not the leader", leader=None, voters=VOTERS)
    return core.Failed("Connection refused")


def test_members_that_answer_without_a_leader_fail_within_the_dial_timeout() -> None:
    s, clock = dial_settings(["a:1", "b:2", "c:3"], 2.0)
    start = clock.now
    with pytest.raises(ClusterUnavailable) as info:
        drive(core.call(s, {"t": "status"}), leaderless_member, clock)
    assert 2.0 <= clock.now - start < 2.1  # the dial timeout, not the 10 s --timeout
    assert info.value.exit_code == 69
    assert "1 of 3 voters answer; n2, n3 refused" in str(info.value)


def test_a_silent_voter_is_named_as_such_and_one_outside_cluster_as_not_asked() -> None:
    s, clock = dial_settings(["a:1", "b:2", "c:3", "d:4"], 1.0)
    start = clock.now
    voters = {**VOTERS, "n4": "d:4", "n5": "e:5"}

    def answer(action: core.Send) -> Any:
        if action.addr == "a:1":
            return error(1, ErrorCode.NOT_LEADER, "not the leader", leader=None, voters=voters)
        if action.addr == "b:2":
            clock.now += action.timeout
            return core.Failed(f"no reply within {action.timeout:g}s")
        return core.Failed("Connection refused")

    with pytest.raises(ClusterUnavailable) as info:
        drive(core.call(s, {"t": "status"}), answer, clock)
    assert clock.now - start < 1.3  # at most one share of the dial budget over it
    assert (
        "1 of 5 voters answer; n2 did not answer; n3, n4 refused; n5 not asked (not in --cluster)"
    ) in str(info.value)


def test_voters_outside_cluster_that_could_make_a_quorum_are_waited_for() -> None:
    s, clock = dial_settings(["a:1", "b:2"], 0.5)
    start = clock.now

    def answer(action: core.Send) -> Any:
        if clock.now - start > 3.0:  # n3 (not in --cluster) and n1 elected a leader
            return ok(1, term=4)
        return leaderless_member(action)

    _, reply = drive(core.call(s, {"t": "status"}), answer, clock)
    assert reply["term"] == 4


def test_without_a_voter_list_the_cluster_addresses_stand_in() -> None:
    s, clock = dial_settings(["a:1", "b:2", "c:3"], 2.0)

    def answer(action: core.Send) -> Any:
        if action.addr == "a:1":
            return error(1, ErrorCode.NOT_LEADER, "not the leader", leader=None)
        return core.Failed("Connection refused")

    with pytest.raises(ClusterUnavailable) as info:
        drive(core.call(s, {"t": "status"}), answer, clock)
    assert "1 of 3 voters answer; b:2, c:3 refused" in str(info.value)


def test_a_quorum_without_a_leader_is_an_election_worth_waiting_for() -> None:
    s, clock = dial_settings(["a:1", "b:2", "c:3"], 0.5)
    start = clock.now

    def electing(action: core.Send) -> Any:
        if clock.now - start > 3.0:  # well past the dial timeout: a leader is elected
            return ok(1, term=3)
        if action.addr == "c:3":
            return core.Failed("Connection refused")
        return error(1, ErrorCode.NOT_LEADER, "not the leader", leader=None, voters=VOTERS)

    _, reply = drive(core.call(s, {"t": "status"}), electing, clock)
    assert reply["term"] == 3


def test_after_first_contact_a_leaderless_cluster_is_ridden_out_for_the_whole_timeout() -> None:
    s, clock = dial_settings(["a:1", "b:2", "c:3"], 0.5)
    drive(core.call(s, {"t": "status"}), lambda action: ok(1, term=1), clock)
    start = clock.now
    with pytest.raises(ClusterUnavailable, match="no leader with a quorum within 10s"):
        drive(core.call(s, {"t": "status"}), leaderless_member, clock)
    assert clock.now - start >= 10.0  # renewals keep trying: not bound by --dial-timeout


def test_once_a_member_answers_only_the_timeout_counts() -> None:
    s, clock = dial_settings(["a:1"], 0.5)
    replies = 0

    def no_quorum_for_a_while(action: core.Send) -> Any:
        nonlocal replies
        replies += 1
        clock.now += 0.2
        if clock.now - 100.0 < 3.0:  # well past the dial timeout
            return error(1, ErrorCode.NO_QUORUM, "electing", retry_after_ms=50)
        return ok(1, term=2)

    _, reply = drive(core.call(s, {"t": "status"}), no_quorum_for_a_while, clock)
    assert reply["term"] == 2 and replies > 3


def test_a_reason_that_names_its_address_is_not_prefixed_again() -> None:
    s, clock = dial_settings(["a:1"], 0.1)
    with pytest.raises(ClusterUnavailable) as info:
        drive(
            core.call(s, {"t": "status"}),
            lambda action: core.Failed("a:1 is not a dlm member (it answered something else)"),
            clock,
        )
    assert "a:1: a:1" not in str(info.value)
    assert "a:1 is not a dlm member" in str(info.value)


def test_after_a_first_answer_the_client_rides_out_an_outage_for_the_whole_timeout() -> None:
    s, clock = dial_settings(["a:1"], 0.5)
    drive(core.call(s, {"t": "status"}), lambda action: ok(1, term=1), clock)
    start = clock.now
    down_until = clock.now + 3.0  # the cluster restarts: refused for a while, then back

    def restarting(action: core.Send) -> Any:
        if clock.now < down_until:
            return core.Failed("Connection refused")
        return ok(1, term=2)

    _, reply = drive(core.call(s, {"t": "status"}), restarting, clock)
    assert reply["term"] == 2 and clock.now - start >= 3.0


# ---------------------------------------------------------------------------
# Request identity
# ---------------------------------------------------------------------------


def test_a_sequencer_counts_up_from_a_random_offset() -> None:
    starts = [core.Sequencer().issue() for _ in range(20)]
    assert len(set(starts)) == 20  # drawn from the OS: two clients' numbers do not meet
    assert all(0 < seq <= 2**62 for seq in starts)
    seqs = core.Sequencer(start=41)
    assert [seqs.issue() for _ in range(3)] == [42, 43, 44]


def test_acked_is_just_below_the_lowest_unanswered_request() -> None:
    seqs = core.Sequencer(start=100)
    assert seqs.acked == 100  # nothing asked yet
    first, second, third = seqs.issue(), seqs.issue(), seqs.issue()
    assert seqs.acked == 100
    seqs.done(second)
    assert seqs.acked == 100  # the first may still be re-sent
    seqs.done(first)
    assert seqs.acked == second
    seqs.done(third)
    assert seqs.acked == third
    seqs.done(third)  # done twice changes nothing
    assert seqs.acked == third


def test_change_puts_the_client_id_seq_and_acked_on_the_wire() -> None:
    s, clock = settings(["a:1"])
    pending = s.seqs.issue()  # an earlier request that is still unanswered
    sent: list[dict[str, Any]] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.request)
        return ok(1, lease="L", released=[])

    drive(core.change(s, wire.CloseLease(id=0, lease="L", seq=0)), answer, clock)
    [request] = sent
    assert (request["t"], request["lease"], request["client"]) == ("close_lease", "L", "me")
    assert request["seq"] == pending + 1
    assert request["acked"] == pending - 1
    assert "id" not in request  # the driver gives each attempt its own


def test_change_keeps_one_seq_for_every_retry() -> None:
    s, clock = settings(["a:1", "b:2"])
    replies = iter(
        [core.Failed("reset"), not_leader("b:2"), error(1, ErrorCode.TIMEOUT, "slow"), ok(1)]
    )
    sent: list[dict[str, Any]] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.request)
        return next(replies)

    drive(core.change(s, wire.CloseLease(id=0, lease="L", seq=0)), answer, clock)
    assert len(sent) == 4
    assert len({(r["client"], r["seq"], r["acked"]) for r in sent}) == 1


@pytest.mark.parametrize(
    "final",
    [
        ok(1),
        error(1, ErrorCode.SESSION_EXPIRED, "gone"),
        error(1, ErrorCode.NO_QUORUM, "no quorum", retry_after_ms=100),
    ],
    ids=["answered", "refused", "given-up"],
)
def test_change_marks_its_seq_done_whatever_the_outcome(final: dict[str, Any]) -> None:
    s, clock = settings(["a:1"], timeout=1.0)
    sent: list[int] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.request["seq"])
        return final

    with contextlib.suppress(DlmError):
        drive(core.change(s, wire.CloseLease(id=0, lease="L", seq=0)), answer, clock)
    assert sent and s.seqs.acked == sent[0]


# ---------------------------------------------------------------------------
# The client's lease clock
# ---------------------------------------------------------------------------


def test_the_lease_deadline_counts_from_the_send_less_the_margin() -> None:
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=10.0)
    # 30 s less 2 x 0.5 % of it and 50 ms.
    assert clock.deadline == pytest.approx(10.0 + 30.0 - 0.3 - 0.05)
    assert clock.deadline == core.lease_deadline(10.0, 30_000)
    # A renewal sent at 20 and answered at 25 counts from 20.
    assert clock.confirmed(20.0, 30_000, now=25.0)
    assert clock.deadline == pytest.approx(20.0 + 30.0 - 0.35)
    assert clock.next_renewal() == pytest.approx(20.0 + 10.0)


def test_an_older_renewal_confirmed_late_does_not_move_the_deadline_back() -> None:
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=10.0)
    assert clock.confirmed(20.0, 30_000, now=21.0)
    assert clock.confirmed(15.0, 30_000, now=22.0)
    assert clock.deadline == core.lease_deadline(20.0, 30_000)


def test_a_confirmation_after_the_deadline_leaves_the_lease_lost() -> None:
    clock = core.LeaseClock(ttl_ms=1_000, confirmed_at=10.0)
    deadline = clock.deadline
    assert not clock.expired(deadline - 0.001)
    # Sent in time, answered too late: the cluster may have given the locks away already.
    assert not clock.confirmed(10.5, 1_000, now=deadline + 0.001)
    assert clock.deadline == deadline and clock.lost
    assert not clock.confirmed(deadline + 0.01, 1_000, now=deadline + 0.02)
    assert clock.expired(deadline - 1.0)  # lost for good, whatever the time


# -- TTL updates: the leader re-arms the lease at apply + the new TTL -----------------


def test_a_shortened_lease_cannot_be_outlived() -> None:
    """Issue 20, hole 3: a 30 s lease updated to 2 s; the leader re-arms it at apply + 2 s
    and, with no renewal, grants the key to B 2.1 s later. A's deadline must be past by
    then (it said 26 s left)."""
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=0.0)
    assert clock.confirmed(1.0, 30_000, now=1.01)
    sent = 2.0
    ticket = clock.update_sent(sent, 2_000)
    # At once, before any answer: the update may be applied the moment it arrives.
    assert clock.deadline <= core.lease_deadline(sent, 2_000)
    applied = sent + 0.005
    assert clock.update_settled(ticket, 2_000, now=sent + 0.01, applied=True)
    assert clock.deadline == core.lease_deadline(sent, 2_000)
    b_granted = applied + 2.1
    assert clock.expired(b_granted)
    assert clock.lost


def test_a_renewal_sent_before_the_update_never_moves_the_deadline_later() -> None:
    """A renewal in flight when the update is sent may be served before the update is
    applied, and answer with the old TTL: its reply moves nothing, before or after the
    update's own reply."""
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=0.0)
    ticket = clock.update_sent(10.0, 2_000)
    capped = clock.deadline
    assert capped == core.lease_deadline(10.0, 2_000)
    # The old renewal (sent at 9.9, old TTL) is answered after the update was sent ...
    assert clock.confirmed(9.9, 30_000, now=10.02)
    assert clock.deadline == capped
    assert clock.update_settled(ticket, 2_000, now=10.03, applied=True)
    # ... or after its reply.
    assert clock.confirmed(9.95, 30_000, now=10.04)
    assert clock.deadline == core.lease_deadline(10.0, 2_000)
    assert clock.ttl_ms == 2_000


def test_a_renewal_sent_after_the_update_counts_no_more_than_the_new_ttl() -> None:
    """Sent after the update but served before it was applied (the old TTL in its reply):
    the update may still re-arm the lease later, at apply + the new TTL."""
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=0.0)
    ticket = clock.update_sent(10.0, 2_000)
    assert clock.confirmed(10.5, 30_000, now=10.6)
    assert clock.deadline == core.lease_deadline(10.5, 2_000)
    # Its confirmation arrives after that renewal's: the deadline stays where it is safe.
    assert clock.update_settled(ticket, 2_000, now=10.7, applied=True)
    assert clock.deadline == core.lease_deadline(10.5, 2_000)
    assert clock.confirmed(11.0, 2_000, now=11.1)
    assert clock.deadline == core.lease_deadline(11.0, 2_000)


def test_a_renewal_sent_with_the_update_and_answered_after_it_counts_the_new_ttl() -> None:
    """Found by the simulator: a renewal sent at the same instant as the update, served
    before the update was applied (old TTL in its reply), answered after the update's
    own confirmation. The update re-armed the lease after the renewal was served."""
    clock = core.LeaseClock(ttl_ms=2_000, confirmed_at=0.0)
    ticket = clock.update_sent(1.0, 300)
    assert clock.update_settled(ticket, 300, now=1.003, applied=True)
    assert clock.confirmed(1.0, 2_000, now=1.004)
    assert clock.deadline == core.lease_deadline(1.0, 300)
    # Sent before the update's confirmation arrived: the same.
    assert clock.confirmed(1.002, 2_000, now=1.005)
    assert clock.deadline == core.lease_deadline(1.002, 300)
    # Sent after it: the reply tells the TTL the leader uses.
    assert clock.confirmed(1.1, 300, now=1.105)
    assert clock.deadline == core.lease_deadline(1.1, 300)


def test_the_renewal_interval_follows_the_new_ttl_at_once() -> None:
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=0.0)
    assert clock.confirmed(5.0, 30_000, now=5.1)
    assert clock.next_renewal() == pytest.approx(15.0)
    clock.update_sent(6.0, 2_000)
    # Before any answer: the next renewal is due a third of the new TTL after the last
    # one that counted, which is already past.
    assert clock.ttl_ms == 2_000
    assert clock.interval() == pytest.approx(2 / 3)
    assert clock.next_renewal() <= 6.0


def test_a_longer_ttl_counts_once_confirmed() -> None:
    clock = core.LeaseClock(ttl_ms=2_000, confirmed_at=0.0)
    before = clock.deadline
    ticket = clock.update_sent(0.5, 30_000)
    assert clock.deadline == before and clock.ttl_ms == 2_000
    assert clock.update_settled(ticket, 30_000, now=0.6, applied=True)
    assert clock.deadline == core.lease_deadline(0.5, 30_000)
    assert clock.interval() == pytest.approx(10.0)


def test_an_unanswered_update_keeps_capping_and_a_refused_one_does_not() -> None:
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=0.0)
    doubt = clock.update_sent(1.0, 2_000)
    assert clock.update_settled(doubt, None, now=2.0, applied=None)
    # A later leader may still apply it: every renewal counts with at most 2 s.
    assert clock.confirmed(2.0, 30_000, now=2.1)
    assert clock.deadline == core.lease_deadline(2.0, 2_000)
    assert clock.ttl_ms == 2_000

    other = core.LeaseClock(ttl_ms=30_000, confirmed_at=0.0)
    refused = other.update_sent(1.0, 2_000)
    assert other.update_settled(refused, None, now=1.1, applied=False)
    assert other.deadline == core.lease_deadline(1.0, 2_000)  # never raised by a refusal
    assert other.confirmed(1.2, 30_000, now=1.3)
    assert other.deadline == core.lease_deadline(1.2, 30_000)


def test_a_renewal_that_reports_a_shorter_ttl_lowers_the_deadline() -> None:
    """Another process of the lease's owner shortened it: the first renewal that says so
    sets the deadline from its own send time and the TTL it reports."""
    clock = core.LeaseClock(ttl_ms=30_000, confirmed_at=0.0)
    assert clock.confirmed(1.0, 2_000, now=1.1)
    assert clock.deadline == core.lease_deadline(1.0, 2_000)
    assert clock.ttl_ms == 2_000


def test_a_lease_lost_stays_lost_whatever_the_update() -> None:
    clock = core.LeaseClock(ttl_ms=1_000, confirmed_at=0.0)
    assert clock.expired(5.0)
    ticket = clock.update_sent(5.0, 30_000)
    assert not clock.update_settled(ticket, 30_000, now=5.1, applied=True)
    assert clock.lost and clock.expired(0.0)


# ---------------------------------------------------------------------------
# Paging, and the open's budget
# ---------------------------------------------------------------------------


def test_paged_flow_follows_next_until_null() -> None:
    s, clock = settings(["a:1"])
    pages = {None: (["a", "b"], "b"), "b": (["c", "d"], "d"), "d": (["e"], None)}
    asked: list[str | None] = []

    def answer(action: core.Send) -> Any:
        after = action.request.get("after")
        asked.append(after)
        keys, cursor = pages[after]
        return ok(1, locks=[{"key": k} for k in keys], next=cursor)

    items = drive(core.list_locks_flow(s, "p/"), answer, clock)
    assert [item.key for item in items] == ["a", "b", "c", "d", "e"]
    assert asked == [None, "b", "d"]


def test_paged_flow_stops_when_the_cursor_does_not_move() -> None:
    s, clock = settings(["a:1"])
    asked = 0

    def answer(action: core.Send) -> Any:
        nonlocal asked
        asked += 1
        return ok(1, leases=[{"id": "x"}], next="x")

    items = drive(core.list_leases_flow(s), answer, clock)
    # The page that did not move the cursor ends the listing; its repeat is passed over.
    assert asked == 2 and [item.id for item in items] == ["x"]


def test_a_page_without_its_list_is_a_bad_reply() -> None:
    s, clock = settings(["a:1"])
    for flow, page in (
        (core.list_locks_flow(s), {"locks": {"key": "a"}}),
        (core.list_leases_flow(s), {"next": None}),
    ):
        with pytest.raises(ServerError, match="is missing or not a list"):
            drive(flow, lambda action, page=page: ok(1, **page), clock)


def test_an_open_is_retried_for_at_most_open_retry_max_s_whatever_the_timeout() -> None:
    s, clock = settings(["a:1"], timeout=10 * core.OPEN_RETRY_MAX_S)
    start = clock.now
    sent: list[dict[str, Any]] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.request)
        return core.Failed("connection refused")

    with pytest.raises(ClusterUnavailable, match=f"within {core.OPEN_RETRY_MAX_S:g}s"):
        drive(core.open_lease_flow(s, 5_000, "L"), answer, clock)
    assert start + core.OPEN_RETRY_MAX_S <= clock.now <= start + core.OPEN_RETRY_MAX_S + 1.1
    assert len({r["seq"] for r in sent}) == 1


def test_an_opened_lease_counts_from_when_the_open_was_first_sent() -> None:
    s, clock = settings(["a:1"])
    start = clock.now
    replies = iter([core.Failed("reset"), ok(1, lease="L", ttl_ms=5_000, incarnation=9)])
    lease = drive(core.open_lease_flow(s, 5_000, "L"), lambda a: next(replies), clock)
    assert lease == core.Lease("L", 5_000)
    assert (lease.confirmed_at, lease.incarnation) == (start, 9)


# --- the minimum hold -------------------------------------------------------------------


def test_a_minimum_hold_is_counted_from_the_grant_reply_and_stretched_for_clock_rates() -> None:
    # Granted (reply in) at 100.0, a 30 s hold, CMD ended 0.3 s later.
    ttl_ms = core.min_hold_ttl_ms(100.0, 30.0, 100.3)
    assert ttl_ms == 30_000 + 150 - 300  # 0.5% of the hold, less what was held already
    assert core.min_hold_ttl_ms(100.0, 3.0, 100.0) == 3015
    assert core.min_hold_ttl_ms(100.0, 0.0005, 100.0) == 1  # rounded up, never to 0


@pytest.mark.parametrize("our_rate", [0.995, 1.0, 1.005])
@pytest.mark.parametrize("leader_rate", [0.995, 1.0, 1.005])
@pytest.mark.parametrize("held_s", [0.0, 0.3, 12.5, 29.0])
def test_a_minimum_hold_never_ends_early_whatever_the_clock_rates(
    our_rate: float, leader_rate: float, held_s: float
) -> None:
    """In true seconds: granted at 0, the reply in at 0.01, CMD over ``held_s`` later. Our
    clock and the leader's run at their rates; the leader counts the TTL from when the update
    reaches it (0.002 s on) by its own clock. The lock must stay taken until 30 s."""
    hold_s, reply_at, transit = 30.0, 0.01, 0.002
    ended_at = reply_at + held_s
    ttl_ms = core.min_hold_ttl_ms(reply_at * our_rate, hold_s, ended_at * our_rate)
    expires_at = ended_at + transit + ttl_ms / 1000 / leader_rate
    assert expires_at >= hold_s
    assert expires_at <= hold_s + 0.5  # and not much later


def test_no_hold_is_left_once_it_has_passed() -> None:
    assert core.min_hold_ttl_ms(100.0, 3.0, 103.1) == 0
    assert core.min_hold_ttl_ms(100.0, 3.0, 200.0) == 0


def test_a_minimum_hold_is_at_most_a_day() -> None:
    assert core.min_hold_ttl_ms(0.0, 86_399.0, 0.0) == 86_400_000


def test_update_lease_is_retried_for_the_timeout_it_is_given() -> None:
    s, clock = settings(["a:1"], timeout=2.0)
    sends: list[dict[str, Any]] = []

    def answer(action: core.Send) -> Any:
        sends.append(action.request)
        return core.Failed("refused")

    started = clock.now
    with pytest.raises(ClusterUnavailable):
        drive(core.update_lease_flow(s, "l1", 2500, finished=True, timeout=20.0), answer, clock)
    assert clock.now - started >= 20.0  # not the client's 2 s
    assert {(r["ttl_ms"], r["finished"], r["seq"]) for r in sends} == {
        (2500, True, sends[0]["seq"])
    }


# ---------------------------------------------------------------------------
# Replies read as records
# ---------------------------------------------------------------------------


def test_a_reply_is_read_as_the_record_the_member_built() -> None:
    sent = wire.LeaseOpened(lease="L", ttl_ms=5000, incarnation=3)
    assert core.read_reply(wire.LeaseOpened, sent.frame(7)) == sent
    # A member of an earlier release names no incarnation: 0, "any".
    assert core.read_reply(wire.LeaseOpened, ok(7, lease="L", ttl_ms=5000)).incarnation == 0
    # What the client ignores may be missing; what it acts on may not.
    assert core.read_reply(wire.LockReleased, ok(1, key="k")).released == "lock"
    with pytest.raises(ServerError, match="reply field 'ttl_ms' is missing or not an integer"):
        core.read_reply(wire.LeaseTerms, ok(1, lease="L", ttl_ms=True))


def test_a_read_is_decoded_once_into_its_view_and_shows_as_sent() -> None:
    s, clock = settings(["a:1"])
    holder = {"lease": "L", "token": 4, "granted_at_ms": 10, "held_ms": 5, "meta": {"h": "x"}}
    # An older member leaves fields out; a newer one adds some: --json shows what came.
    body = {"key": "k", "holders": [holder, 7], "waiters": 2, "colour": "red"}
    state = drive(core.get_flow(s, "k"), lambda action: ok(1, **body), clock)
    assert isinstance(state, views.LockState)
    assert (state.key, state.limit, state.waiting) == ("k", None, 2)
    (seen,) = state.holders
    assert (seen.lease, seen.token, seen.remaining_ms, seen.meta) == ("L", 4, None, {"h": "x"})
    assert state.to_wire() == body and seen.to_wire() == holder
    # A wrong type is read as unknown, never trusted.
    odd = views.HolderView.from_wire({"lease": 3, "token": True, "meta": {"a": 1}})
    assert (odd.lease, odd.token, odd.meta) == (None, None, {})

    info = {"lease": "L", "ttl_ms": 900, "remaining_ms": None, "keys": ["k"], "waiting": []}
    lease = drive(core.lease_info_flow(s, "L"), lambda action: ok(2, **info), clock)
    assert (lease.ttl_ms, lease.keys) == (900, ["k"]) and lease.to_wire() == info


def test_the_status_view_reads_back_what_a_member_of_any_release_sent() -> None:
    view = views.StatusView.from_wire(
        {"node": "n1", "term": "7", "waiters": [{}, {}], "members": [{"id": "n1"}, 3]}
    )
    assert (view.node, view.term, view.waiters, view.progress) == ("n1", None, 2, None)
    assert view.members == [views.MemberEntry(id="n1", address=None, role=None)]
    members = views.MembersView.from_wire({"members": [{"id": "n2"}], "bootstrap": {"n1": 1}})
    assert members.members[0].reachable  # only a member that says so is unreachable
    assert members.bootstrap == {}


def test_a_removal_whose_answer_was_lost_is_resent_with_its_request_id_and_answered_done() -> None:
    # The cluster's side is the replicated table itself: the first attempt removes the
    # identity and its answer is lost; the re-send (same frame, same request id) is done.
    from dlm.node.locks.identities import IdentityTable, Verifier

    table = IdentityTable()
    table.add("ci", "client", ("ci/",), Verifier(b"k" * 8, b"s" * 32, b"v" * 32))
    s, clock = settings(["a:1", "b:2"])
    sent: list[dict[str, Any]] = []

    def answer(action: core.Send) -> Any:
        sent.append(action.request)
        problem = table.remove(action.request["name"], action.request["request"], "admin")
        if len(sent) == 1:
            return core.Failed("no reply within 1s")  # applied, answer lost
        if problem is not None:
            return error(1, ErrorCode.BAD_REQUEST, problem)
        return ok(1, op="remove", name="ci")

    request = wire.AuthRemove(id=0, name="ci", request=b"once-id!")
    assert drive(core.read_flow(s, request), answer, clock) == {"op": "remove", "name": "ci"}
    assert len(sent) == 2 and sent[0] == sent[1]
    # Without the request id (a cluster before version 4), the re-send was refused.
    table.add("ci", "client", ("ci/",), Verifier(b"k" * 8, b"s" * 32, b"v" * 32))
    sent.clear()
    with pytest.raises(BadRequest, match="no identity 'ci'"):
        drive(core.read_flow(s, wire.AuthRemove(id=0, name="ci")), answer, clock)


# -- trace contexts (issue 30) -------------------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_traced_client_sends_its_trace_context_on_lock_and_lease_requests_only() -> None:
    s, clock = settings(["a:1"])
    sent: list[core.Send] = []

    def answer(action: core.Send) -> Any:
        sent.append(action)
        return ok(1, lease="x", ttl_ms=1000)

    drive(core.call(s, {"t": "keepalive", "lease": "x"}), answer, clock)
    assert "trace" not in sent[-1].request  # untraced: the frame is as before
    s.trace = TRACEPARENT
    for kind in sorted(wire.TRACED_REQUESTS):
        drive(core.call(s, {"t": kind, "lease": "x"}), answer, clock)
        assert sent[-1].request["trace"] == TRACEPARENT, kind
    drive(core.call(s, {"t": "status"}), answer, clock)
    assert "trace" not in sent[-1].request


def test_a_clients_trace_context_is_checked_and_spawned_clients_keep_it() -> None:
    from dlm.client.sync import Client

    client = Client(["127.0.0.1:1"])
    assert client.trace is None
    client.trace = TRACEPARENT
    assert client.spawn().trace == TRACEPARENT
    with pytest.raises(ValueError, match="traceparent"):
        client.trace = "00-nonsense"
    client.close()


def test_an_open_naming_no_ttl_is_fitted_to_the_members_protocol_version() -> None:
    request: dict[str, Any] = {"t": "open_lease", "lease": "x", "ttl_ms": None, "meta": {}}
    assert "ttl_ms" not in core.for_member(request, 5)
    assert core.for_member(request, 4)["ttl_ms"] == core.DEFAULT_OPEN_TTL_MS == 30_000
    assert core.for_member(request, None)["ttl_ms"] == 30_000  # version unknown: as an older
    assert request["ttl_ms"] is None  # the flow's request is left as it was, for a retry
    named = {**request, "ttl_ms": 7_000}
    assert core.for_member(named, 5) is named and core.for_member(named, 4) is named
    other = {"t": "keepalive", "lease": "x"}
    assert core.for_member(other, 4) is other


@pytest.mark.parametrize(
    ("greeting", "version"),
    [
        ({"t": "welcome", "version": 5}, 5),
        ({"t": "welcome", "version": 4}, 4),
        ({"t": "welcome", "version": True}, None),
        ({"t": "welcome", "version": "5"}, None),
        ({"t": "welcome", "version": 0}, None),
        ({"t": "welcome"}, None),
        ({"t": "error", "version": 5}, None),
    ],
)
def test_a_welcomes_version_is_read_only_when_it_is_a_sane_integer(
    greeting: dict[str, object], version: int | None
) -> None:
    assert core.greeting_version(greeting) == version
