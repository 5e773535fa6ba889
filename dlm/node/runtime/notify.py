"""Tells systemd how the member is doing (``Type=notify`` units): ``notify("READY=1")``.

systemd passes the address of a datagram socket in ``$NOTIFY_SOCKET``: a
filesystem path, or an abstract-namespace name written with a leading ``@``.
One datagram per message, with newline-separated ``NAME=value`` pairs
(``READY=1``, ``STOPPING=1``, ``STATUS=...``). Without the variable (not
started by systemd, or not as ``Type=notify``) this does nothing, so the
runtime can call it unconditionally. No dependency: a dozen lines of socket
code instead of libsystemd.
"""

from __future__ import annotations

import os
import socket

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"


def notify(state: str) -> bool:
    """Sends ``state`` to $NOTIFY_SOCKET; True if it was sent, False if there is no socket
    to send to or sending failed (a missed notification must never stop the member)."""
    address = os.environ.get(NOTIFY_SOCKET_ENV, "")
    if not address:
        return False
    if address.startswith("@"):
        target = "\0" + address[1:]  # Linux abstract namespace
    elif address.startswith("/"):
        target = address
    else:
        return False  # e.g. vsock: addresses, which only a VM's manager uses
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode("utf-8"), target)
    except OSError:
        return False
    return True
