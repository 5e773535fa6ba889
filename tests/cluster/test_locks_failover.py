"""Crashes and pauses of real members: no grant is lost, none is given twice."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Cluster, RawConn, wait_for

pytestmark = pytest.mark.cluster


class Journal:
    """What clients saw, in the order they saw it (grant received / release about to be sent)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[str, str, int]] = []

    def add(self, kind: str, lease: str, token: int) -> None:
        with self._lock:
            self.events.append((kind, lease, token))

    def check_exclusive(self) -> list[int]:
        """Grants and releases must alternate; returns the tokens in grant order."""
        holder = None
        tokens = []
        for kind, lease, token in self.events:
            if kind == "granted":
                assert holder is None, f"{lease} granted while {holder} held: {self.events}"
                holder = lease
                tokens.append(token)
            else:
                assert holder == lease, f"{lease} released but {holder} held: {self.events}"
                holder = None
        return tokens


def _waiter(cluster: Cluster, journal: Journal, errors: list[BaseException], key: str) -> None:
    try:
        with cluster.client(timeout=30.0) as client:
            lease = client.open_lease(30_000)
            grant = client.acquire(lease, key, wait=40.0)
            journal.add("granted", lease.id, grant.token)
            journal.add("released", lease.id, grant.token)
            client.release(lease, key)
    except BaseException as exc:
        errors.append(exc)


def _waiting_count(cluster: Cluster, key: str) -> Any:
    with cluster.client(timeout=5.0) as c:
        return c.get(key).waiting


def test_killing_the_leader_loses_no_grant_and_grants_none_twice(cluster: Cluster) -> None:
    journal = Journal()
    errors: list[BaseException] = []
    with cluster.client(timeout=30.0) as holder:
        lease = holder.open_lease(30_000)
        first = holder.acquire(lease, "f")
        journal.add("granted", lease.id, first.token)
        threads = [
            threading.Thread(target=_waiter, args=(cluster, journal, errors, "f"), daemon=True)
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        wait_for(lambda: _waiting_count(cluster, "f") == 3, 15.0, "three queued waiters")

        old = cluster.wait_for_leader()
        killed_at = time.monotonic()
        old.kill()
        new = cluster.wait_for_leader(timeout=10.0, not_=old.node_id)
        failover = time.monotonic() - killed_at

        # The holder still holds, under the same token, on the new leader.
        state = holder.get("f")
        assert [(h.lease, h.token) for h in state.holders] == [(lease.id, first.token)]
        assert state.waiting == 3

        journal.add("released", lease.id, first.token)
        holder.release(lease, "f")
        for t in threads:
            t.join(timeout=60.0)
        assert not any(t.is_alive() for t in threads), "a waiter never got its grant"
        assert errors == []

        tokens = journal.check_exclusive()
        assert len(tokens) == 4
        assert tokens == sorted(tokens) and len(set(tokens)) == 4

        # Clients carry on: a fresh acquire works and gets a higher token.
        again = holder.acquire(lease, "f")
        assert again.token > tokens[-1]
        holder.release(lease, "f")
    print(f"\nleader {old.node_id} killed; {new.node_id} took over in {failover:.2f}s")

    # The killed member comes back and catches up with the same lock table.
    old.start()
    leader_view = wait_for(new.status, 5.0, "leader status")

    def caught_up() -> bool:
        view = old.status()
        return view is not None and view["applied"] >= leader_view["commit"]

    wait_for(caught_up, 15.0, f"{old.node_id} to catch up")
    with RawConn(old.address) as conn:
        assert conn.request({"t": "get", "key": "f", "stale": True})["holders"] == []


def test_killing_every_member_keeps_every_grant_and_tokens_keep_rising(
    cluster: Cluster,
) -> None:
    keys = [f"k{i}" for i in range(5)]
    with cluster.client(timeout=20.0) as c:
        owner = c.open_lease(60_000)
        tokens = {key: c.acquire(owner, key).token for key in keys}
        queued = c.open_lease(60_000)
    leader = cluster.wait_for_leader()
    with RawConn(leader.address) as conn:
        reply = conn.request(
            {"t": "acquire", "lease": queued.id, "seq": 7, "key": "k0", "wait": True}
        )
        assert reply["result"] == "queued"

    cluster.kill_all()
    cluster.start_all()
    cluster.wait_for_leader(timeout=15.0)

    with cluster.client(timeout=20.0) as c:
        for key in keys:
            state = c.get(key)
            assert [(h.lease, h.token) for h in state.holders] == [(owner.id, tokens[key])]
        waiters = c.get("k0").waiters
        assert isinstance(waiters, list) and [w.lease for w in waiters] == [queued.id]
        fresh = c.acquire(owner, "fresh")
        assert fresh.token > max(tokens.values())
        c.release(owner, "k0")
        after = c.get("k0").holders
        assert [h.lease for h in after] == [queued.id]
        assert (after[0].token or 0) > fresh.token


def test_a_paused_leader_is_replaced_and_steps_down_when_resumed(cluster: Cluster) -> None:
    old = cluster.wait_for_leader()
    with cluster.client(timeout=20.0) as c:
        lease = c.open_lease(60_000)
        before = c.acquire(lease, "p").token
        old.pause()
        try:
            new = cluster.wait_for_leader(timeout=10.0, not_=old.node_id)
            c.release(lease, "p")
            during = c.acquire(lease, "p").token
            assert during > before
        finally:
            old.resume()

        def stepped_down() -> bool:
            view = old.status()
            return view is not None and view["role"] == "follower" and view["leader"] is not None

        wait_for(stepped_down, 10.0, f"{old.node_id} to step down")
        holders = c.get("p").holders
        assert [(h.lease, h.token) for h in holders] == [(lease.id, during)]
    assert new.node_id != old.node_id


def test_sigterm_hands_leadership_over_and_exits_0(cluster: Cluster) -> None:
    old = cluster.wait_for_leader()
    with cluster.client(timeout=20.0) as c:
        lease = c.open_lease(60_000)
        token = c.acquire(lease, "t").token
        assert old.terminate(grace=10.0) == 0
        new = cluster.wait_for_leader(timeout=10.0, not_=old.node_id)
        holders = c.get("t").holders
        assert [(h.lease, h.token) for h in holders] == [(lease.id, token)]
    assert "transfer_leadership" in old.log_tail(10)
    assert new.node_id != old.node_id


def test_a_member_that_fell_behind_the_log_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, env={"DLM_SNAPSHOT_EVERY": "40", "DLM_SNAPSHOT_KEEP": "5"})
    try:
        cluster.start_all()
        leader = cluster.wait_for_leader(timeout=15.0)
        behind = next(n for n in cluster.nodes.values() if n is not leader)
        behind.kill()
        with cluster.client(timeout=20.0) as c:
            lease = c.open_lease(60_000)
            for _ in range(60):
                c.acquire(lease, "churn")
                c.release(lease, "churn")
            token = c.acquire(lease, "kept").token
            waiter = c.open_lease(60_000)
        with RawConn(cluster.wait_for_leader().address) as conn:
            queued = conn.request(
                {"t": "acquire", "lease": waiter.id, "seq": 1, "key": "kept", "wait": True}
            )
            assert queued["result"] == "queued"
        behind.start()

        def has_it() -> dict[str, Any] | None:
            view = behind.status()
            if view is None or view["applied"] < token:
                return None
            with RawConn(behind.address) as conn:
                got = conn.request({"t": "get", "key": "kept", "stale": True})
            return got if got["holders"] else None

        got = wait_for(has_it, 20.0, f"{behind.node_id} to catch up")
        assert [(h["lease"], h["token"]) for h in got["holders"]] == [(lease.id, token)]
        assert [w["lease"] for w in got["waiters"]] == [waiter.id]
        assert "snapshot_installed" in behind.log_path.read_text()
    finally:
        cluster.stop_all()
