"""Tracing with OpenTelemetry (OTLP over HTTP): the only module that imports it.

Tracing is on when three things hold: the optional extra is installed (``pip install
dlm[tracing]``: the OpenTelemetry SDK and its OTLP/HTTP exporter), an OTLP endpoint is
named (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and
OTEL_SDK_DISABLED is not ``true``. Everything else is configured by the standard OTEL_*
variables, which the SDK reads itself (service name: OTEL_SERVICE_NAME, else the
default the caller names: "dlm" for clients, "dlm-node" for members).

When tracing is off nothing here imports OpenTelemetry: the environment is looked at
first, so a client or member that traces nothing pays for a dictionary lookup, and
tests/unit/test_tracing.py checks that ``sys.modules`` holds no opentelemetry module
after a command.

The API is small on purpose (a gateway may use it as well): ``start_span`` (a span,
child of a W3C traceparent string), ``end_span``, ``traceparent_of`` (a span's context
to send on), ``export_finished`` (spans a member recorded, with their own times) and
``flush``. A span is an opaque handle; with tracing off ``start_span`` returns None and
the others accept None and do nothing.
"""

from __future__ import annotations

import os

from dlm.wire import traceparent_problem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACEPARENT_VARIABLE = "TRACEPARENT"

_tracer: Any = None
"""The SDK's tracer once loaded; False when loading found tracing off or not installed."""
_provider: Any = None


def configured(env: Mapping[str, str] | None = None) -> bool:
    """The environment asks for tracing (the SDK may still be missing: see ``enabled``)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def enabled(service: str = "dlm", *, batch: bool = False) -> bool:
    """Tracing is on: configured, and the SDK loaded (on the first call, which sets up the
    exporter; ``batch``: export from a background thread, as a long-lived member does,
    rather than when each span ends, as a short command does)."""
    global _tracer, _provider
    if _tracer is None:
        _tracer = False
        if configured():
            try:
                _tracer, _provider = _load(service, batch)
            except ImportError:
                _tracer = False
    return _tracer is not False


def _load(service: str, batch: bool) -> tuple[Any, Any]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or service
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    exporter = OTLPSpanExporter()
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return provider.get_tracer("dlm"), provider


def parent_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The TRACEPARENT a job was given (None when unset or empty); ValueError, one line
    saying what to do, when it is set but is no W3C traceparent."""
    env = os.environ if env is None else env
    value = env.get(TRACEPARENT_VARIABLE, "").strip()
    if not value:
        return None
    problem = traceparent_problem(value)
    if problem is not None:
        raise ValueError(
            f"{TRACEPARENT_VARIABLE} {value[:60]!r} is not usable: {problem}; "
            f"set it to a W3C traceparent or unset it"
        )
    return value


def _context_of(traceparent: str | None) -> Any:
    if traceparent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def start_span(
    name: str,
    parent: str | None,
    *,
    attributes: Mapping[str, Any] | None = None,
    start_ns: int | None = None,
    kind: str = "internal",
) -> Any:
    """A new span, child of the ``parent`` traceparent (a new trace when None); None when
    tracing is off. ``kind``: "internal", "client" or "server"."""
    if not enabled():
        return None
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(
        name,
        context=_context_of(parent),
        kind=SpanKind[kind.upper()],
        attributes=dict(attributes or {}),
        start_time=start_ns,
    )


def end_span(span: Any, *, end_ns: int | None = None, error: str | None = None) -> None:
    """Ends ``span`` (None: nothing to do); ``error``: why the work it stands for failed."""
    if span is None:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=end_ns)


def traceparent_of(span: Any) -> str | None:
    """The W3C traceparent naming ``span`` (None for None), to send as a child's parent."""
    if span is None:
        return None
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def export_finished(spans: Iterable[Any], to_ns: Any) -> None:
    """Exports spans a member recorded (dlm.node.spans.FinishedSpan: name, local id,
    parent's local id or None for the request's remote parent, start, end, attributes).
    ``to_ns(instant)`` turns a recorded time into ns since the epoch. Parents come
    before their children in ``spans``."""
    if not enabled("dlm-node", batch=True):
        return
    made: dict[int, Any] = {}
    from opentelemetry.trace import SpanKind, set_span_in_context

    for span in spans:
        parent = made.get(span.parent) if span.parent is not None else None
        context = (
            set_span_in_context(parent) if parent is not None else _context_of(span.traceparent)
        )
        made[span.local_id] = sdk_span = _tracer.start_span(
            span.name,
            context=context,
            kind=SpanKind.SERVER if span.parent is None else SpanKind.INTERNAL,
            attributes=dict(span.attributes),
            start_time=to_ns(span.start),
        )
        sdk_span.end(end_time=to_ns(span.end))


class CommandSpan:
    """The span of one client command (``dlm acquire``, ``dlm exec``, a Python API lock),
    child of the TRACEPARENT it was given. ``traceparent`` is what its requests carry:
    its own span's context when tracing is on; else the given TRACEPARENT unchanged, so
    that the members' spans still join the job's trace; else None.

    ``with CommandSpan("dlm.acquire") as traceparent:`` ends the span when the block
    does (an error if it raised) and sends it before returning."""

    __slots__ = ("flush", "span", "traceparent")

    def __init__(
        self, name: str, parent: str | None = None, *, from_env: bool = True, flush: bool = True
    ) -> None:
        if parent is None and from_env:
            parent = parent_from_env()
        self.span = start_span(name, parent, kind="client")
        self.traceparent = traceparent_of(self.span) or parent
        self.flush = flush
        """Send the span as it ends (a command about to exit), rather than with the next
        batch (a program using the Python API goes on)."""

    def end(self, error: str | None = None) -> None:
        if self.span is not None:
            span, self.span = self.span, None
            end_span(span, error=error)
            if self.flush:
                flush()

    def __enter__(self) -> str | None:
        return self.traceparent

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, *_: Any
    ) -> None:
        failed = kind is not None and not issubclass(kind, SystemExit | KeyboardInterrupt)
        self.end(f"{kind.__name__}: {exc}"[:200] if failed and kind is not None else None)


_command_spans: list[CommandSpan] = []


def end_with_command(span: CommandSpan) -> None:
    """``span`` ends as the command exits (``end_commands``, which dlm.cli.main calls)."""
    _command_spans.append(span)


def end_commands() -> None:
    """Ends (and sends) the spans of the command that is exiting."""
    while _command_spans:
        _command_spans.pop().end()


def flush(timeout_s: float = 5.0) -> None:
    """Sends what is still buffered (a command calls this before it exits)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Flushes and stops the exporter (a member calls this as it stops)."""
    if _provider is not None:
        _provider.shutdown()
