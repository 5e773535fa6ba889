"""A member's spans of traced requests, exported with OpenTelemetry when tracing is on.

The pure machine records the spans of requests that carry a trace context
(dlm/node/spans.py) and hands each answered request's spans out as an ExportSpans
action, with monotonic times. Here they are placed on the wall clock by the action's
anchor (an Instant: a monotonic reading and the wall clock at the same moment) and given
to dlm/tracing.py, whose batch processor sends them from its own thread, so a slow or
absent trace backend never holds up the event loop. When tracing is off (not installed,
no OTLP endpoint, or OTEL_SDK_DISABLED) ``exporter`` returns None and the runtime drops
the actions; OpenTelemetry is then never imported.
"""

from __future__ import annotations

from collections.abc import Callable

from dlm import tracing
from dlm.node.outbox import ExportSpans

SERVICE = "dlm-node"


def exporter() -> Callable[[ExportSpans], None] | None:
    """What to do with each ExportSpans action, or None when tracing is off."""
    if not tracing.configured() or not tracing.enabled(SERVICE, batch=True):
        return None

    def export(action: ExportSpans) -> None:
        anchor = action.anchor
        base_ns = anchor.wall_ms * 1_000_000

        def to_ns(mono: float) -> int:
            return base_ns + round((mono - anchor.mono) * 1e9)

        try:
            tracing.export_finished(action.spans, to_ns)
        except Exception:
            global failed_exports
            failed_exports += 1

    return export


failed_exports = 0
"""Span batches the SDK failed to take (it reports its own export failures itself)."""


def stop() -> None:
    """Sends what is still buffered, briefly: the member is stopping."""
    tracing.flush(timeout_s=2.0)
