"""Where the command's words go: one JSON object, plain lines, tab-separated rows or rich tables.

Anything a lock's owner chose (keys, metadata) reaches people only through
``escape``: a control character, a tab or a newline in it is written as a
visible escape, so owner metadata cannot send escape sequences to an
operator's terminal or split a row of a script's input in two. JSON carries
the exact values.

JSON goes through the stdlib json module and rich is imported only when a
table is drawn, so the scripted paths (``--json``, ``--format env``, tsv)
never pay for it.
"""

from __future__ import annotations

import sys

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    from rich.console import Console

TABLE, TSV, JSON = "table", "tsv", "json"
FORMATS = (TABLE, TSV, JSON)

_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\"}


def escape(value: object) -> str:
    """``value`` as text safe to show a person: one line, no terminal control sequences.

    Tabs, newlines and carriage returns become ``\\t``, ``\\n`` and ``\\r``; any
    other character Python does not call printable (C0 and C1 controls, DEL,
    bidirectional overrides and other format characters, line separators,
    unassigned code points) becomes ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``; and
    a backslash becomes ``\\\\``, so the escaped text reads back to exactly one
    original.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\\" not in text:
        return text  # the common case, at C speed
    out = []
    for ch in text:
        named = _NAMED_ESCAPES.get(ch)
        if named is not None:
            out.append(named)
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x100:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    return "".join(out)


def format_meta(meta: object) -> str:
    """Owner metadata as ``name=value`` pairs, '' when there is none. Not yet escaped: it
    goes into a table cell or a tsv field, which escape what they show."""
    if not isinstance(meta, dict):
        return ""
    return " ".join(f"{name}={value}" for name, value in meta.items())


def iso_local(ms: int | None, timespec: str = "seconds") -> str:
    """Milliseconds since the epoch as local ISO-8601 time with its offset; '-' if unknown."""
    if ms is None:
        return "-"
    from datetime import datetime

    return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec=timespec)


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def choose_format(option: str | None, as_json: bool) -> str:
    """--format as given; json with --json; else a table for a terminal and tsv for a pipe."""
    from dlm.cli.exits import usage_error

    if as_json:
        return JSON
    if option is None:
        return TABLE if stdout_is_terminal() else TSV
    if option not in FORMATS:
        raise usage_error(f"bad --format {option!r}: use table, tsv or json")
    return option


def emit_json(obj: Any) -> None:
    """Prints exactly one JSON object, on one line, to stdout."""
    import json  # only the --json paths pay for it

    sys.stdout.write(json.dumps(obj, separators=(", ", ": "), default=str) + "\n")
    sys.stdout.flush()


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def complain(text: str) -> None:
    """One line on stderr, prefixed so it reads as dlm's and not the wrapped command's."""
    sys.stderr.write(f"dlm: {text}\n")
    sys.stderr.flush()


def tsv_lines(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A header line, then one line per row: cells escaped (so none holds a tab or a newline),
    joined by single tabs, nothing padded or coloured."""
    lines = ["\t".join(header)]
    lines.extend("\t".join(escape(cell) for cell in row) for row in rows)
    return lines


def emit_tsv(header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    sys.stdout.write("".join(line + "\n" for line in tsv_lines(header, rows)))
    sys.stdout.flush()


def console() -> Console:
    from rich.console import Console  # ~40 ms: only tables need it

    return Console(highlight=False, soft_wrap=False)


class Styled:
    """A table cell with a rich style (colour shows on a terminal only)."""

    __slots__ = ("style", "text")

    def __init__(self, text: str, style: str) -> None:
        self.text = text
        self.style = style


def make_table(
    headings: Sequence[str],
    rows: Iterable[Sequence[str | Styled]],
    *,
    width: int,
    squeeze: str | None = None,
    right: Sequence[str] = (),
) -> Any:
    """A rich table whose every row is one line, however narrow ``width`` is.

    Cells are escaped and taken as plain text (never as rich markup). When the
    table is wider than ``width``, the ``squeeze`` column is cut first (with an
    ellipsis), so the ids and numbers people copy stay whole; if that is not
    enough, every column is cut evenly.
    """
    from rich import box
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for heading in headings:
        table.add_column(
            heading,
            no_wrap=True,
            overflow="ellipsis",
            justify="right" if heading in right else "left",
        )
    widest = [cell_len(h) for h in headings]
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            if isinstance(cell, Styled):
                text = Text(escape(cell.text), style=cell.style)
            else:
                text = Text(escape(cell))
            widest[i] = max(widest[i], text.cell_len)
            cells.append(text)
        table.add_row(*cells)
    if squeeze is not None:
        # Measured without a width limit: what the table needs to show every cell whole.
        natural = Console(width=1_000_000).measure(table).maximum
        if natural > width:
            i = list(headings).index(squeeze)
            table.columns[i].max_width = max(cell_len(squeeze), widest[i] - (natural - width))
    return table


def print_table(
    headings: Sequence[str],
    rows: Iterable[Sequence[str | Styled]],
    *,
    squeeze: str | None = None,
    right: Sequence[str] = (),
    out: Console | None = None,
) -> None:
    out = out or console()
    out.print(make_table(headings, rows, width=out.width, squeeze=squeeze, right=right))
