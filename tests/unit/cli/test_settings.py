"""The credentials every command takes: --secret-file and --tls-* over DLM_SECRET_FILE and
DLM_TLS_*, and files that cannot be used exit 78 naming what to set."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlm import auth
from dlm.cli import exits
from dlm.cli.exits import CliError
from dlm.cli.settings import Credentials, GlobalOptions, resolve

VARIABLES = ("DLM_SECRET_FILE", "DLM_TLS_CA", "DLM_TLS_CERT", "DLM_TLS_KEY")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*VARIABLES, "DLM_CLUSTER"):
        monkeypatch.delenv(name, raising=False)


def test_no_credentials_is_falsy_and_loads_nothing() -> None:
    settings = resolve(None, None, None, False)
    assert not settings.credentials
    assert settings.credentials.load() == (None, None)


def test_the_subcommand_beats_the_root_beats_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DLM_SECRET_FILE", "/env/secret")
    monkeypatch.setenv("DLM_TLS_CA", "/env/ca")
    monkeypatch.setenv("DLM_TLS_KEY", "/env/key")
    root = GlobalOptions(secret_file="/root/secret", tls=(None, "/root/cert", None))
    settings = resolve(root, None, None, False, tls=("/cmd/ca", None, None))
    assert settings.credentials == Credentials("/root/secret", "/cmd/ca", "/root/cert", "/env/key")
    settings = resolve(None, None, None, False, secret_file="/cmd/secret")
    assert settings.credentials == Credentials("/cmd/secret", "/env/ca", None, "/env/key")


def test_an_unusable_secret_file_exits_78_naming_the_option(tmp_path: Path) -> None:
    missing = Credentials(str(tmp_path / "nope"))
    with pytest.raises(CliError) as raised:
        missing.load()
    assert raised.value.exit_code == exits.CONFIG == 78
    assert raised.value.code == "CONFIG"
    assert raised.value.message.startswith("--secret-file/DLM_SECRET_FILE: secret file ")
    loose = tmp_path / "loose"
    auth.write_secret_file(str(loose))
    loose.chmod(0o640)
    with pytest.raises(CliError, match="chmod 600"):
        Credentials(str(loose)).load()
    loose.chmod(0o600)
    secret, context = Credentials(str(loose)).load()
    assert secret == auth.load_secret(str(loose)) and context is None


def test_unusable_tls_files_exit_78_naming_the_options(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="--tls-ca/DLM_TLS_CA") as raised:
        Credentials(tls_cert=str(tmp_path / "c.pem"), tls_key=str(tmp_path / "k.pem")).load()
    assert raised.value.exit_code == 78
    with pytest.raises(CliError, match="DLM_TLS_CA") as raised:
        Credentials(tls_ca=str(tmp_path / "missing-ca.pem")).load()
    assert "missing-ca.pem" in raised.value.message and raised.value.exit_code == 78
