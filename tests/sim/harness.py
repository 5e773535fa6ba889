"""The deterministic simulator: Raft nodes, a fake clock, a hostile network, slow disks, one seed.

Theory of operation
-------------------
Time is an integer tick. Each tick the simulation, in this fixed order:
starts and ends the faults scheduled for the tick, carries out membership
actions that came due (start a member whose addition committed, stop one
whose removal did), lets the workload make its requests, completes the disk
writes due by now, ticks every running node (sorted by id), and delivers
every message due at the tick. After each of those events it drains the
node's Ready batches as a pipelining runtime may: send ``messages_now`` at
once, install a snapshot's image, apply committed entries and serve reads
(none of which needs this node's disk), and queue the Ready on the node's
disk; when the disk completes it (in order, after a delay drawn from the
seed, or never if the node crashes first) persist snapshot, entries and hard
state, then send ``messages``, then advance. An ``fsync_stall``
fault stops one node's disk for longer than an election timeout. What the
harness sees is fed to the ``SafetyChecker``. Every random choice comes from
generators derived from the seed, so a seed replays the same run, and the
ordered event log hashes to the same ``trace_hash``.

Membership: the workload adds learners (a new, empty node, started once its
addition commits), promotes caught-up learners, and removes voters (the leader
too) and learners, keeping between ``min_voters`` and ``max_members``. A
removed node runs on for a few ticks, to show it stays quiet, then stops for
good. Every node, including later ones, boots with the bootstrap voters.

At ``ticks - quiet_ticks`` every fault heals; within ten election timeouts a
leader must appear and commit a probe command, and by the end every member
must have applied it.
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from dlm.node.raft.core import Config, RaftNode
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.types import (
    ConfChangeRefused,
    Message,
    NotLeader,
    Ready,
    Role,
    VoteRequest,
    VoteResponse,
)
from dlm.records import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    NodeId,
    Storage,
    decode_conf_change,
)
from dlm.store.disk import DiskStorage
from dlm.store.fs import CrashableFS, CrashMode, SimulatedCrash, Tear

from .checkers import LogReader, SafetyChecker, Violation
from .faults import DEFAULT_WEIGHTS, FaultSpec, draw_schedule
from .machines import DigestMachine, Machine
from .network import LinkConditions, SimNetwork

NODE_NAMES = ("n1", "n2", "n3", "n4", "n5")


class StorageBackend(Protocol):
    """Makes each node's store and decides what of it survives a crash."""

    def fresh(self, node: NodeId) -> Storage: ...

    def after_crash(self, node: NodeId, storage: Storage) -> Storage: ...

    def arm_crash(self, node: NodeId, rng: random.Random) -> bool:
        """Make one of the node's next few writes its last; False if unsupported."""
        ...

    def disarm(self, node: NodeId) -> None: ...

    def close(self) -> None: ...


BackendFactory = Callable[[tuple[NodeId, ...], random.Random], StorageBackend]


class MemoryBackend:
    """Every call on MemoryStorage is durable when it returns, so a crash keeps it all.

    The restarted node gets a deep copy, so nothing the dead core might still
    reference can leak into the new one.
    """

    def __init__(self, voters: tuple[NodeId, ...], rng: random.Random) -> None:
        self._conf = ConfState(voters=voters)

    def fresh(self, node: NodeId) -> Storage:
        return MemoryStorage(self._conf)

    def after_crash(self, node: NodeId, storage: Storage) -> Storage:
        return copy.deepcopy(storage)

    def arm_crash(self, node: NodeId, rng: random.Random) -> bool:
        return False

    def disarm(self, node: NodeId) -> None:
        pass

    def close(self) -> None:
        pass


class DiskBackend:
    """Real ``DiskStorage`` files on one ``CrashableFS`` per node.

    A crash is a power loss: only fsynced bytes and fsynced directory entries
    survive, and with TORN a random part of the unsynced tail comes back too,
    sometimes followed by garbage. ``arm_crash`` makes the crash land in the
    middle of one of the node's next writes (whole, cut short, or followed by
    garbage), before the Ready that caused it could send anything.
    """

    ROOT = "/data"

    def __init__(self, voters: tuple[NodeId, ...], rng: random.Random) -> None:
        self._conf = ConfState(voters=voters)
        self._rng = rng
        self._fs: dict[NodeId, CrashableFS] = {}

    def _open(self, node: NodeId) -> Storage:
        return DiskStorage.open(
            self.ROOT, fs=self._fs[node], segment_bytes=4096, bootstrap_conf=self._conf
        )

    def fresh(self, node: NodeId) -> Storage:
        self._fs[node] = CrashableFS(random.Random(self._rng.getrandbits(64)))
        return self._open(node)

    def after_crash(self, node: NodeId, storage: Storage) -> Storage:
        fs = self._fs[node]
        fs.crash(self._rng.choice((CrashMode.POWER_LOSS, CrashMode.TORN)))
        return self._open(node)

    def arm_crash(self, node: NodeId, rng: random.Random) -> bool:
        fs = self._fs[node]
        fs.arm(fs.ops + rng.randint(0, 8), rng.choice(list(Tear)))
        return True

    def disarm(self, node: NodeId) -> None:
        self._fs[node].disarm()

    def close(self) -> None:
        pass


@dataclass
class SimOptions:
    nodes: int | None = None  # None: 3 or 5, drawn from the seed
    ticks: int = 2000
    quiet_ticks: int = 250
    election_ticks: int = 10
    liveness_timeouts: int = 10
    snapshot_every: int = 40
    snapshot_keep: int = 8
    chunk_bytes: int = 64
    propose_rate: float = 0.3
    read_rate: float = 0.08
    transfer_rate: float = 0.004
    fault_count: tuple[int, int] = (12, 18)
    fault_weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    lagging_follower: bool = True
    schedule: list[FaultSpec] | None = None  # an explicit schedule instead of a drawn one
    disk_delay_rate: float | None = None  # share of writes that take 1..disk_max_delay ticks
    disk_max_delay: int = 3  # (None: the rate is drawn from the seed, sometimes 0)
    member_rate: float = 0.01  # chance per tick that the workload asks for a membership change
    min_voters: int = 3
    max_members: int = 5  # voters and learners together
    max_added: int = 6  # new members over the whole run
    stop_removed: bool = True  # stop a member (a little) after its removal commits
    node_class: type[RaftNode] = RaftNode
    backend: BackendFactory = MemoryBackend
    machine: Callable[[], Machine] = DigestMachine
    check_liveness: bool = True
    check_restart_promises: bool = True  # off: let a forgotten vote show up as a double vote


class SimFailure(AssertionError):
    """A violation, with the seed and tick that produced it and how to replay it."""

    def __init__(self, seed: int, tick: int, violation: Violation, test: str) -> None:
        self.seed = seed
        self.tick = tick
        self.violation = violation
        super().__init__(
            f"seed {seed}, tick {tick}: {violation}\n"
            f"replay: .venv/bin/python -m pytest {test} --sim-seeds={seed}:1"
        )


@dataclass
class SimResult:
    seed: int
    nodes: int
    ticks: int
    trace_hash: str
    faults: Counter[str]
    stats: Counter[str]


class SimNode:
    def __init__(self, node_id: NodeId, storage: Storage, machine: Machine) -> None:
        self.id = node_id
        self.storage = storage
        self.machine = machine
        self.raft: RaftNode | None = None
        self.applied = 0
        self.paused = False
        self.pause_drops = False
        self.retired = False  # removed from the cluster and stopped for good
        self.held: list[Message] = []
        # Readys on their way to the disk, oldest first, with the tick each write completes.
        self.disk: deque[tuple[int, Ready]] = deque()
        self.disk_stalled = False
        self.snapshot_due: tuple[int, bytes] | None = None
        self.acked_hard_state = HardState()  # the last set_hard_state that returned
        self.promised_term = 0  # the highest term this node ever put on a message
        self.checked_role: tuple[int, bool] | None = None  # (term, leader) the checker last saw
        self.image_index = 0  # the index of the last snapshot the machine was rebuilt from

    @property
    def live(self) -> bool:
        return self.raft is not None and not self.paused


class Simulation:
    REPLAY_TEST = "tests/sim/test_raft_sim.py::test_raft_sim"

    def __init__(self, seed: int, options: SimOptions | None = None) -> None:
        self.seed = seed
        self.options = opts = options or SimOptions()
        root = random.Random(seed)
        self.fault_rng = random.Random(root.getrandbits(64))
        self.workload_rng = random.Random(root.getrandbits(64))
        self.node_rng = random.Random(root.getrandbits(64))
        net_rng = random.Random(root.getrandbits(64))
        count = opts.nodes if opts.nodes is not None else root.choice((3, 3, 5))
        self.ids: tuple[NodeId, ...] = NODE_NAMES[:count]
        base = LinkConditions(
            drop=root.choice((0.0, 0.01, 0.03)),
            duplicate=root.choice((0.0, 0.01, 0.02)),
            min_delay=1,
            max_delay=root.choice((1, 2, 3, 4)),
        )
        self.net = SimNetwork(net_rng, base)
        self.checker = SafetyChecker()
        self.heal_tick = opts.ticks - opts.quiet_ticks
        if opts.schedule is not None:
            self.schedule = list(opts.schedule)
        else:
            self.schedule = draw_schedule(
                self.fault_rng,
                first_tick=opts.election_ticks * 3,
                heal_tick=self.heal_tick,
                count=opts.fault_count,
                weights=opts.fault_weights,
                lagging_follower=opts.lagging_follower,
            )
        self.backend = opts.backend(self.ids, random.Random(root.getrandbits(64)))
        self.disk_rng = random.Random(root.getrandbits(64))
        self.member_rng = random.Random(root.getrandbits(64))
        self.disk_delay_rate = (
            opts.disk_delay_rate
            if opts.disk_delay_rate is not None
            else self.disk_rng.choice((0.0, 0.2, 0.5, 0.9))
        )
        self.nodes: dict[NodeId, SimNode] = {}
        for node_id in self.ids:
            self._add_node(node_id)
        self._added = 0
        # (tick, sequence, what, node): membership steps the runtime takes once a change commits.
        self._member_actions: list[tuple[int, int, str, NodeId]] = []
        self._member_seq = 0
        self._conf_seen: set[int] = set()
        self.now = 0
        self._trace = hashlib.blake2b(digest_size=16)
        self.stats: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self._undo: list[tuple[int, int, Callable[[], None]]] = []
        self._undo_seq = 0
        self._next_fault = 0
        self._client_hint: NodeId | None = None
        self._counter = 0
        self._probe: tuple[NodeId, int, bytes] | None = None
        self._probe_done = False
        self._probe_index = 0

    # -- plumbing -------------------------------------------------------------

    def config(self, node_id: NodeId) -> Config:
        opts = self.options
        return Config(
            id=node_id,
            voters=self.ids,
            election_ticks=opts.election_ticks,
            heartbeat_ticks=1,
            snapshot_chunk_bytes=opts.chunk_bytes,
        )

    def _add_node(self, node_id: NodeId) -> SimNode:
        node = SimNode(node_id, self.backend.fresh(node_id), self.options.machine())
        self.nodes[node_id] = node
        self._boot(node)
        return node

    def _boot(self, node: SimNode) -> RaftNode:
        node.acked_hard_state = node.storage.initial_state()[0]
        snap = node.storage.snapshot()
        if snap is not None:
            node.machine.restore(snap.data)
            node.applied = node.image_index = snap.meta.index
        else:
            node.applied = node.image_index = 0
        self.after_restore(node)
        rng = random.Random(self.node_rng.getrandbits(64))
        node.raft = raft = self.options.node_class(self.config(node.id), node.storage, rng)
        node.checked_role = None
        return raft

    def trace(self, record: str) -> None:
        self._trace.update(record.encode())

    def leader(self) -> SimNode | None:
        """The running, unpaused leader with the highest term, if any."""
        best: SimNode | None = None
        best_term = -1
        for node in self.nodes.values():
            raft = node.raft
            if (
                raft is not None
                and not node.paused
                and raft.role is Role.LEADER
                and raft.term > best_term
            ):
                best, best_term = node, raft.term
        return best

    def live_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.live]

    def members(self) -> list[SimNode]:
        """Every node not removed for good, running or crashed."""
        return [n for n in self.nodes.values() if not n.retired]

    def member_ids(self) -> list[NodeId]:
        return [n.id for n in self.nodes.values() if not n.retired]

    # -- the runtime loop of one node -------------------------------------------

    def drain(self, node: SimNode) -> None:
        """Work off every Ready of ``node``; a crash armed in its store may cut this short."""
        try:
            self._drain(node)
        except SimulatedCrash:
            self.stats["crashes_mid_write"] += 1
            self.crash(node)
            return
        self._check(node)

    def _drain(self, node: SimNode) -> None:
        raft = node.raft
        assert raft is not None
        disk = node.disk
        now = self.now
        for _ in range(256):
            if raft.has_ready():
                ready = raft.ready()
                for message in ready.messages_now:
                    self._send(node, message)
                if ready.snapshot is not None or ready.committed or ready.read_states:
                    self._use(node, ready)
                delay = self._write_delay(ready) if self.disk_delay_rate else 0
                if not disk and not delay and not node.disk_stalled:
                    self._complete(node, ready)  # the common case: a write that is done at once
                    continue
                due = now + delay
                if disk:
                    due = max(due, disk[-1][0])  # the disk writes in order
                disk.append((due, ready))
            elif not (disk and disk[0][0] <= now and not node.disk_stalled):
                return
            while disk and disk[0][0] <= now and not node.disk_stalled:
                self._complete(node, disk.popleft()[1])
        raise Violation("ready-loop", f"{node.id} produced 256 Ready batches in one event")

    def _write_delay(self, ready: Ready) -> int:
        if not self.disk_delay_rate or not ready.must_persist():
            return 0
        if self.disk_rng.random() < self.disk_delay_rate:
            self.stats["slow_writes"] += 1
            return self.disk_rng.randint(1, self.options.disk_max_delay)
        return 0

    def _use(self, node: SimNode, ready: Ready) -> None:
        """What needs no local durability, done as the Ready is taken: a snapshot's image,
        committed entries (a quorum holds them) and confirmed reads."""
        if ready.snapshot is not None:
            snap = ready.snapshot
            node.machine.restore(snap.data)
            node.applied = node.image_index = snap.meta.index
            self.checker.observe_image(node.id, snap.meta.index, snap.data)
            self.after_restore(node)
            self.stats["snapshot_installs"] += 1
            self.trace(f"S{self.now}{node.id}{snap.meta.index}")
        for entry in ready.committed:
            self._apply(node, entry)
        for read in ready.read_states:
            self.checker.observe_read_state(node.id, read.ctx, read.index)
            self.stats["reads_served"] += 1
            self.read_served(node, read.ctx, read.index)

    def _complete(self, node: SimNode, ready: Ready) -> None:
        """The disk finished writing ``ready``: what a runtime does after its fsync returns."""
        raft = node.raft
        assert raft is not None
        self._persist(node, ready)
        for message in ready.messages:
            self._send(node, message)
        raft.advance(ready)
        if node.snapshot_due is not None and not node.disk:
            # Only once every write handed out is done: a committed entry may still be
            # on its way to the disk, over a stale entry at the same index.
            self._take_snapshot(node)

    def complete_writes(self, node: SimNode) -> None:
        """Finish the writes of ``node`` due by now (and whatever work they lead to)."""
        if node.raft is None or node.paused or node.disk_stalled:
            return
        if node.disk and node.disk[0][0] <= self.now:
            self.drain(node)

    def _persist(self, node: SimNode, ready: Ready) -> None:
        storage = node.storage
        if ready.snapshot is not None:
            storage.apply_snapshot(ready.snapshot)
        if ready.entries:
            first = ready.entries[0].index
            prev_term = storage.term(first - 1)
            storage.append(ready.entries)
            self.checker.observe_persisted(node.id, ready.entries, prev_term)
        if ready.hard_state is not None:
            storage.set_hard_state(ready.hard_state)
            node.acked_hard_state = ready.hard_state

    def _send(self, node: SimNode, message: Message) -> None:
        kind = type(message)
        if kind is VoteRequest or kind is VoteResponse:
            # A pre-vote names the term it would use without entering it.
            if not message.pre_vote:  # type: ignore[union-attr]
                node.promised_term = max(node.promised_term, message.term)
                if kind is VoteResponse and message.granted:  # type: ignore[union-attr]
                    self.checker.observe_vote_granted(message.src, message.term, message.dst)
        elif message.term > node.promised_term:
            node.promised_term = message.term
        self.net.send(message, self.now)

    def _apply(self, node: SimNode, entry: Entry) -> None:
        if entry.index <= node.image_index and entry.index <= node.applied:
            # The core restarts with applied at its compaction point, which may lie
            # below the snapshot the state machine was rebuilt from: these entries
            # are already in the image (a real runtime skips them the same way).
            self.checker.observe_apply(node.id, entry)
            self.stats["reapplied_skipped"] += 1
            return
        if entry.index != node.applied + 1:
            raise Violation(
                "apply-order", f"{node.id} applied index {entry.index} after {node.applied}"
            )
        self.checker.observe_apply(node.id, entry)
        if entry.kind is EntryKind.CONF_CHANGE:
            self._conf_change_committed(entry)
        result = node.machine.apply(entry)
        node.applied = entry.index
        self.after_apply(node, entry, result)
        if self._probe is not None and entry.data == self._probe[2] and not self._probe_done:
            self._probe_done = True
            self._probe_index = entry.index
        every = self.options.snapshot_every
        if every and entry.index % every == 0:
            image = node.machine.snapshot()
            self.checker.observe_image(node.id, entry.index, image)
            node.snapshot_due = (entry.index, image)

    def _take_snapshot(self, node: SimNode) -> None:
        assert node.snapshot_due is not None
        index, image = node.snapshot_due
        node.snapshot_due = None
        storage = node.storage
        existing = storage.snapshot()
        if existing is not None and existing.meta.index >= index:
            return
        assert node.raft is not None
        storage.create_snapshot(index, node.raft.conf_state_at(index), image)
        keep_from = index - self.options.snapshot_keep
        if keep_from >= storage.first_index():
            storage.compact(keep_from)
        self.stats["snapshots_taken"] += 1

    def _check(self, node: SimNode) -> None:
        raft = node.raft
        if raft is None:
            return  # it stopped (a removal took effect) while draining
        term = raft.term
        checker = self.checker
        role = (term, raft.role is Role.LEADER)
        if role != node.checked_role and checker.observe_role(node.id, term, role[1]):
            self.stats["elections"] += 1
            self.trace(f"L{self.now}{node.id}{term}")
            checker.check_leader_completeness(node.id, term, memory_log(raft))
            self.leader_elected(node)
        commit = raft.commit_index
        if commit > checker.commit_high_water and checker.observe_commit(
            node.id, term, commit, memory_log(raft)
        ):
            for other in self.nodes.values():
                o = other.raft
                if o is not None and o.role is Role.LEADER and o.term > term:
                    checker.check_leader_completeness(other.id, o.term, memory_log(o))
        node.checked_role = role

    # -- hooks for richer workloads (the lock simulation overrides these) ----------

    def after_apply(self, node: SimNode, entry: Entry, result: object) -> None:
        """``node`` applied ``entry``, and its state machine answered ``result``."""

    def after_restore(self, node: SimNode) -> None:
        """``node``'s state machine was just rebuilt from a snapshot (or from nothing)."""

    def leader_elected(self, node: SimNode) -> None:
        """``node`` became the first (and only) leader of its current term."""

    def read_served(self, node: SimNode, ctx: bytes, index: int) -> None:
        """A ReadIndex request ``ctx`` that ``node`` took was confirmed at ``index``."""

    def after_ticks(self) -> None:
        """Every running node has ticked; time-driven runtime work goes here."""

    # -- crash, restart, pause ------------------------------------------------------

    def crash(self, node: SimNode) -> None:
        if node.raft is None:
            return
        acked = node.acked_hard_state
        self.checker.observe_crash(node.id, acked.term, acked.vote)
        node.raft = None
        node.paused = False
        node.held.clear()
        node.disk.clear()  # writes not yet complete are lost
        node.snapshot_due = None
        node.storage = self.backend.after_crash(node.id, node.storage)
        node.machine = self.options.machine()
        self.stats["crashes"] += 1
        self.trace(f"C{self.now}{node.id}")

    def restart(self, node: SimNode) -> None:
        if node.raft is not None or node.retired:
            return
        raft = self._boot(node)
        recovered = node.storage.initial_state()[0]
        self.checker.observe_hard_state(node.id, recovered.term, recovered.vote)
        if self.options.check_restart_promises:
            status = raft.status()
            self.checker.check_promises(node.id, status.term, status.vote, node.promised_term)
        self.stats["restarts"] += 1
        self.trace(f"R{self.now}{node.id}")
        self.drain(node)

    def pause(self, node: SimNode, drop: bool) -> None:
        node.paused = True
        node.pause_drops = drop
        self.trace(f"P{self.now}{node.id}")

    def resume(self, node: SimNode) -> None:
        if not node.paused:
            return
        node.paused = False
        for message in node.held:
            self.net.resend(message, self.now + 1)
        node.held.clear()
        self.trace(f"U{self.now}{node.id}")

    # -- faults -----------------------------------------------------------------

    def _later(self, tick: int, undo: Callable[[], None]) -> None:
        self._undo_seq += 1
        self._undo.append((tick, self._undo_seq, undo))

    def _pick(self, candidates: list[SimNode]) -> SimNode | None:
        return self.fault_rng.choice(candidates) if candidates else None

    def start_fault(self, spec: FaultSpec) -> None:
        rng = self.fault_rng
        net = self.net
        kind = spec.kind
        ids = self.member_ids()
        self.faults[kind] += 1
        target: SimNode | None = None
        if kind == "partition":
            rng.shuffle(ids)
            k = rng.randint(1, len(ids) // 2)
            side_a, side_b = ids[:k], ids[k:]
            links = [(a, b) for a in side_a for b in side_b] + [
                (b, a) for a in side_a for b in side_b
            ]
            net.cut(links)
            self._later(spec.end, lambda: net.mend(links))
            self.trace(f"F{self.now}{kind}{side_a}")
            return
        if kind == "one_way":
            rng.shuffle(ids)
            senders = ids[: rng.randint(1, 2)]
            receivers = [i for i in ids if i not in senders]
            receivers = rng.sample(receivers, rng.randint(1, len(receivers)))
            links = [(s, r) for s in senders for r in receivers]
            net.cut(links)
            self._later(spec.end, lambda: net.mend(links))
            self.trace(f"F{self.now}{kind}{links}")
            return
        if kind in ("isolate_leader", "lag_follower"):
            leader = self.leader()
            if kind == "isolate_leader":
                target = leader or self._pick(self.members())
            else:
                target = self._pick([n for n in self.members() if n is not leader])
            assert target is not None
            victim = target.id
            links = [(victim, o) for o in ids if o != victim] + [
                (o, victim) for o in ids if o != victim
            ]
            net.cut(links)
            self._later(spec.end, lambda: net.mend(links))
            self.trace(f"F{self.now}{kind}{victim}")
            return
        if kind.startswith("fsync_stall"):
            # The leader's disk (it must keep its office on its followers' copies) or a
            # follower's (it must not campaign while its acknowledgements wait). A scripted
            # schedule may name which: fsync_stall_leader, fsync_stall_follower.
            leader = self.leader()
            running = [n for n in self.members() if n.raft is not None]
            on_leader = rng.random() < 0.5
            if kind != "fsync_stall":
                on_leader = kind == "fsync_stall_leader"
            if leader is not None and on_leader:
                target = leader
            else:
                target = self._pick([n for n in running if n is not leader])
            if target is None:
                return
            stalled = target
            stalled.disk_stalled = True

            def unstall() -> None:
                stalled.disk_stalled = False

            self._later(spec.end, unstall)
            self.trace(f"F{self.now}{kind}{stalled.id}")
            return
        if kind in ("crash", "crash_leader"):
            running = [n for n in self.members() if n.raft is not None]
            target = self.leader() if kind == "crash_leader" else None
            target = target or self._pick(running)
            if target is None:
                return
            down = target
            if rng.random() < 0.5 and self.backend.arm_crash(down.id, rng):
                # The crash lands inside one of the node's next writes instead.
                self.faults["crash_mid_write"] += 1
                self.trace(f"A{self.now}{down.id}")

                def disarm_and_restart() -> None:
                    self.backend.disarm(down.id)
                    self.restart(down)

                self._later(spec.end, disarm_and_restart)
                return
            self.crash(down)
            self._later(spec.end, lambda: self.restart(down))
            return
        if kind == "pause":
            target = self._pick(self.live_nodes())
            if target is None:
                return
            self.pause(target, drop=rng.random() < 0.5)
            held = target
            self._later(spec.end, lambda: self.resume(held))
            return
        if kind == "lossy":
            extra = rng.choice((0.1, 0.2, 0.3, 0.5))
            net.extra_drop += extra

            def undo_drop() -> None:
                net.extra_drop -= extra

            self._later(spec.end, undo_drop)
        elif kind == "duplicate":
            extra = rng.choice((0.1, 0.2, 0.4))
            net.extra_duplicate += extra

            def undo_dup() -> None:
                net.extra_duplicate -= extra

            self._later(spec.end, undo_dup)
        elif kind == "reorder":
            spread = rng.randint(3, 12)
            net.extra_delay += spread

            def undo_delay() -> None:
                net.extra_delay -= spread

            self._later(spec.end, undo_delay)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        self.trace(f"F{self.now}{kind}")

    def _run_faults(self) -> None:
        now = self.now
        if self._undo:
            due = sorted(u for u in self._undo if u[0] <= now)
            if due:
                self._undo = [u for u in self._undo if u[0] > now]
                for _, _, undo in due:
                    undo()
        while (
            self._next_fault < len(self.schedule) and self.schedule[self._next_fault].start <= now
        ):
            self.start_fault(self.schedule[self._next_fault])
            self._next_fault += 1

    def heal(self) -> None:
        """End every fault at once: the start of the quiet phase."""
        for _, _, undo in sorted(self._undo):
            undo()
        self._undo.clear()
        self._next_fault = len(self.schedule)
        self.net.mend_all()
        self.net.calm()
        for node in self.nodes.values():
            node.disk_stalled = False
            self.resume(node)
            self.restart(node)
        self.trace(f"H{self.now}")

    # -- workload ---------------------------------------------------------------

    def client_target(self) -> SimNode | None:
        hint = self._client_hint
        if hint is not None and self.nodes[hint].live:
            return self.nodes[hint]
        live = self.live_nodes()
        return self.workload_rng.choice(live) if live else None

    def propose(self, node: SimNode, data: bytes) -> int | None:
        """Propose at ``node``; None if it is not leader (or died persisting the entry)."""
        if node.raft is None:
            return None
        result = node.raft.propose(data)
        if isinstance(result, NotLeader):
            self._client_hint = result.leader
            self.trace(f"p{self.now}{node.id}-")
            return None
        self._client_hint = node.id
        self.stats["proposals"] += 1
        self.trace(f"p{self.now}{node.id}{result}")
        self.drain(node)
        return result

    def workload(self) -> None:
        rng = self.workload_rng
        opts = self.options
        if rng.random() < opts.propose_rate:
            target = self.client_target()
            if target is not None:
                for _ in range(rng.choice((1, 1, 1, 2, 4))):
                    self._counter += 1
                    if self.propose(target, b"w%d" % self._counter) is None:
                        break
        if rng.random() < opts.read_rate:
            target = self.client_target()
            if target is not None and target.raft is not None:
                self._counter += 1
                ctx = b"r%d" % self._counter
                self.checker.read_started(ctx)
                if isinstance(target.raft.read_index(ctx), NotLeader):
                    self.checker.read_floor.pop(ctx, None)
                else:
                    self.stats["reads"] += 1
                self.drain(target)
        if self.now < self.heal_tick and rng.random() < opts.transfer_rate:
            leader = self.leader()
            if leader is not None and leader.raft is not None:
                others = [i for i in leader.raft.voters if i != leader.id]
                if others:
                    to = rng.choice(others)
                    leader.raft.transfer_leadership(to)
                    self.stats["transfers"] += 1
                    self.trace(f"T{self.now}{leader.id}{to}")
                    self.drain(leader)
        if self.now < self.heal_tick and rng.random() < opts.member_rate:
            self.change_membership()

    # -- membership ---------------------------------------------------------------

    def change_membership(self) -> None:
        """Ask the leader for one change that keeps the cluster within its bounds."""
        leader = self.leader()
        if leader is None or leader.raft is None:
            return
        raft = leader.raft
        opts = self.options
        rng = self.member_rng
        conf = raft.conf_state
        progress = raft.status().progress
        choices: list[ConfChange] = []
        for learner in conf.learners:
            pr = progress.get(learner)
            if pr is not None and pr.match >= raft.commit_index:
                choices.append(ConfChange(ConfChangeKind.PROMOTE, learner))
            choices.append(ConfChange(ConfChangeKind.REMOVE, learner))
        members = len(conf.voters) + len(conf.learners)
        if members < opts.max_members and self._added < opts.max_added:
            name = f"n{len(self.ids) + self._added + 1}"
            choices.append(ConfChange(ConfChangeKind.ADD_LEARNER, name, name.encode()))
        if len(conf.voters) > opts.min_voters:
            choices.extend(ConfChange(ConfChangeKind.REMOVE, v) for v in conf.voters)
            choices.append(ConfChange(ConfChangeKind.REMOVE, leader.id))  # the leader, more often
        if not choices:
            return
        change = rng.choice(choices)
        result = self.propose_conf_change(leader, change)
        if isinstance(result, int):
            self.stats[f"conf_{change.kind.name.lower()}"] += 1
            if change.kind is ConfChangeKind.ADD_LEARNER:
                self._added += 1  # its name is taken, whether or not the change commits
        else:
            self.stats["conf_refused"] += 1

    def propose_conf_change(
        self, node: SimNode, change: ConfChange
    ) -> int | NotLeader | ConfChangeRefused:
        assert node.raft is not None
        result = node.raft.propose_conf_change(change)
        self.trace(f"M{self.now}{node.id}{change.kind.name}{change.node}{result}")
        self.drain(node)
        return result

    def _conf_change_committed(self, entry: Entry) -> None:
        """A node applied a CONF_CHANGE entry: the change is committed; act on it once."""
        if entry.index in self._conf_seen:
            return
        self._conf_seen.add(entry.index)
        change = decode_conf_change(entry.data)
        if change.kind is ConfChangeKind.ADD_LEARNER:
            self._member_action(self.now + 1, "start", change.node)
        elif change.kind is ConfChangeKind.REMOVE and self.options.stop_removed:
            # Let it run a little: a removed member must stay quiet on its own.
            delay = self.member_rng.randint(1, 2 * self.options.election_ticks)
            self._member_action(self.now + delay, "stop", change.node)

    def _member_action(self, tick: int, what: str, node: NodeId) -> None:
        self._member_seq += 1
        self._member_actions.append((tick, self._member_seq, what, node))

    def _run_member_actions(self) -> None:
        if not self._member_actions:
            return
        due = sorted(a for a in self._member_actions if a[0] <= self.now)
        if not due:
            return
        self._member_actions = [a for a in self._member_actions if a[0] > self.now]
        for _, _, what, node_id in due:
            node = self.nodes.get(node_id)
            if what == "start":
                if node is None:
                    self._add_node(node_id)
                    self.stats["members_started"] += 1
                    self.trace(f"J{self.now}{node_id}")
            elif node is not None and not node.retired:
                if node.raft is not None and node.raft.removed:
                    self.stats["removal_noticed"] += 1
                self.crash(node)
                node.retired = True
                self.stats["members_stopped"] += 1
                self.trace(f"X{self.now}{node_id}")

    def _liveness(self) -> None:
        if self._probe_done:
            return
        leader = self.leader()
        if leader is not None and (self._probe is None or self._probe[0] != leader.id):
            data = b"probe%d" % self.seed
            index = self.propose(leader, data)
            if index is not None:
                self._probe = (leader.id, index, data)
        deadline = self.heal_tick + self.options.liveness_timeouts * self.options.election_ticks
        if not self._probe_done and self.now >= deadline:
            raise Violation(
                "liveness",
                f"no leader committed a proposal within {deadline - self.heal_tick} ticks "
                f"after the faults healed (leader now: {leader.id if leader else None})",
            )

    # -- the clock ------------------------------------------------------------

    def step(self) -> None:
        """Run one tick."""
        now = self.now
        if now == self.heal_tick:
            self.heal()
        elif now < self.heal_tick:
            self._run_faults()
        self._run_member_actions()
        self.workload()
        if now >= self.heal_tick and self.options.check_liveness:
            self._liveness()
        for node in self.nodes.values():
            if node.disk:
                self.complete_writes(node)
        for node in self.nodes.values():
            if node.raft is not None and not node.paused:
                node.raft.tick()
                self.drain(node)
        self.after_ticks()
        delivered: list[tuple[NodeId, NodeId, str, int]] = []
        nodes = self.nodes
        for message in self.net.due(now):
            dst = nodes.get(message.dst)
            if dst is None or dst.raft is None:
                self.stats["to_down_node"] += 1
                continue
            if dst.paused:
                if not dst.pause_drops:
                    dst.held.append(message)
                continue
            delivered.append((message.src, message.dst, type(message).__name__, message.term))
            dst.raft.step(message)
            self.drain(dst)
        if delivered:
            # One record per tick: formatting each message alone costs more than the rest.
            self.trace(f"{now}{delivered!r}")
            self.stats["delivered"] += len(delivered)
        self.now = now + 1

    def ticks(self) -> Iterator[int]:
        while self.now < self.options.ticks:
            yield self.now
            self.step()

    def run(self) -> SimResult:
        try:
            for _ in self.ticks():
                pass
            self.finish()
        except Violation as violation:
            raise SimFailure(self.seed, self.now, violation, self.REPLAY_TEST) from violation
        except Exception as error:
            raise SimFailure(
                self.seed,
                self.now,
                Violation("exception", f"{type(error).__name__}: {error}"),
                self.REPLAY_TEST,
            ) from error
        finally:
            self.backend.close()
        return SimResult(
            seed=self.seed,
            nodes=len(self.ids),
            ticks=self.options.ticks,
            trace_hash=self._trace.hexdigest(),
            faults=self.faults,
            stats=self.stats + self.net.stats,
        )

    def finish(self) -> None:
        """End-of-run checks: the probe committed and every node caught up to it."""
        if not self.options.check_liveness:
            return
        if not self._probe_done:
            raise Violation("liveness", "the probe proposal never committed")
        index = self._probe_index
        for node in self.members():
            if node.applied < index:
                raise Violation(
                    "convergence",
                    f"{node.id} applied only {node.applied} by the end, probe is at {index}",
                )


def memory_log(raft: RaftNode) -> LogReader:
    """The log a core holds (stable prefix and unstable tail), for checks that must not wait
    for the disk: a leader's or a follower's commit may run ahead of its own writes."""
    return raft._log


def run_seed(seed: int, options: SimOptions | None = None) -> SimResult:
    return Simulation(seed, options).run()
