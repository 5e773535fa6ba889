"""Short chaos schedules against real clusters: what `make test` runs of tests/chaos.

Seeds 0, 1 and 2 of the short profile (schedule.py) inject twelve kinds of
fault between them, on 3- and 5-member clusters; `make chaos` runs the long
ones. A failure prints the run's report, with the seed and the command that
replays it; the histories and logs stay in pytest's temporary directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import report
from tests.chaos.runner import ChaosRun
from tests.chaos.schedule import Schedule, make_schedule

# serial: each schedule runs clusters of up to five members under faults for a while.
pytestmark = [pytest.mark.cluster, pytest.mark.serial]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_short_schedule_leaves_a_history_that_passes_every_check(
    seed: int, tmp_path: Path
) -> None:
    schedule = make_schedule(seed, "short")
    result = ChaosRun(schedule, tmp_path / f"seed-{seed}").run()
    page = report.text(result)
    (tmp_path / "report.txt").write_text(page)
    print(page)
    assert result.verdict.ok, page
    assert not result.verdict.inconclusive, page
    # The run did exercise the system: locks taken, written under, and faults injected.
    assert result.verdict.stats["sections"] > 20, page
    assert result.verdict.stats["store_accepted"] > 20, page
    assert [f for f in result.faults if not str(f["target"]).startswith("skipped")], page


def test_a_leader_that_expires_leases_early_is_caught_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same suite, no faults, members whose leader counts a quarter of each TTL
    (mutant_node.py): the checker must find the lock given on while its holder still
    counted on it."""
    monkeypatch.setenv("DLM_CHAOS_MUTANT", "early-expiry")
    schedule = Schedule(seed=0, profile="short", size=3, faults=(), length=8.0)
    result = ChaosRun(schedule, tmp_path / "mutant").run()
    page = report.text(result)
    print(page)
    found = {v.kind for v in result.verdict.violations}
    # Either finding proves it: a grant no order of the history allows (linearizability),
    # or two clients inside one key's critical section at once (real time).
    assert found & {"not-linearizable", "overlap"}, page
