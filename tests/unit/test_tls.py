"""TLS contexts: a member and a client (or a peer) agree, names are checked, and every
misconfiguration is one line naming the file.

Certificates come from a throwaway CA made with the ``openssl`` command (skipped
where it is missing); handshakes run over a local socket pair, never a network.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dlm import tls
from tests.pki import OPENSSL, make_ca, make_leaf, openssl
from tests.unit.cli.test_imports import ON_THE_FAST_PATH, forbidden, modules_after

pytestmark = pytest.mark.skipif(OPENSSL is None, reason="the openssl command is not installed")
TIMEOUT = 10.0
NOT_WITHOUT_TLS = ("dlm.tls", "ssl", "dlm.auth", "hmac", "hashlib")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_leaf(d, "n1", "ca", "DNS:n1,IP:127.0.0.1")
    make_leaf(d, "n2", "ca", "DNS:n2")
    make_leaf(d, "n3", "ca", "DNS:n3")
    make_leaf(d, "client", "ca", None)
    make_leaf(d, "rogue-n2", "other-ca", "DNS:n2")
    openssl(
        "pkey", "-in", "n1.key", "-aes256", "-passout", "pass:secret", "-out", "n1-encrypted.key",
        cwd=d,
    )  # fmt: skip
    return d


def p(pki: Path, name: str) -> str:
    return str(pki / name)


def member(pki: Path, name: str = "n1") -> ssl.SSLContext:
    return tls.server_context(p(pki, f"{name}.crt"), p(pki, f"{name}.key"), p(pki, "ca.crt"))


def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str
) -> tuple[dict[str, Any] | None, BaseException | None, BaseException | None]:
    """TLS over a socket pair; returns (peercert the server saw, server error, client error)."""
    left, right = socket.socketpair()
    left.settimeout(TIMEOUT)
    right.settimeout(TIMEOUT)
    seen: list[Any] = [None, None]

    def serve() -> None:
        try:
            with server.wrap_socket(left, server_side=True) as conn:
                seen[0] = conn.getpeercert()
                conn.sendall(b"welcome")
        except (ssl.SSLError, OSError) as exc:
            seen[1] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    client_error: BaseException | None = None
    try:
        with client.wrap_socket(right, server_hostname=server_hostname) as conn:
            assert conn.recv(16) == b"welcome"
    except (ssl.SSLError, OSError) as exc:
        client_error = exc
    finally:
        right.close()
        thread.join(TIMEOUT)
        left.close()
    assert not thread.is_alive()
    return seen[0], seen[1], client_error


def test_a_peer_with_its_certificate_is_accepted_under_its_own_name(pki: Path) -> None:
    peer = tls.client_context(p(pki, "ca.crt"), p(pki, "n2.crt"), p(pki, "n2.key"))
    peercert, server_error, client_error = handshake(member(pki), peer, "n1")
    assert server_error is None and client_error is None
    assert tls.peer_certificate_problem(peercert, "n2") is None


def test_a_peer_certificate_naming_another_member_is_refused(pki: Path) -> None:
    n3 = tls.client_context(p(pki, "ca.crt"), p(pki, "n3.crt"), p(pki, "n3.key"))
    peercert, server_error, client_error = handshake(member(pki), n3, "n1")
    assert server_error is None and client_error is None  # a fine TLS connection...
    problem = tls.peer_certificate_problem(peercert, "n2")  # ...whose hello claims n2
    assert problem == "peer claims to be 'n2' but its certificate names n3"


def test_a_client_needs_no_certificate_but_cannot_pass_for_a_peer(pki: Path) -> None:
    client = tls.client_context(p(pki, "ca.crt"))
    peercert, server_error, client_error = handshake(member(pki), client, "127.0.0.1")
    assert server_error is None and client_error is None
    assert tls.peer_certificate_problem(peercert, "n2") == (
        "peer 'n2' presented no TLS certificate (members must)"
    )
    with_cert = tls.client_context(p(pki, "ca.crt"), p(pki, "client.crt"), p(pki, "client.key"))
    peercert, _, _ = handshake(member(pki), with_cert, "n1")
    assert tls.peer_certificate_problem(peercert, "client") is not None  # no DNS name at all


def test_a_certificate_from_another_ca_is_refused_both_ways(pki: Path) -> None:
    rogue = tls.client_context(p(pki, "ca.crt"), p(pki, "rogue-n2.crt"), p(pki, "rogue-n2.key"))
    _, server_error, _ = handshake(member(pki), rogue, "n1")
    assert isinstance(server_error, ssl.SSLError)
    impostor = tls.server_context(p(pki, "rogue-n2.crt"), p(pki, "rogue-n2.key"), p(pki, "ca.crt"))
    _, _, client_error = handshake(impostor, tls.client_context(p(pki, "ca.crt")), "n2")
    assert isinstance(client_error, ssl.SSLCertVerificationError)


def test_the_client_checks_the_name_it_dialled(pki: Path) -> None:
    _, _, client_error = handshake(member(pki), tls.client_context(p(pki, "ca.crt")), "n2")
    assert isinstance(client_error, ssl.SSLCertVerificationError)
    assert "n2" in str(client_error)


MISCONFIGURED = [
    # (cert, key, ca) for server_context, and what the one line must say.
    (("missing", "n1.key", "ca.crt"), "TLS certificate file {missing} does not exist"),
    (("n1.crt", "missing", "ca.crt"), "TLS key file {missing} does not exist"),
    (("n1.crt", "n1.key", "missing"), "TLS CA file {missing} does not exist"),
    (("n1.crt", "n2.key", "ca.crt"), "TLS key {n2.key} does not match certificate {n1.crt}"),
    (("n1.crt", "n1-encrypted.key", "ca.crt"), "is encrypted: give dlm an unencrypted key"),
    (("garbage", "n1.key", "ca.crt"), "cannot load TLS certificate {garbage} with key"),
    (("n1.crt", "n1.key", "garbage"), "cannot load TLS CA file {garbage}"),
    (("n1.crt", "n1.key", "dir"), "TLS CA file {dir} is a directory"),
    (("n1.crt", "n1.key", "n2.crt"), "TLS CA file {n2.crt} holds no CA certificate"),
]


@pytest.mark.parametrize(("files", "needle"), MISCONFIGURED)
def test_misconfigurations_are_one_line_naming_the_file(
    pki: Path, tmp_path: Path, files: tuple[str, str, str], needle: str
) -> None:
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    paths = {name: p(pki, name) for name in ("n1.crt", "n1.key", "n2.key", "n2.crt", "ca.crt",
                                             "n1-encrypted.key")}  # fmt: skip
    paths |= {
        "missing": str(tmp_path / "nope.pem"),
        "garbage": str(tmp_path / "garbage.pem"),
        "dir": str(tmp_path),
    }
    cert, key, ca = (paths[name] for name in files)
    with pytest.raises(tls.TlsConfigError) as info:
        tls.server_context(cert, key, ca)
    message = str(info.value)
    expected = needle
    for name, path in paths.items():
        expected = expected.replace("{" + name + "}", path)
    assert expected in message
    assert "\n" not in message


def test_a_client_certificate_needs_its_key(pki: Path) -> None:
    with pytest.raises(tls.TlsConfigError, match="needs both a cert and a key file"):
        tls.client_context(p(pki, "ca.crt"), p(pki, "n1.crt"))


def test_tls_stays_off_the_plain_cli_path() -> None:
    """ssl costs ~14 ms of start-up: only a TLS configuration may load it."""
    loaded = modules_after(
        "import dlm.cli.main, dlm.cli.fastpath, dlm.cli.ops, dlm.cli.exec_cmd, dlm.client.sync, "
        "dlm.wire"
    )
    assert forbidden(loaded, NOT_WITHOUT_TLS) == []
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dlm", "acquire", "k", *ON_THE_FAST_PATH],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "dlm.cli.main" in imported
    assert forbidden(imported, NOT_WITHOUT_TLS) == []


def test_certificate_names_are_the_cn_then_the_dns_names_each_once() -> None:
    peercert = {
        "subject": ((("organizationName", "acme"),), (("commonName", "ci"),)),
        "subjectAltName": (("DNS", "runner.example"), ("IP Address", "10.0.0.1"), ("DNS", "ci")),
    }
    assert tls.certificate_names(peercert) == ("ci", "runner.example")
    assert tls.certificate_names(None) == ()
    assert tls.certificate_names({}) == ()
