"""The /metrics endpoint alone: a MetricsListener on 127.0.0.1 with a registry of our own,
spoken to over raw TCP, with its limits lowered where waiting them out would be slow; the
member's collector on an in-process NodeServer; and a member told to serve metrics without
prometheus-client."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from dlm import tls
from dlm.node.raft.memory import MemoryStorage
from dlm.node.runtime.config.node_config import NodeConfig
from dlm.node.runtime.log import Logger
from dlm.node.runtime.main import EXIT_CONFIG, EXIT_FAILURE, EXIT_USAGE, start_node
from dlm.node.runtime.metrics import METRIC_HELP, REQUEST_LIMIT, MetricsListener, registry_for
from dlm.node.runtime.server import NodeServer
from dlm.records import ConfState
from tests.pki import OPENSSL, make_pki

pytestmark = pytest.mark.anyio

DEADLINE = 5.0
"""Seconds any one exchange may take before the test fails."""


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    Counter("test_things", "Things counted.", registry=registry).inc(3)
    return registry


@asynccontextmanager
async def _listening(
    registry: CollectorRegistry | None = None, **limits: float
) -> AsyncIterator[MetricsListener]:
    listener = MetricsListener(registry or _registry(), **limits)  # type: ignore[arg-type]
    await listener.start("127.0.0.1", 0)
    try:
        yield listener
    finally:
        listener.close()


async def _exchange(port: int, request: bytes) -> bytes:
    """Sends ``request`` and reads until the endpoint closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _body(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


async def test_get_metrics_is_the_text_exposition_of_the_registry() -> None:
    async with _listening() as listener:
        response = await _exchange(listener.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status(response) == 200
    assert b"Content-Type: text/plain; version=0.0.4" in response
    families = {f.name: f for f in text_string_to_metric_families(_body(response).decode())}
    assert families["test_things"].samples[0].value == 3.0
    length = int(response.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
    assert length == len(_body(response))


async def test_a_query_string_is_ignored_and_head_gets_no_body() -> None:
    async with _listening() as listener:
        get = await _exchange(listener.port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")
        head = await _exchange(listener.port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert _status(get) == 200 and _status(head) == 200
    assert _body(head) == b"" and b"Content-Length: 0" not in head


async def test_other_paths_are_404() -> None:
    async with _listening() as listener:
        for path in (b"/", b"/metrics/", b"/favicon.ico", b"/metricsx"):
            response = await _exchange(listener.port, b"GET %s HTTP/1.1\r\n\r\n" % path)
            assert _status(response) == 404, path
            assert _body(response) == b"metrics are at /metrics\n"


async def test_other_methods_are_405_with_allow() -> None:
    async with _listening() as listener:
        for method in (b"POST", b"PUT", b"DELETE", b"OPTIONS"):
            response = await _exchange(listener.port, b"%s /metrics HTTP/1.1\r\n\r\n" % method)
            assert _status(response) == 405, method
            assert b"Allow: GET, HEAD\r\n" in response


async def test_what_is_not_http_is_400() -> None:
    async with _listening() as listener:
        for junk in (b"\r\n\r\n", b"GET\r\n\r\n", b"GET /metrics\r\n\r\n", b"\x00\x01 x y\r\n\r\n"):
            assert _status(await _exchange(listener.port, junk)) == 400, junk


async def test_a_request_over_the_size_limit_is_refused_at_the_limit() -> None:
    """431 as soon as the limit is passed, not after the timeout: the reader stops there."""
    async with _listening(request_timeout=30.0) as listener:
        padding = b"X-Pad: " + b"a" * REQUEST_LIMIT + b"\r\n"
        unfinished = b"GET /metrics HTTP/1.1\r\n" + padding  # no blank line: never complete
        response = await _exchange(listener.port, unfinished)
        assert _status(response) == 431
        finished = unfinished + b"\r\n"
        assert _status(await _exchange(listener.port, finished)) == 431
        small = b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 4000 + b"\r\n\r\n"
        assert _status(await _exchange(listener.port, small)) == 200


async def test_a_connection_that_says_nothing_is_closed_after_the_timeout() -> None:
    async with _listening(request_timeout=0.2) as listener:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        try:
            started = asyncio.get_running_loop().time()
            assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
            waited = asyncio.get_running_loop().time() - started
        finally:
            writer.close()
    assert 0.15 <= waited < DEADLINE


async def test_a_request_sent_slowly_is_cut_at_the_timeout() -> None:
    async with _listening(request_timeout=0.3) as listener:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        try:
            for byte in b"GET /metrics HTTP/1.1\r\n":  # bounded: 23 bytes
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)  # the trickle itself, not synchronisation
                if reader.at_eof():
                    break
            assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
        finally:
            writer.close()


async def test_a_flood_of_idle_connections_does_not_lock_the_scraper_out() -> None:
    async with _listening(max_connections=8, request_timeout=30.0) as listener:
        idle = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(20)]
        try:
            for _ in range(3):
                response = await _exchange(listener.port, b"GET /metrics HTTP/1.1\r\n\r\n")
                assert _status(response) == 200
            assert listener.evicted >= 12
            # The oldest idle connections were the ones closed.
            first_reader = idle[0][0]
            assert await asyncio.wait_for(first_reader.read(), DEADLINE) == b""
        finally:
            for _, writer in idle:
                writer.close()


class _Broken(Collector):
    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("test_fine", "Fine.", value=1)
        raise RuntimeError("collector bug")


async def test_a_failing_collector_is_a_500_and_a_log_line_not_a_dead_endpoint() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Broken())
    out = io.StringIO()
    listener = MetricsListener(registry, log=Logger("n1", stream=out))
    await listener.start("127.0.0.1", 0)
    try:
        response = await _exchange(listener.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert _status(response) == 500 and b"collector bug" in _body(response)
        assert _status(await _exchange(listener.port, b"GET / HTTP/1.1\r\n\r\n")) == 404
    finally:
        listener.close()
    record = json.loads(out.getvalue().splitlines()[0])
    assert record["event"] == "metrics_failed" and "collector bug" in record["error"]


def test_without_prometheus_client_the_member_says_so_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "prometheus_client" else real_find_spec(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    settings = {"metrics_listen": "127.0.0.1:9", "data": str(tmp_path / "data")}
    assert start_node(settings) == EXIT_FAILURE
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "--metrics-listen needs the prometheus-client package" in err
    assert not (tmp_path / "data").exists()  # refused before touching anything


async def test_the_collector_serves_every_metric_it_names(tmp_path: Path) -> None:
    """A member that has not served yet (a follower of a 3-member cluster, on
    MemoryStorage): every family of METRIC_HELP is there, with its help text."""
    config = NodeConfig.from_flags(
        node_id="n1",
        listen="127.0.0.1:7701",
        peers="n1=127.0.0.1:7701,n2=127.0.0.1:7702,n3=127.0.0.1:7703",
        data=str(tmp_path),
        cluster="test",
    )
    server = NodeServer(config, MemoryStorage(ConfState(voters=config.voters)))
    text = generate_latest(registry_for(server)).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name, help_text in METRIC_HELP.items():
        family = families.get(name.removesuffix("_total"))
        assert family is not None, f"{name} is not served"
        assert family.documentation == help_text
        assert (family.type == "counter") == name.endswith("_total"), name
    assert families["process_cpu_seconds"].type == "counter"
    role = {s.labels["role"]: s.value for s in families["dlm_raft_role"].samples}
    assert role["follower"] == 1 and sum(role.values()) == 1
    assert not families["dlm_peer_reachable"].samples  # a follower does not judge its peers
    (build,) = families["dlm_build_info"].samples
    assert build.labels["version"] and build.value == 1


# ------------------------------------------------------------------ who may scrape


async def test_with_a_token_a_scrape_must_carry_it_as_a_bearer_token() -> None:
    async with _listening(token=b"s3cret-token") as listener:  # type: ignore[arg-type]
        port = listener.port
        bare = await _exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        wrong = await _exchange(
            port, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret-tokem\r\n\r\n"
        )
        basic = await _exchange(
            port, b"GET /metrics HTTP/1.1\r\nAuthorization: Basic s3cret-token\r\n\r\n"
        )
        right = await _exchange(
            port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nauthorization: bearer s3cret-token\r\n\r\n"
        )
        assert listener.unauthorized == 3
    for refused in (bare, wrong, basic):
        assert _status(refused) == 401 and b"WWW-Authenticate: Bearer\r\n" in refused
        assert b"test_things" not in refused
    assert _status(right) == 200 and b"test_things_total 3.0" in _body(right)


def test_a_bare_port_for_metrics_is_a_usage_error_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = {"metrics_listen": "9464", "data": str(tmp_path / "data")}
    assert start_node(settings) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "--metrics-listen 9464 is a bare port: give HOST:PORT, e.g. 127.0.0.1:9464" in err
    assert not (tmp_path / "data").exists()


def test_metrics_beyond_loopback_without_a_credential_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = {"metrics_listen": "0.0.0.0:9464", "data": str(tmp_path / "data")}
    assert start_node(settings) == EXIT_CONFIG
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--metrics-token-file" in err and "--insecure" in err
    assert not (tmp_path / "data").exists()


@pytest.mark.skipif(OPENSSL is None, reason="the openssl command is not installed")
async def test_with_the_members_tls_a_scraper_needs_a_certificate_the_ca_signed(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki", ["n1"])
    served = tls.server_context(
        str(pki / "n1.crt"), str(pki / "n1.key"), str(pki / "ca.crt"), require_client_cert=True
    )
    with_cert = tls.client_context(
        str(pki / "ca.crt"), str(pki / "client.crt"), str(pki / "client.key")
    )
    without = tls.client_context(str(pki / "ca.crt"))
    rogue = tls.client_context(
        str(pki / "ca.crt"), str(pki / "rogue-n2.crt"), str(pki / "rogue-n2.key")
    )
    async with _listening(tls=served) as listener:  # type: ignore[arg-type]

        async def scrape(context: ssl.SSLContext) -> bytes:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", listener.port, ssl=context, server_hostname="n1"
            )
            try:
                writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
                await writer.drain()
                return await asyncio.wait_for(reader.read(), DEADLINE)
            finally:
                writer.close()

        assert _status(await scrape(with_cert)) == 200
        for refused in (without, rogue):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                response = await scrape(refused)
                # TLS 1.3 may report the refused certificate only at the first read.
                assert response == b""
                raise ConnectionError("closed without an answer")
