"""dlm/tracing.py: on only when installed and configured, never imported when off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dlm import tracing
from tests.otlp_receiver import OtlpReceiver, tracing_to_a_receiver

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID, PARENT_SPAN = PARENT.split("-")[1:3]


def _otel_env_removed() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEPARENT"))}


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1", "OTEL_SDK_DISABLED": "false"}, True),
        ({"TRACEPARENT": PARENT}, False),
    ],
)
def test_tracing_is_configured_only_by_an_endpoint_and_not_disabled(
    env: dict[str, str], on: bool
) -> None:
    assert tracing.configured(env) is on


def test_a_bad_traceparent_in_the_environment_is_one_line_saying_what_to_do() -> None:
    assert tracing.parent_from_env({}) is None
    assert tracing.parent_from_env({"TRACEPARENT": " "}) is None
    assert tracing.parent_from_env({"TRACEPARENT": PARENT}) == PARENT
    with pytest.raises(ValueError, match="TRACEPARENT 'nonsense' is not usable") as caught:
        tracing.parent_from_env({"TRACEPARENT": "nonsense"})
    assert "\n" not in str(caught.value) and "unset it" in str(caught.value)


_COMMAND_THEN_MODULES = """
import json, sys
from dlm.cli.main import run
code = run(sys.argv[1:])
print(json.dumps([code, sorted(m for m in sys.modules if m.startswith("opentelemetry"))]))
"""


def _run_command(env: dict[str, str], *args: str) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", _COMMAND_THEN_MODULES, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    code, modules = json.loads(done.stdout.strip().splitlines()[-1])
    return code, modules, done.stderr


# Nothing listens on port 1: the command fails at once, after it made its client.
UNREACHABLE = ("--cluster", "127.0.0.1:1", "--timeout", "1s", "--dial-timeout", "0.5s")


@pytest.mark.parametrize(
    "command", [["acquire", "jobs/a"], ["exec", "--lock", "jobs/a", "--", "true"]]
)
def test_with_tracing_off_no_opentelemetry_module_is_loaded(command: list[str]) -> None:
    env = _otel_env_removed() | {"TRACEPARENT": PARENT}
    code, modules, stderr = _run_command(env, *UNREACHABLE, *command)
    assert code not in (0, 2), stderr  # it ran as far as the cluster
    assert modules == []
    # Disabled by OTEL_SDK_DISABLED: the endpoint is not enough.
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}
    code, modules, _ = _run_command(env, *UNREACHABLE, *command)
    assert code != 0 and modules == []


def test_a_command_given_a_bad_traceparent_refuses_it_in_one_line() -> None:
    env = _otel_env_removed() | {"TRACEPARENT": "00-zz"}
    code, _, stderr = _run_command(env, *UNREACHABLE, "acquire", "jobs/a")
    assert code == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "TRACEPARENT '00-zz' is not usable" in lines[0], stderr


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on in this process, exporting to a test receiver; off again afterwards."""
    with tracing_to_a_receiver(monkeypatch) as backend:
        yield backend


def test_a_command_span_is_a_child_of_the_given_parent_and_its_context_is_sent_on(
    receiver: OtlpReceiver,
) -> None:
    span = tracing.CommandSpan("dlm.acquire", PARENT, from_env=False)
    sent = span.traceparent
    assert sent is not None and sent != PARENT
    assert sent.split("-")[1] == TRACE_ID  # the same trace, a new span
    span.end()
    got = receiver.wait_for(lambda spans: any(s.name == "dlm.acquire" for s in spans))
    (mine,) = [s for s in got if s.name == "dlm.acquire"]
    assert (mine.trace_id, mine.parent_span_id, mine.span_id) == (
        TRACE_ID,
        PARENT_SPAN,
        sent.split("-")[2],
    )
    assert mine.service == "dlm"


class _Recorded:
    def __init__(self, name: str, local_id: int, parent: int | None, start: int, end: int) -> None:
        self.name, self.local_id, self.parent = name, local_id, parent
        self.traceparent = PARENT
        self.start, self.end = start, end
        self.attributes: dict[str, Any] = {"dlm.index": local_id}


def test_a_members_recorded_spans_are_exported_as_one_tree_with_their_own_times(
    receiver: OtlpReceiver,
) -> None:
    assert tracing.enabled("dlm-node", batch=True)
    recorded = [
        _Recorded("dlm.request", 1, None, 100, 900),
        _Recorded("raft.proposal", 2, 1, 200, 700),
        _Recorded("wal.fsync", 3, 2, 300, 400),
    ]
    tracing.export_finished(recorded, lambda t: 1_000_000_000 + t)
    tracing.flush()
    got = receiver.wait_for(lambda spans: len(spans) >= 3)
    by_name = {s.name: s for s in got}
    assert {s.trace_id for s in got} == {TRACE_ID}
    assert by_name["dlm.request"].parent_span_id == PARENT_SPAN
    assert by_name["raft.proposal"].parent_span_id == by_name["dlm.request"].span_id
    assert by_name["wal.fsync"].parent_span_id == by_name["raft.proposal"].span_id
    assert (by_name["wal.fsync"].start_ns, by_name["wal.fsync"].end_ns) == (
        1_000_000_300,
        1_000_000_400,
    )
    assert by_name["wal.fsync"].attributes == {"dlm.index": 3}
    assert by_name["dlm.request"].service == "dlm-node"
