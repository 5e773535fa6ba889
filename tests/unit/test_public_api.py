"""`import dlm`: the public names, cheap to import, and the exceptions that mirror the exit
codes of the `dlm` command (dlm/__init__.py, dlm/_api/)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dlm
from dlm.cli import exits


def test_import_dlm_loads_neither_the_api_nor_the_client_nor_an_event_loop() -> None:
    code = (
        "import sys\n"
        "import dlm\n"
        "loaded = [m for m in sys.modules if m.startswith(('dlm.', 'anyio', 'asyncio', 'typer'))]\n"
        "assert not loaded, loaded\n"
        "dlm.LockHeld\n"
        "assert 'anyio' not in sys.modules and 'dlm.client.sync' not in sys.modules\n"
        "dlm.Client\n"
        "assert 'anyio' not in sys.modules, 'the blocking API needs no event loop'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_every_public_name_resolves_and_nothing_else_does() -> None:
    for name in dlm.__all__:
        assert getattr(dlm, name) is not None, name
    assert set(dlm.__all__) <= set(dir(dlm))
    with pytest.raises(AttributeError):
        _ = dlm.KeepAlive
    assert isinstance(dlm.now(), float)


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        ("LockHeld", exits.CONFLICT),
        ("LockLost", exits.LOST),
        ("LeaseLost", exits.LOST),
        ("NotHolder", exits.LOST),
        ("PermissionDenied", exits.LOST),
        ("QuotaExceeded", exits.LOST),
        ("ClusterUnavailable", exits.UNAVAILABLE),
        ("AuthFailed", exits.CONFIG),
        ("BadRequest", exits.USAGE),
        ("InertAfterFork", exits.INTERNAL),
    ],
)
def test_each_exception_has_the_exit_code_of_the_same_meaning(error: str, exit_code: int) -> None:
    kind = getattr(dlm, error)
    assert issubclass(kind, dlm.DlmError)
    assert kind.exit_code == exit_code


def test_the_package_is_typed_and_ships_the_marker() -> None:
    import tomllib
    from pathlib import Path

    package = Path(dlm.__file__).parent
    assert (package / "py.typed").exists()
    pyproject = tomllib.loads((package.parent / "pyproject.toml").read_text(encoding="utf-8"))
    # Wheels and sdists carry it (the zipapp copies the whole dlm tree, the marker with it).
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["dlm"]
