"""The anyio client: the same flows as the blocking one, driven by coroutines, against a real
member (real_member.py) and doubles for what it will not do."""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import pytest

from dlm import wire
from dlm.client import aio, core, renewal
from dlm.client.aio import AsyncClient
from dlm.client.clock import lease_clock
from dlm.client.errors import DlmError, LockHeld, NotHolder

from .doubles import cutting_proxy, redirecting_member, scripted_member, silent_member
from .real_member import WAIT, RunningMember


def run(fn: Any) -> Any:
    return anyio.run(fn, backend="asyncio")


@pytest.fixture(autouse=True, params=["native", "anyio"])
def connection_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on asyncio's own transport and on anyio's portable stream."""
    monkeypatch.setattr(aio, "NATIVE_ASYNCIO", request.param == "native")
    return str(request.param)


def _opens_with_45s(request: dict[str, Any]) -> list[dict[str, Any]]:
    """A member whose default-ttl is 45 s."""
    ttl_ms = request.get("ttl_ms", 45_000)
    return [wire.ok(request["id"], lease=request["lease"], ttl_ms=ttl_ms, incarnation=1)]


@pytest.mark.parametrize(
    ("version", "sent", "got"), [(5, None, 45_000), (4, 30_000, 30_000)], ids=["v5", "v4"]
)
def test_an_open_without_a_ttl_is_fitted_to_the_members_version(
    version: int, sent: int | None, got: int
) -> None:
    with scripted_member(_opens_with_45s, version=version) as double:

        async def main() -> None:
            async with AsyncClient(double.addr, timeout=3.0) as c:
                lease = await c.open_lease(None)
                assert lease.ttl_ms == got
                await c.open_lease(7_000)

        run(main)
        first, second = double.of_type("open_lease")
        assert first.get("ttl_ms") == sent and ("ttl_ms" in first) == (sent is not None)
        assert second["ttl_ms"] == 7_000


def test_each_call_through_a_redirect(member: RunningMember) -> None:
    with redirecting_member(member.addr) as follower:

        async def main() -> None:
            async with AsyncClient([follower.addr], timeout=3.0, rng=random.Random(2)) as c:
                lease = await c.open_lease(2000)
                assert c.connected_to == member.addr
                grant = await c.acquire(lease, "k", meta={"pid": "1"})
                assert grant.lease == lease.id and grant.ttl_ms == 2000
                assert await c.keepalive(lease) == 2000
                assert (await c.get("k")).holders[0].token == grant.token
                assert [lock.key for lock in await c.list_locks()] == ["k"]
                assert (await c.lease_info(lease)).keys == ["k"]
                assert (await c.status()).node == "n1"
                assert (await c.member_status(member.addr)) is not None
                other = await c.open_lease(2000)
                with pytest.raises(LockHeld):
                    await c.acquire(other, "k")
                with pytest.raises(NotHolder):
                    await c.release(other, "k")
                await c.release(lease, "k")
                await c.close_lease(lease)

        run(main)


def test_a_waiting_acquire_gets_the_push_while_keep_alive_renews(member: RunningMember) -> None:
    async def main() -> None:
        async with AsyncClient(member.addr, timeout=3.0) as a, AsyncClient(member.addr) as b:
            la, lb = await a.open_lease(1000), await b.open_lease(1000)
            await a.acquire(la, "k")
            async with b.keep_alive(lb, interval=0.05) as keeper:
                async with anyio.create_task_group() as tg:

                    async def release_when_queued() -> None:
                        await anyio.to_thread.run_sync(member.wait_for, "acquire", 2)
                        await a.release(la, "k")

                    tg.start_soon(release_when_queued)
                    with anyio.fail_after(WAIT):
                        grant = await b.acquire(lb, "k", wait=WAIT)
                assert grant.lease == lb.id
                await anyio.to_thread.run_sync(member.wait_for, "keepalive", 2)
                assert not keeper.lost.is_set()

    run(main)


def test_keep_alive_reports_loss_when_the_member_stops_answering(member: RunningMember) -> None:
    reasons: list[str] = []

    async def main() -> None:
        async with AsyncClient(member.addr, timeout=2.0) as c:
            lease = await c.open_lease(1000)
            async with c.keep_alive(lease, on_lost=reasons.append, interval=0.05) as keeper:
                await anyio.to_thread.run_sync(member.wait_for, "keepalive", 1)
                with member.frozen():
                    with anyio.fail_after(WAIT):
                        await keeper.lost.wait()
            assert reasons and "deadline" in reasons[0]

    run(main)


def test_a_waiting_acquire_that_times_out_releases(member: RunningMember) -> None:
    async def main() -> None:
        async with AsyncClient(member.addr, timeout=2.0) as c:
            a, b = await c.open_lease(1000), await c.open_lease(1000)
            await c.acquire(a, "k")
            with pytest.raises(LockHeld):
                await c.acquire(b, "k", wait=0.2)
            assert [r["lease"] for r in member.of_type("release")] == [b.id]

    run(main)


def test_an_answer_lost_with_the_connection_is_asked_again_with_the_same_seq(
    member: RunningMember,
) -> None:
    def first_acquire(frame: dict[str, Any]) -> bool:
        return frame.get("t") == "acquire"

    with cutting_proxy(member.addr, cut_after_request=first_acquire) as proxy:

        async def main() -> None:
            async with AsyncClient(proxy.addr, timeout=3.0, rng=random.Random(3)) as c:
                lease = await c.open_lease(2000)
                grant = await c.acquire(lease, "k")
                holders = (await c.get("k")).holders
                assert [(h.lease, h.token) for h in holders] == [(lease.id, grant.token)]
                await c.release(lease, "k")

        run(main)
        first, second = member.of_type("acquire")
        assert (first["client"], first["seq"]) == (second["client"], second["seq"])
        assert member.of_type("release")[0]["seq"] > first["seq"]
        assert proxy.cuts == 1


def test_a_silent_member_is_abandoned_for_the_next_one(member: RunningMember) -> None:
    with silent_member() as stopped:

        async def main() -> None:
            members = [stopped.addr, member.addr]
            async with AsyncClient(members, timeout=3.0, attempt_timeout=0.2) as c:
                lease = await c.open_lease(1000)
                assert lease.ttl_ms == 1000
                assert c.connected_to == member.addr
                assert stopped.of_type("open_lease")[0]["lease"] == lease.id

        run(main)


def test_keep_alive_hears_of_a_shorter_ttl_before_the_update_is_sent(
    member: RunningMember,
) -> None:
    """Issue 20, hole 3, on the anyio client: the deadline falls at once, and the next
    renewal goes by the new TTL (a third of 1 s after the last, not of 30 s)."""

    async def main() -> None:
        async with AsyncClient(member.addr, timeout=3.0) as c:
            lease = await c.open_lease(30_000)
            async with c.keep_alive(lease) as keeper:
                before = time.monotonic()
                assert await c.update_lease(lease, 1_000) == 1_000
                assert keeper.ttl_ms == 1_000
                assert keeper.deadline <= core.lease_deadline(time.monotonic(), 1_000)
                with anyio.fail_after(WAIT):
                    while keeper.renewals < 1:
                        await anyio.sleep(0.005)
                assert keeper._clock.last_sent >= before
                assert keeper.deadline == core.lease_deadline(keeper._clock.last_sent, 1_000)
                assert not keeper.lost.is_set()

    run(main)


def test_keep_alive_pings_its_idle_connection_between_long_renewals(
    member: RunningMember, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(renewal, "PING_EVERY_S", 0.05)  # members drop connections idle for 2 min

    async def main() -> None:
        async with AsyncClient(member.addr, timeout=2.0) as c:
            lease = await c.open_lease(60_000)
            # Confirmed 19.9 s ago: the first renewal (every 20 s) is due at once, the next
            # one in 20 s; pings keep its connection wanted meanwhile.
            since = lease.confirmed_at - 19.9
            async with c.keep_alive(lease, confirmed_at=since) as keeper:
                await anyio.to_thread.run_sync(member.wait_for, "keepalive", 1)
                await anyio.to_thread.run_sync(member.wait_for, "ping", 2)
                assert keeper.renewals == 1 and not keeper.lost.is_set()
            assert set(member.conns_of("ping")) <= set(member.conns_of("keepalive"))

    run(main)


def test_the_membership_calls_and_ping(member: RunningMember) -> None:
    async def main() -> None:
        async with AsyncClient(member.addr, timeout=2.0) as c:
            assert not await c.ping()  # nothing connected: nothing to keep
            view = await c.members_view()
            assert view.leader == "n1" and view.members
            assert await c.ping()
            with pytest.raises(DlmError):
                await c.remove_member("n1")  # the only voter stays
            with pytest.raises(DlmError):
                await c.promote_member("nobody")
            added = await c.add_member("n2", "127.0.0.1:1")
            assert any(m.id == "n2" for m in added.members)
            removed = await c.remove_member("n2")
            assert not any(m.id == "n2" for m in removed.members)

    run(main)


def test_a_part_opened_through_the_family_counts_before_the_next_round() -> None:
    # As sync.KeepAlive's (test_keepalive.py): a part whose open was first sent long
    # before its answer came is the keeper's deadline at once.
    async def main() -> None:
        async with AsyncClient("127.0.0.1:1") as c:  # never connects: nothing is renewed
            now = lease_clock()
            keeper = aio.AsyncKeepAlive(c, core.Lease("L", 60_000, now, partition=0))
            late = core.Lease("L", 60_000, now - 59.0, partition=1)
            c._book.opened(late)
            assert keeper.deadline == core.lease_deadline(late.confirmed_at, 60_000)

    anyio.run(main)
