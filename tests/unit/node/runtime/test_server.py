"""The adapter's client side over real sockets: hello, frame limits, deadlines, caps, routing.

A one-member cluster on MemoryStorage in the test's own event loop
(server_harness.py); the rules tested here are the transport's, the
decisions behind them are test_machine.py's.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import cast

import anyio
import pytest

from dlm.node.machine import Instant
from dlm.node.runtime.accepting import ClientConnection, Limits
from dlm.node.runtime.server import Alarm
from dlm.wire import CLIENT_FRAME_LIMIT, FrameDecoder, encode_frame

from .server_harness import WAIT, Wire, running_member

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------------------
# The hello
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hello", "version"),
    [
        ({"version": 1}, 1),
        ({"version": 1, "max_version": 2}, 2),
        ({"version": 2}, 2),
        ({"version": 1, "max_version": 3}, 3),
        ({"version": 1, "max_version": 4}, 4),
        ({"version": 1, "max_version": 5}, 5),
        ({"version": 1, "max_version": 9}, 5),
    ],
)
async def test_the_welcome_speaks_the_lower_of_the_two_versions(
    hello: dict[str, int], version: int
) -> None:
    async with running_member() as (_, port):
        wire = await Wire.connect(port)
        await wire.send({"t": "hello", "role": "client", **hello})
        assert await wire.recv() == {
            "t": "welcome",
            "version": version,
            "node": "n1",
            "cluster": "unit",
        }
        assert (await wire.request("ping"))["t"] == "ok"


async def test_a_client_of_another_cluster_is_refused() -> None:
    async with running_member() as (_, port):
        wire = await Wire.connect(port)
        await wire.send({"t": "hello", "role": "client", "version": 1, "cluster": "prod"})
        refusal = await wire.recv()
        assert refusal["code"] == "BAD_REQUEST" and "'prod'" in refusal["message"]
        await wire.closed()


async def test_a_first_frame_that_is_not_a_hello_is_refused() -> None:
    async with running_member() as (_, port):
        wire = await Wire.connect(port)
        await wire.send({"t": "status", "id": 1})
        refusal = await wire.recv()
        assert refusal["code"] == "BAD_REQUEST" and "hello" in refusal["message"]
        await wire.closed()


async def test_a_request_sent_behind_the_hello_is_answered_after_the_welcome() -> None:
    async with running_member() as (_, port):
        wire = await Wire.connect(port)
        hello = {"t": "hello", "role": "client", "version": 1, "max_version": 2}
        await wire.send_bytes(encode_frame(hello) + encode_frame({"t": "ping", "id": 7}))
        assert (await wire.recv())["t"] == "welcome"
        assert await wire.recv() == {"t": "ok", "id": 7}


# ---------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------


async def test_an_oversized_frame_gets_an_error_naming_the_limit_and_the_connection_closes() -> (
    None
):
    async with running_member() as (_, port):
        wire = await Wire.client(port)
        await wire.send_bytes(struct.pack(">I", CLIENT_FRAME_LIMIT + 1) + b"\0" * 16)
        refusal = await wire.recv()
        assert refusal["code"] == "TOO_LARGE"
        assert str(CLIENT_FRAME_LIMIT) in refusal["message"]
        await wire.closed()
        # The member goes on serving everyone else.
        assert (await (await Wire.client(port)).request("ping"))["t"] == "ok"


async def test_an_oversized_hello_is_told_this_port_speaks_dlm() -> None:
    async with running_member() as (_, port):
        wire = await Wire.connect(port)
        await wire.send_bytes(b"GET / HTTP/1.1\r\n\r\n")
        refusal = await wire.recv()
        assert refusal["code"] == "TOO_LARGE" and "dlm protocol" in refusal["message"]
        await wire.closed()


async def test_a_frame_that_is_not_cbor_gets_an_error_and_the_connection_goes_on() -> None:
    async with running_member() as (_, port):
        wire = await Wire.client(port)
        await wire.send_bytes(struct.pack(">I", 1) + b"\x1c")  # a reserved CBOR head
        refusal = await wire.recv()
        assert refusal["code"] == "BAD_REQUEST" and "CBOR" in refusal["message"]
        assert (await wire.request("ping"))["t"] == "ok"


async def test_an_oversized_length_gets_an_error_and_the_connection_closes() -> None:
    async with running_member() as (_, port):
        wire = await Wire.client(port)
        await wire.send_bytes(struct.pack(">I", 1 << 30) + b"\xa0")
        refusal = await wire.recv()
        assert refusal["code"] == "TOO_LARGE"
        await wire.closed()


# ---------------------------------------------------------------------------
# Deadlines and caps
# ---------------------------------------------------------------------------


async def test_a_client_that_stalls_half_way_through_a_frame_is_closed() -> None:
    async with running_member(limits=Limits(frame_stall_timeout=0.2)) as (_, port):
        wire = await Wire.client(port)
        await wire.send_bytes(struct.pack(">I", 100) + b"\xa1")
        with anyio.fail_after(2.0):
            assert await wire.closed() == b""
        # A client that finishes its frames in time is left alone.
        steady = await Wire.client(port)
        assert (await steady.request("ping"))["t"] == "ok"


@pytest.mark.parametrize("sent", [b"", b"\x00\x00\x00\x40\xa1"], ids=["nothing", "half-a-hello"])
async def test_a_connection_that_does_not_finish_its_hello_in_time_is_closed(sent: bytes) -> None:
    async with running_member(limits=Limits(hello_timeout=0.2)) as (_, port):
        wire = await Wire.connect(port)
        await wire.send_bytes(sent)
        with anyio.fail_after(2.0):
            assert await wire.closed() == b""


async def test_an_idle_client_is_closed_after_the_idle_timeout() -> None:
    async with running_member(limits=Limits(idle_timeout=0.3)) as (_, port):
        wire = await Wire.client(port)
        assert (await wire.request("ping"))["t"] == "ok"
        with anyio.fail_after(2.0):
            await wire.closed()


async def test_clients_beyond_the_connection_cap_are_refused_unavailable() -> None:
    async with running_member(limits=Limits(max_connections=2)) as (server, port):
        first, _second = await Wire.client(port), await Wire.client(port)
        extra = await Wire.connect(port)
        await extra.send({"t": "hello", "role": "client", "version": 1})
        refusal = await extra.recv()
        assert refusal["code"] == "UNAVAILABLE" and refusal["retry_after_ms"] > 0
        await extra.closed()
        assert server.counters.connections_refused == 1
        await first.aclose()
        with anyio.fail_after(WAIT):
            while len(server._clients) >= 2:
                await anyio.sleep(0.01)
        assert (await (await Wire.client(port)).request("ping"))["t"] == "ok"


async def test_a_client_that_does_not_read_its_replies_is_cut_off() -> None:
    async with running_member() as (server, port):
        setup = await Wire.client(port)
        await setup.request("open_lease", lease="L", ttl_ms=60_000, client="c", seq=1)
        meta = {f"m{i:02}": "x" * 250 for i in range(15)}  # ~3.8 KB per holder
        for seq in range(2, 102):
            key = f"k{seq:03}"
            reply = await setup.request(
                "acquire", lease="L", key=key, meta=meta, client="c", seq=seq
            )
            assert reply["result"] == "granted"
        # Each listing is ~400 KB; the member's buffer for this client passes its cap long
        # before 40 of them are out.
        reader = await Wire.client(port)
        sent = 0
        try:
            for rid in range(1, 41):
                await reader.send({"t": "list", "id": rid})
                sent += 1
        except anyio.BrokenResourceError:
            pass  # cut off already
        received = await reader.closed()
        assert len(received) < sent * 380_000
        with anyio.fail_after(WAIT):
            while len(server._clients) > 1:
                await anyio.sleep(0.01)
        assert (await setup.request("ping"))["t"] == "ok"


# ---------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------


async def test_replies_and_grant_pushes_go_to_the_connection_that_asked() -> None:
    async with running_member() as (_, port):
        holder, waiter = await Wire.client(port), await Wire.client(port)
        await holder.request("open_lease", lease="a", ttl_ms=10_000, client="ca", seq=1)
        await waiter.request("open_lease", lease="b", ttl_ms=10_000, client="cb", seq=1)
        granted = await holder.request("acquire", lease="a", key="k", client="ca", seq=2)
        queued = await waiter.request("acquire", lease="b", key="k", wait=True, client="cb", seq=2)
        assert queued["result"] == "queued"
        # Both connections pipeline requests with the same ids; each gets its own answers.
        for wire in (holder, waiter):
            for rid in (101, 102, 103):
                await wire.send({"t": "status", "id": rid, "stale": True})
        for wire, lease in ((holder, "a"), (waiter, "b")):
            answers = [await wire.recv() for _ in range(3)]
            assert sorted(a["id"] for a in answers) == [101, 102, 103]
            assert all(a["t"] == "ok" for a in answers), lease
        released = await holder.request("release", lease="a", key="k", client="ca", seq=3)
        assert released["released"] == "lock"
        push = await waiter.recv()
        assert push == {"t": "grant", "lease": "b", "key": "k", "token": push["token"]}
        assert push["token"] > granted["token"]
        assert (await holder.request("ping"))["t"] == "ok"
        assert holder.frames == []  # no push went to the holder


def test_a_long_batch_of_committed_entries_is_applied_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart replaying a long log applies it in batches of thousands of entries: the
    collector would walk the growing table again and again (bench.replay), so it is paused
    for such a batch and what the batch made frozen after. Short batches change nothing."""
    import gc

    from dlm.node.machine import Instant, NodeMachine
    from dlm.node.runtime.server import LONG_APPLY_ENTRIES, _Machine
    from dlm.records import Entry

    seen: list[tuple[int, bool]] = []

    def spy(self: NodeMachine, committed: tuple[Entry, ...], now: Instant) -> None:
        seen.append((len(committed), gc.isenabled()))

    monkeypatch.setattr(NodeMachine, "_apply", spy)
    machine = object.__new__(_Machine)  # only _apply runs: no state needed
    long = tuple(Entry(i, 1, b"") for i in range(1, LONG_APPLY_ENTRIES + 1))
    assert gc.isenabled()
    gc.unfreeze()
    try:
        machine._apply(long[:3], Instant(0.0, 0))
        assert gc.get_freeze_count() == 0
        machine._apply(long, Instant(0.0, 0))
        # What the long batch made is out of the collector's sight (until an image's end).
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert seen == [(3, True), (LONG_APPLY_ENTRIES, False)]
    assert gc.isenabled()


async def test_a_client_frame_costs_a_pump_turn_only_when_the_machine_has_work() -> None:
    """Keep-alives waiting out their round's gap leave the machine nothing to pump
    (test_machine.py, needs_pump): their frames are fed without a turn of the loop for a
    pump. Here the idle leader's stand-in for that is a frame of a connection it does not
    know (ignored); a ping, whose answer waits to be sent, does get its pump turn."""
    async with running_member() as (server, _port):
        # A pump the start-up left pending (a write's completion under load) runs first:
        # from here to the last assertion nothing yields to the loop.
        for _ in range(1_000):
            if not server._pump_scheduled:
                break
            await anyio.sleep(0)
        assert not server._pump_scheduled
        stranger = ClientConnection(
            10_000, cast(asyncio.Transport, None), FrameDecoder(CLIENT_FRAME_LIMIT), 0.0
        )
        stranger.decoder.feed(encode_frame({"t": "ping", "id": 1}))
        assert server.client_data(stranger)
        assert not server._pump_scheduled, "nothing to do: no pump turn"
        client = server.client_opened(cast(asyncio.Transport, None), "test", None, None)
        client.decoder.feed(encode_frame({"t": "ping", "id": 2}))
        try:
            assert server.client_data(client)
            assert server._pump_scheduled, "an answer to send: a pump turn"
        finally:
            server.client_closed(client)  # before the turn runs: nothing is written to it


def test_the_runtime_images_and_restores_the_lock_table_with_the_collector_paused() -> None:
    import gc

    from dlm.node import locks
    from dlm.node.locks.commands import ClusterVersionCommand, OpenLeaseCommand, Origin
    from dlm.node.runtime.server import _Locks

    table = _Locks()
    table.apply_command(1, ClusterVersionCommand(2, 0))
    table.apply_command(2, OpenLeaseCommand("L1", 30_000, Origin("c1", 1, 0), 0))
    seen: list[bool] = []
    real = locks.LockStateMachine.snapshot

    def spy(self: locks.LockStateMachine) -> bytes:
        seen.append(gc.isenabled())
        return real(self)

    locks.LockStateMachine.snapshot = spy  # type: ignore[method-assign]
    try:
        image = table.snapshot()
    finally:
        locks.LockStateMachine.snapshot = real  # type: ignore[method-assign]
    assert seen == [False] and gc.isenabled()
    assert image == real(table)
    assert _Locks.restore(image).snapshot() == image and gc.isenabled()
    gc.disable()
    try:
        table.snapshot()
        assert not gc.isenabled(), "a collector the caller had paused stays paused"
    finally:
        gc.enable()


async def test_the_alarm_goes_off_once_at_the_earliest_time_asked_of_it() -> None:
    loop = asyncio.get_running_loop()
    went_off: list[float] = []
    done = anyio.Event()

    def fire() -> None:
        went_off.append(time.monotonic())
        done.set()

    alarm = Alarm(loop, fire)
    start = time.monotonic()
    alarm.no_later_than(start + 60.0)
    alarm.no_later_than(start + 0.02)
    alarm.no_later_than(start + 30.0)  # later than it is set for: changes nothing
    assert alarm.at == start + 0.02
    with anyio.fail_after(WAIT):
        await done.wait()
    assert len(went_off) == 1
    assert alarm.at == float("inf"), "gone off: unset until asked again"
    alarm.no_later_than(time.monotonic() + 60.0)
    alarm.cancel()
    assert alarm.at == float("inf")


async def test_the_member_ticks_on_its_alarm() -> None:
    """The member's clock is the alarm: its ticks keep coming, each setting it again."""
    async with running_member() as (server, _port):
        machine = server.machine
        ticks: list[float] = []
        three = anyio.Event()
        real_timer = machine.timer

        def counting(now: Instant) -> None:
            ticks.append(now.mono)
            if len(ticks) == 3:
                three.set()
            real_timer(now)

        machine.timer = counting  # type: ignore[method-assign]
        with anyio.fail_after(WAIT):
            await three.wait()
        assert server._alarm is not None and server._alarm.at <= machine.next_timer()
    assert server._alarm is None, "a member that stopped sets no alarm again"
