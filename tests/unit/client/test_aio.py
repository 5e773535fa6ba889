"""The anyio client: the same flows as the blocking one, driven by coroutines."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

from dlm.client import aio
from dlm.client.aio import AsyncClient
from dlm.client.errors import LockHeld, NotHolder

from .fake_server import FakeConn, FakeServer, LockModel, redirect_to


def run(fn: Any) -> Any:
    return anyio.run(fn, backend="asyncio")


@pytest.fixture(autouse=True, params=["native", "anyio"])
def connection_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on asyncio's own transport and on anyio's portable stream."""
    monkeypatch.setattr(aio, "NATIVE_ASYNCIO", request.param == "native")
    return str(request.param)


def test_basic_flow_through_a_redirect() -> None:
    with FakeServer(name="leader") as leader, FakeServer(redirect_to(leader.addr)) as follower:

        async def main() -> None:
            async with AsyncClient([follower.addr], timeout=3.0, rng=random.Random(2)) as c:
                lease = await c.open_lease(2000)
                assert c.connected_to == leader.addr
                grant = await c.acquire(lease, "k", meta={"pid": "1"})
                assert grant.lease == lease.id and grant.ttl_ms == 2000
                assert await c.keepalive(lease) == 2000
                assert (await c.get("k"))["holders"][0]["token"] == grant.token
                assert [lock["key"] for lock in await c.list_locks()] == ["k"]
                assert (await c.lease_info(lease))["keys"] == ["k"]
                assert (await c.status())["node"] == "n1"
                assert (await c.member_status(leader.addr)) is not None
                other = await c.open_lease(2000)
                with pytest.raises(LockHeld):
                    await c.acquire(other, "k")
                with pytest.raises(NotHolder):
                    await c.release(other, "k")
                await c.release(lease, "k")
                await c.close_lease(lease)

        run(main)


def test_waiting_acquire_gets_the_push_and_keep_alive_renews() -> None:
    with FakeServer() as server:

        async def main() -> None:
            async with AsyncClient(server.addr, timeout=3.0) as a, AsyncClient(server.addr) as b:
                la, lb = await a.open_lease(300), await b.open_lease(300)
                await a.acquire(la, "k")
                async with b.keep_alive(lb) as keeper:
                    async with anyio.create_task_group() as tg:

                        async def release_when_queued() -> None:
                            await anyio.to_thread.run_sync(server.wait_for, "acquire", 2)
                            await a.release(la, "k")

                        tg.start_soon(release_when_queued)
                        grant = await b.acquire(lb, "k", wait=5.0)
                    assert grant.lease == lb.id
                    await anyio.to_thread.run_sync(server.wait_for, "keepalive", 2)
                    assert not keeper.lost.is_set()

        run(main)


def test_keep_alive_reports_loss_when_renewals_stop() -> None:
    model = LockModel()

    def silent_keepalive(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any] | None:
        return None if req["t"] == "keepalive" else model(conn, req)

    with FakeServer(silent_keepalive) as server:
        reasons: list[str] = []

        async def main() -> None:
            async with AsyncClient(server.addr, timeout=2.0) as c:
                lease = await c.open_lease(300)
                async with c.keep_alive(lease, on_lost=reasons.append) as keeper:
                    with anyio.fail_after(5.0):
                        await keeper.lost.wait()
                assert reasons and "deadline" in reasons[0]

        run(main)


def test_waiting_acquire_times_out_and_releases() -> None:
    with FakeServer() as server:

        async def main() -> None:
            async with AsyncClient(server.addr, timeout=2.0) as c:
                a, b = await c.open_lease(1000), await c.open_lease(1000)
                await c.acquire(a, "k")
                with pytest.raises(LockHeld):
                    await c.acquire(b, "k", wait=0.2)
                assert [r["lease"] for r in server.of_type("release")] == [b.id]

        run(main)


def test_dropped_connection_is_retried_with_the_same_seq() -> None:
    model = LockModel()
    dropped: list[int] = []

    def flaky(conn: FakeConn, req: dict[str, Any]) -> dict[str, Any] | None:
        if req["t"] == "acquire" and not dropped:
            dropped.append(req["seq"])
            conn.drop()
            return None
        return model(conn, req)

    with FakeServer(flaky) as server:

        async def main() -> None:
            async with AsyncClient(server.addr, timeout=3.0, rng=random.Random(3)) as c:
                lease = await c.open_lease(2000)
                grant = await c.acquire(lease, "k")
                assert grant.token > 0
                await c.release(lease, "k")

        run(main)
        acquires = server.of_type("acquire")
        assert len(acquires) == 2
        assert acquires[0]["seq"] == acquires[1]["seq"] == dropped[0]
        assert server.of_type("release")[0]["seq"] != dropped[0]


def test_silent_member_is_abandoned_for_the_next_one() -> None:
    def silent(conn: FakeConn, req: dict[str, Any]) -> None:
        return None

    with FakeServer(silent, name="stopped") as stopped, FakeServer() as live:

        async def main() -> None:
            members = [stopped.addr, live.addr]
            async with AsyncClient(members, timeout=3.0, attempt_timeout=0.2) as c:
                lease = await c.open_lease(1000)
                assert lease.ttl_ms == 1000
                assert c.connected_to == live.addr
                assert stopped.of_type("open_lease")[0]["lease"] == lease.id

        run(main)
