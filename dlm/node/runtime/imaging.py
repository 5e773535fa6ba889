"""Images of the applied state built off the event loop, in a forked child.

Building an image walks the whole lock table: at 100,000 locks that took the leader's
event loop two seconds, more than an election timeout, so its followers started an
election (bench/results/scale.md). A thread would not help: the encoder holds the GIL
for the whole walk. So the member forks, as Redis does for its snapshots: the child
sees the table as it was at the fork, in copy-on-write memory, builds the image,
writes it down a pipe and leaves with ``os._exit``; it does nothing else (no event
loop, no log, no disk), so no lock another thread held at the fork can trap it. The
parent pays for the fork (page tables: about 10 ms at 250 MB) and for the pages it
writes to while the child runs, and reads the pipe on its loop in bounded slices. So
that it writes to few, the cyclic collector's view of every object that exists at the
fork is frozen (``gc.freeze``) until the last child is done: a full collection in the
parent meanwhile would otherwise touch, and so copy, every page of the lock table.

A child that fails or outlives ``timeout_s`` is reported as failed (and killed);
the periodic snapshot is then taken at a later index, and a backup's client is told.
At most one child per purpose runs at a time (the imager says "not now" otherwise).
Where ``os.fork`` does not exist the image is built on the spot.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable

READ_SLICE_BYTES = 1 << 20
READS_PER_TURN = 8
"""At most this many slices are read per loop turn: 8 MiB, a few ms of copying."""
DEFAULT_TIMEOUT_S = 600.0

Done = Callable[[bytes | None, str | None], None]
"""Called once with (image, None) or (None, why it failed)."""


class ChildImage:
    """An image a forked child is building (``snapshots.PendingImage``)."""

    def __init__(self, purpose: str, pid: int, fd: int, started: float, fork_s: float) -> None:
        self.purpose = purpose
        self.pid = pid
        self.fd = fd
        self.started = started
        self.fork_s = fork_s
        """How long the fork itself held the loop."""
        self.seconds = 0.0
        """From the fork to the last byte read (once done)."""
        self.buffer = bytearray()
        self.done = False
        self.image: bytes | None = None
        self.error: str | None = None
        self._callbacks: list[Done] = []
        self.timer: asyncio.TimerHandle | None = None

    def add_done_callback(self, callback: Done) -> None:
        if self.done:
            callback(self.image, self.error)
        else:
            self._callbacks.append(callback)

    def _finish(self, image: bytes | None, error: str | None) -> None:
        self.done = True
        self.image, self.error = image, error
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(image, error)


class ForkImager:
    """The runtime's ``snapshots.Imager``: one forked child per image."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fork: bool = hasattr(os, "fork"),
    ) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._fork = fork
        self.running: dict[str, ChildImage] = {}
        self.last_fork_s = 0.0

    def __call__(self, build: Callable[[], bytes], purpose: str) -> bytes | ChildImage | None:
        if purpose in self.running:
            return None
        if not self._fork:
            return build()
        read_fd, write_fd = os.pipe()
        started = time.monotonic()
        gc.freeze()
        try:
            with warnings.catch_warnings():
                # Python 3.12 warns that a child of a process with threads may deadlock on a
                # lock another thread held: this one takes none (see the module docstring).
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            if not self.running:
                gc.unfreeze()
            return build()  # no memory for a child: the loop pays, as before
        if pid == 0:  # pragma: no cover - the child; it leaves through os._exit
            _child(build, read_fd, write_fd)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self.last_fork_s = time.monotonic() - started
        child = ChildImage(purpose, pid, read_fd, started, self.last_fork_s)
        self.running[purpose] = child
        self._loop.add_reader(read_fd, self._readable, child)
        child.timer = self._loop.call_later(self._timeout_s, self._timed_out, child)
        return child

    def _readable(self, child: ChildImage) -> None:
        for _ in range(READS_PER_TURN):
            try:
                data = os.read(child.fd, READ_SLICE_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                self._end(child, f"reading the image failed: {exc.strerror or exc}")
                return
            if not data:
                self._end(child, None)
                return
            child.buffer += data

    def _timed_out(self, child: ChildImage) -> None:
        self._end(child, f"the image took longer than {self._timeout_s:g} s")

    def _end(self, child: ChildImage, error: str | None) -> None:
        if child.done:
            return
        self._loop.remove_reader(child.fd)
        os.close(child.fd)
        if child.timer is not None:
            child.timer.cancel()
        if error is not None:
            _kill(child.pid)
        status = _reap(child.pid)
        if error is None and status != 0:
            error = f"the child building the image exited with status {status}"
        child.seconds = time.monotonic() - child.started
        self.running.pop(child.purpose, None)
        if not self.running:
            gc.unfreeze()
        image = None if error is not None else bytes(child.buffer)
        child.buffer = bytearray()
        child._finish(image, error)

    def close(self) -> None:
        """Kills every child still building (the member is stopping)."""
        for child in list(self.running.values()):
            self._end(child, "the member stopped")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> int:
    """The child's exit status (it has closed the pipe, so it is exiting or has exited)."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status)


def _child(build: Callable[[], bytes], read_fd: int, write_fd: int) -> None:  # pragma: no cover
    """In the forked child: build the image, write it to ``write_fd``, leave."""
    code = 1
    try:
        # Signals mean what they mean to any process: the parent's handlers write to its
        # event loop's wake-up descriptor, which is not ours to use.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        gc.disable()  # the image holds no cycles, and a collection would touch every page
        # Drop our copies of the parent's sockets and files: a connection the parent closes
        # must close now, not when this child leaves. (Descriptors 0-2 stay, for a message.)
        os.close(read_fd)
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, _max_fd())
        data = memoryview(build())
        while data:
            data = data[os.write(write_fd, data) :]
        code = 0
    except BaseException as exc:
        try:
            sys.stderr.write(f"dlm: building a snapshot image failed: {exc!r}\n")
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(code)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536
