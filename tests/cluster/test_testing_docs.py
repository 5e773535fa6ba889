"""The examples of docs/testing.md run as written: the plain ones in this process, the
pytest ones as a user's own test run (the conftest.py block beside the test file)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def _plain() -> list[str]:
    return [b for b in BLOCKS if "pytest" not in b]


def test_the_page_has_its_examples() -> None:
    assert len(_plain()) == 2
    assert len(BLOCKS) == 4


@pytest.mark.parametrize("index", range(2))
def test_a_plain_example_runs(index: int) -> None:
    exec(compile(_plain()[index], f"docs/testing.md example {index + 1}", "exec"), {})


def test_the_pytest_examples_run_in_a_users_project(tmp_path: Path) -> None:
    [conftest, tests] = [b for b in BLOCKS if "pytest" in b]
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_user.py").write_text(tests)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
        check=False,
    )
    assert "2 passed" in run.stdout, run.stdout + run.stderr
