"""The lock service under the simulator: LockStateMachine replicated by the Raft core.

Clients open leases, take and release exclusive keys and a two-slot
semaphore (waiting in FIFO queues or not), keep their leases alive through
ReadIndex-confirmed keep-alives to the leader, sometimes stop doing so (a
zombie), and re-send a request unchanged (same lease and seq) when its answer
does not come back in time, typically across a leader change. Only the leader
decides that time passed: its ``LeaseTracker``, fed by the simulated tick
clock, proposes ``Expire`` and re-arms every lease with a full TTL when it
takes office.

Checked on every node at every applied index: at most ``limit`` holders per
key; every new grant's fencing token is the index of the entry that granted
it and beats every earlier token of that key on that node. Checked once per
entry: a re-sent acquire never yields a second token; no lease is expired
before the deadline its client counts from its last confirmed keep-alive. The
harness already compares state-machine images (snapshot bytes) at equal
applied indexes and checks every Raft invariant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlm.node.leases import LeaseTracker
from dlm.node.locks import (
    Acquire,
    ApplyOutcome,
    CloseLease,
    Command,
    Expire,
    Granted,
    LeaseClosed,
    LeaseOpened,
    LockStateMachine,
    NotHolder,
    OpenLease,
    Queued,
    Release,
    Released,
    SessionExpired,
    decode_command,
    encode_command,
)
from dlm.node.raft.types import Entry, EntryKind, NodeId, Role

from .checkers import Violation
from .harness import SimNode, SimOptions, Simulation

TICK_MS = 10
LIMITS = {"k0": 1, "k1": 1, "k2": 1, "sem": 2}
CLIENTS = 5
RETRY_TICKS = 40


class LockMachine:
    """The harness's Machine protocol over LockStateMachine."""

    def __init__(self) -> None:
        self.sm = LockStateMachine()

    def apply(self, entry: Entry) -> ApplyOutcome | None:
        if entry.kind is not EntryKind.NORMAL:
            return None
        return self.sm.apply(entry.index, entry.data)

    def snapshot(self) -> bytes:
        return self.sm.snapshot()

    def restore(self, image: bytes) -> None:
        self.sm = LockStateMachine.restore(image)


@dataclass
class Client:
    lease: str
    ttl_ticks: int
    seq: int = 0
    open: bool = False
    holding: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)
    pending: tuple[bytes, int] | None = None  # (payload, tick first sent)
    pending_index: int = 0
    last_sent: int = 0
    deadline: int = 0  # the client's own lease deadline (tick)
    last_keepalive: int = -(10**9)
    zombie_until: int = 0

    def reset(self) -> None:
        self.open = False
        self.holding.clear()
        self.waiting.clear()
        self.deadline = 0


def lock_options(**overrides: object) -> SimOptions:
    # Lock images run to kilobytes; stop-and-wait chunks of 64 bytes would take longer
    # to send than the leader takes to compact past them again.
    options = SimOptions(machine=LockMachine, propose_rate=0.0, read_rate=0.03, chunk_bytes=1024)
    for name, value in overrides.items():
        setattr(options, name, value)
    return options


class LockSimulation(Simulation):
    REPLAY_TEST = "tests/sim/test_lock_sim.py::test_lock_sim"

    def __init__(self, seed: int, options: SimOptions | None = None) -> None:
        self.trackers: dict[NodeId, LeaseTracker] = {}
        self.max_token: dict[NodeId, dict[str, int]] = {}
        super().__init__(seed, options or lock_options())
        rng = self.workload_rng
        self.clients = [
            Client(lease=f"c{i}", ttl_ticks=rng.randint(100, 200)) for i in range(CLIENTS)
        ]
        self.by_lease = {c.lease: c for c in self.clients}
        self.token_of_request: dict[tuple[str, int], int] = {}
        self.applied_high_water = 0
        self.keepalives: dict[bytes, tuple[Client, int]] = {}

    # -- hooks -------------------------------------------------------------------

    def after_restore(self, node: SimNode) -> None:
        machine = node.machine
        assert isinstance(machine, LockMachine)
        self.max_token[node.id] = {
            key: max((h.token for h in state.holders), default=0)
            for key in LIMITS
            if (state := machine.sm.get(key)) is not None
        }
        if node.raft is None:
            self.trackers[node.id] = LeaseTracker(expire_retry=0.5)

    def leader_elected(self, node: SimNode) -> None:
        machine = node.machine
        assert isinstance(machine, LockMachine)
        self.trackers[node.id].take_office(self._seconds(), machine.sm.leases())
        self.trace(f"office{self.now}{node.id}")

    def after_apply(self, node: SimNode, entry: Entry, result: object) -> None:
        if not isinstance(result, ApplyOutcome):
            return
        tracker = self.trackers[node.id]
        now_s = self._seconds()
        for lease, ttl_ms in result.opened:
            tracker.opened(lease, ttl_ms, now_s)
        for lease in (*result.closed, *result.expired):
            tracker.ended(lease)
        self._check_node(node, entry, result)
        if entry.index > self.applied_high_water:
            self.applied_high_water = entry.index
            self._first_application(entry, result)

    def read_served(self, node: SimNode, ctx: bytes, index: int) -> None:
        waiting = self.keepalives.pop(ctx, None)
        if waiting is None:
            return
        client, sent = waiting
        if self.trackers[node.id].renew(client.lease, sent * TICK_MS / 1000):
            client.deadline = max(client.deadline, sent + client.ttl_ticks)
            self.stats["keepalives_confirmed"] += 1

    def after_ticks(self) -> None:
        for node in self.nodes.values():
            tracker = self.trackers[node.id]
            raft = node.raft
            if not tracker.leading:
                continue
            if raft is None or raft.role is not Role.LEADER:
                tracker.leave_office()
                continue
            if node.paused:
                continue
            for lease in tracker.due(self._seconds()):
                self.stats["expire_proposed"] += 1
                self.propose(node, encode_command(Expire(lease, self.now * TICK_MS)))

    # -- checks --------------------------------------------------------------------

    def _check_node(self, node: SimNode, entry: Entry, outcome: ApplyOutcome) -> None:
        machine = node.machine
        assert isinstance(machine, LockMachine)
        tokens = self.max_token.setdefault(node.id, {})
        fresh = [(g.key, g.token) for g in outcome.grants]
        result = outcome.result
        if isinstance(result, Granted) and result.token == entry.index:
            fresh.append((result.key, result.token))
        for key, token in fresh:
            if token != entry.index:
                raise Violation(
                    "fencing-token",
                    f"{node.id} granted {key} with token {token} at index {entry.index}",
                )
            if token <= tokens.get(key, 0):
                raise Violation(
                    "fencing-token",
                    f"{node.id} granted {key} with token {token} after token {tokens[key]}",
                )
            tokens[key] = token
        for key, limit in LIMITS.items():
            state = machine.sm.get(key)
            if state is not None and len(state.holders) > limit:
                holders = [h.lease for h in state.holders]
                raise Violation(
                    "one-holder",
                    f"{node.id} has {holders} holding {key} (limit {limit}) at index {entry.index}",
                )

    def _first_application(self, entry: Entry, outcome: ApplyOutcome) -> None:
        """Client-visible effects, taken once per entry (every node computes the same)."""
        try:
            command: Command | None = decode_command(entry.data) if entry.data else None
        except ValueError:
            command = None
        result = outcome.result
        if isinstance(command, Acquire) and isinstance(result, Granted):
            first = self.token_of_request.setdefault((command.lease, command.seq), result.token)
            if first != result.token:
                raise Violation(
                    "retry-double-grant",
                    f"acquire {command.lease}/{command.seq} of {command.key} granted token "
                    f"{first} and, re-sent, token {result.token}",
                )
        if isinstance(command, Expire):
            client = self.by_lease.get(command.lease)
            if client is not None and client.open and client.deadline > self.now:
                raise Violation(
                    "lease-expired-early",
                    f"lease {command.lease} expired at tick {self.now}, its client counts "
                    f"on it until tick {client.deadline}",
                )
            self.stats["leases_expired"] += 1
        for grant in outcome.grants:
            waiter = self.by_lease.get(grant.lease)
            if waiter is not None:
                waiter.waiting.discard(grant.key)
                waiter.holding.add(grant.key)
                self.stats["waiter_grants"] += 1
        for lease in (*outcome.closed, *outcome.expired):
            gone = self.by_lease.get(lease)
            if gone is not None:
                gone.reset()
        for client in self.clients:
            if client.pending is not None and client.pending[0] == entry.data:
                self._answer(client, result)

    def _answer(self, client: Client, result: object) -> None:
        assert client.pending is not None
        sent = client.pending[1]
        client.pending = None
        if isinstance(result, LeaseOpened):
            client.open = True
            client.deadline = sent + client.ttl_ticks
        elif isinstance(result, Granted):
            client.waiting.discard(result.key)
            client.holding.add(result.key)
            self.stats["grants"] += 1
        elif isinstance(result, Queued):
            client.waiting.add(result.key)
        elif isinstance(result, Released | NotHolder):
            client.holding.discard(result.key)
            client.waiting.discard(result.key)
        elif isinstance(result, SessionExpired | LeaseClosed):
            client.reset()

    # -- workload --------------------------------------------------------------------

    def _seconds(self) -> float:
        return self.now * TICK_MS / 1000

    def _send_request(self, client: Client, payload: bytes) -> None:
        target = self.leader() or self.client_target()
        client.last_sent = self.now
        if target is None:
            return
        index = self.propose(target, payload)
        if index is not None:
            client.pending_index = index

    def workload(self) -> None:
        super().workload()  # reads only: lock_options() turns plain proposals off
        rng = self.workload_rng
        now = self.now
        for client in self.clients:
            if client.open and now >= client.zombie_until:
                if rng.random() < 0.002:
                    client.zombie_until = now + rng.randint(100, 400)
                elif now - client.last_keepalive >= client.ttl_ticks // 4:
                    self._keepalive(client)
            if client.pending is not None:
                if now - client.last_sent >= RETRY_TICKS:
                    self.stats["retries"] += 1
                    self._send_request(client, client.pending[0])
                continue
            if rng.random() >= 0.1:
                continue
            command = self._next_command(client)
            payload = encode_command(command)
            client.pending = (payload, now)
            self._send_request(client, payload)

    def _next_command(self, client: Client) -> Command:
        rng = self.workload_rng
        at_ms = self.now * TICK_MS
        if not client.open:
            return OpenLease(client.lease, client.ttl_ticks * TICK_MS, at_ms)
        client.seq += 1
        if client.holding and rng.random() < 0.5:
            key = rng.choice(sorted(client.holding))
            return Release(client.lease, client.seq, key, at_ms)
        if rng.random() < 0.02:
            return CloseLease(client.lease, client.seq, at_ms)
        key = rng.choice(sorted(LIMITS))
        return Acquire(client.lease, client.seq, key, rng.random() < 0.6, LIMITS[key], {}, at_ms)

    def _keepalive(self, client: Client) -> None:
        leader = self.leader()
        client.last_keepalive = self.now
        if leader is None or leader.raft is None:
            return
        self._counter += 1
        ctx = b"ka%d" % self._counter
        self.keepalives[ctx] = (client, self.now)
        self.checker.read_started(ctx)
        leader.raft.read_index(ctx)
        self.drain(leader)
