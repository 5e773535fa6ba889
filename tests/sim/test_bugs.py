"""Proof that the simulator's checkers can fail: known Raft bugs must be caught within a few seeds.

Each bug is switched on by a RaftNode subclass (tests/sim/bugs.py) that
overrides one of the core's test seams. A test passes when the simulator
reports one of the violations that bug should cause, within a bounded number
of seeds; how many it needed is printed in the session summary.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dlm.node.raft.core import RaftNode

from .bugs import (
    ChangesMembershipBeforeCommittingInTerm,
    CommitsPreviousTermByCounting,
    ForgetsVote,
    LeaderIgnoresHigherTerm,
    VotesForStaleLogs,
)
from .conftest import SimTotals
from .harness import SimFailure, SimOptions, run_seed
from .scenarios import figure8, membership_erratum

MAX_SEEDS = 200

CRASHY = {"crash": 6, "crash_leader": 6, "partition": 2, "isolate_leader": 2, "pause": 1}


def seeds_to_catch(
    make_options: Callable[[], SimOptions], expected: set[str], limit: int = MAX_SEEDS
) -> tuple[int, SimFailure]:
    """Run seeds 0, 1, ... until a violation of an ``expected`` kind; return (seeds run, it)."""
    for seed in range(limit):
        try:
            run_seed(seed, make_options())
        except SimFailure as failure:
            if failure.violation.kind in expected:
                return seed + 1, failure
            raise
    pytest.fail(f"no {sorted(expected)} violation within {limit} seeds")


@pytest.mark.parametrize(
    ("bug", "options", "expected"),
    [
        pytest.param(
            ForgetsVote,
            {},
            {"vote-regressed"},
            id="forgets-vote",
        ),
        pytest.param(
            ForgetsVote,
            # Without the restart check the forgotten vote must surface as a second vote.
            {
                "check_restart_promises": False,
                "fault_weights": CRASHY,
                "fault_count": (20, 30),
                "lagging_follower": False,
            },
            {"double-vote", "two-leaders"},
            id="forgets-vote-double-vote",
        ),
        pytest.param(
            VotesForStaleLogs,
            {},
            {"leader-completeness", "state-machine-safety", "log-matching", "stale-read"},
            id="votes-for-stale-logs",
        ),
        pytest.param(
            LeaderIgnoresHigherTerm,
            {},
            {"two-leaders", "log-matching", "leader-completeness", "state-machine-safety"},
            id="leader-ignores-higher-term",
        ),
    ],
)
def test_random_schedules_catch_bug(
    bug: type[RaftNode], options: dict[str, object], expected: set[str], sim_totals: SimTotals
) -> None:
    def make() -> SimOptions:
        return SimOptions(node_class=bug, **options)  # type: ignore[arg-type]

    seeds, failure = seeds_to_catch(make, expected)
    sim_totals.note(
        f"bug {bug.__name__}{'' if not options else ' (tuned)'}: caught after "
        f"{seeds} seed(s) as {failure.violation.kind}"
    )


def test_figure8_script_is_harmless_for_the_real_core() -> None:
    for seed in range(3):
        outcome = figure8(seed)
        assert outcome.reached_last_phase
        assert not outcome.old_entry_committed
        assert outcome.violation is None


def test_figure8_catches_commit_of_previous_term_by_counting(sim_totals: SimTotals) -> None:
    for seed in range(20):
        outcome = figure8(seed, CommitsPreviousTermByCounting)
        if outcome.violation is not None:
            assert outcome.old_entry_committed
            assert outcome.violation.kind in {"leader-completeness", "state-machine-safety"}
            sim_totals.note(
                f"bug CommitsPreviousTermByCounting (figure 8 script): caught after "
                f"{seed + 1} seed(s) as {outcome.violation.kind}"
            )
            return
    pytest.fail("the figure 8 script never exposed commit-by-counting of an old entry")


def test_erratum_script_is_harmless_for_the_real_core() -> None:
    for seed in range(3):
        outcome = membership_erratum(seed)
        assert outcome.reached_last_phase
        assert outcome.change_refused  # no entry of its term committed: no change yet
        assert outcome.violation is None


def test_erratum_script_catches_a_change_before_an_entry_of_the_term_commits(
    sim_totals: SimTotals,
) -> None:
    for seed in range(10):
        outcome = membership_erratum(seed, ChangesMembershipBeforeCommittingInTerm)
        if outcome.violation is not None:
            assert not outcome.change_refused
            assert outcome.violation.kind in {"leader-completeness", "state-machine-safety"}
            sim_totals.note(
                f"bug ChangesMembershipBeforeCommittingInTerm (erratum script): caught after "
                f"{seed + 1} seed(s) as {outcome.violation.kind}"
            )
            return
    pytest.fail("the erratum script never exposed a membership change made too early")
