"""Runs every node machine scenario in testdata/*.txt through machine_traces.py.

A changed behaviour shows as a diff of the scenario file; when the change is
intended, regenerate the expected outputs with ``DLM_TRACES_REWRITE=1`` and
read the diff before committing it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datadriven import run_file
from tests.unit.node.machine_traces import MachineTrace

TESTDATA = Path(__file__).parent / "testdata"
SCENARIOS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    run_file(path, MachineTrace().execute)


@pytest.mark.parametrize("seed", [2, 3])
def test_only_scenarios_that_name_a_seed_depend_on_the_random_draws(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLM_TRACES_REWRITE", raising=False)
    for path in SCENARIOS:
        run_file(path, MachineTrace(seed=seed).execute)
