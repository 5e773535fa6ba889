"""A traced client says its trace context in each connection's hello (issue 30), for a
gateway on the way to parent its routing span; an untraced client's hello leaves it
out. The blocking client and both async transports."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from dlm.client import aio
from dlm.client.aio import AsyncClient
from dlm.client.sync import Client
from dlm.wire import ok

from .doubles import scripted_member

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _answer(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [ok(request["id"], node="double", role="leader")]


@pytest.mark.parametrize("trace", [PARENT, None])
def test_the_blocking_clients_hello_carries_its_trace(trace: str | None) -> None:
    with scripted_member(_answer) as double, Client(double.addr, timeout=5.0) as c:
        c.trace = trace
        assert c.status().node == "double"
        (hello,) = double.hellos
    assert hello.get("trace") == trace
    assert ("trace" in hello) == (trace is not None)


@pytest.mark.parametrize("native", [True, False], ids=["asyncio", "anyio"])
@pytest.mark.parametrize("trace", [PARENT, None])
def test_the_async_clients_hello_carries_its_trace(
    trace: str | None, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aio, "NATIVE_ASYNCIO", native)

    async def status(addr: str) -> str | None:
        async with AsyncClient(addr, timeout=5.0) as c:
            c.trace = trace
            return (await c.status()).node

    with scripted_member(_answer) as double:
        assert anyio.run(status, double.addr) == "double"
        (hello,) = double.hellos
    assert ("trace" in hello) == (trace is not None)
    assert hello.get("trace") == trace
