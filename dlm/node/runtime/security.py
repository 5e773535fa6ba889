"""What a member needs to trust its connections: the secrets and TLS contexts it was given.

``load(settings, listen)`` turns the security settings of `dlm node start`
(``--peer-secret-file``, ``--client-secret-file``, ``--tls-cert``, ``--tls-key``,
``--tls-ca``, ``--insecure``) into a ``NodeSecurity``: the secrets read from their
files and, with TLS, the context the listener serves with and the one the peer
links dial with. It refuses (``SecurityError``, one line saying what to add) a
member that would listen beyond the loopback range with its peers
unauthenticated, unless ``--insecure`` says that is intended: on a reachable
address, anyone who can connect could otherwise speak Raft to the member. It
also refuses a peer secret equal to the client secret: every client host holds
the client secret, and with it could act as a member.

dlm.auth and dlm.tls (hence hashlib and ssl) are imported only when a secret or
TLS is configured.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlm.wire import format_addr

TLS_FLAGS = ("--tls-cert", "--tls-key", "--tls-ca")


class SecurityError(Exception):
    """The security settings cannot be used; the message is one line saying what to do."""


@dataclass(frozen=True, slots=True)
class NodeSecurity:
    peer_secret: bytes | None = None
    """Peers must prove they hold it (both directions of every pair), when set."""
    client_secret: bytes | None = None
    """Clients must prove they hold it in their hello, when set."""
    server_tls: Any = None
    """ssl.SSLContext the listener serves with (None: plain TCP)."""
    peer_tls: Any = None
    """ssl.SSLContext the peer links dial with: our certificate, checked against the CA."""
    metrics_token: bytes | None = None
    """Scrapers of /metrics must send it as a bearer token, when set."""
    metrics_tls: Any = None
    """ssl.SSLContext /metrics serves with, requiring a client certificate the CA signed
    (None: plain HTTP)."""
    previous_peer_secret: bytes | None = None
    """The peer secret before the last reload changed it: still accepted, until the next
    reload (the overlap a rotation needs: dlm/node/runtime/reload.py)."""
    previous_client_secret: bytes | None = None
    """The client secret before the last reload changed it, accepted the same way."""

    @property
    def peers_authenticated(self) -> bool:
        return self.peer_secret is not None or self.server_tls is not None


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (an IP literal or ``localhost``)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def truthy(value: str | None, flag: str) -> bool:
    """A flag's value as the table gives it ('true'/'false' and their usual spellings)."""
    if value is None:
        return False
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise SecurityError(f"{flag} takes no value, or true/false in a variable (got {value!r})")


def load(
    settings: Mapping[str, str | None],
    listen: tuple[str, int],
    metrics_listen: tuple[str, int] | None = None,
) -> NodeSecurity:
    """The member's security for its settings (config/options.py names); SecurityError.

    ``metrics_listen``: where /metrics is served, if anywhere. Beyond the loopback range it
    is served with every credential configured (the bearer token of
    ``--metrics-token-file``, and the member's TLS with a client certificate required), and
    needs at least one of them, or ``--insecure``: the metrics name leases' owners and
    members' addresses, and a scrape costs the member work."""
    peer_file = settings.get("peer_secret_file")
    client_file = settings.get("client_secret_file")
    tls_files = [settings.get(name) for name in ("tls_cert", "tls_key", "tls_ca")]
    insecure = truthy(settings.get("insecure"), "--insecure")
    if any(tls_files) and not all(tls_files):
        missing = [flag for flag, value in zip(TLS_FLAGS, tls_files, strict=True) if not value]
        raise SecurityError(
            "TLS needs all three of --tls-cert, --tls-key and --tls-ca: "
            f"add {' and '.join(missing)}"
        )
    if not peer_file and not all(tls_files) and not insecure and not is_loopback(listen[0]):
        raise SecurityError(
            f"--listen {format_addr(*listen)} is reachable from other machines, but peers "
            "are not authenticated: add --peer-secret-file PATH (make it with: dlm secret new "
            "--out PATH) or --tls-cert, --tls-key and --tls-ca; or --insecure to accept any peer"
        )
    token_file = settings.get("metrics_token_file")
    if token_file and metrics_listen is None:
        raise SecurityError("--metrics-token-file goes with --metrics-listen: add it, or drop it")
    beyond_loopback = metrics_listen is not None and not is_loopback(metrics_listen[0])
    if beyond_loopback and not token_file and not all(tls_files) and not insecure:
        assert metrics_listen is not None
        raise SecurityError(
            f"--metrics-listen {format_addr(*metrics_listen)} is reachable from other machines, "
            "but scrapers are not authenticated: add --metrics-token-file PATH (make it with: "
            "dlm secret new --out PATH) or the member's TLS (--tls-cert, --tls-key, --tls-ca); "
            "or --insecure to serve metrics to anyone"
        )
    metrics_token = _secret(token_file, "--metrics-token-file") if token_file else None
    peer_secret = _secret(peer_file, "--peer-secret-file") if peer_file else None
    client_secret = _secret(client_file, "--client-secret-file") if client_file else None
    if peer_secret is not None and peer_secret == client_secret:
        # Every client host holds the client secret: with the same one it could speak as a
        # member (send Raft messages, claim a member's id).
        raise SecurityError(
            "--peer-secret-file and --client-secret-file hold the same secret, which would "
            "let every client act as a member: give peers their own (dlm secret new --out PATH)"
        )
    server_tls = peer_tls = metrics_tls = None
    if all(tls_files):
        from dlm import tls

        cert, key, ca = (str(path) for path in tls_files)
        try:
            server_tls = tls.server_context(cert, key, ca)
            peer_tls = tls.client_context(ca, cert, key)
            if beyond_loopback:
                metrics_tls = tls.server_context(cert, key, ca, require_client_cert=True)
        except tls.TlsConfigError as exc:
            raise SecurityError(str(exc)) from None
    return NodeSecurity(
        peer_secret, client_secret, server_tls, peer_tls, metrics_token, metrics_tls
    )


def _secret(path: str, flag: str) -> bytes:
    from dlm import auth

    try:
        return auth.load_secret(path)
    except auth.SecretFileError as exc:
        raise SecurityError(f"{flag}: {exc}") from None
