"""`dlm members list|add|remove|promote`: who is in the cluster; changing it, one at a time.

The list is put together as `dlm status` puts its table together: the
leader's view of the membership (who votes, who is a learner, how far behind
each is, when the leader last heard from it), read through the leader, then
each member asked directly, with a short timeout, for its own role. A member
that does not answer is shown with the role ``unknown``, unreachable, and no
lag. A change is one request to the leader, which answers with the new
membership once the change is committed; it is printed the same way.

What the leader refuses comes back as the client's exceptions, each with its
exit code (dlm.cli.exits): a request that makes no sense (an id or address in
use, an unknown id, the last voter) and a removal that would leave no quorum
of answering voters exit 2; a change while another is pending exits 75; no
quorum exits 69.

In a partitioned cluster every partition's Raft group has the same members: a change
goes to every group in turn (dlm/cli/fanout.py), partition 0 first. Each is idempotent
per partition: a partition that already made it (the member is there, a voter, or gone)
counts as done, so a change some partitions did not take (exit non-zero, one line naming
them) is completed by running the same command again. `list` shows partition 0's
membership and says which partitions disagree with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlm.cli.exits import usage_error
from dlm.cli.output import (
    JSON,
    TSV,
    Styled,
    console,
    emit_json,
    emit_tsv,
    escape,
    print_table,
    say,
)
from dlm.cli.settings import Settings
from dlm.durations import format_ms
from dlm.views import MemberHealth, MembersView

if TYPE_CHECKING:
    from dlm.client.sync import Client

ROLES = ("leader", "follower", "candidate", "learner", "unknown")
FIELDS = (
    "id",
    "address",
    "role",
    "voter",
    "reachable",
    "match",
    "lag",
    "last_contact_ms",
    "reason",
)
MEMBER_TIMEOUT = 1.0
"""How long each member gets to say what it is (a missing one is shown as unknown)."""
ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


# ---------------------------------------------------------------------------
# Arguments, checked before connecting
# ---------------------------------------------------------------------------


def check_member_id(member: str) -> None:
    """The rule of `dlm node start --id`: 1-63 letters, digits, '_', '-' or '.', starting
    with a letter or digit."""
    if not (0 < len(member) <= 63 and member[0].isalnum() and set(member) <= ID_CHARS):
        raise usage_error(
            f"bad ID '{escape(member)}': a member id is 1-63 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit (as given to dlm node start --id)"
        )


def check_address(address: str) -> str:
    """``HOST:PORT`` as the members will dial it, or a usage error."""
    from dlm.wire import format_addr, parse_addr

    if "://" in address:
        raise usage_error(f"bad ADDR '{escape(address)}': write HOST:PORT, not a URL")
    try:
        return format_addr(*parse_addr(address))
    except ValueError as exc:
        raise usage_error(
            f"bad ADDR '{escape(address)}': {exc}; write HOST:PORT, e.g. 10.0.0.4:7700"
        ) from None


# ---------------------------------------------------------------------------
# The membership, as rows
# ---------------------------------------------------------------------------


def member_rows(client: Client, view: MembersView, timeout: float) -> list[dict[str, Any]]:
    """One row per member of the leader's ``view``, each completed with the member's own
    account of its role (asked directly, in parallel, within ``timeout``)."""
    from dlm.cli.status_view import gather_members

    listed = view.members
    seen = gather_members(client, listed, timeout)
    return [member_row(member, own) for member, own in zip(listed, seen, strict=True)]


def member_row(listed: MemberHealth, seen: dict[str, Any]) -> dict[str, Any]:
    """A member as the leader lists it (``listed``) and as it answered us (``seen``, a row of
    dlm.cli.status_view.gather_members: its own role, and whether it answered). The role is
    the member's own word, so a member cut off from the leader shows as a candidate."""
    from dlm.cli.status_view import human_role

    learner = listed.role == "learner"
    answered = bool(seen.get("reachable"))
    # Reachable: it answers us, and the leader hears from it (one the leader cannot reach
    # takes no part in the cluster, and often says so: it campaigns).
    reachable = answered and listed.reachable
    role = human_role(seen.get("role")) if answered else "unknown"
    if learner:
        role = "learner"  # the leader's configuration decides, whatever the member knows yet
    elif role == "learner":
        role = "follower"  # promoted; its own log has not said so yet
    if role not in ROLES:
        role = "unknown"
    return {
        "id": listed.id,
        "address": listed.address,
        "role": role,
        "voter": not learner,
        "reachable": reachable,
        "match": listed.match,
        "lag": listed.lag if reachable else None,
        "last_contact_ms": listed.last_contact_ms,
        # Why a learner is not a voter yet, in the leader's words ("" for a voter): a
        # learner that never proved the peer secret is never promoted.
        "reason": listed.reason,
    }


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def members_tsv(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[object]]]:
    return list(FIELDS), [
        [
            _dash(r["id"]),
            _dash(r["address"]),
            r["role"],
            _yes(r["voter"]),
            _yes(r["reachable"]),
            *(_dash(r[f]) for f in ("match", "lag", "last_contact_ms")),
            r["reason"],
        ]
        for r in rows
    ]


def print_members_table(rows: list[dict[str, Any]], leader: str | None) -> None:
    cells: list[list[str | Styled]] = []
    for r in rows:
        is_leader = r["id"] is not None and r["id"] == leader
        ident: str | Styled = _dash(r["id"])
        role: str | Styled = r["role"]
        if is_leader:
            ident, role = Styled(f"{ident} *", "bold green"), Styled(str(role), "bold green")
        contact = r["last_contact_ms"]
        cells.append(
            [
                ident,
                _dash(r["address"]),
                role,
                _yes(r["reachable"]) if r["reachable"] else Styled("no", "bold red"),
                _dash(r["match"]),
                _dash(r["lag"]),
                "-" if contact is None else f"{format_ms(contact)} ago",
            ]
        )
    print_table(
        ("ID", "ADDRESS", "ROLE", "REACHABLE", "MATCH", "LAG", "LAST CONTACT"),
        cells,
        right=("MATCH", "LAG", "LAST CONTACT"),
        out=console(),
    )
    # Why each learner is not a voter yet, one line each under the table (a column would
    # squeeze the others out of a terminal's width).
    for r in rows:
        if r["reason"] and r["role"] == "learner":
            say(f"{escape(_dash(r['id']))} is not a voter: {escape(r['reason'])}")


def show(
    rows: list[dict[str, Any]],
    leader: str | None,
    output_format: str,
    *,
    headline: str | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Prints the membership: one JSON object, tsv rows, or (with ``headline`` first) a table."""
    if output_format == JSON:
        emit_json({**(extra or {}), "members": rows, "leader": leader})
    elif output_format == TSV:
        emit_tsv(*members_tsv(rows))
    else:
        if headline is not None:
            say(headline)
        print_members_table(rows, leader)


# ---------------------------------------------------------------------------
# The subcommands
# ---------------------------------------------------------------------------


def list_members(settings: Settings, output_format: str) -> None:
    client = settings.connect()
    try:
        view = client.members_view()
        rows = member_rows(client, view, min(MEMBER_TIMEOUT, settings.timeout))
        disagree = _disagreements(client, view)
    finally:
        client.close()
    partitions = int(getattr(client, "partitions", 1))
    if partitions <= 1:
        show(rows, _leader(view), output_format)
        return
    if output_format == JSON:
        show(
            rows,
            _leader(view),
            output_format,
            extra={"partitions": partitions, "disagree": disagree},
        )
        return
    if disagree:
        import sys

        sys.stderr.write(
            "dlm: warning: the partitions disagree about the membership ("
            + "; ".join(f"partition {d['partition']}: {d['problem']}" for d in disagree)
            + "): run the membership change again to complete it\n"
        )
    show(rows, _leader(view), output_format)


def _membership(view: MembersView) -> dict[str, tuple[str | None, bool]]:
    """Who is a member, at which address, voter or not, in one partition's view."""
    return {m.id: (m.address, m.role != "learner") for m in view.members if m.id is not None}


def _disagreements(client: Client, first: MembersView) -> list[dict[str, Any]]:
    """Each other partition whose membership is not partition 0's, and how."""
    from dlm.client.errors import DlmError

    partitions = int(getattr(client, "partitions", 1))
    mine = _membership(first)
    out: list[dict[str, Any]] = []
    for partition in range(1, partitions):
        try:
            theirs = _membership(client.members_view(partition=partition))
        except DlmError as exc:
            out.append({"partition": partition, "problem": f"no answer ({exc})"})
            continue
        problems = []
        for member in sorted(set(mine) - set(theirs)):
            problems.append(f"{member} is not a member")
        for member in sorted(set(theirs) - set(mine)):
            problems.append(f"{member} is a member (not in partition 0)")
        for member in sorted(set(mine) & set(theirs)):
            (addr, voter), (their_addr, their_voter) = mine[member], theirs[member]
            if voter != their_voter:
                problems.append(f"{member} is a {'voter' if their_voter else 'learner'}")
            elif addr != their_addr:
                problems.append(f"{member} is at {their_addr}")
        if problems:
            out.append({"partition": partition, "problem": ", ".join(problems)})
    return out


def add(settings: Settings, member: str, address: str, output_format: str) -> None:
    check_member_id(member)
    where = check_address(address)
    view, rows, partitions = _change(
        settings,
        lambda client, p: client.add_member(member, where, **_in(p)),
        f"members add {member}",
        "is already a member",
    )
    headline = (
        f"added {member} ({where}) as a learner: once it runs and has caught up, the leader "
        f"makes it a voter (if the members run with --auto-promote off: dlm members promote "
        f"{member})"
    )
    if partitions > 1:
        headline = f"in every partition ({partitions}): {headline}"
    mine = [r for r in rows if r["id"] == member]
    if mine and not mine[0]["reachable"]:
        headline += (
            f"; it does not answer yet: start it with dlm node start --id {member} "
            f"--listen {where} --join {','.join(settings.members)}"
        )
    show(
        rows,
        _leader(view),
        output_format,
        headline=headline,
        extra={"added": {"id": member, "address": where}, **_count(partitions)},
    )


def remove(settings: Settings, member: str, force: bool, output_format: str) -> None:
    check_member_id(member)
    view, rows, partitions = _change(
        settings,
        lambda client, p: client.remove_member(member, force=force, **_in(p)),
        f"members remove {member}",
        "is not a member: nothing to remove",
    )
    where = f" from every partition ({partitions})" if partitions > 1 else ""
    show(
        rows,
        _leader(view),
        output_format,
        headline=f"removed {member}{where}: its process stops by itself (exit 0) once it learns it",
        extra={"removed": {"id": member}, **_count(partitions)},
    )


def promote(settings: Settings, member: str, output_format: str) -> None:
    check_member_id(member)
    view, rows, partitions = _change(
        settings,
        lambda client, p: client.promote_member(member, **_in(p)),
        f"members promote {member}",
        "already a voter",
    )
    where = f" in every partition ({partitions})" if partitions > 1 else ""
    show(
        rows,
        _leader(view),
        output_format,
        headline=f"promoted {member}: it is a voter now{where}",
        extra={"promoted": {"id": member}, **_count(partitions)},
    )


def _in(partition: int) -> dict[str, int]:
    """The keyword that sends a request to ``partition`` (none for partition 0)."""
    return {"partition": partition} if partition else {}


def _count(partitions: int) -> dict[str, int]:
    return {"partitions": partitions} if partitions > 1 else {}


def _change(
    settings: Settings, make: Any, what: str, done_already: str
) -> tuple[MembersView, list[dict[str, Any]], int]:
    """Makes the change in every partition (dlm/cli/fanout.py); partition 0's view of the
    new membership, its rows, and the partition count. ``done_already``: the words of
    the refusal of a partition that made the change before (a re-run)."""
    from dlm.cli.fanout import settle, to_every_partition

    client = settings.connect()
    try:
        result = to_every_partition(
            lambda: int(getattr(client, "partitions", 1)),
            lambda p: make(client, p),
            had_it=lambda exc: done_already in str(exc),
        )
        settle(result, what)
        view: MembersView | None = result.took.get(0)
        if view is None:
            view = client.members_view()
        rows = member_rows(client, view, min(MEMBER_TIMEOUT, settings.timeout))
    finally:
        client.close()
    return view, rows, result.partitions


def _leader(view: MembersView) -> str | None:
    return view.leader
