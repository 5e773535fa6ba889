"""The decisions of `dlm exec`, pure: when CMD may start, when it gets which signal.

The guard process (guard.py) and the supervisor (exec_cmd.py) act on these
objects, and the whole-node simulator (tests/sim/nodesim.py) drives the very
same ones, with time passed in: nothing here reads a clock, does IO or sends
a signal. Times are seconds on the host's lease clock
(``dlm.client.clock.lease_clock``); D is the deadline
(``dlm.client.core.lease_deadline`` of the last confirmed renewal).

Timing rules (``stop`` is when an immediate stop was asked for)::

    SIGTERM  at min(D - max(grace, KILL_LEAD_S), stop)        term_time
    SIGKILL  at min(D - KILL_LEAD_S, stop + grace)            kill_time

CMD starts only before its SIGTERM time, checked twice, each time right
before the step that cannot be taken back: by the supervisor before it orders
the spawn (``StartGate.may_order_spawn``), and by the guard before it spawns
(``GuardRules.may_spawn``). A CMD that starts anyway (the guard paused
between its check and the spawn) is SIGKILLed at once (``GuardRules.spawned``).
"""

from __future__ import annotations

KILL_LEAD_S = 0.2
"""SIGKILL goes out this long before D: time to wake, find every descendant, deliver."""
MAX_DEFAULT_GRACE_S = 5.0
KILL_REPEAT_S = 0.01
"""After SIGKILL, look for (and kill) late descendants this often until none is left ..."""
KILL_REPEAT_SLOW_S = 0.5
"""... and this often once a second has passed (a process in uninterruptible sleep)."""
RECHECK_S = 0.1
"""While CMD runs the guard reads the clock at least this often: its waits count on a
clock that stops in a suspend, and a deadline that passed meanwhile must be seen soon."""

TERM, KILL = "TERM", "KILL"
"""The signals the guard is told to send (guard.py maps them to SIGTERM and SIGKILL)."""

START, RENEW, TOO_LATE = "start", "renew", "too late"
"""``StartGate.before_start``'s answers."""


def default_grace(ttl_ms: int) -> float:
    """--kill-grace when not given: min(5 s, TTL/4)."""
    return min(MAX_DEFAULT_GRACE_S, ttl_ms / 4000.0)


def grace_problem(grace: float, ttl_ms: int) -> str | None:
    """Why an explicit --kill-grace cannot work with this TTL, or None if it can.

    SIGTERM goes out at D - grace; with half the TTL or more, a lease renewed every
    TTL/3 would be spent before its renewal had a chance.
    """
    if grace * 2000.0 >= ttl_ms:
        return "it must be less than half the TTL"
    return None


def term_time(deadline: float, grace: float, stop_at: float | None = None) -> float:
    """When CMD's processes get SIGTERM."""
    at = deadline - max(grace, KILL_LEAD_S)
    return at if stop_at is None else min(at, stop_at)


def kill_time(deadline: float, grace: float, stop_at: float | None = None) -> float:
    """When CMD's processes get SIGKILL: before D whatever happens."""
    at = deadline - KILL_LEAD_S
    return at if stop_at is None else min(at, stop_at + grace)


def extended(deadline: float, offered: float, term_sent: bool) -> float:
    """The deadline after a renewal offers ``offered``: later only, and never once
    SIGTERM is out (a renewal confirmed late takes back nothing already sent)."""
    return deadline if term_sent else max(deadline, offered)


class GuardRules:
    """What the guard decides: whether to start CMD, and which signal is due when.

    The guard calls ``offer`` for every D the supervisor sends, ``may_spawn``
    when the spawn order arrives (with the order's D), ``spawned`` right after
    CMD started, ``stop`` when the supervisor hangs up, asks for a stop or CMD
    ended leaving processes behind, and ``next_signal`` on every wake-up.
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.deadline = float("-inf")
        self.stop_at: float | None = None
        self.kill_from: float | None = None
        """Set when CMD started past its SIGTERM time: SIGKILL from then on."""
        self.term_sent = False
        self.deadline_reported = False

    def offer(self, deadline: float) -> None:
        """The supervisor confirmed a renewal: D moves to ``deadline`` if that is later and
        no SIGTERM went out yet."""
        self.deadline = extended(self.deadline, deadline, self.term_sent)

    def may_spawn(self, now: float, deadline: float) -> bool:
        """The spawn order arrived, under ``deadline``: start CMD only before its SIGTERM
        time (a supervisor paused after its own check sends the order late)."""
        self.offer(deadline)
        return now < term_time(self.deadline, self.grace, self.stop_at)

    def spawned(self, now: float) -> bool:
        """CMD has started; ``now`` is read after the spawn returned. False when its
        SIGTERM time passed meanwhile (the guard was paused between ``may_spawn`` and
        the spawn): then CMD is to be SIGKILLed at once, not given a grace."""
        if now < term_time(self.deadline, self.grace, self.stop_at):
            return True
        self.kill_from = now
        return False

    def stop(self, now: float) -> None:
        """Stop CMD from ``now`` (SIGTERM now, SIGKILL after the grace, never after D)."""
        if self.stop_at is None:
            self.stop_at = now

    def deadline_passed(self, now: float) -> bool:
        """True once, the first time ``now`` is at or past the SIGTERM time of D with no
        stop asked for: the lease ran out unrenewed (the guard tells the supervisor)."""
        if self.deadline_reported or now < term_time(self.deadline, self.grace):
            return False
        self.deadline_reported = True
        return True

    def kill_at(self) -> float:
        at = kill_time(self.deadline, self.grace, self.stop_at)
        return at if self.kill_from is None else min(at, self.kill_from)

    def next_signal(self, now: float) -> tuple[str | None, float]:
        """The signal due at ``now`` (KILL, TERM or None) and when to look again: never
        later than RECHECK_S from now, so a suspend cannot hide a deadline for long."""
        kill_at = self.kill_at()
        if now >= kill_at:
            repeat = KILL_REPEAT_S if now < kill_at + 1.0 else KILL_REPEAT_SLOW_S
            self.term_sent = True
            return KILL, now + repeat
        term_at = term_time(self.deadline, self.grace, self.stop_at)
        if now >= term_at:
            due = None if self.term_sent else TERM
            self.term_sent = True
            return due, min(kill_at, now + RECHECK_S)
        return None, min(term_at, now + RECHECK_S)


class StartGate:
    """What the supervisor decides between the grant and the spawn order.

    ``deadline`` is always D of the last confirmed renewal, as the supervisor
    knows it; ``now`` is read right before the decision is acted on.
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace

    def stop_time(self, deadline: float) -> float:
        return term_time(deadline, self.grace)

    def before_start(self, now: float, deadline: float, interval: float) -> str:
        """After the grant: START when CMD has a renewal interval or more before its
        SIGTERM time, RENEW (once, then ``may_order_spawn``) when it has less, TOO_LATE
        when that time has passed."""
        stop_at = self.stop_time(deadline)
        if stop_at <= now:
            return TOO_LATE
        if stop_at - now < interval:
            return RENEW
        return START

    def may_order_spawn(self, now: float, deadline: float) -> bool:
        """Right before the spawn order goes to the guard: only before CMD's SIGTERM time
        (the supervisor may have been paused since its last look)."""
        return now < self.stop_time(deadline)
