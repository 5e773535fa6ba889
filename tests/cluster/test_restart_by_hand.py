"""A member restarted by hand, with only its --id, --data and --cluster-id, listens where it did.

The README says `--peers` and `--join` matter at the first start only, and
`--listen` defaults to where the member listened before (its data directory
records it). A first member and one that joined later are both killed and
started again without --listen, --peers or --join: each serves at its old
address and the cluster is healthy again. A different --listen given later
wins, is logged, and is where a later restart by hand listens.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, free_ports, wait_for

TIMEOUT = 30.0


def healthy(dlm: Dlm, voters: int) -> bool:
    done = dlm.run("status", "--check", "--json", "--timeout", "2s")
    if done.returncode != 0:
        return False
    verdict = json.loads(done.stdout)
    return bool(verdict["voters"] == verdict["voters_up"] == voters)


def test_members_restarted_without_listen_or_peers_serve_where_they_did(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, size=3)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=TIMEOUT)
        joined = cluster.add_node("n4")
        joined.start()
        dlm = Dlm(cluster.members_env, tmp_path)
        wait_for(lambda: healthy(dlm, 4), TIMEOUT, "four voters, healthy")

        for node in (cluster.nodes["n2"], joined):
            node.kill()
            node.by_hand = True
            node.start()
            assert "--listen" not in node.command() and "--peers" not in node.command()
        # status() dials each at its old address: it answers only if it listens there.
        wait_for(lambda: cluster.nodes["n2"].status() is not None, TIMEOUT, "n2 at its address")
        wait_for(lambda: joined.status() is not None, TIMEOUT, "n4 at its address")
        wait_for(lambda: healthy(dlm, 4), TIMEOUT, "the cluster healthy again")

        # A new --listen wins, and says so; a later restart by hand listens there.
        n3 = cluster.nodes["n3"]
        n3.kill()
        old = n3.address
        n3.port = free_ports(1)[0]
        n3.by_hand = True
        n3.flags = ("--listen", n3.address)
        n3.start()
        wait_for(lambda: n3.status() is not None, TIMEOUT, "n3 at its new address")
        changed = [
            json.loads(line)
            for line in n3.log_path.read_text().splitlines()
            if '"listen_changed"' in line
        ]
        assert changed and changed[-1]["listen"] == n3.address
        assert changed[-1]["previous"] == old
        n3.kill()
        n3.flags = ()
        n3.start()
        wait_for(lambda: n3.status() is not None, TIMEOUT, "n3 where it listened last")
    finally:
        cluster.stop_all()
