"""`dlm gateway`: its flags checked, its listener bound, then dlm/gateway/relay.py runs.

Bad flags exit 2 with one line; an address it cannot listen on exits 1 with one
line; SIGTERM or SIGINT closes every connection and exits 0.
"""

from __future__ import annotations

import errno
import os
import socket
import sys

from dlm.cli.exits import CliError, usage_error
from dlm.cli.settings import CLUSTER_ENV, parse_members

LISTEN_ENV = "DLM_GATEWAY_LISTEN"
MAX_CLIENTS_ENV = "DLM_GATEWAY_MAX_CLIENTS"
MAX_CLIENTS_CAP = 1_000_000


def run(listen: str | None, cluster: str | None, max_clients: str | None) -> int:
    """Checks the flags (or their variables), binds, and relays until told to stop."""
    from dlm.event_loop import EventLoopChoiceError, chosen_loop
    from dlm.event_loop import run as run_loop
    from dlm.gateway.relay import DEFAULT_MAX_CLIENTS, Gateway
    from dlm.node.runtime.log import Logger
    from dlm.wire import format_addr, parse_addr

    listen_text, listen_source = listen, "--listen"
    if not listen_text:
        listen_text, listen_source = os.environ.get(LISTEN_ENV), LISTEN_ENV
    if not listen_text:
        raise usage_error(f"dlm gateway needs --listen HOST:PORT (or {LISTEN_ENV})")
    try:
        host, port = parse_addr(listen_text)
    except ValueError as exc:
        raise usage_error(f"bad {listen_source} {listen_text!r}: {exc}") from None
    cluster_text, source = cluster, "--cluster"
    if not cluster_text:
        cluster_text, source = os.environ.get(CLUSTER_ENV), CLUSTER_ENV
    if not cluster_text:
        raise usage_error(
            f"dlm gateway needs --cluster HOST:PORT[,HOST:PORT...] (or {CLUSTER_ENV})"
        )
    members = parse_members(cluster_text, source)
    if any(member.startswith("gateway:") for member in members):
        raise usage_error(f"{source} of a gateway names members, not gateways")
    cap_text, cap_source = max_clients, "--max-clients"
    if not cap_text:
        cap_text, cap_source = os.environ.get(MAX_CLIENTS_ENV), MAX_CLIENTS_ENV
    cap = DEFAULT_MAX_CLIENTS
    if cap_text:
        if not cap_text.strip().isdigit() or not 1 <= int(cap_text) <= MAX_CLIENTS_CAP:
            raise usage_error(
                f"{cap_source} must be a whole number from 1 to {MAX_CLIENTS_CAP}, not {cap_text!r}"
            )
        cap = int(cap_text)
    try:
        loop_name = chosen_loop()
    except EventLoopChoiceError as exc:
        raise usage_error(str(exc)) from None
    listener = _bind(host, port, format_addr(host, port))
    gateway = Gateway(members, Logger("gateway", stream=sys.stderr), max_clients=cap)
    try:
        return run_loop(loop_name, lambda: gateway.run(listener))
    except EventLoopChoiceError as exc:
        raise usage_error(str(exc)) from None
    finally:
        listener.close()


def _bind(host: str, port: int, shown: str) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise CliError("LISTEN", f"cannot listen on {shown}: {exc.strerror or exc}", 1) from None
    family, kind, proto, _, address = infos[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(1024)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            message = f"{shown} is already in use: stop the other process or choose --listen"
        else:
            message = f"cannot listen on {shown}: {exc.strerror or exc}"
        raise CliError("LISTEN", message, 1) from None
    listener.setblocking(False)
    return listener
