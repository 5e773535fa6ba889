"""`dlm status`, `dlm status KEY`, `dlm locks`, `dlm lease list`: the cluster, its locks, leases.

Cluster status is put together from two sources: one linearizable ``status``
through the leader (term, leader, counts, membership, and each member's
replication progress and last contact as the leader sees them), then each
member asked directly (a stale read of its own view, with a short timeout)
for role, term, commit and applied index. A member that does not answer is
shown as unreachable rather than failing the whole command, and if no quorum
answers the members are still shown before exiting 69: that is when an
operator needs them most. dlm.cli.health turns the figures into a verdict.

Three formats: rich tables for a terminal, tab-separated rows for a pipe
(one header line, then one line per row), and JSON (exact values, as the
cluster sent them). The two human formats show keys and metadata through
output.escape and translate Raft's words (a pre-candidate is a candidate).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from dlm.cli import health
from dlm.cli.exits import CHECK_FAILED, OK, UNAVAILABLE, CliError, usage_error
from dlm.cli.output import (
    JSON,
    TABLE,
    TSV,
    Styled,
    console,
    emit_json,
    emit_tsv,
    escape,
    format_meta,
    iso_local,
    make_table,
    print_table,
    say,
    stdout_is_terminal,
)
from dlm.cli.settings import Settings
from dlm.durations import format_ms
from dlm.views import (
    HolderView,
    LeaseSummary,
    LockState,
    MemberEntry,
    MemberHealth,
    Progress,
    StatusView,
    WaiterView,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from rich.console import RenderableType

    from dlm.client.sync import Client

# Each member gets at most this long to describe itself: the table is worth
# more with one member missing than late.
MEMBER_TIMEOUT = 1.0

MEMBER_FIELDS = (
    "id",
    "address",
    "role",
    "term",
    "commit",
    "applied",
    "lag",
    "last_contact_ms",
    "voter",
    "reachable",
)

# Raft's words for people: a pre-candidate is a candidate that has not yet bumped its term.
HUMAN_ROLES = {"pre_candidate": "candidate", "precandidate": "candidate"}


def human_role(role: Any) -> str:
    if not isinstance(role, str) or not role:
        return "-"
    return HUMAN_ROLES.get(role, role)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------------
# Putting the cluster's picture together
# ---------------------------------------------------------------------------


def gather_members(
    client: Client, members: Sequence[MemberEntry | MemberHealth], timeout: float
) -> list[dict[str, Any]]:
    """Asks every member for its own view, in parallel; keeps the given order."""
    return gather_views(client, members, timeout)[0]


def gather_views(
    client: Client, members: Sequence[MemberEntry | MemberHealth], timeout: float
) -> tuple[list[dict[str, Any]], list[StatusView | None]]:
    """The members table and each member's own view (None: it did not answer)."""
    addresses = [m.address or "" for m in members]

    def ask(addr: str) -> StatusView | None:
        return client.member_status(addr, timeout) if addr else None

    with ThreadPoolExecutor(max_workers=max(1, min(len(addresses), 8))) as pool:
        views = list(pool.map(ask, addresses))
    return [merge_member(m, v) for m, v in zip(members, views, strict=True)], views


def merge_member(member: MemberEntry | MemberHealth, view: StatusView | None) -> dict[str, Any]:
    """One row of the members table: what the leader listed plus what the member said."""
    row: dict[str, Any] = dict.fromkeys(MEMBER_FIELDS)
    row["id"] = member.id or (view.node if view else None)
    row["address"] = member.address
    row["reachable"] = view is not None
    # The list the status reply carries (version 2) says who votes; a learner that was
    # promoted a moment ago may not know it yet. Without a list, the member's own account.
    if member.role is not None:
        row["voter"] = member.role != "learner"
    else:
        row["voter"] = (view.role if view else None) != "learner"
    if view is not None:
        row["role"] = view.role
        row["term"] = view.term
        row["commit"] = view.commit
        row["applied"] = view.applied
    return row


def fill_progress(
    rows: list[dict[str, Any]],
    reference: int | None,
    progress: dict[str, Progress] | None = None,
    leader_last: int | None = None,
) -> None:
    """lag: how far each member is behind the leader, in entries: the committed entries it
    has yet to apply (against ``reference``) or, from the leader's progress, the entries it
    has yet to receive, whichever is more. last_contact_ms: from the leader's progress."""
    for row in rows:
        lags = []
        if reference is not None and row["applied"] is not None:
            lags.append(max(0, reference - row["applied"]))
        seen = (progress or {}).get(row["id"])
        if seen is not None:
            if seen.match is not None and leader_last is not None:
                lags.append(max(0, leader_last - seen.match))
            row["last_contact_ms"] = seen.last_contact_ms
        row["lag"] = max(lags) if lags else None


def summarize(client: Client, view: StatusView, member_timeout: float) -> dict[str, Any]:
    """The `dlm status --json` object, from the leader's view and every member's own.

    A cluster of P > 1 partitions: ``members``, ``leader``, ``term`` and ``commit`` are
    partition 0's (every partition has the same members; partition 0 is the one a client
    of an earlier release talks to), ``sessions``, ``locks`` and ``waiters`` are totals
    over the partitions that answered, and ``partitions`` has every partition's leader,
    term, commit and lag (one entry, partition 0's, for P = 1)."""
    members = view.members or [MemberEntry(id=view.node, address=view.address, role=None)]
    rows, views = gather_views(client, members, member_timeout)
    leader = view.leader
    # The leader's own commit index is the reference; the answering member's if the
    # leader did not answer us directly.
    leader_commit = next(
        (row["commit"] for row in rows if row["id"] == leader and row["commit"] is not None),
        view.commit,
    )
    # Progress (each member's match and last contact) is the leader's to tell: from the
    # view that answered if the leader gave it, else from the leader's own view.
    leader_view = view if view.role == "leader" else None
    if leader_view is None:
        leader_view = next(
            (
                v
                for row, v in zip(rows, views, strict=True)
                if v is not None and row["id"] == leader and v.role == "leader"
            ),
            None,
        )
    fill_progress(
        rows,
        leader_commit,
        leader_view.progress if leader_view is not None else None,
        leader_view.last_index if leader_view is not None else None,
    )
    first = health.partition_entry(0, view, commit=leader_commit)
    first["lag"] = health.replication_lag(leader_view)
    # The client learned the count from the greeting; the answer says it too.
    others = gather_partitions(client, max(client.partitions, view.partitions or 1), member_timeout)
    views = [view, *(look.view for look in others.values())]
    return {
        "cluster": view.cluster,
        "leader": leader,
        "leader_address": view.leader_address,
        "term": view.term,
        "commit": leader_commit,
        "members": rows,
        "sessions": _total(v.sessions if v else None for v in views),
        "locks": _total(v.locks if v else None for v in views),
        "waiters": _total(v.waiters if v else None for v in views),
        "incarnation": view.incarnation or 0,
        "quarantine": None
        if view.quarantine_ms is None
        else {"ms": view.quarantine_ms, "until_ms": view.quarantined_until_ms or 0},
        "partitions": [first, *(look.entry for look in others.values())],
        "health": health.with_partitions(
            health.assess(rows, leader),
            partition_problems(others, rows),
            serving=True,
            count=1 + len(others),
        ),
    }


def _total(counts: Iterator[int | None]) -> int | None:
    """The sum of the counts that are known (None when none is)."""
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


class PartitionLook(NamedTuple):
    """What `dlm status` learned of one partition."""

    view: StatusView | None
    """Its answer to ``status`` (the leader's own view when it could be had; None: no
    member answered)."""
    entry: dict[str, Any]
    """Its item of ``partitions``."""
    why: str | None = None
    """Why no member answered (None when one did)."""
    leader_silent: bool = False
    """A member named its leader, and the leader did not answer us directly."""


def gather_partitions(
    client: Client, count: int, member_timeout: float
) -> dict[int, PartitionLook]:
    """Every partition but 0 of ``count`` asked for its ``status`` (a cluster of one
    partition: none), up to 8 at a time, each through a client of its own, so that
    partitions without a leader cost one --timeout together, not one each."""
    partitions = range(1, count)
    if not partitions:
        return {}

    def look(partition: int) -> PartitionLook:
        own_client = client.spawn()
        try:
            return look_at_partition(own_client, partition, member_timeout)
        finally:
            own_client.close()

    with ThreadPoolExecutor(max_workers=min(len(partitions), 8)) as pool:
        return dict(zip(partitions, pool.map(look, partitions), strict=True))


def look_at_partition(client: Client, partition: int, member_timeout: float) -> PartitionLook:
    """One partition's ``status``; when another member than its leader answered, the
    leader asked directly too, since only it knows how far behind each voter is."""
    from dlm.client.errors import ClusterUnavailable

    try:
        view = client.status(partition=partition)
    except ClusterUnavailable as exc:
        return PartitionLook(None, health.partition_entry(partition, None), exc.message)
    silent = False
    if view.role != "leader" and view.leader is not None and view.leader_address:
        own = client.member_status(view.leader_address, member_timeout, partition=partition)
        if own is not None and own.role == "leader" and own.node == view.leader:
            view = own
        else:
            silent = True
    return PartitionLook(view, health.partition_entry(partition, view), leader_silent=silent)


def partition_problems(looks: dict[int, PartitionLook], rows: list[dict[str, Any]]) -> list[str]:
    """What is wrong with partitions 1..P-1, each naming its partition; a member that does
    not answer us at all is reported once, with the members."""
    down = frozenset(r["id"] for r in rows if not r.get("reachable") and r.get("id"))
    problems: list[str] = []
    for look in looks.values():
        problems.extend(
            health.partition_problems(
                look.entry, look.view, look.why, down, leader_silent=look.leader_silent
            )
        )
    return problems


def collect(settings: Settings, client: Client) -> dict[str, Any]:
    """One look at the cluster: the summary, or (no quorum) the error and every member's view."""
    from dlm.cli.exits import from_client_error
    from dlm.client.errors import ClusterUnavailable

    member_timeout = min(MEMBER_TIMEOUT, settings.timeout)
    try:
        view = client.status()
    except ClusterUnavailable as exc:
        members = [MemberEntry(id=None, address=addr, role=None) for addr in settings.members]
        rows = gather_members(client, members, member_timeout)
        reference = max((r["commit"] for r in rows if r["commit"] is not None), default=None)
        fill_progress(rows, reference)
        error = from_client_error(exc)
        # Partition 0 has no leader; the others (a cluster of P > 1) may still serve.
        others = gather_partitions(client, client.partitions, member_timeout)
        first = health.partition_entry(0, None)
        problems = [
            *health.partition_problems(first, None, error.message),
            *partition_problems(others, rows),
        ]
        serving = any(look.entry["leader"] is not None for look in others.values())
        return {
            **error.to_json(),
            "members": rows,
            "partitions": [first, *(look.entry for look in others.values())],
            "health": health.with_partitions(
                health.no_quorum(rows, error.message), problems if others else [], serving
            ),
        }
    return summarize(client, view, member_timeout)


# ---------------------------------------------------------------------------
# dlm status
# ---------------------------------------------------------------------------


def cluster_status(settings: Settings, output_format: str, *, check: bool = False) -> int:
    """Prints the cluster's status (or, with ``check``, its verdict); returns the exit code."""
    client = settings.connect()
    try:
        result = collect(settings, client)
    finally:
        client.close()
    verdict = result["health"]
    code = {health.HEALTHY: OK, health.DEGRADED: CHECK_FAILED}.get(verdict["state"], UNAVAILABLE)
    if check:
        if output_format == JSON:
            emit_json({**verdict, "members": result["members"], "partitions": result["partitions"]})
        else:
            say(health.check_line(verdict))
        return code
    if output_format == JSON:
        emit_json(result)
    elif output_format == TSV:
        emit_tsv(*members_tsv(result))
    else:
        console().print(cluster_renderable(result, console().width))
    if "error" in result:
        if output_format == JSON:
            return UNAVAILABLE  # the object above carries the error
        error = result["error"]
        raise CliError(str(error["code"]), str(error["message"]), UNAVAILABLE)
    return OK


def watch(settings: Settings, output_format: str, interval: float) -> int:
    """Shows the cluster every ``interval`` seconds until Ctrl-C (exit 0): refreshed in place
    on a terminal, one snapshot after another otherwise."""
    # A look must not take much longer than the interval, even without a quorum.
    budget = max(interval, 1.0)
    quick = Settings(
        settings.members,
        min(settings.timeout, budget),
        settings.json,
        min(settings.dial_timeout, budget),
        settings.credentials,
    )
    client = quick.connect()
    try:
        if output_format == TABLE and stdout_is_terminal():
            _watch_live(quick, client, interval)
        else:
            while True:
                started = time.monotonic()
                result = collect(quick, client)
                if output_format == JSON:
                    emit_json(result)
                elif output_format == TSV:
                    emit_tsv(*members_tsv(result))
                else:
                    console().print(cluster_renderable(result, console().width, stamp=True))
                    say("")
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return OK
    finally:
        client.close()


def _watch_live(settings: Settings, client: Client, interval: float) -> NoReturn:
    from rich.live import Live

    out = console()
    with Live(console=out, auto_refresh=False, transient=False) as live:
        while True:
            started = time.monotonic()
            result = collect(settings, client)
            live.update(cluster_renderable(result, out.width, stamp=True), refresh=True)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def members_tsv(result: dict[str, Any]) -> tuple[list[str], list[list[object]]]:
    header = list(MEMBER_FIELDS)
    rows: list[list[object]] = []
    for r in result["members"]:
        rows.append(
            [
                _dash(r["id"]),
                _dash(r["address"]),
                human_role(r["role"]),
                *(_dash(r[f]) for f in ("term", "commit", "applied", "lag", "last_contact_ms")),
                "yes" if r["voter"] else "no",
                "yes" if r["reachable"] else "no",
            ]
        )
    return header, rows


HEALTH_STYLES = {health.HEALTHY: "green", health.DEGRADED: "yellow", health.NO_QUORUM: "bold red"}


def cluster_renderable(result: dict[str, Any], width: int, *, stamp: bool = False) -> Any:
    """The human view: a summary line, the verdict, and the members table."""
    from rich.console import Group
    from rich.text import Text

    verdict = result["health"]
    lines: list[RenderableType] = []
    if stamp:
        lines.append(Text(f"as of {iso_local(int(time.time() * 1000))} (Ctrl-C stops)"))
    if "error" in result:
        lines.append(Text(f"no quorum: {escape(result['error']['message'])}", style="bold red"))
    else:
        count = len(result.get("partitions") or [])
        which = f", {count} partitions; partition 0" if count > 1 else ""
        lines.append(
            Text(
                f"cluster {escape(result.get('cluster') or '-')}{which}: "
                f"leader {escape(result.get('leader') or 'none')}, "
                f"term {_dash(result.get('term'))}, commit {_dash(result.get('commit'))}; "
                f"{_dash(result.get('sessions'))} sessions, {_dash(result.get('locks'))} locks, "
                f"{_dash(result.get('waiters'))} waiters"
            )
        )
        incarnation = result.get("incarnation")
        if incarnation:
            lines.append(Text(f"incarnation {incarnation} (restored or recovered)"))
        quarantine = result.get("quarantine")
        if quarantine:
            lines.append(Text(quarantine_line(quarantine), style="bold yellow"))
        style = HEALTH_STYLES.get(verdict["state"], "")
        if verdict["state"] == health.DEGRADED:
            lines.append(Text(f"degraded: {verdict['reason']}", style=style))
            lines.append(Text(health.tolerance_line(verdict)))
        else:
            lines.append(Text(f"healthy: {health.tolerance_line(verdict)}", style=style))
    lines.append(members_table(result["members"], result.get("leader"), width))
    partitions = result.get("partitions") or []
    if len(partitions) > 1:
        lines.append(partitions_table(partitions, width))
    return Group(*lines)


def partitions_table(entries: list[dict[str, Any]], width: int) -> Any:
    """Each partition's leader, term, commit index and lag (a cluster of P > 1 only: with
    one partition the first line says it all)."""
    cells: list[list[str | Styled]] = []
    for entry in entries:
        leader = entry.get("leader")
        cells.append(
            [
                str(entry["partition"]),
                str(leader) if leader else Styled("(no leader)", "bold red"),
                *(_dash(entry.get(f)) for f in ("term", "commit", "lag")),
            ]
        )
    return make_table(
        ("PARTITION", "LEADER", "TERM", "COMMIT", "LAG"),
        cells,
        width=width,
        right=("PARTITION", "TERM", "COMMIT", "LAG"),
    )


def quarantine_line(quarantine: dict[str, Any]) -> str:
    """``quarantined until T: ...`` for a restored or recovered cluster."""
    until = _int(quarantine.get("until_ms")) or 0
    if until > 0:
        when = f"until {iso_local(until)}"
    else:
        length = (_int(quarantine.get("ms")) or 0) / 1000
        when = f"until a leader has been in office for {length:g}s"
    return f"quarantined {when}: no lock is granted before then (the cluster was restored)"


def members_table(rows: list[dict[str, Any]], leader: str | None, width: int) -> Any:
    headings = ("ID", "ADDRESS", "ROLE", "TERM", "COMMIT", "APPLIED", "LAG", "LAST CONTACT")
    cells: list[list[str | Styled]] = []
    for r in rows:
        is_leader = r["id"] is not None and r["id"] == leader
        ident: str | Styled = _dash(r["id"]) + (" *" if is_leader else "")
        role: str | Styled = human_role(r["role"])
        if not r["voter"] and role != "learner":
            role = f"{role} (learner)"
        if not r["reachable"]:
            role = Styled("(unreachable)" if r["voter"] else "learner (unreachable)", "bold red")
        elif is_leader:
            ident, role = Styled(str(ident), "bold green"), Styled(str(role), "bold green")
        contact = r["last_contact_ms"]
        cells.append(
            [
                ident,
                _dash(r["address"]),
                role,
                *(_dash(r[f]) for f in ("term", "commit", "applied", "lag")),
                "-" if contact is None else f"{format_ms(contact)} ago",
            ]
        )
    return make_table(
        headings, cells, width=width, right=("TERM", "COMMIT", "APPLIED", "LAG", "LAST CONTACT")
    )


# ---------------------------------------------------------------------------
# dlm status KEY
# ---------------------------------------------------------------------------


def key_status(settings: Settings, key: str, output_format: str) -> None:
    from dlm.cli.ops import check_key

    check_key(key)
    client = settings.connect()
    try:
        state = client.get(key)
    finally:
        client.close()
    if output_format == JSON:
        emit_json(with_holds(state))
        return
    holders = state.holders
    waiters = state.waiters if isinstance(state.waiters, list) else []
    now_ms = server_now_ms(holders)
    if output_format == TSV:
        emit_tsv(*key_tsv(key, holders, waiters, now_ms))
        return
    limit = state.limit or 1
    delay = delay_line(key, state)
    if not holders and not waiters and delay is None:
        say(f"{escape(key)} is free")
        return
    if delay is not None:
        say(delay)
    if holders or waiters:
        say(key_summary(key, limit, holders, waiters, now_ms))
    for h in holders:
        say("")
        say(holder_block(h, now_ms))
    if waiters:
        say("")
        print_table(
            ("#", "WAITING LEASE", "WAITING SINCE", "FOR", "OWNER"),
            (
                [
                    str(w.position or i),
                    _or_unknown(w.lease),
                    iso_local(w.since_ms),
                    format_ms(_waited(now_ms, w.since_ms)),
                    format_meta(w.meta),
                ]
                for i, w in enumerate(waiters, 1)
            ),
            squeeze="OWNER",
            right=("#", "FOR"),
        )


def delay_line(key: str, state: LockState) -> str | None:
    """The line that says ``key`` is in a lock-delay (granted to nobody), or None."""
    if state.lock_delay_ms is None:
        return None
    line = (
        f"{escape(key)} is in a lock-delay of {format_ms(state.lock_delay_ms)}: lease "
        f"{escape(_or_unknown(state.lock_delay_lease))} expired or was revoked holding it; "
        "nobody is granted it"
    )
    if state.lock_delay_remaining_ms is not None:
        line += f" for {format_ms(state.lock_delay_remaining_ms)} more"
    elif state.lock_delay_until_ms is not None:
        line += f" until about {iso_local(state.lock_delay_until_ms)}"
    return line


def with_holds(state: LockState) -> dict[str, Any]:
    """The cluster's answer plus, for each holder, ``command_finished`` (it holds on only
    for a `dlm exec --min-hold` whose command ended) and ``hold_until`` (when that hold
    ends, ISO-8601; null when not in a hold, or another member than the leader answered);
    and the same two for the key: whether every holder is in such a hold, and the latest
    end of them (null otherwise)."""
    held = state.holders
    all_finished = bool(held) and all(_finished(h) for h in held)
    ends = [h.hold_until_ms for h in held if h.hold_until_ms is not None]
    latest = max(ends) if all_finished and len(ends) == len(held) else None
    return {
        **state.to_wire(),
        "holders": [
            {**h.to_wire(), "command_finished": _finished(h), "hold_until": _hold_until(h)}
            for h in held
        ],
        "command_finished": all_finished,
        "hold_until": None if latest is None else iso_local(latest, "milliseconds"),
        # In a lock-delay (its holder's lease expired or was revoked): granted to nobody.
        "delayed": state.lock_delay_ms is not None,
    }


def _finished(holder: HolderView) -> bool:
    return holder.finished_at_ms is not None


def _hold_until(holder: HolderView) -> str | None:
    until = holder.hold_until_ms
    return iso_local(until, "milliseconds") if _finished(holder) and until is not None else None


def _or_unknown(value: str | int | None) -> str:
    """A holder's or waiter's lease or token, '?' when the member did not say."""
    return "?" if value is None else str(value)


def key_summary(
    key: str, limit: int, holders: list[HolderView], waiters: list[WaiterView], now_ms: int
) -> str:
    if limit == 1:
        what = "lock, held" if holders else "lock, free"
        if holders and _finished(holders[0]):
            until = holders[0].hold_until_ms
            what += " after its command finished (--min-hold)"
            if until is not None:
                what += f" until {iso_local(until)}"
    else:
        what = f"semaphore of {limit}, {len(holders)} holder{'' if len(holders) == 1 else 's'}"
    queue = f"{len(waiters)} waiting" if waiters else "nobody waiting"
    return f"{escape(key)}: {what}, {queue} (as of {iso_local(now_ms)})"


def holder_block(holder: HolderView, now_ms: int) -> str:
    """One holder, a line per fact, each time as an absolute time beside its duration."""
    remaining = holder.remaining_ms
    if remaining is None:
        ttl = "- (only the leader tracks it, and another member answered)"
    else:
        ttl = f"{format_ms(remaining)}, until {_expires(now_ms, remaining)}"
    facts = [
        ("lease", escape(_or_unknown(holder.lease))),
        ("token", escape(_or_unknown(holder.token))),
        (
            "held since",
            f"{iso_local(holder.granted_at_ms)}, for {format_ms(holder.held_ms)}",
        ),
        ("TTL left", ttl),
        ("owner", escape(format_meta(holder.meta)) or "-"),
    ]
    if _finished(holder):
        until = holder.hold_until_ms
        end = "until its lease expires" if until is None else f"until {iso_local(until)}"
        facts.append(
            ("min hold", f"command finished {iso_local(holder.finished_at_ms)}; held {end}")
        )
    return "\n".join(f"  {name:<11} {value}" for name, value in facts)


def key_tsv(
    key: str, holders: list[HolderView], waiters: list[WaiterView], now_ms: int
) -> tuple[list[str], list[list[object]]]:
    header = [
        "key", "state", "lease", "token", "position", "since", "for_ms", "ttl_left_ms",
        "expires", "owner", "command_finished", "hold_until",
    ]  # fmt: skip
    rows: list[list[object]] = []
    for h in holders:
        rows.append(
            [
                key,
                "holder",
                _dash(h.lease),
                _dash(h.token),
                "-",
                iso_local(h.granted_at_ms),
                _dash(h.held_ms),
                _dash(h.remaining_ms),
                _expires(now_ms, h.remaining_ms),
                format_meta(h.meta),
                "yes" if _finished(h) else "no",
                iso_local(h.hold_until_ms) if _finished(h) else "-",
            ]
        )
    for i, w in enumerate(waiters, 1):
        rows.append(
            [
                key,
                "waiter",
                _dash(w.lease),
                "-",
                w.position or i,
                iso_local(w.since_ms),
                _dash(_waited(now_ms, w.since_ms)),
                "-",
                "-",
                format_meta(w.meta),
                "-",
                "-",
            ]
        )
    return header, rows


def _expires(now_ms: int, remaining_ms: int | None) -> str:
    return "-" if remaining_ms is None else iso_local(now_ms + remaining_ms)


def _waited(now_ms: int, since_ms: int | None) -> int | None:
    return None if since_ms is None else max(0, now_ms - since_ms)


def server_now_ms(holders: list[HolderView]) -> int:
    """The answering member's clock, as far as a reply shows it (holder's grant time plus
    how long it has held); our own clock only when nobody holds the key."""
    for h in holders:
        if h.granted_at_ms is not None and h.held_ms is not None:
            return h.granted_at_ms + h.held_ms
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------
# dlm locks
# ---------------------------------------------------------------------------


def list_locks(settings: Settings, prefix: str, output_format: str) -> None:
    client = settings.connect()
    try:
        locks = client.list_locks(prefix)
    finally:
        client.close()
    if output_format == JSON:
        # As the cluster sent them: version 1 counts a lock's waiters, version 2 lists them.
        emit_json({"prefix": prefix, "locks": [lock.to_wire() for lock in locks]})
        return
    rows = list(lock_rows(locks))
    if output_format == TSV:
        header = ["key", "lease", "token", "held_ms", "ttl_left_ms", "waiters", "owner"]
        emit_tsv(header, ([_dash(cell) for cell in row] for row in rows))
        return
    if not rows:
        under = f" under '{escape(prefix)}'" if prefix else ""
        say(f"no locks held{under}")
        return
    print_table(
        ("KEY", "LEASE", "TOKEN", "HELD FOR", "TTL LEFT", "WAITERS", "OWNER"),
        ([r[0], r[1], r[2], format_ms(r[3]), format_ms(r[4]), _dash(r[5]), r[6]] for r in rows),
        squeeze="OWNER",
        right=("TOKEN", "HELD FOR", "TTL LEFT", "WAITERS"),
    )


def lock_rows(
    locks: list[LockState],
) -> Iterator[tuple[str, str, str, int | None, int | None, int, str]]:
    """(key, lease, token, held_ms, remaining_ms, waiters, owner) per holder; a row of its own
    for a key with waiters but no holder."""
    for lock in locks:
        key = _or_unknown(lock.key)
        if not lock.holders:
            yield key, "-", "-", None, None, lock.waiting, ""
        for h in lock.holders:
            yield (
                key,
                _dash(h.lease),
                _dash(h.token),
                h.held_ms,
                h.remaining_ms,
                lock.waiting,
                format_meta(h.meta),
            )


# ---------------------------------------------------------------------------
# dlm lease list
# ---------------------------------------------------------------------------


def list_leases(settings: Settings, output_format: str) -> None:
    client = settings.connect()
    try:
        leases = client.list_leases()
    finally:
        client.close()
    if output_format == JSON:
        # ``owner``: the identity that opened the lease; "" for one opened before identities
        # (a member of an earlier release does not send the field).
        emit_json({"leases": [{**lease.to_wire(), "owner": lease.owner or ""} for lease in leases]})
        return
    rows = [lease_row(lease) for lease in leases]
    if output_format == TSV:
        header = ["id", "ttl_ms", "left_ms", "holding", "waiting", "owner"]
        emit_tsv(header, ([_dash(cell) for cell in row] for row in rows))
        return
    if not rows:
        say("no leases")
        return
    print_table(
        ("LEASE", "TTL", "LEFT", "HOLDING", "WAITING FOR", "OWNER"),
        ([r[0], format_ms(r[1]), format_ms(r[2]), r[3] or "-", r[4] or "-", r[5]] for r in rows),
        squeeze="OWNER",
        right=("TTL", "LEFT"),
    )


def lease_row(lease: LeaseSummary) -> tuple[str, int | None, int | None, str, str, str]:
    """(id, ttl_ms, left_ms, held keys, awaited keys, owner); the keys comma-separated and
    not yet escaped (the table and tsv escape every cell)."""
    return (
        _or_unknown(lease.id),
        lease.ttl_ms,
        lease.left_ms,
        ",".join(lease.holding),
        ",".join(lease.waiting),
        format_meta(lease.meta),
    )


def check_options(
    key: str | None, check: bool, watch_on: bool, interval: str | None
) -> float | None:
    """The watch interval in seconds (None: no --watch); usage errors for combinations
    that make no sense."""
    from dlm.cli.ops import duration_option

    if key is not None and check:
        raise usage_error("--check is about the cluster: drop KEY")
    if key is not None and interval is not None:
        raise usage_error(
            "--interval is for the cluster's --watch: KEY --watch shows each change as the "
            "cluster pushes it"
        )
    if check and watch_on:
        raise usage_error("--check gives one verdict and --watch keeps looking: pick one")
    if interval is not None and not watch_on:
        raise usage_error("--interval goes with --watch")
    if not watch_on:
        return None
    return duration_option("--interval", interval or "2s", allow_zero=False)
