"""Routing over partitions (issue 25): the flows send each request to its key's
partition, learn the partition count from a WRONG_PARTITION reply and route again
(bounded), keep one router per partition; the drivers dial partition i > 0 with the
preamble and keep a connection per partition."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

from dlm.client import Client, aio, core
from dlm.client.aio import AsyncClient
from dlm.client.errors import ServerError
from dlm.partitioning import partition_of
from dlm.wire import ErrorCode, error, ok

from .doubles import Frame, partitioned_member
from .test_core import drive, not_leader, settings


def key_in(partition: int, partitions: int, stem: str = "k") -> str:
    """A key that lives in ``partition`` of a cluster of ``partitions``."""
    for n in range(10_000):
        key = f"{stem}{n}"
        if partition_of(key, partitions) == partition:
            return key
    raise AssertionError("no such key")


def wrong_partition(partitions: int) -> dict[str, Any]:
    return error(1, ErrorCode.WRONG_PARTITION, "not mine", partitions=partitions)


def granted(token: int = 7) -> dict[str, Any]:
    return ok(1, result="granted", token=token, ttl_ms=10_000)


# -- the flows -------------------------------------------------------------------


def test_a_keyed_request_goes_to_its_keys_partition() -> None:
    s, clock = settings(["a:1"])
    s.learn_partitions(4)
    key = key_in(3, 4)
    sent: list[core.Send] = []

    def answer(action: core.Send) -> Any:
        sent.append(action)
        return ok(1)

    drive(core.call(s, {"t": "get", "key": key}), answer, clock)
    drive(core.call(s, {"t": "status"}), answer, clock)
    assert [a.partition for a in sent] == [3, 0]


def test_wrong_partition_teaches_the_count_and_the_same_request_is_routed_again() -> None:
    s, clock = settings(["a:1"])
    key = key_in(2, 4)
    sent: list[core.Send] = []

    def answer(action: core.Send) -> Any:
        sent.append(action)
        if partition_of(key, 4) != action.partition:
            return wrong_partition(4)
        return granted()

    request = {"t": "acquire", "key": key, "lease": "L", "seq": 5}
    _, reply = drive(core.call(s, request), answer, clock)
    assert reply["token"] == 7
    assert s.partitions == 4
    assert [a.partition for a in sent] == [0, 2]
    assert sent[0].request is sent[1].request  # the same request: the same seq


def test_a_partition_the_caller_named_is_kept_and_wrong_partition_raised() -> None:
    s, clock = settings(["a:1"])
    with pytest.raises(core.WrongPartition) as caught:
        drive(
            core.call(s, {"t": "acquire", "key": "x"}, partition=0),
            lambda a: wrong_partition(4),
            clock,
        )
    assert caught.value.partitions == 4 and s.partitions == 4


def test_members_that_disagree_about_the_count_do_not_send_the_client_in_circles() -> None:
    s, clock = settings(["a:1"])
    counts = iter([2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 10)
    key = "some-key"
    sends = 0

    def answer(action: core.Send) -> Any:
        nonlocal sends
        sends += 1
        # Each reply names a count under which the key is not where it was sent.
        for count in counts:
            if partition_of(key, count) != action.partition:
                return wrong_partition(count)
        raise AssertionError("ran out of counts")

    with pytest.raises(ServerError, match="same --partitions"):
        drive(core.call(s, {"t": "get", "key": key}), answer, clock)
    assert sends <= core.MAX_PARTITION_REROUTES + 1


def test_wrong_partition_naming_the_count_the_client_already_routed_by_is_an_error() -> None:
    s, clock = settings(["a:1"])
    s.learn_partitions(4)
    with pytest.raises(ServerError, match="partition"):
        drive(core.call(s, {"t": "get", "key": "k"}), lambda a: wrong_partition(4), clock)


def test_each_partition_has_its_own_router() -> None:
    s, clock = settings(["a:1", "b:2", "c:3"])
    s.learn_partitions(2)
    key0, key1 = key_in(0, 2), key_in(1, 2)
    leaders = {0: "b:2", 1: "c:3"}
    sent: list[tuple[int, str]] = []

    def answer(action: core.Send) -> Any:
        sent.append((action.partition, action.addr))
        leader = leaders[action.partition]
        return ok(1) if action.addr == leader else not_leader(leader)

    drive(core.call(s, {"t": "get", "key": key0}), answer, clock)
    drive(core.call(s, {"t": "get", "key": key1}), answer, clock)
    assert s.router.target() == "b:2" and s.router_for(1).target() == "c:3"
    sent.clear()
    drive(core.call(s, {"t": "get", "key": key1}), answer, clock)
    drive(core.call(s, {"t": "get", "key": key0}), answer, clock)
    assert sent == [(1, "c:3"), (0, "b:2")]  # each straight to its own leader


def test_a_partitions_router_starts_its_turn_further_on_and_keeps_a_subclass() -> None:
    class Special(core.Router):
        pass

    router = Special(["a:1", "b:2", "c:3"])
    router.preferred = "a:1"
    other = router.for_partition(2)
    assert type(other) is Special
    assert other.preferred is None and other.target() == "c:3"
    assert router.target() == "a:1"


def test_a_waiting_acquire_awaits_the_push_on_its_partitions_connection() -> None:
    s, clock = settings(["a:1"])
    s.learn_partitions(4)
    key = key_in(1, 4)
    actions: list[Any] = []

    def answer(action: Any) -> Any:
        actions.append(action)
        if isinstance(action, core.AwaitGrant):
            return {"t": "grant", "lease": "L", "key": key, "token": 9}
        return ok(1, result="queued")

    flow = core.acquire_flow(s, "L", key, wait=5.0, limit=1, meta=None, known_ttl_ms=1000)
    grant = drive(flow, answer, clock)
    assert grant.token == 9
    assert [(type(a).__name__, a.partition) for a in actions] == [
        ("Send", 1),
        ("AwaitGrant", 1),
    ]


@pytest.mark.parametrize(
    ("greeting", "expected"),
    [
        ({"t": "welcome"}, (1, 0)),
        ({"t": "welcome", "partitions": 4, "partition": 3}, (4, 3)),
        ({"t": "welcome", "partitions": 4, "partition": 4}, (4, None)),
        ({"t": "welcome", "partitions": 65}, (None, 0)),
        ({"t": "welcome", "partitions": True, "partition": -1}, (None, None)),
        ({"t": "welcome", "partitions": "4", "partition": "1"}, (None, None)),
    ],
)
def test_what_a_greeting_says_of_partitions(
    greeting: dict[str, Any], expected: tuple[int | None, int | None]
) -> None:
    assert core.greeting_partitions(greeting) == expected


def test_a_count_that_is_no_valid_count_is_not_learned() -> None:
    s, _ = settings(["a:1"])
    for bad in (0, 65, -1, True, "4", None, 2.0):
        assert not s.learn_partitions(bad)
    assert s.partitions == 1
    assert s.learn_partitions(64) and s.partitions == 64


# -- the drivers -----------------------------------------------------------------

P = 4


def serve(partition: int, request: Frame) -> list[Frame]:
    if request.get("t") == "get":
        key = request["key"]
        return [ok(request["id"], key=key, limit=1, holders=[], waiters=0)]
    return [ok(request["id"])]


def test_the_blocking_client_dials_each_partition_with_its_preamble() -> None:
    keys = [key_in(p, P) for p in range(P)]
    with (
        partitioned_member(P, serve) as member,
        Client([member.addr], timeout=3.0, rng=random.Random(1)) as client,
    ):
        for key in keys:
            assert client.get(key).key == key
        assert client.partitions == P
        # One connection per partition, each reached through its preamble.
        assert sorted(client._conns) == list(range(P))
        for key in reversed(keys):
            client.get(key)
    served = [(p, f["key"]) for p, f in member.seen if f.get("t") == "get"]
    # The first request went to partition 0 (the count was not known yet).
    assert served[0] == (0, keys[0])
    assert served[1:] == [(p, keys[p]) for p in range(1, P)] + [
        (p, keys[p]) for p in reversed(range(P))
    ]


def test_the_blocking_client_learns_the_count_from_wrong_partition() -> None:
    key = key_in(3, P)
    with (
        partitioned_member(P, serve) as member,
        Client([member.addr], timeout=3.0, rng=random.Random(1)) as client,
    ):
        assert client.get(key).key == key
    assert [p for p, f in member.seen if f.get("t") == "get"] == [0, 3]


@pytest.mark.parametrize("native", [True, False])
def test_the_async_client_dials_each_partition_with_its_preamble(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aio, "NATIVE_ASYNCIO", native)
    keys = [key_in(p, P) for p in range(P)]
    with partitioned_member(P, serve) as member:

        async def main() -> None:
            async with AsyncClient([member.addr], timeout=3.0, rng=random.Random(1)) as client:
                for key in keys:
                    assert (await client.get(key)).key == key
                assert client.partitions == P
                assert sorted(client._conns) == list(range(P))

        anyio.run(main, backend="asyncio")
    served = [(p, f["key"]) for p, f in member.seen if f.get("t") == "get"]
    # The greeting of the first connection taught the count before the first request.
    assert served[0] == (0, keys[0])
    assert served[1:] == [(p, keys[p]) for p in range(1, P)]


def test_a_spawned_client_knows_the_count_and_each_partitions_leader() -> None:
    s_members = ["127.0.0.1:1", "127.0.0.1:2"]
    client = Client(s_members, timeout=1.0)
    client._ctx.learn_partitions(3)
    client._ctx.router_for(2).preferred = "127.0.0.1:2"
    child = client.spawn()
    assert child.partitions == 3
    assert child._ctx.router_for(2).preferred == "127.0.0.1:2"
    assert child._ctx.router_for(2) is not client._ctx.router_for(2)
