"""Locks through a real 3-member cluster: take, conflict, release, renew, expiry, FIFO."""

from __future__ import annotations

import time

import pytest

from dlm.client import LockHeld
from tests.cluster.harness import Cluster, RawConn, wait_for

pytestmark = pytest.mark.cluster


def test_acquire_conflict_release(cluster: Cluster) -> None:
    with cluster.client() as a, cluster.client() as b:
        la = a.open_lease(10_000)
        lb = b.open_lease(10_000)
        grant = a.acquire(la, "deploy", meta={"host": "web1"})
        assert grant.token > 0
        with pytest.raises(LockHeld):
            b.acquire(lb, "deploy")
        state = b.get("deploy")
        assert [(h.lease, h.token) for h in state.holders] == [(la.id, grant.token)]
        assert state.holders[0].meta == {"host": "web1"}
        a.release(la, "deploy")
        second = b.acquire(lb, "deploy")
        assert second.token > grant.token
        b.release(lb, "deploy")
        assert b.get("deploy").holders == []


def test_stale_reads_work_on_every_member_and_followers_redirect_the_rest(
    cluster: Cluster,
) -> None:
    leader = cluster.wait_for_leader()
    with cluster.client() as c:
        lease = c.open_lease(10_000)
        token = c.acquire(lease, "k").token
        # Through the client, a linearizable read reaches the leader, which knows the TTL left.
        holder = c.get("k").holders[0]
        assert holder.token == token and holder.remaining_ms is not None
        assert 0 < holder.remaining_ms <= 10_000
    for node in cluster.nodes.values():
        with RawConn(node.address) as conn:

            def stale_sees_the_grant(conn: RawConn = conn) -> bool:
                reply = conn.request({"t": "get", "key": "k", "stale": True})
                assert reply["t"] == "ok", reply
                return [h["token"] for h in reply["holders"]] == [token]

            wait_for(stale_sees_the_grant, 10.0, f"{node.node_id} to apply the grant")
            read = conn.request({"t": "get", "key": "k"})
            write = conn.request(
                {"t": "acquire", "lease": lease.id, "seq": 99, "key": "other", "wait": False}
            )
            if node is leader:
                assert read["t"] == "ok", read
                assert write["t"] == "ok", write
            else:
                for reply in (read, write):
                    assert reply["code"] == "NOT_LEADER"
                    assert reply["leader_address"] == leader.address


def test_keepalive_renews_a_lease_past_its_ttl(cluster: Cluster) -> None:
    with cluster.client() as c:
        lease = c.open_lease(1_000)
        c.acquire(lease, "renewed")
        # Renew every 250 ms for 3 TTLs: the lock must stay ours throughout.
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            assert c.keepalive(lease) == 1_000
            time.sleep(0.25)
        holders = c.get("renewed").holders
        assert [h.lease for h in holders] == [lease.id]
        assert c.lease_info(lease).keys == ["renewed"]


def test_an_unrenewed_lease_expires_and_its_waiter_is_granted(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    with cluster.client() as a:
        short = a.open_lease(1_000)
        first = a.acquire(short, "job")
    with RawConn(leader.address) as conn:
        waiter = "waiter-1"
        assert conn.request({"t": "open_lease", "lease": waiter, "ttl_ms": 30_000})["t"] == "ok"
        queued = conn.request(
            {"t": "acquire", "lease": waiter, "seq": 1, "key": "job", "wait": True}
        )
        assert queued["result"] == "queued", queued
        push = conn.await_push(waiter, "job", timeout=10.0)
        assert push["token"] > first.token
        state = conn.request({"t": "get", "key": "job"})
        assert [h["lease"] for h in state["holders"]] == [waiter]
        gone = conn.request({"t": "lease_info", "lease": short.id})
        assert gone["code"] == "SESSION_EXPIRED"


def test_five_queued_waiters_are_granted_in_order(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    conns = [RawConn(leader.address) for _ in range(6)]
    try:
        names = [f"w{i}" for i in range(6)]
        for conn, name in zip(conns, names, strict=True):
            assert conn.request({"t": "open_lease", "lease": name, "ttl_ms": 30_000})["t"] == "ok"
        held = conns[0].request({"t": "acquire", "lease": "w0", "seq": 1, "key": "q"})
        assert held["result"] == "granted"
        tokens = [held["token"]]
        for position, (conn, name) in enumerate(zip(conns[1:], names[1:], strict=True), 1):
            reply = conn.request(
                {"t": "acquire", "lease": name, "seq": 1, "key": "q", "wait": True}
            )
            assert (reply["result"], reply["position"]) == ("queued", position)
        for i in range(5):
            released = conns[i].request({"t": "release", "lease": names[i], "seq": 2, "key": "q"})
            assert released["released"] == "lock", released
            push = conns[i + 1].await_push(names[i + 1], "q")
            tokens.append(push["token"])
            state = conns[i + 1].request({"t": "get", "key": "q"})
            assert [h["lease"] for h in state["holders"]] == [names[i + 1]]
            assert [w["lease"] for w in state["waiters"]] == names[i + 2 :]
            # Nobody further back was woken.
            for later in conns[i + 2 :]:
                assert later.pushes == []
        assert tokens == sorted(tokens) and len(set(tokens)) == 6
    finally:
        for conn in conns:
            conn.close()


def test_status_reports_members_and_progress(cluster: Cluster) -> None:
    leader = cluster.wait_for_leader()
    view = wait_for(leader.status, 5.0, "leader status")
    assert view["role"] == "leader"
    assert sorted(m["id"] for m in view["members"]) == ["n1", "n2", "n3"]
    assert set(view["progress"]) == {"n1", "n2", "n3"}
