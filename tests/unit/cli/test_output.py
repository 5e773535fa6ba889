"""What people see of values owners chose: escaped, one line per row, never a terminal command."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dlm.cli.exits import CliError
from dlm.cli.output import (
    JSON,
    TABLE,
    TSV,
    Styled,
    choose_format,
    escape,
    format_meta,
    make_table,
    tsv_lines,
)

HOSTILE = [
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;title\x07",
    "del\x7f",
    "c1\x9bcsi",
    "bidi\u202eoverride",
    "line\u2028separator",
    "back\\slash",
    "nul\x00byte",
]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain key/with spaces", "plain key/with spaces"),
        ("tab\there", "tab\\there"),
        ("new\nline", "new\\nline"),
        ("cr\r", "cr\\r"),
        ("\x1b[31m", "\\x1b[31m"),
        ("\x07", "\\x07"),
        ("\x7f\x9b", "\\x7f\\x9b"),
        ("\u202e", "\\u202e"),
        ("\U000e0001", "\\U000e0001"),
        ("back\\slash", "back\\\\slash"),
        ("héllo wörld ✓ 日本", "héllo wörld ✓ 日本"),
    ],
)
def test_escape_writes_controls_as_visible_escapes(raw: str, shown: str) -> None:
    assert escape(raw) == shown


@pytest.mark.parametrize("raw", HOSTILE)
def test_escaped_text_is_one_printable_line_that_reads_back(raw: str) -> None:
    shown = escape(raw)
    assert shown.isprintable()
    assert "\t" not in shown and "\n" not in shown and "\x1b" not in shown
    # Unambiguous: Python's own escape syntax reads it back to exactly the original.
    assert shown.encode("ascii", "backslashreplace").decode("unicode_escape") == raw


def test_escape_takes_any_value() -> None:
    assert escape(42) == "42"
    assert escape(None) == "None"


def test_meta_is_joined_for_people_and_escaped_where_it_is_shown() -> None:
    meta = {"host": "a", "note": "x\ny"}
    assert format_meta(meta) == "host=a note=x\ny"
    assert escape(format_meta(meta)) == "host=a note=x\\ny"
    assert format_meta(None) == ""


def test_tsv_is_a_header_then_one_line_per_row_with_hostile_cells() -> None:
    rows = [[raw, f"meta={raw}", 7] for raw in HOSTILE]
    lines = tsv_lines(["key", "owner", "n"], rows)
    text = "".join(line + "\n" for line in lines)
    assert text.count("\n") == len(HOSTILE) + 1
    assert lines[0] == "key\towner\tn"
    for line, raw in zip(lines[1:], HOSTILE, strict=True):
        cells = line.split("\t")
        assert cells == [escape(raw), f"meta={escape(raw)}", "7"]
        assert "\x1b" not in line and "\r" not in line


def render(table: object, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None).print(table)
    return out.getvalue()


@pytest.mark.parametrize("width", [40, 80, 200])
def test_a_table_row_never_wraps_and_never_carries_an_escape_sequence(width: int) -> None:
    rows: list[list[str | Styled]] = [
        [f"key-{i}-{raw}", "lease0123456789ab", str(i), f"owner={raw} " + "x" * 150]
        for i, raw in enumerate(HOSTILE)
    ]
    rows.append([Styled("[bold]not markup[/bold]", "red"), "l", "1", "o"])
    text = render(make_table(("KEY", "LEASE", "TOKEN", "OWNER"), rows, width=width,
                             squeeze="OWNER"), width)  # fmt: skip
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)  # heading, rule, one line per row
    assert all(len(line) <= width for line in lines)
    assert "\x1b" not in text and "\x07" not in text
    assert "[bold]not markup[/bold]" in text or width < 80


def test_the_squeezed_column_gives_way_first() -> None:
    rows: list[list[str | Styled]] = [["deploy/production-eu-west", "a1b2c3d4e5f6g7h8", "o" * 200]]
    text = render(make_table(("KEY", "LEASE", "OWNER"), rows, width=80, squeeze="OWNER"), 80)
    assert "deploy/production-eu-west" in text
    assert "a1b2c3d4e5f6g7h8" in text
    assert "…" in text


def test_format_defaults_to_tsv_off_a_terminal_and_json_wins() -> None:
    assert choose_format(None, as_json=False) == TSV  # pytest's stdout is not a terminal
    assert choose_format("table", as_json=False) == TABLE
    assert choose_format("tsv", as_json=True) == JSON
    with pytest.raises(CliError, match="use table, tsv or json"):
        choose_format("yaml", as_json=False)
