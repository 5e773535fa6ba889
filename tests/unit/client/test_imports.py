"""The CLI's hot path must not pay for an event loop or for rich."""

from __future__ import annotations

import subprocess
import sys


def test_sync_client_imports_no_event_loop_or_rich() -> None:
    code = (
        "import sys\n"
        "import dlm.client, dlm.client.errors\n"
        "assert 'dlm.wire' not in sys.modules, 'errors must not need the codec'\n"
        "from dlm.client import Client, KeepAlive, Grant, Lease\n"
        "heavy = [m for m in ('asyncio', 'anyio', 'rich', 'typer') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
