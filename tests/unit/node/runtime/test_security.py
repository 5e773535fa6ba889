"""A member's security settings: secrets and TLS loaded, and the guard on reachable addresses."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlm import auth
from dlm.node.runtime import security
from dlm.node.runtime.security import SecurityError, is_loopback, load

LOOPBACK = ("127.0.0.1", 7700)
REACHABLE = ("0.0.0.0", 7700)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("db1.example.net", False),  # a name may resolve to anything
    ],
)
def test_what_counts_as_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_loopback_needs_nothing() -> None:
    loaded = load({}, LOOPBACK)
    assert loaded == security.NodeSecurity()
    assert not loaded.peers_authenticated


def test_a_reachable_address_needs_peer_authentication_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(SecurityError) as raised:
        load({}, REACHABLE)
    message = str(raised.value)
    assert "0.0.0.0:7700" in message and "\n" not in message
    for what in ("--peer-secret-file", "--tls-cert", "--tls-key", "--tls-ca", "--insecure"):
        assert what in message
    # A client secret alone does not authenticate peers.
    client = tmp_path / "client.secret"
    auth.write_secret_file(str(client))
    with pytest.raises(SecurityError):
        load({"client_secret_file": str(client)}, REACHABLE)
    assert load({"insecure": "true"}, REACHABLE) == security.NodeSecurity()
    peer = tmp_path / "peer.secret"
    auth.write_secret_file(str(peer))
    loaded = load({"peer_secret_file": str(peer), "client_secret_file": str(client)}, REACHABLE)
    assert loaded.peer_secret == auth.load_secret(str(peer))
    assert loaded.client_secret == auth.load_secret(str(client))
    assert loaded.peers_authenticated and loaded.server_tls is None


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_insecure_from_a_variable_or_file(value: str) -> None:
    load({"insecure": value}, REACHABLE)


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_insecure_switched_off(value: str) -> None:
    with pytest.raises(SecurityError):
        load({"insecure": value}, REACHABLE)


def test_insecure_refuses_other_words() -> None:
    with pytest.raises(SecurityError, match="--insecure takes no value"):
        load({"insecure": "maybe"}, LOOPBACK)


def test_tls_needs_all_three_files() -> None:
    with pytest.raises(SecurityError, match="add --tls-key and --tls-ca"):
        load({"tls_cert": "c.pem"}, LOOPBACK)
    with pytest.raises(SecurityError, match=r"add --tls-cert$"):
        load({"tls_key": "k.pem", "tls_ca": "ca.pem"}, LOOPBACK)


def test_tls_file_problems_are_one_line_naming_the_file(tmp_path: Path) -> None:
    files = {name: str(tmp_path / f"{name}.pem") for name in ("tls_cert", "tls_key", "tls_ca")}
    with pytest.raises(SecurityError, match=r"tls_cert\.pem does not exist"):
        load(files, REACHABLE)


def test_secret_file_problems_name_the_flag(tmp_path: Path) -> None:
    loose = tmp_path / "peer.secret"
    auth.write_secret_file(str(loose))
    loose.chmod(0o644)
    with pytest.raises(SecurityError, match=r"^--peer-secret-file: .*chmod 600"):
        load({"peer_secret_file": str(loose)}, LOOPBACK)
    with pytest.raises(SecurityError, match=r"^--client-secret-file: .*does not exist"):
        load({"client_secret_file": str(tmp_path / "nope")}, LOOPBACK)


def test_a_peer_secret_equal_to_the_client_secret_is_refused(tmp_path: Path) -> None:
    peer, client = tmp_path / "peer.secret", tmp_path / "client.secret"
    auth.write_secret_file(str(peer))
    client.write_bytes(peer.read_bytes() + b"\n")  # whitespace aside, the same secret
    client.chmod(0o600)
    with pytest.raises(SecurityError) as raised:
        load({"peer_secret_file": str(peer), "client_secret_file": str(client)}, LOOPBACK)
    message = str(raised.value)
    assert "same secret" in message and "\n" not in message


# ------------------------------------------------------------------ the /metrics endpoint

METRICS_REACHABLE = ("0.0.0.0", 9464)


def test_metrics_beyond_loopback_need_a_credential_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(SecurityError) as raised:
        load({}, LOOPBACK, METRICS_REACHABLE)
    message = str(raised.value)
    assert "--metrics-listen 0.0.0.0:9464" in message and "\n" not in message
    for what in ("--metrics-token-file", "--tls-cert", "--insecure"):
        assert what in message
    assert load({"insecure": "true"}, LOOPBACK, METRICS_REACHABLE) == security.NodeSecurity()
    token = tmp_path / "metrics.token"
    auth.write_secret_file(str(token))
    loaded = load({"metrics_token_file": str(token)}, LOOPBACK, METRICS_REACHABLE)
    assert loaded.metrics_token == auth.load_secret(str(token))
    assert loaded.metrics_tls is None


def test_metrics_on_loopback_need_nothing_but_take_a_token_when_given(tmp_path: Path) -> None:
    assert load({}, LOOPBACK, ("127.0.0.1", 9464)) == security.NodeSecurity()
    token = tmp_path / "metrics.token"
    auth.write_secret_file(str(token))
    loaded = load({"metrics_token_file": str(token)}, LOOPBACK, ("localhost", 9464))
    assert loaded.metrics_token is not None


def test_a_metrics_token_without_metrics_is_a_mistake(tmp_path: Path) -> None:
    token = tmp_path / "metrics.token"
    auth.write_secret_file(str(token))
    with pytest.raises(SecurityError, match="goes with --metrics-listen"):
        load({"metrics_token_file": str(token)}, LOOPBACK)


def test_a_metrics_token_file_open_to_others_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "metrics.token"
    auth.write_secret_file(str(token))
    token.chmod(0o644)
    with pytest.raises(SecurityError, match=r"--metrics-token-file: .*chmod 600"):
        load({"metrics_token_file": str(token)}, LOOPBACK, METRICS_REACHABLE)
