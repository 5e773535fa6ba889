"""A trace backend for tests: an OTLP/HTTP receiver on 127.0.0.1 that keeps the spans.

It answers POST /v1/traces (protobuf ExportTraceServiceRequest, as the OpenTelemetry
exporter sends) by decoding the request with opentelemetry-proto and keeping every span
as a ``ReceivedSpan``. Tests wait for spans with ``wait_for`` (an event, bounded by a
timeout), never by sleeping. ``with OtlpReceiver() as receiver:`` starts and stops it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

MAX_BODY = 8 * 1024 * 1024


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode_export(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ExportTraceServiceRequest."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces" or not 0 <= length <= MAX_BODY:
                    self.send_response(404)
                    self.end_headers()
                    return
                spans = decode_export(self.rfile.read(length))
                with receiver._changed:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                    receiver._changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL, for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter adds /v1/traces)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans received, once ``found`` holds of them; AssertionError at the timeout."""
        with self._changed:
            if not self._changed.wait_for(lambda: found(list(self.spans)), timeout):
                names = sorted({(s.service, s.name) for s in self.spans})
                raise AssertionError(f"spans not received within {timeout}s; got {names}")
            return list(self.spans)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@contextlib.contextmanager
def tracing_to_a_receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on in this process (dlm/tracing.py), exporting to a test receiver; off
    again afterwards. Skips the test where the SDK is not installed."""
    from dlm import tracing

    pytest.importorskip("opentelemetry.sdk")
    with OtlpReceiver() as backend:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", backend.endpoint)
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        monkeypatch.setattr(tracing, "_tracer", None)
        monkeypatch.setattr(tracing, "_provider", None)
        try:
            yield backend
        finally:
            tracing.shutdown()
