"""The lock state machine against a plain model (dicts and lists), step by random step.

After every step we check, on the machine itself: at most ``limit`` holders per
key, fencing tokens strictly increasing per key and equal to the granting
entry's index; and against the model: FIFO grant order, every result, the
whole lock table. A rule re-sends a lease's last request and checks that it
answers the same and changes nothing; an invariant round-trips the snapshot.
The last tests plant bugs in subclasses and check that these checks catch them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from dlm.node.locks import (
    Acquire,
    ApplyOutcome,
    BadRequest,
    CloseLease,
    Command,
    Expire,
    Grant,
    Granted,
    LeaseClosed,
    LeaseOpened,
    Locked,
    LockStateMachine,
    NotHolder,
    OpenLease,
    Queued,
    Release,
    Released,
    Result,
    SessionExpired,
    encode_command,
)
from dlm.node.locks.machine import _Key

LEASES = ("a", "b", "c", "d")
KEYS = ("k1", "k2", "k3")
TTLS = (1_000, 5_000, 60_000)


@dataclass
class ModelKey:
    limit: int
    holders: list[tuple[str, int]] = field(default_factory=list)
    waiters: list[str] = field(default_factory=list)


class LockModelTest(RuleBasedStateMachine):
    machine_class: type[LockStateMachine] = LockStateMachine

    def __init__(self) -> None:
        super().__init__()
        self.sm = self.machine_class()
        self.index = 0
        self.at_ms = 0
        self.seqs = itertools.count(1)
        self.leases: dict[str, int] = {}
        self.keys: dict[str, ModelKey] = {}
        self.max_token: dict[str, int] = {}
        self.last_request: dict[str, tuple[Command, Result]] = {}
        self.holdings: set[tuple[str, str, int]] = set()

    # ---------------------------------------------------------------- driving

    def _apply(self, cmd: Command | bytes, gap: int = 1) -> ApplyOutcome:
        self.index += gap
        data = cmd if isinstance(cmd, bytes) else encode_command(cmd)
        outcome = self.sm.apply(self.index, data)
        self._check_machine_properties(outcome)
        return outcome

    def _check_machine_properties(self, outcome: ApplyOutcome) -> None:
        table = self.sm.list_locks()
        holdings = {(s.key, h.lease, h.token) for s in table for h in s.holders}
        for key, lease, token in sorted(holdings - self.holdings):
            assert token == outcome.index, (
                f"token invariant: {lease} got {key} with token {token} at entry {outcome.index}"
            )
            assert token > self.max_token.get(key, 0), (
                f"token invariant: {key} granted token {token} after {self.max_token.get(key)}"
            )
            self.max_token[key] = token
        self.holdings = holdings
        replies = list(outcome.grants)
        if isinstance(outcome.result, Granted):
            result = outcome.result
            replies.append(Grant(result.lease, result.key, result.token, 0))
        for grant in replies:
            assert (grant.key, grant.lease, grant.token) in holdings, (
                f"token invariant: {grant} does not match the lock table"
            )
        for state in table:
            assert 1 <= len(state.holders) <= state.limit, (
                f"holder invariant: {state.key} has {len(state.holders)} holders, "
                f"limit {state.limit}"
            )
            assert not state.waiters or len(state.holders) == state.limit, (
                f"holder invariant: {state.key} has waiters while a slot is free"
            )

    def _expect(self, outcome: ApplyOutcome, result: Result, grants: list[Grant]) -> None:
        assert outcome.grants == tuple(grants), (
            f"FIFO: granted {outcome.grants}, the model grants {grants}"
        )
        assert outcome.result == result, f"result: got {outcome.result}, model says {result}"

    def _record(self, cmd: Command, result: Result) -> None:
        self.last_request[cmd.lease] = (cmd, result)

    def _now(self) -> int:
        self.at_ms += 7
        return self.at_ms

    # ------------------------------------------------------------------ model

    def _model_free_slot(self, key: str, entry: ModelKey, grants: list[Grant]) -> None:
        while entry.waiters and len(entry.holders) < entry.limit:
            lease = entry.waiters.pop(0)
            entry.holders.append((lease, self.index))
            grants.append(Grant(lease, key, self.index, self.at_ms))
        if not entry.holders and not entry.waiters:
            del self.keys[key]

    def _model_end(self, lease: str) -> list[Grant]:
        grants: list[Grant] = []
        for key in sorted(self.keys):
            entry = self.keys[key]
            if lease in entry.waiters:
                entry.waiters.remove(lease)
                if not entry.holders and not entry.waiters:
                    del self.keys[key]
        for key in sorted(self.keys):
            entry = self.keys[key]
            if any(h == lease for h, _ in entry.holders):
                entry.holders = [(h, t) for h, t in entry.holders if h != lease]
                self._model_free_slot(key, entry, grants)
        del self.leases[lease]
        self.last_request.pop(lease, None)
        return grants

    def _position(self, lease: str, key: str) -> Result | None:
        entry = self.keys.get(key)
        if entry is None:
            return None
        for holder, token in entry.holders:
            if holder == lease:
                return Granted(key, token, lease)
        if lease in entry.waiters:
            return Queued(key, entry.waiters.index(lease) + 1)
        return None

    # ------------------------------------------------------------------ rules

    @initialize(ttls=st.lists(st.sampled_from(TTLS), min_size=len(LEASES), max_size=len(LEASES)))
    def start_with_every_lease_open(self, ttls: list[int]) -> None:
        for lease, ttl in zip(LEASES, ttls, strict=True):
            self.open_lease(lease, ttl)

    @rule(lease=st.sampled_from(LEASES), ttl=st.sampled_from(TTLS))
    def open_lease(self, lease: str, ttl: int) -> None:
        outcome = self._apply(OpenLease(lease, ttl, self._now()))
        self.leases.setdefault(lease, ttl)
        self._expect(outcome, LeaseOpened(lease, self.leases[lease]), [])
        assert outcome.opened == ((lease, self.leases[lease]),)

    @rule(
        lease=st.sampled_from(LEASES),
        key=st.sampled_from(KEYS),
        wait=st.booleans(),
        limit=st.sampled_from((1, 1, 1, 2, 3)),
        gap=st.sampled_from((1, 1, 1, 2, 5)),
    )
    def acquire(self, lease: str, key: str, wait: bool, limit: int, gap: int) -> None:
        cmd = Acquire(lease, next(self.seqs), key, wait, limit, {"n": lease}, self._now())
        outcome = self._apply(cmd, gap)
        expected: Result
        entry = self.keys.get(key)
        if lease not in self.leases:
            expected = SessionExpired(lease)
        elif entry is not None and entry.limit != limit:
            assert isinstance(outcome.result, BadRequest)
            expected = outcome.result
        elif (found := self._position(lease, key)) is not None:
            expected = found
        else:
            if entry is None:
                entry = self.keys[key] = ModelKey(limit)
            if len(entry.holders) < limit:
                entry.holders.append((lease, self.index))
                expected = Granted(key, self.index, lease)
            elif wait:
                entry.waiters.append(lease)
                expected = Queued(key, len(entry.waiters))
            else:
                assert isinstance(outcome.result, Locked)
                assert [h.lease for h in outcome.result.holders] == [h for h, _ in entry.holders]
                expected = outcome.result
        self._expect(outcome, expected, [])
        if lease in self.leases:
            self._record(cmd, expected)

    @rule(key=st.sampled_from(KEYS), order=st.permutations(LEASES))
    def crowd(self, key: str, order: list[str]) -> None:
        """Every lease asks for one key and waits: builds the deep queues FIFO is about."""
        limit = self.keys[key].limit if key in self.keys else 1
        for lease in order:
            self.acquire(lease, key, wait=True, limit=limit, gap=1)

    @rule(key=st.sampled_from(KEYS), which=st.integers(0, 2))
    def release_a_holder(self, key: str, which: int) -> None:
        entry = self.keys.get(key)
        if entry is not None:
            self.release(entry.holders[which % len(entry.holders)][0], key)

    @rule(lease=st.sampled_from(LEASES), key=st.sampled_from(KEYS))
    def release(self, lease: str, key: str) -> None:
        cmd = Release(lease, next(self.seqs), key, self._now())
        outcome = self._apply(cmd)
        grants: list[Grant] = []
        expected: Result
        entry = self.keys.get(key)
        if lease not in self.leases:
            expected = SessionExpired(lease)
        elif entry is not None and any(h == lease for h, _ in entry.holders):
            entry.holders = [(h, t) for h, t in entry.holders if h != lease]
            self._model_free_slot(key, entry, grants)
            expected = Released(key, held=True)
        elif entry is not None and lease in entry.waiters:
            entry.waiters.remove(lease)
            if not entry.holders and not entry.waiters:
                del self.keys[key]
            expected = Released(key, held=False)
        else:
            assert isinstance(outcome.result, NotHolder)
            holders = [h for h, _ in entry.holders] if entry else []
            assert [h.lease for h in outcome.result.holders] == holders
            expected = outcome.result
        if grants and key in self.keys and self.keys[key].waiters:
            event("a release granted a waiter ahead of another")
        self._expect(outcome, expected, grants)
        if lease in self.leases:
            self._record(cmd, expected)

    @rule(lease=st.sampled_from(LEASES), by_leader=st.booleans())
    def end_lease(self, lease: str, by_leader: bool) -> None:
        cmd: Command
        if by_leader:
            cmd = Expire(lease, self._now())
        else:
            cmd = CloseLease(lease, next(self.seqs), self._now())
        outcome = self._apply(cmd)
        if lease not in self.leases:
            self._expect(outcome, SessionExpired(lease), [])
            return
        grants = self._model_end(lease)
        self._expect(outcome, LeaseClosed(lease), grants)
        assert (outcome.expired if by_leader else outcome.closed) == (lease,)

    @rule(data=st.data())
    def resend_last_request(self, data: st.DataObject) -> None:
        if not self.last_request:
            return
        lease = data.draw(st.sampled_from(sorted(self.last_request)))
        cmd, first = self.last_request[lease]
        before = self._view()
        outcome = self._apply(cmd)
        expected = first
        if isinstance(first, Queued):
            found = self._position(lease, first.key)
            assert found is not None, "a queued lease can only leave the queue by a new request"
            expected = found
        self._expect(outcome, expected, [])
        assert self._view() == before, "idempotency: a re-sent request changed the state"

    @rule(junk=st.binary(max_size=40))
    def garbage_entry(self, junk: bytes) -> None:
        before = self._view()
        outcome = self._apply(b"\x9f" + junk)
        assert outcome.result is None or isinstance(outcome.result, BadRequest)
        assert self._view() == before

    # ------------------------------------------------------------- invariants

    def _view(self) -> object:
        return (
            self.sm.leases(),
            self.sm.list_locks(),
            [self.sm.lease(lease) for lease in LEASES],
            self.sm.counts(),
        )

    @invariant()
    def table_matches_model(self) -> None:
        table = {
            s.key: (s.limit, [(h.lease, h.token) for h in s.holders], [w.lease for w in s.waiters])
            for s in self.sm.list_locks()
        }
        model = {k: (e.limit, e.holders, e.waiters) for k, e in self.keys.items()}
        assert table == model, f"state: table {table} != model {model}"
        assert dict(self.sm.leases()) == self.leases
        assert self.sm.applied_index == self.index

    @invariant()
    def snapshot_round_trips(self) -> None:
        data = self.sm.snapshot()
        restored = LockStateMachine.restore(data)
        assert restored.snapshot() == data, "snapshot: restore(snapshot()) changed the bytes"
        assert restored.list_locks() == self.sm.list_locks()
        assert restored.leases() == self.sm.leases()
        assert [restored.lease(x) for x in LEASES] == [self.sm.lease(x) for x in LEASES]
        assert restored.applied_index == self.sm.applied_index


TestLockModel = LockModelTest.TestCase
TestLockModel.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


# -------------------------------------------------------------------------
# The checker can fail: plant a bug, expect the matching check to report it.


class GrantsNewestWaiterFirst(LockStateMachine):
    def _next_waiter(self, entry: _Key) -> str:
        return next(reversed(entry.waiters))


class IgnoresLimit(LockStateMachine):
    def _has_room(self, entry: _Key) -> bool:
        return len(entry.holders) < entry.limit + 1


class ForgetsRetries(LockStateMachine):
    """Keeps no per-lease results, so every re-sent request runs again."""

    def apply(self, index: int, data: bytes) -> ApplyOutcome:
        outcome = super().apply(index, data)
        for lease in self._leases.values():
            lease.recent.clear()
        return outcome


class CoarseTokens(LockStateMachine):
    """Numbers grants with a coarse counter, so consecutive grants can share a token."""

    def _execute(self, index: int, cmd: Command) -> ApplyOutcome:
        return replace(super()._execute(index // 4, cmd), index=index)


@pytest.mark.parametrize(
    ("buggy", "report"),
    [
        (GrantsNewestWaiterFirst, "FIFO"),
        (IgnoresLimit, "holder invariant"),
        (ForgetsRetries, "result|idempotency"),
        (CoarseTokens, "token invariant"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_checker_reports_a_planted_bug(buggy: type[LockStateMachine], report: str) -> None:
    class Buggy(LockModelTest):
        machine_class = buggy

    with pytest.raises(AssertionError, match=report):
        run_state_machine_as_test(
            Buggy,
            settings=settings(
                max_examples=300,
                stateful_step_count=40,
                deadline=None,
                derandomize=True,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            ),
        )
