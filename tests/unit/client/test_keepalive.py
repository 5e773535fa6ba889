"""KeepAlive: renews in the background, and says promptly when the lease can't be trusted."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dlm.client import Client, KeepAlive

from .fake_server import FakeConn, FakeServer, LockModel


def test_renews_and_moves_the_deadline_forward() -> None:
    with FakeServer() as server, Client(server.addr, timeout=2.0) as c:
        lease = c.open_lease(300)
        first_deadline = lease.confirmed_at + 0.3
        with KeepAlive(c, lease) as ka:
            server.wait_for("keepalive", count=3)
            assert not ka.lost.is_set()
            assert ka.deadline > first_deadline
        assert not ka.lost.is_set()
        # Its own connection: the shared client's connection is untouched.
        assert len({n for n, _ in server.requests}) == 2


def test_sets_lost_when_keepalives_stop_being_answered() -> None:
    model = LockModel()
    answered = {"count": 0}

    def goes_silent(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any] | None:
        if req["t"] == "keepalive":
            answered["count"] += 1
            if answered["count"] > 2:
                return None  # as if every member were SIGSTOPped
        return model(conn, req)

    reasons: list[str] = []
    with (
        FakeServer(goes_silent) as server,
        Client(server.addr, timeout=2.0, attempt_timeout=1.0) as c,
    ):
        lease = c.open_lease(300)
        ka = KeepAlive(c, lease, on_lost=reasons.append).start()
        try:
            assert ka.lost.wait(5.0)
            assert "deadline" in (ka.reason or "")
            assert reasons == [ka.reason]
            # Lost means: no confirmed renewal within the TTL before now.
            assert time.monotonic() >= ka.deadline
        finally:
            ka.stop()


def test_sets_lost_on_session_expired() -> None:
    model = LockModel()
    with FakeServer(model) as server, Client(server.addr, timeout=2.0) as c:
        lease = c.open_lease(10_000)
        model.expire_keepalives = True
        fired = threading.Event()
        with KeepAlive(c, lease, interval=0.01, on_lost=lambda _: fired.set()) as ka:
            assert ka.lost.wait(5.0)
            assert fired.is_set()
            assert "expired" in (ka.reason or "")


def test_stop_is_prompt_while_a_renewal_hangs() -> None:
    model = LockModel()

    def silent_keepalive(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any] | None:
        return None if req["t"] == "keepalive" else model(conn, req)

    with FakeServer(silent_keepalive) as server, Client(server.addr, timeout=30.0) as c:
        lease = c.open_lease(60_000)
        ka = KeepAlive(c, lease, interval=0.01).start()
        server.wait_for("keepalive")
        ka.stop(timeout=5.0)
        assert not any(t.is_alive() for t in ka._threads)
        assert not ka.lost.is_set()


def test_needs_ttl_and_confirmation_time() -> None:
    with FakeServer() as server, Client(server.addr) as c:
        with pytest.raises(ValueError):
            KeepAlive(c, "some-lease", confirmed_at=time.monotonic())
        with pytest.raises(ValueError):
            KeepAlive(c, "some-lease", ttl_ms=1000)


def test_deadline_of_sets_when_the_lease_is_given_up_and_on_renewed_hears_each_renewal() -> None:
    renewed: list[tuple[float, int]] = []
    with FakeServer() as server, Client(server.addr, timeout=2.0) as c:
        lease = c.open_lease(3_000)

        def early(sent: float, ttl_ms: int) -> float:
            return sent + ttl_ms / 1000.0 - 1.0  # give up a second before the TTL is out

        with KeepAlive(c, lease, deadline_of=early, on_renewed=lambda *r: renewed.append(r)) as ka:
            assert ka.deadline == pytest.approx(lease.confirmed_at + 2.0)
            server.wait_for("keepalive", count=1)
            deadline = time.monotonic() + 5
            while not renewed:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            sent, ttl_ms = renewed[0]
            assert ttl_ms == 3_000
            assert ka.confirmed_at >= sent
            assert ka.deadline >= early(sent, ttl_ms)


def test_a_renewal_confirmed_after_the_deadline_counts_for_nothing() -> None:
    with FakeServer() as server, Client(server.addr, timeout=2.0) as c:
        lease = c.open_lease(60_000)
        heard: list[tuple[float, int]] = []
        ka = KeepAlive(c, lease, on_renewed=lambda *r: heard.append(r))  # not started
        assert ka.confirmed(time.monotonic(), 60_000)
        assert heard and ka.renewals == 1
        late = KeepAlive(
            c, lease, confirmed_at=time.monotonic() - 61.0, on_renewed=lambda *r: heard.append(r)
        )
        before = late.deadline
        assert not late.confirmed(time.monotonic(), 60_000)
        assert late.deadline == before
        assert len(heard) == 1
