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
