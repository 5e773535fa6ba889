"""The slow disk the chaos runs inject (DLM_TEST_FSYNC_DELAY_MS) really slows a member's writes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster

pytestmark = pytest.mark.cluster

DELAY_MS = 300


def _write_latency(base: Path, env: dict[str, str]) -> float:
    """Seconds a one-member cluster takes to open a lease (one entry written and fsynced)."""
    base.mkdir()
    cluster = Cluster(base, size=1, env=env)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        with cluster.client(timeout=10.0) as client:
            client.open_lease(5000)  # the first write pays for nothing but itself too
            started = time.monotonic()
            client.open_lease(5000)
            return time.monotonic() - started
    finally:
        cluster.stop_all()


def test_a_member_with_a_slow_disk_answers_writes_no_sooner_than_its_delay(
    tmp_path: Path,
) -> None:
    slow = _write_latency(tmp_path / "slow", {"DLM_TEST_FSYNC_DELAY_MS": str(DELAY_MS)})
    assert slow >= DELAY_MS / 1000
    fast = _write_latency(tmp_path / "fast", {})
    assert fast < slow
