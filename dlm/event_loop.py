"""Which event loop dlm's long-running processes run on, and a transport's socket on either.

A member (`dlm node start`), the supervisor of a partitioned member and `dlm gateway`
run on asyncio's own loop, or on uvloop (a C implementation of that loop, where it is
installed) with ``DLM_EVENT_LOOP=uvloop``; an unknown value, or ``uvloop`` where it is
not installed, is refused in one line before the process starts
(``EventLoopChoiceError``). Client commands never come here: they run no loop of this
kind, and ``import uvloop`` is only ever done by ``loop_factory``.

asyncio is the default, uvloop installed or not: measured beside each other
(bench/results/ab.md, "uvloop"), members on uvloop were no faster (c=1 pair p50 0.95x to
1.19x asyncio's, c=64 server CPU per pair 0.93x to 1.05x, in three runs) and spent more
server CPU per keep-alive (109-150 µs against 81-88), short of issue 29's bar for a new
dependency (c=1 pair p50 15 % better, or c=64 CPU per pair 25 %).

uvloop's transports are not subclasses of ``asyncio.Transport``, and the socket a closed
uvloop transport reports answers every option with ValueError rather than asyncio's
OSError; ``open_socket`` is how the runtime reaches a transport's socket on both.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing stays off the import path of the commands that load this
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Coroutine, Mapping
    from typing import Any, TypeVar

    T = TypeVar("T")

ENV = "DLM_EVENT_LOOP"
ASYNCIO = "asyncio"
UVLOOP = "uvloop"
CHOICES = (ASYNCIO, UVLOOP)
DEFAULT = ASYNCIO
"""The loop when ``DLM_EVENT_LOOP`` is unset (the module's docstring says why)."""


class EventLoopChoiceError(ValueError):
    """``DLM_EVENT_LOOP`` cannot be honoured; the message is the one line to print."""


def uvloop_installed() -> bool:
    """uvloop can be imported here (found without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(UVLOOP) is not None
    except (ImportError, ValueError):
        return False


def chosen_loop(environ: Mapping[str, str] | None = None) -> str:
    """The loop named by ``DLM_EVENT_LOOP`` (unset or empty: ``DEFAULT``); raises
    EventLoopChoiceError for a name it cannot run."""
    given = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    if not given:
        return DEFAULT
    if given not in CHOICES:
        raise EventLoopChoiceError(
            f"{ENV} must be {ASYNCIO} or {UVLOOP}, not {given!r}: "
            f"unset it to run on {DEFAULT}'s own loop"
        )
    if given == UVLOOP and not uvloop_installed():
        raise EventLoopChoiceError(
            f"{ENV}={UVLOOP} but uvloop is not installed: pip install uvloop, "
            f"or set {ENV}={ASYNCIO}"
        )
    return given


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes a loop of ``name`` (None: asyncio's default)."""
    if name != UVLOOP:
        return None
    try:
        import uvloop
    except ImportError as exc:  # found, yet broken: say so rather than run on another loop
        raise EventLoopChoiceError(
            f"uvloop is installed but cannot be imported ({exc}): reinstall it, "
            f"or set {ENV}={ASYNCIO}"
        ) from None
    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_loop


def run(name: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())`` on the loop ``name`` (``main`` is called once the loop is
    known to exist, so a refusal leaves no coroutine un-awaited)."""
    import asyncio

    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(main())


def running_loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """Which loop ``loop`` is, for the start-up log line."""
    return UVLOOP if type(loop).__module__.startswith(UVLOOP) else ASYNCIO


def timer_floor(loop: asyncio.AbstractEventLoop) -> float:
    """The shortest wait worth asking ``loop`` for, in seconds.

    uvloop (libuv) keeps timers in whole milliseconds, counted from a clock read once per
    turn of the loop: a wait under half a millisecond rounds to none, and a wait that ends
    a little early by ``time.monotonic`` is asked for again and again until that clock
    catches up. A 10 ms sleep to a ``time.monotonic`` deadline took 16 to 35 wakes there
    (measured), and 1.3 with waits of at least 1 ms; asyncio's loop keeps the float and
    took 1."""
    return 0.001 if running_loop_name(loop) == UVLOOP else 0.0


def open_socket(transport: asyncio.BaseTransport) -> Any:
    """The socket under ``transport`` while it is open; None once it is closing or
    closed (nothing to probe or tune then), or where the transport has none."""
    if transport.is_closing():
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return None
    return sock
