"""docs/python.md's examples, run as a reader would run them, against a real cluster.

Every fenced ``python`` block of docs/python.md runs here in a fresh interpreter, with
``DLM_CLUSTER`` set to the module's 3-member cluster and this tree on the path, unless
the line right before its fence is a marker saying why it cannot be
(``<!-- python-test: skip: REASON -->``): so the page cannot drift from the API. A
block must exit 0 within a minute.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.harness import REPO, Cluster

PAGE = REPO / "docs" / "python.md"
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- python-test: (.+?) -->$")
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Block:
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    text: str
    marker: str | None


def blocks(text: str) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None or not opening.group(1):
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        found.append(
            Block(start + 1, opening.group(1), "\n".join(body), marker and marker.group(1))
        )
        i += 1
    return found


EXAMPLES = [b for b in blocks(PAGE.read_text(encoding="utf-8")) if b.lang == "python"]


def test_the_page_has_examples_and_each_block_is_closed() -> None:
    assert len(EXAMPLES) >= 5
    assert PAGE.read_text(encoding="utf-8").count("```") % 2 == 0


@pytest.mark.parametrize("block", EXAMPLES, ids=[f"line{b.line}" for b in EXAMPLES])
def test_each_example_runs(block: Block, shared: Cluster, tmp_path: Path) -> None:
    if block.marker is not None:
        assert block.marker.startswith("skip: ") and len(block.marker) > 10, block.marker
        pytest.skip(block.marker)
    env = dict(os.environ)
    env["DLM_CLUSTER"] = shared.members_env
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for variable in ("DLM_SECRET_FILE", "DLM_TLS_CA", "DLM_TLS_CERT", "DLM_TLS_KEY"):
        env.pop(variable, None)
    script = tmp_path / f"example_line{block.line}.py"
    script.write_text(block.text + "\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"docs/python.md line {block.line} failed:\n{result.stdout}\n{result.stderr}"
    )
