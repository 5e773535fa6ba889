"""`make api-docs` (tools/api_docs.py): the reference of every public name, and of nothing
internal, from the docstrings, with the standard library alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dlm

REPO = Path(__file__).resolve().parents[2]


def test_the_reference_covers_every_public_name_and_no_private_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "api_docs.py"), "--output", str(tmp_path / "api")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    names = {p.name for p in (tmp_path / "api").iterdir()}
    for name in dlm.__all__:
        if name != "__version__":
            assert f"dlm.{name}.html" in names, name
    text = (tmp_path / "api" / "dlm.txt").read_text(encoding="utf-8")
    for documented in ("acquire(self", "extend(self", "time_left(self", "fencing token"):
        assert documented in text, documented
    assert "_borrow" not in text and "_lost_now" not in text
    assert "dlm.Lock.html" in (tmp_path / "api" / "index.html").read_text(encoding="utf-8")
