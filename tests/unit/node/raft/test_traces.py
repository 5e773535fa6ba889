"""Runs every Raft scenario in testdata/*.txt through the trace interpreter (traces.py).

A changed behaviour shows as a diff of the scenario file; when the change is
intended, regenerate the expected outputs with ``DLM_TRACES_REWRITE=1`` and
read the diff before committing it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datadriven import parse, run_file
from tests.unit.node.raft.traces import RaftTrace

TESTDATA = Path(__file__).parent / "testdata"
SCENARIOS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    run_file(path, RaftTrace().execute)


@pytest.mark.parametrize("seed", [2, 3])
def test_no_scenario_depends_on_the_random_election_timeouts(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenarios set their timing explicitly (``campaign``, or ticks that fire exactly one
    timeout whatever the draw), so a change in how the core draws its timeouts keeps them."""
    monkeypatch.delenv("DLM_TRACES_REWRITE", raising=False)
    for path in SCENARIOS:
        run_file(path, RaftTrace(seed=seed).execute)


def test_there_are_scenarios_for_every_area_the_rule_tests_cover() -> None:
    names = {p.stem for p in SCENARIOS}
    for area in ("election", "pre_vote", "check_quorum", "log_repair", "snapshot", "membership"):
        assert any(area in name for name in names), area


def test_a_mismatch_fails_with_a_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLM_TRACES_REWRITE", raising=False)
    scenario = tmp_path / "wrong.txt"
    scenario.write_text("new n1\n----\nnot what it says\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)-not what it says.*\+voters=\(n1\)"):
        run_file(scenario, RaftTrace().execute)


def test_rewrite_mode_writes_the_actual_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = tmp_path / "stale.txt"
    scenario.write_text("# one member\nnew n1\n----\nstale\n\nstatus n1\n----\n", encoding="utf-8")
    monkeypatch.setenv("DLM_TRACES_REWRITE", "1")
    run_file(scenario, RaftTrace().execute)
    monkeypatch.delenv("DLM_TRACES_REWRITE")
    run_file(scenario, RaftTrace().execute)  # now it matches
    text = scenario.read_text(encoding="utf-8")
    assert text.startswith("# one member\nnew n1\n----\nvoters=(n1)")
    assert "n1: follower term=0" in text


def test_a_command_without_its_separator_is_refused() -> None:
    with pytest.raises(ValueError, match="not followed by ----"):
        parse("campaign n1\nstatus n1\n----\nok\n")


def test_two_leaders_in_one_term_stop_the_scenario() -> None:
    trace = RaftTrace()
    for command in ("new n1 n2 n3", "campaign n1", "stabilize"):
        trace.execute(command)
    trace._leaders[1] = "n2"  # as if n2 had led term 1 before
    with pytest.raises(AssertionError, match="two leaders in term 1: n2 and n1"):
        trace.execute("status n1")
