"""Test-only: makes the ports in DLM_TEST_UNREACHABLE_PORTS unreachable for this process.

A cluster test puts this directory first on a `dlm` command's PYTHONPATH to stand
for a host that can reach only a gateway: every connect to a member's port is
refused, so the command works only if it never dials a member itself. The
blocking client makes its sockets from the C module ``_socket`` (whose type
cannot be patched), so that module's ``socket`` is replaced by a subclass too.
"""

from __future__ import annotations

import os
from typing import Any

_BLOCKED = frozenset(
    int(port) for port in os.environ.get("DLM_TEST_UNREACHABLE_PORTS", "").split(",") if port
)


def _refused(address: Any) -> bool:
    return isinstance(address, tuple) and len(address) >= 2 and address[1] in _BLOCKED


if _BLOCKED:
    import _socket
    import socket

    class _GuardedSocket(_socket.socket):
        def connect(self, address: Any) -> None:
            if _refused(address):
                raise ConnectionRefusedError(111, "unreachable from this host (test)")
            super().connect(address)

        def connect_ex(self, address: Any) -> int:
            return 111 if _refused(address) else super().connect_ex(address)

    _connect = socket.socket.connect
    _connect_ex = socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        if _refused(address):
            raise ConnectionRefusedError(111, "unreachable from this host (test)")
        _connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        return 111 if _refused(address) else _connect_ex(self, address)

    _socket.socket = _GuardedSocket  # type: ignore[misc]
    socket.socket.connect = connect  # type: ignore[method-assign, assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign, assignment]
