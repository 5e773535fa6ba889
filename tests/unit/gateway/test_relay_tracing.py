"""The gateway's routing span (issue 30): a traced client's hello makes the gateway record
``dlm.gateway.route`` as the child of the client's context, the bytes relayed unchanged;
no span without a trace, past the hello cap, or with TLS; with tracing off the gateway
imports no OpenTelemetry module."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlm.gateway.relay import HELLO_CAP, NOTICE, ROUTE_SPAN
from dlm.partitioning import preamble, target_preamble
from dlm.wire import Hello, HelloRole, encode_frame
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan, tracing_to_a_receiver
from tests.unit.gateway.test_relay import _open, _read_all, relay

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID, PARENT_SPAN = PARENT.split("-")[1:3]
TRACED_HELLO = encode_frame(Hello(HelloRole.CLIENT, trace=PARENT).to_wire())


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on in this process, exporting to a test receiver; off again afterwards."""
    with tracing_to_a_receiver(monkeypatch) as backend:
        yield backend


async def _through(address: str, sent: bytes) -> bytes:
    """Sends ``sent`` through the gateway, half-closes, and returns all that came back."""
    reader, writer = await _open(address)
    writer.write(sent)
    writer.write_eof()
    got = await _read_all(reader)
    writer.close()
    return got


def _routes(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == ROUTE_SPAN]


def test_a_traced_hello_gets_a_routing_span_and_goes_on_unchanged(
    receiver: OtlpReceiver,
) -> None:
    async def scenario() -> str:
        async with relay() as (address, member, _):
            sent = target_preamble(2, member.address) + TRACED_HELLO + b"after"
            got = await _through(address, sent)
            assert got == NOTICE + b"hi" + (preamble(2) + TRACED_HELLO + b"after").upper()
            assert member.received == [preamble(2) + TRACED_HELLO + b"after"]
            return member.address

    member = asyncio.run(scenario())
    (route,) = _routes(receiver.wait_for(lambda spans: bool(_routes(spans))))
    assert (route.trace_id, route.parent_span_id, route.service) == (
        TRACE_ID,
        PARENT_SPAN,
        "dlm-gateway",
    )
    assert route.attributes == {
        "dlm.partition": 2,
        "dlm.targeted": True,
        "dlm.member": member,
        "dlm.dial_attempts": 1,
    }
    assert route.start_ns <= route.end_ns


def test_no_span_without_a_trace_past_the_cap_or_with_tls(receiver: OtlpReceiver) -> None:
    untraced = encode_frame(Hello(HelloRole.CLIENT).to_wire())
    too_long = (HELLO_CAP + 1).to_bytes(4, "big") + b"\xa0" * 10
    cut_short = TRACED_HELLO[:9]  # the client closes inside its hello

    async def scenario() -> None:
        async with relay() as (address, member, _):
            for sent in (untraced, too_long, b"\x16" + TRACED_HELLO, cut_short):
                await _through(address, sent)
            assert member.received == [untraced, too_long, b"\x16" + TRACED_HELLO, cut_short]
            # A last traced one, so that the receiver has something to wait for.
            await _through(address, TRACED_HELLO)

    asyncio.run(scenario())
    spans = receiver.wait_for(lambda spans: bool(_routes(spans)))
    assert len(_routes(spans)) == 1
    assert _routes(spans)[0].attributes["dlm.targeted"] is False


_GATEWAY_THEN_MODULES = """
import asyncio, json, sys
from tests.unit.gateway.test_relay import relay, _open, _read_all
from dlm.wire import Hello, HelloRole, encode_frame

async def scenario():
    async with relay() as (address, member, _):
        reader, writer = await _open(address)
        writer.write(encode_frame(Hello(HelloRole.CLIENT, trace=sys.argv[1]).to_wire()))
        writer.write_eof()
        await _read_all(reader)
        writer.close()
        return len(member.received)

relayed = asyncio.run(scenario())
print(json.dumps([relayed, sorted(m for m in sys.modules if m.startswith("opentelemetry"))]))
"""


def test_with_tracing_off_the_gateway_imports_no_opentelemetry() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEPARENT"))}
    done = subprocess.run(
        [sys.executable, "-c", _GATEWAY_THEN_MODULES, PARENT],
        env=env,
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [1, []]
