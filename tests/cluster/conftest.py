"""Fixtures for the real-process cluster tests: a fresh 3-member cluster per test, or one
shared by a module's CLI tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three members on free 127.0.0.1 ports with a leader elected; stopped by PID afterwards."""
    c = Cluster(tmp_path, size=3)
    try:
        c.start_all()
        c.wait_for_leader(timeout=15.0)
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for a whole module, for tests that only add their own locks to it."""
    c = Cluster(tmp_path_factory.mktemp("shared-cluster"), size=3)
    try:
        c.start_all()
        c.wait_for_leader(timeout=15.0)
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def dlm(shared: Cluster, tmp_path: Path) -> Dlm:
    """Runs the `dlm` command against the shared cluster."""
    return Dlm(shared.members_env, tmp_path)
