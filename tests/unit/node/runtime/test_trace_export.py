"""runtime/trace_export.py: a member exports its recorded spans only when tracing is on."""

from __future__ import annotations

import pytest

from dlm import tracing
from dlm.node.outbox import ExportSpans, FinishedSpan, Instant
from dlm.node.runtime import trace_export

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_with_no_endpoint_the_member_drops_its_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in tracing.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert trace_export.exporter() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert trace_export.exporter() is None


def test_recorded_times_are_placed_on_the_wall_clock_by_the_anchor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.setattr(tracing, "enabled", lambda *_, **__: True)
    seen: list[tuple[str, int, int]] = []

    def export_finished(spans: list[FinishedSpan], to_ns: object) -> None:
        assert callable(to_ns)
        seen.extend((s.name, to_ns(s.start), to_ns(s.end)) for s in spans)

    monkeypatch.setattr(tracing, "export_finished", export_finished)
    export = trace_export.exporter()
    assert export is not None
    span = FinishedSpan("dlm.request", 1, None, TRACE, 100.25, 100.5, ())
    export(ExportSpans((span,), Instant(mono=100.0, wall_ms=1_700_000_000_000)))
    assert seen == [("dlm.request", 1_700_000_000_250_000_000, 1_700_000_000_500_000_000)]
