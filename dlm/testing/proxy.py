"""A fault-injecting TCP proxy for tests: put it between a client and one member, then cut,
delay and heal the link while real processes talk through it. dlm.testing's links are
made of these; the project's own cluster and chaos tests use it too (tests/cluster/proxy.py).

::

    with Proxy("127.0.0.1:7701") as link:      # listens on 127.0.0.1, a free port
        run_client(link.address)               # "127.0.0.1:PORT"
        link.cut()                             # drop everything, both ways
        link.cut(UP)                           # or one way: client -> upstream only
        link.delay(0.2)                        # or add 200 ms each way (or one: DOWN)
        link.heal()                            # back to a clean link

Semantics, chosen to look like a network to both ends:

- A *cut* direction drops every byte, including bytes already queued behind a
  delay, without closing anything: neither end sees an error, only silence,
  as in a partition. New connections are accepted and connected upstream as
  usual, and their bytes dropped too.
- ``heal()`` lifts cuts and delays, and closes every connection that lost
  bytes: a TCP stream with a hole in it cannot be trusted again (a real one
  would have been reset), so its ends see it close and reconnect.
- A *delay* holds each chunk for that long, in order; changing it affects
  chunks read after the change.

Control calls are synchronous: when ``cut()`` returns, no byte read afterwards
gets through. The proxy runs an asyncio loop in a thread of its own; every
loop in it ends with its connection or at ``stop()``, which closes everything
and joins the thread within a bounded time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

UP = "up"
"""Client to upstream."""
DOWN = "down"
"""Upstream to client."""
BOTH = (UP, DOWN)
CONTROL_TIMEOUT_S = 10.0
CHUNK = 65536


class _Link:
    """One proxied connection: both sockets and a queue per direction."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.readers = {UP: client[0], DOWN: upstream[0]}
        self.writers = {UP: upstream[1], DOWN: client[1]}
        self.queues: dict[str, asyncio.Queue[tuple[float, bytes] | None]] = {
            UP: asyncio.Queue(),
            DOWN: asyncio.Queue(),
        }
        self.damaged = False
        self.open_directions = 2
        self.tasks: list[asyncio.Task[None]] = []

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class Proxy:
    """Forwards 127.0.0.1:``port`` (0: a free one) to ``upstream``, with faults on demand."""

    def __init__(self, upstream: str, *, port: int = 0) -> None:
        host, _, upstream_port = upstream.rpartition(":")
        self.upstream = (host, int(upstream_port))
        self._port = port
        self._cut = {UP: False, DOWN: False}
        self._delay = {UP: 0.0, DOWN: 0.0}
        self.dropped = {UP: 0, DOWN: 0}
        """Bytes dropped so far in each direction."""
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------

    @property
    def address(self) -> str:
        assert self._server is not None, "start() the proxy first"
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    def start(self) -> Proxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._accept, "127.0.0.1", self._port)
                )
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                # As asyncio.run does: whatever is left (a connection accepted while
                # stopping) is cancelled and run to its end before the loop closes.
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                if left:
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=serve, name="test-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(CONTROL_TIMEOUT_S):
            raise RuntimeError("the proxy did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        """Closes the listener and every connection; joins the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CONTROL_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError("the proxy thread did not stop")

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------

    def cut(self, *directions: str) -> None:
        """Drops every byte in these directions (default: both) until ``heal()``."""
        self._call(self._set_cut(directions or BOTH))

    def delay(self, seconds: float, *directions: str) -> None:
        """Holds each chunk ``seconds`` in these directions (default: both)."""
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        self._call(self._set_delay(seconds, directions or BOTH))

    def heal(self) -> None:
        """No cut, no delay; connections that lost bytes are closed."""
        self._call(self._heal())

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        count: int = self._call(self._count())
        return count

    # -- on the loop --------------------------------------------------------

    def _call(self, work: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None, "start() the proxy first"
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(CONTROL_TIMEOUT_S)

    async def _set_cut(self, directions: tuple[str, ...]) -> None:
        for d in directions:
            _check(d)
            self._cut[d] = True
        for link in self._links:
            for d in directions:
                self._drop_queued(link, d)

    async def _set_delay(self, seconds: float, directions: tuple[str, ...]) -> None:
        for d in directions:
            _check(d)
            self._delay[d] = seconds

    async def _heal(self) -> None:
        self._cut = {UP: False, DOWN: False}
        self._delay = {UP: 0.0, DOWN: 0.0}
        for link in [link for link in self._links if link.damaged]:
            link.close()
            self._links.discard(link)

    async def _count(self) -> int:
        return len(self._links)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [task for link in self._links for task in link.tasks]
        for link in list(self._links):
            link.close()
        self._links.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _drop_queued(self, link: _Link, direction: str) -> None:
        queue = link.queues[direction]
        while not queue.empty():
            item = queue.get_nowait()
            if item is None:  # the end-of-stream marker stays
                queue.put_nowait(None)
                return
            self.dropped[direction] += len(item[1])
            link.damaged = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), CONTROL_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            writer.close()
            return
        if self._server is None or not self._server.is_serving():  # stopping
            writer.close()
            upstream[1].close()
            return
        link = _Link((reader, writer), upstream)
        self._links.add(link)
        for d in BOTH:
            link.tasks.append(asyncio.create_task(self._pump(link, d)))
            link.tasks.append(asyncio.create_task(self._send(link, d)))

    async def _pump(self, link: _Link, direction: str) -> None:
        """Reads one direction until its end; queues or drops each chunk."""
        loop = asyncio.get_running_loop()
        reader, queue = link.readers[direction], link.queues[direction]
        try:
            while data := await reader.read(CHUNK):
                if self._cut[direction]:
                    self.dropped[direction] += len(data)
                    link.damaged = True
                    continue
                queue.put_nowait((loop.time() + self._delay[direction], data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        queue.put_nowait(None)

    async def _send(self, link: _Link, direction: str) -> None:
        """Writes one direction's queue in order, each chunk when it is due."""
        loop = asyncio.get_running_loop()
        writer, queue = link.writers[direction], link.queues[direction]
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if self._cut[direction]:  # cut while it waited
                    self.dropped[direction] += len(data)
                    link.damaged = True
                    continue
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            link.open_directions -= 1
            if link.open_directions > 0:
                return  # the other direction may still carry a reply
        except OSError:
            pass
        link.close()
        self._links.discard(link)


def _check(direction: str) -> None:
    if direction not in BOTH:
        raise ValueError(f"direction must be {UP!r} or {DOWN!r}, not {direction!r}")
