"""Warnings anyone on the network can cause at will, logged at most once a second each.

A member must say that it refuses hellos, fails authentications, sheds
connections or cannot accept (out of descriptors), but an attacker can make
each happen thousands of times a second, and a log that grows that fast hides
everything else and fills the disk. ``QuietLog.warning(event, **fields)``
writes the first occurrence of an event at once; later ones within the same
second are counted, and ``flush(now)`` (called from the member's timer) writes
one line for them when the second is over, with the fields of the latest and
``count``, the number of occurrences that line stands for.

``loop_exception_handler`` routes what asyncio reports through the event loop's
exception handler (a failed ``accept()``: EMFILE and the like; a transport's
fatal error) into the same budget, one line each instead of a traceback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dlm.node.runtime.log import Logger

INTERVAL_S = 1.0


class _Burst:
    __slots__ = ("fields", "logged_at", "unlogged")

    def __init__(self, logged_at: float) -> None:
        self.logged_at = logged_at
        self.unlogged = 0
        self.fields: dict[str, Any] = {}


class QuietLog:
    """At most one warning line per event per ``interval`` seconds, with a count."""

    def __init__(
        self,
        log: Logger,
        *,
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._interval = interval
        self._clock = clock
        self._bursts: dict[str, _Burst] = {}
        self.total = 0
        """Occurrences of every event so far, logged or not."""

    def warning(self, event: str, **fields: Any) -> None:
        self.total += 1
        now = self._clock()
        burst = self._bursts.get(event)
        if burst is None or now - burst.logged_at >= self._interval:
            count = 1 if burst is None else burst.unlogged + 1
            self._bursts[event] = _Burst(now)
            self._log.warning(event, **fields, count=count)
            return
        burst.unlogged += 1
        burst.fields = fields

    def flush(self, now: float | None = None) -> None:
        """Writes the count of every event whose second has ended since its last line."""
        now = self._clock() if now is None else now
        for event, burst in list(self._bursts.items()):
            if now - burst.logged_at < self._interval:
                continue
            if burst.unlogged:
                self._log.warning(event, **burst.fields, count=burst.unlogged)
                self._bursts[event] = _Burst(now)
            else:
                del self._bursts[event]


ACCEPT_FAILED = "socket.accept() out of system resource"


def loop_exception_handler(quiet: QuietLog) -> Callable[[Any, dict[str, Any]], None]:
    """An asyncio exception handler that reports through ``quiet``."""

    def handle(loop: Any, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "unexpected error in the event loop")
        exc = context.get("exception")
        error = f"{type(exc).__name__}: {exc}" if exc is not None else message
        if message == ACCEPT_FAILED:
            # asyncio stops accepting for a second and tries again; connections wait in
            # the backlog meanwhile (the descriptor budget in accepting.py keeps this rare).
            quiet.warning("accept_failed", error=error)
        else:
            quiet.warning("loop_error", message=message, error=error[:500])

    return handle
