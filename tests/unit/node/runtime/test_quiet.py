"""Warnings the network can cause are logged once a second each, with a count; asyncio's
accept errors too, as one line instead of a traceback per failed accept."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from typing import Any

from dlm.node.runtime.log import Logger
from dlm.node.runtime.quiet import ACCEPT_FAILED, QuietLog, loop_exception_handler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def quiet_log() -> tuple[QuietLog, io.StringIO, Clock]:
    stream = io.StringIO()
    clock = Clock()
    return QuietLog(Logger("n1", stream=stream), clock=clock), stream, clock


def test_one_line_per_second_per_event_with_the_count() -> None:
    quiet, stream, clock = quiet_log()
    for _ in range(1000):
        quiet.warning("auth_failed", remote="10.0.0.9:4000")
        quiet.warning("bad_hello", remote="10.0.0.9:4001")
        clock.now += 0.001  # 1,000 of each within a second
    assert [(e["event"], e["count"]) for e in events(stream)] == [
        ("auth_failed", 1),
        ("bad_hello", 1),
    ]
    clock.now += 1.0
    quiet.flush()
    logged = events(stream)[2:]
    assert [(e["event"], e["count"]) for e in logged] == [("auth_failed", 999), ("bad_hello", 999)]
    assert quiet.total == 2000
    # Quiet again: nothing more, and the next occurrence is logged at once.
    clock.now += 5.0
    quiet.flush()
    assert len(events(stream)) == 4
    quiet.warning("auth_failed", remote="x")
    assert events(stream)[-1]["count"] == 1


def test_the_loop_handler_turns_accept_errors_into_counted_lines() -> None:
    quiet, stream, clock = quiet_log()
    handle = loop_exception_handler(quiet)
    error = OSError(24, "Too many open files")
    for _ in range(50):
        handle(None, {"message": ACCEPT_FAILED, "exception": error})
    handle(None, {"message": "Fatal error on transport", "exception": ValueError("x")})
    clock.now += 2.0
    quiet.flush()
    got = [(e["event"], e["count"]) for e in events(stream)]
    assert got == [("accept_failed", 1), ("loop_error", 1), ("accept_failed", 49)]
    assert events(stream)[0]["error"] == "OSError: [Errno 24] Too many open files"


SERVER = textwrap.dedent(
    """
    import asyncio, resource, socket, sys, time
    from dlm.node.runtime.log import Logger
    from dlm.node.runtime.quiet import QuietLog, loop_exception_handler

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    async def main():
        loop = asyncio.get_running_loop()
        if sys.argv[1] == "quiet":
            quiet = QuietLog(Logger("n1"))
            loop.set_exception_handler(loop_exception_handler(quiet))
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            if sys.argv[1] == "quiet":
                quiet.flush()
        server.close()

    asyncio.run(main())
    """
)


def run_flooded_server(mode: str) -> str:
    """A server with 64 descriptors (so accept fails with EMFILE), flooded for 3 s."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        import socket

        held = []
        for _ in range(150):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2.0))
            except OSError:
                break
        _, err = proc.communicate(timeout=30)
        for sock in held:
            sock.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    return err


def test_asyncio_alone_logs_a_traceback_per_failed_accept_and_ours_does_not() -> None:
    plain = run_flooded_server("plain")
    assert plain.count("Traceback") >= 1  # what a member used to write, per failed accept
    quiet = run_flooded_server("quiet")
    assert "Traceback" not in quiet
    lines = [json.loads(line) for line in quiet.splitlines()]
    # On a loaded host the flood can also surface other loop errors (connections reset
    # mid-accept): those go through the same quiet log, one line a second at most too.
    kinds = [e["event"] for e in lines]
    assert "accept_failed" in kinds and set(kinds) <= {"accept_failed", "loop_error"}, kinds
    assert len(lines) <= 16, kinds  # each kind: one line (with its count) a second, for 3 s
    assert sum(e["count"] for e in lines if e["event"] == "accept_failed") >= 1
