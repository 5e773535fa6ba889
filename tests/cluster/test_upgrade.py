"""Upgrades from the previous release (0.1.0, tests/compat): its data, and a rolling restart.

A member of this release must open a data directory the previous release
wrote, and a cluster of previous-release members must survive being restarted
one member at a time onto this release while clients work: no acknowledged
grant lost, tokens still rising, and the log moved to protocol version 2 only
once every member runs this release (docs/ARCHITECTURE.md §7).
"""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from dlm.client.errors import DlmError, LockHeld
from dlm.client.sync import Client
from dlm.views import StatusView
from dlm.wire import PROTOCOL_VERSION
from tests import compat
from tests.cluster.harness import Cluster, NodeProc, wait_for


def _at_version_2(client: Client) -> StatusView | None:
    """The status once the log runs this release's version (2 before issue 24, now 4)."""
    view = client.status()
    return view if view.cluster_version == PROTOCOL_VERSION else None


def _serving(node: NodeProc, cluster: Cluster) -> dict[str, Any] | None:
    view = node.status()
    if view is None or view.get("leader") is None:
        return None
    leader = cluster.leader_now()
    if leader is None:
        return None
    lead = leader.status()
    if lead is None or view.get("applied", -1) < lead.get("commit", 0) - 50:
        return None
    return view


def test_a_member_of_this_release_opens_the_previous_releases_data(tmp_path: Path) -> None:
    old = compat.extract(tmp_path / "previous")
    (tmp_path / "cluster").mkdir()
    cluster = Cluster(tmp_path / "cluster", size=1)
    node = cluster.nodes["n1"]
    node.release = old
    try:
        node.start()
        cluster.wait_for_leader(timeout=15.0)
        with cluster.client(timeout=10.0) as client:
            lease = client.open_lease(120_000)
            kept = client.acquire(lease, "kept")
            freed = client.acquire(lease, "freed")
            client.release(lease, "freed")
        assert node.terminate() == 0
        node.release = None  # this release, on the same data directory
        node.start()
        cluster.wait_for_leader(timeout=15.0)
        with cluster.client(timeout=10.0) as client:
            holders = client.get("kept").holders
            assert [(h.lease, h.token) for h in holders] == [(lease.id, kept.token)]
            assert client.get("freed").holders == []
            other = client.open_lease(10_000)
            later = client.acquire(other, "freed")
            assert later.token > max(kept.token, freed.token)
            view = wait_for(lambda: _at_version_2(client), 10.0, "the log to move to version 2")
            assert view.cluster_version == PROTOCOL_VERSION
    finally:
        cluster.stop_all()


class _Workload:
    """Clients taking and giving back locks while members restart; records every grant."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.grants: list[tuple[str, int, float]] = []
        self.errors: list[str] = []
        self.longest_pause = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def granted_more_than(self, count: int) -> bool:
        return len(self.grants) > count

    def _run(self) -> None:
        last_ok = time.monotonic()
        with self.cluster.client(timeout=15.0) as client:
            for i in range(100_000):
                if self.stop.is_set():
                    return
                key = f"k{i % 3}"
                try:
                    lease = client.open_lease(20_000)
                    grant = client.acquire(lease, key, wait=5.0)
                    self.grants.append((key, grant.token, time.monotonic()))
                    client.release(lease, key)
                    client.close_lease(lease)
                except LockHeld:
                    continue
                except DlmError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                now = time.monotonic()
                self.longest_pause = max(self.longest_pause, now - last_ok)
                last_ok = now


def test_a_rolling_restart_from_the_previous_release_under_load(tmp_path: Path) -> None:
    old = compat.extract(tmp_path / "previous")
    (tmp_path / "cluster").mkdir()
    cluster = Cluster(tmp_path / "cluster", size=3)
    for node in cluster.nodes.values():
        node.release = old
    workload = _Workload(cluster)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        with cluster.client(timeout=15.0) as client:
            held_lease = client.open_lease(120_000)
            held = client.acquire(held_lease, "held-throughout")
            workload.thread.start()
            wait_for(lambda: len(workload.grants) >= 10, 30.0, "the workload to get going")
            for node in cluster.nodes.values():
                assert node.terminate() == 0, node.log_tail()
                node.release = None
                node.start()
                wait_for(partial(_serving, node, cluster), 30.0, f"{node.node_id} to serve")
                client.keepalive(held_lease)
                before = len(workload.grants)
                wait_for(partial(workload.granted_more_than, before + 5), 30.0, "more grants")
            view = wait_for(
                lambda: _at_version_2(client),
                15.0,
                "the log to move to version 2 once every member runs this release",
            )
            assert view.cluster_version == PROTOCOL_VERSION
            workload.stop.set()
            workload.thread.join(timeout=60)
            holders = client.get("held-throughout").holders
            assert [(h.lease, h.token) for h in holders] == [(held_lease.id, held.token)]
        by_key: dict[str, list[int]] = {}
        for key, token, _ in workload.grants:
            by_key.setdefault(key, []).append(token)
        for key, tokens in by_key.items():
            assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), key
        assert len(workload.grants) > 30
        print(
            f"rolling restart: {len(workload.grants)} grants, longest pause between "
            f"successful operations {workload.longest_pause:.2f}s, "
            f"{len(workload.errors)} failed operations"
        )
    finally:
        workload.stop.set()
        cluster.stop_all()
