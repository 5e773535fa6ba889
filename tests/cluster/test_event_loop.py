"""Members on each event loop (DLM_EVENT_LOOP): they start, serve, fail over, and say which
loop they run on; a partitioned member's supervisor and partitions on uvloop; a loop that
cannot be had is one line and exit 2 from `dlm node start`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlm.event_loop import ASYNCIO, ENV, UVLOOP, uvloop_installed
from tests.cluster.harness import Cluster, NodeProc, free_ports

pytestmark = pytest.mark.cluster

LOOPS = [
    ASYNCIO,
    pytest.param(UVLOOP, marks=pytest.mark.skipif(not uvloop_installed(), reason="no uvloop")),
]


def records_of(node: NodeProc) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in node.log_path.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]


def loops_logged(node: NodeProc, event: str) -> list[str]:
    return [r["event_loop"] for r in records_of(node) if r.get("event") == event]


@pytest.mark.parametrize("loop", LOOPS)
def test_members_serve_and_fail_over_on_each_loop(loop: str, tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, env={ENV: loop})
    try:
        cluster.start_all()
        old = cluster.wait_for_leader(timeout=15.0)
        with cluster.client() as client:
            lease = client.open_lease(30_000)
            first = client.acquire(lease, "k").token
            client.release(lease, "k")
            # The leader dies: its peers' links to it close under their watches (the
            # probe of a closed connection stopped members on uvloop once).
            old.kill()
            cluster.wait_for_leader(timeout=15.0, not_=old.node_id)
            lease = client.open_lease(30_000)
            assert client.acquire(lease, "k").token > first
        for node in cluster.nodes.values():
            assert loops_logged(node, "node_started") == [loop], node.log_tail()
            if node is not old:
                assert node.alive, node.log_tail()
                assert "unexpected error" not in node.log_path.read_text(errors="replace")
    finally:
        cluster.stop_all()


@pytest.mark.skipif(not uvloop_installed(), reason="no uvloop")
def test_a_partitioned_members_supervisor_and_partitions_run_on_uvloop(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, partitions=2, env={ENV: UVLOOP})
    try:
        cluster.start_all()
        cluster.wait_for_leaders(timeout=30.0)
        with cluster.client() as client:
            lease = client.open_lease(30_000)
            for key in ("a", "b", "c", "d"):  # at least one key in each partition
                client.acquire(lease, key)
        for node in cluster.nodes.values():
            assert loops_logged(node, "supervisor_started") == [UVLOOP], node.log_tail()
            assert loops_logged(node, "node_started") == [UVLOOP, UVLOOP], node.log_tail()
    finally:
        cluster.stop_all()


def test_a_loop_that_cannot_be_had_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    where = ["--listen", f"127.0.0.1:{port}", "--data", str(tmp_path / "d")]
    proc = subprocess.run(
        [sys.executable, "-m", "dlm", "node", "start", "--id", "n1", *where],
        env={**os.environ, ENV: "libuv"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "dlm node: error: DLM_EVENT_LOOP must be asyncio or uvloop, not 'libuv': "
        "unset it to run on asyncio's own loop\n"
    )
    assert not (tmp_path / "d").exists()
