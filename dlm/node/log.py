"""Structured logs for a node: one JSON object per line on stderr.

Each line carries ``ts`` (Unix seconds, millisecond precision), ``level``,
``node``, ``event`` (a short snake_case name an operator can grep for) and
the event's own fields. The level check happens before anything is
formatted, so a disabled ``debug`` call on the hot path costs one compare.
The level comes from ``DLM_LOG_LEVEL`` (debug, info, warning, error;
default info).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO

DEBUG = 10
INFO = 20
WARNING = 30
ERROR = 40

_LEVELS = {"debug": DEBUG, "info": INFO, "warning": WARNING, "warn": WARNING, "error": ERROR}
_NAMES = {DEBUG: "debug", INFO: "info", WARNING: "warning", ERROR: "error"}


def level_from_env(default: int = INFO) -> int:
    return _LEVELS.get(os.environ.get("DLM_LOG_LEVEL", "").strip().lower(), default)


class Logger:
    """Writes JSON lines for one node; ``stream`` defaults to stderr at write time."""

    __slots__ = ("level", "node", "stream")

    def __init__(self, node: str, *, level: int | None = None, stream: TextIO | None = None):
        self.node = node
        self.level = level_from_env() if level is None else level
        self.stream = stream

    def enabled(self, level: int) -> bool:
        return level >= self.level

    def log(self, level: int, event: str, **fields: Any) -> None:
        if level < self.level:
            return
        record: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "level": _NAMES.get(level, str(level)),
            "node": self.node,
            "event": event,
        }
        record.update(fields)
        line = json.dumps(record, default=str, separators=(",", ":"))
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):
            # A closed or broken stderr must not take the node down with it.
            pass

    def debug(self, event: str, **fields: Any) -> None:
        if self.level <= DEBUG:
            self.log(DEBUG, event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        if self.level <= INFO:
            self.log(INFO, event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.log(WARNING, event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.log(ERROR, event, **fields)
