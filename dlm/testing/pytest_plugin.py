"""The ``dlm_cluster`` pytest fixture: a fresh 3-member test cluster per test.

Not registered as an entry-point plugin (which would load into every pytest run of
everyone who installs dlm); a project asks for it in its conftest.py::

    pytest_plugins = ["dlm.testing.pytest_plugin"]

    def test_my_job_survives_a_failover(dlm_cluster):
        client = dlm_cluster.client()
        ...
        dlm_cluster.kill_leader()

Loading this module imports pytest and nothing else of weight; no member starts unless a
test asks for the fixture. ``@pytest.mark.dlm_cluster(size=5, election_timeout="500ms")``
on a test passes options to dlm.testing.Cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from dlm.testing.processes import Cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "dlm_cluster(size=3, **options): options of the dlm_cluster fixture's cluster"
    )


@pytest.fixture
def dlm_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A started dlm.testing.Cluster (3 members, a leader elected); every process it started
    is stopped by PID when the test ends, passed or failed."""
    from dlm.testing.processes import Cluster

    marker = request.node.get_closest_marker("dlm_cluster")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    size = int(options.pop("size", marker.args[0] if marker and marker.args else 3))
    with Cluster(size, **options) as started:
        yield started
