"""The options every subcommand shares (--cluster, --timeout, --json) and the client they make.

Each may be given before the subcommand (``dlm --json status``) or after it
(``dlm status --json``); the later, more specific one wins, then the
environment (``DLM_CLUSTER``), then the default.
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
CLUSTER_ENV = "DLM_CLUSTER"

# Defaults of the subcommands, shared by the typer app and the fast path.
ACQUIRE_TTL = "30s"
ACQUIRE_FORMAT = "text"
EXEC_TTL = "30s"
EXEC_KILL_GRACE: str | None = None  # min(5s, TTL/4): dlm.cli.guard.default_grace
EXEC_CONFLICT_EXIT_CODE = 75


class Settings:
    """Where to find the cluster, how long to try, and how to answer."""

    __slots__ = ("json", "members", "timeout")

    def __init__(self, members: tuple[str, ...], timeout: float, json: bool) -> None:
        self.members = members
        self.timeout = timeout
        self.json = json

    def __repr__(self) -> str:
        return f"Settings(members={self.members!r}, timeout={self.timeout!r}, json={self.json!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        return (self.members, self.timeout, self.json) == (other.members, other.timeout, other.json)

    __hash__ = None  # type: ignore[assignment]

    def connect(self) -> Client:
        from dlm.client.sync import Client

        return Client(list(self.members), timeout=self.timeout)


class GlobalOptions:
    """What the root callback saw before the subcommand."""

    __slots__ = ("cluster", "json", "timeout")

    def __init__(
        self, cluster: str | None = None, timeout: str | None = None, json: bool = False
    ) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.json = json


def parse_members(text: str) -> tuple[str, ...]:
    from dlm.client.core import parse_members as parse

    try:
        return tuple(parse(text))
    except ValueError as exc:
        raise usage_error(f"bad --cluster {text!r}: {exc}") from None


def parse_timeout(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise usage_error(f"bad --timeout: {exc}") from None
    if seconds <= 0:
        raise usage_error("--timeout must be more than 0")
    return seconds


def resolve(root: Any, cluster: str | None, timeout: str | None, json_out: bool) -> Settings:
    """Merges the subcommand's own options over the root's, the environment and defaults."""
    top = root if isinstance(root, GlobalOptions) else GlobalOptions()
    cluster_text = cluster or top.cluster or os.environ.get(CLUSTER_ENV) or DEFAULT_CLUSTER
    timeout_text = timeout or top.timeout or DEFAULT_TIMEOUT
    return Settings(
        members=parse_members(cluster_text),
        timeout=parse_timeout(timeout_text),
        json=json_out or top.json,
    )
