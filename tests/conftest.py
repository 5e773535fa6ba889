"""Options shared by all test directories (`pytest tests` and `pytest tests/sim` accept them)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sim-seeds",
        action="store",
        default=None,
        metavar="START:COUNT",
        help="run the simulator on exactly seeds START .. START+COUNT-1 (default: the CI range)",
    )
