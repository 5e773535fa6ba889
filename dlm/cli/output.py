"""Where the command's words go: one JSON object, plain lines, or rich tables.

JSON goes through the stdlib json module and rich is imported only when a
table is drawn, so the scripted paths (``--json``, ``--format env``) never pay
for it.
"""

from __future__ import annotations

import sys

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from rich.console import Console


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


def console() -> Console:
    from rich.console import Console  # ~40 ms: only tables need it

    return Console(highlight=False, soft_wrap=False)
