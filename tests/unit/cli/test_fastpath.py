"""The fast path must be the typer app, only faster: same options, same calls, else hands over."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from dlm.cli import exec_cmd, fastpath, ops
from dlm.cli.app import app
from dlm.cli.main import _run_typer

Calls = list[tuple[str, tuple[Any, ...], dict[str, Any]]]


def click_options(command: Any) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for param in command.params:
        if param.param_type_name != "option" or "--help" in param.opts:
            continue
        if param.is_flag:
            kind = fastpath.FLAG
        elif param.multiple:
            kind = fastpath.MULTI
        elif param.type.name.startswith("int"):
            kind = fastpath.INT
        else:
            kind = fastpath.VALUE
        for opt in param.opts:
            out[opt] = (param.name, kind)
    return out


@pytest.mark.parametrize("name", sorted(fastpath.COMMANDS))
def test_the_option_tables_match_the_typer_app(name: str) -> None:
    group = typer.main.get_command(app)
    command = group.commands[name]  # type: ignore[attr-defined]
    positionals, own = fastpath.COMMANDS[name]
    assert click_options(command) == {**own, **fastpath.GLOBAL_OPTIONS}
    arguments = [p.name for p in command.params if p.param_type_name == "argument"]
    expected = [*positionals, "command"] if name == "exec" else list(positionals)
    assert arguments == expected
    for param in command.params:
        if param.name in fastpath.INT_RANGES:
            assert (param.type.min, param.type.max) == fastpath.INT_RANGES[param.name]
        if param.required and param.param_type_name == "option":
            assert param.name in fastpath.REQUIRED.get(name, ())


def test_the_root_options_match() -> None:
    # --version and shell completion exist only on the typer path (the fast path hands
    # any line it does not know to typer).
    assert click_options(typer.main.get_command(app)) == {
        **fastpath.GLOBAL_OPTIONS,
        "--version": ("version", fastpath.FLAG),
        "--install-completion": ("install_completion", fastpath.FLAG),
        "--show-completion": ("show_completion", fastpath.FLAG),
    }


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Calls:
    calls: Calls = []

    def recorder(name: str, result: Any = None) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, args, kwargs))
            return result

        return record

    monkeypatch.setattr(ops, "acquire", recorder("acquire"))
    monkeypatch.setattr(ops, "release", recorder("release"))
    monkeypatch.setattr(ops, "renew", recorder("renew"))
    monkeypatch.setattr(exec_cmd, "run", recorder("exec", 0))
    monkeypatch.delenv("DLM_CLUSTER", raising=False)
    return calls


SAME_LINES = [
    ["acquire", "k"],
    ["acquire", "k", "--ttl", "5m", "--wait=30s", "--limit", "3", "--lease", "abc"],
    ["acquire", "--meta", "a=1", "k", "--meta=b=2", "--format", "env", "--json"],
    ["--json", "--cluster", "a:1,b:2", "acquire", "k", "--timeout", "2s"],
    ["--cluster=a:1", "acquire", "k", "--cluster", "c:3", "--ttl", "1s", "--ttl", "2s"],
    ["release", "k", "--lease", "abc"],
    ["release", "--lease=abc", "k", "--json"],
    ["release", "k", "--lease", "abc", "--token", "17", "--keep-lease"],
    ["release", "--token=9223372036854775807", "--keep-lease", "k", "--lease=abc"],
    ["renew", "abc"],
    ["renew", "abc", "--keep-alive", "--timeout", "1s"],
    ["exec", "--lock", "k", "--", "true"],
    ["exec", "--lock", "k", "sh", "-c", "exit 3", "--json"],
    ["exec", "--lock=k", "--ttl", "3s", "--wait", "1m", "--kill-grace", "0", "--limit", "2",
     "--conflict-exit-code", "0", "--json", "--", "cmd", "--lock", "x"],
    ["--timeout", "1s", "exec", "--lock", "k", "--cluster", "h:9", "--", "--", "odd"],
    ["exec", "--lock", "k", "-q", "--", "true"],
    ["exec", "--lock", "k", "--min-hold", "30s", "--", "true"],
    ["exec", "--min-hold=25m", "--lock", "k", "--wait", "1m", "true"],
    ["exec", "--quiet", "--lock", "k", "--conflict-exit-code=3", "--kill-grace", "1s", "true"],
    ["--dial-timeout", "500ms", "acquire", "k", "--dial-timeout=3s"],
    ["renew", "abc", "--dial-timeout", "1s"],
    ["--secret-file", "/s", "acquire", "k", "--tls-ca=/ca"],
    ["acquire", "k", "--tls-ca", "/ca", "--tls-cert", "/c", "--tls-key", "/k", "--secret-file=/s"],
    ["--tls-ca", "/ca", "exec", "--lock", "k", "--secret-file", "/s", "--", "true"],
    ["release", "k", "--lease", "abc", "--secret-file", "/s"],
]  # fmt: skip


@pytest.mark.parametrize("line", SAME_LINES, ids=" ".join)
def test_both_paths_make_the_same_call(line: list[str], recorded: Calls) -> None:
    parsed = fastpath.parse(line)
    assert parsed is not None
    assert fastpath.run(parsed) == 0
    assert _run_typer(line, as_json=False) == 0
    fast, slow = recorded
    assert fast == slow


HANDED_OVER = [
    [],
    ["--help"],
    ["acquire", "--help"],
    ["acquire", "-h", "k"],
    ["acquire"],
    ["acquire", "k", "extra"],
    ["acquire", "k", "--ttl"],
    ["acquire", "k", "--ttl", "--json"],
    ["acquire", "k", "--limit", "0"],
    ["acquire", "k", "--limit", "two"],
    ["acquire", "k", "--limit", "-1"],
    ["acquire", "k", "--json=yes"],
    ["acquire", "k", "--bogus"],
    ["acquire", "--", "k"],
    ["acquire", "-x"],
    ["release", "k"],
    ["release", "k", "--lease", "abc", "--token", "0"],
    ["release", "k", "--lease", "abc", "--token", "-3"],
    ["release", "k", "--lease", "abc", "--token"],
    ["release", "k", "--lease", "abc", "--keep-lease=no"],
    ["renew"],
    ["exec", "--lock", "k"],
    ["exec", "--lock", "k", "--"],
    ["exec", "--", "true"],
    ["exec", "--lock", "k", "--conflict-exit-code", "256", "--", "true"],
    ["exec", "--lock", "k", "--help", "--", "true"],
    ["exec", "--lock", "k", "-qq", "--", "true"],
    ["exec", "--lock", "k", "--quiet=yes", "--", "true"],
    ["exec", "--lock", "k", "--min-hold", "--", "true"],
    ["lease", "list"],
    ["lease", "revoke", "abc"],
    ["status"],
    ["locks", "--json"],
    ["node", "start"],
    ["--version"],
    ["--install-completion"],
    ["--show-completion", "bash"],
    ["--json"],
    ["--bogus", "acquire", "k"],
]


@pytest.mark.parametrize("line", HANDED_OVER, ids=" ".join)
def test_anything_else_goes_to_typer(line: list[str]) -> None:
    assert fastpath.parse(line) is None
