"""A tiny in-test network for driving RaftNodes by hand.

Every node gets a MemoryStorage. ``persist`` plays the runtime: it takes each
Ready, queues ``messages_now``, writes snapshot, entries and hard state to
storage, queues ``messages``, records committed entries as "applied", then
calls advance. Messages are only
delivered when a test says so (``deliver``/``stabilize``), and a ``drop``
predicate or a cut link discards them, so every interleaving is explicit.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TypedDict, TypeVar, Unpack

from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import Message, ReadState, Ready, Role
from dlm.records import ConfState, Entry, NodeId, Snapshot


class RaftOptions(TypedDict, total=False):
    """Config fields a test may override; the rest of Config comes from the Net."""

    group: int
    election_ticks: int
    heartbeat_ticks: int
    pre_vote: bool
    check_quorum: bool
    max_inflight: int
    max_entries_bytes: int
    snapshot_chunk_bytes: int


def ids(n: int) -> tuple[NodeId, ...]:
    return tuple(f"n{i}" for i in range(1, n + 1))


class Net:
    def __init__(
        self,
        members: Iterable[NodeId] | int = 3,
        *,
        learners: tuple[NodeId, ...] = (),
        seed: int = 1,
        node_class: type[RaftNode] = RaftNode,
        **cfg: Unpack[RaftOptions],
    ) -> None:
        self.voters = ids(members) if isinstance(members, int) else tuple(members)
        self.learners = learners
        self.seed = seed
        self.node_class = node_class
        self.cfg = cfg
        self.storages: dict[NodeId, MemoryStorage] = {}
        self.nodes: dict[NodeId, RaftNode] = {}
        self.applied: dict[NodeId, list[Entry]] = {}
        self.snapshots: dict[NodeId, list[Snapshot]] = {}
        self.reads: dict[NodeId, list[ReadState]] = {}
        self.readies: dict[NodeId, list[Ready]] = {}
        self.queue: deque[Message] = deque()
        self.sent: list[Message] = []
        self.cut: set[tuple[NodeId, NodeId]] = set()
        self.drop: Callable[[Message], bool] = lambda m: False
        for n in (*self.voters, *learners):
            self.storages[n] = MemoryStorage(ConfState(self.voters, learners))
            self.start(n)

    # -- lifecycle ---------------------------------------------------------

    def config(self, n: NodeId) -> Config:
        return Config(id=n, voters=self.voters, **self.cfg)

    def start(self, n: NodeId) -> RaftNode:
        rng = random.Random(f"{self.seed}-{n}")
        node = self.node_class(self.config(n), self.storages[n], rng)
        self.nodes[n] = node
        self.applied.setdefault(n, [])
        self.snapshots.setdefault(n, [])
        self.reads.setdefault(n, [])
        self.readies.setdefault(n, [])
        return node

    def add(self, n: NodeId) -> RaftNode:
        """Start a new, empty member; like every member it boots with the bootstrap config."""
        self.storages[n] = MemoryStorage(ConfState(self.voters, self.learners))
        return self.start(n)

    def stop(self, n: NodeId) -> None:
        """Stop ``n`` for good (a removed member): it neither sends nor receives again."""
        del self.nodes[n]
        self.queue = deque(m for m in self.queue if n not in (m.dst, m.src))

    def restart(self, n: NodeId) -> RaftNode:
        """Lose everything not persisted; the state machine restarts from the snapshot."""
        self.queue = deque(m for m in self.queue if n not in (m.dst, m.src))
        snap = self.storages[n].snapshot()
        self.applied[n] = [
            e for e in self.applied[n] if snap is not None and e.index <= snap.meta.index
        ]
        return self.start(n)

    def __getitem__(self, n: NodeId) -> RaftNode:
        return self.nodes[n]

    # -- the runtime's part ------------------------------------------------

    def persist(self, n: NodeId) -> list[Ready]:
        node = self.nodes[n]
        storage = self.storages[n]
        out = []
        for _ in range(1000):
            if not node.has_ready():
                break
            rd = node.ready()
            self.queue.extend(rd.messages_now)
            self.sent.extend(rd.messages_now)
            if rd.snapshot is not None:
                storage.apply_snapshot(rd.snapshot)
                self.snapshots[n].append(rd.snapshot)
                self.applied[n] = []
            if rd.entries:
                storage.append(rd.entries)
            if rd.hard_state is not None:
                storage.set_hard_state(rd.hard_state)
            self.queue.extend(rd.messages)
            self.sent.extend(rd.messages)
            self.applied[n].extend(rd.committed)
            self.reads[n].extend(rd.read_states)
            self.readies[n].append(rd)
            node.advance(rd)
            out.append(rd)
        return out

    def persist_all(self) -> None:
        for n in self.nodes:
            self.persist(n)

    def deliver(self, limit: int = 100_000) -> int:
        """Deliver queued messages (persisting after each) until none are left."""
        count = 0
        self.persist_all()
        while self.queue and count < limit:
            m = self.queue.popleft()
            count += 1
            if (m.src, m.dst) in self.cut or self.drop(m) or m.dst not in self.nodes:
                continue
            self.nodes[m.dst].step(m)
            self.persist(m.dst)
        return count

    stabilize = deliver

    def take(self, n: NodeId | None = None) -> list[Message]:
        """Remove and return queued messages (optionally only those from ``n``) without delivery."""
        self.persist_all()
        taken = [m for m in self.queue if n is None or m.src == n]
        self.queue = deque(m for m in self.queue if not (n is None or m.src == n))
        return taken

    def send(self, *msgs: Message) -> None:
        for m in msgs:
            self.nodes[m.dst].step(m)
            self.persist(m.dst)

    def tick(self, n: NodeId, times: int = 1) -> None:
        for _ in range(times):
            self.nodes[n].tick()
        self.persist(n)

    def tick_all(self, times: int = 1) -> None:
        for _ in range(times):
            for node in self.nodes.values():
                node.tick()
            self.deliver()

    def campaign(self, n: NodeId) -> None:
        """Tick ``n`` until its election timer fires, then deliver everything."""
        node = self.nodes[n]
        for _ in range(4 * node._cfg.election_ticks):
            if node.role not in (Role.FOLLOWER, Role.LEARNER):
                break
            node.tick()
        self.persist(n)
        self.deliver()

    def elect(self, n: NodeId = "n1") -> RaftNode:
        self.campaign(n)
        assert self.nodes[n].role is Role.LEADER, self.nodes[n]
        return self.nodes[n]

    def isolate(self, n: NodeId) -> None:
        for other in self.nodes:
            if other != n:
                self.cut.add((n, other))
                self.cut.add((other, n))

    def heal(self) -> None:
        self.cut.clear()
        self.drop = lambda m: False

    def leader(self) -> NodeId | None:
        leaders = [n for n, node in self.nodes.items() if node.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def data(self, n: NodeId) -> list[bytes]:
        return [e.data for e in self.applied[n] if e.data]


M = TypeVar("M")


def of_type(msgs: Iterable[Message], kind: type[M]) -> list[M]:
    return [m for m in msgs if isinstance(m, kind)]


def with_term(m: Message, term: int) -> Message:
    return replace(m, term=term)
