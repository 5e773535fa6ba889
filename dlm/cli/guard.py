"""The lifeline of `dlm exec`: a small process that stops CMD by the lease deadline on its own.

Why a separate process
----------------------
dlm exec (the *supervisor*) renews the lease, but it can be SIGKILLed (the OOM
killer), SIGSTOPped (a debugger) or starved, and a CMD that outlived its lease
would then run on while the cluster grants the lock to someone else. So the
supervisor forks this guard before it starts any thread, and tells it, through
a pipe, each new deadline D after every confirmed renewal. From then on the
guard needs nothing from the supervisor to keep the promise:

- it spawns CMD (a new session, only fds 0-2 inherited) and is its parent and
  its child subreaper, so every descendant of CMD, a ``setsid`` daemon whose
  parent exited included, is the guard's child or beneath one;
- it starts CMD only if the clock, read right before the spawn, is before
  CMD's SIGTERM time (the supervisor checked too, but may have been paused
  since), and SIGKILLs at once a CMD whose spawn returned past that time (the
  guard itself paused in between); a CMD not started is reported, and dlm
  exits 77 (the lock may be someone else's by then);
- it SIGTERMs CMD's group and every descendant at D - grace and SIGKILLs them
  at D - KILL_LEAD_S, unless a later D arrived before the SIGTERM went out (one
  that arrives after it changes nothing);
- when the control pipe reaches end-of-file (the supervisor died), or the
  supervisor asks, it stops them at once: SIGTERM, SIGKILL after the grace,
  and never later than D - KILL_LEAD_S;
- when CMD ends but left processes behind, it stops those the same way;
- it reports CMD's exit status (128+N after signal N) and exits once it has no
  child left.

D is an instant of ``dlm.client.clock.lease_clock`` (CLOCK_BOOTTIME on Linux),
the clock of every process of a host, which runs on while the host is
suspended; select's timeouts do not, so while CMD runs the guard reads the
clock at least every RECHECK_S (100 ms), and a deadline that passed during a
suspend stops CMD within that long of the resume. The guard ignores the
signals a terminal or a service manager sends (dlm forwards those to CMD),
sits in its own process group, lowers its OOM score where it may, has no
threads, and imports only the standard library and dlm's pure rules. What it
cannot survive is what freezes it too: a frozen host or container (cgroup
freezer, suspend: CMD is frozen with it, and runs up to RECHECK_S after the
resume) or its own SIGKILL; against those only the fencing token protects the
data.

Its decisions (spawn or not, which signal when) are ``exec_rules.GuardRules``,
pure, so the whole-node simulator drives them too; the timing rules are
documented there. The margin (why D is a little before ``sent + TTL``) is
the client library's rule, ``dlm.client.core.lease_deadline``, so every
holder counts alike.
"""

from __future__ import annotations

import errno
import os
import select
import signal

from dlm.cli.exec_rules import RECHECK_S, GuardRules
from dlm.client.clock import lease_clock

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

IDLE_WAKE_S = RECHECK_S
"""Longest sleep of the guard's loop once CMD runs: a lost wake-up could never stall it
for longer, and a deadline that passed while the host was suspended is seen this soon."""

# Python ignores these itself; CMD gets them back at their defaults, as from subprocess.
PYTHON_IGNORES = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)
)
# Signals a terminal, a shell or a service manager may send the whole family; the
# guard outlives them (dlm forwards them to CMD). CMD gets back whatever dlm was
# started with: an ignored signal (nohup, `&` in sh) stays ignored, the rest default.
GUARD_IGNORES = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGTTIN", "SIGTTOU", "SIGTSTP",
                 "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
) + PYTHON_IGNORES  # fmt: skip
_SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
_PR_SET_CHILD_SUBREAPER = 36
_EXIT_GUARD_FAILED = 70


# ---------------------------------------------------------------------------
# Timing rules (pure)
# ---------------------------------------------------------------------------


def exit_code_of(returncode: int) -> int:
    """A shell's view of how a process ended: its code, or 128+N after signal N."""
    return 128 - returncode if returncode < 0 else returncode


# ---------------------------------------------------------------------------
# The supervisor's side
# ---------------------------------------------------------------------------

STARTED, SPAWN_FAILED, NOT_STARTED, DEADLINE, LEFTOVERS, DONE = "p", "e", "n", "t", "l", "r"
"""Reports from the guard: CMD's pid; spawn errno; CMD not started, its SIGTERM time had
passed when the order came (the lock may be lost); the deadline passed unrenewed (the
lock is lost); CMD ended but left processes (being stopped); everything is gone, CMD's
exit code."""


class Guard:
    """The supervisor's handle on its guard: what it tells it, and what it hears back.

    Every message is one short line written with one ``write`` (under PIPE_BUF, so
    messages from the KeepAlive thread and the main thread never interleave), on a
    non-blocking pipe: a guard that stopped reading cannot block dlm.
    """

    def __init__(self, pid: int, control: int, reports: int) -> None:
        self.pid = pid
        self.control = control
        self.reports = reports
        self.deadline = 0.0
        self.eof = False
        self._buffer = b""
        self._pending: list[tuple[str, str]] = []
        self._unfreeze = False

    @classmethod
    def start(cls, program: str, argv: Sequence[str], grace: float) -> Guard:
        """Forks the guard. Call it before any thread exists: only the calling thread
        lives on in the child."""
        import gc

        control_r, control_w = os.pipe()
        reports_r, reports_w = os.pipe()
        # After a fork, every page either process writes is copied, and a collection
        # writes to every object it visits: with what exists now out of the collector's
        # reach, a run costs ~4 ms less CPU. close() gives it back (unless someone else
        # had frozen objects too, which is theirs to undo).
        unfreeze = gc.get_freeze_count() == 0
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the guard; its behaviour is tested from outside
            gc.disable()  # the guard makes no garbage worth a collection
            code = _EXIT_GUARD_FAILED
            try:
                os.close(control_w)
                os.close(reports_r)
                code = _Keeper(control_r, reports_w, program, list(argv), grace).serve()
            finally:
                os._exit(code)
        os.close(control_r)
        os.close(reports_w)
        try:
            os.setpgid(pid, pid)  # the child does it too; whoever is first wins the race
        except OSError:
            pass
        os.set_blocking(control_w, False)
        os.set_blocking(reports_r, False)
        guard = cls(pid, control_w, reports_r)
        guard._unfreeze = unfreeze
        return guard

    def _send(self, line: str) -> bool:
        if self.control < 0:
            return False
        try:
            os.write(self.control, line.encode("ascii"))
        except (BlockingIOError, BrokenPipeError, OSError):
            return False
        return True

    def extend(self, deadline: float) -> None:
        """A renewal was confirmed: D moves to ``deadline`` (called from any thread)."""
        self.deadline = max(self.deadline, deadline)
        self._send(f"d {deadline!r}\n")

    def spawn(self, env: dict[str, str], deadline: float) -> None:
        """Starts CMD with these variables set over the environment, under ``deadline``."""
        self.deadline = max(self.deadline, deadline)
        fields = " ".join(f"{k.encode().hex()}={v.encode().hex()}" for k, v in env.items())
        self._send(f"s {deadline!r} {fields}\n")

    def forward(self, signum: int) -> None:
        """Passes a signal dlm received on to CMD's process group."""
        self._send(f"k {int(signum)}\n")

    def stop_now(self) -> None:
        """The lease is gone: stop CMD at once (SIGTERM, SIGKILL after the grace)."""
        self._send("x\n")

    @property
    def pending(self) -> bool:
        """Reports already read from the pipe and not yet taken."""
        return bool(self._pending)

    def read(self) -> list[tuple[str, str]]:
        """Every report that has arrived (never blocks); sets ``eof`` at the guard's end."""
        self._fill()
        out, self._pending = self._pending, []
        return out

    def next_report(self) -> tuple[str, str] | None:
        """Blocks for the next report; None if the guard is gone."""
        while not self._pending and not self.eof:
            select.select([self.reports], [], [])
            self._fill()
        return self._pending.pop(0) if self._pending else None

    def _fill(self) -> None:
        if self.eof:
            return
        try:
            data = os.read(self.reports, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return
        self._buffer += data
        lines = self._buffer.split(b"\n")
        self._buffer = lines.pop()
        for line in lines:
            kind, _, arg = line.decode("ascii", "replace").partition(" ")
            self._pending.append((kind, arg))

    def close(self, *, wait: bool) -> None:
        """Hangs up (a guard with CMD still running stops it at once) and reaps the guard
        if it is done (``wait``: it is about to be)."""
        control, reports, self.control, self.reports = self.control, self.reports, -1, -1
        for fd in (control, reports):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            pass
        if self._unfreeze:
            import gc

            self._unfreeze = False
            gc.unfreeze()


# ---------------------------------------------------------------------------
# The guard's side (runs in the forked process only)
# ---------------------------------------------------------------------------


def spawn(
    program: str,
    argv: Sequence[str],
    env: dict[str, str],
    defaults: Sequence[int] = PYTHON_IGNORES,
) -> int:
    """Starts CMD as subprocess.Popen(start_new_session=True, close_fds=True) would, and
    returns its pid; OSError if it cannot be executed.

    Why not subprocess: importing it (with locale and re) costs ~4 ms of every
    `dlm exec`. posix_spawn does the same here: a new session, ``defaults`` (the
    signals the guard ignores but dlm's parent did not, and SIGPIPE, SIGXFSZ,
    which Python ignores) back at their default action, and no descriptor
    inherited beyond 0-2 (ours are close-on-exec already; any inheritable one
    dlm was given is made close-on-exec first).
    """
    _no_inheritable_fds()
    try:
        return os.posix_spawn(program, list(argv), env, setsid=True, setsigdef=defaults)
    except (AttributeError, NotImplementedError):  # pragma: no cover - no posix_spawn setsid
        import subprocess

        def restore() -> None:
            for s in defaults:
                signal.signal(s, signal.SIG_DFL)

        # preexec_fn is safe here: the guard has no threads.
        proc = subprocess.Popen(
            argv,
            executable=program,
            env=env,
            start_new_session=True,
            preexec_fn=restore,  # noqa: PLW1509
        )
        return proc.pid


_spawn_seam = spawn
"""What the guard calls to start CMD: a test replaces it (before the fork) to stand for
a guard paused between its last look at the clock and the spawn."""


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


def descendants(root: int) -> list[tuple[int, int]]:
    """(pid, process group) of every process below ``root``.

    Walks the tree through /proc/PID/task/TID/children where the kernel has
    them, else reads every process's parent from one pass over /proc. A
    process that forks meanwhile may be missed; the guard's SIGKILL pass
    repeats until it has no child left, so a late one is found on the next.
    """
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return _descendants_by_scan(root)
    found: list[tuple[int, int]] = []
    seen = {root}
    todo = [root]
    while todo:
        for child in _children(todo.pop()):
            group = None if child in seen else _group_of(child)
            if group is None:  # seen already, or gone
                continue
            seen.add(child)
            found.append((child, group))
            todo.append(child)
    return found


def _children(pid: int) -> list[int]:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in threads:
        data = _read(f"/proc/{pid}/task/{tid}/children")
        if data is not None:
            out.extend(int(child) for child in data.split())
    return out


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _parent_and_group(stat: bytes) -> tuple[int, int]:
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[1]), int(fields[2])


def _group_of(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    try:
        return None if stat is None else _parent_and_group(stat)[1]
    except (ValueError, IndexError):
        return None


def _descendants_by_scan(root: int) -> list[tuple[int, int]]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    children: dict[int, list[tuple[int, int]]] = {}
    for name in names:
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat")
        try:
            parent, group = _parent_and_group(stat) if stat is not None else (-1, -1)
        except (ValueError, IndexError):
            continue
        children.setdefault(parent, []).append((int(name), group))
    found: list[tuple[int, int]] = []
    seen = {root}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child[0] not in seen:
                seen.add(child[0])
                found.append(child)
                todo.append(child[0])
    return found


def _noop(_signum: int, _frame: FrameType | None) -> None:
    """SIGCHLD needs a handler (not SIG_IGN, which would auto-reap) to reach the wake-up fd."""


def _become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER); False where there is no such call (not Linux:
    orphans then go to init) or it failed.

    Through _ctypes, the C module under the ctypes package: one call of one libc
    function needs none of the package's Python (its types, struct layouts and
    loaders), whose import cost the guard ~2 ms of CPU on every `dlm exec`.
    """
    try:
        import _ctypes

        class _CInt(_ctypes._SimpleCData):  # type: ignore[type-arg]
            _type_ = "i"

        class _CFunction(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _CInt

        libc = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # this process
        prctl = _CFunction(_ctypes.dlsym(libc, "prctl"))
    except (ImportError, OSError, AttributeError, TypeError):
        return False
    result: int = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return result == 0


def _lower_oom_score() -> None:
    """Asks the OOM killer to pick the guard last; only root may, so EPERM is expected."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, b"-1000")
    except OSError:
        pass
    finally:
        os.close(fd)


class _Keeper:
    """The guard's state and loop (runs in the forked process)."""

    def __init__(
        self, control: int, reports: int, program: str, argv: list[str], grace: float
    ) -> None:
        self.control = control
        self.reports = reports
        self.program = program
        self.argv = argv
        self.rules = GuardRules(grace)
        self.leader: int | None = None  # CMD's pid, which is also its process group
        self.leader_code: int | None = None  # set once CMD is reaped
        self.hung_up = False
        self.defaults: list[int] = []  # signals CMD gets back at their default action
        self._buffer = b""

    def serve(self) -> int:
        self._detach()
        try:
            if not self._spawn_when_asked():
                return 0
            self._watch()
        finally:
            if self.leader is not None and self._reap():
                self._signal_all(signal.SIGKILL)  # leaving by a bug: take nothing along
        return 0

    def _detach(self) -> None:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        for s in GUARD_IGNORES:
            if signal.getsignal(s) != signal.SIG_IGN or s in PYTHON_IGNORES:
                self.defaults.append(s)
            signal.signal(s, signal.SIG_IGN)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        os.set_blocking(self.reports, False)
        signal.signal(signal.SIGCHLD, _noop)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        _become_subreaper()

    def _report(self, kind: str, arg: object = "") -> None:
        try:
            os.write(self.reports, f"{kind} {arg}\n".encode("ascii"))
        except OSError:  # the supervisor is gone or not reading: carry on regardless
            pass

    def _lines(self) -> list[str]:
        """Whole control lines available now; sets ``hung_up`` at end-of-file."""
        try:
            data = os.read(self.control, 4096)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            self.hung_up = True
            return []
        self._buffer += data
        lines = self._buffer.split(b"\n")
        self._buffer = lines.pop()
        return [line.decode("ascii", "replace") for line in lines]

    def _spawn_when_asked(self) -> bool:
        """Waits for the spawn order; False if the supervisor hung up first."""
        while not self.hung_up:
            select.select([self.control], [], [])
            lines = self._lines()
            for i, line in enumerate(lines):
                kind, _, arg = line.partition(" ")
                if kind == "d":
                    self.rules.offer(float(arg))
                elif kind == "s":
                    if not self._spawn(arg):
                        return False
                    self._obey(lines[i + 1 :])
                    return True
        return False

    def _spawn(self, arg: str) -> bool:
        deadline, *pairs = arg.split()
        env = dict(os.environ)
        for pair in pairs:
            name, _, value = pair.partition("=")
            env[bytes.fromhex(name).decode()] = bytes.fromhex(value).decode()
        # The last look at the clock before CMD exists: the supervisor checked too, but
        # it may have been paused (SIGSTOP, swap) between its check and its order.
        if not self.rules.may_spawn(lease_clock(), float(deadline)):
            self._report(NOT_STARTED)
            return False
        try:
            self.leader = _spawn_seam(self.program, self.argv, env, self.defaults)
        except OSError as exc:
            self._report(SPAWN_FAILED, exc.errno or errno.ENOEXEC)
            return False
        except ValueError:  # an argument or variable with a NUL byte in it
            self._report(SPAWN_FAILED, errno.EINVAL)
            return False
        # Paused between that look and the spawn? Then CMD started past its SIGTERM time:
        # the first pass of the watch SIGKILLs it, before anything else.
        self.rules.spawned(lease_clock())
        # After the spawn, so that CMD keeps the score it would have had without us.
        _lower_oom_score()
        self._report(STARTED, self.leader)
        return True

    def _watch(self) -> None:
        while True:
            children_left = self._reap()
            if self.leader_code is not None:
                if not children_left:
                    self._report(DONE, self.leader_code)
                    return
                if self.rules.stop_at is None:
                    self.rules.stop(lease_clock())
                    self._report(LEFTOVERS)
            now = lease_clock()
            if self.rules.deadline_passed(now):
                self._report(DEADLINE)
            due, wake_at = self.rules.next_signal(now)
            if due is not None:
                self._signal_all(_SIGNALS[due])
            # Never longer than IDLE_WAKE_S: select's timeout stops in a suspend, D does not.
            timeout = min(IDLE_WAKE_S, max(0.0, wake_at - lease_clock()))
            watched = [self.wake_r] if self.hung_up else [self.wake_r, self.control]
            ready, _, _ = select.select(watched, [], [], timeout)
            if self.wake_r in ready:
                self._drain_wake()
            if self.control in ready:
                self._obey(self._lines())

    def _obey(self, lines: list[str]) -> None:
        for line in lines:
            kind, _, arg = line.partition(" ")
            if kind == "d":
                self.rules.offer(float(arg))
            elif kind == "k":
                self._forward(int(arg))
            elif kind == "x":
                self.rules.stop(lease_clock())
        if self.hung_up:
            self.rules.stop(lease_clock())  # the supervisor died: nobody renews any more

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except OSError:
            pass

    def _reap(self) -> bool:
        """Reaps every child that has ended; whether any child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.leader:
                self.leader_code = exit_code_of(os.waitstatus_to_exitcode(status))

    def _forward(self, signum: int) -> None:
        # Only while CMD is unreaped: until then its pid, hence its group id, cannot be reused.
        if self.leader is not None and self.leader_code is None:
            try:
                os.killpg(self.leader, signum)
            except OSError:
                pass

    def _signal_all(self, signum: int) -> None:
        """Signals CMD's group and every descendant of the guard, each once."""
        group = self.leader if self.leader_code is None else None
        if group is not None:
            try:
                os.killpg(group, signum)
            except OSError:
                pass
        for pid, pgrp in descendants(os.getpid()):
            if pgrp != group:
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass
