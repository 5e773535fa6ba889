"""bench/loadgen.py, the second load generator, against three real members: every cell of
item 4 at c=1 and c=4 completes pairs with no error, each grant's token checked, the
members' CPU read, and a client that first reaches a follower is sent on to the leader."""

from __future__ import annotations

from bench import loadgen
from tests.cluster.harness import Cluster


def test_every_cell_completes_pairs_without_an_error(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader(timeout=15.0)
    followers = [n.address for n in cluster.nodes.values() if n is not leader]
    # A follower first: every session opens its lease through a NOT_LEADER redirect.
    endpoints = [*followers, leader.address]
    pids = [n.pid for n in cluster.nodes.values()]
    assert sorted(loadgen.listening_pids(cluster.addresses)) == sorted(pids)
    specs = loadgen.cell_specs([1, 4])
    assert [(s.hot, s.clients) for s in specs] == [(False, 1), (True, 1), (True, 4), (False, 4)]
    for spec in specs:
        figures = loadgen.run_cell(
            endpoints, spec, seconds=1.0, warmup=0.2, procs=2, member_pids=pids
        )
        assert figures.errors == 0, figures.first_error
        assert figures.pairs_per_s > 0 and figures.samples > 0
        assert figures.procs == min(2, spec.clients)
        # Every grant was checked (warm-up and window alike), the window's among them.
        assert figures.tokens_checked >= figures.samples
        assert figures.pair_p50_ms <= figures.pair_p99_ms
        assert figures.server_cpu is not None and figures.server_cpu >= 0
