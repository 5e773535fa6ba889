"""`dlm config set|get|list`: the cluster-wide settings, changed through the log.

Three settings (dlm/node/locks/settings.py), each a duration: ``default-ttl`` (the TTL
of a lease whose open names none), ``max-ttl`` (no lease opened or updated above it:
refused with one line naming the limit), ``lock-delay`` (the lock-delay of a lease that
names none). ``0`` (or ``none``) unsets one. Admins only (exit 77 otherwise); each set
is an entry of the Raft log, so every member applies it at the same point, and the
audit log says who set what (``admin_action``, ``action: config_set``).

The cluster must run version 5 (every member on this release): until then a member
refuses with one line saying an upgrade is in progress.

In a partitioned cluster every partition's group keeps its own copy: `dlm config set`
writes each in turn (dlm/cli/fanout.py) and names the partitions that did not take it;
running it again completes it. `get` and `list` read partition 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from dlm.cli.connection_options import with_settings
from dlm.cli.settings import Settings

if TYPE_CHECKING:
    from dlm.client.sync import Client

config_app = typer.Typer(
    help="Cluster-wide settings, changed through the log: default-ttl, max-ttl, lock-delay "
    "(admins only).",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)

UNSET_WORDS = ("0", "none", "unset", "off")

SettingArg = Annotated[
    str,
    typer.Argument(
        metavar="SETTING", help="default-ttl, max-ttl or lock-delay.", show_default=False
    ),
]


def _check_setting(name: str) -> str:
    from dlm.cli.exits import usage_error
    from dlm.cli.output import escape
    from dlm.node.locks.settings import KEYS

    if name not in KEYS:
        raise usage_error(f"unknown setting '{escape(name)}': the settings are {', '.join(KEYS)}")
    return name


def parse_value(name: str, text: str) -> int:
    """The value of ``dlm config set NAME TEXT`` in ms (0: unset); a usage error, one
    line, when it is no duration or out of the setting's bounds."""
    from dlm.cli.exits import usage_error
    from dlm.cli.output import escape
    from dlm.durations import DurationError, parse_duration_ms
    from dlm.node.locks.settings import setting_problem

    if text.strip().lower() in UNSET_WORDS:
        return 0
    try:
        value = parse_duration_ms(text)
    except DurationError as exc:
        raise usage_error(f"bad VALUE '{escape(text)}' for {name}: {exc}") from None
    problem = setting_problem(name, value)
    if problem is not None:
        raise usage_error(problem)
    return value


def _shown(value: int | None) -> str:
    from dlm.durations import format_ms

    return "(not set)" if not value else format_ms(value)


def _read(settings: Settings, setting: str | None) -> dict[str, Any]:
    from dlm.wire import ConfigGet

    client: Client = settings.connect()
    try:
        # A read that names no key: the client sends it as it sends the identity reads.
        answer = client.auth_change(cast(Any, ConfigGet(id=0, setting=setting)))
    finally:
        client.close()
    rows = answer.get("settings")
    return rows if isinstance(rows, dict) else {}


@config_app.command("set")
@with_settings
def config_set(
    *,
    settings: Settings,
    setting: SettingArg,
    value: Annotated[
        str,
        typer.Argument(
            metavar="VALUE",
            help="A duration (10s, 5m, 1h), or 0 to unset.",
            show_default=False,
        ),
    ],
) -> None:
    """Set a cluster-wide setting for every member (admins only). max-ttl refuses new
    leases and TTL updates above it; leases already open keep their TTL."""
    from dlm.cli.fanout import FanOut, settle, to_every_partition
    from dlm.cli.output import emit_json, say
    from dlm.wire import ConfigSet

    name = _check_setting(setting)
    value_ms = parse_value(name, value)
    request = ConfigSet(id=0, setting=name, value_ms=value_ms)
    client: Client = settings.connect()
    try:
        result: FanOut[dict[str, Any]] = to_every_partition(
            lambda: int(getattr(client, "partitions", 1)),
            lambda p: client.auth_change(request, partition=p),
        )
    finally:
        client.close()
    settle(result, f"config set {name}")
    partitions = {"partitions": result.partitions} if result.partitions > 1 else {}
    if settings.json:
        emit_json({"set": {"setting": name, "value_ms": value_ms or None}, **partitions})
        return
    say(f"{name} is {_shown(value_ms)}" if value_ms else f"{name} is unset")


@config_app.command("get")
@with_settings
def config_get(
    *,
    settings: Settings,
    setting: Annotated[
        str | None,
        typer.Argument(
            metavar="[SETTING]",
            help="default-ttl, max-ttl or lock-delay. [default: every one]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show a cluster-wide setting (or every one), as the leader has applied it."""
    _show(settings, _check_setting(setting) if setting is not None else None)


@config_app.command("list")
@with_settings
def config_list(*, settings: Settings) -> None:
    """Show every cluster-wide setting, as the leader has applied it."""
    _show(settings, None)


def _show(settings: Settings, setting: str | None) -> None:
    from dlm.cli.output import emit_json, print_table, say

    rows = _read(settings, setting)
    if settings.json:
        emit_json({"settings": rows})
        return
    if setting is not None:
        say(_shown(rows.get(setting)))
        return
    print_table(("SETTING", "VALUE"), [[name, _shown(value)] for name, value in rows.items()])
