"""Well-formed command lines of acquire, exec, release and renew, run without loading typer.

Why: these are the commands cron jobs and CI scripts run on every lock, and
importing typer (with its click, inspect, pathlib, typing machinery) and
building the command tree is the largest single part of their start-up,
more than the client, the codec and the round trips to the cluster together.

How it stays honest: this parser accepts only a strict subset, lines where
every word is an option it knows with a well-formed value, or the expected
arguments. Anything else (help, a typo, a missing or malformed value, an
unknown option, an integer out of range) returns None, and main hands the
line to the typer app, which gives the help or the usage error. The typer
app stays the definition of the command line: tests/unit/cli/test_fastpath.py
checks that the options below match the app's, and that both paths make the
same call for the same line.
"""

from __future__ import annotations

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

FLAG, VALUE, MULTI, INT = "flag", "value", "multi", "int"

# option -> (parameter name, kind)
GLOBAL_OPTIONS: dict[str, tuple[str, str]] = {
    "--cluster": ("cluster", VALUE),
    "--timeout": ("timeout", VALUE),
    "--dial-timeout": ("dial_timeout", VALUE),
    "--json": ("json", FLAG),
    "--secret-file": ("secret_file", VALUE),
    "--tls-ca": ("tls_ca", VALUE),
    "--tls-cert": ("tls_cert", VALUE),
    "--tls-key": ("tls_key", VALUE),
}

# command -> (positional parameter names, options)
COMMANDS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, str]]]] = {
    "acquire": (
        ("key",),
        {
            "--ttl": ("ttl", VALUE),
            "--wait": ("wait", VALUE),
            "--lease": ("lease", VALUE),
            "--limit": ("limit", INT),
            "--meta": ("meta", MULTI),
            "--format": ("output_format", VALUE),
            "--lock-delay": ("lock_delay", VALUE),
        },
    ),
    "release": (
        ("key",),
        {
            "--lease": ("lease", VALUE),
            "--token": ("token", INT),
            "--keep-lease": ("keep_lease", FLAG),
        },
    ),
    "renew": (("lease",), {"--keep-alive": ("keep_alive", FLAG)}),
    "exec": (
        (),
        {
            "--lock": ("lock", MULTI),
            "--ttl": ("ttl", VALUE),
            "--wait": ("wait", VALUE),
            "--kill-grace": ("kill_grace", VALUE),
            "--conflict-exit-code": ("conflict_exit_code", INT),
            "--quiet": ("quiet", FLAG),
            "-q": ("quiet", FLAG),
            "--verbose": ("verbose", FLAG),
            "-v": ("verbose", FLAG),
            "--limit": ("limit", INT),
            "--min-hold": ("min_hold", VALUE),
            "--on-busy": ("on_busy", VALUE),
            "--lock-delay": ("lock_delay", VALUE),
        },
    ),
}

# The ranges the typer app enforces (min/max of its int options).
INT_RANGES = {"limit": (1, None), "conflict_exit_code": (0, 255), "token": (1, None)}
REQUIRED = {"release": ("lease",), "exec": ("lock",)}


class Parsed:
    """A command line the fast path understood completely."""

    __slots__ = ("command", "params", "root")

    def __init__(self, command: str, root: dict[str, Any], params: dict[str, Any]) -> None:
        self.command = command
        self.root = root
        self.params = params

    def __repr__(self) -> str:
        return f"Parsed({self.command!r}, {self.root!r}, {self.params!r})"


def _int(text: str, name: str) -> int | None:
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    low, high = INT_RANGES.get(name, (None, None))
    if (low is not None and value < low) or (high is not None and value > high):
        return None
    return value


def _take_options(
    args: Sequence[str], i: int, table: dict[str, tuple[str, str]], into: dict[str, Any]
) -> int | None:
    """Consumes the option at ``args[i]`` into ``into``; the next index, or None to give up."""
    word = args[i]
    name, eq, inline = word.partition("=")
    spec = table.get(name)
    if spec is None:
        return None
    param, kind = spec
    if kind == FLAG:
        if eq:
            return None
        into[param] = True
        return i + 1
    if eq:
        value, nxt = inline, i + 1
    elif i + 1 < len(args):
        value, nxt = args[i + 1], i + 2
    else:
        return None
    if (value.startswith("-") and kind != VALUE) or value.startswith("--"):
        return None  # most likely a forgotten value; let typer say so
    if kind == INT:
        number = _int(value, param)
        if number is None:
            return None
        into[param] = number
    elif kind == MULTI:
        into.setdefault(param, []).append(value)
    else:
        into[param] = value
    return nxt


def parse(args: Sequence[str]) -> Parsed | None:
    """The command and its parameters, or None if typer should handle this line."""
    root: dict[str, Any] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        nxt = _take_options(args, i, GLOBAL_OPTIONS, root)
        if nxt is None:
            return None
        i = nxt
    if i >= len(args) or args[i] not in COMMANDS:
        return None
    command = args[i]
    positional_names, own = COMMANDS[command]
    table = {**own, **GLOBAL_OPTIONS}
    params: dict[str, Any] = {}
    positionals: list[str] = []
    i += 1
    while i < len(args):
        word = args[i]
        if command == "exec" and (word == "--" or not word.startswith("-")):
            rest = list(args[i + 1 :] if word == "--" else args[i:])
            if not rest:
                return None
            params["command"] = rest
            break
        if word.startswith("-"):
            if word in ("-h", "--help", "--"):
                return None
            nxt = _take_options(args, i, table, params)
            if nxt is None:
                return None
            i = nxt
            continue
        positionals.append(word)
        i += 1
    if command == "exec" and "command" not in params:
        return None
    if len(positionals) != len(positional_names):
        return None
    params.update(zip(positional_names, positionals, strict=True))
    if any(name not in params for name in REQUIRED.get(command, ())):
        return None
    return Parsed(command, root, params)


def run(parsed: Parsed) -> int:
    """Makes the same call the typer command would; returns the exit code."""
    from dlm.cli import settings as defaults
    from dlm.cli.settings import GlobalOptions, resolve

    top = parsed.root
    root = GlobalOptions(
        cluster=top.get("cluster"),
        timeout=top.get("timeout"),
        json=top.get("json", False),
        dial_timeout=top.get("dial_timeout"),
        secret_file=top.get("secret_file"),
        tls=(top.get("tls_ca"), top.get("tls_cert"), top.get("tls_key")),
    )
    p = parsed.params
    settings = resolve(
        root,
        p.get("cluster"),
        p.get("timeout"),
        p.get("json", False),
        p.get("dial_timeout"),
        secret_file=p.get("secret_file"),
        tls=(p.get("tls_ca"), p.get("tls_cert"), p.get("tls_key")),
    )
    if parsed.command == "acquire":
        from dlm.cli import ops

        ops.acquire(
            settings,
            key=p["key"],
            ttl=p.get("ttl", defaults.ACQUIRE_TTL),
            wait=p.get("wait"),
            lease=p.get("lease"),
            limit=p.get("limit", 1),
            meta_pairs=p.get("meta", []),
            output_format=p.get("output_format", defaults.ACQUIRE_FORMAT),
            lock_delay=p.get("lock_delay"),
        )
        return 0
    if parsed.command == "exec":
        from dlm.cli import exec_cmd, ops

        for key in p["lock"]:
            ops.check_lock_options(key, p.get("limit", 1), "--lock")
        return exec_cmd.run(
            settings,
            key=p["lock"][0],
            also=p["lock"][1:],
            command=p["command"],
            ttl=p.get("ttl", defaults.EXEC_TTL),
            wait=p.get("wait"),
            kill_grace=p.get("kill_grace", defaults.EXEC_KILL_GRACE),
            conflict_exit_code=p.get("conflict_exit_code"),
            limit=p.get("limit", 1),
            quiet=p.get("quiet", False),
            min_hold=p.get("min_hold"),
            verbose=p.get("verbose", False),
            on_busy=p.get("on_busy"),
            lock_delay=p.get("lock_delay"),
        )
    from dlm.cli import ops

    if parsed.command == "release":
        ops.release(
            settings,
            p["key"],
            p["lease"],
            token=p.get("token"),
            keep_lease=p.get("keep_lease", False),
        )
    else:
        ops.renew(settings, p["lease"], p.get("keep_alive", False))
    return 0
