"""Structured logs for a node: one line per event on stderr, as JSON or as readable text.

A JSON line carries ``time`` (ISO-8601, UTC, milliseconds), ``ts`` (the same as
Unix seconds, for tools that prefer numbers), ``level``,
``node``, ``event`` (a short snake_case name an operator can grep for) and
the event's own fields. A text line carries the same in the order people
read them: local time with its offset, level, node, event, then
``key=value`` fields, a value quoted (JSON string syntax) when it holds a
space, a quote, an ``=`` or a character that is not printable, so one event
is always one line (a traceback's newlines become ``\n``).

The level check happens before anything is formatted, so a disabled
``debug`` call on the hot path costs one compare. The level is the one the
caller gives (`dlm node start --log-level`), else ``DLM_LOG_LEVEL`` (debug,
info, warning, error; default info).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

DEBUG = 10
INFO = 20
WARNING = 30
ERROR = 40

JSON_FORMAT, TEXT_FORMAT = "json", "text"

_LEVELS = {"debug": DEBUG, "info": INFO, "warning": WARNING, "warn": WARNING, "error": ERROR}
_NAMES = {DEBUG: "debug", INFO: "info", WARNING: "warning", ERROR: "error"}
_RESERVED = frozenset({"time", "ts", "level", "node", "partition", "event"})
"""The keys every JSON line starts with; an event field of the same name replaces them."""


_encode_fields = json.JSONEncoder(default=str, separators=(",", ":")).encode
"""``json.dumps(fields, default=str, separators=(",", ":"))`` without making an encoder
for every line."""


_QUOTED: dict[str, str] = {}
_QUOTED_MAX = 512


def _quoted(name: str) -> str:
    """``json.dumps(name)`` of a level or an event name, each quoted once (the names are
    the code's own, a few dozen; past _QUOTED_MAX of them, quoted every time)."""
    quoted = _QUOTED.get(name)
    if quoted is None:
        quoted = json.dumps(name)
        if len(_QUOTED) < _QUOTED_MAX:
            _QUOTED[name] = quoted
    return quoted


_second_stamped: tuple[int, str] = (0, "")
"""The last second ``stamp_of`` formatted (seconds since the epoch, its ISO-8601 text up to
the seconds): a replay stamps a hundred thousand lines with their entries' own times, a
thousand a second. One tuple, read and replaced whole (loggers of other threads)."""


def stamp_of(ms: int) -> str:
    """ISO-8601 in UTC with milliseconds, for ``ms`` since the epoch."""
    global _second_stamped
    second = ms // 1000
    cached = _second_stamped
    if cached[0] != second or not cached[1]:
        whole = datetime.fromtimestamp(second, UTC).isoformat(timespec="seconds")
        cached = _second_stamped = (second, whole[: -len("+00:00")])
    return f"{cached[1]}.{ms % 1000:03d}+00:00"


def level_from_env(default: int = INFO) -> int:
    return _LEVELS.get(os.environ.get("DLM_LOG_LEVEL", "").strip().lower(), default)


def level_named(name: str | None) -> int:
    """The level called ``name`` (debug, info, warning, error); DLM_LOG_LEVEL's if None."""
    if name is None:
        return level_from_env()
    try:
        return _LEVELS[name.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown log level {name!r}: use debug, info, warning or error") from None


def default_format(stream: TextIO | None = None) -> str:
    """Text for a person at a terminal, JSON for a log collector."""
    stream = stream if stream is not None else sys.stderr
    try:
        return TEXT_FORMAT if stream.isatty() else JSON_FORMAT
    except (AttributeError, ValueError):
        return JSON_FORMAT


class Logger:
    """Writes one line per event for one node; ``stream`` defaults to stderr at write time."""

    __slots__ = (
        "_head",
        "_label",
        "_replay_ms",
        "_replay_stamp",
        "_stamp",
        "_stamped_ms",
        "format",
        "level",
        "node",
        "partition",
        "stream",
    )

    def __init__(
        self,
        node: str,
        *,
        level: int | None = None,
        stream: TextIO | None = None,
        format: str = JSON_FORMAT,
        partition: int | None = None,
    ):
        if format not in (JSON_FORMAT, TEXT_FORMAT):
            raise ValueError(f"unknown log format {format!r}: use json or text")
        self.node = node
        self.partition = partition
        """The partition this process serves, named in every line (None: a member of one
        partition, or a supervisor, whose lines name none)."""
        self._head = f'"node":{json.dumps(node)}'
        if partition is not None:
            self._head += f',"partition":{partition}'
        self._label = node if partition is None else f"{node}/p{partition}"
        self.level = level_from_env() if level is None else level
        self.stream = stream
        self.format = format
        self._stamped_ms = -1
        self._stamp = ""
        self._replay_ms = -1
        self._replay_stamp = ""

    def enabled(self, level: int) -> bool:
        return level >= self.level

    def log(self, level: int, event: str, **fields: Any) -> None:
        line = self.line(level, event, fields)
        if line is not None:
            self.write_lines([line])

    def line(
        self, level: int, event: str, fields: dict[str, Any], *, at_ms: int | None = None
    ) -> str | None:
        """The line for this event (no newline), or None when its level is off. ``at_ms``:
        the event's own time (ms since the epoch) when it is not now (a replayed event)."""
        if level < self.level:
            return None
        if at_ms is not None:
            if self.format == TEXT_FORMAT:
                return text_line(
                    at_ms / 1000, _NAMES.get(level, str(level)), self._label, event, fields
                )
            if _RESERVED.isdisjoint(fields):
                # A restart replays a line per applied entry, a hundred thousand of them
                # for a long log: the same head as a live line, stamped at the entry's
                # time (built once per millisecond), and only the fields encoded.
                if at_ms != self._replay_ms:
                    self._replay_stamp = (
                        f'{{"time":"{stamp_of(at_ms)}","ts":{json.dumps(at_ms / 1000)},"level":'
                    )
                    self._replay_ms = at_ms
                return self._fast_line(self._replay_stamp, level, event, fields)
            record: dict[str, Any] = {
                "time": stamp_of(at_ms),
                "ts": at_ms / 1000,
                "level": _NAMES.get(level, str(level)),
                "node": self.node,
                **self._partition_field(),
                "event": event,
                **fields,
            }
            return json.dumps(record, default=str, separators=(",", ":"))
        now = time.time()
        if self.format == TEXT_FORMAT:
            return text_line(now, _NAMES.get(level, str(level)), self._label, event, fields)
        # One millisecond for both stamps (rounding one and truncating the other
        # could put them a millisecond apart).
        ms = int(now * 1000)
        if ms != self._stamped_ms:
            self._stamp = f'{{"time":"{stamp_of(ms)}","ts":{json.dumps(ms / 1000)},"level":'
            self._stamped_ms = ms
        if _RESERVED.isdisjoint(fields):
            # The audit trail writes several lines a millisecond under load: the fixed
            # head is built once per millisecond, and only the fields are encoded.
            return self._fast_line(self._stamp, level, event, fields)
        record = {
            "time": stamp_of(ms),
            "ts": ms / 1000,
            "level": _NAMES.get(level, str(level)),
            "node": self.node,
            **self._partition_field(),
            "event": event,
        }
        record.update(fields)
        return json.dumps(record, default=str, separators=(",", ":"))

    def _fast_line(self, stamp: str, level: int, event: str, fields: dict[str, Any]) -> str:
        head = f'{stamp}{_quoted(_NAMES.get(level, str(level)))},{self._head},"event":'
        head += _quoted(event)
        if not fields:
            return head + "}"
        return head + "," + _encode_fields(fields)[1:]

    def _partition_field(self) -> dict[str, int]:
        return {} if self.partition is None else {"partition": self.partition}

    def write_lines(self, lines: list[str]) -> None:
        """Writes ``lines`` with one write and one flush (the runtime's events of one turn)."""
        if not lines:
            return
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write("\n".join(lines) + "\n")
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


def text_line(ts: float, level: str, node: str, event: str, fields: dict[str, Any]) -> str:
    """``2024-05-01T12:00:00.123+02:00 INFO  n1 role_changed role=leader term=3``."""
    stamp = datetime.fromtimestamp(ts).astimezone().isoformat(timespec="milliseconds")
    parts = [stamp, f"{level.upper():<5}", _text_value(node), _text_value(event)]
    parts.extend(f"{_text_value(str(key))}={_text_value(value)}" for key, value in fields.items())
    return " ".join(parts)


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    elif isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str, separators=(",", ":"))
    else:
        text = str(value)
    if text and text.isprintable() and not any(ch in text for ch in ' "=\\'):
        return text
    return json.dumps(text)  # ASCII-only: escapes every character that could mislead a terminal
