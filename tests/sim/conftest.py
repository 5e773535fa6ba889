"""Seed selection for the simulator tests.

A test that takes ``sim_seeds`` receives a batch of consecutive seeds (one
test case per batch keeps pytest's per-case overhead small). Without
``--sim-seeds`` the batches cover the CI range; with ``--sim-seeds=S:C`` they
cover exactly seeds S .. S+C-1, for every such test.
"""

from __future__ import annotations

import pytest

CI_SEEDS = (0, 300)
BATCH = 10


def parse_seed_range(text: str) -> tuple[int, int]:
    start, sep, count = text.partition(":")
    if not sep:
        raise pytest.UsageError(f"--sim-seeds wants START:COUNT, got {text!r}")
    try:
        first, n = int(start), int(count)
    except ValueError:
        raise pytest.UsageError(f"--sim-seeds wants integers START:COUNT, got {text!r}") from None
    if first < 0 or n < 1:
        raise pytest.UsageError(f"--sim-seeds wants START >= 0 and COUNT >= 1, got {text!r}")
    return first, n


def seed_batches(first: int, count: int, batch: int = BATCH) -> list[range]:
    end = first + count
    return [range(s, min(s + batch, end)) for s in range(first, end, batch)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sim_seeds" not in metafunc.fixturenames:
        return
    option = metafunc.config.getoption("--sim-seeds")
    if option is None:
        marker = metafunc.definition.get_closest_marker("sim_default_seeds")
        first, count = marker.args if marker else CI_SEEDS
    else:
        first, count = parse_seed_range(option)
    batches = seed_batches(first, count)
    metafunc.parametrize(
        "sim_seeds", batches, ids=[f"seeds{b.start}-{b.stop - 1}" for b in batches]
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim_default_seeds(start, count): the seed range used without --sim-seeds"
    )
