"""The simulator's checkers on hand-made traces: each accepts legal history, rejects broken."""

from __future__ import annotations

import random

import pytest

from dlm.node.raft.types import Heartbeat
from dlm.records import ConfState, Entry, HardState, LogCompacted, LogUnavailable, Snapshot

from .checkers import SafetyChecker, Violation
from .conftest import parse_seed_range, seed_batches
from .faults import FAULT_KINDS, draw_schedule
from .lockcheck import LockChecker, Section
from .network import LinkConditions, SimNetwork


class ListLog:
    """A read-only log for the checkers: ``terms[i]`` is the term at index i + 1."""

    def __init__(self, terms: list[int], first: int = 1) -> None:
        self.terms = terms
        self.first = first

    def initial_state(self) -> tuple[HardState, ConfState]:
        return HardState(), ConfState()

    def first_index(self) -> int:
        return self.first

    def last_index(self) -> int:
        return len(self.terms)

    def term(self, index: int) -> int:
        if index == 0:
            return 0
        if index < self.first - 1:
            raise LogCompacted(index)
        if index > len(self.terms):
            raise LogUnavailable(index)
        return self.terms[index - 1]

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        return [Entry(i, self.terms[i - 1]) for i in range(lo, hi)]

    def snapshot(self) -> Snapshot | None:
        return None


def entries(*pairs: tuple[int, int]) -> list[Entry]:
    return [Entry(index, term, b"%d/%d" % (index, term)) for index, term in pairs]


def test_one_leader_per_term() -> None:
    c = SafetyChecker()
    assert c.observe_role("a", 1, True)
    assert not c.observe_role("a", 1, True)
    assert not c.observe_role("b", 1, False)
    assert c.observe_role("b", 2, True)
    with pytest.raises(Violation, match="two-leaders"):
        c.observe_role("c", 2, True)


def test_term_never_goes_back() -> None:
    c = SafetyChecker()
    c.observe_role("a", 3, False)
    with pytest.raises(Violation, match="term-regressed"):
        c.observe_role("a", 2, False)


def test_vote_and_term_survive_restart() -> None:
    c = SafetyChecker()
    c.observe_hard_state("a", 4, "b")
    c.observe_hard_state("a", 4, "b")
    c.observe_hard_state("a", 5, None)  # a new term may start without a vote
    with pytest.raises(Violation, match="term-regressed"):
        c.observe_hard_state("a", 4, "b")
    c2 = SafetyChecker()
    c2.observe_hard_state("a", 4, "b")
    with pytest.raises(Violation, match="vote-regressed"):
        c2.observe_hard_state("a", 4, None)


def test_one_vote_per_term() -> None:
    c = SafetyChecker()
    c.observe_vote_granted("a", 1, "b")
    c.observe_vote_granted("a", 1, "b")  # a duplicated response is the same vote
    c.observe_vote_granted("a", 2, "c")
    with pytest.raises(Violation, match="double-vote"):
        c.observe_vote_granted("a", 2, "b")


def test_log_matching_accepts_overwrites_of_other_terms() -> None:
    c = SafetyChecker()
    c.observe_persisted("a", entries((1, 1), (2, 1), (3, 2)), 0)
    c.observe_persisted("b", entries((1, 1), (2, 1)), 0)
    c.observe_persisted("b", entries((3, 3)), 1)  # a different term at 3 is fine
    c.observe_persisted("c", entries((3, 2)), 1)


def test_log_matching_rejects_same_index_term_with_other_payload() -> None:
    c = SafetyChecker()
    c.observe_persisted("a", entries((1, 1), (2, 1)), 0)
    with pytest.raises(Violation, match="log-matching"):
        c.observe_persisted("b", [Entry(2, 1, b"other")], 1)


def test_log_matching_rejects_same_entry_after_different_prefix() -> None:
    c = SafetyChecker()
    c.observe_persisted("a", entries((1, 1), (2, 2), (3, 2)), 0)
    c.observe_persisted("b", entries((1, 1), (2, 1)), 0)
    # b now claims (3, 2) with the same payload but after a term-1 entry at 2.
    with pytest.raises(Violation, match="log-matching"):
        c.observe_persisted("b", entries((3, 2)), 1)


def test_state_machine_safety() -> None:
    c = SafetyChecker()
    for e in entries((1, 1), (2, 1)):
        c.observe_apply("a", e)
        c.observe_apply("b", e)
    with pytest.raises(Violation, match="state-machine-safety"):
        c.observe_apply("c", Entry(2, 2, b"x"))


def test_images_must_agree() -> None:
    c = SafetyChecker()
    c.observe_image("a", 40, b"image")
    c.observe_image("b", 40, b"image")
    with pytest.raises(Violation, match="state-divergence"):
        c.observe_image("c", 40, b"imagf")


def test_leader_completeness_needs_earlier_terms_commits() -> None:
    c = SafetyChecker()
    leader1 = ListLog([1, 1, 1])
    assert c.observe_commit("a", 1, 3, leader1)
    assert not c.observe_commit("b", 1, 2, leader1)
    c.check_leader_completeness("b", 2, ListLog([1, 1, 1, 2]))
    with pytest.raises(Violation, match="leader-completeness"):
        c.check_leader_completeness("c", 2, ListLog([1, 1]))
    with pytest.raises(Violation, match="leader-completeness"):
        c.check_leader_completeness("c", 2, ListLog([1, 1, 2]))


def test_leader_completeness_ignores_later_terms_commits() -> None:
    """A stale leader of term 2 need not hold what a leader of term 3 committed."""
    c = SafetyChecker()
    c.observe_commit("a", 3, 4, ListLog([1, 1, 3, 3]))
    c.check_leader_completeness("b", 2, ListLog([1, 1, 2]))
    c.check_leader_completeness("b", 3, ListLog([1, 1, 3, 3]))


def test_leader_completeness_skips_compacted_prefix() -> None:
    c = SafetyChecker()
    c.observe_commit("a", 1, 2, ListLog([1, 1]))
    c.check_leader_completeness("b", 2, ListLog([1, 1, 1, 1, 2], first=4))


def test_commit_beyond_own_log_is_flagged() -> None:
    c = SafetyChecker()
    with pytest.raises(Violation, match="commit-beyond-log"):
        c.observe_commit("a", 1, 5, ListLog([1, 1]))


def test_reads_see_earlier_commits() -> None:
    c = SafetyChecker()
    c.observe_commit("a", 1, 7, ListLog([1] * 7))
    c.read_started(b"r1")
    c.observe_read_state("a", b"r1", 7)
    c.observe_read_state("a", b"r1", 0)  # a duplicate answer is ignored
    c.read_started(b"r2")
    with pytest.raises(Violation, match="stale-read"):
        c.observe_read_state("b", b"r2", 6)


def test_network_is_deterministic_and_honours_cuts() -> None:
    def run(seed: int) -> list[tuple[str, str, int]]:
        net = SimNetwork(random.Random(seed), LinkConditions(0.2, 0.2, 1, 5))
        net.cut([("a", "c")])
        out: list[tuple[str, str, int]] = []
        for t in range(50):
            for dst in "bc":
                net.send(Heartbeat(group=0, term=t, src="a", dst=dst, commit=0), t)
            out.extend((m.src, m.dst, m.term) for m in net.due(t))
        return out

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    assert all(dst == "b" for _, dst, _ in first)
    terms = [t for _, _, t in first]
    assert terms != sorted(terms), "random delays should reorder messages"


def test_schedule_has_enough_faults_and_heals_in_time() -> None:
    for seed in range(50):
        specs = draw_schedule(random.Random(seed), first_tick=30, heal_tick=1750)
        assert len(specs) >= 10
        assert all(30 <= s.start < s.end <= 1750 for s in specs)
        assert {s.kind for s in specs} <= set(FAULT_KINDS)
        assert any(s.kind == "lag_follower" for s in specs)


def test_seed_ranges() -> None:
    assert parse_seed_range("5:3") == (5, 3)
    assert [list(b) for b in seed_batches(5, 13, 10)] == [list(range(5, 15)), [15, 16, 17]]
    with pytest.raises(pytest.UsageError):
        parse_seed_range("5")


def test_a_minimum_hold_keeps_the_key_taken_and_a_semaphore_slot_only() -> None:
    checker = LockChecker({"k": 1, "sem": 2})
    checker.held_until("k", "A", 5, until=1_000)
    checker.held_until("sem", "A", 6, until=1_000)
    with pytest.raises(Violation, match="min-hold"):
        checker.enter(Section("b", "k", 7, "B", 999, lambda: 5_000), 999)
    # The other slot of the semaphore is free; a third holder would not be.
    checker.enter(Section("b", "sem", 8, "B", 500, lambda: 5_000), 500)
    with pytest.raises(Violation, match="min-hold"):
        checker.enter(Section("c", "sem", 9, "C", 600, lambda: 5_000), 600)
    # Once the hold is over, the key is free.
    checker.enter(Section("b", "k", 10, "B", 1_000, lambda: 5_000), 1_000)


# ---------------------------------------------------------------------------
# The lock-level checker: a `dlm exec` command against later grants
# ---------------------------------------------------------------------------


def _cmd(token: int, lease: str, ends: list[int]) -> Section:
    return Section("c1", "k0", token, lease, 0, lambda: ends[0], cmd=True)


def test_a_cmd_that_starts_after_a_later_grant_is_flagged() -> None:
    checker = LockChecker({"k0": 1})
    checker.grant_committed(10, "k0", "other", now=5)
    with pytest.raises(Violation) as caught:
        checker.enter(_cmd(7, "mine", [10**9]), now=6)
    assert caught.value.kind == "cmd-after-grant"


def test_a_cmd_still_running_when_a_later_grant_commits_is_flagged() -> None:
    checker = LockChecker({"k0": 1})
    checker.enter(_cmd(7, "mine", [10**9]), now=1)
    with pytest.raises(Violation) as caught:
        checker.grant_committed(10, "k0", "other", now=5)
    assert caught.value.kind == "cmd-after-grant"


def test_a_cmd_frozen_in_a_suspend_is_not_running_until_it_resumes() -> None:
    checker = LockChecker({"k0": 1})
    ends = [4]  # its host was suspended at 4: frozen since
    section = _cmd(7, "mine", ends)
    checker.enter(section, now=1)
    checker.grant_committed(10, "k0", "other", now=5)
    ends[0] = 10**9  # the host resumed and nothing killed it
    with pytest.raises(Violation) as caught:
        checker.cmd_resumed(section, now=8)
    assert caught.value.kind == "cmd-after-grant"


def test_a_cmd_killed_before_the_later_grant_is_fine() -> None:
    checker = LockChecker({"k0": 1})
    section = _cmd(7, "mine", [3])
    checker.enter(section, now=1)
    checker.grant_committed(10, "k0", "other", now=5)
    checker.grant_committed(11, "k0", "mine", now=6)  # a grant to its own lease, later
