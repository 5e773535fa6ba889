"""Test-only: makes the ports in DLM_TEST_UNREACHABLE_PORTS unreachable for this process.

A cluster test puts this directory first on a `dlm` command's PYTHONPATH to stand
for a host that can reach only a gateway: every connect to a member's port is
refused, so the command works only if it never dials a member itself.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_BLOCKED = frozenset(
    int(port) for port in os.environ.get("DLM_TEST_UNREACHABLE_PORTS", "").split(",") if port
)

if _BLOCKED:
    _connect = socket.socket.connect
    _connect_ex = socket.socket.connect_ex

    def _refused(address: Any) -> bool:
        return isinstance(address, tuple) and len(address) >= 2 and address[1] in _BLOCKED

    def connect(self: socket.socket, address: Any) -> None:
        if _refused(address):
            raise ConnectionRefusedError(111, "unreachable from this host (test)")
        _connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        return 111 if _refused(address) else _connect_ex(self, address)

    socket.socket.connect = connect  # type: ignore[method-assign, assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign, assignment]
