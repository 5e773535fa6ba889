"""A real member for the client tests: NodeServer, a one-member cluster, in a thread of its own.

``running_member()`` (behind the ``member`` fixture of conftest.py) starts
``dlm.node.runtime.server.NodeServer`` on 127.0.0.1 port 0 with MemoryStorage, in a
background thread running its own event loop (an anyio blocking portal),
waits until it leads and runs protocol version 2, and stops it after the
test, every step bounded in time. The clients under
test talk to it over TCP like to any member.

What a test may need to see or do beyond a client's view:

* ``received`` / ``wait_for(kind, count)``: every frame the member's machine
  was handed, with the connection it came on (recorded on the way in);
* ``frozen()``: the member's event loop stops for the duration of the block,
  as if the process were SIGSTOPped: connections stay open, nothing answers;
* ``inspect(fn)``: runs ``fn(machine)`` on the member's own thread.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.from_thread

from dlm.node.machine import Instant, NodeMachine, Timing
from dlm.node.raft.memory import MemoryStorage
from dlm.node.runtime.accepting import Limits
from dlm.node.runtime.config.node_config import NodeConfig
from dlm.node.runtime.log import Logger
from dlm.node.runtime.server import NodeServer
from dlm.records import ConfState

T = TypeVar("T")
FAST = Timing(tick_s=0.01, election_ticks=3, heartbeat_ticks=1, expire_retry_s=0.2)
WAIT = 5.0
"""The longest any step of starting, inspecting or stopping the member may take."""


class RunningMember:
    """One NodeServer on its own thread and event loop (see the module docstring)."""

    def __init__(self, *, dead_peers: int = 0, limits: Limits | None = None) -> None:
        self.dead_peers = dead_peers
        self.limits = limits
        self.addr = ""
        self.received: list[tuple[int, dict[str, Any]]] = []
        self._cond = threading.Condition()
        self._server: NodeServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- what tests use ---------------------------------------------------------------

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [frame for _, frame in self.received if frame.get("t") == kind]

    def conns_of(self, kind: str) -> list[int]:
        with self._cond:
            return [conn for conn, frame in self.received if frame.get("t") == kind]

    def wait_for(self, kind: str, count: int = 1, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Waits until ``count`` frames of type ``kind`` arrived; fails after ``timeout``."""
        with self._cond:
            arrived = self._cond.wait_for(lambda: len(self._of_type(kind)) >= count, timeout)
            assert arrived, f"{count} {kind!r} frames did not arrive within {timeout}s"
            return self._of_type(kind)

    def inspect(self, fn: Callable[[NodeMachine], T]) -> T:
        """``fn(machine)``, run on the member's thread (its state is not thread-safe)."""
        assert self._loop is not None and self._server is not None
        server = self._server
        return asyncio.run_coroutine_threadsafe(_call(fn, server.machine), self._loop).result(WAIT)

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The member's event loop stands still inside the block (a SIGSTOPped process)."""
        assert self._loop is not None
        entered, release = threading.Event(), threading.Event()

        def stand_still() -> None:
            entered.set()
            release.wait(4 * WAIT)

        self._loop.call_soon_threadsafe(stand_still)
        assert entered.wait(WAIT)
        try:
            yield
        finally:
            release.set()

    # -- the member's own thread ----------------------------------------------------------

    def _of_type(self, kind: str) -> list[dict[str, Any]]:
        return [frame for _, frame in self.received if frame.get("t") == kind]

    def _record(self, machine: NodeMachine) -> None:
        handle = machine.client_frame

        def recording(conn: int, obj: Any, now: Instant, *, pump: bool = True) -> None:
            if isinstance(obj, dict):
                with self._cond:
                    self.received.append((conn, obj))
                    self._cond.notify_all()
            handle(conn, obj, now, pump=pump)

        machine.client_frame = recording  # type: ignore[method-assign]

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._loop = asyncio.get_running_loop()
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.addr = f"127.0.0.1:{port}"
        peers = {"n1": ("127.0.0.1", port)}
        for i in range(self.dead_peers):
            peers[f"n{i + 2}"] = ("127.0.0.1", 1)  # nothing listens on port 1 of loopback
        config = NodeConfig(
            node_id="n1",
            listen=("127.0.0.1", port),
            peers=peers,
            data_dir=Path("unused-by-the-server"),
            cluster="unit",
            timing=FAST,
        )
        storage = MemoryStorage(ConfState(voters=tuple(sorted(peers))))
        server = NodeServer(
            config, storage, log=Logger("n1", stream=io.StringIO()), limits=self.limits
        )
        self._server = server
        self._record(server.machine)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listener)
            if not self.dead_peers:
                with anyio.fail_after(WAIT):
                    await server.leader_seen.wait()
                    while server.machine.locks.version < 2:
                        await anyio.sleep(0.005)
            task_status.started()
            await server.stopped.wait()

    def stop(self) -> None:
        assert self._server is not None
        self._server.stopped.set()


async def _call(fn: Callable[[NodeMachine], T], machine: NodeMachine) -> T:
    return fn(machine)


@contextmanager
def running_member(**options: Any) -> Iterator[RunningMember]:
    """A started member; stopped, and its thread joined, on exit."""
    member = RunningMember(**options)
    with anyio.from_thread.start_blocking_portal(backend="asyncio") as portal:
        future, _ = portal.start_task(member.serve)
        try:
            yield member
        finally:
            portal.call(member.stop)
            future.result(timeout=WAIT)
