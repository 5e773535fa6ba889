"""`dlm exec`: run a command only while a lock is held, and never after it is lost.

Theory of operation
-------------------
1. Open a fresh lease (``--ttl``) and start renewing it at once (KeepAlive,
   every TTL/3 from its own connection), so a long ``--wait`` in the queue
   cannot outlive it.
2. Acquire the lock (``--wait`` queues FIFO). Not obtained: close the lease,
   exit 75 or ``--conflict-exit-code``; CMD never starts.
3. Start CMD with no shell, in a new session (so its own process group, and
   no terminal job control can stop it), with only fds 0-2 and the DLM_*
   variables set over the inherited environment.
4. Wait for whichever comes first:
   - CMD ends: stop whatever it left running in its group (SIGTERM, then
     SIGKILL after ``--kill-grace``), close the lease (which releases the
     lock) and exit with CMD's code, or 128+N if signal N killed it;
   - a signal to dlm (INT, TERM, HUP, QUIT): forward it to CMD's group and
     keep waiting, so CMD decides how to end and the lock is released after;
   - the lease cannot be confirmed before its client-side deadline (counted
     from when the last confirmed renewal was *sent*, so it passes before the
     server's): SIGTERM the group, SIGKILL it after ``--kill-grace``, exit 77.
     A lease lost while still queued (``--wait``) ends the wait at once: 77.

Waiting uses a pidfd (Linux >= 5.3) and a self-pipe the KeepAlive writes to
on loss, in one ``select``; where pidfds are missing it polls every 20 ms.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time
from collections.abc import Sequence

from dlm.cli import exits
from dlm.cli.exits import CliError, Interrupted, usage_error
from dlm.cli.ops import duration_option, owner_meta, ttl_option, wait_option
from dlm.cli.output import complain, emit_json
from dlm.cli.settings import Settings

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

    from dlm.client.core import Grant, Lease
    from dlm.client.sync import Client, KeepAlive

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
POLL_SECONDS = 0.02
KILL_SETTLE_SECONDS = 1.0
LOST_VERDICT_SECONDS = 2.0
"""How long to wait for the KeepAlive's verdict after it closed the client under us."""


class _Signals:
    """One handler for dlm's whole run, whose meaning follows the phase.

    Before CMD starts, a signal abandons the attempt (Interrupted; the cleanup
    gives back whatever was obtained). While CMD is being started it is held
    back, then forwarded; while CMD runs it is forwarded to CMD's group; once
    CMD has ended it is ignored, so the lock is still released.
    """

    BEFORE, STARTING, RUNNING, DONE = range(4)

    def __init__(self) -> None:
        self.phase = self.BEFORE
        self.child: _Child | None = None
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
        elif self.phase == self.RUNNING and self.child is not None:
            self.child.signal_group(signum)

    def started(self, child: _Child) -> None:
        self.child = child
        self.phase = self.RUNNING
        while self.pending:
            child.signal_group(self.pending.pop(0))


def run(
    settings: Settings,
    *,
    key: str,
    command: Sequence[str],
    ttl: str,
    wait: str | None,
    kill_grace: str,
    conflict_exit_code: int,
    limit: int,
) -> int:
    if not command:
        raise usage_error("no command given: dlm exec --lock KEY -- CMD [ARGS...]")
    ttl_ms = ttl_option(ttl)
    wait_s = wait_option(wait)
    grace_s = duration_option("--kill-grace", kill_grace)
    program = resolve_program(command[0])

    from dlm.client.errors import ClusterUnavailable, LeaseLost, LockHeld
    from dlm.client.sync import KeepAlive

    signals = _Signals()
    signals.install()
    client = settings.connect()
    lease: Lease | None = None
    keeper: KeepAlive | None = None
    wake_r, wake_w = os.pipe()
    try:
        lease = client.open_lease(ttl_ms)
        keeper = KeepAlive(client, lease, on_lost=lambda _reason: _on_lost(client, wake_w))
        keeper.start()
        meta = owner_meta(pid=os.getpid(), command=command)
        try:
            grant = client.acquire(lease, key, wait=wait_s, limit=limit, meta=meta)
        except LockHeld as exc:
            error = exits.from_client_error(exc)
            error.exit_code = conflict_exit_code
            raise error from None
        except ClusterUnavailable as exc:
            # A lease lost while queued closes the client under the waiting acquire.
            if exc.code == "CLOSED" and keeper.lost.wait(LOST_VERDICT_SECONDS):
                raise _lost_error(keeper, key, ran=False) from None
            raise
        if keeper.lost.is_set():
            raise _lost_error(keeper, key, ran=False)
        code = _supervise(
            program=program,
            command=command,
            grant=grant,
            keeper=keeper,
            signals=signals,
            wake_fd=wake_r,
            grace_s=grace_s,
        )
        if settings.json:
            emit_json(
                {
                    "key": grant.key,
                    "token": grant.token,
                    "lease": grant.lease,
                    "ttl_ms": lease.ttl_ms,
                    "exit_code": code,
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
            keeper.stop()
        if lease is not None:
            _give_back(client, lease)
        client.close()
        signals.restore()
        os.close(wake_r)
        os.close(wake_w)


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


def child_env(grant: Grant, ttl_ms: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DLM_LOCK_KEY=grant.key,
        DLM_FENCING_TOKEN=str(grant.token),
        DLM_LEASE_ID=grant.lease,
        DLM_LEASE_TTL_MS=str(ttl_ms),
    )
    return env


def exit_code_of(returncode: int) -> int:
    """A shell's view of how the child ended: its code, or 128+N after signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _on_lost(client: Client, wake_fd: int) -> None:
    """The lease is gone: wake the supervisor, and fail an acquire still waiting in the queue
    (the cluster drops a lost lease's queue place without telling the waiter)."""
    _poke(wake_fd)
    client.close()


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"!")
    except OSError:
        pass


def _give_back(client: Client, lease: Lease) -> None:
    """Closes the lease, which releases its lock. Failure is a warning: the TTL ends it."""
    try:
        client.close_lease(lease)
    except Exception as exc:
        complain(
            f"could not release the lock ({exc}); it will expire with lease {lease.id} "
            f"within {lease.ttl_ms} ms"
        )


def _lost_error(keeper: KeepAlive, key: str, *, ran: bool) -> CliError:
    what = "stopped the command" if ran else "the command was not started"
    return CliError(
        "LOCK_LOST",
        f"lost the lock on {key!r}: {keeper.reason or 'lease lost'}; {what}. "
        "Check the cluster with `dlm status`",
        exits.LOST,
    )


def spawn(program: str, argv: Sequence[str], env: dict[str, str]) -> int:
    """Starts CMD as subprocess.Popen(start_new_session=True, close_fds=True) would, and
    returns its pid; OSError if it cannot be executed.

    Why not subprocess: importing it (with locale and re) costs ~4 ms of every
    `dlm exec`. posix_spawn does the same here: a new session, SIGPIPE and
    SIGXFSZ back to their defaults (Python ignores them), and no descriptor
    inherited beyond 0-2 (dlm's own are close-on-exec already; any inheritable
    one dlm was given is made close-on-exec first).
    """
    _no_inheritable_fds()
    defaults = [getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
                if hasattr(signal, name)]  # fmt: skip
    try:
        return os.posix_spawn(program, list(argv), env, setsid=True, setsigdef=defaults)
    except (AttributeError, NotImplementedError):  # pragma: no cover - no posix_spawn setsid
        import subprocess

        proc = subprocess.Popen(argv, executable=program, env=env, start_new_session=True)
        return proc.pid


def _no_inheritable_fds() -> None:
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(where)
        except OSError:
            continue
        for name in names:
            fd = int(name)
            if fd > 2:
                try:
                    if os.get_inheritable(fd):
                        os.set_inheritable(fd, False)
                except OSError:  # the listing's own descriptor, closed by now
                    pass
        return


class _Child:
    """The running CMD and the means to wait for it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None  # as Popen's: -N when signal N ended it
        self.pidfd: int | None = None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                self.pidfd = pidfd_open(pid)
            except OSError:
                self.pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # pragma: no cover - reaped behind our back
            self.returncode = 255
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError:
            # The group leader is gone and its pgid may be reused elsewhere: try the pid
            # only, and only while it is still ours (not yet reaped).
            if self.poll() is None:
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    pass

    def group_alive(self) -> bool:
        """Whether any process is left in CMD's process group (its leader included)."""
        self.poll()
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop_group(self, grace_s: float) -> None:
        """SIGTERM the whole group, SIGKILL whatever is left after the grace, reap the leader.

        Members other than the leader are not our children, so nothing signals their
        end: the group is polled. SIGKILL goes out even when the group looks empty, in
        case a member was just being created.
        """
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.group_alive() and time.monotonic() < deadline:
            self.wait_until(min(deadline, time.monotonic() + POLL_SECONDS), None)
        self.signal_group(signal.SIGKILL)
        self.wait()
        # SIGKILL lands when the kernel next schedules each member: give it a moment, so
        # that when dlm reports the lock gone, nothing of CMD is still running.
        settle = time.monotonic() + KILL_SETTLE_SECONDS
        while self.group_alive() and time.monotonic() < settle:
            self.wait_until(min(settle, time.monotonic() + POLL_SECONDS), None)

    def wait_until(self, deadline: float | None, wake_fd: int | None) -> bool:
        """Waits for CMD to end, the wake fd to fire, or the deadline; True once CMD ended."""
        while True:
            if self.poll() is not None:
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            left = None if deadline is None else deadline - now
            fds = [fd for fd in (self.pidfd, wake_fd) if fd is not None]
            timeout = left if self.pidfd is not None else min(left or POLL_SECONDS, POLL_SECONDS)
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
            if wake_fd is not None and wake_fd in ready:
                return self.poll() is not None

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _supervise(
    *,
    program: str,
    command: Sequence[str],
    grant: Grant,
    keeper: KeepAlive,
    signals: _Signals,
    wake_fd: int,
    grace_s: float,
) -> int:
    """Runs CMD under the lock; returns dlm's exit code."""
    signals.phase = signals.STARTING
    try:
        pid = spawn(program, command, child_env(grant, keeper.ttl_ms))
    except OSError as exc:
        signals.phase = signals.DONE
        code = exits.NOT_FOUND if exc.errno == errno.ENOENT else exits.NOT_EXECUTABLE
        raise CliError("EXEC_FAILED", f"{command[0]}: {exc.strerror}", code) from None
    child = _Child(pid)
    signals.started(child)
    try:
        while not child.wait_until(None, wake_fd):
            if keeper.lost.is_set():
                child.stop_group(grace_s)
                signals.phase = signals.DONE
                # Whatever the child did, the lock was lost while it ran.
                raise _lost_error(keeper, grant.key, ran=True)
        signals.phase = signals.DONE
        code = exit_code_of(child.wait())
        if child.group_alive():
            # Left running, CMD's background processes would outlive the lock.
            complain(
                f"{command[0]} ended but left processes in its group; stopping them "
                "before the lock is released"
            )
            child.stop_group(grace_s)
        return code
    finally:
        child.close()
