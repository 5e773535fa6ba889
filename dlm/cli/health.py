"""Is the cluster healthy? The verdict of `dlm status` and `dlm status --check`, from its figures.

Pure: it reads the rows status_view put together (each member's own answer
and the leader's progress) and decides, so the rules are tested on canned
replies. Only voters count; a learner may lag or vanish without degrading
anything, because it takes no part in a quorum.

- ``healthy``: every voter answers us, is heard from by the leader and is at
  most ``MAX_BEHIND_ENTRIES`` behind it;
- ``degraded``: the cluster serves (a leader answered with a quorum) but a
  voter is unreachable, silent for two election timeouts, or far behind;
- ``no_quorum``: no leader with a quorum answered (decided by the caller).

A cluster of P partitions (P Raft groups on the same members) is judged by
partition 0's members as above, then each partition by its leader's account:
it is ``degraded`` when any partition has no leader, has a voter more than
``MAX_BEHIND_ENTRIES`` behind, or has a voter its leader has not heard from;
each such reason names its partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlm.cli.output import escape
from dlm.durations import format_ms

if TYPE_CHECKING:
    from dlm.views import StatusView

HEALTHY, DEGRADED, NO_QUORUM = "healthy", "degraded", "no_quorum"

MAX_BEHIND_ENTRIES = 1_000
ELECTION_TIMEOUT_MS = 600
"""The longest election timeout a member draws (Timing in
dlm.node.runtime.config.node_config: 6 ticks of 50 ms, x2)."""
SILENT_AFTER_MS = 2 * ELECTION_TIMEOUT_MS


def is_voter(row: dict[str, Any]) -> bool:
    return row.get("voter", True) is not False


def member_problems(row: dict[str, Any], leader: str | None) -> list[str]:
    """What is wrong with one member, worded for people (empty when nothing is)."""
    name = f"{escape(row.get('id') or '?')} ({escape(row.get('address') or '?')})"
    problems = []
    if not row.get("reachable"):
        problems.append(f"{name} does not answer")
    silent = row.get("last_contact_ms")
    if isinstance(silent, int) and silent > SILENT_AFTER_MS and row.get("id") != leader:
        problems.append(f"the leader has not heard from {name} for {format_ms(silent)}")
    lag = row.get("lag")
    if isinstance(lag, int) and lag > MAX_BEHIND_ENTRIES:
        problems.append(f"{name} is {lag} entries behind the leader")
    return problems


def is_up(row: dict[str, Any], leader: str | None) -> bool:
    """Counts towards a quorum: answers us and, as far as the leader tells, answers it."""
    silent = row.get("last_contact_ms")
    heard = not (isinstance(silent, int) and silent > SILENT_AFTER_MS and row.get("id") != leader)
    return bool(row.get("reachable")) and heard


def assess(rows: list[dict[str, Any]], leader: str | None) -> dict[str, Any]:
    """The verdict for a cluster whose leader answered: healthy or degraded, and why."""
    voters = [r for r in rows if is_voter(r)]
    quorum = len(voters) // 2 + 1
    up = sum(1 for r in voters if is_up(r, leader))
    problems = [p for r in voters for p in member_problems(r, leader)]
    tolerates = max(0, up - quorum)
    if problems:
        state, reason = DEGRADED, "; ".join(problems)
    else:
        state, reason = HEALTHY, f"all {len(voters)} voters answer, leader {escape(leader)}"
    return {
        "healthy": state == HEALTHY,
        "state": state,
        "reason": reason,
        "leader": leader,
        "voters": len(voters),
        "voters_up": up,
        "quorum": quorum,
        "tolerates": tolerates,
    }


def no_quorum(rows: list[dict[str, Any]], why: str) -> dict[str, Any]:
    """The verdict when no leader with a quorum answered."""
    voters = [r for r in rows if is_voter(r)]
    return {
        "healthy": False,
        "state": NO_QUORUM,
        "reason": why,
        "leader": None,
        "voters": len(voters),
        "voters_up": sum(1 for r in voters if r.get("reachable")),
        "quorum": len(voters) // 2 + 1,
        "tolerates": 0,
    }


def tolerance_line(health: dict[str, Any]) -> str:
    """How many more member failures the cluster survives, in one line."""
    up, voters, quorum = health["voters_up"], health["voters"], health["quorum"]
    figures = f"{up} of {voters} voters up, quorum {quorum}"
    if health["state"] == NO_QUORUM:
        return f"no quorum: the cluster cannot serve ({figures})"
    n = health["tolerates"]
    if n == 0:
        return f"survives no further member failure ({figures})"
    return f"survives {n} more member failure{'s' if n > 1 else ''} ({figures})"


def check_line(health: dict[str, Any]) -> str:
    """The one line of `dlm status --check`."""
    state = health["state"].replace("_", " ")
    if health["state"] == NO_QUORUM:
        return f"{state}: {health['reason']}"
    return f"{state}: {health['reason']}; {tolerance_line(health)}"


# ---------------------------------------------------------------------------
# Partitions: a cluster of P Raft groups is as healthy as its worst partition
# ---------------------------------------------------------------------------


def replication_lag(view: StatusView | None) -> int | None:
    """A partition's ``lag``: its leader's commit index minus the match index of its
    slowest voter, in entries (0 when every voter has every committed entry; a voter
    ahead of the commit counts 0). From the leader's own status only, since only the
    leader knows each voter's match: None when ``view`` is not the leader's, or it sent
    no progress (a member of an older release)."""
    if view is None or view.role != "leader" or view.progress is None or view.commit is None:
        return None
    learners = {m.id for m in view.members if m.role == "learner"}
    matches = [
        seen.match
        for member, seen in view.progress.items()
        if member not in learners and seen.match is not None
    ]
    if not matches:
        return None
    return max(0, view.commit - min(matches))


def partition_entry(
    partition: int, view: StatusView | None, *, commit: int | None = None
) -> dict[str, Any]:
    """One item of `dlm status --json`'s ``partitions``: ``{"partition", "leader", "term",
    "commit", "lag"}`` from the partition's answer to a linearizable ``status`` (None: no
    leader answered it, and only ``partition`` is known). ``commit``: the leader's own
    commit index when known better than the answering member's."""
    if view is None:
        return {"partition": partition, "leader": None, "term": None, "commit": None, "lag": None}
    return {
        "partition": partition,
        "leader": view.leader,
        "term": view.term,
        "commit": view.commit if commit is None else commit,
        "lag": replication_lag(view),
    }


def partition_problems(
    entry: dict[str, Any],
    view: StatusView | None,
    why: str | None = None,
    known_down: frozenset[str] = frozenset(),
    *,
    leader_silent: bool = False,
) -> list[str]:
    """What is wrong with one partition, each naming it (empty when nothing is): no
    leader (``why`` it did not answer), a leader that does not answer us itself
    (``leader_silent``: another member named it), a voter more than MAX_BEHIND_ENTRIES
    behind its leader, or a voter its leader has not heard from for SILENT_AFTER_MS;
    a member in ``known_down`` (already reported as not answering us at all) is not
    named again."""
    name = f"partition {entry['partition']}"
    leader = entry.get("leader")
    if leader is None:
        return [f"{name} has no leader" + (f" ({why})" if why else "")]
    problems: list[str] = []
    if leader_silent and leader not in known_down:
        problems.append(f"{name}: its leader {escape(leader)} does not answer")
    lag = entry.get("lag")
    if isinstance(lag, int) and lag > MAX_BEHIND_ENTRIES:
        problems.append(f"{name}: its slowest voter is {lag} entries behind the leader")
    if view is not None and view.progress is not None:
        learners = {m.id for m in view.members if m.role == "learner"}
        for member, seen in sorted(view.progress.items()):
            silent = seen.last_contact_ms
            if (
                member in learners
                or member in known_down
                or member == entry.get("leader")
                or not isinstance(silent, int)
                or silent <= SILENT_AFTER_MS
            ):
                continue
            problems.append(
                f"{name}: its leader has not heard from {escape(member)} for {format_ms(silent)}"
            )
    return problems


def with_partitions(
    verdict: dict[str, Any], problems: list[str], serving: bool, count: int = 1
) -> dict[str, Any]:
    """The verdict of a cluster of ``count`` partitions: ``verdict`` (partition 0's, from
    its members) made degraded by any partition's ``problems``. ``serving``: some
    partition has a leader, so a cluster whose partition 0 has none is degraded, not
    without a quorum (the keys of the other partitions are still served)."""
    if not problems:
        if count > 1 and verdict["state"] == HEALTHY:
            return {**verdict, "reason": f"{verdict['reason']}; all {count} partitions led"}
        return verdict
    reason = "; ".join(problems)
    if verdict["state"] == HEALTHY:
        return {**verdict, "healthy": False, "state": DEGRADED, "reason": reason}
    if verdict["state"] == DEGRADED:
        return {**verdict, "reason": f"{verdict['reason']}; {reason}"}
    if serving:  # no quorum in partition 0 (its problem is among ``problems``)
        return {**verdict, "state": DEGRADED, "reason": reason}
    return verdict
