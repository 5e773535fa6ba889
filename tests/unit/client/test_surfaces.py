"""The blocking and the async client offer the same calls, with the same parameters.

Each difference the two can't avoid is named here: ``close`` is ``aclose`` on the async
client, every call that does IO is a coroutine there, and a KeepAlive runs threads that
``start`` and ``stop`` where the async one runs as long as its ``async with`` block. A
method or a parameter added to one client and not the other fails this test.
"""

from __future__ import annotations

import inspect
from typing import Any

import anyio
import pytest

from dlm.client.aio import AsyncClient, AsyncKeepAlive
from dlm.client.sync import Client, KeepAlive

RENAMED = {"close": "aclose"}
"""Blocking name -> async name."""
THREADS_ONLY = {"start", "running", "halt", "stop"}
"""KeepAlive's thread control (``halt`` stops renewing without joining the threads):
an AsyncKeepAlive lives in its ``async with`` block."""
NO_IO = {"spawn"}
"""Calls that do no IO: plain functions on both clients."""


def public(cls: type) -> dict[str, Any]:
    """The class's public names (the constructor included), as their static members."""
    names = {n for n in dir(cls) if not n.startswith("_")} | {"__init__"}
    return {n: inspect.getattr_static(cls, n) for n in names}


def parameters(member: Any) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter but the first (self)."""
    signature = inspect.signature(member)
    return [(p.name, p.kind, p.default) for p in list(signature.parameters.values())[1:]]


def kind(member: Any) -> str:
    if isinstance(member, property):
        return "property"
    if (
        inspect.iscoroutinefunction(member)
        # An iterator on the blocking client (watch, observe) is an async iterator here.
        or inspect.isasyncgenfunction(member)
        or inspect.isasyncgenfunction(getattr(member, "__wrapped__", None))
    ):
        return "async"
    return "function" if callable(member) else "value"


def blocking_side(blocking: type, skip: set[str]) -> dict[str, Any]:
    """The blocking class's public members, under the names their twins have."""
    return {RENAMED.get(n, n): m for n, m in public(blocking).items() if n not in skip}


def pairs(blocking: type, non_blocking: type, skip: set[str]) -> list[tuple[str, Any, Any]]:
    ours, theirs = blocking_side(blocking, skip), public(non_blocking)
    return [
        (name, ours[name], theirs[name])
        for name in sorted(set(ours) | set(theirs))
        if name in ours and name in theirs
    ]


def test_the_two_clients_offer_the_same_calls() -> None:
    assert sorted(blocking_side(Client, set())) == sorted(public(AsyncClient))


def test_the_two_keepalives_offer_the_same_members() -> None:
    assert sorted(blocking_side(KeepAlive, THREADS_ONLY)) == sorted(public(AsyncKeepAlive))


CLIENT_PAIRS = pairs(Client, AsyncClient, set())
KEEPALIVE_PAIRS = pairs(KeepAlive, AsyncKeepAlive, THREADS_ONLY)


@pytest.mark.parametrize(("name", "blocking", "non_blocking"), CLIENT_PAIRS)
def test_each_client_call_has_its_twin(name: str, blocking: Any, non_blocking: Any) -> None:
    if isinstance(blocking, property) or name == "__init__" or name in NO_IO:
        assert kind(blocking) == kind(non_blocking), name
    else:
        # Every call of the blocking client is a coroutine (or an async with) on the other.
        assert kind(blocking) == "function" and kind(non_blocking) == "async", name
    if not isinstance(blocking, property):
        assert parameters(blocking) == parameters(non_blocking), name


@pytest.mark.parametrize(("name", "blocking", "non_blocking"), KEEPALIVE_PAIRS)
def test_each_keepalive_member_has_its_twin(name: str, blocking: Any, non_blocking: Any) -> None:
    assert kind(blocking) == kind(non_blocking), name
    if callable(blocking) and not isinstance(blocking, property):
        assert parameters(blocking) == parameters(non_blocking), name


def test_the_keep_alive_calls_take_what_the_keepalives_take() -> None:
    made_by_client = parameters(Client.keep_alive)
    assert made_by_client == parameters(KeepAlive.__init__)[1:]  # less the client
    assert made_by_client == parameters(AsyncKeepAlive.__init__)[1:]


def test_the_keepalives_keep_the_same_state() -> None:
    """The attributes set in the constructors, which the class listings do not show."""

    async def made() -> tuple[set[str], set[str]]:
        client = AsyncClient("127.0.0.1:1")
        blocking = KeepAlive(Client("127.0.0.1:1"), "L", ttl_ms=1000, confirmed_at=0.0)
        non_blocking = AsyncKeepAlive(client, "L", ttl_ms=1000, confirmed_at=0.0)
        return _state(blocking), _state(non_blocking)

    blocking, non_blocking = anyio.run(made, backend="asyncio")
    assert blocking == non_blocking == {"last_error", "lease", "lost", "reason"}


def _state(keeper: object) -> set[str]:
    return {n for n in vars(keeper) if not n.startswith("_")}


def test_the_differences_named_here_are_real() -> None:
    """A name that stopped differing should leave this file's lists."""
    assert "close" in public(Client) and "aclose" in public(AsyncClient)
    assert "close" not in public(AsyncClient) and "aclose" not in public(Client)
    assert set(public(KeepAlive)) >= THREADS_ONLY
    assert not THREADS_ONLY & set(public(AsyncKeepAlive))
    assert set(public(AsyncClient)) >= NO_IO
