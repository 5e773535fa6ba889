"""`dlm exec`: run a command only while a lock is held, and stop it before the lock can be lost.

Theory of operation
-------------------
Three processes: dlm itself (the *supervisor*), its *guard* (dlm.cli.guard),
and CMD, which the guard starts and stops.

1. Before anything else (and before any thread exists), fork the guard.
2. Open a fresh lease (``--ttl``) and renew it every TTL/3 (KeepAlive, from
   its own connection), so a long ``--wait`` in the queue cannot outlive it.
   Each confirmed renewal sets the deadline D: the send time of that renewal
   + TTL, less a margin for clock-rate drift (dlm.client.core.lease_deadline).
   The supervisor passes every new D to the guard. An acquire that cannot
   outlast half the TTL (one key in a cluster of one partition, no ``--wait``,
   ``--timeout`` + ``--dial-timeout`` under TTL/2) has the KeepAlive's threads
   start once the guard says CMD started and half a renewal interval has passed
   since the last confirmation, instead of before the acquire (a CMD that ended
   by then, as most cron jobs do, runs without them): none of its renewals
   would have been due, or the one that was is made up for by step 4 or, when
   the threads start, at once (renewals_can_wait).
3. Acquire the lock (``--wait`` queues FIFO). Not obtained: close the lease,
   exit 75 or ``--conflict-exit-code`` (silently with that, ``-q`` or
   ``--min-hold``, unless ``-v``; ``--json`` always prints its object); CMD
   never starts.
4. If less than a renewal interval is left before CMD would have to be
   stopped (a long wait, a slow acquire), renew once more first; if that is
   not confirmed, CMD does not start.
5. Right before it orders the spawn, dlm compares D with its clock once more
   (no round trip; it may have been paused since the renewal): past CMD's
   SIGTERM time, CMD does not start and dlm exits 77. The guard compares
   again right before it spawns (the order may have waited in the pipe), and
   SIGKILLs at once a CMD whose spawn returned past that time. Both decisions
   are dlm.cli.exec_rules (pure), on dlm.client.clock.lease_clock, which runs
   on while the host is suspended.
   The guard starts CMD (no shell, a new session, fds 0-2, the DLM_*
   variables; under ``--json`` CMD's stdout is dlm's stderr, so dlm's stdout
   carries only its JSON object). From then on the guard alone enforces the
   deadline: SIGTERM to CMD's group and descendants at D - grace, SIGKILL
   before D, whether or not the supervisor is alive, scheduled or renewing.
6. The supervisor waits for the guard's reports, the KeepAlive's verdict and
   signals:
   - CMD ended and nothing of it is left (the guard stops leftovers first:
     SIGTERM, SIGKILL after the grace): stop the renewals, close the lease,
     which releases the lock, and exit with CMD's code (128+N after signal N);
     the KeepAlive's threads are joined after the close, not before it;
   - a signal to dlm (INT, TERM, HUP, QUIT): forward it to CMD's group, keep
     waiting, so CMD decides how to end and the lock is released after;
   - the lease is lost (SESSION_EXPIRED, or the stop time passed without a
     confirmed renewal): the guard stops CMD; once nothing of it is left
     (bounded wait), exit 77 without touching the lease. A lease lost while
     still queued (``--wait``) ends the wait at once: 77.
7. ``--min-hold``: when CMD has ended (whatever its code) before the hold is
   over, stop renewing and give the lease the rest of the hold as its TTL
   (``lease_update`` with ``finished``) instead of closing it, then exit at
   once: the leader expires the lease, and frees the lock, when that time is
   up. The hold is counted from when the grant's reply arrived, after the
   grant, and stretched for clock rates (dlm.client.core.min_hold_ttl_ms), so
   it never ends before DURATION after the grant; a failover only lengthens
   it. If the cluster does not confirm the update, the lease is left to
   expire by itself (never closed: that would end the hold at once), and dlm
   keeps trying only while a late confirmation could still save the hold,
   that is while the last renewal does not already cover it and the lease
   lasts (at most --ttl).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time
from collections.abc import Sequence

from dlm.cli import exits
from dlm.cli.exec_rules import StartGate
from dlm.cli.exits import CliError, Interrupted, usage_error
from dlm.cli.ops import (
    conflict_error,
    duration_option,
    lock_delay_option,
    owner_meta,
    ttl_option,
    wait_option,
)
from dlm.cli.output import complain, emit_json, iso_local
from dlm.cli.settings import EXEC_CONFLICT_EXIT_CODE, Settings
from dlm.limits import HOLD_MAX_MS

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Protocol

    from dlm.cli.guard import Guard
    from dlm.client.core import Grant, Lease, RunEnd
    from dlm.client.sync import Client, KeepAlive

    class Election(Protocol):
        """What `dlm elect` (elect.py) changes in a run: see ``run``."""

        def meta(self) -> dict[str, str]: ...
        def placeholder(self) -> list[str]: ...
        def elected(self, grant: Grant, as_json: bool) -> None: ...
        def exit_code(self, code: int) -> int: ...


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SETTLE_SECONDS = 1.0
"""After D, how long to wait for the guard to see the last of CMD's processes gone."""
LOST_VERDICT_SECONDS = 2.0
"""How long to wait for the KeepAlive's verdict after it closed the client under us."""


class _Signals:
    """One handler for dlm's whole run, whose meaning follows the phase.

    Before CMD starts, a signal abandons the attempt (Interrupted; the cleanup
    gives back whatever was obtained). While CMD is being started it is held
    back, then forwarded; while CMD runs it is forwarded to CMD's group (by the
    guard, which knows whether that group id is still CMD's); once CMD has
    ended it is ignored, so the lock is still released.
    """

    BEFORE, STARTING, RUNNING, DONE = range(4)

    def __init__(self) -> None:
        self.phase = self.BEFORE
        self.guard: Guard | None = None
        self.pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for s in FORWARDED:
            # An ignored signal (nohup, `&` in sh) stays ignored, and CMD inherits that.
            if signal.getsignal(s) != signal.SIG_IGN:
                self._previous[s] = signal.signal(s, self._handle)

    def restore(self) -> None:
        for s, old in self._previous.items():
            signal.signal(s, old)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.phase == self.BEFORE:
            self.phase = self.DONE
            raise Interrupted(signum)
        if self.phase == self.STARTING:
            self.pending.append(signum)
        elif self.phase == self.RUNNING and self.guard is not None:
            self.guard.forward(signum)

    def started(self, guard: Guard) -> None:
        self.guard = guard
        self.phase = self.RUNNING
        while self.pending:
            guard.forward(self.pending.pop(0))


def run(
    settings: Settings,
    *,
    key: str,
    command: Sequence[str],
    ttl: str | None,
    wait: str | None,
    kill_grace: str | None,
    conflict_exit_code: int | None,
    limit: int,
    quiet: bool = False,
    min_hold: str | None = None,
    verbose: bool = False,
    on_busy: str | None = None,
    lock_delay: str | None = None,
    election: Election | None = None,
    also: Sequence[str] = (),
) -> int:
    """``election``: run for `dlm elect` (elect.py): the value goes with the grant, the
    election is announced once the lock is held, and without CMD a placeholder that
    waits for a signal holds the lock. ``also``: more locks to hold with ``key`` under
    the same lease (`--lock` repeated), taken all or none in the one global order."""
    if election is not None and not command:
        command = election.placeholder()
    if not command:
        raise usage_error("no command given: dlm exec --lock KEY -- CMD [ARGS...]")
    if on_busy is not None:
        wait, quiet, verbose = on_busy_option(
            on_busy, wait=wait, quiet=quiet, verbose=verbose, conflict_exit_code=conflict_exit_code
        )
    ttl_ms = ttl_option(ttl)
    delay_ms = lock_delay_option(lock_delay)
    wait_s = wait_option(wait)
    grace_s = kill_grace_option(kill_grace, ttl_ms)
    hold_s = min_hold_option(min_hold)
    if hold_s is not None and wait_s is not None and wait_s >= hold_s:
        complain(
            f"warning: --wait {wait} is not shorter than --min-hold {min_hold}: a host that "
            "gets the lock after the hold ends runs CMD again in the same tick"
        )
    program = resolve_program(command[0])

    from dlm.cli.guard import Guard

    # First, while dlm has a single thread: only the forking thread lives on in a child.
    if settings.json:
        guard = _start_with_stdout_on_stderr(program, command, grace_s)
    else:
        guard = Guard.start(program, command, grace_s)
    session = _Session(settings, key=key, command=command, guard=guard, grace=grace_s, hold=hold_s)
    session.grace_text = kill_grace if ttl_ms is None else None
    session.keys = list(dict.fromkeys([key, *also]))
    session.lock_delay_ms = delay_ms
    session.election = election
    try:
        return session.run(
            ttl_ms=ttl_ms,
            wait_s=wait_s,
            limit=limit,
            conflict_code=(
                EXEC_CONFLICT_EXIT_CODE if conflict_exit_code is None else conflict_exit_code
            ),
            quiet_conflict=conflict_is_silent(
                quiet=quiet,
                verbose=verbose,
                conflict_exit_code=conflict_exit_code,
                min_hold=hold_s,
            ),
        )
    finally:
        # With CMD still running (an error in dlm), hanging up makes the guard stop it;
        # otherwise the guard is about to exit, and is reaped.
        guard.close(wait=session.cmd_gone or not session.cmd_started)


def _start_with_stdout_on_stderr(program: str, command: Sequence[str], grace: float) -> Guard:
    """Forks the guard with dlm's stderr as its stdout, so CMD writes there: under --json
    dlm's stdout carries the one JSON object and nothing of CMD's can mix with it.

    The guard (and CMD after it) inherit descriptors at the fork, so stdout is pointed
    at stderr for the fork only and then put back for dlm's own JSON.
    """
    import sys

    from dlm.cli.guard import Guard

    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to keep apart
        return Guard.start(program, command, grace)
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr: CMD keeps the one stdout there is
        os.close(saved)
        return Guard.start(program, command, grace)
    try:
        return Guard.start(program, command, grace)
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def conflict_is_silent(
    *, quiet: bool, verbose: bool, conflict_exit_code: int | None, min_hold: float | None
) -> bool:
    """Does a lock held by someone else go unsaid on stderr? (--json says it anyway.)

    Cron mails whatever a job prints, so a conflict that is the expected outcome
    of a cron line says nothing: with --min-hold every host but the first in a
    tick is meant to skip, and -q or --conflict-exit-code say the skip is
    expected. Elsewhere (an interactive run, a plain --wait) the line saying who
    holds the lock is what a person needs. -v brings the line back in every case.
    """
    if verbose:
        return False
    return quiet or conflict_exit_code is not None or min_hold is not None


def on_busy_option(
    text: str, *, wait: str | None, quiet: bool, verbose: bool, conflict_exit_code: int | None
) -> tuple[str | None, bool, bool]:
    """``--on-busy skip|wait=D|fail`` as the older flags say it: (--wait, -q, -v).

    skip: exit 75 (or --conflict-exit-code) saying nothing; wait=D: --wait D; fail: exit
    75 with the line saying who holds the lock. The older flags stay as aliases; a
    combination that says two different things is a usage error (exit 2).
    """
    mode, eq, value = text.partition("=")
    if mode == "skip" and not eq:
        if wait is not None:
            raise usage_error(f"--on-busy skip and --wait {wait} disagree: give one of them")
        if verbose:
            raise usage_error("--on-busy skip is quiet and -v is not: give one of them")
        return None, True, False
    if mode == "fail" and not eq:
        if wait is not None:
            raise usage_error(f"--on-busy fail and --wait {wait} disagree: give one of them")
        if quiet:
            raise usage_error(
                "--on-busy fail says who holds the lock and -q does not: give one of them"
            )
        return None, False, True
    if mode == "wait" and eq and value:
        duration_option("--on-busy wait", value)  # a bad duration is said as such
        if wait is not None and wait != value:
            raise usage_error(
                f"--on-busy wait={value} and --wait {wait} disagree: give one of them"
            )
        return value, quiet, verbose
    raise usage_error(f"bad --on-busy {text!r}: write skip, fail or wait=DURATION (e.g. wait=1m)")


def kill_grace_option(text: str | None, ttl_ms: int | None) -> float:
    """Seconds between SIGTERM and the deadline: min(5 s, TTL/4) unless given; given, it
    must stay under TTL/2, or the lease would be spent before a renewal could save it.

    ``ttl_ms`` None (no --ttl): the lease gets the cluster's default-ttl, known once it
    is open, and the grace is checked against it then (_Session.check_grace); the
    default is the one of a 30 s TTL, as the guard needs its grace when it starts."""
    from dlm.cli.exec_rules import default_grace, grace_problem
    from dlm.client.core import DEFAULT_OPEN_TTL_MS
    from dlm.durations import format_ms

    if text is None:
        return default_grace(DEFAULT_OPEN_TTL_MS if ttl_ms is None else ttl_ms)
    grace = duration_option("--kill-grace", text)
    if ttl_ms is None:
        return grace
    problem = grace_problem(grace, ttl_ms)
    if problem is not None:
        raise usage_error(
            f"--kill-grace {text} is too long for a {format_ms(ttl_ms)} --ttl: {problem} "
            f"({format_ms(ttl_ms / 2)}); leave it out for min(5s, TTL/4), or raise --ttl"
        )
    return grace


def min_hold_option(text: str | None) -> float | None:
    """Seconds of --min-hold (None: no hold). A hold of a day or more is refused: a
    lease can be given at most 24h, and a schedule whose period exceeds twice the hold
    runs less than daily, where cron's skew is no matter for a lock."""
    if text is None:
        return None
    hold = duration_option("--min-hold", text)
    if hold * 1000 >= HOLD_MAX_MS:
        raise usage_error(f"bad --min-hold: a minimum hold must be shorter than 24h (got {text})")
    return hold if hold > 0 else None


def resolve_program(name: str) -> str:
    """The executable CMD names, found now so a typo does not take (and drop) a lock."""
    found = name if os.sep in name else _which(name)
    if found is None or not os.path.exists(found):
        raise CliError(
            "NOT_FOUND",
            f"{name}: command not found (check PATH, or give its full path)",
            exits.NOT_FOUND,
        )
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise CliError("NOT_EXECUTABLE", f"{name}: permission denied", exits.NOT_EXECUTABLE)
    return found


def _which(name: str) -> str | None:
    # shutil.which, without importing shutil (and the compression modules it probes).
    for directory in os.get_exec_path():
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def child_env(grant: Grant, ttl_ms: int, tokens: dict[str, int] | None = None) -> dict[str, str]:
    """The variables CMD gets over the environment dlm was started with. Holding several
    locks (``tokens``: each key's token), DLM_LOCK_KEY and DLM_FENCING_TOKEN are the
    first --lock's, and DLM_FENCING_TOKENS is every key's token as a JSON object."""
    env = {
        "DLM_LOCK_KEY": grant.key,
        "DLM_FENCING_TOKEN": str(grant.token),
        "DLM_LEASE_ID": grant.lease,
        "DLM_LEASE_TTL_MS": str(ttl_ms),
    }
    if tokens is not None and len(tokens) > 1:
        import json

        env["DLM_FENCING_TOKENS"] = json.dumps(tokens, separators=(",", ":"))
    return env


def renewals_can_wait(settings: Settings, wait_s: float | None, ttl_ms: int) -> bool:
    """May the KeepAlive's threads start once CMD has started instead of before the
    acquire? Starting two threads costs a couple of milliseconds on the way to CMD.
    For an acquire that is one call: one key, in a cluster of one partition (more
    keys, or a part to open in another partition, are a call each, each with its
    own --timeout); the caller checks that.

    The first renewal is due a renewal interval (TTL/3) after the open, and the
    deadline watcher fires at the TTL. An acquire that does not queue (no --wait)
    ends within --timeout + --dial-timeout; while that is under half the TTL the
    threads could at most have renewed once during it, and the lease cannot have
    run out on the cluster. That one renewal is made up for: before the start when
    less than an interval is left (_confirm_before_start), else by the KeepAlive
    as soon as its threads start, the renewal being overdue. The guard's deadline
    moves only with confirmed renewals either way. A queued acquire, or one that
    may outlast half the TTL, has the threads running first.
    """
    if wait_s is not None:
        return False
    bound_ms = (settings.timeout + settings.dial_timeout) * 1000.0
    return bound_ms < ttl_ms / 2


def _on_lost(client: Client, wake_fd: int) -> None:
    """The lease is gone: wake the supervisor, and fail an acquire still waiting in the queue
    (the cluster drops a lost lease's queue place without telling the waiter)."""
    try:
        os.write(wake_fd, b"!")
    except OSError:
        pass
    client.close()


def run_end(code: int | None, *, started: bool) -> RunEnd:
    """How the run ended, for the cluster's run ledger: CMD's exit code (``finished``; a
    code above 128 that a signal explains is that signal), or ``lock_lost`` when the lock
    was granted but CMD could not start in time."""
    if not started or code is None:
        return ("lock_lost", None, None)
    if 128 < code <= 128 + 64:
        return ("finished", None, code - 128)
    return ("finished", code, None)


def _give_back(client: Client, lease: Lease, run: RunEnd | None = None) -> None:
    """Closes the lease, which releases its lock. Failure is a warning: the TTL ends it."""
    try:
        client.close_lease(lease, run=run)
    except Exception as exc:
        complain(
            f"could not release the lock ({exc}); it will expire with lease {lease.id} "
            f"within {lease.ttl_ms} ms"
        )


def _hold_until(held_ms: int | None) -> str | None:
    """When a hold handed to the cluster ends, by this host's clock (for --json)."""
    if not held_ms:
        return None
    return iso_local(int(time.time() * 1000) + held_ms, "milliseconds")


_TOO_LATE_TO_START = (
    "its lease's time ran out before the command could start (dlm was paused or starved "
    "after its last renewal)"
)


def _lost_error(reason: str | None, key: str, *, ran: bool) -> CliError:
    what = "stopped the command" if ran else "the command was not started"
    return CliError(
        "LOCK_LOST",
        f"lost the lock on {key!r}: {reason or 'lease lost'}; {what}. "
        "Check the cluster with `dlm status`",
        exits.LOST,
    )


class _Session:
    """One `dlm exec` run, from opening the lease to CMD's exit code."""

    def __init__(
        self,
        settings: Settings,
        *,
        key: str,
        command: Sequence[str],
        guard: Guard,
        grace: float,
        hold: float | None = None,
    ) -> None:
        self.settings = settings
        self.key = key
        self.command = command
        self.guard = guard
        self.grace = grace
        self.hold = hold
        self.grace_text: str | None = None
        """--kill-grace as given, when it is checked once the lease's TTL is known (no --ttl)."""
        self.gate = StartGate(grace)
        self.lock_delay_ms = 0
        self.keys = [key]
        """Every lock to hold (``key`` first), under the one lease."""
        self.tokens: dict[str, int] = {}
        self.election: Election | None = None
        self.cmd_started = False
        self.cmd_gone = False  # the guard saw CMD and every process it left end
        self.granted = False
        self.run_code: int | None = None
        """CMD's exit code, for the run ledger (None: it did not start or did not end)."""

    def check_grace(self, ttl_ms: int) -> None:
        """The lease got the cluster's default-ttl (no --ttl): the grace must stay under
        half of it, as kill_grace_option checks a --ttl given (a usage error, exit 2)."""
        from dlm.cli.exec_rules import grace_problem
        from dlm.durations import format_ms

        problem = grace_problem(self.grace, ttl_ms)
        if problem is None:
            return
        given = (
            f"--kill-grace {self.grace_text}"
            if self.grace_text
            else (f"the default --kill-grace ({format_ms(self.grace * 1000)})")
        )
        raise usage_error(
            f"{given} is too long for the cluster's default-ttl of {format_ms(ttl_ms)}: "
            f"{problem} ({format_ms(ttl_ms / 2)}); give a --ttl, or a shorter --kill-grace"
        )

    def run(
        self,
        *,
        ttl_ms: int | None,
        wait_s: float | None,
        limit: int,
        conflict_code: int,
        quiet_conflict: bool,
    ) -> int:
        from dlm.cli.exec_rules import term_time
        from dlm.client.clock import lease_clock
        from dlm.client.core import lease_deadline
        from dlm.client.errors import ClusterUnavailable, LeaseLost, LockHeld
        from dlm.client.sync import KeepAlive

        grace, guard = self.grace, self.guard
        signals = _Signals()
        signals.install()
        client = self.settings.connect(traced_as="dlm.exec")
        lease: Lease | None = None
        keeper: KeepAlive | None = None
        wake_r, wake_w = os.pipe()
        try:
            # Who holds it, for `dlm status KEY` (on the lock) and `dlm lease list` (on the lease).
            meta = owner_meta(pid=os.getpid(), command=self.command)
            if self.election is not None:
                meta.update(self.election.meta())
            lease = client.open_lease(
                ttl_ms, meta=meta, lock_delay_ms=self.lock_delay_ms, near=self.keys
            )
            if ttl_ms is None:
                self.check_grace(lease.ttl_ms)
            keeper = KeepAlive(
                client,
                lease,
                on_lost=lambda _reason: _on_lost(client, wake_w),
                # Renew until the moment CMD would get SIGTERM; tell the guard each new D.
                deadline_of=lambda sent, ttl: term_time(lease_deadline(sent, ttl), grace),
                on_renewed=lambda sent, ttl: guard.extend(lease_deadline(sent, ttl)),
            )
            one_call = len(self.keys) == 1 and client.partitions == 1
            if not (one_call and renewals_can_wait(self.settings, wait_s, lease.ttl_ms)):
                keeper.start()
            try:
                if len(self.keys) == 1:
                    grant = client.acquire(lease, self.key, wait=wait_s, limit=limit, meta=meta)
                    self.tokens = {grant.key: grant.token}
                else:
                    grants = client.acquire_all(
                        lease, self.keys, wait=wait_s, limit=limit, meta=meta
                    )
                    by_key = {g.key: g for g in grants}
                    grant = by_key[self.key]
                    self.tokens = {key: by_key[key].token for key in self.keys}
                # The reply is in, so the grant happened before this: a hold counted from
                # here cannot end early.
                granted_by = lease_clock()
            except LockHeld as exc:
                show = self.settings.json or not quiet_conflict
                error = conflict_error(
                    exc, exc.key or self.key, waited=wait_s, client=client if show else None,
                    next_step="; not running CMD",
                )  # fmt: skip
                error.exit_code = conflict_code
                error.reported = not show  # nothing on stderr, as cron would mail it
                raise error from None
            except ClusterUnavailable as exc:
                # A lease lost while queued closes the client under the waiting acquire.
                if exc.code == "CLOSED" and keeper.lost.wait(LOST_VERDICT_SECONDS):
                    raise _lost_error(keeper.reason, self.key, ran=False) from None
                raise
            self.granted = True
            if keeper.lost.is_set():
                raise _lost_error(keeper.reason, self.key, ran=False)
            self._confirm_before_start(client, keeper, lease)
            if self.election is not None:
                self.election.elected(grant, self.settings.json)
            code = self._supervise(grant, keeper, signals, wake_r)
            self.run_code = code
            if self.election is not None:
                return self.election.exit_code(code)
            held_ms = None
            if self.hold is not None:
                held_ms = self._hand_over_hold(client, keeper, lease, granted_by, self.hold)
                if held_ms is not None:
                    lease = None  # the cluster ends it when the hold is over
            if self.settings.json:
                emit_json(
                    {
                        "key": grant.key,
                        "token": grant.token,
                        "lease": grant.lease,
                        "ttl_ms": grant.ttl_ms,
                        "exit_code": code,
                        "hold_until": _hold_until(held_ms),
                        **({"tokens": self.tokens} if len(self.tokens) > 1 else {}),
                    }
                )
            return code
        except (ClusterUnavailable, LeaseLost):
            # Unreachable: closing would only wait out --timeout again, and the lease expires
            # by itself. Lost: there is nothing left to close.
            lease = None
            raise
        except CliError as exc:
            if exc.exit_code == exits.LOST and exc.code == "LOCK_LOST":
                lease = None  # nothing left to give back, and the cluster may be unreachable
            raise
        finally:
            signals.phase = signals.DONE
            if keeper is not None:
                # Renewals end before the lease is given back; the threads are joined
                # after it, so the release does not wait for them to wake and end.
                keeper.halt()
            # Never release while something of CMD may still run: the lease then lapses.
            if lease is not None and (self.cmd_gone or not self.cmd_started):
                started = self.cmd_started or self.run_code is not None
                report = run_end(self.run_code, started=started)
                _give_back(client, lease, report if self.granted else None)
            if keeper is not None:
                keeper.stop()
            client.close()
            signals.restore()
            os.close(wake_r)
            os.close(wake_w)

    def _hand_over_hold(
        self, client: Client, keeper: KeepAlive, lease: Lease, granted_by: float, hold: float
    ) -> int | None:
        """CMD has ended: has the cluster keep the lock for the rest of the minimum hold.

        Returns the milliseconds handed over, 0 when the cluster did not confirm them
        (the lease then runs out by itself: closing it would end the hold at once), or
        None when the hold is over already and the lease is to be closed as usual.
        """
        from dlm.client.clock import lease_clock
        from dlm.client.core import lease_deadline, min_hold_ttl_ms
        from dlm.client.errors import DlmError, LeaseLost
        from dlm.durations import format_ms

        keeper.stop()  # renewals from here on could only lengthen the hold
        now = lease_clock()
        hold_ms = min_hold_ttl_ms(granted_by, hold, now)
        if hold_ms <= 0:
            return None
        hold_end = now + hold_ms / 1000.0
        # Until when the last confirmed renewal keeps the lock taken whatever happens next.
        covered_until = lease_deadline(keeper.confirmed_at, keeper.ttl_ms)
        budget = self.settings.timeout
        if covered_until < hold_end:
            # Only a confirmed update can keep the hold whole: worth trying as long as
            # the lease lasts, but no longer.
            budget = max(budget, covered_until - now)
        try:
            run = run_end(self.run_code, started=True)
            client.update_lease(lease, hold_ms, finished=True, timeout=budget, run=run)
        except LeaseLost as exc:
            complain(f"could not keep {self.key!r} taken for the rest of --min-hold: {exc.message}")
            return 0
        except DlmError as exc:
            if covered_until >= hold_end:
                outcome = (
                    f"it stays taken until lease {lease.id} expires, at the latest "
                    f"{format_ms(keeper.ttl_ms)} after its last renewal, which covers the hold"
                )
            else:
                outcome = (
                    f"it may be free again up to {format_ms((hold_end - covered_until) * 1000)} "
                    "before the hold ends, when its lease expires (a --ttl of 1.6 times "
                    "--min-hold or more would cover the hold)"
                )
            complain(
                f"could not hand the rest of --min-hold on {self.key!r} to the cluster "
                f"({exc.message}); {outcome}"
            )
            return 0
        return hold_ms

    def _confirm_before_start(self, client: Client, keeper: KeepAlive, lease: Lease) -> None:
        """Renews first if CMD would have less than a renewal interval before its SIGTERM."""
        from dlm.cli.exec_rules import START, TOO_LATE
        from dlm.client.clock import lease_clock
        from dlm.client.core import lease_deadline
        from dlm.client.errors import ClusterUnavailable, LeaseLost

        interval = keeper.ttl_ms / 3000.0
        deadline = lease_deadline(keeper.confirmed_at, keeper.ttl_ms)
        stop_at = self.gate.stop_time(deadline)
        sent = lease_clock()
        step = self.gate.before_start(sent, deadline, interval)
        if step == START:
            return
        if step == TOO_LATE:
            raise _lost_error(keeper.reason or "its time ran out", self.key, ran=False)
        try:
            ttl = client.keepalive(lease, timeout=stop_at - sent)
        except LeaseLost as exc:
            raise _lost_error(exc.message, self.key, ran=False) from None
        except ClusterUnavailable as exc:
            if keeper.lost.is_set():
                raise _lost_error(keeper.reason, self.key, ran=False) from None
            raise ClusterUnavailable(
                f"could not renew the lease before starting the command ({exc.message}); "
                "the command was not started",
                exc.code,
            ) from None
        if not keeper.confirmed(sent, ttl):
            raise _lost_error(keeper.reason or "renewed too late", self.key, ran=False)

    def _supervise(self, grant: Grant, keeper: KeepAlive, signals: _Signals, wake_fd: int) -> int:
        """Has the guard run CMD under the lock; returns dlm's exit code."""
        from dlm.cli import guard as lifeline
        from dlm.client.clock import lease_clock
        from dlm.client.core import lease_deadline

        guard = self.guard
        signals.phase = signals.STARTING
        deadline = lease_deadline(keeper.confirmed_at, keeper.ttl_ms)
        # The last look before the order, without another round trip: dlm may have been
        # paused (SIGSTOP, swap, an overloaded host) since its renewal was confirmed.
        if not self.gate.may_order_spawn(lease_clock(), deadline):
            signals.phase = signals.DONE
            raise _lost_error(_TOO_LATE_TO_START, self.key, ran=False)
        guard.spawn(child_env(grant, keeper.ttl_ms, self.tokens), deadline)
        report = guard.next_report()
        if report is None or report[0] != lifeline.STARTED:
            signals.phase = signals.DONE
            if report is not None and report[0] == lifeline.NOT_STARTED:
                raise _lost_error(_TOO_LATE_TO_START, self.key, ran=False)
            if report is not None and report[0] == lifeline.SPAWN_FAILED:
                number = int(report[1])
                exit_code = exits.NOT_FOUND if number == errno.ENOENT else exits.NOT_EXECUTABLE
                message = f"{self.command[0]}: {os.strerror(number)}"
                self.run_code = exit_code  # the ledger records it as CMD's exit code
                raise CliError("EXEC_FAILED", message, exit_code)
            raise CliError("INTERNAL", "dlm's guard process ended before starting CMD", 1)
        self.cmd_started = True
        cmd_pid = int(report[1])
        signals.started(guard)
        # Renewals left until now (renewals_can_wait) start half a renewal interval after
        # the last confirmation, if CMD still runs then: the first renewal is due an
        # interval after it, and a short CMD (most cron jobs) needs no thread at all.
        # After cmd_started: should a thread fail to start, the lease is left to lapse,
        # not closed under a CMD the guard is still stopping.
        renewals_from: float | None = None
        if not keeper.running:
            renewals_from = keeper.confirmed_at + keeper.ttl_ms / 6000.0

        lost: str | None = None
        code: int | None = None
        give_up_at: float | None = None
        while code is None:
            timeout = None if give_up_at is None else max(0.0, give_up_at - lease_clock())
            if renewals_from is not None:
                until = max(0.0, renewals_from - lease_clock())
                timeout = until if timeout is None else min(timeout, until)
            if guard.pending:
                timeout = 0.0
            ready, _, _ = select.select([guard.reports, wake_fd], [], [], timeout)
            if renewals_from is not None and lease_clock() >= renewals_from:
                renewals_from = None
                keeper.start()
            if wake_fd in ready:
                os.read(wake_fd, 64)
            if lost is None and keeper.lost.is_set():
                lost = keeper.reason or "lease lost"
                guard.stop_now()
            for kind, arg in guard.read():
                if kind == lifeline.DEADLINE and lost is None:
                    lost = (
                        f"lease {grant.lease} was not renewed in time "
                        f"(last confirmed {lease_clock() - keeper.confirmed_at:.1f}s ago)"
                    )
                elif kind == lifeline.LEFTOVERS:
                    complain(
                        f"{self.command[0]} ended but left processes running; stopping them "
                        "before the lock is released"
                    )
                elif kind == lifeline.DONE:
                    code = int(arg)
            if code is None and guard.eof:
                signals.phase = signals.DONE
                self._guard_died(cmd_pid)
            if lost is not None and give_up_at is None:
                give_up_at = max(lease_clock(), guard.deadline) + SETTLE_SECONDS
            if code is None and give_up_at is not None and lease_clock() >= give_up_at:
                complain(
                    f"a process of {self.command[0]} survived SIGKILL (uninterruptible "
                    f"sleep?); dlm's guard (pid {guard.pid}) keeps killing it"
                )
                break
        signals.phase = signals.DONE
        self.cmd_gone = code is not None
        if lost is not None:
            raise _lost_error(lost, grant.key, ran=True)
        assert code is not None
        return code

    def _guard_died(self, cmd_pid: int) -> None:
        """Without its guard CMD has no lifeline: kill its group and give up the lock."""
        try:
            os.killpg(cmd_pid, signal.SIGKILL)
        except OSError:
            pass
        raise CliError(
            "LOCK_LOST",
            f"dlm's guard process (pid {self.guard.pid}) died, so nothing could stop "
            f"{self.command[0]} in time any more; killed its process group and left the lock "
            f"on {self.key!r} to expire",
            exits.LOST,
        )
