"""The connection options are declared once: every command that talks to the cluster
gets all of them, named and ordered alike, and its body gets them resolved."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import pytest
import typer

from dlm.cli.app import app
from dlm.cli.connection_options import CONNECTION_PARAMETERS, remembers_options, with_settings
from dlm.cli.settings import Credentials, Settings

CONNECTION_NAMES = [parameter.name for parameter in CONNECTION_PARAMETERS]
# The commands that never talk to the cluster through a client.
OFFLINE = {
    "node start",
    "node restore",
    "node recover",
    "store inspect",
    "secret new",
    "snapshot inspect",
    "gateway",  # relays bytes; its --cluster names the members it may dial
}


def leaf_commands(group: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    for name, command in group.commands.items():
        full = f"{path} {name}".strip()
        if hasattr(command, "commands"):
            yield from leaf_commands(command, full)
        else:
            yield full, command


def option_names(command: Any) -> list[str]:
    return [
        param.name
        for param in command.params
        if param.param_type_name == "option" and "--help" not in param.opts
    ]


def test_every_cluster_command_ends_with_the_connection_options_in_one_order() -> None:
    commands = dict(leaf_commands(typer.main.get_command(app)))
    assert commands.keys() >= OFFLINE
    online = {path: command for path, command in commands.items() if path not in OFFLINE}
    assert {"acquire", "exec", "lease revoke", "members promote"} <= online.keys()
    for path, command in online.items():
        names = option_names(command)
        assert names[-len(CONNECTION_NAMES) :] == CONNECTION_NAMES, path
        assert len(set(names)) == len(names), path


def test_the_root_lists_them_first_then_version() -> None:
    names = option_names(typer.main.get_command(app))
    assert names[: len(CONNECTION_NAMES) + 1] == [*CONNECTION_NAMES, "version"]


def toy_app(seen: list[Settings]) -> typer.Typer:
    toy = typer.Typer(add_completion=False)

    @toy.callback()
    @remembers_options
    def root() -> None:
        """A root that keeps what it saw."""

    @toy.command()
    @with_settings
    def show(*, settings: Settings, key: Annotated[str, typer.Argument(metavar="KEY")]) -> None:
        """Records what it was given."""
        assert key == "k"
        seen.append(settings)

    return toy


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["show", "k"], Settings(("127.0.0.1:7700",), 10.0, False, 2.0)),
        (
            ["--cluster", "a:1", "--json", "--tls-ca", "/ca", "show", "k", "--timeout", "3s"],
            Settings(("a:1",), 3.0, True, 2.0, Credentials(None, "/ca", None, None)),
        ),
        (
            ["--cluster", "a:1", "--secret-file", "/s", "show", "--cluster", "b:2", "k",
             "--dial-timeout", "500ms", "--tls-cert", "/c", "--tls-key", "/k"],
            Settings(("b:2",), 10.0, False, 0.5, Credentials("/s", None, "/c", "/k")),
        ),
    ],
)  # fmt: skip
def test_the_body_gets_the_options_before_and_after_the_subcommand_merged(
    args: list[str], expected: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("DLM_CLUSTER", "DLM_SECRET_FILE", "DLM_TLS_CA", "DLM_TLS_CERT", "DLM_TLS_KEY"):
        monkeypatch.delenv(variable, raising=False)
    seen: list[Settings] = []
    command = typer.main.get_command(toy_app(seen))
    command.main(args=args, prog_name="toy", standalone_mode=False)
    assert seen == [expected]


def test_a_body_without_settings_or_with_a_positional_parameter_is_refused() -> None:
    def no_settings(*, key: str) -> None:
        del key

    def positional(key: str, *, settings: Settings) -> None:
        del key, settings

    with pytest.raises(TypeError, match="'settings'"):
        with_settings(no_settings)
    with pytest.raises(TypeError, match="keyword-only"):
        with_settings(positional)
