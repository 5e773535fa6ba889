"""A partition child's end of its supervisor: connections in, news out.

A member with more than one partition listens in its supervisor
(supervisor.py), which hands every accepted connection to the child serving
the partition it names. The channel between them is one unix SOCK_SEQPACKET
socket pair per child, one message each way at a time:

* supervisor -> child: one byte (``b"c"``) carrying one descriptor in
  SCM_RIGHTS: an accepted TCP connection whose preamble, if any, is already read.
  The child adopts it as if its own listener had accepted it
  (``loop.connect_accepted_socket``, TLS included).
* child -> supervisor: ``b"serving"`` once the child serves, and
  ``b"metrics PORT"`` once it serves its metrics on 127.0.0.1:PORT (the
  supervisor fetches them from there and labels them by partition).

The end of the channel (the supervisor exited, or was killed) stops the child:
a partition process never outlives its member.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable

CONNECTION = b"c"
SERVING = b"serving"
METRICS = b"metrics"
MAX_FDS_PER_MESSAGE = 1
CHANNEL_FD_ENV = "DLM_PARTITION_CHANNEL_FD"
"""The descriptor number of the child's end of the channel, in its environment."""


class Seat:
    """The child's end of the channel: ``partition`` of ``partitions``."""

    def __init__(self, channel: socket.socket, partition: int, partitions: int) -> None:
        self.channel = channel
        self.partition = partition
        self.partitions = partitions
        self._loop: asyncio.AbstractEventLoop | None = None
        self._adopt: Callable[[socket.socket], None] | None = None
        self._lost: Callable[[], None] | None = None

    @classmethod
    def from_fd(cls, fd: int, partition: int, partitions: int) -> Seat:
        channel = socket.socket(fileno=fd)
        channel.setblocking(False)
        return cls(channel, partition, partitions)

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        adopt: Callable[[socket.socket], None],
        lost: Callable[[], None],
    ) -> None:
        """Hands every connection the supervisor passes to ``adopt``; calls ``lost`` once
        when the supervisor is gone."""
        self._loop, self._adopt, self._lost = loop, adopt, lost
        loop.add_reader(self.channel.fileno(), self._readable)

    def stop(self) -> None:
        """Takes no more connections (the member is shutting down)."""
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self.channel.fileno())
            self._loop = None

    def tell(self, news: bytes) -> None:
        """Sends one piece of news to the supervisor (lost if it is not reading: it is gone)."""
        with contextlib.suppress(OSError):
            self.channel.send(news)

    def _readable(self) -> None:
        for _ in range(64):  # bounded per turn: the loop has other work too
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.channel, 16, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:
                self._gone()
                return
            for fd in fds:
                sock = _adoptable(fd)
                if sock is not None and self._adopt is not None:
                    self._adopt(sock)

    def _gone(self) -> None:
        self.stop()
        lost, self._lost = self._lost, None
        if lost is not None:
            lost()


def _adoptable(fd: int) -> socket.socket | None:
    """The socket behind a received descriptor, if it is a TCP stream (anything else the
    supervisor would never send: closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.close(fd)
        return None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.close()
        return None
    return sock
