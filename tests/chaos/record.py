"""How every process of a chaos run writes down what it did: one JSON object a line.

Standard library only, so that the command `dlm exec` runs (tests/chaos/critical.py)
starts fast. Each line is written with one ``write`` on a file opened with
O_APPEND and flushed at once, so a process killed with SIGKILL loses at most the
line it was writing (the reader skips a torn last line), and an operation whose
completion never got written counts as one with an unknown outcome.

Records (``k``): ``call`` and ``ret`` of an operation (``op`` is its id, unique in
the run), ``renew`` (a lease's opening or a renewal that counted: ``sent``,
``ttl_ms``, ``t`` when the confirmation arrived), and plain events (``cmd_start``,
``beat``, ``cmd_end``, ``exec_start``, ``exec_end``, ``fault``, ...). ``t`` is
always ``time.monotonic()``: one machine, so one clock for every process.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from typing import Any


class Recorder:
    """Appends records for one client (``client`` names it in the run)."""

    def __init__(self, path: str | os.PathLike[str], client: str) -> None:
        self.client = client
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def _write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def event(self, kind: str, /, **fields: Any) -> float:
        now = time.monotonic()
        self._write({"k": kind, "client": self.client, "t": now, **fields})
        return now

    def call(self, f: str, **fields: Any) -> str:
        """Records the invocation of an operation; returns its id."""
        op = f"{self.client}:{next(self._ids)}"
        self._write({"k": "call", "op": op, "client": self.client, "f": f,
                     "t": time.monotonic(), **fields})  # fmt: skip
        return op

    def ret(self, op: str, outcome: str, **fields: Any) -> None:
        """Records the completion: ``ok``, ``fail`` (with ``detail``) or ``unknown``."""
        self._write({"k": "ret", "op": op, "t": time.monotonic(), "outcome": outcome, **fields})

    def renew(self, lease: str, sent: float, ttl_ms: int) -> None:
        self.event("renew", lease=lease, sent=sent, ttl_ms=ttl_ms)

    def close(self) -> None:
        os.close(self._fd)


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every whole record of a file (a line torn by SIGKILL is skipped)."""
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    item = json.loads(line)
                except ValueError:
                    continue
                if isinstance(item, dict):
                    out.append(item)
    except FileNotFoundError:
        pass
    return out
