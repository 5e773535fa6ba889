"""Durations as people write them on a command line: ``500ms``, ``30s``, ``5m``, ``1h``.

Parts may be combined (``1m30s``, as Go and etcd accept) and a bare number
means seconds, as it does for ``sleep``, ``timeout`` and ``flock -w``.
Anything else is refused with a message that shows the accepted forms.
"""

from __future__ import annotations

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DIGITS = frozenset("0123456789")

# A week: beyond this a value is much more likely a typo than a wish.
MAX_SECONDS = 7 * 24 * 3600.0

HINT = "write it like 500ms, 30s, 5m, 1h or 1m30s"


class DurationError(ValueError):
    """The text is not a duration this command understands."""


def _number_end(s: str, pos: int) -> int:
    """Where the number that starts at ``pos`` ends (``12``, ``1.5``, ``.5``); ``pos`` if
    none starts there. Scanned by hand: importing re costs ~2 ms of every run."""
    i = pos
    while i < len(s) and s[i] in _DIGITS:
        i += 1
    if i < len(s) and s[i] == ".":
        j = i + 1
        while j < len(s) and s[j] in _DIGITS:
            j += 1
        if j > i + 1:
            return j
    return i


def parse_duration(text: str) -> float:
    """Returns the duration in seconds; raises DurationError naming what is wrong."""
    s = text.strip().lower()
    if not s:
        raise DurationError(f"empty duration: {HINT}")
    if _number_end(s, 0) == len(s):
        seconds = float(s)
    else:
        seconds = 0.0
        pos = 0
        while pos < len(s):
            end = _number_end(s, pos)
            unit = "ms" if s.startswith("ms", end) else s[end : end + 1]
            if end == pos or unit not in _UNIT_SECONDS:
                break
            seconds += float(s[pos:end]) * _UNIT_SECONDS[unit]
            pos = end + len(unit)
        if pos != len(s) or pos == 0:
            raise DurationError(f"{text!r} is not a duration: {HINT}")
    if seconds > MAX_SECONDS:
        raise DurationError(f"{text!r} is longer than a week")
    return seconds


def parse_duration_ms(text: str) -> int:
    """The duration in whole milliseconds (rounded up, so 0.5ms is not 0)."""
    seconds = parse_duration(text)
    ms = int(seconds * 1000)
    return ms + 1 if ms < seconds * 1000 else ms


def format_ms(ms: int | float | None) -> str:
    """Short human form of a millisecond count: 850ms, 12.5s, 3m05s, 2h01m."""
    if ms is None:
        return "-"
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s".replace(".0s", "s")
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
