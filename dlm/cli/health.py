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
"""

from __future__ import annotations

from typing import Any

from dlm.cli.output import escape
from dlm.durations import format_ms

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
