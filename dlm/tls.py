"""TLS for dlm connections: the contexts a member and a client use, and the peer name check.

Import this module only when TLS is configured: ``import ssl`` costs about
14 ms of start-up, which the CLI's plain path must not pay
(tests/unit/test_tls.py checks that it does not).

Certificates
------------
One CA (the cluster's own, not a public one) signs every certificate. A
member's certificate names, as subjectAltName entries, its member id as a
DNS name (``DNS:n1``) and the addresses clients dial it at (``IP:10.0.0.1``
or ``DNS:db1.example.net``). A client certificate is optional and needs no
particular name. Keys are unencrypted PEM files (protect them with file
permissions): a member cannot ask for a passphrase at start-up.

API
---
``server_context(cert, key, ca)``
    For a member's listening socket. Presents ``cert``; asks every connection
    for a certificate and verifies one against ``ca`` when it is presented, but
    does not require one at the TLS layer: clients and peers share the port,
    and only the hello says which is which.
``peer_certificate_problem(peercert, member_id)``
    After the hello says "peer" and names ``member_id``: why that connection
    may not speak for it (no certificate, or one whose subjectAltName does not
    name ``member_id`` as a DNS name), or None to accept it. ``peercert`` is
    what the TLS layer returns for the connection (``SSLSocket.getpeercert()``,
    ``transport.get_extra_info("peercert")``): only certificates the CA
    verified ever get this far.
``certificate_names(peercert)``
    The names a verified client certificate gives: its subject's commonName, then
    its subjectAltName DNS names (in that order, each once). A member takes the
    first one that names an identity in its table as the client's identity, when
    the client's hello proves no secret (dlm/node/admission.py).
``client_context(ca, cert=None, key=None)``
    For the CLI and the client library, and for a member dialling a peer (with
    its own cert and key). Verifies the member's certificate against ``ca`` and
    the name dialled: pass ``server_hostname=`` the host of the address for a
    client, or the peer's member id for a member dialling a peer.

Every misconfiguration (a missing or unreadable file, a key that does not
match its certificate, an encrypted key, a CA file with no certificate in it)
raises ``TlsConfigError`` whose message is one line naming the file.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any


class TlsConfigError(Exception):
    """TLS cannot be set up as configured; the message is one line naming the file."""


def server_context(
    cert: str, key: str, ca: str, *, require_client_cert: bool = False
) -> ssl.SSLContext:
    """``require_client_cert``: refuse a connection without a certificate the CA signed
    (the /metrics endpoint; the member's port checks a peer's certificate itself)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_identity(context, cert, key)
    _load_ca(context, ca)
    context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the peer and its name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(context, ca)
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise TlsConfigError("a TLS client certificate needs both a cert and a key file")
        _load_identity(context, cert, key)
    return context


def peer_certificate_problem(peercert: Mapping[str, Any] | None, member_id: str) -> str | None:
    """Why this connection may not act as member ``member_id``, or None if it may."""
    if not peercert:
        return f"peer {member_id!r} presented no TLS certificate (members must)"
    names = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    if member_id not in names:
        shown = ", ".join(names) if names else "no DNS name"
        return f"peer claims to be {member_id!r} but its certificate names {shown}"
    return None


def certificate_names(peercert: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The subject's CN, then the subjectAltName DNS names, of a verified certificate."""
    if not peercert:
        return ()
    names: list[str] = []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str):
                names.append(value)
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "DNS" and isinstance(value, str):
            names.append(value)
    return tuple(dict.fromkeys(names))


def _check_readable(path: str, what: str) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except FileNotFoundError:
        raise TlsConfigError(f"TLS {what} file {path} does not exist") from None
    except IsADirectoryError:
        raise TlsConfigError(f"TLS {what} file {path} is a directory") from None
    except OSError as exc:
        raise TlsConfigError(f"cannot read TLS {what} file {path}: {exc.strerror or exc}") from None


def _refuse_passphrase() -> str:
    raise TlsConfigError("encrypted")


def _load_identity(context: ssl.SSLContext, cert: str, key: str) -> None:
    _check_readable(cert, "certificate")
    _check_readable(key, "key")
    try:
        context.load_cert_chain(cert, key, password=_refuse_passphrase)
    except TlsConfigError:
        raise TlsConfigError(
            f"TLS key {key} is encrypted: give dlm an unencrypted key (protect it with chmod 600)"
        ) from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsConfigError(f"TLS key {key} does not match certificate {cert}") from None
        raise TlsConfigError(
            f"cannot load TLS certificate {cert} with key {key} ({_reason(exc)}): "
            "both must be PEM files"
        ) from None


def _load_ca(context: ssl.SSLContext, ca: str) -> None:
    _check_readable(ca, "CA")
    try:
        context.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"cannot load TLS CA file {ca}: {_reason(exc)}") from None
    if not context.get_ca_certs():
        raise TlsConfigError(f"TLS CA file {ca} holds no CA certificate")


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason, without its library tag and C source position."""
    text = str(exc.reason or (exc.args[1] if len(exc.args) > 1 else exc))
    if text.startswith("["):
        text = text.partition("] ")[2]
    return text.partition(" (_ssl.c")[0].replace("_", " ").lower()
