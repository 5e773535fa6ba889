"""Durations on the command line: the accepted forms and the refused ones."""

from __future__ import annotations

import pytest

from dlm.durations import DurationError, format_ms, parse_duration, parse_duration_ms


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("1h2m3s", 3723.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("30", 30.0),
        ("0", 0.0),
        ("0.25", 0.25),
        (" 10S ", 10.0),
    ],
)
def test_accepted_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", " ", "abc", "10x", "s", "ms", "-5s", "1.2.3s", "5 m", "1h-", "s10", "1e3", "inf"]
)
def test_garbage_is_refused_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(DurationError, match="500ms"):
        parse_duration(text)


def test_more_than_a_week_is_refused() -> None:
    with pytest.raises(DurationError, match="week"):
        parse_duration("169h")


def test_milliseconds_round_up_so_a_tiny_duration_is_not_zero() -> None:
    assert parse_duration_ms("30s") == 30000
    assert parse_duration_ms("0.0005s") == 1
    assert parse_duration_ms("1.0004s") == 1001


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (0, "0ms"), (850, "850ms"), (1000, "1s"), (12500, "12.5s"), (185000, "3m05s"),
     (7260000, "2h01m"), (-5, "0ms")],
)  # fmt: skip
def test_format_ms(ms: int | None, text: str) -> None:
    assert format_ms(ms) == text
