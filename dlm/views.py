"""The read replies and views, as records: what ``get``, ``list``, ``lease_info``,
``lease_list``, ``status`` and ``members`` answer.

They are reply records like those in dlm.wire (built by dlm/node/replies.py, read back
by ``dlm status`` and ``dlm members``), kept in a room of their own so that the commands
that never read them (``dlm acquire``, ``dlm exec``) do not pay for defining them at
start-up. Read back leniently: a member of an older release leaves fields out, and the
commands show what they can.
"""

from __future__ import annotations

from dlm.wire import (
    Reply,
    _as_sent,
    _reply_opt_int,
    _reply_opt_text,
    _reply_text,
    _reply_true,
    field,
)

# typing stays off the import path of `dlm status` (see wire.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    R = TypeVar("R", bound=Reply)


def _reply_not_false(msg: dict[Any, Any], name: str) -> bool:
    # Only a member that says so is unreachable: one of an early release says nothing.
    return msg.get(name) is not False


class HolderView(Reply):
    """One holder of a lock; the lease terms only from the leader."""

    lease: str = field(_as_sent)
    token: int = field(_as_sent)
    granted_at_ms: int = field(_as_sent)
    held_ms: int = field(_as_sent)
    meta: dict[str, str] = field(_as_sent)
    ttl_ms: int | None = field(_as_sent, default=None, omit=True)
    remaining_ms: int | None = field(_as_sent, default=None, omit="ttl_ms")
    finished_at_ms: int | None = field(_as_sent, default=None, omit=True)
    hold_until_ms: int | None = field(_as_sent, default=None, omit=True)


class WaiterView(Reply):
    """One place in a lock's queue (``position`` 1 is next)."""

    lease: str = field(_as_sent)
    since_ms: int = field(_as_sent)
    position: int = field(_as_sent)
    meta: dict[str, str] = field(_as_sent)


class LockState(Reply):
    """The answer to ``get``, and one item of a ``list`` page."""

    key: str = field(_as_sent)
    limit: int = field(_as_sent)
    holders: list[HolderView] = field(_as_sent)
    waiters: list[WaiterView] = field(_as_sent)


class LocksPage(Reply):
    """The answer to ``list``; ``next`` is the cursor of the next page (None: the last)."""

    locks: list[LockState] = field(_as_sent)
    next: str | None = field(_as_sent)


class LeaseState(Reply):
    """The answer to ``lease_info``."""

    lease: str = field(_as_sent)
    ttl_ms: int = field(_as_sent)
    remaining_ms: int | None = field(_as_sent)
    keys: list[str] = field(_as_sent)
    waiting: list[str] = field(_as_sent)


class LeaseSummary(Reply):
    """One item of a ``lease_list`` page; ``left_ms`` only from the leader."""

    id: str = field(_as_sent)
    ttl_ms: int = field(_as_sent)
    left_ms: int | None = field(_as_sent)
    holding: list[str] = field(_as_sent)
    waiting: list[str] = field(_as_sent)
    meta: dict[str, str] = field(_as_sent)
    owner: str = field(_reply_text, default="")
    """The identity that opened the lease ("" for one opened before identities, or by a
    member of an earlier release, which does not send it)."""


class LeasesPage(Reply):
    """The answer to ``lease_list``."""

    leases: list[LeaseSummary] = field(_as_sent)
    next: str | None = field(_as_sent)


class MemberEntry(Reply):
    """A member as a ``status`` lists it: its address and whether it votes."""

    id: str | None = field(_reply_opt_text)
    address: str | None = field(_reply_opt_text)
    role: str | None = field(_reply_opt_text)


class Progress(Reply):
    """The leader's view of one member's log."""

    match: int | None = field(_reply_opt_int)
    next: int | None = field(_reply_opt_int)
    active: bool = field(_reply_true)
    last_contact_ms: int | None = field(_reply_opt_int)


def _reply_waiters(msg: dict[Any, Any], name: str) -> int | None:
    # A count; a member of the first release listed the waiters instead.
    value = msg.get(name)
    return len(value) if isinstance(value, list) else _reply_opt_int(msg, name)


class StatusView(Reply):
    """The answer to ``status``: one member's view of the cluster (``progress``: the
    leader's only). Read back leniently: a member of an older release leaves fields out,
    and ``dlm status`` shows what it can."""

    node: str | None = field(_reply_opt_text)
    address: str | None = field(_reply_opt_text)
    cluster: str | None = field(_reply_opt_text)
    role: str | None = field(_reply_opt_text)
    term: int | None = field(_reply_opt_int)
    leader: str | None = field(_reply_opt_text)
    leader_address: str | None = field(_reply_opt_text)
    commit: int | None = field(_reply_opt_int)
    applied: int | None = field(_reply_opt_int)
    first_index: int | None = field(_reply_opt_int)
    last_index: int | None = field(_reply_opt_int)
    members: list[MemberEntry] = field(lambda msg, name: _reply_records(MemberEntry, msg, name))
    sessions: int | None = field(_reply_opt_int)
    locks: int | None = field(_reply_opt_int)
    waiters: int | None = field(_reply_waiters)
    version: int | None = field(_reply_opt_int)
    cluster_version: int | None = field(_reply_opt_int)
    progress: dict[str, Progress] | None = field(
        lambda msg, name: _reply_record_map(Progress, msg, name), default=None, omit=True
    )


class MemberHealth(Reply):
    """A member as ``members`` lists it: its role as this member sees it, and its log."""

    id: str | None = field(_reply_opt_text)
    address: str | None = field(_reply_opt_text)
    role: str | None = field(_reply_opt_text)
    match: int | None = field(_reply_opt_int)
    lag: int | None = field(_reply_opt_int)
    reachable: bool = field(_reply_not_false)
    last_contact_ms: int | None = field(_reply_opt_int)
    reason: str = field(_reply_text, default="")
    """Why a learner is not a voter yet ("" for a voter, or from an earlier release)."""


def _reply_names(msg: dict[Any, Any], name: str) -> dict[str, str]:
    value = msg.get(name)
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


class MembersView(Reply):
    """The answer to ``members``; ``bootstrap``: the members the cluster started with."""

    members: list[MemberHealth] = field(lambda msg, name: _reply_records(MemberHealth, msg, name))
    leader: str | None = field(_reply_opt_text)
    bootstrap: dict[str, str] = field(_reply_names)


def _reply_records(kind: type[R], msg: dict[Any, Any], name: str) -> list[R]:
    """The maps of a list field as ``kind`` records; anything else in it is passed over."""
    value = msg.get(name)
    if not isinstance(value, list):
        return []
    return [kind.from_wire(item) for item in value if isinstance(item, dict)]


def _reply_record_map(kind: type[R], msg: dict[Any, Any], name: str) -> dict[str, R] | None:
    """A map field of records by name (None when absent or not a map)."""
    value = msg.get(name)
    if not isinstance(value, dict):
        return None
    return {k: kind.from_wire(v) for k, v in value.items() if isinstance(v, dict)}
