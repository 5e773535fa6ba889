"""The options every subcommand shares and the client they make.

--cluster, --timeout, --dial-timeout and --json may each be given before the
subcommand (``dlm --json status``) or after it (``dlm status --json``); the
later, more specific one wins, then the environment (``DLM_CLUSTER``), then
the default.

Two budgets, as etcdctl has: --dial-timeout bounds how long a command waits
for any member to answer at all (a wrong address, a cluster that is down),
and --timeout how long it keeps trying to reach a quorum once members answer
(an election, a lost majority).
"""

from __future__ import annotations

import os

from dlm.cli.durations import DurationError, parse_duration
from dlm.cli.exits import usage_error

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from dlm.client.sync import Client

DEFAULT_CLUSTER = "127.0.0.1:7700"
DEFAULT_TIMEOUT = "10s"
DEFAULT_DIAL_TIMEOUT = "2s"
CLUSTER_ENV = "DLM_CLUSTER"

# Defaults of the subcommands, shared by the typer app and the fast path.
ACQUIRE_TTL = "30s"
ACQUIRE_FORMAT = "text"
EXEC_TTL = "30s"
EXEC_KILL_GRACE: str | None = None  # min(5s, TTL/4): dlm.cli.guard.default_grace
EXEC_CONFLICT_EXIT_CODE = 75


class Settings:
    """Where to find the cluster, how long to try, and how to answer."""

    __slots__ = ("dial_timeout", "json", "members", "timeout")

    def __init__(
        self, members: tuple[str, ...], timeout: float, json: bool, dial_timeout: float = 2.0
    ) -> None:
        self.members = members
        self.timeout = timeout
        self.json = json
        self.dial_timeout = dial_timeout

    def __repr__(self) -> str:
        return (
            f"Settings(members={self.members!r}, timeout={self.timeout!r}, json={self.json!r}, "
            f"dial_timeout={self.dial_timeout!r})"
        )

    def _fields(self) -> tuple[object, ...]:
        return (self.members, self.timeout, self.json, self.dial_timeout)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def connect(self) -> Client:
        from dlm.client.sync import Client

        return Client(list(self.members), timeout=self.timeout, dial_timeout=self.dial_timeout)


class GlobalOptions:
    """What the root callback saw before the subcommand."""

    __slots__ = ("cluster", "dial_timeout", "json", "timeout")

    def __init__(
        self,
        cluster: str | None = None,
        timeout: str | None = None,
        json: bool = False,
        dial_timeout: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.json = json
        self.dial_timeout = dial_timeout


def parse_members(text: str, source: str = "--cluster") -> tuple[str, ...]:
    """The member addresses; a usage error naming ``source`` (the option or variable)."""
    from dlm.client.core import parse_members as parse

    if "://" in text:
        # http://host:port parses as host "http" and a bad port: say what is wrong instead.
        raise usage_error(f"{source} takes HOST:PORT[,HOST:PORT...], not a URL (got {text!r})")
    try:
        return tuple(parse(text))
    except ValueError as exc:
        raise usage_error(f"bad {source} {text!r}: {exc}") from None


def parse_timeout(text: str, option: str = "--timeout") -> float:
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise usage_error(f"bad {option}: {exc}") from None
    if seconds <= 0:
        raise usage_error(f"{option} must be more than 0")
    return seconds


def resolve(
    root: Any,
    cluster: str | None,
    timeout: str | None,
    json_out: bool,
    dial_timeout: str | None = None,
) -> Settings:
    """Merges the subcommand's own options over the root's, the environment and defaults."""
    top = root if isinstance(root, GlobalOptions) else GlobalOptions()
    cluster_text = cluster or top.cluster
    source = "--cluster"
    if not cluster_text and os.environ.get(CLUSTER_ENV):
        cluster_text, source = os.environ[CLUSTER_ENV], CLUSTER_ENV
    timeout_text = timeout or top.timeout or DEFAULT_TIMEOUT
    dial_text = dial_timeout or top.dial_timeout or DEFAULT_DIAL_TIMEOUT
    return Settings(
        members=parse_members(cluster_text or DEFAULT_CLUSTER, source),
        timeout=parse_timeout(timeout_text),
        json=json_out or top.json,
        dial_timeout=parse_timeout(dial_text, "--dial-timeout"),
    )
