"""A node's log lines: JSON for collectors, one readable line per event for people."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from dlm.node.runtime.log import DEBUG, INFO, Logger, default_format, level_named, text_line


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_json_lines_are_unchanged() -> None:
    out = io.StringIO()
    Logger("n1", level=INFO, stream=out).info("role_changed", role="leader", term=3)
    record = json.loads(out.getvalue())
    assert record["node"] == "n1" and record["event"] == "role_changed"
    assert (record["level"], record["role"], record["term"]) == ("info", "leader", 3)


def test_a_partition_process_names_its_partition_in_every_line(utc: None) -> None:
    out = io.StringIO()
    log = Logger("n1", level=INFO, stream=out, partition=2)
    log.info("role_changed", role="leader")
    log.info("audit", partition=9)  # an event's own field of that name wins
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["node"] == "n1" and first["partition"] == 2 and first["event"] == "role_changed"
    assert second["partition"] == 9  # the event's own field, as with any reserved name
    text = io.StringIO()
    Logger("n1", level=INFO, stream=text, format="text", partition=2).info("x")
    assert " n1/p2 x" in text.getvalue()
    plain = io.StringIO()
    Logger("n1", level=INFO, stream=plain).info("x")
    assert "partition" not in json.loads(plain.getvalue())


def test_text_is_time_level_node_event_then_fields(utc: None) -> None:
    line = text_line(1_700_000_000.123, "info", "n1", "role_changed", {"role": "leader", "term": 3})
    assert line == "2023-11-14T22:13:20.123+00:00 INFO  n1 role_changed role=leader term=3"


def test_text_quotes_what_would_break_the_line_or_the_terminal() -> None:
    fields = {
        "traceback": "Traceback:\n  boom",
        "path": "/var/lib/dlm data",
        "peer": None,
        "ok": True,
        "evil": "\x1b[2J",
        "bidi": "a\u202eb",
        "sizes": [1, 2],
        "eq": "a=b",
    }
    line = text_line(0.0, "error", "n1", "node_crashed", fields)
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    assert 'traceback="Traceback:\\n  boom"' in line
    assert 'path="/var/lib/dlm data"' in line
    assert "peer=null ok=true" in line
    assert 'evil="\\u001b[2J"' in line
    assert 'bidi="a\\u202eb"' in line
    assert "sizes=[1,2]" in line and 'eq="a=b"' in line


def test_a_text_logger_writes_one_line_per_event() -> None:
    out = io.StringIO()
    log = Logger("n2", level=DEBUG, stream=out, format="text")
    log.debug("tick", n=1)
    log.error("node_crashed", traceback="a\nb\nc")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert re.match(r"\S+ DEBUG n2 tick n=1$", lines[0])
    assert re.match(r'\S+ ERROR n2 node_crashed traceback="a\\nb\\nc"$', lines[1])


def test_levels_and_formats() -> None:
    assert level_named("warning") == 30
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        level_named("loud")
    with pytest.raises(ValueError, match="unknown log format"):
        Logger("n1", format="xml")
    assert default_format(io.StringIO()) == "json"  # not a terminal


@pytest.mark.parametrize("now", [1_700_000_000.0, 1_700_000_000.9996, 1_795_668_934.9655, 0.0015])
def test_json_time_and_ts_are_the_same_millisecond(
    monkeypatch: pytest.MonkeyPatch, now: float
) -> None:
    monkeypatch.setattr(time, "time", lambda: now)
    out = io.StringIO()
    Logger("n1", level=INFO, stream=out).info("lock_granted", key="k")
    record = json.loads(out.getvalue())
    stamp = datetime.fromisoformat(record["time"])
    assert round(stamp.timestamp() * 1000) == round(record["ts"] * 1000)


@pytest.mark.parametrize("partition", [None, 2])
def test_a_replayed_line_is_the_whole_record_at_the_entrys_own_time(
    partition: int | None,
) -> None:
    """A restart writes a line per replayed entry through a shortcut (the head built once
    per millisecond, only the fields encoded): byte for byte the line the record gives."""
    log = Logger("n1", level=INFO, partition=partition)
    fields = {"key": "k/1", "token": 7, "owner": {"owner": "o"}, "replayed": True}
    at_ms = 1_795_856_860_617
    for _ in range(2):  # the second from the cached head
        line = log.line(INFO, "lock_granted", dict(fields), at_ms=at_ms)
        record = {
            "time": datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds"),
            "ts": at_ms / 1000,
            "level": "info",
            "node": "n1",
            **({} if partition is None else {"partition": partition}),
            "event": "lock_granted",
            **fields,
        }
        assert line == json.dumps(record, separators=(",", ":"))
    assert log.line(INFO, "cluster_version", {}, at_ms=at_ms + 1) == json.dumps(
        {
            "time": datetime.fromtimestamp((at_ms + 1) / 1000, UTC).isoformat(
                timespec="milliseconds"
            ),
            "ts": (at_ms + 1) / 1000,
            "level": "info",
            "node": "n1",
            **({} if partition is None else {"partition": partition}),
            "event": "cluster_version",
        },
        separators=(",", ":"),
    )
    # A field named like the head replaces it, as before.
    replaced = log.line(INFO, "odd", {"node": "other"}, at_ms=at_ms)
    assert replaced is not None and json.loads(replaced)["node"] == "other"


def test_stamps_are_iso_8601_utc_with_milliseconds() -> None:
    """``stamp_of`` formats each second once: the same text as formatting every stamp."""
    from dlm.node.runtime.log import stamp_of

    def formatted(ms: int) -> str:
        stamp = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
        return stamp.isoformat(timespec="milliseconds")

    for ms in [0, 1, 999, 1000, 1_795_856_860_617, 1_795_856_860_999, 1_795_856_861_000, -1]:
        for _ in range(2):
            assert stamp_of(ms) == formatted(ms), ms
    for ms in range(1_795_856_859_990, 1_795_856_860_020):
        assert stamp_of(ms) == formatted(ms)
