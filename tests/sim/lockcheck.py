"""What users rely on, checked in simulated real time: the lock-level invariants.

The whole-node simulation (nodesim.py) reports what its clients experience
and what the replicated log did, and ``LockChecker`` raises ``Violation`` the
moment one of these fails:

* **one holder at a time**: no two clients are inside a critical section of
  the same exclusive key at the same real moment (at most N for a semaphore
  of N). A section starts when the client learns its grant and ends when it
  sends its release, or at its client-side deadline, whichever comes first; a
  ``dlm exec`` section ends when the guard has killed the command;
* **a minimum hold is kept**: once a ``dlm exec --min-hold`` run has handed the
  rest of its hold to the cluster (and had it confirmed while its lease lasted),
  nobody else enters the key before the hold is over, counted from when the
  grant's reply arrived (a semaphore's other slots stay open);
* **no CMD after a later grant**: a ``dlm exec`` command (a section marked
  ``cmd``) never starts, and never runs, once the cluster committed a later
  grant of its exclusive key to another lease; a command frozen with its
  host (a suspend) is not running until the host resumes;
* **tokens rise**: the fencing tokens clients learn for an exclusive key
  strictly increase in the order they learn them; and across a restore (a new
  incarnation, issue 24), every grant of the new cluster has a token above every
  index the old cluster's members had written (``new_incarnation``);
* **grants are real**: every grant a client was told about is a grant in the
  committed history (checked at the end);
* **at most once**: each client request (client, seq) runs at most once in
  the committed history (opening, closing and updating leases included);
  a keep-alive extends a lease at most once;
* **acknowledged means durable**: an entry is applied (and so answered) only
  once a majority of voters store it;
* **a lock-delay is kept** (issue 27): once an entry put a key in its lock-delay of D
  (its holder's lease expired or was revoked), no entry grants that key before D has
  passed on the fastest clock the simulation gives a member (a new leader counts D
  again from its own election; ``DelayChecker``);
* **fencing**: the store the clients write to never accepts a lower token
  after a higher one; writes of a client that ran past its deadline (a paused
  process) are counted, and must be refused once a later holder wrote.

Times are real microseconds; a client's deadline is converted from its own
drifting clock by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .checkers import Violation


@dataclass
class Section:
    """One client's critical section on one key."""

    client: str
    key: str
    token: int
    lease: str
    start: int
    ends_by: Callable[[], int]
    """The real time at which the section ends unless released first (the client's
    deadline, or the exec guard's kill time), as it stands now."""
    released: int | None = None
    cmd: bool = False
    """A `dlm exec` command: checked against later grants as well."""

    def active_at(self, t: int) -> bool:
        if self.released is not None and self.released <= t:
            return False
        return t < self.ends_by()


@dataclass
class FencedStore:
    """A store that refuses any token lower than the highest it has accepted (per key)."""

    highest: dict[str, int] = field(default_factory=dict)
    value: dict[str, int] = field(default_factory=dict)
    accepted: int = 0
    refused: int = 0
    zombie_accepted: int = 0
    zombie_refused: int = 0

    def write(self, key: str, token: int, *, zombie: bool) -> bool:
        """A read-modify-write under ``token``; False when the store refuses it."""
        if token < self.highest.get(key, 0):
            self.refused += 1
            if zombie:
                self.zombie_refused += 1
            return False
        self.highest[key] = token
        self.value[key] = self.value.get(key, 0) + 1
        self.accepted += 1
        if zombie:
            self.zombie_accepted += 1
        return True


class DelayChecker:
    """No grant of a key inside the lock-delay an earlier entry put it in.

    A delay of D started by the entry at index i is timed by the leader that applied i
    (or, after a failover, by a later leader from its election); either arms it no
    earlier than the first moment any member applied i, and counts D on a clock that
    runs at most ``1 + drift`` times real time. So every entry j > i that grants the key
    is first applied at least D / (1 + drift) of real time after i first was.
    """

    def __init__(self, drift: float) -> None:
        self.drift = drift
        self.delays: dict[str, dict[int, tuple[int, int]]] = {}
        """key -> index that started a delay -> (first real time applied, ms)."""
        self.checked = 0

    def started(self, index: int, key: str, ms: int, now: int) -> None:
        self.delays.setdefault(key, {}).setdefault(index, (now, ms))

    def granted(self, index: int, key: str, now: int) -> None:
        for start, (applied_at, ms) in self.delays.get(key, {}).items():
            if start >= index:
                continue
            self.checked += 1
            ends = applied_at + int(ms * 1000 / (1 + self.drift)) - 1
            if now < ends:
                raise Violation(
                    "lock-delay",
                    f"index {index} granted {key} at {now / 1e6:.3f}s, inside the lock-delay of "
                    f"{ms} ms that index {start} started at {applied_at / 1e6:.3f}s",
                )


class LockChecker:
    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.sections: dict[str, list[Section]] = {key: [] for key in limits}
        self.max_token: dict[str, int] = {}
        self.told: dict[tuple[str, int], tuple[str, str]] = {}
        """(key, token) -> (client, lease) for every grant a client learned."""
        self.latest_grant: dict[str, tuple[int, str]] = {}
        """key -> (token, lease) of the highest grant of each exclusive key committed so far."""
        self.granted: dict[tuple[int, str], set[str]] = {}
        """The leases each entry granted a key to: one, or (the entry that ends a restored
        cluster's quarantine) up to a semaphore's limit of its waiters at once."""
        """Committed history: (token, key) -> lease of each grant (one entry can grant
        several keys: a lease that ends frees all it held)."""
        self.executed: dict[tuple[str, int], int] = {}
        self.token_floor = 0
        """Grants must have tokens above this: the old incarnation's highest index."""
        """(client, seq) -> index of the entry that ran it."""
        self.renewals: dict[tuple[str, int, str, str, int], int] = {}
        self.holds: dict[str, list[tuple[str, int, int]]] = {key: [] for key in limits}
        """key -> (lease, token, real time until which it stays taken) of minimum holds."""
        self.store = FencedStore()
        self.sections_checked = 0
        self.overlaps_checked = 0

    # -- critical sections --------------------------------------------------

    def enter(self, section: Section, now: int) -> None:
        key = section.key
        latest = self.latest_grant.get(key)
        if (
            section.cmd
            and latest is not None
            and latest[0] > section.token
            and latest[1] != section.lease
        ):
            raise Violation(
                "cmd-after-grant",
                f"{section.client} started CMD on {key} with token {section.token} at "
                f"{now / 1e6:.3f}s, after the cluster granted {key} to lease {latest[1]} "
                f"with token {latest[0]}",
            )
        again = self.told.get((key, section.token))
        if again is not None and again[1] == section.lease:
            # A re-entrant acquire under the same lease: the same hold, learned again.
            pass
        elif self.limits[key] == 1 and section.token <= self.max_token.get(key, 0):
            # (Semaphore slots are taken concurrently, so their grants may be learned in
            # any order; a fenced store is for exclusive locks.)
            raise Violation(
                "token-order",
                f"{section.client} learned token {section.token} for {key} after token "
                f"{self.max_token[key]} was handed out",
            )
        self.max_token[key] = max(self.max_token.get(key, 0), section.token)
        self.told[(key, section.token)] = (section.client, section.lease)
        limit = self.limits[key]
        active = [s for s in self.sections[key] if s.active_at(now)]
        others = [s for s in active if (s.lease, s.token) != (section.lease, section.token)]
        self.overlaps_checked += len(others)
        held = [
            (lease, token, until)
            for lease, token, until in self.holds[key]
            if until > now and (lease, token) != (section.lease, section.token)
        ]
        self.holds[key] = held
        if held and len(others) + len(held) >= limit:
            lease, token, until = held[0]
            raise Violation(
                "min-hold",
                f"{section.client} entered {key} with token {section.token} at {now / 1e6:.3f}s, "
                f"before the minimum hold of lease {lease} (token {token}) ended at "
                f"{until / 1e6:.3f}s (limit {limit})",
            )
        if len(others) >= limit:
            holders = ", ".join(
                f"{s.client} (token {s.token}, until {s.ends_by() / 1e6:.3f}s)" for s in others
            )
            raise Violation(
                "two-holders",
                f"{section.client} entered {key} with token {section.token} at "
                f"{now / 1e6:.3f}s while {holders} still held it (limit {limit})",
            )
        # Sections that ended long ago are of no further use.
        self.sections[key] = [*active, section]
        self.sections_checked += 1

    def held_until(self, key: str, lease: str, token: int, until: int) -> None:
        """``lease`` keeps ``key`` (granted with ``token``) taken until real time ``until``."""
        self.holds[key].append((lease, token, until))

    def cmd_resumed(self, section: Section, now: int) -> None:
        """A command frozen with its host (a suspend) runs again, unless its guard, woken
        first, has just killed it: it must not, if its key went to another lease since."""
        latest = self.latest_grant.get(section.key)
        if (
            section.active_at(now)
            and latest is not None
            and latest[0] > section.token
            and latest[1] != section.lease
        ):
            raise Violation(
                "cmd-after-grant",
                f"{section.client}'s CMD on {section.key} (token {section.token}) ran again "
                f"at {now / 1e6:.3f}s after a suspend, though the cluster had granted "
                f"{section.key} to lease {latest[1]} with token {latest[0]}",
            )

    def leave(self, section: Section, now: int) -> None:
        if section.released is None:
            section.released = now

    # -- the replicated history -----------------------------------------------

    def new_incarnation(self, old_last_index: int) -> None:
        """The cluster was restored: ``old_last_index`` is the highest index any member of
        the old incarnation had written (a token it may have handed out)."""
        self.token_floor = max(self.token_floor, old_last_index)

    def grant_committed(self, index: int, key: str, lease: str, now: int | None = None) -> None:
        if index <= self.token_floor:
            raise Violation(
                "tokens-rise",
                f"the restored cluster granted {key} to {lease} with token {index}, not above "
                f"index {self.token_floor}, which the old cluster may have handed out",
            )
        if now is not None and self.limits.get(key) == 1:
            latest = self.latest_grant.get(key)
            if latest is None or latest[0] < index:
                self.latest_grant[key] = (index, lease)
            for s in self.sections.get(key, []):
                if s.cmd and s.lease != lease and s.token < index and s.active_at(now):
                    raise Violation(
                        "cmd-after-grant",
                        f"{s.client}'s CMD on {key} (token {s.token}) still ran at "
                        f"{now / 1e6:.3f}s, when the cluster granted {key} to lease {lease} "
                        f"with token {index}",
                    )
        known = self.granted.setdefault((index, key), set())
        known.add(lease)
        if len(known) > self.limits.get(key, 1):
            raise Violation(
                "history",
                f"index {index} granted {key} to {', '.join(sorted(known))}: more than its "
                "limit, so members applied different entries there",
            )

    def executed_request(self, client: str, seq: int, index: int) -> None:
        if not client:
            return  # a version-1 request has no identity to hold to this
        first = self.executed.setdefault((client, seq), index)
        if first != index:
            raise Violation(
                "at-most-once",
                f"request {client}/{seq} ran at index {first} and again at index {index}",
            )

    def renewed(self, leader: str, term: int, lease: str, client: str, seq: int) -> None:
        if not client:
            return
        key = (leader, term, lease, client, seq)
        count = self.renewals[key] = self.renewals.get(key, 0) + 1
        if count > 1:
            raise Violation(
                "at-most-once",
                f"keep-alive {client}/{seq} extended lease {lease} {count} times on {leader}",
            )

    def check_history(self) -> None:
        """Every grant a client learned is a committed grant of that key to that lease."""
        for (key, token), (client, lease) in self.told.items():
            committed = self.granted.get((token, key), set())
            if lease not in committed:
                raise Violation(
                    "lost-grant",
                    f"{client} was told it holds {key} with token {token} (lease {lease}), but "
                    f"the committed entry {token} is {committed}",
                )
