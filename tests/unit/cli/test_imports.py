"""What the hot paths import: start-up time is paid on every cron run.

`dlm acquire`, `exec`, `release` and `renew` must not load an event loop (asyncio or uvloop:
asyncio alone costs 60-75 ms), rich (only tables need it), pydantic, any of
the node's code, or (on the fast path) typer itself, or dataclasses (which
pulls in inspect, ast, dis and tokenize, and then generates code per class).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ("asyncio", "anyio", "uvloop", "rich", "pydantic", "dlm.node", "dlm.store")
# ctypes: exec's guard (whose imports -X importtime lists too: it is a fork writing to the
# same stderr, and it always gets as far as becoming the subreaper) calls prctl through
# _ctypes; the package's Python costs ~2 ms of CPU.
FAST_PATH_FORBIDDEN: tuple[str, ...] = (*FORBIDDEN, "typer", "dataclasses", "inspect", "ctypes")
try:
    import _cbor2  # type: ignore[import-not-found]  # noqa: F401
except ImportError:  # the pure-Python codec is the cbor2 package, with typing and re
    pass
else:  # cbor2's C module is used alone (dlm/cbor_codec.py): the package, typing and re stay out
    FAST_PATH_FORBIDDEN = (*FAST_PATH_FORBIDDEN, "cbor2", "typing", "re")
# The one piece of the node the typer path loads: the settings table `dlm node start` is
# built from (no imports of its own), with the empty package files above it.
NODE_SETTINGS_TABLE = (
    "dlm.node",
    "dlm.node.runtime",
    "dlm.node.runtime.config",
    "dlm.node.runtime.config.options",
)


def modules_after(code: str) -> set[str]:
    # The list is taken before json is loaded: json itself loads re.
    probe = f"{code}\nimport sys\nloaded = sorted(sys.modules)\n"
    probe += "import json\nprint(json.dumps(loaded))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def forbidden(modules: set[str], names: tuple[str, ...] = FORBIDDEN) -> list[str]:
    return sorted(
        m
        for m in modules
        if m not in NODE_SETTINGS_TABLE and any(m == f or m.startswith(f + ".") for f in names)
    )


def test_the_hot_path_modules_import_nothing_heavy() -> None:
    loaded = modules_after(
        "import dlm.cli.main, dlm.cli.fastpath, dlm.cli.ops, dlm.cli.exec_cmd, dlm.client.sync"
    )
    assert forbidden(loaded, FAST_PATH_FORBIDDEN) == []


ON_THE_FAST_PATH = ["--timeout", "100ms", "--cluster", "127.0.0.1:1"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["acquire", "k", "--help"], FORBIDDEN),
        (["exec", "--help"], FORBIDDEN),
        (["--help"], FORBIDDEN),
        (["acquire", "k", *ON_THE_FAST_PATH], FAST_PATH_FORBIDDEN),
        (["release", "k", "--lease", "x", *ON_THE_FAST_PATH], FAST_PATH_FORBIDDEN),
        (["renew", "x", *ON_THE_FAST_PATH], FAST_PATH_FORBIDDEN),
        (["exec", "--lock", "k", *ON_THE_FAST_PATH, "--", "true"], FAST_PATH_FORBIDDEN),
    ],
)
def test_running_a_hot_command_imports_nothing_heavy(
    args: list[str], names: tuple[str, ...]
) -> None:
    # -X importtime lists every module imported, on stderr; the process's own
    # output and exit code do not matter here (port 1 refuses: exit 69).
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dlm", *args],
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
    assert forbidden(imported, names) == []


NOT_WITHOUT_SECURITY = ("ssl", "dlm.tls", "dlm.auth", "hashlib", "hmac", "socket")
"""What only a secret (dlm.auth: hashlib, hmac) or TLS (ssl, socket, dlm.tls) may load."""


def imported_by(args: list[str], env: dict[str, str] | None = None) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dlm", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    names = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "dlm.cli.main" in names, proc.stderr[-2000:]
    return names


@pytest.mark.parametrize(
    "args",
    [
        ["acquire", "k", *ON_THE_FAST_PATH],
        ["exec", "--lock", "k", *ON_THE_FAST_PATH, "--", "true"],
        ["status", *ON_THE_FAST_PATH],
    ],
)
def test_the_plain_path_loads_neither_authentication_nor_tls(args: list[str]) -> None:
    clean = {"DLM_SECRET_FILE": "", "DLM_TLS_CA": "", "DLM_TLS_CERT": "", "DLM_TLS_KEY": ""}
    assert forbidden(imported_by(args, clean), NOT_WITHOUT_SECURITY) == []


def test_a_secret_loads_dlm_auth_and_still_no_tls(tmp_path: Path) -> None:
    from dlm import auth

    secret = tmp_path / "client.secret"
    auth.write_secret_file(str(secret))
    names = imported_by(["acquire", "k", "--secret-file", str(secret), *ON_THE_FAST_PATH])
    assert "dlm.auth" in names
    assert forbidden(names, ("ssl", "dlm.tls", "socket")) == []


def test_tls_loads_ssl_only_when_asked(tmp_path: Path) -> None:
    ca = tmp_path / "missing-ca.pem"  # the file is checked after ssl is loaded: exit 78
    names = imported_by(["acquire", "k", *ON_THE_FAST_PATH], {"DLM_TLS_CA": str(ca)})
    assert "dlm.tls" in names and "ssl" in names
