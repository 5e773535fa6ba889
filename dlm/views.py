"""The read replies and views, as records: what ``get``, ``list``, ``lease_info``,
``lease_list``, ``status`` and ``members`` answer.

They are reply records like those in dlm.wire: built by dlm/node/replies.py, read back
once, where a reply arrives, by the clients' reads (``Client.get``, ``list_locks``,
``lease_info``, ``list_leases``) and by ``dlm status`` and ``dlm members``. They are kept
in a room of their own so that the commands that never read them (``dlm acquire``, ``dlm
exec``) do not pay for defining them at start-up. Read back leniently: a member of an
older release leaves fields out (None then), and the commands show what they can; a
field a command cannot do without (a page's items) is refused, BAD_REPLY.
"""

from __future__ import annotations

from dlm.wire import (
    ProtocolError,
    Reply,
    _reply_opt_int,
    _reply_opt_text,
    _reply_text,
    _reply_texts,
    _reply_true,
    field,
)

# typing stays off the import path of `dlm status` (see wire.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Self, TypeVar

    R = TypeVar("R", bound=Reply)


def _reply_not_false(msg: dict[Any, Any], name: str) -> bool:
    # Only a member that says so is unreachable: one of an early release says nothing.
    return msg.get(name) is not False


def _reply_names(msg: dict[Any, Any], name: str) -> dict[str, str]:
    """A map of strings (metadata, addresses); other entries are passed over."""
    value = msg.get(name)
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


class SentView(Reply):
    """A view a command may show as JSON, exactly as the member sent it.

    Read back (``from_wire``), it keeps the map it was read from, and ``to_wire`` gives
    that map back: ``--json`` shows what the cluster said (a field an older member left
    out stays out, one a newer member added stays in), while the commands read the
    typed fields. Built by a member, it is a reply record like any other.
    """

    __slots__ = ("_sent",)

    @classmethod
    def from_wire(cls, obj: Any) -> Self:
        record = super().from_wire(obj)
        object.__setattr__(record, "_sent", obj)
        return record

    def to_wire(self) -> dict[str, Any]:
        sent: dict[str, Any] | None = getattr(self, "_sent", None)
        return dict(sent) if sent is not None else super().to_wire()


class HolderView(SentView):
    """One holder of a lock; the lease terms only from the leader."""

    lease: str | None = field(_reply_opt_text)
    token: int | None = field(_reply_opt_int)
    granted_at_ms: int | None = field(_reply_opt_int)
    held_ms: int | None = field(_reply_opt_int)
    meta: dict[str, str] = field(_reply_names)
    ttl_ms: int | None = field(_reply_opt_int, default=None, omit=True)
    remaining_ms: int | None = field(_reply_opt_int, default=None, omit="ttl_ms")
    finished_at_ms: int | None = field(_reply_opt_int, default=None, omit=True)
    hold_until_ms: int | None = field(_reply_opt_int, default=None, omit=True)


class WaiterView(SentView):
    """One place in a lock's queue (``position`` 1 is next)."""

    lease: str | None = field(_reply_opt_text)
    since_ms: int | None = field(_reply_opt_int)
    position: int | None = field(_reply_opt_int)
    meta: dict[str, str] = field(_reply_names)


def _reply_waiter_list(msg: dict[Any, Any], name: str) -> list[WaiterView] | int:
    # A member of the first release counted a lock's waiters instead of listing them.
    value = msg.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _reply_records(WaiterView, msg, name)


class LockState(SentView):
    """The answer to ``get``, and one item of a ``list`` page. ``waiters`` is a count
    from a member of the first release."""

    key: str | None = field(_reply_opt_text)
    limit: int | None = field(_reply_opt_int)
    holders: list[HolderView] = field(lambda msg, name: _reply_records(HolderView, msg, name))
    waiters: list[WaiterView] | int = field(_reply_waiter_list)
    lock_delay_ms: int | None = field(_reply_opt_int, default=None, omit=True)
    """Set while the key is in a lock-delay (granted to nobody): its length."""
    lock_delay_lease: str | None = field(_reply_opt_text, default=None, omit="lock_delay_ms")
    """The lease whose expiry or revocation started the delay."""
    lock_delay_until_ms: int | None = field(_reply_opt_int, default=None, omit="lock_delay_ms")
    """When the delay ends by the wall clock of the leader that started it (a later leader
    counts the whole delay again from its election, so it may end later)."""
    lock_delay_remaining_ms: int | None = field(_reply_opt_int, default=None, omit=True)
    """How long the delay still lasts by the leader's clock (only the leader knows)."""

    @property
    def waiting(self) -> int:
        """How many wait, listed or counted."""
        waiters = self.waiters
        return waiters if isinstance(waiters, int) else len(waiters)


class LocksPage(Reply):
    """The answer to ``list``; ``next`` is the cursor of the next page (None: the last)."""

    locks: list[LockState] = field(lambda msg, name: _reply_page(LockState, msg, name))
    next: str | None = field(_reply_opt_text)


class LeaseState(SentView):
    """The answer to ``lease_info``."""

    lease: str | None = field(_reply_opt_text)
    ttl_ms: int | None = field(_reply_opt_int)
    remaining_ms: int | None = field(_reply_opt_int)
    keys: list[str] = field(_reply_texts)
    waiting: list[str] = field(_reply_texts)


class LeaseSummary(SentView):
    """One item of a ``lease_list`` page; ``left_ms`` only from the leader."""

    id: str | None = field(_reply_opt_text)
    ttl_ms: int | None = field(_reply_opt_int)
    left_ms: int | None = field(_reply_opt_int)
    holding: list[str] = field(_reply_texts)
    waiting: list[str] = field(_reply_texts)
    meta: dict[str, str] = field(_reply_names)
    owner: str | None = field(_reply_opt_text, default=None)
    """The identity that opened the lease (absent or "" for one opened before identities, or
    listed by a member of an earlier release)."""


class LeasesPage(Reply):
    """The answer to ``lease_list``."""

    leases: list[LeaseSummary] = field(lambda msg, name: _reply_page(LeaseSummary, msg, name))
    next: str | None = field(_reply_opt_text)


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


class StatusView(SentView):
    """The answer to ``status``: one member's view of the cluster (``progress``: the
    leader's only). Read back leniently: a member of an older release leaves fields out,
    and ``dlm status`` shows what it can. ``Client.status`` and ``member_status`` give it;
    ``to_wire`` is the map the member sent."""

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
    incarnation: int | None = field(_reply_opt_int, default=None, omit=True)
    """The cluster incarnation (left out, None, for a cluster never restored or recovered,
    and by older members)."""
    quarantine_ms: int | None = field(_reply_opt_int, default=None, omit=True)
    """While quarantined after a restore or recovery: its length (else left out)."""
    quarantined_until_ms: int | None = field(_reply_opt_int, default=None, omit=True)
    """While quarantined: when it ends, as its leader said (0: not said yet)."""
    partition: int | None = field(_reply_opt_int, default=None, omit=True)
    """Which partition this view is of (left out, None, in a cluster of one partition)."""
    partitions: int | None = field(_reply_opt_int, default=None, omit=True)
    """The cluster's partition count (left out, None, in a cluster of one partition)."""
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


class MembersView(SentView):
    """The answer to ``members`` and to a membership change; ``bootstrap``: the members the
    cluster started with. ``Client.members_view`` and ``add_member`` (...) give it;
    ``to_wire`` is the map the member sent."""

    members: list[MemberHealth] = field(lambda msg, name: _reply_records(MemberHealth, msg, name))
    leader: str | None = field(_reply_opt_text)
    bootstrap: dict[str, str] = field(_reply_names)
    incarnation: int | None = field(_reply_opt_int, default=None, omit=True)
    """The cluster incarnation: a member that joins takes it (left out: 0)."""


def _reply_records(kind: type[R], msg: dict[Any, Any], name: str) -> list[R]:
    """The maps of a list field as ``kind`` records; anything else in it is passed over."""
    value = msg.get(name)
    if not isinstance(value, list):
        return []
    return [kind.from_wire(item) for item in value if isinstance(item, dict)]


def _reply_page(kind: type[R], msg: dict[Any, Any], name: str) -> list[R]:
    """A page's items: the client cannot go on without the list (BAD_REPLY)."""
    if not isinstance(msg.get(name), list):
        raise ProtocolError(f"reply field {name!r} is missing or not a list")
    return _reply_records(kind, msg, name)


def _reply_record_map(kind: type[R], msg: dict[Any, Any], name: str) -> dict[str, R] | None:
    """A map field of records by name (None when absent or not a map)."""
    value = msg.get(name)
    if not isinstance(value, dict):
        return None
    return {k: kind.from_wire(v) for k, v in value.items() if isinstance(v, dict)}
