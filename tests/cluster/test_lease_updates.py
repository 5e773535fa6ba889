"""A library client that shortens its lease's TTL cannot outlive it (issue 20, hole 3),
through real member processes.

Client A holds a key under a 30 s lease with a KeepAlive, updates the TTL to 1 s, and is
cut off (a proxy between it and the leader drops every byte: its renewals vanish). B
queues for the key and is granted it once the leader expires A's lease, about 1 s after
the update was applied. By then A's deadline must have passed: before the fix it still
counted 30 s from its last renewal.
"""

from __future__ import annotations

import time

import pytest

from dlm.client import Client, KeepAlive, core
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.proxy import Proxy

pytestmark = pytest.mark.cluster

WAIT_S = 15.0


def test_a_shortened_lease_ends_on_the_client_before_the_key_is_granted_again(
    cluster: Cluster,
) -> None:
    leader = cluster.wait_for_leader(timeout=15.0)
    with (
        Proxy(leader.address) as link,
        Client(link.address, timeout=5.0) as a,
        cluster.client(timeout=5.0) as b,
    ):
        lease = a.open_lease(30_000)
        a.acquire(lease, "shortened")
        other = b.open_lease(30_000)
        with KeepAlive(a, lease) as keeper:
            updated = time.monotonic()
            assert a.update_lease(lease, 1_000) == 1_000
            # Before any renewal: the deadline counts 1 s from the update's send.
            assert keeper.deadline <= core.lease_deadline(time.monotonic(), 1_000)
            # The renewals follow the new TTL at once (one is due a third of a second
            # after the last, long past), not in 10 s.
            wait_for(lambda: keeper.confirmed_at >= updated, WAIT_S, "a renewal by the new TTL")
            assert keeper.ttl_ms == 1_000
            link.cut()  # A's renewals vanish from here on
            b.acquire(other, "shortened", wait=WAIT_S)
            granted_by = time.monotonic()
            assert keeper.deadline < granted_by, (
                f"A counted on the lease {keeper.deadline - granted_by:.3f}s past B's grant"
            )
            assert keeper.lost.wait(WAIT_S)
        state = b.get("shortened")
        assert [h.lease for h in state.holders] == [other.id]
        b.close_lease(other)
