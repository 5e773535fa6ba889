"""Scenario files: commands, each followed by the output it must produce.

A scenario file (``testdata/*.txt``) is a script a reader can follow::

    # a comment, kept as is
    campaign n1
    ----
    n1 is pre_candidate at term 0

Each command is one line, then a line ``----``, then its expected output,
which ends at the first blank line (so an output never holds a blank line;
an interpreter that has nothing to say answers ``ok``). A command the
interpreter refuses (it raises ValueError) answers ``error: <why>``, so a
scenario shows its own mistakes; any other exception fails the test. Lines starting with
``#`` and blank lines between commands are kept verbatim.

``run_file`` feeds every command to an interpreter and compares what it
answers with what the file says. On a mismatch the test fails with a unified
diff of the whole file (expected against actual). With ``DLM_TRACES_REWRITE=1``
in the environment it writes the actual outputs back into the file instead:
review the change with ``git diff`` before committing it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

SEPARATOR = "----"
REWRITE_ENV = "DLM_TRACES_REWRITE"


@dataclass(frozen=True)
class Directive:
    """One command of a scenario and the output the file expects of it."""

    line: int
    command: str
    expected: str


@dataclass(frozen=True)
class Verbatim:
    """Comments and blank lines between commands, kept for the rewrite."""

    text: str


Chunk = Directive | Verbatim


def parse(text: str, name: str = "<scenario>") -> list[Chunk]:
    lines = text.splitlines()
    chunks: list[Chunk] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            chunks.append(Verbatim(line))
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1] != SEPARATOR:
            raise ValueError(f"{name}:{i + 1}: the command {line!r} is not followed by {SEPARATOR}")
        start = i + 2
        end = start
        while end < len(lines) and lines[end].strip():
            end += 1
        chunks.append(Directive(i + 1, line.strip(), "\n".join(lines[start:end])))
        i = end
    return chunks


def render(chunks: list[Chunk], outputs: list[str]) -> str:
    """The file again, with ``outputs`` (one per directive, in order) as the expected outputs."""
    answers = iter(outputs)
    out: list[str] = []
    for chunk in chunks:
        if isinstance(chunk, Verbatim):
            out.append(chunk.text)
        else:
            out.extend((chunk.command, SEPARATOR, next(answers)))
    return "\n".join(out) + "\n"


def normalise(output: str) -> str:
    """An output as a file can hold it: no trailing spaces, no blank line, never empty."""
    lines = [line.rstrip() for line in output.splitlines()]
    text = "\n".join(line for line in lines if line)
    return text or "ok"


def run_file(path: Path, execute: Callable[[str], str]) -> None:
    """Run every command of ``path`` through ``execute``; fail with a diff, or rewrite."""
    original = path.read_text(encoding="utf-8")
    chunks = parse(original, path.name)
    outputs: list[str] = []
    for chunk in chunks:
        if isinstance(chunk, Directive):
            try:
                outputs.append(normalise(execute(chunk.command)))
            except ValueError as error:  # a command the interpreter cannot run
                outputs.append(f"error: {error}")
            except Exception as error:
                raise AssertionError(
                    f"{path.name}:{chunk.line}: {chunk.command!r} raised {error!r}"
                ) from error
    actual = render(chunks, outputs)
    if actual == original:
        return
    if os.environ.get(REWRITE_ENV) == "1":
        path.write_text(actual, encoding="utf-8")
        return
    diff = "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"{path.name} (expected)",
            tofile=f"{path.name} (actual)",
        )
    )
    pytest.fail(
        f"{path} does not match what the interpreter says "
        f"(rerun with {REWRITE_ENV}=1 to accept it):\n{diff}",
        pytrace=False,
    )
