"""A bad byte never takes a node down (ARCHITECTURE.md, invariant 8)."""

from __future__ import annotations

import struct

import cbor2
import pytest

from tests.cluster.harness import Cluster, RawConn

pytestmark = pytest.mark.cluster


def _still_serving(cluster: Cluster, address: str) -> None:
    with cluster.client(timeout=10.0) as c:
        lease = c.open_lease(5_000)
        c.acquire(lease, "after-bad-input")
        c.release(lease, "after-bad-input")
    with RawConn(address) as conn:
        assert conn.request({"t": "status", "stale": True})["t"] == "ok"


def test_malformed_client_frames_get_errors_and_the_node_keeps_serving(
    cluster: Cluster,
) -> None:
    leader = cluster.wait_for_leader()
    with RawConn(leader.address) as conn:
        conn.send_raw_body(b"\xff\xfe not cbor at all")
        reply = conn.recv()
        assert (reply["t"], reply["code"]) == ("error", "BAD_REQUEST")

        conn.send([1, 2, 3])  # CBOR, but not a map
        assert conn.recv()["code"] == "BAD_REQUEST"

        conn.send({"t": "no_such_request", "id": 41})
        reply = conn.recv()
        assert (reply["code"], reply["id"]) == ("BAD_REQUEST", 41)

        conn.send({"t": "acquire", "id": 42, "lease": "x", "seq": 1, "key": 17})
        reply = conn.recv()
        assert (reply["code"], reply["id"]) == ("BAD_REQUEST", 42)

        conn.send({"t": "acquire", "id": 43, "lease": "x", "seq": True, "key": "k"})
        assert conn.recv()["code"] == "BAD_REQUEST"

        conn.send({"t": "open_lease", "id": 44, "lease": "x", "ttl_ms": 1})
        reply = conn.recv()
        assert (reply["code"], reply["id"]) == ("BAD_REQUEST", 44)
        assert "TTL" in reply["message"]

        conn.send_raw_body(cbor2.dumps(cbor2.CBORTag(1, 0)))  # a tagged date
        assert conn.recv()["code"] == "BAD_REQUEST"

        # The same connection still works after all that.
        assert conn.request({"t": "status", "stale": True})["t"] == "ok"

    with RawConn(leader.address) as conn:
        conn.send_bytes(struct.pack(">I", 50 * 1024 * 1024) + b"\0" * 64)
        reply = conn.recv()
        assert reply["code"] == "TOO_LARGE"
        assert conn.closed_by_peer()

    with RawConn(leader.address, hello=False) as conn:
        conn.send({"t": "status", "id": 1})  # no hello first
        assert conn.recv()["t"] == "error"
        assert conn.closed_by_peer()

    with RawConn(leader.address, hello=False) as conn:
        conn.send_bytes(b"\x00\x00")  # half a length prefix, then hang up
    _still_serving(cluster, leader.address)
    assert cluster.wait_for_leader().node_id == leader.node_id


def test_peers_with_the_wrong_cluster_id_or_garbage_are_refused(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    stranger = {
        "t": "hello",
        "role": "peer",
        "version": 1,
        "max_version": 2,
        "cluster": "other",
        "node": follower.node_id,
    }
    with RawConn(leader.address, hello=stranger) as conn:
        assert conn.welcome["t"] == "error"
        assert "cluster" in conn.welcome["message"]
        assert conn.closed_by_peer()

    unknown = {"t": "hello", "role": "peer", "version": 1, "cluster": "test", "node": "n9"}
    with RawConn(leader.address, hello=unknown) as conn:
        assert conn.welcome["t"] == "error"

    # A peer of this release (a cluster at version 2 refuses members that speak only 1).
    member = {
        "t": "hello",
        "role": "peer",
        "version": 1,
        "max_version": 2,
        "cluster": "test",
        "node": leader.node_id,
    }
    with RawConn(follower.address, hello=member) as conn:
        assert conn.welcome["t"] == "welcome"
        conn.send({"t": "raft", "m": [[3, 0, "x"]]})  # malformed raft message
        assert conn.closed_by_peer()
    with RawConn(follower.address, hello=member) as conn:
        conn.send({"t": "raft", "m": [[99, 0, 1, "n1", "n2"]]})  # unknown kind
        assert conn.closed_by_peer()

    old_version = {"t": "hello", "role": "client", "version": 99}
    with RawConn(leader.address, hello=old_version) as conn:
        assert conn.welcome["code"] == "BAD_REQUEST"

    _still_serving(cluster, follower.address)
    assert cluster.wait_for_leader().node_id == leader.node_id
