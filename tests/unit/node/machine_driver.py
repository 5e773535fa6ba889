"""A deterministic driver for NodeMachine tests: members, a fake clock, a network run by hand.

Everything runs in the calling thread, in an order the test chooses:

* **time** moves only in ``advance``: the clock jumps to the earliest
  ``next_timer()`` of the members, fires those timers, settles and delivers,
  and repeats up to the end of the interval. ``Instant.wall_ms`` follows the
  monotonic clock (1 ms per ms) from a fixed epoch.
* **peer messages** from ``SendMessages`` wait in ``in_flight`` until
  ``deliver``, which hands each one to its destination unless ``blocked``
  (a predicate the test sets) says it is lost; lost ones are kept in
  ``dropped``. Every message a member sent is also kept in its ``sent``.
* **backups**: a ``SendBackup``'s header lands in the client's frames, and the action
  itself (its image) in the member's ``backups``.
* **the disk**: ``Persist`` and ``SaveSnapshot`` go to a member's queue and
  are written to its MemoryStorage in order, at once, unless the member's
  ``hold_disk`` is set; then the test completes them with ``write_disk``.
* **clients**: ``Client`` opens a connection on one member and sends frames;
  what the member answers lands in ``Client.frames``.
* **membership**: ``join`` boots a member that was not among the first ones, as
  `dlm node start --join` does. With ``links_follow_peers`` a message is
  delivered only as the runtime would carry it: over a link the sender keeps
  (its last ``PeersChanged``) to a member that accepts the sender's hello.

Nothing here sleeps, opens a socket or starts a thread; the members' random
choices come from one seed.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import cbor2

from dlm.node.machine import (
    CloseConnection,
    Instant,
    LogEvent,
    MachineConfig,
    NodeMachine,
    PeersChanged,
    Persist,
    Quotas,
    SaveSnapshot,
    SendBackup,
    SendFrame,
    SendMessages,
    Stop,
    Timing,
)
from dlm.node.outbox import ExportSpans
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import Message, Role
from dlm.node.runtime.persister import write_job
from dlm.records import ConfState, EntryKind, NodeId

NODE_IDS = ("n1", "n2", "n3")
MONO_START = 100.0
WALL_START_MS = 1_700_000_000_000
TIMING = Timing(tick_s=0.05, election_ticks=6, heartbeat_ticks=1, request_timeout_s=5.0)
CHANGES = frozenset(
    {
        "open_lease",
        "close_lease",
        "lease_update",
        "acquire",
        "release",
        "member_add",
        "member_remove",
        "member_promote",
    }
)
MAX_STEPS = 10_000
"""Bound on every loop here: a member that never settles is a bug, not a slow test."""


def address(node: NodeId) -> str:
    return f"{node}:7700"


@dataclass(eq=False)
class Member:
    id: NodeId
    storage: MemoryStorage
    machine: NodeMachine
    hold_disk: bool = False
    disk: deque[Persist | SaveSnapshot] = field(default_factory=deque)
    sent: list[Message] = field(default_factory=list)
    frames: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    closed: dict[int, str] = field(default_factory=dict)
    """Connections the member asked to close, with the reason, in the order asked."""
    events: list[LogEvent] = field(default_factory=list)
    persists: list[Persist] = field(default_factory=list)
    snapshots: list[SaveSnapshot] = field(default_factory=list)
    backups: list[SendBackup] = field(default_factory=list)
    """Backups the member sent (their header frame is in ``frames`` too)."""
    stops: list[Stop] = field(default_factory=list)
    peers: dict[NodeId, str] = field(default_factory=dict)
    """The links the member keeps: its last PeersChanged."""
    exported: list[ExportSpans] = field(default_factory=list)
    """The span batches of traced requests the member handed out (dlm/node/spans.py)."""
    order: list[Any] = field(default_factory=list)
    """Every action in the order the member emitted it (for ordering checks)."""

    @property
    def role(self) -> Role:
        return self.machine.role

    def event_names(self) -> list[str]:
        return [e.event for e in self.events]

    def commands(self) -> list[Any]:
        """The decoded CBOR item of every non-empty normal entry in the stored log."""
        storage = self.storage
        first, last = storage.first_index(), storage.last_index()
        return [
            cbor2.loads(e.data)
            for e in storage.entries(first, last + 1)
            if e.kind is EntryKind.NORMAL and e.data
        ]

    def command_names(self) -> list[str]:
        return [item[0] for item in self.commands()]


class Cluster:
    """One or three NodeMachines on MemoryStorage, driven by hand."""

    def __init__(
        self,
        size: int = 1,
        *,
        timing: Timing = TIMING,
        quotas: Quotas | None = None,
        snapshot_every: int = 10_000,
        snapshot_keep: int = 1_000,
        max_version: int = 2,
        peer_version: int | None = 2,
        machine_class: type[NodeMachine] = NodeMachine,
        seed: int = 7,
        links_follow_peers: bool = False,
        peers_authenticated: bool = False,
        partition: int = 0,
        partitions: int = 1,
    ) -> None:
        self.partition = partition
        self.partitions = partitions
        """Which partition's group these members are, of how many (1: no partitions)."""
        self.first = NODE_IDS[:size]
        """The first members (the bootstrap configuration)."""
        self.ids: tuple[NodeId, ...] = self.first
        """Every member booted, joined ones too."""
        self.links_follow_peers = links_follow_peers
        self.peers_authenticated = peers_authenticated
        self.timing = timing
        self.quotas = quotas or Quotas()
        self.snapshot_every = snapshot_every
        self.snapshot_keep = snapshot_keep
        self.max_version = max_version
        self.peer_version = peer_version
        self.machine_class = machine_class
        self.rng = random.Random(seed)
        self.mono = MONO_START
        self.in_flight: list[Message] = []
        self.dropped: list[Message] = []
        self.blocked: Callable[[Message], bool] = lambda msg: False
        self._conns = itertools.count(1)
        self.members: dict[NodeId, Member] = {}
        self._join_members: dict[NodeId, dict[NodeId, str]] = {}
        for node in self.ids:
            storage = MemoryStorage(ConfState(voters=self.ids))
            self.members[node] = self._boot(node, storage)

    # -- members ------------------------------------------------------------------

    def config(self, node: NodeId, peers: dict[NodeId, str] | None = None) -> MachineConfig:
        return MachineConfig(
            node_id=node,
            cluster="unit",
            peers=peers or {n: address(n) for n in self.first},
            timing=self.timing,
            snapshot_every=self.snapshot_every,
            snapshot_keep=self.snapshot_keep,
            quotas=self.quotas,
            max_version=self.max_version,
            address=address(node),
            join_members=self._join_members.get(node, {}),
            peers_authenticated=self.peers_authenticated,
            partition=self.partition,
            partitions=self.partitions,
        )

    def join(self, node: NodeId, told: dict[NodeId, str]) -> Member:
        """Boots ``node`` as `dlm node start --join` does once the leader added it: on empty
        storage, with the first members as its bootstrap and ``told`` (the members the
        join's answer named) as the members it knows of."""
        self._join_members[node] = dict(told)
        self.ids = (*self.ids, node)
        storage = MemoryStorage(ConfState(voters=self.first))
        member = self.members[node] = self._boot(node, storage)
        return member

    def _boot(
        self, node: NodeId, storage: MemoryStorage, peers: dict[NodeId, str] | None = None
    ) -> Member:
        machine = self.machine_class(
            self.config(node, peers), storage, random.Random(self.rng.random()), self.now()
        )
        member = Member(node, storage, machine)
        if self.peer_version is not None:
            for peer in self.ids:
                if peer != node:
                    machine.peer_version(peer, self.peer_version)
        self.settle(member)
        return member

    def restart(self, node: NodeId, peers: dict[NodeId, str] | None = None) -> Member:
        """A new machine on the member's storage, as after a crash (queued disk work is lost)."""
        member = self.members[node] = self._boot(node, self.members[node].storage, peers)
        return member

    def __getitem__(self, node: NodeId) -> Member:
        return self.members[node]

    @property
    def leader(self) -> Member:
        leaders = [m for m in self.members.values() if m.role is Role.LEADER]
        assert len(leaders) == 1, f"expected one leader, got {[m.id for m in leaders]}"
        return leaders[0]

    # -- time ---------------------------------------------------------------------

    def now(self) -> Instant:
        return Instant(self.mono, WALL_START_MS + round((self.mono - MONO_START) * 1000))

    def advance(self, seconds: float, *, only: Iterable[NodeId] | None = None) -> None:
        """Lets ``seconds`` pass, firing each member's timer when it is due."""
        end = self.mono + seconds
        ticking = [self.members[n] for n in (only or self.ids)]
        for _ in range(MAX_STEPS):
            due = min(m.machine.next_timer() for m in ticking)
            if due > end:
                self.mono = end
                return
            self.mono = max(self.mono, due)
            for member in ticking:
                if member.machine.next_timer() <= self.mono:
                    member.machine.timer(self.now())
                    self.settle(member)
            self.deliver()
        raise AssertionError("time did not advance")

    def run_until(self, done: Callable[[], bool], within: float, what: str) -> None:
        """Advances tick by tick until ``done()``; fails after ``within`` seconds."""
        end = self.mono + within
        while not done():
            if self.mono >= end:
                raise AssertionError(f"{what}: not within {within}s")
            self.advance(self.timing.tick_s)

    def elect(self, node: NodeId = "n1") -> Member:
        """Makes ``node`` the first leader (only its timer runs until it wins), then lets the
        cluster settle: the no-op and, when every member reported version 2, the version
        entry commit everywhere."""
        member = self.members[node]
        for _ in range(MAX_STEPS):
            if member.role is Role.LEADER:
                break
            self.advance(member.machine.next_timer() - self.mono, only=[node])
        assert member.role is Role.LEADER
        self.advance(self.timing.tick_s * 4)
        return member

    # -- actions --------------------------------------------------------------------

    def settle(self, member: Member) -> None:
        """Carries out the member's actions until it has none (and, unless held, no disk work)."""
        for _ in range(MAX_STEPS):
            actions = member.machine.take_actions()
            for action in actions:
                member.order.append(action)
                self._perform(member, action)
            if member.disk and not member.hold_disk:
                self._write_next(member)
                continue
            if not actions:
                return
        raise AssertionError(f"{member.id} did not settle")

    def _perform(self, member: Member, action: Any) -> None:
        if isinstance(action, SendMessages):
            member.sent.extend(action.messages)
            self.in_flight.extend(action.messages)
        elif isinstance(action, SendFrame):
            member.frames.setdefault(action.conn, []).append(action.frame)
        elif isinstance(action, CloseConnection):
            member.closed[action.conn] = action.reason
        elif isinstance(action, Persist):
            member.persists.append(action)
            member.disk.append(action)
        elif isinstance(action, SaveSnapshot):
            member.snapshots.append(action)
            member.disk.append(action)
        elif isinstance(action, LogEvent):
            member.events.append(action)
        elif isinstance(action, Stop):
            member.stops.append(action)
        elif isinstance(action, ExportSpans):
            member.exported.append(action)
        elif isinstance(action, SendBackup):
            member.backups.append(action)
            header = {**action.header, "t": "ok", "id": action.request_id}
            member.frames.setdefault(action.conn, []).append(header)
        else:
            assert isinstance(action, PeersChanged)
            member.peers = dict(action.peers)

    def write_disk(self, node: NodeId, count: int | None = None) -> None:
        """Completes the first ``count`` (default: all) held disk jobs of ``node``, in order."""
        member = self.members[node]
        for _ in range(len(member.disk) if count is None else count):
            self._write_next(member)
            self.settle(member)

    def _write_next(self, member: Member) -> None:
        job = member.disk.popleft()
        self.write(member, job)
        if isinstance(job, Persist):
            member.machine.persisted(job.job, self.now())

    @staticmethod
    def write(member: Member, job: Persist | SaveSnapshot) -> None:
        write_job(member.storage, job)

    # -- the network ------------------------------------------------------------------

    def deliver(self) -> None:
        """Hands every message in flight to its destination (and what that sends, and so on)."""
        for _ in range(MAX_STEPS):
            if not self.in_flight:
                return
            msg = self.in_flight.pop(0)
            self.deliver_one(msg)
        raise AssertionError("the network did not go quiet")

    def deliver_one(self, msg: Message) -> None:
        if self.blocked(msg):
            self.dropped.append(msg)
            return
        member = self.members.get(msg.dst)
        if member is None:
            return
        if self.links_follow_peers and not self._linked(msg.src, member):
            self.dropped.append(msg)
            return
        member.machine.peer_messages(msg.src, (msg,), self.now())
        self.settle(member)

    def _linked(self, src: NodeId, dst: Member) -> bool:
        """Whether the runtime would carry a message from ``src`` to ``dst``: ``src`` keeps a
        link to it, and ``dst`` accepted that link's hello (which names ``src``'s address)."""
        sender = self.members.get(src)
        speaks = self.peer_version or 1
        return (
            sender is not None
            and dst.id in sender.peers
            and dst.machine.accept_peer(src, speaks, address(src)) is None
        )

    # -- clients --------------------------------------------------------------------

    def connect(self, node: NodeId, identity: str = "") -> Client:
        """A client connection to ``node``, authenticated as ``identity`` ("": the admin)."""
        return Client(self, self.members[node], next(self._conns), identity)


class Client:
    """One client connection to one member, sending frames by hand."""

    def __init__(self, cluster: Cluster, member: Member, conn: int, identity: str = "") -> None:
        self.cluster = cluster
        self.member = member
        self.conn = conn
        self.client_id = f"client-{conn}"
        self._ids = itertools.count(1)
        self._seqs = itertools.count(1)
        member.machine.client_connected(conn, f"10.0.0.9:{40000 + conn}", identity)
        member.frames.setdefault(conn, [])

    @property
    def frames(self) -> list[dict[str, Any]]:
        return self.member.frames[self.conn]

    @property
    def pushes(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if "id" not in f and f.get("t") == "grant"]

    @property
    def closed(self) -> bool:
        return self.conn in self.member.closed

    def send_raw(self, obj: Any) -> None:
        self.member.machine.client_frame(self.conn, obj, self.cluster.now())
        self.cluster.settle(self.member)

    def send(self, t: str, **fields: Any) -> int:
        """Sends a request (a state-changing one with this client's id and a fresh seq, unless
        given); returns its id. Nothing is delivered: the test decides when."""
        rid = next(self._ids)
        if t in CHANGES:
            fields.setdefault("client", self.client_id)
            if "seq" not in fields:
                fields["seq"] = next(self._seqs)
            fields.setdefault("acked", 0)
        self.send_raw({"t": t, "id": rid, **fields})
        return rid

    def reply(self, rid: int) -> dict[str, Any] | None:
        answers = [f for f in self.frames if f.get("id") == rid]
        assert len(answers) <= 1, f"request {rid} answered twice: {answers}"
        return answers[0] if answers else None

    def wait(self, rid: int, within: float = 2.0) -> dict[str, Any]:
        """Delivers and lets time pass until request ``rid`` is answered."""
        self.cluster.deliver()
        self.cluster.run_until(lambda: self.reply(rid) is not None, within, f"reply to {rid}")
        answer = self.reply(rid)
        assert answer is not None
        return answer

    def call(self, t: str, **fields: Any) -> dict[str, Any]:
        return self.wait(self.send(t, **fields))

    def close(self) -> None:
        self.member.machine.client_closed(self.conn)
        self.cluster.settle(self.member)
