"""`dlm secret new`: a fresh secret on stdout, or in a new file of mode 600."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dlm import auth
from dlm.cli.main import run

Capture = pytest.CaptureFixture[str]


def test_secret_new_prints_a_fresh_secret(capsys: Capture) -> None:
    assert run(["secret", "new"]) == 0
    first = capsys.readouterr().out
    assert run(["secret", "new"]) == 0
    second = capsys.readouterr().out
    assert first.endswith("\n") and len(first.strip()) == 64 and int(first, 16) >= 0
    assert first != second


def test_secret_new_out_creates_a_private_file_that_loads(capsys: Capture, tmp_path: Path) -> None:
    path = tmp_path / "peer.secret"
    assert run(["secret", "new", "--out", str(path)]) == 0
    assert capsys.readouterr() == ("", "")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(auth.load_secret(str(path))) == 64


def test_secret_new_out_never_overwrites(capsys: Capture, tmp_path: Path) -> None:
    path = tmp_path / "peer.secret"
    path.write_text("keep me")
    assert run(["secret", "new", "--out", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"dlm: {path} already exists: remove it first, or choose another path\n"
    assert path.read_text() == "keep me"
