"""The hello's ``trace`` field (issue 30): members of this release and of the previous
one (tests/compat) take a hello that carries it, and a bad one is refused in one line.

A traced client puts its trace context in its hello so that a gateway on the way can
make its routing span a child of the client's; members do nothing with it, so it must
never cost a client its connection to a member that does not know the field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlm import wire
from tests import compat

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_traced_hello_round_trips_and_an_untraced_one_leaves_the_field_out() -> None:
    traced = wire.Hello(wire.HelloRole.CLIENT, trace=TRACEPARENT)
    assert traced.to_wire()["trace"] == TRACEPARENT
    assert wire.Hello.from_wire(traced.to_wire()) == traced
    assert "trace" not in wire.Hello(wire.HelloRole.CLIENT).to_wire()
    assert wire.Hello.from_wire(wire.Hello(wire.HelloRole.CLIENT).to_wire()).trace is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("00-" + "0" * 32 + "-b7ad6b7169203331-01", "trace id must not be all zeros"),
        (TRACEPARENT.upper(), "lowercase hex"),
        (7, "must be a string"),
    ],
)
def test_a_hello_with_a_bad_trace_is_refused_in_one_line(value: object, says: str) -> None:
    frame = {**wire.Hello(wire.HelloRole.CLIENT).to_wire(), "trace": value}
    with pytest.raises(wire.ProtocolError, match=says) as refused:
        wire.Hello.from_wire(frame)
    assert "\n" not in str(refused.value)


def test_a_member_of_the_previous_release_takes_a_traced_hello(tmp_path: Path) -> None:
    """The previous release's member decodes a hello with Hello.from_wire, which reads the
    fields it knows and passes over the others: a traced client still connects."""
    old = compat.extract(tmp_path / "previous")
    frame = wire.Hello(wire.HelloRole.CLIENT, trace=TRACEPARENT).to_wire()
    program = (
        "import json, sys\n"
        "from dlm.wire import Hello\n"
        "hello = Hello.from_wire(json.loads(sys.argv[1]))\n"
        "print(hello.role.value, hello.version)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, json.dumps(frame)],
        env={"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["client", "1"]
