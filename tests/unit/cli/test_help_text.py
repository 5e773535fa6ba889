"""dlm.cli.help_text: `dlm --help` without typer must print exactly what typer would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dlm.cli import help_text


def _dlm(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlm", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )


def test_the_copy_is_what_typer_renders() -> None:
    assert help_text.rendered() == help_text.TOP_LEVEL_HELP, (
        "the CLI changed: regenerate the copy with `python -m dlm.cli.help_text --write`"
    )


def test_dlm_help_prints_the_copy_on_wide_terminals_and_typer_below_80_columns() -> None:
    for flag in ("--help", "-h"):
        for columns in ("80", "200"):
            fast = _dlm([flag], COLUMNS=columns)
            slow = _dlm([flag], COLUMNS=columns, DLM_NO_FASTPATH="1")
            assert (fast.returncode, fast.stdout) == (0, help_text.TOP_LEVEL_HELP)
            assert (slow.returncode, slow.stdout) == (0, help_text.TOP_LEVEL_HELP)
    narrow = _dlm(["--help"], COLUMNS="60")
    assert narrow.returncode == 0
    assert narrow.stdout == _dlm(["--help"], COLUMNS="60", DLM_NO_FASTPATH="1").stdout
    assert narrow.stdout != help_text.TOP_LEVEL_HELP


def test_dlm_help_loads_no_typer() -> None:
    probe = (
        "import sys, json; sys.argv = ['dlm', '--help']\n"
        "from dlm.cli.main import run\n"
        "run(['--help'])\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "100"},
    ).stdout
    loaded = set(json.loads(out.splitlines()[-1]))
    assert not {m for m in loaded if m == "typer" or m.startswith(("typer.", "dlm.client"))}
