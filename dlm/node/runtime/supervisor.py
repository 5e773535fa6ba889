"""The supervisor of a member with more than one partition: one listener, P children.

`dlm node start --partitions P` with P > 1 runs this instead of a node. It owns
the member's one listening address and starts one child process per
partition, each an ordinary member runtime (server.py) for that partition's
Raft group, with data directory ``DATA/p<i>`` (main.py's ``child_main``).
It decides nothing about Raft or locks; it only moves connections and
watches processes:

* **accepting**: each accepted connection is held until its first byte
  arrives (``PREAMBLE_TIMEOUT_S``; at most ``MAX_PENDING`` connections wait
  at once: one more closes the oldest). A first byte other than the
  preamble's (a hello frame, a TLS handshake) means partition 0 and is left
  unread (MSG_PEEK); a first byte of the preamble is followed by reading the
  rest of it (``PREAMBLE_SIZE`` bytes in all, consumed), and a connection
  whose preamble is malformed or names no partition of this member is closed.
  The socket then goes to the child over its channel (seat.py) in
  SCM_RIGHTS, and the supervisor closes its own copy.
* **children**: started as ``sys.executable -c BOOT ROOT MODULE ...`` where
  ROOT is the directory the ``dlm`` package was imported from, so the same
  code runs in the child whether dlm was installed or runs from a zipapp. A
  child that dies is started again as dlm/node/supervision.py's
  ``RestartPolicy`` says (backoff; a child that keeps failing to start stops
  the member with one line and exit 1).
* **stopping**: on SIGTERM or SIGINT the listener closes and each child gets
  SIGTERM by PID; one still running after ``STOP_GRACE_S`` gets SIGKILL.
* **readiness**: systemd hears READY=1 once every child said it serves.
* **metrics**: with --metrics-listen each child serves its own on
  127.0.0.1:0 and tells its port; the supervisor serves --metrics-listen and
  answers a scrape with every child's samples, each labelled
  ``partition="i"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dlm
from dlm.event_loop import running_loop_name
from dlm.node.runtime.config.node_config import NodeConfig, partition_dir
from dlm.node.runtime.log import Logger
from dlm.node.runtime.notify import NOTIFY_SOCKET_ENV, notify
from dlm.node.runtime.partition_metrics import TOKEN_ENV, exposition
from dlm.node.runtime.reload import (
    RELOAD_FLAGS_ENV,
    Reloading,
    partition_settings,
    supervisor_reload,
)
from dlm.node.runtime.seat import CONNECTION, METRICS, SERVING
from dlm.node.runtime.security import NodeSecurity
from dlm.node.supervision import GiveUp, Leave, Restart, RestartPolicy
from dlm.partitioning import PREAMBLE_MAGIC, PREAMBLE_SIZE, read_preamble

PREAMBLE_TIMEOUT_S = 5.0
"""How long an accepted connection may take to send its first bytes (the preamble)."""
MAX_PENDING = 512
"""Accepted connections waiting for their first bytes at once; one more closes the oldest."""
STOP_GRACE_S = 10.0
"""How long a child has to stop after SIGTERM before it gets SIGKILL."""
ACCEPTS_PER_TURN = 64
ACCEPT_PAUSE_S = 0.1
"""How long the listener is left alone after an accept failed (out of descriptors)."""
BOOT = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import importlib\n"
    "sys.exit(importlib.import_module(sys.argv[2]).child_main(sys.argv[3:]))\n"
)
"""The child's program: the dlm package from the supervisor's own location, then the
child entry of the module the supervisor was told (its arguments after that)."""


def code_root() -> str:
    """The directory (or zipapp) the running ``dlm`` package was imported from."""
    return str(Path(dlm.__file__).resolve().parent.parent)


@dataclass(slots=True)
class Child:
    """One partition's process, as the supervisor sees it."""

    partition: int
    process: asyncio.subprocess.Process | None = None
    channel: socket.socket | None = None
    serving: bool = False
    metrics_port: int | None = None
    metrics_token: str = ""
    """The bearer token its metrics demand (drawn anew at each start)."""
    pid_history: list[int] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return max(0, len(self.pid_history) - 1)


@dataclass(slots=True)
class _Pending:
    sock: socket.socket
    since: float
    where: str
    read: bytes = b""


class Supervisor:
    """Runs one member's partition children behind its one listener."""

    def __init__(
        self,
        config: NodeConfig,
        settings: Mapping[str, str | None],
        partitions: int,
        log: Logger,
        *,
        child_module: str,
        security: NodeSecurity | None = None,
        reloading: Reloading | None = None,
        flags: Mapping[str, str | None] | None = None,
    ) -> None:
        self.config = config
        self.settings = dict(settings)
        self.reloading = reloading
        """How a SIGHUP reads the member's settings again: checked here once, then
        forwarded to every child, which applies its part (reload.py)."""
        self.flags = flags
        self.partitions = partitions
        self.log = log
        self.child_module = child_module
        self.security = security
        self.children = [Child(i) for i in range(partitions)]
        self.policy = RestartPolicy(partitions)
        self.exit_code = 0
        self.failure: str | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._listener: socket.socket | None = None
        self._pending: dict[int, _Pending] = {}
        """Connections still sending their first bytes, by descriptor, oldest first."""
        self._ready_said = False
        self._accept_warned_at = float("-inf")
        self._shed_said_at: dict[str, float] = {}
        self._shed_unsaid: dict[str, int] = {}
        """Connections shed per reason since the last line that said so."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics: Any = None
        self.shed = 0
        self._reload_tasks: set[asyncio.Future[Any]] = set()
        """Connections closed for a bad preamble, a timeout or the pending cap."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def stopping(self) -> bool:
        """The member is stopping: a child that exits now is not started again."""
        return self._stopping

    async def run(self, listener: socket.socket) -> int:
        loop = self._loop = asyncio.get_running_loop()
        self._listener = listener
        listener.setblocking(False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._signalled, signum)
        loop.add_signal_handler(signal.SIGHUP, self._reload_soon)
        if self.config.metrics_listen is not None:
            await self._start_metrics(*self.config.metrics_listen)
        self.log.info(
            "supervisor_started",
            address=self.config.address,
            partitions=self.partitions,
            data=str(self.config.data_dir),
            event_loop=running_loop_name(loop),
        )
        loop.add_reader(listener.fileno(), self._accept)
        watchers = [asyncio.create_task(self._keep(child)) for child in self.children]
        sweeper = asyncio.create_task(self._sweep())
        try:
            await self._stopped.wait()
        finally:
            self._stop_accepting()
            sweeper.cancel()
            await self._stop_children()
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, sweeper, return_exceptions=True)
            if self.metrics is not None:
                self.metrics.close()
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
        if self.failure is not None:
            sys.stderr.write(f"dlm node: error: {self.failure}\n")
            sys.stderr.flush()
        self.log.info("supervisor_stopped", exit_code=self.exit_code)
        return self.exit_code

    def _signalled(self, signum: int) -> None:
        self.log.info("signal", signal=signal.Signals(signum).name)
        if self._stopping:
            # A second signal means "now": every child hears it again (and stops at once).
            self.signal_children(signal.SIGTERM)
            return
        self._stop()

    def _reload_soon(self) -> None:
        self.log.info("signal", signal="SIGHUP")
        if not self._stopping:
            task = asyncio.ensure_future(supervisor_reload(self))
            self._reload_tasks.add(task)
            task.add_done_callback(self._reload_tasks.discard)

    def _stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            notify("STOPPING=1")
            self._stop_accepting()
            self._stopped.set()

    def _stop_accepting(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None and self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(listener.fileno())
            listener.close()
        for fd in list(self._pending):
            self._drop(fd)

    def signal_children(self, signum: int) -> None:
        for child in self.children:
            process = child.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    async def _stop_children(self) -> None:
        self.signal_children(signal.SIGTERM)
        waits = [
            child.process.wait()
            for child in self.children
            if child.process is not None and child.process.returncode is None
        ]
        if not waits:
            return
        _done, late = await asyncio.wait(
            [asyncio.ensure_future(w) for w in waits], timeout=STOP_GRACE_S
        )
        if late:
            self.signal_children(signal.SIGKILL)
            await asyncio.wait(late, timeout=STOP_GRACE_S)

    # ------------------------------------------------------------------ children

    async def _keep(self, child: Child) -> None:
        """Starts ``child`` and starts it again each time it dies, as the policy says; a
        failure of the supervisor's own (a bug) stops the member rather than leave the
        partition unwatched."""
        try:
            await self._keep_running(child)
        except Exception as exc:
            self._give_up(GiveUp(1, f"watching partition {child.partition} failed: {exc!r}"))

    async def _keep_running(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            try:
                await self._spawn(child)
            except OSError as exc:
                self._give_up(GiveUp(1, f"cannot start partition {child.partition}: {exc}"))
                return
            process = child.process
            assert process is not None
            code = await process.wait()
            self._close_channel(child)
            if self.stopping:
                return
            verdict = self.policy.exited(child.partition, code, loop.time())
            self.log.warning(
                "partition_exited", partition=child.partition, pid=process.pid, exit_code=code
            )
            if isinstance(verdict, GiveUp):
                self._give_up(verdict)
                return
            if isinstance(verdict, Leave):
                if all(
                    c.process is None or c.process.returncode is not None for c in self.children
                ):
                    self._stop()
                return
            assert isinstance(verdict, Restart)
            self.log.info(
                "partition_restarting", partition=child.partition, delay_s=verdict.delay_s
            )
            await asyncio.sleep(verdict.delay_s)

    def _give_up(self, verdict: GiveUp) -> None:
        if self.failure is None:
            self.failure = verdict.message
            self.exit_code = verdict.exit_code
        self.log.error("partition_given_up", error=verdict.message)
        self._stop()

    async def _spawn(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A child serves its metrics on 127.0.0.1 (a port of the kernel's choice, with
            # the token below), where the supervisor fetches them: main.py.
            settings = partition_settings(
                self.settings, str(partition_dir(self.config.data_dir, child.partition))
            )
            env = {k: v for k, v in os.environ.items() if k != NOTIFY_SOCKET_ENV}
            if self.flags is not None:
                # What a forwarded SIGHUP makes it read again (reload.py).
                env[RELOAD_FLAGS_ENV] = json.dumps(dict(self.flags))
            child.metrics_token = secrets.token_hex(16)
            env[TOKEN_ENV] = child.metrics_token
            command = [
                sys.executable,
                "-c",
                BOOT,
                code_root(),
                self.child_module,
                json.dumps(settings),
                str(theirs.fileno()),
                str(child.partition),
                str(self.partitions),
            ]
            child.process = await asyncio.create_subprocess_exec(
                *command,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=env,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        child.channel = ours
        child.serving = False
        child.metrics_port = None
        child.pid_history.append(child.process.pid)
        self.policy.started(child.partition, loop.time())
        loop.add_reader(ours.fileno(), self._news, child)
        self.log.info("partition_started", partition=child.partition, pid=child.process.pid)

    def _close_channel(self, child: Child) -> None:
        channel, child.channel = child.channel, None
        child.serving = False
        child.metrics_port = None
        if channel is not None:
            if self._loop is not None:
                with contextlib.suppress(ValueError, OSError):
                    self._loop.remove_reader(channel.fileno())
            channel.close()

    def _news(self, child: Child) -> None:
        channel = child.channel
        if channel is None:
            return
        try:
            news = channel.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            news = b""
        if not news:
            # The child is gone (its process exit follows): stop listening to it.
            if self._loop is not None:
                with contextlib.suppress(ValueError, OSError):
                    self._loop.remove_reader(channel.fileno())
            return
        assert self._loop is not None
        if news == SERVING:
            child.serving = True
            self.policy.serving(child.partition, self._loop.time())
            self.log.info("partition_serving", partition=child.partition)
            if not self._ready_said and all(c.serving for c in self.children):
                self._ready_said = True
                notify("READY=1")
                self.log.info("member_serving", partitions=self.partitions)
        elif news.startswith(METRICS + b" "):
            port = news[len(METRICS) + 1 :]
            if port.isdigit() and 0 < int(port) < 65536:
                child.metrics_port = int(port)

    # ------------------------------------------------------------------ metrics

    async def _start_metrics(self, host: str, port: int) -> None:
        # prometheus-client is imported only by members that serve metrics.
        from dlm.node.runtime.metrics import MetricsListener

        security = self.security
        listener = MetricsListener(
            None,
            collect=lambda: exposition(self.children),
            log=self.log,
            token=security.metrics_token if security is not None else None,
            tls=security.metrics_tls if security is not None else None,
        )
        try:
            await listener.start(host, port)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot serve metrics on {_where((host, port))}: {exc.strerror}"
            ) from None
        self.metrics = listener
        self.log.info("metrics_serving", address=_where((host, listener.port)))

    # ------------------------------------------------------------------ connections

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of descriptors, most likely: the connection stays in the backlog,
                # and the listener, still readable, is left alone for a moment (else the
                # loop would spin on it).
                self._accept_later(exc)
                return
            sock.setblocking(False)
            pending = _Pending(sock, time.monotonic(), _where(addr))
            fd = sock.fileno()
            self._pending[fd] = pending
            if len(self._pending) > MAX_PENDING:
                oldest = next(iter(self._pending))
                self._shed("too many connections waiting for their preamble", oldest)
            if fd in self._pending:
                assert self._loop is not None
                self._loop.add_reader(fd, self._first_bytes, fd)

    def _accept_later(self, exc: OSError) -> None:
        listener, loop = self._listener, self._loop
        if listener is None or loop is None:
            return
        now = time.monotonic()
        if now - self._accept_warned_at >= 1.0:  # at most a line a second
            self._accept_warned_at = now
            self.log.warning("accept_failed", error=str(exc))
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(listener.fileno())
        loop.call_later(ACCEPT_PAUSE_S, self._accept_again)

    def _accept_again(self) -> None:
        listener, loop = self._listener, self._loop
        if listener is not None and loop is not None:
            loop.add_reader(listener.fileno(), self._accept)

    def _first_bytes(self, fd: int) -> None:
        pending = self._pending.get(fd)
        if pending is None:
            return
        sock = pending.sock
        try:
            if not pending.read:
                first = sock.recv(1, socket.MSG_PEEK)
                if not first:
                    self._drop(fd)
                    return
                if first != PREAMBLE_MAGIC[:1]:
                    self._hand_over(fd, 0)  # a hello or a TLS handshake: left unread
                    return
            more = sock.recv(PREAMBLE_SIZE - len(pending.read))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(fd)
            return
        if not more:
            self._drop(fd)
            return
        pending.read += more
        if len(pending.read) < PREAMBLE_SIZE:
            return
        partition = read_preamble(pending.read)
        if partition is None or partition >= self.partitions:
            self._shed("a malformed preamble, or one naming no partition of this member", fd)
            return
        self._hand_over(fd, partition)

    def _release(self, fd: int) -> _Pending | None:
        pending = self._pending.pop(fd, None)
        if pending is not None and self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(fd)
        return pending

    def _drop(self, fd: int) -> None:
        pending = self._release(fd)
        if pending is not None:
            pending.sock.close()

    def _hand_over(self, fd: int, partition: int) -> None:
        pending = self._release(fd)
        if pending is None:
            return
        channel = self.children[partition].channel
        try:
            if channel is None:
                raise OSError("partition not running")
            socket.send_fds(channel, [CONNECTION], [pending.sock.fileno()])
        except OSError:
            # The child is restarting, or its channel is full (it stopped reading):
            # the client tries again, or another member.
            self._said_shed(f"partition {partition} is not taking connections", pending.where)
        finally:
            pending.sock.close()

    async def _sweep(self) -> None:
        """Closes connections that did not send their first bytes in time."""
        while True:
            await asyncio.sleep(PREAMBLE_TIMEOUT_S / 5)
            cutoff = time.monotonic() - PREAMBLE_TIMEOUT_S
            for fd, pending in list(self._pending.items()):
                if pending.since > cutoff:
                    break  # oldest first: the rest are younger
                self._shed("no preamble or hello within 5 s", fd)

    def _shed(self, reason: str, fd: int) -> None:
        """Closes a connection still waiting for its first bytes, and says why."""
        pending = self._pending.get(fd)
        # Said before the close: whoever sees the connection end finds the line written.
        self._said_shed(reason, pending.where if pending is not None else "?")
        self._drop(fd)

    def _said_shed(self, reason: str, remote: str) -> None:
        """Counts a connection closed unserved; says so at most once a second per reason
        (strangers choose how many: the log must not be theirs to fill)."""
        self.shed += 1
        count = self._shed_unsaid[reason] = self._shed_unsaid.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._shed_said_at.get(reason, float("-inf")) < 1.0:
            return
        self._shed_said_at[reason] = now
        self._shed_unsaid[reason] = 0
        self.log.warning("connection_shed", reason=reason, remote=remote, count=count)


def _where(addr: Any) -> str:
    try:
        host, port = addr[0], addr[1]
    except (TypeError, IndexError):
        return str(addr)
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
