"""The verdict on one chaos run: a pure check of the history that real processes recorded.

Everything here is a function of a ``History`` (no IO, no clock): every client
operation with its invocation and completion time on the host's monotonic
clock (one machine, one clock) and its outcome (``ok``, ``fail`` or
``unknown``: a timeout, a process killed before it heard back), what each
lease's client knew about its deadline, what the fenced store did, and the
grants the members' audit logs record. ``check`` returns every violation of:

* **linearizability** of the lock model, per key (the search of Wing & Gong as
  refined by Lowe, as porcupine does it: order the operations consistently with
  real time, backtrack, memoise (linearized set, state)). The model is a lock
  with fencing tokens: a grant needs the lock free and a token above every
  earlier one; a release or close frees it; a read (``get``) sees its holder.
  A lock may also be freed by its lease's expiry, which the cluster may do only
  once the lease's client-side deadline has passed (``free_after``): that is how
  invariant 4 (the client's lease ends first) enters the model. The model is
  nondeterministic (an ``unknown`` operation may or may not have taken effect;
  an expiry may or may not have happened), so the search runs over *sets* of
  states, which keeps it the deterministic algorithm;
* **one holder in real time**: no two critical sections of one key overlap. A
  library client's section runs from when it learned the grant to the earliest
  of its release, its lease's close, its client-side deadline and its death; a
  ``dlm exec`` section from CMD's own start record to the last sign of life CMD
  recorded (or the moment the harness froze its process tree). What a client
  does after its section ended (a paused process waking up) is a *zombie*
  operation: the fenced store must take care of it;
* **the fenced store**: it never accepted a token lower than one it had seen,
  never refused one at least as high, lost no update (every accepted write
  builds on the value before it, and the final value is the number of accepted
  writes, between the writes clients saw acknowledged and those plus the
  unknown ones), and no store access with a higher token came while a section
  with a lower one was still open;
* **grants are real**: every grant a client was told about is a ``lock_granted``
  of that key, token and lease in the members' audit logs, and no token of a
  key was granted to two leases;
* **recovery**: a lock whose holder died became available within the bound
  the harness gives (TTL + an election timeout + slack once faults healed).

Times are seconds of ``time.monotonic()``; an unknown completion is ``inf``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dlm.client.core import lease_deadline

INF = math.inf
SEARCH_BUDGET = 2_000_000
"""Steps of the linearizability search per key before it gives up (inconclusive)."""

# Operation kinds (Op.f)
ACQUIRE, RELEASE, CLOSE, GET, READ, WRITE = "acquire", "release", "close", "get", "read", "write"
OK, FAIL, UNKNOWN = "ok", "fail", "unknown"
# Reasons an operation failed (Op.detail)
HELD, NOT_HOLDER, LOST, QUEUE, REFUSED = "held", "not_holder", "lost", "queue", "refused"


@dataclass(frozen=True)
class Op:
    """One client operation. ``token``: granted (acquire ok), named (release), used (store ops)."""

    id: str
    client: str
    f: str
    key: str | None
    lease: str | None
    call: float
    ret: float
    outcome: str
    token: int | None = None
    detail: str = ""
    holder: tuple[str, int] | None = None
    """What a ``get`` saw: the (lease, token) holding the key, None when free."""
    wait: bool = False
    """An acquire that queued: its failure (the wait ran out) says nothing about the lock,
    since leaving the queue releases a grant that raced in."""


@dataclass(frozen=True)
class Renewal:
    """A renewal (or the lease's opening) sent at ``sent``, confirmed with ``ttl_ms`` at
    ``arrived``."""

    sent: float
    ttl_ms: int
    arrived: float


@dataclass
class LeaseFacts:
    """What is known of a lease from its client's side."""

    client: str
    kind: str = "library"
    """``library`` (a Client with a KeepAlive) or ``exec`` (a `dlm exec` run)."""
    renewals: list[Renewal] = field(default_factory=list)
    killed_at: float | None = None
    """When the harness killed the client process (nothing of it ran after)."""
    cmd_start: float | None = None
    last_sign: float | None = None
    """exec: the last moment CMD recorded being alive, before any freeze."""
    frozen_at: float | None = None
    """exec: when the harness SIGSTOPped the whole process tree (a frozen host)."""


@dataclass(frozen=True)
class StoreEvent:
    """One request as the fenced store handled it, at ``t``."""

    op: str
    client_op: str
    key: str
    token: int
    accepted: bool
    highest_before: int
    value_before: int
    value_after: int
    expected: int | None
    """For a write: the value the writer had read (the write sets expected + 1)."""
    t: float


@dataclass(frozen=True)
class AuditGrant:
    node: str
    key: str
    token: int
    lease: str


@dataclass(frozen=True)
class Recovery:
    """A holder died at ``died``; faults healed at ``healed``; the key was granted again at
    ``available`` (None: never, within the time the harness waited)."""

    key: str
    died: float
    healed: float
    available: float | None
    bound: float


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    leases: dict[str, LeaseFacts] = field(default_factory=dict)
    store: list[StoreEvent] = field(default_factory=list)
    audit: list[AuditGrant] | None = None
    """The members' ``lock_granted`` events; None when no audit log was read (the grants
    clients were told about are then not checked against them)."""
    recoveries: list[Recovery] = field(default_factory=list)


@dataclass(frozen=True)
class Violation:
    kind: str
    key: str | None
    message: str

    def __str__(self) -> str:
        where = f" [{self.key}]" if self.key else ""
        return f"{self.kind}{where}: {self.message}"


@dataclass(frozen=True)
class Section:
    client: str
    key: str
    lease: str
    token: int
    start: float
    end: float
    why_end: str


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    sections: list[Section] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, kind: str, key: str | None, message: str) -> None:
        self.violations.append(Violation(kind, key, message))


# ---------------------------------------------------------------------------
# Deadlines
# ---------------------------------------------------------------------------


def client_deadline(renewals: Iterable[Renewal]) -> float:
    """The lease's client-side deadline after every renewal that counted (KeepAlive's rule:
    a confirmation that arrives after the deadline as it stood counts for nothing)."""
    deadline = -INF
    for r in sorted(renewals, key=lambda r: r.arrived):
        if deadline == -INF or r.arrived < deadline:
            deadline = max(deadline, lease_deadline(r.sent, r.ttl_ms))
    return deadline


def free_after(facts: LeaseFacts | None) -> float:
    """The earliest moment the cluster may end this lease's holds without being asked.

    A library lease: its client-side deadline (the cluster's own comes later). An exec
    lease: the end of CMD, which must be gone before the cluster may expire the lease;
    one whose CMD never ran may have been let go at any time (nothing relied on it).
    Unknown leases: never (nothing may free them unseen).
    """
    if facts is None:
        return INF
    if facts.kind == "exec":
        if facts.cmd_start is None:
            return -INF
        end = facts.last_sign if facts.last_sign is not None else facts.cmd_start
        return min(end, facts.frozen_at) if facts.frozen_at is not None else end
    if not facts.renewals:
        return -INF
    return client_deadline(facts.renewals)


# ---------------------------------------------------------------------------
# The lock model, and the linearizability search
# ---------------------------------------------------------------------------

State = tuple[str | None, int | None, int]
"""(holder lease or None, its token or None when not learned, highest token granted)."""
INIT: State = (None, None, 0)


class LockModel:
    """One exclusive key: its transitions, with expiry allowed once ``free_after`` passed."""

    def __init__(self, free: dict[str, float]) -> None:
        self.free = free

    def _expirable(self, s: State, op: Op) -> list[State]:
        """``s``, and ``s`` with its holder expired if that may have happened by ``op.ret``."""
        holder, _, floor = s
        if holder is not None and self.free.get(holder, INF) <= op.ret:
            return [s, (None, None, floor)]
        return [s]

    def successors(self, s: State, op: Op) -> set[State]:
        out: set[State] = set()
        lease = op.lease
        if op.f == ACQUIRE:
            if op.outcome == OK:
                assert op.token is not None
                for holder, token, floor in self._expirable(s, op):
                    if holder is None and op.token > floor:
                        out.add((lease, op.token, op.token))
                    elif holder == lease and token in (op.token, None):
                        out.add((lease, op.token, max(floor, op.token)))
            elif op.outcome == FAIL and op.detail == HELD and not op.wait:
                if s[0] is not None and s[0] != lease:
                    out.add(s)
            else:  # unknown, or a failure that says nothing (a wait that ran out, lost lease)
                out.add(s)
                for holder, _, floor in self._expirable(s, op):
                    if holder is None:
                        out.add((lease, None, floor))
        elif op.f == RELEASE:
            if op.outcome == OK and op.detail != QUEUE:
                holder, token, floor = s
                if holder == lease and token in (op.token, None):
                    top = floor if op.token is None else max(floor, op.token)
                    out.add((None, None, top))
            elif op.outcome == OK:  # it left a queue: it did not hold the lock
                out.update(x for x in self._expirable(s, op) if x[0] != lease)
            elif op.outcome == FAIL and op.detail in (NOT_HOLDER, LOST):
                out.update(
                    x for x in self._expirable(s, op) if not (x[0] == lease and x[1] == op.token)
                )
            else:
                out.update(self._expirable(s, op))
                if s[0] == lease:
                    out.add((None, None, s[2]))
        elif op.f == CLOSE:
            for x in self._expirable(s, op):
                if op.outcome == OK:
                    out.add((None, None, x[2]) if x[0] == lease else x)
                else:
                    out.add(x)
                    if x[0] == lease:
                        out.add((None, None, x[2]))
        elif op.f == GET:
            if op.outcome != OK:
                out.add(s)
            elif op.holder is None:
                out.update(x for x in self._expirable(s, op) if x[0] is None)
            else:
                seen_lease, seen_token = op.holder
                holder, token, floor = s
                if holder == seen_lease and token in (seen_token, None):
                    out.add((holder, seen_token, max(floor, seen_token)))
        else:
            raise ValueError(f"not a lock operation: {op.f}")
        return out

    def step(self, states: frozenset[State], op: Op) -> frozenset[State]:
        out: set[State] = set()
        for s in states:
            out |= self.successors(s, op)
        return frozenset(out)


class _Entry:
    __slots__ = ("index", "is_call", "match", "next", "op", "prev")

    def __init__(self, op: Op | None, index: int, is_call: bool) -> None:
        self.op = op
        self.index = index
        self.is_call = is_call
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


@dataclass
class SearchResult:
    linearizable: bool | None
    """None: the search ran out of budget."""
    stuck_at: Op | None = None
    """The operation whose completion no ordering could reach (on the deepest attempt)."""
    states: frozenset[State] = frozenset()
    prefix: list[Op] = field(default_factory=list)
    steps: int = 0


def linearize(
    ops: list[Op],
    step: Callable[[frozenset[State], Op], frozenset[State]],
    init: frozenset[State],
    budget: int = SEARCH_BUDGET,
) -> SearchResult:
    """Whether ``ops`` can be put in an order consistent with real time in which every one
    is a legal step of the model. Operations with ``ret == inf`` may be placed anywhere
    after their call (or at the very end)."""
    events: list[tuple[float, int, int]] = []
    for i, op in enumerate(ops):
        events.append((op.call, 0, i))
        if op.ret != INF:
            if op.ret < op.call:
                raise ValueError(f"operation {op.id} returns before it is called")
            events.append((op.ret, 1, i))
    events.sort()  # a call before a return at the same instant: they count as concurrent
    head = _Entry(None, -1, False)
    calls: dict[int, _Entry] = {}
    last: _Entry = head
    for _, kind, i in events:
        made = _Entry(ops[i], i, kind == 0)
        if kind == 0:
            calls[i] = made
        else:
            calls[i].match = made
        made.prev, last.next = last, made
        last = made

    def lift(e: _Entry) -> None:
        assert e.prev is not None
        e.prev.next = e.next
        if e.next is not None:
            e.next.prev = e.prev
        m = e.match
        if m is not None:
            assert m.prev is not None
            m.prev.next = m.next
            if m.next is not None:
                m.next.prev = m.prev

    def unlift(e: _Entry) -> None:
        m = e.match
        if m is not None:
            assert m.prev is not None
            m.prev.next = m
            if m.next is not None:
                m.next.prev = m
        assert e.prev is not None
        e.prev.next = e
        if e.next is not None:
            e.next.prev = e

    state = init
    linearized = 0
    stack: list[tuple[_Entry, frozenset[State]]] = []
    cache: set[tuple[int, frozenset[State]]] = set()
    entry: _Entry | None = head.next
    steps = 0
    deepest: tuple[int, Op | None, frozenset[State], list[Op]] = (-1, None, init, [])
    while head.next is not None:
        steps += 1
        if steps > budget:
            return SearchResult(None, steps=steps)
        if entry is not None and entry.is_call:
            assert entry.op is not None
            after = step(state, entry.op)
            if after:
                marked = linearized | (1 << entry.index)
                if (marked, after) not in cache:
                    cache.add((marked, after))
                    stack.append((entry, state))
                    state, linearized = after, marked
                    lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
            continue
        # A completion no remaining order can reach before it, or nothing left to try.
        if entry is not None and len(stack) > deepest[0]:
            deepest = (len(stack), entry.op, state, [e.op for e, _ in stack if e.op is not None])
        if not stack:
            _, stuck, states, prefix = deepest
            return SearchResult(False, stuck, states, prefix, steps)
        top, state = stack.pop()
        linearized &= ~(1 << top.index)
        unlift(top)
        entry = top.next
    return SearchResult(True, steps=steps)


# ---------------------------------------------------------------------------
# Critical sections
# ---------------------------------------------------------------------------


def sections(history: History) -> list[Section]:
    """Every critical section the clients were in, per the rules in the module docstring."""
    out: list[Section] = []
    by_lease: dict[str, list[Op]] = defaultdict(list)
    for op in history.ops:
        if op.lease is not None:
            by_lease[op.lease].append(op)
    for op in history.ops:
        if op.f != ACQUIRE or op.outcome != OK or op.key is None or op.lease is None:
            continue
        assert op.token is not None
        facts = history.leases.get(op.lease)
        if facts is not None and facts.kind == "exec":
            if facts.cmd_start is None:
                continue  # the grant was never used: CMD did not start
            end = free_after(facts)
            why = "frozen" if facts.frozen_at is not None and end == facts.frozen_at else "cmd"
            out.append(Section(op.client, op.key, op.lease, op.token, facts.cmd_start, end, why))
            continue
        ends: list[tuple[float, str]] = []
        for other in by_lease[op.lease]:
            if other.call < op.ret:
                continue
            if (other.f == RELEASE and other.key == op.key) or other.f == CLOSE:
                ends.append((other.call, other.f))
        if facts is not None:
            if facts.renewals:
                ends.append((client_deadline(facts.renewals), "deadline"))
            if facts.killed_at is not None:
                ends.append((facts.killed_at, "killed"))
        end, why = min(ends) if ends else (INF, "never")
        out.append(Section(op.client, op.key, op.lease, op.token, op.ret, max(end, op.ret), why))
    return out


def _check_overlaps(secs: list[Section], verdict: Verdict) -> None:
    by_key: dict[str, list[Section]] = defaultdict(list)
    for s in secs:
        by_key[s.key].append(s)
    for key, group in by_key.items():
        group.sort(key=lambda s: s.start)
        open_: list[Section] = []
        for s in group:
            open_ = [o for o in open_ if o.end > s.start]
            for o in open_:
                if (o.lease, o.token) != (s.lease, s.token):
                    verdict.add(
                        "overlap",
                        key,
                        f"{s.client} (token {s.token}) entered at {s.start:.3f} while "
                        f"{o.client} (token {o.token}) was inside until {o.end:.3f} "
                        f"({o.why_end}): {1000 * (o.end - s.start):.0f} ms together",
                    )
            open_.append(s)
            verdict.stats["sections"] += 1


# ---------------------------------------------------------------------------
# The fenced store
# ---------------------------------------------------------------------------


def _check_store(history: History, secs: list[Section], verdict: Verdict) -> None:
    ops_by_id = {op.id: op for op in history.ops}
    section_of = {(s.key, s.token, s.lease): s for s in secs}
    section_by_token: dict[tuple[str, int], Section] = {(s.key, s.token): s for s in secs}
    highest: dict[str, int] = {}
    value: dict[str, int] = {}
    accepted_writes: Counter[str] = Counter()
    for e in sorted(history.store, key=lambda e: e.t):
        top = highest.get(e.key, 0)
        if e.highest_before != top or e.value_before != value.get(e.key, 0):
            verdict.add(
                "store-log",
                e.key,
                f"the store's log disagrees with itself at {e.t:.3f} (highest {e.highest_before} "
                f"vs {top}, value {e.value_before} vs {value.get(e.key, 0)})",
            )
        if e.accepted and e.token < top:
            verdict.add(
                "store-order",
                e.key,
                f"the store accepted token {e.token} ({e.op}) at {e.t:.3f} after token {top}",
            )
        if not e.accepted and e.token >= top:
            verdict.add(
                "store-refused-valid", e.key, f"the store refused token {e.token} at {e.t:.3f}"
            )
        if e.accepted:
            highest[e.key] = max(top, e.token)
            if e.op == WRITE:
                accepted_writes[e.key] += 1
                if e.expected != e.value_before:
                    verdict.add(
                        "lost-update",
                        e.key,
                        f"token {e.token} wrote {e.value_after} at {e.t:.3f} over "
                        f"{e.value_before}, having read {e.expected}: "
                        f"{e.value_before - (e.expected or 0)} update(s) lost",
                    )
                if e.value_after != e.value_before + 1:
                    verdict.add(
                        "lost-update", e.key, f"a write at {e.t:.3f} did not add exactly one"
                    )
            value[e.key] = e.value_after
        # Zombies: accesses made after the section they belong to had ended.
        op = ops_by_id.get(e.client_op)
        sec = section_of.get((e.key, e.token, op.lease)) if op and op.lease else None
        if sec is None:
            sec = section_by_token.get((e.key, e.token))
        called = op.call if op is not None else e.t
        if sec is not None and called >= sec.end:
            verdict.stats["zombie_" + ("accepted" if e.accepted else "refused")] += 1
        verdict.stats["store_" + ("accepted" if e.accepted else "refused")] += 1
        # A store access with a higher token while a lower token's section is still open
        # means the lock was granted again while its holder still had the right to act.
        for s in secs:
            if s.key == e.key and s.token < e.token and s.start <= e.t < s.end:
                if sec is not None and called >= sec.end:
                    continue  # the zombie's own section is over; it proves nothing
                verdict.add(
                    "overlap",
                    e.key,
                    f"token {e.token} reached the store at {e.t:.3f} while {s.client} "
                    f"(token {s.token}) was inside its section until {s.end:.3f}",
                )
    acked: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    for op in history.ops:
        if op.f == WRITE and op.key is not None:
            if op.outcome == OK:
                acked[op.key] += 1
            elif op.outcome == UNKNOWN:
                unknown[op.key] += 1
    for key in set(value) | set(acked):
        final = value.get(key, 0)
        if final != accepted_writes[key]:
            verdict.add(
                "lost-update",
                key,
                f"final value {final}, but the store accepted {accepted_writes[key]} writes",
            )
        if not acked[key] <= final <= acked[key] + unknown[key]:
            verdict.add(
                "lost-update",
                key,
                f"final value {final}; clients saw {acked[key]} writes acknowledged and "
                f"{unknown[key]} with no answer",
            )
        verdict.stats["store_final_value"] += final


# ---------------------------------------------------------------------------
# Grants against the audit logs
# ---------------------------------------------------------------------------


def _check_audit(history: History, verdict: Verdict) -> None:
    if history.audit is None:
        return
    granted: dict[tuple[str, int], str] = {}
    for g in history.audit:
        known = granted.setdefault((g.key, g.token), g.lease)
        if known != g.lease:
            verdict.add(
                "audit-conflict",
                g.key,
                f"token {g.token} granted to lease {known} on one member and to {g.lease} on "
                f"{g.node}",
            )
    for op in history.ops:
        if op.f != ACQUIRE or op.outcome != OK or op.key is None or op.token is None:
            continue
        verdict.stats["grants_told"] += 1
        found = granted.get((op.key, op.token))
        if found != op.lease:
            verdict.add(
                "lost-grant",
                op.key,
                f"{op.client} was told lease {op.lease} holds it with token {op.token}, but "
                f"the audit logs say {found or 'no such grant'}",
            )


def _check_recoveries(history: History, verdict: Verdict) -> None:
    for r in history.recoveries:
        start = max(r.died, r.healed)
        if r.available is None:
            verdict.add("unavailable", r.key, "never granted again after its holder died")
        elif r.available - start > r.bound:
            verdict.add(
                "unavailable",
                r.key,
                f"granted again {r.available - start:.2f}s after its holder died and faults "
                f"healed (bound {r.bound:.2f}s)",
            )
        verdict.stats["recoveries"] += 1


# ---------------------------------------------------------------------------
# The whole check
# ---------------------------------------------------------------------------


def _describe(op: Op) -> str:
    what = f"{op.client} {op.f}({op.key}, lease {op.lease}"
    what += f", token {op.token})" if op.token is not None else ")"
    ret = "never" if op.ret == INF else f"{op.ret:.3f}"
    how = op.outcome + (f"/{op.detail}" if op.detail else "")
    if op.holder is not None:
        how += f" holder={op.holder}"
    return f"{what} [{op.call:.3f}, {ret}] -> {how}"


def _left_the_queue(ops: list[Op]) -> dict[str, float]:
    """Leases whose waiting acquire of this key ran out: the client then releases the key
    (the grant may have raced in while it waited, say with its member cut off), so from
    that acquire's return on the lease cannot hold the key, until it takes it again; by
    lease, when. A lease that later acquires the key again is left out, so as not to
    free its later hold."""
    left: dict[str, float] = {}
    for op in ops:
        waited_out = op.f == ACQUIRE and op.wait and op.outcome == FAIL and op.detail == HELD
        if waited_out and op.lease is not None:
            left[op.lease] = min(left.get(op.lease, INF), op.ret)
    for op in ops:
        if op.f == ACQUIRE and op.outcome == OK and op.lease in left and op.call >= left[op.lease]:
            del left[op.lease]
    return left


def check_linearizable(history: History, verdict: Verdict, budget: int = SEARCH_BUDGET) -> None:
    free = {lease: free_after(facts) for lease, facts in history.leases.items()}
    per_key: dict[str, list[Op]] = defaultdict(list)
    for op in history.ops:
        if op.f in (ACQUIRE, RELEASE, GET) and op.key is not None:
            per_key[op.key].append(op)
    keys_of_lease: dict[str, set[str]] = defaultdict(set)
    for key, ops in per_key.items():
        for op in ops:
            if op.lease is not None:
                keys_of_lease[op.lease].add(key)
    for op in history.ops:
        if op.f == CLOSE and op.lease is not None:
            for key in keys_of_lease[op.lease]:
                per_key[key].append(op)
    for key in sorted(per_key):
        ops = per_key[key]
        left = _left_the_queue(ops)
        model = LockModel({**free, **{k: min(t, free.get(k, INF)) for k, t in left.items()}})
        result = linearize(ops, model.step, frozenset({INIT}), budget)
        verdict.stats["linearizability_steps"] += result.steps
        verdict.stats["lock_ops_checked"] += len(ops)
        if result.linearizable is None:
            verdict.inconclusive.append(key)
        elif not result.linearizable:
            tail = "; ".join(_describe(op) for op in result.prefix[-4:])
            stuck = _describe(result.stuck_at) if result.stuck_at else "?"
            verdict.add(
                "not-linearizable",
                key,
                f"no order fits: stuck before {stuck}, in states {sorted(result.states, key=str)}"
                f", after ...{tail}",
            )


def check(history: History, budget: int = SEARCH_BUDGET) -> Verdict:
    verdict = Verdict()
    for op in history.ops:
        verdict.stats[f"ops_{op.outcome}"] += 1
    check_linearizable(history, verdict, budget)
    secs = sections(history)
    verdict.sections = secs
    _check_overlaps(secs, verdict)
    _check_store(history, secs, verdict)
    _check_audit(history, verdict)
    _check_recoveries(history, verdict)
    return verdict
