"""An impostor on a dead member's port cannot stop the cluster (issue 20, holes 1 and 2).

A real 3-member cluster with peer and client secrets; n3 is stopped, and a
process (tests/cluster/impostor.py) binds n3's port. It answers every redial
of n1 and n2 with the words a removed member is told ("member n1 was removed
from this cluster"), before any proof, and keeps dialling n1 and n2 with
spoofed peer hellos (claiming n3, and an id no log names, at its own
address) that never prove anything. Before the fix both members stopped with
exit 0 at the first refusal. Now a refusal before the proof is a failed dial:
they keep running, keep a leader, and serve.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlm import auth
from tests.cluster.harness import REPO, Cluster, NodeProc, wait_for

pytestmark = pytest.mark.cluster

ANSWERS = 5
"""Refusals the impostor must have sent each live member before the test looks."""


def test_an_impostor_on_a_dead_members_port_stops_nobody(tmp_path: Path) -> None:
    auth.write_secret_file(str(tmp_path / "peer.secret"))
    auth.write_secret_file(str(tmp_path / "client.secret"))

    def flags(_: NodeProc) -> list[str]:
        return [
            "--peer-secret-file",
            str(tmp_path / "peer.secret"),
            "--client-secret-file",
            str(tmp_path / "client.secret"),
        ]

    base = tmp_path / "cluster"
    base.mkdir()
    client_secret = auth.load_secret(str(tmp_path / "client.secret"))
    cluster = Cluster(base, size=3, node_args=flags, client_secret=client_secret)
    impostor: subprocess.Popen[bytes] | None = None
    log = tmp_path / "impostor.log"
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        n1, n2, n3 = (cluster.nodes[n] for n in ("n1", "n2", "n3"))
        n3.terminate()
        env = {**os.environ, "PYTHONPATH": str(REPO), "IMPOSTOR_CLUSTER": cluster.cluster_id}
        impostor = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.impostor", str(n3.port), str(log),
             n1.address, n2.address],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

        def heard_enough() -> bool:
            for node in (n1, n2):
                assert node.alive, f"{node.node_id} stopped:\n{node.log_tail()}"
            lines = log.read_text().splitlines() if log.exists() else []
            return (
                all(lines.count(f"refused {n}") >= ANSWERS for n in ("n1", "n2"))
                and sum(line.startswith("spoofed") for line in lines) >= 4
            )

        wait_for(heard_enough, 30.0, f"{ANSWERS} refusals to n1 and to n2, and spoofed hellos")
        assert n1.alive and n2.alive
        assert "peer_refusal_unproved" in n1.log_tail(400) + n2.log_tail(400)
        leader = cluster.wait_for_leader(timeout=15.0)
        assert leader.node_id in ("n1", "n2")
        with cluster.client(timeout=10.0) as client:
            lease = client.open_lease(10_000)
            grant = client.acquire(lease, "impostor-test")
            assert grant.token > 0
        assert impostor.poll() is None, impostor.stderr
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait(timeout=10)
        cluster.stop_all()
