"""`dlm status`, `dlm status KEY` and `dlm locks`: what the cluster and its locks look like.

Cluster status is put together from two sources: one linearizable ``status``
through the leader (term, leader, counts, membership), then each member asked
directly (a stale read of its own view, with a short timeout) for role, term,
commit and applied index. A member that does not answer is shown as
unreachable rather than failing the whole command, and if no quorum answers
the members are still shown before exiting 69: that is when an operator
needs them most.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from dlm.cli.durations import format_ms
from dlm.cli.exits import CliError, from_client_error
from dlm.cli.output import console, emit_json, say
from dlm.cli.settings import Settings

if TYPE_CHECKING:
    from dlm.client.sync import Client

# Each member gets at most this long to describe itself: the table is worth
# more with one member missing than late.
MEMBER_TIMEOUT = 1.0

MEMBER_FIELDS = ("id", "address", "role", "term", "commit", "applied", "lag", "reachable")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def gather_members(
    client: Client, members: list[dict[str, Any]], timeout: float
) -> list[dict[str, Any]]:
    """Asks every member for its own view, in parallel; keeps the given order."""
    addresses = [str(m.get("address") or "") for m in members]

    def ask(addr: str) -> dict[str, Any] | None:
        return client.member_status(addr, timeout) if addr else None

    with ThreadPoolExecutor(max_workers=max(1, min(len(addresses), 8))) as pool:
        views = list(pool.map(ask, addresses))
    return [merge_member(m, v) for m, v in zip(members, views, strict=True)]


def merge_member(member: dict[str, Any], view: dict[str, Any] | None) -> dict[str, Any]:
    """One row of the members table: what the leader listed plus what the member said."""
    row: dict[str, Any] = dict.fromkeys(MEMBER_FIELDS)
    row["id"] = _str(member.get("id")) or (_member_id(view) if view else None)
    row["address"] = _str(member.get("address"))
    row["reachable"] = view is not None
    if view is not None:
        row["role"] = _str(view.get("role"))
        row["term"] = _int(view.get("term"))
        row["commit"] = _int(view.get("commit"))
        row["applied"] = _int(view.get("applied"))
    return row


def fill_lag(rows: list[dict[str, Any]], reference: int | None) -> None:
    """lag = how many committed entries a member has yet to apply, against ``reference``."""
    for row in rows:
        if reference is not None and row["applied"] is not None:
            row["lag"] = max(0, reference - row["applied"])


def _member_id(view: dict[str, Any]) -> str | None:
    # A status reply names its member in "node" ("id" is the request id, and
    # the client strips it); "id" is still read for older members.
    return _str(view.get("node"))


def cluster_status(settings: Settings) -> None:
    from dlm.client.errors import ClusterUnavailable

    client = settings.connect()
    try:
        try:
            view = client.status()
        except ClusterUnavailable as exc:
            _report_unavailable(settings, client, exc)
            return
        result = summarize(client, view, min(MEMBER_TIMEOUT, settings.timeout))
    finally:
        client.close()
    if settings.json:
        emit_json(result)
    else:
        print_cluster(result)


def summarize(client: Client, view: dict[str, Any], member_timeout: float) -> dict[str, Any]:
    """The `dlm status --json` object, from one member's view and every member's own."""
    members = [m for m in view.get("members") or [] if isinstance(m, dict)]
    if not members:
        members = [{"id": _member_id(view), "address": view.get("address")}]
    rows = gather_members(client, members, member_timeout)
    leader = _str(view.get("leader"))
    # The leader's own commit index is the reference; the answering member's if the
    # leader did not answer us directly.
    leader_commit = next(
        (row["commit"] for row in rows if row["id"] == leader and row["commit"] is not None),
        _int(view.get("commit")),
    )
    fill_lag(rows, leader_commit)
    return {
        "cluster": _str(view.get("cluster")),
        "leader": leader,
        "leader_address": _str(view.get("leader_address")),
        "term": _int(view.get("term")),
        "commit": leader_commit,
        "members": rows,
        "sessions": _int(view.get("sessions")),
        "locks": _int(view.get("locks")),
        "waiters": _int(view.get("waiters")),
    }


def _report_unavailable(settings: Settings, client: Client, exc: Exception) -> None:
    """No quorum: show what each member we know of says, then fail with 69."""
    members = [{"id": None, "address": addr} for addr in settings.members]
    rows = gather_members(client, members, min(MEMBER_TIMEOUT, settings.timeout))
    fill_lag(rows, max((r["commit"] for r in rows if r["commit"] is not None), default=None))
    error = from_client_error(exc)
    if settings.json:
        emit_json({**error.to_json(), "members": rows})
        raise _Reported(error.exit_code)
    print_members(rows)
    raise error


class _Reported(CliError):
    """The error is already printed (as part of a JSON object); only the exit code is left."""

    def __init__(self, exit_code: int) -> None:
        super().__init__("REPORTED", "", exit_code)
        self.reported = True


def key_status(settings: Settings, key: str) -> None:
    client = settings.connect()
    try:
        state = client.get(key)
    finally:
        client.close()
    if settings.json:
        emit_json(state)
        return
    holders = [h for h in state.get("holders") or [] if isinstance(h, dict)]
    waiters = [w for w in state.get("waiters") or [] if isinstance(w, dict)]
    limit = _int(state.get("limit")) or 1
    if not holders and not waiters:
        say(f"{key} is free")
        return
    out = console()
    what = "lock" if limit == 1 else f"semaphore (limit {limit})"
    out.print(f"{key}: {what}, {len(holders)} holder(s), {len(waiters)} waiter(s)")
    table = _table("LEASE", "TOKEN", "HELD FOR", "TTL LEFT", "OWNER")
    for h in holders:
        table.add_row(
            str(h.get("lease", "?")),
            str(h.get("token", "?")),
            format_ms(_int(h.get("held_ms"))),
            format_ms(_int(h.get("remaining_ms"))),
            _meta(h.get("meta")),
        )
    out.print(table)
    if waiters:
        now_ms = server_now_ms(holders)
        queue = _table("#", "LEASE", "WAITING FOR", "OWNER")
        for i, w in enumerate(waiters, 1):
            since = _int(w.get("since_ms"))
            queue.add_row(
                str(_int(w.get("position")) or i),
                str(w.get("lease", "?")),
                format_ms(None if since is None else now_ms - since),
                _meta(w.get("meta")),
            )
        out.print(queue)


def server_now_ms(holders: list[dict[str, Any]]) -> int:
    """The answering member's clock, as far as a reply shows it (holder's grant time plus
    how long it has held); our own clock only when nobody holds the key."""
    for h in holders:
        granted, held = _int(h.get("granted_at_ms")), _int(h.get("held_ms"))
        if granted is not None and held is not None:
            return granted + held
    import time

    return int(time.time() * 1000)


def list_locks(settings: Settings, prefix: str) -> None:
    client = settings.connect()
    try:
        locks = client.list_locks(prefix)
    finally:
        client.close()
    if settings.json:
        emit_json({"prefix": prefix, "locks": locks})
        return
    if not locks:
        say(f"no locks held{f' under {prefix!r}' if prefix else ''}")
        return
    table = _table("KEY", "LEASE", "TOKEN", "HELD FOR", "TTL LEFT", "WAITERS", "OWNER")
    for lock in locks:
        holders = [h for h in lock.get("holders") or [] if isinstance(h, dict)] or [{}]
        for h in holders:
            table.add_row(
                str(lock.get("key", "?")),
                str(h.get("lease", "-")),
                str(h.get("token", "-")),
                format_ms(_int(h.get("held_ms"))),
                format_ms(_int(h.get("remaining_ms"))),
                str(lock.get("waiters", 0)),
                _meta(h.get("meta")),
            )
    console().print(table)


def _meta(meta: Any) -> str:
    if not isinstance(meta, dict):
        return ""
    return " ".join(f"{k}={v}" for k, v in meta.items())


def _table(*columns: str) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in columns:
        # Ids and numbers stay whole (people copy them); the owner column takes the squeeze.
        table.add_column(column, no_wrap=column != "OWNER", overflow="fold")
    return table


def print_cluster(result: dict[str, Any]) -> None:
    leader = result.get("leader") or "none"
    say(
        f"cluster {result.get('cluster') or '-'}: leader {leader}, term {result.get('term')}, "
        f"commit {result.get('commit')}; {result.get('sessions')} sessions, "
        f"{result.get('locks')} locks, {result.get('waiters')} waiters"
    )
    print_members(result["members"])


def print_members(rows: list[dict[str, Any]]) -> None:
    table = _table("ID", "ADDRESS", "ROLE", "TERM", "COMMIT", "APPLIED", "LAG", "REACHABLE")
    for r in rows:
        table.add_row(
            *("-" if r[f] is None else str(r[f]) for f in MEMBER_FIELDS[:-1]),
            "yes" if r["reachable"] else "NO",
        )
    console().print(table)
