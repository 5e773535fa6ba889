"""Linearizable reads without a log entry: the leader's side of ReadIndex.

A read request remembers the commit index at the moment it arrived. The leader
then sends a round of heartbeats carrying the request's ``ctx``; once a quorum
has answered with that ctx, no other leader can have been elected in between,
so the remembered index (and that of every earlier request) is safe to read at.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set
from dataclasses import dataclass, field

from dlm.records import NodeId


@dataclass(slots=True)
class ReadRequest:
    ctx: bytes
    index: int
    requester: NodeId
    acks: set[NodeId] = field(default_factory=set)


class ReadOnly:
    """Pending ReadIndex requests of a leader, in arrival order."""

    __slots__ = ("_by_ctx", "_queue")

    def __init__(self) -> None:
        self._by_ctx: dict[bytes, ReadRequest] = {}
        self._queue: deque[bytes] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, ctx: bytes, index: int, requester: NodeId) -> bool:
        """Queue a request; False if a request with the same ctx is already pending."""
        if ctx in self._by_ctx:
            return False
        self._by_ctx[ctx] = ReadRequest(ctx, index, requester)
        self._queue.append(ctx)
        return True

    def ack(self, ctx: bytes, voter: NodeId) -> Set[NodeId]:
        """Record that ``voter`` answered the heartbeat round for ``ctx``; returns who has.

        The caller counts the answers against the configuration in force when
        it decides, which may have changed since the round started.
        """
        req = self._by_ctx.get(ctx)
        if req is None:
            return frozenset()
        req.acks.add(voter)
        return req.acks

    def confirm(self, ctx: bytes) -> list[ReadRequest]:
        """Release ``ctx`` and every request queued before it."""
        if ctx not in self._by_ctx:
            return []
        released: list[ReadRequest] = []
        while self._queue:
            head = self._queue.popleft()
            released.append(self._by_ctx.pop(head))
            if head == ctx:
                break
        return released

    def last_ctx(self) -> bytes:
        """The ctx a heartbeat should carry so that a lost round gets retried (b"" if none)."""
        return self._queue[-1] if self._queue else b""

    def clear(self) -> None:
        self._by_ctx.clear()
        self._queue.clear()
