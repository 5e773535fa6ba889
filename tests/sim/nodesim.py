"""The whole-node simulator: real NodeMachines, real client flows, a hostile world, one seed.

Theory of operation
-------------------
Everything a cluster and its clients do happens here in one process, as
events in simulated real time (world.py), driven by one seed:

* **members** are ``dlm.node.machine.NodeMachine`` objects, the code a real
  member runs, each with its own drifting clock, a store (MemoryStorage, or
  DiskStorage on a crashable in-memory filesystem on odd seeds), and a disk
  that completes ``Persist`` jobs in order after a latency drawn from the
  seed (the ``fsync_stall`` fault makes it slower than an election timeout).
  Peer messages cross a network that delays, drops, duplicates, reorders and
  partitions, each member sending to each peer on a connection of its own, as
  peers.py does. A connection that lost a message to a cut (or that the
  ``stall`` fault hits) stops delivering for good, as a TCP connection deep in
  retransmission back-off does, until the sender replaces it; the sender
  decides that with the runtime's own ``LinkWatch`` (dlm/node/linkwatch.py),
  fed from the peer's acknowledgements, which a cut in the other direction
  loses, and from TCP's retransmission timeout, doubled for each one that went
  unanswered (``_observe_link``), and looked at on a timer as peers.py does
  (``LINK_POLL_US``), so a connection a cut stalled is replaced even while
  nothing is written to it. Under ``packet_loss`` a redial's SYN is lost too.
* **clients** are processes running the client library's own flows
  (``dlm.client.core``: redirects, retries, backoff, request identity, the
  client-side lease clock), each over one connection at a time to a member,
  with latency on the link. A library client opens a lease, keeps it alive
  from a second connection with the keep-alives' own ``core.Renewer`` (as
  ``KeepAlive`` does), takes keys, writes to a
  fenced store while it holds them, and releases by token; an exec client
  runs ``dlm exec``'s flow: its supervisor decides with the CLI's own
  ``StartGate`` whether to order the spawn, and its guard (a process of its
  own on the same host, sharing the host's clock) decides with the CLI's own
  ``GuardRules`` whether to start the command and when to kill it. Clients
  get cut off, paused (a GC pause, longer than their TTL at times) and
  resumed; an exec supervisor is paused between any two of its steps (its
  guard and command run on); a client host is suspended (every process on it
  frozen, its CLOCK_MONOTONIC stopped, real time and CLOCK_BOOTTIME running
  on). A library client now and then changes its lease's TTL while it holds a
  key, shorter or longer (``Client.update_lease``: its keeper hears of it
  before it is sent), and holds on; an exec client's command now and then
  ends before its ``--min-hold``, and it hands the rest of the hold to the
  cluster as the lease's last TTL, sometimes only after a pause that ends just
  before the leader would expire the lease (the update then races the
  Expire); as ``dlm exec`` does, it counts on any confirmed handover.
* **a stranger** (stranger.py) on the network, without the members' peer
  secret, sends frames before and instead of a proof: spoofed refusals,
  spoofed hellos with real member ids, replays of recorded handshakes. It goes
  through the same admission objects a member runs (dlm/node/admission.py).
  Now and then the operator adds a member at an address where only such a
  stranger answers (never a member process: nothing there proves the peer
  secret), asks to promote it, and later removes it; no member may ever count
  it as a voter (``unproved-voter``), and the leader's members view must say
  why it is not one.
* **lease views**: the cluster expiring a lease that some client still counts
  on (its deadline not yet passed) is a violation by itself (lease-outlived).
* **partitions** (``NodeSimOptions.partitions`` > 1, issue 25): each member
  hosts one NodeMachine per partition (its own store, disk queue and peer
  connections, the member's clock); member faults hit all of them,
  ``crash_partition`` one (restarted when the member's own ``RestartPolicy``,
  dlm/node/supervision.py, says, as the runtime's supervisor asks it); exec
  clients are pinned to one partition, library clients route through the
  client library (WRONG_PARTITION teaches them the count) with leases that
  have a part in each partition they take a key of;
  Raft's checks run per partition, the lock checks per key across them, and
  once healthy no member leads more than ceil(P/N) partitions (``spread``).
* **gateways** (``NodeSimOptions.gateways`` > 0, issue 30): `dlm gateway`
  processes between some library clients and the cluster, routing each
  connection with the runtime's own ``GatewayRouter`` (dlm/gateway/routing.py).
  Half of the library clients (and the recovery and liveness probes) know
  only the gateways' addresses, learn that they are gateways as the driver
  does from the notice, and follow leaders through them with target
  preambles. Gateways crash (every connection through them breaks) and
  restart (their leader hints lost); a hostile client asks them for members
  they do not know. Checked: a gateway never relays to a non-member
  (``gateway-open-relay``) and a connection naming a member reaches that one
  (``gateway-target``); every other checker holds as without gateways.
* **checks** run after every event: Raft's invariants (checkers.py) and the
  lock-level promises users rely on (lockcheck.py), in real time; and after each
  of the stranger's frames, that it changed nothing in the member.

After ``heal_at`` every fault ends and the workload winds down; then every
key must become available to a new client within the longest TTL, an
election timeout and some slack.

A failing seed prints the command that replays it.
"""

from __future__ import annotations

import hashlib
import random
import signal
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from dlm.cli.exec_cmd import renewals_can_wait
from dlm.cli.exec_rules import KILL, KILL_LEAD_S, RENEW, TOO_LATE, GuardRules, StartGate
from dlm.cli.settings import Settings
from dlm.client import core
from dlm.client.errors import (
    ClusterUnavailable,
    DlmError,
    LeaseLost,
    LockHeld,
    NotHolder,
    PermissionDenied,
)
from dlm.gateway.routing import GatewayRouter, canonical
from dlm.node import locks
from dlm.node.admission import Acceptance, Dialing
from dlm.node.incarnation import DEFAULT_BUMP, lock_machine_of, new_incarnation
from dlm.node.leases import LeaseTracker
from dlm.node.linkwatch import LinkWatch
from dlm.node.locks.ledger import RunLedger
from dlm.node.machine import (
    CloseConnection,
    LogEvent,
    MachineConfig,
    NodeMachine,
    PeersChanged,
    Persist,
    SaveSnapshot,
    SendBackup,
    SendFrame,
    SendMessages,
    Stop,
    Timing,
)
from dlm.node.machine_config import PROTOCOL_SPOKEN
from dlm.node.outbox import ExportSpans
from dlm.node.raft.quorum import majority
from dlm.node.raft.types import Message, Role, VoteRequest, VoteResponse
from dlm.node.snapshots import image as node_image
from dlm.node.spans import FSYNC, span_problems
from dlm.node.spread import leader_counts_bound
from dlm.node.supervision import GiveUp, Leave, RestartPolicy
from dlm.node.watches import Watches
from dlm.partitioning import check_partitions, partition_of
from dlm.records import (
    ConfState,
    Entry,
    EntryKind,
    HardState,
    NodeId,
    Snapshot,
    SnapshotMeta,
    Storage,
)
from dlm.store.fs import SimulatedCrash
from dlm.wire import (
    AuthAdd,
    AuthRemove,
    AuthSet,
    ConfigSet,
    MemberAdd,
    MemberChange,
    MemberPromote,
    MemberRemove,
    SnapshotHeader,
    backup_chunk_frames,
)

from . import permcheck
from .backupcheck import BackupChecker
from .checkers import SafetyChecker, Violation
from .harness import MemoryBackend, StorageBackend
from .ledgercheck import LedgerChecker, SimLedger
from .lockcheck import DelayChecker, LockChecker, Section
from .settingscheck import MaxTtlChecker
from .stranger import Stranger
from .watchcheck import SimWatcher, WatchTruth, check_watchers
from .world import DRIFT, US, Clock, World

NODE_NAMES = ("n1", "n2", "n3", "n4", "n5")
SPARE_NAMES = tuple(f"n{i}" for i in range(6, 40))
"""Ids of members that join later (ids are never reused)."""
STRANGER_NAMES = tuple(f"mallory{i}" for i in range(1, 40))
"""Ids the operator adds at an address where no member process runs (only strangers)."""
UNPROVED_ADDS = 0.3
"""How often the operator's add names an address where nothing proves the peer secret."""
LIMITS = {"k0": 1, "k1": 1, "k2": 1, "sem": 2}
TEAMS = {"t0": ("k0", "k1"), "t1": ("k2", "sem")}
"""The limited identities of the workload and their key prefixes (every client draws its
keys from all of LIMITS, so a limited one is refused now and then)."""
MS = 1000
TIMING = Timing(
    tick_s=0.01, election_ticks=10, heartbeat_ticks=2, request_timeout_s=1.0, expire_retry_s=0.3
)
ELECTION_US = int(TIMING.tick_s * TIMING.election_ticks * 2 * US)
"""The longest election timeout (the core draws between one and two base timeouts)."""
DEBUG_STEADY = False
RETRANSMIT_US = ELECTION_US // 3
"""TCP's first retransmission timeout: 200 ms is two thirds of the real members' shortest
election timeout, and this of the simulated ones'."""
MAX_RETRANSMITS = 4
"""Losses in a row that one message suffers at most (it is then 15 timeouts late): beyond,
a real member replaces the stalled connection (peers.py)."""
EXEC_GRACE_MS = 150
"""How long before its deadline the exec model's guard starts stopping the command."""
FRESH_CONNECTION_US = 5 * RETRANSMIT_US
"""How long a new connection waits to resend a lost SYN: Linux's 1 s against its first
retransmission timeout of 200 ms, scaled as ``RETRANSMIT_US`` is (linkwatch.py keeps a
connection whose own retransmission comes sooner)."""
MAX_RETRANSMIT_DOUBLINGS = 12
"""TCP's retransmission timeout stops doubling here (Linux caps it at 120 s)."""
STALL_AFTER_S = TIMING.election_timeout_s
"""A peer connection with nothing acknowledged for this long is replaced (as server.py sets)."""
LINK_POLL_US = int(STALL_AFTER_S * US / 4)
"""How often a member looks at its outbound connections, written to or not (peers.py's
``_until_lost`` polls every ``stall_after / 4``)."""
RECOVERY_US = 2 * US
"""After the heal, a write (opening a lease) must succeed within this long."""

FAULT_KINDS = (
    "partition",
    "isolate_leader",
    "crash",
    "crash_leader",
    "pause",
    "fsync_stall",
    "slow_disks",
    "lossy",
    "reorder",
    "client_cut",
    "client_cut_leader",
    "client_pause",
    "client_slow",
    "one_way",
    "stall",
    "host_suspend",
    # A backup is taken; at the fault's end every member and its data is lost and the
    # cluster is restored from it (issue 24). Not in DEFAULT_WEIGHTS: its test asks for it.
    "restore",
    # Every member stops; the one whose log goes furthest is recovered (`dlm node recover`:
    # everything its log holds, committed or not) and the others rebuilt from it.
    "recover",
    # One partition's process dies (on its leader's member, or any) and is restarted by
    # the member's supervisor; the other partitions keep their leaders. Partitioned runs
    # only (``partitioned_options``).
    "crash_partition",
)
DEFAULT_WEIGHTS: dict[str, int] = {
    "partition": 3,
    "isolate_leader": 3,
    "crash": 2,
    "crash_leader": 3,
    "pause": 2,
    "fsync_stall": 2,
    "slow_disks": 1,
    "lossy": 1,
    "reorder": 1,
    "client_cut": 3,
    "client_cut_leader": 2,
    "client_pause": 3,
    "client_slow": 4,
    "one_way": 2,
    "stall": 2,
    "host_suspend": 2,
}
PARTITIONED_WEIGHTS: dict[str, int] = {"crash_partition": 3}
"""Faults a partitioned run draws besides the others."""
PARTITIONED_OFF = ("restore", "recover")
"""Faults a partitioned run does not draw (a backup and restore of every partition is
another helper's work: part-admin)."""
PARTITIONED_KEYS = {"k3": 1, "k6": 1}
"""Keys a partitioned run adds to LIMITS: with them every partition of 2, 3 or 4 holds
some (dlm/partitioning.py's partition_of)."""
CLIENT_FAULTS = frozenset(
    {"client_cut", "client_cut_leader", "client_pause", "client_slow", "host_suspend"}
)
SUPERVISOR_PAUSE_P = 0.08
"""Chance that an exec supervisor is paused (SIGSTOP, swap) at each step boundary."""
GUARD_STALL_P = 0.05
"""Chance that an exec guard is starved while a spawn order waits in its pipe."""
RESTORE_QUARANTINE_MS = 5_000
"""The restore fault's quarantine at least: above any TTL or hold the simulated clients use."""
FOREVER = 2**62


@dataclass
class NodeSimOptions:
    nodes: int | None = None  # None: 3 or 5, drawn from the seed
    duration_us: int = 20 * US
    """2,000 ticks of the members' 10 ms tick."""
    quiet_us: int = 6 * US
    clients: tuple[int, int] = (5, 8)
    fault_count: tuple[int, int] = (12, 16)
    fault_weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    snapshot_every: int = 40
    snapshot_keep: int = 8
    tombstone_ms: int = 3_500
    """Short (but longer than a client re-sends an open: 3 s here), so lease ids come back
    and incarnations matter."""
    max_stamp_step_ms: int = 250
    """Scaled down with ``tombstone_ms`` (the members' wall clocks differ by up to days
    here, so every change of leader is a jump of log time)."""
    backend: Callable[[tuple[NodeId, ...], random.Random], StorageBackend] = MemoryBackend
    machine_class: type[NodeMachine] | None = None
    lock_machine_class: type[locks.LockStateMachine] | None = None
    ledger_class: type[RunLedger] = SimLedger
    """The members' run ledger (a mutant's loses runs or skips)."""
    tracker_class: type[LeaseTracker] | None = None
    membership: bool = True
    """Add, promote and remove members (the leader too) while everything else goes on."""
    backups: bool = True
    """An operator takes backups (``dlm snapshot save``'s flow) now and then, each checked
    by backupcheck.py."""
    peer_version: int = PROTOCOL_SPOKEN
    """The protocol version the members tell each other (1: a cluster mid-upgrade; at 3
    the log reaches version 3, and identities are enforced)."""
    identities: bool = True
    """Clients of two limited identities besides the admins, an operator who adds them and
    now and then removes one while its clients hold locks, and the permission check
    (permcheck.py). ``TEAMS`` names them and their prefixes."""
    identity_limits: bool = True
    """The operator also sets the teams' own quotas now and then (``dlm auth set``, from
    version 4 on), and permcheck.py checks no entry takes an owner past them."""
    lease_clock_from_reply: bool = False
    """Mutant: the client counts its lease from the reply instead of the send."""
    exec_kill_late_us: int = 0
    """Mutant: the exec guard kills this long after the deadline instead of before it."""
    link_watch_class: type[LinkWatch] = LinkWatch
    """What decides when a member replaces a peer connection that stopped delivering."""
    stranger: bool = True
    """A stranger on the network sends frames before and instead of a proof (stranger.py)."""
    acceptance_class: type[Acceptance] = Acceptance
    dialing_class: type[Dialing] = Dialing
    """The admission objects the members use (mutants replace them)."""
    lease_clock_class: type[core.LeaseClock] = core.LeaseClock
    fit_request: Callable[[dict[str, Any], int | None], dict[str, Any]] = core.for_member
    """How a client fits a request to the member's protocol version (an open naming no TTL
    leaves it to the cluster from version 5 on; a mutant may stand in for it)."""
    part_clocks_class: type[core.PartClocks] = core.PartClocks
    """The clocks of a lease with parts in several partitions (partitioned runs' clients
    that route through the library; a mutant may stand in for it)."""
    late_part_opens: float = 0.0
    """How often the answer to a lease part's open (an ``open_lease`` of a lease id in a
    partition other than the id's own) comes back 1 to 1.5 TTLs after it was sent: the
    gateway that relayed it crashed with the answer and the retry through the other one
    was slow (seed 33 of the gateway runs, once in about 200 seeds; this makes it
    common)."""
    """The client-side lease clock (a mutant may stand in for it)."""
    check_outlived: bool = True
    """Whether an expired lease that a client still counts on is a violation by itself
    (off: only what follows from it, two holders, is)."""
    ttl_updates: float = 0.3
    """How often a library client changes its lease's TTL while it holds a key."""
    min_holds: float = 0.3
    """How often an exec client's command ends before its --min-hold is over."""
    deferred_renewals: float = 0.0
    """How many exec clients have an acquire budget under half their leases' TTL, so
    that their keep-alives start only once CMD has started, for a lease's first acquire
    that does not queue (dlm exec's ``renewals_can_wait``)."""
    late_handovers: float = 0.5
    """Of those, how often exec's supervisor is paused after its keep-alives stopped, until
    about when the cluster expires its lease, and only then hands the hold over (a
    --min-hold longer than CMD's run and the pause): its update races the lease's Expire."""
    min_hold_from_send: bool = False
    """Mutant: --min-hold counts from when the acquire was sent, not from its reply."""
    steady: str | None = None
    """A fault that lasts from the start to the heal ("slow_disks": a majority of the
    members, or all, write slower than an election timeout; "lossy_links": 30 % of the
    packets on every peer link are lost, see ``packet_loss``), under which a client's
    request must still succeed before the heal (the liveness check of issue 20, item 5)."""
    guard_rules_class: type[GuardRules] = GuardRules
    start_gate_class: type[StartGate] = StartGate
    guard_clock_stops_in_suspend: bool = False
    """Mutant: the guard reads CLOCK_MONOTONIC, which stops while its host is suspended."""
    restore_bump: int = DEFAULT_BUMP
    """The token jump of the restore fault (a mutant sets 0: the log continues at the
    backup's index)."""
    restore_quarantine: bool = True
    """Mutant (False): the restored cluster grants at once, with no quarantine."""
    watchers: int = 2
    """Watching clients (watchcheck.py): one on a key, one on every key."""
    watches_class: type[Watches] | None = None
    """The members' watch hub (a mutant may stand in for it)."""
    restart_policy_class: type[RestartPolicy] = RestartPolicy
    """What each member's supervisor decides about a partition process that died
    (dlm/node/supervision.py; a mutant may stand in for it)."""
    lock_delays: float = 0.0
    """How often a client opens its lease with a lock-delay (cluster version 4 only; off
    by default, so that the other runs draw what they drew before lock-delays existed)."""
    traces: float | None = None
    """Issue 30: the share of clients whose lock and lease requests carry a trace context
    (each its own traceparent); every span batch a member hands out is checked
    (dlm/node/spans.py, span_problems). None: drawn per seed, from a generator of its own
    so that no other draw moves: half the seeds trace, with half their clients."""
    gateways: int = 0
    """`dlm gateway` processes (issue 30; 0: none, and the run draws what it drew before
    gateways existed). Needs ``membership`` off: a gateway relays only to its --cluster."""
    gateway_router_class: type[GatewayRouter] = GatewayRouter
    """The gateways' routing (dlm/gateway/routing.py; a mutant may stand in for it)."""
    cluster_settings: float = 0.5
    """The share of runs (of one partition, at cluster version 5) in which an operator
    changes the cluster's max-ttl now and then (`dlm config set`), between values below and
    above the clients' TTLs: settingscheck.py checks no lease gets a TTL above it."""
    partitions: int = 1
    """Raft groups per cluster (issue 25): each member hosts one NodeMachine per partition,
    each with its own store, disk queue and peer connections, on the member's clock; exec
    clients are pinned to one partition, library clients route each key to its partition
    through the client library. 1 is the simulator of before, drawing exactly
    the same numbers; above 1, the run draws partition faults too (``crash_partition``:
    one partition's process dies and its supervisor restarts it as its
    ``restart_policy_class`` decides, the others run on), and
    membership changes, backups, restores, identities, watchers and the stranger are off
    (their cluster-wide fan-out is other helpers' work: docs/ARCHITECTURE.md)."""


def partitioned_options(options: NodeSimOptions) -> NodeSimOptions:
    """What a partitioned run (``partitions`` > 1) runs with: the partition faults on, and
    off what has no cluster-wide form here yet (membership changes, backups and restores,
    identities, watchers, the stranger)."""
    weights = {k: w for k, w in options.fault_weights.items() if k not in PARTITIONED_OFF}
    for kind, weight in PARTITIONED_WEIGHTS.items():
        weights.setdefault(kind, weight)
    return replace(
        options,
        fault_weights=weights,
        membership=False,
        backups=False,
        identities=False,
        identity_limits=False,
        watchers=0,
        stranger=False,
    )


class SimFailure(AssertionError):
    def __init__(self, seed: int, t_us: int, violation: Violation, test: str) -> None:
        self.seed = seed
        self.violation = violation
        super().__init__(
            f"seed {seed}, t={t_us / US:.3f}s: {violation}\n"
            f"replay: .venv/bin/python -m pytest {test} --sim-seeds={seed}:1"
        )


@dataclass
class NodeSimResult:
    seed: int
    nodes: int
    ticks: int
    trace_hash: str
    faults: Counter[str]
    stats: Counter[str]


# ---------------------------------------------------------------------------
# Members
# ---------------------------------------------------------------------------


@dataclass
class _DiskJob:
    action: Persist | SaveSnapshot
    generation: int


class SimMember:
    """One member process: the whole member, or (partitioned) one partition's child.

    Partition i > 0 of member n is named ``n/p<i>`` in traces and checks; it shares the
    member's clock (one host) and has the member's id in its group, as every partition's
    group has the same member ids.
    """

    def __init__(
        self,
        sim: NodeSimulation,
        node_id: NodeId,
        storage: Storage,
        partition: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self.sim = sim
        self.id = node_id
        self.partition = partition
        self.name = node_id if partition == 0 else f"{node_id}/p{partition}"
        self.clock = clock or Clock(sim.rng_for(f"clock-{node_id}"))
        self.storage = storage
        self.machine: NodeMachine | None = None
        self.generation = 0
        self.paused = False
        self.held: list[Callable[[], None]] = []
        self.disk: deque[_DiskJob] = deque()
        self.disk_busy_until = 0
        self.stall_until = 0
        self.slow_write_us = 0
        """Each write (the jobs queued together, as the real disk thread groups them) takes
        this long (the slow_disks fault); 0: the disk's normal latency."""
        self.timer_token = 0
        self.timer_at = float("inf")
        """The machine time the armed timer fires at."""
        self.conns: dict[int, SimConn] = {}
        self.next_conn = 1
        self.acked_hard_state = HardState()
        self.promised_term = 0
        self.incarnation = 0
        """The cluster incarnation it belongs to (a restore fault makes a new one)."""
        self.removed = False
        """It was removed from the cluster and has stopped for good."""
        self.abandoned = False
        """Its supervisor will not start it again (it gave up, or left it down): nothing in
        the run does, the heal neither (its operator would have to)."""

    @property
    def up(self) -> bool:
        return self.machine is not None


class SimPeerLink:
    """One member's outbound connection to one peer (peers.py's PeerLink), replaced whole."""

    __slots__ = ("acked", "conn", "dial_at", "partition", "sent", "stalled", "watch")

    def __init__(self, watch: LinkWatch, partition: int = 0) -> None:
        self.watch = watch
        self.partition = partition
        """The partition whose processes it joins (a connection with that preamble)."""
        self.conn = 0
        """Which connection: messages of an older one are lost with it."""
        self.stalled = False
        """It stopped delivering (a cut lost one of its messages, or the stall fault)."""
        self.sent = 0
        self.acked = 0
        """Messages written on this connection, and how many of them the peer acknowledged."""
        self.dial_at = 0
        """While a replacement is being dialled (real µs): messages are dropped until then."""

    def replace(self, dial_at: int) -> None:
        self.conn += 1
        self.stalled = False
        self.sent = self.acked = 0
        self.dial_at = dial_at
        self.watch.connected()


# ---------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------


class SimConn:
    """A client's TCP connection to one member (in order, until it breaks)."""

    def __init__(self, client: SimClient, member: SimMember) -> None:
        self.client = client
        self.member = member
        self.number = 0  # the member's connection number, once connected
        self.generation = member.generation
        self.connected = False
        self.broken = False
        self.outbox: list[dict[str, Any]] = []
        self.to_member_at = 0
        self.to_client_at = 0
        self.route: str | None = None
        """The router's address this connection was made for, through a gateway (None:
        straight to the member)."""
        self.gateway: SimGateway | None = None


class SimGateway:
    """One `dlm gateway` process: the runtime's pure router, up or crashed."""

    def __init__(self, sim: NodeSimulation, name: str, members: list[str]) -> None:
        self.sim = sim
        self.name = name
        self.address = f"{name}:7800"
        self.members = members
        self.router = sim.options.gateway_router_class(members)
        self.up = True
        self.conns: list[SimConn] = []
        self.restarts = 0

    def crash(self) -> None:
        """Every connection through it breaks; its hints die with it."""
        self.up = False
        conns, self.conns = self.conns, []
        for conn in conns:
            self.sim._break(conn)

    def restart(self) -> None:
        if not self.up:
            self.up = True
            self.restarts += 1
            self.router = self.sim.options.gateway_router_class(self.members)


class SimClient:
    """One client library object (``Client``): a context, a connection, one flow at a time."""

    def __init__(
        self,
        proc: ClientProc,
        name: str,
        *,
        timeout: float = 3.0,
        attempt_timeout: float = 0.5,
        gateways: list[str] | None = None,
    ) -> None:
        self.proc = proc
        self.name = name
        sim = proc.sim
        sim.client_count += 1
        rng = sim.rng_for(f"client-{name}-{sim.client_count}")
        addresses = gateways or [f"{n}:7700" for n in sim.current_ids()]
        clock = proc.clock
        self.ctx = core.Context(
            members=addresses,
            router=core.Router(addresses, rng.randrange(len(addresses))),
            backoff=core.Backoff(rng),
            clock=lambda: clock.mono(sim.world.now),
            timeout=timeout,
            attempt_timeout=attempt_timeout,
            client=f"{name}x{rng.randrange(10**6)}",
            seqs=core.Sequencer(rng.randrange(2**40)),
        )
        tracer = sim.rng_for(f"trace-{name}-{sim.client_count}")
        if sim.trace_share and tracer.random() < sim.trace_share:
            trace_id, span_id = tracer.getrandbits(128) or 1, tracer.getrandbits(64) or 1
            self.ctx.trace = f"00-{trace_id:032x}-{span_id:016x}-01"
            sim.traceparents.add(self.ctx.trace)
        self.conn: SimConn | None = None
        self.next_id = 0
        self.waiting: tuple[int, Callable[[Any], None]] | None = None
        """(request id, resume) of the request in flight."""
        self.grant_wait: tuple[str, str, Callable[[Any], None]] | None = None
        self.pushes: list[dict[str, Any]] = []
        self.chunks: list[dict[str, Any]] = []
        """Image chunks of a backup (``snapshot_save``), as they arrive."""
        self.wait_token = 0
        self.watcher: SimWatcher | None = None
        """Set on a watching client: pushed watch frames and breaks go to it."""

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.broken:
            self.proc.sim.client_hang_up(conn)


class _Cancelled(Exception):
    """The lease was lost: the process cancels what it was doing (as exec closes its client)."""


@dataclass
class RunFlow:
    client: SimClient
    flow: Generator[Any, Any, Any]


@dataclass
class Sleep:
    seconds: float


Script = Generator[RunFlow | Sleep, Any, None]


class Task:
    """A script of a client process, resumed by events; ``cancel`` throws into it."""

    def __init__(self, proc: ClientProc, script: Script, name: str) -> None:
        self.proc = proc
        self.script = script
        self.name = name
        self.done = False
        self.epoch = 0  # bumps on every resume: stale wake-ups are ignored
        self.sleeping = False

    def start(self) -> None:
        self._advance(None, None)

    def _advance(self, value: Any, exc: BaseException | None) -> None:
        if self.done:
            return
        self.epoch += 1
        try:
            step = self.script.throw(exc) if exc is not None else self.script.send(value)
        except StopIteration:
            self.done = True
            return
        self._wait(step)

    def _wait(self, step: RunFlow | Sleep) -> None:
        proc = self.proc
        epoch = self.epoch
        self.sleeping = isinstance(step, Sleep)
        if isinstance(step, Sleep):
            proc.after(step.seconds, lambda: self._resume_if(epoch, None, None))
            return
        FlowRunner(step.client, step.flow, lambda v, e: self._resume_if(epoch, v, e)).step(None)

    def _resume_if(self, epoch: int, value: Any, exc: BaseException | None) -> None:
        if epoch == self.epoch:
            self._advance(value, exc)

    def cancel(self, exc: BaseException) -> None:
        """Abandons whatever the task waits for and throws ``exc`` into it."""
        self._advance(None, exc)

    def nudge(self) -> None:
        """Ends the task's Sleep early (a condition variable's notify): the Sleep returns
        True instead of None, and the script re-reads its times. Nothing if it is not
        sleeping."""
        if self.sleeping and not self.done:
            epoch = self.epoch
            self.proc.after(0.0, lambda: self._resume_if(epoch, True, None))


class FlowRunner:
    """Drives one core flow over a SimClient: the simulator's twin of sync.Client._run."""

    def __init__(
        self,
        client: SimClient,
        flow: Generator[Any, Any, Any],
        done: Callable[[Any, BaseException | None], None],
    ) -> None:
        self.client = client
        self.flow = flow
        self.done = done
        self.finished = False

    def step(self, outcome: Any) -> None:
        if self.finished:
            return
        try:
            action = self.flow.send(outcome)
        except StopIteration as stop:
            self.finished = True
            self.done(stop.value, None)
            return
        except DlmError as exc:
            self.finished = True
            self.done(None, exc)
            return
        self.client.proc.sim.perform(self, action)


class Flag:
    """Set by one part of the simulation while a script waits at a yield (like threading.Event).

    A method call rather than a bool attribute, so that mypy does not carry a value
    narrowed before the yield past it.
    """

    def __init__(self) -> None:
        self._raised = False

    def set(self) -> None:
        self._raised = True

    def is_set(self) -> bool:
        return self._raised


class ClientProc:
    """A client process: a drifting clock, tasks, and pauses that defer everything.

    ``clock`` is its host's CLOCK_BOOTTIME; ``suspended_us`` and
    ``suspended_since`` record the host's suspends, which CLOCK_MONOTONIC
    (``stopping_mono``) does not count. A guard shares its supervisor's host.
    """

    def __init__(
        self, sim: NodeSimulation, name: str, kind: str, host: ClientProc | None = None
    ) -> None:
        self.sim = sim
        self.name = name
        self.kind = kind  # "library", "exec" or "guard"
        self.rng = sim.rng_for(f"proc-{name}")
        self.host = host or self
        self.clock: Clock = Clock(self.rng) if host is None else host.clock
        self.suspended_us = 0
        self.suspended_since: int | None = None
        self.guard: ClientProc | None = None
        """An exec supervisor's guard process (made on first use)."""
        self.cmd: CmdRun | None = None
        """The command an exec supervisor's guard runs now."""
        self.pauses = 0
        self.paused = False
        self.deferred: list[Callable[[], None]] = []
        self.tasks: list[Task] = []
        self.stopping = Flag()
        self.identity: str = host.identity if host is not None else ""
        """Who its connections authenticate as ("": the built-in admin)."""
        self.reopen: tuple[str, int] | None = None
        """A lease id to open again (incarnations), and the real time from which to."""
        self.update_rng = sim.rng_for(f"updates-{name}")
        self.acquire_sent = 0.0
        """When the last acquire was first sent (the min-hold mutant counts from it)."""
        self.net_rng: random.Random | None = None
        """A process with draws of its own for its links' latency (a watcher), so that
        adding it leaves every other draw of the seed as it was."""
        self.pinned: int | None = host.pinned if host is not None else None
        """The one partition this process's requests reach (a partitioned run's client of
        one partition: its keys, its leases), or None to route by the client library."""

    def run(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` now, or when the process is resumed."""
        if self.paused:
            self.deferred.append(fn)
        else:
            fn()

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        sim = self.sim
        target = self.clock.real_us(self.clock.mono(sim.world.now) + max(0.0, seconds))
        sim.world.at(target, lambda: self.run(fn))

    def spawn(self, script: Script, name: str) -> Task:
        task = Task(self, script, name)
        self.tasks.append(task)
        self.run(task.start)
        return task

    def mono(self) -> float:
        return self.clock.mono(self.sim.world.now)

    def stopping_mono(self) -> float:
        """CLOCK_MONOTONIC: the host's clock less the time it spent suspended."""
        host, now = self.host, self.sim.world.now
        asleep = host.suspended_us + (
            0 if host.suspended_since is None else now - host.suspended_since
        )
        return self.clock.mono(now) - self.clock.rate * asleep / US


PIPE_S = 0.0005
"""How long a line takes down the pipe between an exec supervisor and its guard."""


class CmdRun:
    """One `dlm exec` command under its guard: the guard's rules and what it reported."""

    def __init__(self, rules: GuardRules) -> None:
        self.rules = rules
        self.started = False
        self.ended_at: int | None = None
        """Real time CMD's last process ended (killed or exited)."""
        self.killed = False
        self.deadline_passed = False
        self.stop_sent = False
        self.watch_epoch = 0
        self.section: Section | None = None
        self.long = False
        """A command that runs for seconds (past its lease, if nothing renews it)."""
        self.done = Flag()


# ---------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------


class NodeSimulation:
    REPLAY_TEST = "tests/sim/test_node_sim.py::test_node_sim"

    def __init__(self, seed: int, options: NodeSimOptions | None = None) -> None:
        self.seed = seed
        self.options = opts = options or NodeSimOptions()
        self.partitions = opts.partitions
        problem = check_partitions(self.partitions)
        if problem is not None:
            raise ValueError(problem)
        if self.partitions > 1:
            self.options = opts = partitioned_options(opts)
            self.REPLAY_TEST = "tests/sim/test_node_sim.py::test_node_sim_partitioned"
        if opts.gateways:
            # (That test draws the same options per seed, partitioned ones included.)
            self.REPLAY_TEST = "tests/sim/test_node_sim.py::test_node_sim_with_gateways"
        self.limits = dict(LIMITS) if self.partitions == 1 else {**LIMITS, **PARTITIONED_KEYS}
        """The workload's keys and their limits (a partitioned run has more, so that every
        partition of up to 4 holds some)."""
        self._root = random.Random(seed)
        self.rng = random.Random(self._root.getrandbits(64))
        self.net_rng = random.Random(self._root.getrandbits(64))
        self.fault_rng = random.Random(self._root.getrandbits(64))
        count = opts.nodes if opts.nodes is not None else self.rng.choice((3, 3, 5))
        self.ids: tuple[NodeId, ...] = NODE_NAMES[:count]
        """The cluster's first members (members that join later are added to ``members``)."""
        self._spares = iter(SPARE_NAMES)
        self._stranger_names = iter(STRANGER_NAMES)
        self.unproved: set[NodeId] = set()
        """Members added where nothing ever proves the peer secret: never voters."""
        self._promote_asked: set[NodeId] = set()
        self._usage_checked: dict[NodeId, tuple[int, int]] = {}
        self.world = World()
        tracing = self.rng_for("tracing")
        self.trace_share = (
            opts.traces if opts.traces is not None else (0.5 if tracing.random() < 0.5 else 0.0)
        )
        """The share of clients that trace (NodeSimOptions.traces)."""
        self.traceparents: set[str] = set()
        """The trace contexts the clients sent: the only ones span batches may name."""
        self.raft_checker = SafetyChecker()
        self.backups = BackupChecker(
            self.raft_checker, _replay_class(opts.lock_machine_class, opts)
        )
        self._commit_voters: dict[tuple[int, int, int], tuple[NodeId, ...]] = {}
        """(partition, index, term) -> the voters whose majority the leader counted."""
        self.checker = LockChecker(dict(self.limits))
        self.ledger_check = LedgerChecker()
        self.group_checkers: dict[int, SafetyChecker] = {
            p: SafetyChecker() for p in range(1, self.partitions)
        }
        """Raft's checks of partitions 1 and up (``raft_checker`` is partition 0's)."""
        self.group_ledgers: dict[int, LedgerChecker] = {
            p: LedgerChecker() for p in range(1, self.partitions)
        }
        """The run ledger's checks of partitions 1 and up (indexes are per partition)."""
        self.delay_checker = DelayChecker(DRIFT)
        self.settings_admin = False
        """An operator changes the max-ttl in this run (then the recovery probe's write
        unsets it, so that the liveness probe's long lease is allowed)."""
        self.max_ttl_checkers: dict[int, MaxTtlChecker] = {}
        self.default_ttl_ms: int | None = None
        """The cluster's default-ttl once the settings admin has set it (then some opens
        name no TTL, as `dlm acquire` without --ttl, and must get this one)."""
        """Each partition's max-ttl in force by index, and the check (settingscheck.py)."""
        self.lease_delays: dict[tuple[str, int], int] = {}
        """(lease, incarnation) -> the lock-delay its open entry gave it."""
        self.stats: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.heal_at = opts.duration_us - opts.quiet_us
        self.gateways: dict[str, SimGateway] = {}
        """The `dlm gateway` processes by name (issue 30; made when the run starts)."""
        self._trace = hashlib.blake2b(digest_size=16)
        self.cuts: Counter[tuple[str, str]] = Counter()
        self.peer_links: dict[tuple[str, str], SimPeerLink] = {}
        self.drop = self.rng.choice((0.0, 0.01, 0.02))
        self.extra_drop = 0.0
        self.late_rng = self.rng_for("late-part-opens")
        self.late_answers: dict[tuple[SimConn, Any], int] = {}
        """Answers to hold back (``late_part_opens``): (connection, request id) -> the TTL
        asked, in µs."""
        self.extra_delay_us = 0
        self.packet_loss = 0.0
        """Packets lost on every peer link as TCP sees them (the steady lossy_links fault):
        nothing is dropped, but each loss delays a message, and those behind it on its
        link, by a retransmission timeout that doubles with each loss in a row."""
        self._link_free_at: dict[tuple[str, str, int], int] = {}
        """When each connection (by sender, receiver and which connection) next delivers:
        in order, as TCP does; a replacement connection starts with no backlog."""
        self.healed = False
        self.incarnations: dict[str, list[int]] = {}
        """Every incarnation each lease id has had, oldest first."""
        self.slow: dict[str, int] = {}
        """Extra latency (µs, drawn up to) on one client's links: a congested network."""
        self.backend = opts.backend(self.ids, random.Random(self._root.getrandbits(64)))
        self.members: dict[NodeId, SimMember] = {}
        """Partition 0's member processes (every member's, when there is one partition)."""
        for node_id in self.ids:
            member = SimMember(self, node_id, self.backend.fresh(node_id))
            self.members[node_id] = member
        self.groups: list[dict[NodeId, SimMember]] = [self.members]
        """Each partition's member processes, by member id."""
        for partition in range(1, self.partitions):
            group = {}
            for node_id in self.ids:
                name = f"{node_id}/p{partition}"
                host_clock = self.members[node_id].clock
                group[node_id] = SimMember(
                    self, node_id, self.backend.fresh(name), partition, host_clock
                )
            self.groups.append(group)
        self._leaders: dict[int, tuple[NodeId, int]] = {}
        """partition -> (its latest leader, the real time it was elected)."""
        self.by_name: dict[str, SimMember] = {
            m.name: m for group in self.groups for m in group.values()
        }
        for group in self.groups:
            for member in group.values():
                self._boot(member)
        self.supervisors: dict[NodeId, RestartPolicy] = {}
        """Each member's supervisor's restart decisions (partitioned runs): a new one each
        time the member starts, as the real supervisor process is."""
        if self.partitions > 1:
            for node_id in self.ids:
                self._start_supervisor(self.members[node_id])
        self.procs: list[ClientProc] = []
        self.client_count = 0
        n_clients = self.rng.randint(*opts.clients)
        for i in range(n_clients):
            kind = "exec" if i % 2 else "library"
            proc = ClientProc(self, f"c{i}", kind)
            if opts.identities:
                proc.identity = ("", *TEAMS)[i % 3]
            if self.partitions > 1 and kind == "exec":
                # An exec client is pinned to one partition (its keys and leases); a
                # library client routes by the client library, learning the count from
                # WRONG_PARTITION replies, its leases opening a part in each partition it
                # takes a key of.
                proc.pinned = (i // 2) % self.partitions
            self.procs.append(proc)
        self.leases_ttl_max_ms = 0
        """The longest TTL a client's lease was opened with or updated to (the probe's bound)."""
        self.watch_truth = WatchTruth()
        self.watchers: list[SimWatcher] = []
        self.lease_views: dict[str, list[tuple[int, ClientProc, Any, Any]]] = {}
        """lease id -> (incarnation, process, clock, lease book) of every client that counts
        on it (the book: its parts, by partition, for a lease with parts; else None)."""

    # -- plumbing ----------------------------------------------------------------

    def rng_for(self, name: str) -> random.Random:
        digest = hashlib.blake2b(f"{self.seed}/{name}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "big"))

    def trace(self, record: str) -> None:
        self._trace.update(record.encode())

    def _raft_checker_of(self, member: SimMember) -> SafetyChecker:
        return self.raft_checker if member.partition == 0 else self.group_checkers[member.partition]

    def _keys_for(self, proc: ClientProc) -> list[str]:
        """The keys a client draws from: every key, or its partition's."""
        if proc.pinned is None:
            return sorted(self.limits)
        return [k for k in sorted(self.limits) if partition_of(k, self.partitions) == proc.pinned]

    def _ledger_of(self, partition: int) -> LedgerChecker:
        return self.ledger_check if partition == 0 else self.group_ledgers[partition]

    def _group_of(self, member: SimMember) -> dict[NodeId, SimMember]:
        return self.groups[member.partition]

    def host(self, member: SimMember) -> list[SimMember]:
        """Every process of ``member``'s member: one per partition (a host-wide fault)."""
        return [group[member.id] for group in self.groups if member.id in group]

    def all_members(self) -> list[SimMember]:
        return [m for group in self.groups for m in group.values()]

    def _machine_class_for(self, member: SimMember) -> type[NodeMachine]:
        """The node machine with the simulator's instruments (and any injected bug)."""
        sim = self
        opts = self.options
        base = opts.machine_class or NodeMachine
        lock_base = opts.lock_machine_class or locks.LockStateMachine
        tracker_base = opts.tracker_class or LeaseTracker

        class CountingLocks(lock_base):  # type: ignore[valid-type,misc]
            tombstone_ms = opts.tombstone_ms
            max_stamp_step_ms = opts.max_stamp_step_ms
            ledger_class = opts.ledger_class

            def apply(self, index: int, data: bytes) -> locks.ApplyOutcome:
                sim._applying(member, index, data)
                try:
                    cmd = locks.decode_command(data) if data else None
                except locks.CommandError:
                    cmd = None
                why = over = None
                if cmd is not None:
                    why = permcheck.forbidden(self, cmd)
                    over = permcheck.over_own_limit(self, cmd)
                outcome: locks.ApplyOutcome = super().apply(index, data)
                sim._applied(outcome, why, over, member.partition)
                sim._ledger_of(member.partition).applied(outcome, self.version)
                if member.partition == 0:  # (watchers run with one partition only)
                    sim.watch_truth.applied(member.id, outcome, self)
                return outcome

            def apply_command(self, index: int, cmd: locks.Command) -> locks.ApplyOutcome:
                sim._applying(member, index, locks.encode_command(cmd))
                why = permcheck.forbidden(self, cmd)
                over = permcheck.over_own_limit(self, cmd)
                outcome: locks.ApplyOutcome = super().apply_command(index, cmd)
                sim._applied(outcome, why, over, member.partition)
                sim._ledger_of(member.partition).applied(outcome, self.version)
                if member.partition == 0:  # (watchers run with one partition only)
                    sim.watch_truth.applied(member.id, outcome, self)
                return outcome

            def skip(self, index: int) -> None:
                sim._applying(member, index, None)
                super().skip(index)

            def _executing(self, cmd: locks.ClientCommand) -> None:
                client = cmd.origin.client
                if member.partition and client:
                    client = f"{client}@p{member.partition}"  # indexes are per partition
                sim.checker.executed_request(client, cmd.origin.seq, self.applied_index)

        class CountingTracker(tracker_base):  # type: ignore[valid-type,misc]
            def renew(self, lease: str, received_at: float, client: str = "", seq: int = 0) -> bool:
                before = self.remaining_ms(lease, received_at)
                renewed: bool = super().renew(lease, received_at, client, seq)
                after = self.remaining_ms(lease, received_at)
                if renewed and before is not None and after is not None and after > before:
                    term = member.machine.raft.term if member.machine is not None else 0
                    sim.checker.renewed(member.name, term, lease, client, seq)
                return renewed

        class CommitRecordingRaft(base.raft_class):  # type: ignore[name-defined,misc]
            def _maybe_commit(self) -> bool:
                before = self._log.committed
                moved: bool = super()._maybe_commit()
                if moved:
                    sim._committed_under(member, self._log, before, self.voters)
                return moved

        class SimNodeMachine(base):  # type: ignore[valid-type,misc]
            watches_class = opts.watches_class or base.watches_class
            lock_machine_class = CountingLocks
            tracker_class = CountingTracker
            raft_class = CommitRecordingRaft

        return SimNodeMachine

    def _applying(self, member: SimMember, index: int, data: bytes | None) -> None:
        """``member`` applies ``index``: everyone applies the same, and only what a quorum
        of voters stores durably (an applied entry is answered to its client)."""
        machine = member.machine
        if machine is None:  # restoring at boot: the image is checked on its own
            return
        log = machine.raft._log
        term = log.term(index)
        if data is not None:
            self._raft_checker_of(member).observe_apply(member.id, Entry(index, term, data))
        elif member.partition == 0:  # (backups are taken with one partition only)
            self.backups.skipped(index, term)
        # An entry commits under the configuration its leader used, the latest in the leader's
        # log: the one at the entry or one change after it, which a follower may not have yet.
        # A majority of that configuration, recorded when the leader counted, is what counts.
        configs = []
        used = self._commit_voters.get((member.partition, index, term))
        if used is not None:
            configs.append(used)
        try:
            configs.append(machine.raft.conf_state_at(index).voters)
        except ValueError:
            pass
        group = self._group_of(member)
        counts = [(self._durable_on(group, voters, index, term), voters) for voters in configs]
        if not any(durable >= majority(voters) for durable, voters in counts):
            durable, voters = counts[-1]
            raise Violation(
                "applied-before-durable",
                f"{member.name} applied index {index} (term {term}) while only {durable} of "
                f"{len(voters)} voters stored it",
            )

    def _committed_under(
        self, member: SimMember, log: Any, before: int, voters: Iterable[NodeId]
    ) -> None:
        """A leader moved its commit index past ``before``, counting a majority of ``voters``."""
        counted = tuple(sorted(voters))
        partition = member.partition
        for index in range(max(before + 1, log.committed - 4096), log.committed + 1):
            term = log.term_or_none(index)
            if term is not None:
                self._commit_voters.setdefault((partition, index, term), counted)

    def _durable_on(
        self, group: dict[NodeId, SimMember], voters: tuple[NodeId, ...], index: int, term: int
    ) -> int:
        durable = 0
        for voter in voters:
            other = group.get(voter)
            if other is None:
                continue
            storage = other.storage
            snap = storage.snapshot()
            if snap is not None and snap.meta.index >= index:
                durable += 1
                continue
            try:
                if storage.term(index) == term:
                    durable += 1
            except Exception:
                pass
        return durable

    def _applied(
        self,
        outcome: locks.ApplyOutcome,
        forbidden: str | None = None,
        over: str | None = None,
        partition: int = 0,
    ) -> None:
        if forbidden is not None and permcheck.effective(outcome):
            raise Violation(
                "unpermitted", f"index {outcome.index} was applied without permission: {forbidden}"
            )
        if over is not None:
            if permcheck.added(outcome):
                raise Violation("over-quota", f"index {outcome.index} was applied: {over}")
            self.stats["own_limit_held"] += 1
        cmd = outcome.command
        if isinstance(cmd, locks.IdentityCommand) and cmd.op == "remove" and outcome.ended:
            raise Violation(
                "removed-lease-freed",
                f"removing identity {cmd.name} ended leases {outcome.ended} at once",
            )
        for lease, _, incarnation in outcome.armed:
            # (Each partition numbers its part's incarnations on its own: the stale Expires,
            # proposed in partition 0, draw from partition 0's.)
            named = lease if partition == 0 else f"{lease}@p{partition}"
            seen = self.incarnations.setdefault(named, [])
            if incarnation not in seen:
                seen.append(incarnation)
        expire = outcome.command
        if (
            outcome.expired
            and isinstance(expire, locks.ExpireCommand)
            and self.options.check_outlived
        ):
            self._check_outlived(expire, partition)
        checker = self.max_ttl_checkers.get(partition)
        if checker is None:
            checker = self.max_ttl_checkers[partition] = MaxTtlChecker()
        if checker.applied(outcome):
            self.stats["max_ttl_checked"] += 1
        if isinstance(outcome.command, locks.SettingsCommand) and isinstance(
            outcome.result, locks.Invalid
        ):
            self.stats["settings_refused"] += 1
        if isinstance(outcome.result, locks.Invalid) and "max-ttl" in outcome.result.message:
            self.stats["over_max_ttl_refused_at_apply"] += 1
        now = self.world.now
        self._lock_delays(outcome, now)
        result = outcome.result
        if isinstance(result, locks.Granted) and result.token == outcome.index:
            self.delay_checker.granted(outcome.index, result.key, now)
            self.checker.grant_committed(outcome.index, result.key, result.lease, self.world.now)
        for promotion in outcome.promotions:
            self.delay_checker.granted(promotion.token, promotion.key, now)
            self.checker.grant_committed(
                promotion.token, promotion.key, promotion.lease, self.world.now
            )

    def _lock_delays(self, outcome: locks.ApplyOutcome, now: int) -> None:
        """Tells the delay checker of every key this entry put in a lock-delay, found from
        what the log says (the lease's delay in its open entry, the keys its Expire ended),
        not from the machine's own account of it, which a mutant may leave out."""
        cmd, result = outcome.command, outcome.result
        if isinstance(cmd, locks.OpenLeaseCommand) and isinstance(result, locks.LeaseOpened):
            if not result.joined:
                self.lease_delays[(cmd.lease, result.incarnation)] = cmd.lock_delay_ms
        elif (
            isinstance(cmd, locks.ExpireCommand)
            and isinstance(result, locks.LeaseClosed)
            and cmd.lease in outcome.expired
        ):
            delay_ms = self.lease_delays.get((cmd.lease, cmd.incarnation), 0)
            for key in result.released if delay_ms else ():
                self.delay_checker.started(outcome.index, key, delay_ms, now)
                self.stats["lock_delays"] += 1

    def _check_outlived(self, expire: locks.ExpireCommand, partition: int = 0) -> None:
        """The cluster expired a lease: no client may still count on it (its deadline
        passes before the leader's, whatever happened to the lease's TTL)."""
        now = self.world.now
        views = self.lease_views.get(expire.lease, [])
        for opened, proc, clock, book in views:
            incarnation = opened
            if book is not None:
                # A lease with parts: the expired part is this partition's; the client
                # counts on it if it knows it (the earliest part's deadline is the lease's).
                part = (book.parts(expire.lease) or {}).get(partition)
                if part is None:
                    continue
                incarnation = part.incarnation
            if expire.incarnation not in (0, incarnation):
                continue
            if clock.lost:
                continue
            until = proc.clock.real_us(clock.deadline)
            if until > now:
                raise Violation(
                    "lease-outlived",
                    f"lease {expire.lease} (incarnation {incarnation}) expired at "
                    f"{now / US:.3f}s while {proc.name} counted on it until {until / US:.3f}s",
                )
        # Views of an expired lease are of no further use.
        kept = [v for v in views if v[3] is not None or expire.incarnation not in (0, v[0])]
        if kept:
            self.lease_views[expire.lease] = kept
        else:
            self.lease_views.pop(expire.lease, None)

    def _watch_lease(
        self, proc: ClientProc, lease: core.Lease, clock: Any, book: Any = None
    ) -> None:
        self.lease_views.setdefault(lease.id, []).append((lease.incarnation, proc, clock, book))

    def _forget_lease(self, lease: str, clock: Any) -> None:
        views = [v for v in self.lease_views.get(lease, []) if v[2] is not clock]
        if views:
            self.lease_views[lease] = views
        else:
            self.lease_views.pop(lease, None)

    # -- members -------------------------------------------------------------------

    def _boot(self, member: SimMember) -> None:
        member.generation += 1
        member.acked_hard_state = member.storage.initial_state()[0]
        config = MachineConfig(
            node_id=member.id,
            cluster="sim",
            incarnation=member.incarnation,
            peers={n: f"{n}:7700" for n in self.ids},
            address=f"{member.id}:7700",
            timing=TIMING,
            snapshot_every=self.options.snapshot_every,
            snapshot_keep=self.options.snapshot_keep,
            partition=member.partition,
            partitions=self.partitions,
        )
        rng = self.rng_for(f"node-{member.name}-{member.generation}")
        machine_class = self._machine_class_for(member)
        member.machine = machine = machine_class(
            config, member.storage, rng, member.clock.instant(self.world.now)
        )
        for peer in self.members:
            if peer != member.id:
                machine.peer_version(peer, self.options.peer_version)
        self._after_member_event(member)
        self._arm_timer(member)

    def _arm_timer(self, member: SimMember) -> None:
        machine = member.machine
        if machine is None:
            return
        member.timer_token += 1
        token = member.timer_token
        member.timer_at = machine.next_timer()
        at = member.clock.real_us(member.timer_at)
        self.world.at(at, lambda: self._fire_timer(member, token))

    def _fire_timer(self, member: SimMember, token: int) -> None:
        if token != member.timer_token or member.machine is None:
            return
        if member.paused:
            member.held.append(lambda: self._fire_timer(member, member.timer_token))
            return
        member.machine.timer(member.clock.instant(self.world.now))
        self._after_member_event(member)
        self._arm_timer(member)

    def on_member(self, member: SimMember, fn: Callable[[NodeMachine], None]) -> None:
        """Runs ``fn`` on the member's machine now (held while it is paused)."""
        generation = member.generation

        def go() -> None:
            if member.machine is None or member.generation != generation:
                return
            if member.paused:
                member.held.append(go)
                return
            fn(member.machine)
            self._after_member_event(member)

        go()

    def _after_member_event(self, member: SimMember) -> None:
        machine = member.machine
        if machine is None:
            return
        for action in machine.take_actions():
            if isinstance(action, SendMessages):
                for msg in action.messages:
                    self._send_peer(member, msg)
            elif isinstance(action, SendFrame):
                conn = member.conns.get(action.conn)
                if conn is not None:
                    self._to_client(conn, action.frame)
            elif isinstance(action, Persist | SaveSnapshot):
                self._disk_submit(member, action)
            elif isinstance(action, CloseConnection):
                conn = member.conns.pop(action.conn, None)
                if conn is not None:
                    self._break(conn)
            elif isinstance(action, Stop):
                self._removed(member, action.reason)
                return
            elif isinstance(action, SendBackup):
                conn = member.conns.get(action.conn)
                image = action.image
                assert isinstance(image, bytes), "the members build images on the spot here"
                if conn is not None:
                    self._to_client(conn, {**action.header, "t": "ok", "id": action.request_id})
                    for frame in backup_chunk_frames(action.request_id, image):
                        self._to_client(conn, frame)
            elif isinstance(action, LogEvent):
                if self.partitions > 1 and action.event == "transfer_leadership":
                    self.stats["spread_transfers"] += 1
            elif isinstance(action, ExportSpans):
                self._check_spans(member, action)
            elif isinstance(action, PeersChanged):
                pass
        if member.machine is not None and member.machine.next_timer() < member.timer_at:
            # As the runtime's alarm: an input brought the timer forward (keep-alives
            # waiting out their round's gap), so it is set again for the sooner time.
            self._arm_timer(member)
        self._check_member(member)

    def _check_spans(self, member: SimMember, batch: ExportSpans) -> None:
        """Issue 30: a traced request's spans are well formed, in the trace its client
        sent, and at the member's own time."""
        problems = span_problems(batch.spans)
        traces = {span.traceparent for span in batch.spans}
        if not traces <= self.traceparents:
            problems.append(f"spans in a trace no client sent: {sorted(traces)}")
        if batch.anchor != self._now(member):
            problems.append("spans anchored at another time than the member's")
        if problems:
            names = [(s.name, s.start, s.end) for s in batch.spans]
            raise Violation("spans", f"{member.name}: {problems[0]} in {names}")
        self.stats["traced_requests"] += 1
        if any(span.name == FSYNC for span in batch.spans):
            self.stats["traced_commits"] += 1

    def _check_no_spans_held(self) -> None:
        """At the end: no traced request's spans still wait for a write that is done."""
        for member in self.all_members():
            machine = member.machine
            if machine is None:
                continue
            writing = {number for number, job in machine.jobs._jobs if not job.done}
            for index, job in machine.spans.awaiting_writes().items():
                if job not in writing:
                    raise Violation(
                        "spans",
                        f"{member.name}: the spans of the traced entry {index} never left "
                        f"(its write, job {job}, is done)",
                    )

    def _check_member(self, member: SimMember) -> None:
        machine = member.machine
        assert machine is not None
        raft = machine.raft
        checker = self._raft_checker_of(member)
        if checker.observe_role(member.id, raft.term, raft.role is Role.LEADER):
            self.stats["elections"] += 1
            self.trace(f"L{self.world.now}{member.name}{raft.term}")
            if self.partitions > 1:
                self._leader_moved(member)
            checker.check_leader_completeness(member.id, raft.term, _LogView(member))
        checker.observe_commit(member.id, raft.term, raft.commit_index, _LogView(member))
        if self.unproved:
            self._check_unproved(member)
        if self.options.identities:
            table = machine.locks
            # Once per applied index (or image) per member: nothing else moves the counts.
            if self._usage_checked.get(member.name) != (id(table), table.applied_index):
                self._usage_checked[member.name] = (id(table), table.applied_index)
                if _check_usage(member.id, table):
                    self.stats["owned_lease_checks"] += 1

    def _leader_moved(self, member: SimMember) -> None:
        """A partition elected ``member``: counted as a lone move when every other partition
        kept its leader for the last second (one group's failover leaves the others be)."""
        now = self.world.now
        self._leaders[member.partition] = (member.id, now)
        others = [self._leaders.get(p) for p in range(self.partitions) if p != member.partition]
        if all(held is not None and now - held[1] >= US for held in others):
            self.stats["lone_leader_moves"] += 1

    def _check_spread(self) -> None:
        """Once the cluster is healthy (the end of the run, long after the heal), every
        partition has a leader and no member leads more than ceil(P/N) of them."""
        counts: Counter[str] = Counter()
        for partition in range(self.partitions):
            leader = self.leader(partition)
            if leader is None or leader.machine is None:
                raise Violation("spread", f"partition {partition} has no leader at the end")
            counts[leader.id] += 1
            voters = len(leader.machine.raft.voters)
        bound = leader_counts_bound(self.partitions, voters)
        busiest, led = counts.most_common(1)[0]
        self.stats["max_led"] = max(self.stats["max_led"], led)
        if led > bound:
            raise Violation(
                "spread",
                f"{busiest} leads {led} of {self.partitions} partitions at the end "
                f"(at most {bound} with {voters} voters): {dict(counts)}",
            )

    def _check_unproved(self, member: SimMember) -> None:
        """A member added where nothing proves the peer secret never counts as a voter, and
        the leader's members view says why it is a learner."""
        machine = member.machine
        assert machine is not None
        raft = machine.raft
        counted = self.unproved.intersection(raft.voters)
        if counted:
            raise Violation(
                "unproved-voter",
                f"{member.id} counts {sorted(counted)} as voters, though nothing at their "
                "address ever proved the peer secret",
            )
        if raft.role is Role.LEADER:
            for learner in self.unproved.intersection(raft.learners):
                reason = machine.membership.learner_reason(learner, raft, machine.health.proved)
                if "never" not in reason:
                    raise Violation(
                        "unproved-voter",
                        f"the leader {member.id} gives no reason why {learner} is not a voter "
                        f"(it says {reason!r})",
                    )

    # -- the disk ------------------------------------------------------------------

    def _disk_submit(self, member: SimMember, action: Persist | SaveSnapshot) -> None:
        member.disk.append(_DiskJob(action, member.generation))
        if len(member.disk) == 1:
            self._disk_next(member)

    def _disk_next(self, member: SimMember) -> None:
        if not member.disk:
            return
        latency = self.net_rng.randint(150, 1200)
        if self.world.now < member.stall_until:
            latency += ELECTION_US + self.net_rng.randint(0, ELECTION_US)
        generation = member.generation
        group = 1
        if member.slow_write_us:
            # A slow disk writes what queued meanwhile with one fsync (persister.py): one
            # job per fsync would never catch up with a leader's stream of appends.
            latency += self.net_rng.randint(member.slow_write_us // 2, member.slow_write_us)
            group = len(member.disk)
        self.world.after(latency, lambda: self._disk_done(member, generation, group))

    def _disk_done(self, member: SimMember, generation: int, group: int = 1) -> None:
        for _ in range(group):
            if member.generation != generation or not member.disk:
                return
            if not self._disk_write_one(member):
                return
        self._disk_next(member)

    def _disk_write_one(self, member: SimMember) -> bool:
        """Writes the first queued job; False if the member crashed in the middle."""
        job = member.disk.popleft()
        action = job.action
        storage = member.storage
        try:
            if isinstance(action, Persist):
                if action.snapshot is not None:
                    storage.apply_snapshot(action.snapshot)
                    self.stats["snapshot_installs"] += 1
                if action.entries:
                    first = action.entries[0].index
                    prev_term = storage.term(first - 1)
                    storage.append(action.entries)
                    self._raft_checker_of(member).observe_persisted(
                        member.id, action.entries, prev_term
                    )
                if action.hard_state is not None:
                    storage.set_hard_state(action.hard_state)
                    member.acked_hard_state = action.hard_state
            else:
                self._raft_checker_of(member).observe_image(member.id, action.index, action.data)
                existing = storage.snapshot()
                if existing is None or existing.meta.index < action.index:
                    storage.create_snapshot(action.index, action.conf, action.data)
                    self.stats["snapshots_taken"] += 1
                if action.compact_to > storage.first_index() - 1:
                    storage.compact(min(action.compact_to, action.index))
        except SimulatedCrash:
            # The power cut armed by a host crash: every partition's process of the member
            # dies with it, not only the one whose write it landed in.
            self.stats["crashes_mid_write"] += 1
            self.crash_host(member)
            return False
        if isinstance(action, Persist):
            self.on_member(member, lambda m: m.persisted(action.job, self._now(member)))
        return True

    def _now(self, member: SimMember) -> Any:
        return member.clock.instant(self.world.now)

    # -- the peer network --------------------------------------------------------

    def _send_peer(self, member: SimMember, msg: Message) -> None:
        kind = type(msg)
        if kind is VoteRequest or kind is VoteResponse:
            if not msg.pre_vote:  # type: ignore[union-attr]
                member.promised_term = max(member.promised_term, msg.term)
                if kind is VoteResponse and msg.granted:  # type: ignore[union-attr]
                    checker = self._raft_checker_of(member)
                    checker.observe_vote_granted(msg.src, msg.term, msg.dst)
        elif msg.term > member.promised_term:
            member.promised_term = msg.term
        rng = self.net_rng
        if rng.random() < self.drop + self.extra_drop:
            self.stats["dropped"] += 1
            return
        link = self._peer_link(member.name, _process_name(msg.dst, member.partition))
        now = self.world.now
        if now < link.dial_at:
            self.stats["dropped"] += 1  # the link is down: PeerLink.send drops
            return
        link.sent += 1
        mono = member.clock.mono(now)
        if self._observe_link(link, mono):
            self._replace_link(member, link, msg.dst)
            return
        if link.stalled:
            self.stats["stalled"] += 1
            return
        conn, seq = link.conn, link.sent
        if self.packet_loss:
            delay = rng.randint(100, 1500)
            losses = 0
            while losses < MAX_RETRANSMITS and rng.random() < self.packet_loss:
                losses += 1
            delay += RETRANSMIT_US * ((1 << losses) - 1)
            key = (member.name, _process_name(msg.dst, member.partition), conn)
            at = max(self.world.now + delay, self._link_free_at.get(key, 0))
            self._link_free_at[key] = at  # in order, as on one TCP connection
            self.world.at(at, lambda: self._deliver_peer(msg, link, conn, seq))
            return
        copies = 2 if rng.random() < 0.01 else 1
        for _ in range(copies):
            delay = rng.randint(100, 1500) + rng.randint(0, self.extra_delay_us)
            self.world.after(delay, lambda: self._deliver_peer(msg, link, conn, seq))

    def _peer_link(self, src: str, dst: str) -> SimPeerLink:
        """The connection from process ``src`` to process ``dst`` (names: ``n1``, ``n1/p2``)."""
        link = self.peer_links.get((src, dst))
        if link is None:
            partition = self.by_name[src].partition if src in self.by_name else 0
            watch = self.options.link_watch_class(STALL_AFTER_S, FRESH_CONNECTION_US / US)
            link = SimPeerLink(watch, partition)
            self.peer_links[(src, dst)] = link
        return link

    def _replace_link(self, member: SimMember, link: SimPeerLink, peer: str) -> None:
        """The member drops a connection that stopped delivering and dials a new one; the
        runtime tells the machine the link went down (peers.py's on_down)."""
        self.stats["links_replaced"] += 1
        self.trace(f"K{self.world.now}{member.name}{peer}")
        link.replace(self.world.now + self._dial_delay(member.id, peer))
        # After this event, not inside it: the member is in the middle of its actions.
        self.world.after(0, lambda: self.on_member(member, self._link_broke(peer, member, False)))

    def _poll_links(self) -> None:
        """Every running member's look at its outbound connections, as peers.py's
        ``_until_lost`` takes on a timer whether or not anything is written.

        Looked at only when written to, a connection that a cut stalled stayed stalled
        after the heal until its member next wrote to it, and that message was lost with
        it: a member between election rounds writes nothing to its peers for a whole
        (widened) election timeout, so every round after a heal could lose its requests
        to connections the runtime would have replaced during the cut (seed 3601 at
        2afbbb1: no leader for 3.1 s after the heal).
        """
        self.world.after(LINK_POLL_US, self._poll_links)
        now = self.world.now
        for (src, dst), link in list(self.peer_links.items()):
            member = self.by_name.get(src)
            if member is None or member.machine is None or member.paused or now < link.dial_at:
                continue  # a stopped process looks at nothing; a link being dialled has no watch
            if self._observe_link(link, member.clock.mono(now)):
                self._replace_link(member, link, _node_of_process(dst))

    @staticmethod
    def _observe_link(link: SimPeerLink, mono: float) -> bool:
        """The member's look at one connection (peers.py's, from TCP_INFO): what is
        outstanding and acknowledged, and the sender's retransmission timeout, which TCP
        doubles at each retransmission that went unanswered since the last progress."""
        since = link.watch.waiting_since
        waited_us = 0.0 if since is None else (mono - since) * US
        doublings = 0
        while (
            doublings < MAX_RETRANSMIT_DOUBLINGS
            and RETRANSMIT_US * ((2 << doublings) - 1) <= waited_us
        ):
            doublings += 1
        return link.watch.observe(
            mono,
            outstanding=link.sent > link.acked,
            acknowledged=link.acked,
            retransmit_after=RETRANSMIT_US * (1 << doublings) / US,
        )

    def _dial_delay(self, src: str, dst: str) -> int:
        """How long a redial takes: a round trip, or a failed try and a back-off when the
        network between the two is still cut."""
        rng = self.net_rng
        delay = rng.randint(25 * MS, 75 * MS)
        if self.cuts[(src, dst)] or self.cuts[(dst, src)]:
            delay += rng.randint(250 * MS, 750 * MS)
        if self.packet_loss:
            # The SYN or its answer lost: the kernel resends after 1 s, then 2 s, ...
            lost = 1 - (1 - self.packet_loss) ** 2
            wait = FRESH_CONNECTION_US
            for _ in range(MAX_RETRANSMITS):
                if rng.random() >= lost:
                    break
                delay += wait
                wait *= 2
        return delay

    def _reset_links(self, node: str) -> None:
        """A process died: every connection to and from it is gone; new ones start fresh."""
        for (src, dst), link in self.peer_links.items():
            if node in (src, dst):
                link.replace(self.world.now)

    def _deliver_peer(self, msg: Message, link: SimPeerLink, conn: int, seq: int) -> None:
        if link.conn != conn:
            return  # lost with the connection it was written on
        if self.cuts[(msg.src, msg.dst)]:
            # TCP keeps the message and backs off; the connection delivers nothing more
            # until the sender replaces it.
            self.stats["cut"] += 1
            link.stalled = True
            return
        if link.stalled:
            self.stats["stalled"] += 1
            return
        member = self.groups[link.partition].get(msg.dst)
        if member is None or member.machine is None:
            return
        # The peer's kernel acknowledges it (even while the process is paused); the
        # acknowledgement is lost to a cut in the other direction.
        delay = self.net_rng.randint(100, 1500)
        self.world.after(delay, lambda: self._acknowledge_peer(msg, link, conn, seq))
        self.stats["delivered"] += 1
        self.on_member(member, lambda m: m.peer_messages(msg.src, (msg,), self._now(member)))

    def _acknowledge_peer(self, msg: Message, link: SimPeerLink, conn: int, seq: int) -> None:
        if link.conn == conn and not self.cuts[(msg.dst, msg.src)]:
            link.acked = max(link.acked, seq)

    # -- client connections ----------------------------------------------------------

    def _link_ok(self, proc: ClientProc, member: SimMember) -> bool:
        return not self.cuts[(proc.name, member.id)]

    def _latency(self, proc: ClientProc | None = None) -> int:
        if proc is not None and proc.net_rng is not None:
            return proc.net_rng.randint(100, 2000)
        extra = self.slow.get(proc.name, 0) if proc is not None else 0
        slow = self.net_rng.randint(extra // 2, extra) if extra else 0
        return self.net_rng.randint(100, 2000) + slow

    def _own_latency(self, proc: ClientProc) -> int:
        """A connection's latency: a watcher's own draw, else the network's."""
        return self._latency(proc if proc.net_rng is not None else None)

    def connect(self, client: SimClient, member: SimMember) -> SimConn:
        conn = SimConn(client, member)
        client.conn = conn
        arrive = self.world.now + self._own_latency(client.proc)

        def syn() -> None:
            if conn.broken or client.conn is not conn:
                return
            if not self._link_ok(client.proc, member):
                return  # SYN lost: the client times out
            if member.machine is None or member.generation != conn.generation:
                self.world.after(self._own_latency(client.proc), lambda: self._break(conn))
                return
            if member.paused:
                member.held.append(syn)
                return
            identity = client.proc.identity
            if identity and member.machine.locks.identities.get(identity) is None:
                # The handshake finds no such identity (dlm.auth.IdentityResponder): refused.
                self.stats["identity_refused"] += 1
                self.world.after(self._own_latency(client.proc), lambda: self._break(conn))
                return
            number = member.next_conn
            member.next_conn += 1
            conn.number = number
            member.conns[number] = conn
            member.machine.client_connected(number, client.proc.name, identity)
            conn.connected = True
            outbox, conn.outbox = conn.outbox, []
            for frame in outbox:
                self._deliver_to_member(conn, frame)

        self.world.at(arrive, syn)
        return conn

    def client_send(self, conn: SimConn, frame: dict[str, Any]) -> None:
        if (
            self.options.late_part_opens
            and frame.get("t") == "open_lease"
            and conn.member.partition != partition_of(frame.get("lease", ""), self.partitions)
            and self.world.now + 2 * US < self.heal_at  # a fault: over by the heal
            and self.late_rng.random() < self.options.late_part_opens
        ):
            self.late_answers[(conn, frame.get("id"))] = int(frame.get("ttl_ms") or 1000) * MS
        if not conn.connected:
            conn.outbox.append(frame)
            return
        at = max(conn.to_member_at, self.world.now + self._latency(conn.client.proc))
        conn.to_member_at = at
        self.world.at(at, lambda: self._deliver_to_member(conn, frame))

    def _deliver_to_member(self, conn: SimConn, frame: dict[str, Any]) -> None:
        member = conn.member
        if conn.broken or member.generation != conn.generation or member.machine is None:
            return
        if not self._link_ok(conn.client.proc, member):
            return

        def feed(machine: NodeMachine) -> None:
            # As the runtime (server.py, client_data): the frame without a pump, then a pump
            # only if the machine has work (keep-alives waiting for their round have none).
            now = self._now(member)
            machine.client_frame(conn.number, frame, now, pump=False)
            if machine.needs_pump(now):
                machine.pump(now)

        self.on_member(member, feed)

    def _to_client(self, conn: SimConn, frame: dict[str, Any]) -> None:
        at = max(conn.to_client_at, self.world.now + self._latency(conn.client.proc))
        late = self.late_answers.pop((conn, frame.get("id")), None) if self.late_answers else None
        if late is not None:
            at += int(late * self.late_rng.uniform(1.0, 1.5))
            self.stats["late_part_opens"] += 1
        conn.to_client_at = at

        def arrive() -> None:
            if conn.broken:
                return
            if not self._link_ok(conn.client.proc, conn.member):
                watcher = conn.client.watcher
                if watcher is not None and frame.get("t") == "watch":
                    watcher.lost(conn)
                return
            conn.client.proc.run(lambda: self._client_receives(conn, frame))

        self.world.at(at, arrive)

    def _client_receives(self, conn: SimConn, frame: dict[str, Any]) -> None:
        client = conn.client
        if client.conn is not conn:
            return
        if client.watcher is not None and frame.get("t") in ("watch", "watch_end"):
            client.watcher.pushed(conn, frame)
            return
        if frame.get("t") == "grant" and "id" not in frame:
            client.pushes.append(frame)
            self._check_grant_wait(client)
            return
        if frame.get("t") == "chunk":
            client.chunks.append(frame)
            return
        if self.partitions > 1 and frame.get("code") == "WRONG_PARTITION":
            self.stats["wrong_partition"] += 1
        waiting = client.waiting
        if waiting is not None and frame.get("id") == waiting[0]:
            client.waiting = None
            waiting[1](frame)

    def _break(self, conn: SimConn) -> None:
        """The connection failed (RST); the client learns it after a moment."""
        if conn.broken:
            return
        conn.broken = True
        member = conn.member
        member.conns.pop(conn.number, None)
        if member.machine is not None and member.generation == conn.generation and conn.connected:
            self.on_member(member, lambda m: m.client_closed(conn.number))

        def tell() -> None:
            client = conn.client
            if client.conn is not conn:
                return
            client.proc.run(lambda: self._client_broken(client, conn))

        self.world.after(self._own_latency(conn.client.proc), tell)

    def _client_broken(self, client: SimClient, conn: SimConn) -> None:
        if client.conn is not conn:
            return
        client.conn = None
        if client.watcher is not None:
            client.watcher.broken(conn)
        waiting, client.waiting = client.waiting, None
        if waiting is not None:
            waiting[1](core.Failed("connection broken"))
        grant_wait, client.grant_wait = client.grant_wait, None
        if grant_wait is not None:
            grant_wait[2](core.Failed("connection broken"))

    def client_hang_up(self, conn: SimConn) -> None:
        conn.broken = True
        member = conn.member

        def fin() -> None:
            if member.generation != conn.generation or member.machine is None:
                return
            if not conn.connected or not self._link_ok(conn.client.proc, member):
                return
            member.conns.pop(conn.number, None)
            self.on_member(member, lambda m: m.client_closed(conn.number))

        self.world.after(self._own_latency(conn.client.proc), fin)

    # -- performing a flow's actions ---------------------------------------------------

    def perform(self, runner: FlowRunner, action: Any) -> None:
        client = runner.client
        proc = client.proc
        if isinstance(action, core.Sleep):
            proc.after(action.seconds, lambda: runner.step(None))
            return
        if isinstance(action, core.AwaitGrant):
            conn = client.conn
            if (
                conn is None
                or (conn.route or f"{conn.member.id}:7700") != action.addr
                or conn.member.partition != self._partition_for(proc, action)
                or conn.broken
            ):
                runner.step(core.Failed("connection lost while waiting"))
                return
            client.wait_token += 1
            token = client.wait_token

            def resume(outcome: Any) -> None:
                if client.wait_token == token:
                    client.wait_token += 1
                    runner.step(outcome)

            client.grant_wait = (action.lease, action.key, resume)
            proc.after(action.timeout, lambda: self._grant_timeout(client, token))
            self._check_grant_wait(client)
            return
        assert isinstance(action, core.Send)
        # (A connection to partition i > 0 starts with its preamble: the member's
        # supervisor hands it to that partition's process.)
        partition = self._partition_for(proc, action)
        dial, target, _ = core.split_route(action.addr)
        gateway = self.gateways.get(_node_of(dial))
        conn = client.conn
        if gateway is not None:
            if (
                conn is None
                or conn.route != action.addr
                or conn.member.partition != partition
                or conn.broken
            ):
                # (A connection per route and partition, as the driver keeps them: the same
                # gateway's connection for another partition reached that one's process.)
                client.drop()
                member = self._through_gateway(gateway, partition, target)
                if member is None:
                    # Refused, or closed without a word: the client hears it after a moment.
                    self.stats["gateway_closed"] += 1
                    proc.after(
                        self._own_latency(proc) / US,
                        lambda: runner.step(core.Failed("connection closed by the gateway")),
                    )
                    return
                conn = self.connect(client, member)
                conn.route = action.addr
                conn.gateway = gateway
                gateway.conns.append(conn)
                client.ctx.gateways.add(dial)  # the gateway's notice, as the driver reads it
                self.stats["gateway_connections"] += 1
        else:
            member = self.groups[partition][_node_of(action.addr)]
            if conn is None or conn.member is not member or conn.broken or conn.route:
                client.drop()
                conn = self.connect(client, member)
        if action.drop_pushes_for is not None:
            lease, key = action.drop_pushes_for
            client.pushes = [
                p for p in client.pushes if (p.get("lease"), p.get("key")) != (lease, key)
            ]
        client.next_id += 1
        rid = client.next_id
        client.wait_token += 1
        token = client.wait_token

        def resume_reply(outcome: Any) -> None:
            if client.wait_token == token:
                client.wait_token += 1
                if isinstance(outcome, dict) and (
                    (outcome.get("t") == "error" and "id" not in outcome)
                    or (conn.route is not None and core.redial_through_gateway(outcome))
                ):
                    client.drop()  # (through a gateway, as the driver does: choose again)
                runner.step(outcome)

        client.waiting = (rid, resume_reply)
        request = self.options.fit_request(action.request, self.options.peer_version)
        self.client_send(conn, {**request, "id": rid})

        def timeout() -> None:
            if client.wait_token != token:
                return
            client.waiting = None
            client.drop()  # a late reply would confuse a reused connection
            resume_reply(core.Failed("no reply in time"))

        proc.after(action.timeout, timeout)

    def _through_gateway(
        self, gateway: SimGateway, partition: int, target: str | None
    ) -> SimMember | None:
        """The member ``gateway`` relays a new connection to (None: it closes it), by its
        router, as relay.py dials: the plan's members in order, a down one skipped (and
        forgotten as a hint). Checks the gateway's two promises."""
        if not gateway.up:
            return None
        plan = gateway.router.plan(partition, target)
        if plan is None:
            self.stats["gateway_refused"] += 1
            return None
        named = canonical(target) if target is not None else None
        for address in plan:
            if address not in gateway.members:
                raise Violation(
                    "gateway-open-relay",
                    f"{gateway.name} relayed to {address}, not one of its members",
                )
            if named is not None and address != named:
                raise Violation(
                    "gateway-target",
                    f"{gateway.name} relayed a connection naming {named} to {address}",
                )
            member = self.groups[partition].get(_node_of(address))
            if member is None or member.machine is None or member.removed:
                gateway.router.dial_failed(partition, address)
                continue
            return member
        return None

    def _gateway_outsider(self, gateway: SimGateway) -> None:
        """A hostile client asks the gateway for an address that is no member of it."""
        self.stats["gateway_outsider"] += 1
        self._through_gateway(gateway, 0, "x9:7700")

    def _gateways_for(self, proc: ClientProc) -> list[str] | None:
        """The addresses a library client knows, when it goes through gateways (half of
        them do, by the seed): the gateways', in its own order."""
        if not self.gateways:
            return None
        rng = self.rng_for(f"gateway-client-{proc.name}")
        if rng.random() < 0.5:
            return None
        addresses = [g.address for g in self.gateways.values()]
        rng.shuffle(addresses)
        return addresses

    def _schedule_gateways(self) -> None:
        """Each gateway crashes now and then before the heal and comes back a moment later;
        a hostile client asks each for outsiders."""
        for gateway in self.gateways.values():
            rng = self.rng_for(f"gateway-{gateway.name}")
            for _ in range(rng.randint(1, 3)):
                down_at = rng.randint(US, max(US + 1, self.heal_at - US))
                back_at = min(self.heal_at, down_at + rng.randint(US // 5, 2 * US))
                self.world.at(down_at, partial(self._gateway_crash, gateway))
                self.world.at(back_at, gateway.restart)
            for _ in range(3):
                at = rng.randint(0, self.heal_at)
                self.world.at(at, partial(self._gateway_outsider, gateway))

    def _gateway_crash(self, gateway: SimGateway) -> None:
        if gateway.up:
            self.stats["gateway_crashes"] += 1
            self.trace(f"G{self.world.now}{gateway.name}")
            gateway.crash()

    def _partition_for(self, proc: ClientProc, action: Any) -> int:
        return proc.pinned if proc.pinned is not None else _partition_of_action(action)

    def _grant_timeout(self, client: SimClient, token: int) -> None:
        if client.wait_token != token or client.grant_wait is None:
            return
        _, _, resume = client.grant_wait
        client.grant_wait = None
        resume(None)

    def _check_grant_wait(self, client: SimClient) -> None:
        wait = client.grant_wait
        if wait is None:
            return
        lease, key, resume = wait
        for i, push in enumerate(client.pushes):
            if push.get("lease") == lease and push.get("key") == key:
                del client.pushes[i]
                client.grant_wait = None
                resume(push)
                return

    # -- membership ----------------------------------------------------------------------

    def _removed(self, member: SimMember, reason: str) -> None:
        """The member learned it was removed and stops, for good."""
        if "removed" not in reason:
            raise Violation("stop", f"{member.id} asked to stop: {reason}")
        self.stats["removed_stopped"] += 1
        self.trace(f"X{self.world.now}{member.name}")
        member.removed = True
        member.machine = None
        member.generation += 1
        member.disk.clear()
        for conn in list(member.conns.values()):
            self._break(conn)
        member.conns.clear()

    def current_ids(self) -> list[NodeId]:
        return [m.id for m in self.members.values() if not m.removed]

    def _admin(self, proc: ClientProc) -> Script:
        """An operator growing, shrinking and reshaping the cluster, one change at a time."""
        rng = proc.rng
        admin = SimClient(proc, "admin")
        while self.world.now < self.heal_at - 2 * US:
            yield Sleep(rng.uniform(0.6, 2.0))
            leader = self.leader()
            if leader is None or leader.machine is None:
                continue
            raft = leader.machine.raft
            voters = list(raft.voters)
            unproved = sorted(self.unproved.intersection(raft.learners))
            request: MemberChange
            if unproved:
                # Asked to promote once (the leader must refuse), then taken out again.
                mallory = unproved[0]
                if mallory not in self._promote_asked:
                    self._promote_asked.add(mallory)
                    request = MemberPromote(id=0, member=mallory, seq=0)
                    self.stats["unproved_promotions_asked"] += 1
                else:
                    request = MemberRemove(id=0, member=mallory, seq=0)
                    self.stats["unproved_removed"] += 1
            elif raft.learners:
                continue  # the leader promotes it once it has caught up
            elif rng.random() < UNPROVED_ADDS:
                # No process is started there: only the stranger would answer, without
                # the peer secret.
                mallory = next(self._stranger_names)
                self.unproved.add(mallory)
                request = MemberAdd(id=0, member=mallory, address=f"{mallory}:7700", seq=0)
                self.stats["unproved_added"] += 1
            elif len(voters) < 5 and (len(voters) <= 3 or rng.random() < 0.5):
                new_id = next(self._spares)
                request = MemberAdd(id=0, member=new_id, address=f"{new_id}:7700", seq=0)
                # The new member's process starts as `dlm node start --join` does: empty.
                self._spawn_member(new_id)
                self.stats["members_added"] += 1
            else:
                victim = leader.id if rng.random() < 0.3 else rng.choice(voters)
                request = MemberRemove(id=0, member=victim, seq=0)
                self.stats["members_removed"] += 1
            self.trace(f"M{self.world.now}{type(request).__name__}{request.member}")
            admin.ctx.router.redirect(f"{leader.id}:7700")
            try:
                yield RunFlow(admin, core.member_change_flow(admin.ctx, request))
            except DlmError:
                self.stats["member_changes_refused"] += 1

    def _backup_taker(self, proc: ClientProc) -> Script:
        """An operator running ``dlm snapshot save`` now and then, through the client's own
        flow and image assembly; each finished backup is checked (backupcheck.py)."""
        rng = proc.rng
        client = SimClient(proc, "backup")
        while self.world.now < self.heal_at:
            yield Sleep(rng.uniform(0.5, 2.5))
            floor = self.backups.floor()
            client.chunks = []
            try:
                _, reply = yield RunFlow(client, core.snapshot_save_flow(client.ctx))
                header = core.read_reply(SnapshotHeader, reply)
                assembly = core.ImageAssembly(reply["id"])
                for _ in range(400):  # bounded: the chunks follow the header on its link
                    while client.chunks and not assembly.done:
                        assembly.take(client.chunks.pop(0))
                    if assembly.done or client.conn is None or client.conn.broken:
                        break
                    yield Sleep(0.01)
            except DlmError:
                self.stats["backups_refused"] += 1
                continue
            if not assembly.done:
                self.stats["backups_cut_off"] += 1
                continue
            self.trace(f"B{self.world.now}{header.index}")
            self.backups.check(floor, header, assembly.image())
            self.stats["backups_checked"] += 1

    def _identity_admin(self, proc: ClientProc) -> Script:
        """An admin who adds the workload's identities (``TEAMS``), and now and then removes
        one while its clients hold locks, adding it back a few seconds later. A removed
        identity's connections close and its clients cannot connect again; its leases are
        renewed by nobody, so they run out at their TTL, after each holder's own deadline
        (lockcheck.py's checks; permcheck.py: the removal ends no lease itself)."""
        rng = proc.rng
        admin = SimClient(proc, "operator")

        def verifier() -> dict[str, bytes]:
            return {
                "key_id": rng.randbytes(8),
                "stored_key": rng.randbytes(32),
                "server_key": rng.randbytes(32),
            }

        def change(request: Any, tries: int = 200) -> Generator[RunFlow | Sleep, Any, bool]:
            for _ in range(tries):  # until the cluster runs version 3 (4) and takes it
                if self.world.now >= self.heal_at:
                    return False
                try:
                    yield RunFlow(admin, core.read_flow(admin.ctx, request))
                    return True
                except DlmError:
                    yield Sleep(rng.uniform(0.1, 0.4))
            return False

        def set_limits() -> Generator[RunFlow | Sleep, Any, None]:
            """Now and then an admin gives a team its own, tight quotas (``dlm auth set``),
            or puts them back to the default: permcheck.py checks they hold."""
            if not self.options.identity_limits or self.options.peer_version < 4:
                return
            if limits_rng.random() < 0.3:
                return
            name = limits_rng.choice(sorted(TEAMS))
            leases, held = limits_rng.choice((0, 1, 1, 2)), limits_rng.choice((0, 1, 1, 2))
            self.trace(f"I{self.world.now}limits{name}{leases}{held}")
            request = AuthSet(id=0, name=name, max_leases=leases, max_locks=held)
            if (yield from change(request, tries=10)):
                self.stats["identity_limits_set"] += 1

        limits_rng = self.rng_for("identity-limits")
        for name, prefixes in TEAMS.items():
            yield from change(
                AuthAdd(id=0, name=name, role="client", prefixes=list(prefixes), **verifier())
            )
        yield from set_limits()
        while self.world.now < self.heal_at - 3 * US:
            yield Sleep(rng.uniform(2.0, 5.0))
            yield from set_limits()
            if rng.random() < 0.5:
                continue
            name = rng.choice(sorted(TEAMS))
            self.trace(f"I{self.world.now}remove{name}")
            if (yield from change(AuthRemove(id=0, name=name))):
                self.stats["identities_removed"] += 1
            yield Sleep(rng.uniform(1.0, 3.0))
            request = AuthAdd(
                id=0, name=name, role="client", prefixes=list(TEAMS[name]), **verifier()
            )
            yield from change(request)

    def _settings_admin(self, proc: ClientProc) -> Script:
        """An admin who now and then sets the cluster's max-ttl (`dlm config set max-ttl`)
        to a value below or above the TTLs the clients open and update leases with, or
        unsets it: the leader refuses what is above it, and every replica again at apply
        (a request proposed before a lower max-ttl committed)."""
        rng = self.rng_for("cluster-settings-admin")
        admin = SimClient(proc, "settings")
        admin.ctx.timeout = 1.0  # each request settles before the heal
        # The default-ttl first (its own stream of draws: the max-ttl's stay as they were).
        default_ttl = self.rng_for("cluster-settings-default-ttl").choice((1000, 1500, 2000))
        self.leases_ttl_max_ms = max(self.leases_ttl_max_ms, default_ttl)
        request = ConfigSet(id=0, setting="default-ttl", value_ms=default_ttl)
        taken = yield from self._config_set(admin, request, rng, self.heal_at - 3 * US)
        if taken is None:
            return
        if taken:
            self.default_ttl_ms = default_ttl
            self.stats["default_ttl_set"] += 1
        while self.world.now < self.heal_at - 3 * US:
            yield Sleep(rng.uniform(1.0, 4.0))
            if self.world.now >= self.heal_at - 3 * US:
                return
            value = rng.choice((0, 1000, 1000, 1500, 2500))
            self.trace(f"S{self.world.now}max-ttl{value}")
            request = ConfigSet(id=0, setting="max-ttl", value_ms=value)
            taken = yield from self._config_set(admin, request, rng, self.heal_at - 2 * US)
            if taken is None:
                return
            if taken:
                self.stats["max_ttl_set"] += 1

    def _config_set(
        self, admin: SimClient, request: ConfigSet, rng: random.Random, stop_at: int
    ) -> Generator[RunFlow | Sleep, Any, bool | None]:
        """``request`` sent until the cluster runs version 5 and takes it (at most 10
        tries): True once taken, False if never, None when ``stop_at`` came first."""
        for _ in range(10):
            if self.world.now >= stop_at:
                return None
            try:
                yield RunFlow(admin, core.read_flow(admin.ctx, request))
                return True
            except DlmError:
                yield Sleep(rng.uniform(0.1, 0.4))
        return False

    def _spawn_member(self, node_id: NodeId) -> None:
        member = SimMember(self, node_id, self.backend.fresh(node_id))
        self.members[node_id] = member
        self.by_name[node_id] = member
        for other in self.members.values():
            if other.machine is not None and other is not member:
                other.machine.peer_version(node_id, self.options.peer_version)
        self._boot(member)

    # -- crash, restart, pause ------------------------------------------------------

    def crash_host(self, member: SimMember) -> None:
        """``member``'s host dies: every partition's process of it (kill -9 of the member),
        and its supervisor with them (the restarts it had planned die with it)."""
        for process in self.host(member):
            self.crash(process)
        self.supervisors.pop(member.id, None)

    # -- a member's supervisor (partitioned runs) ---------------------------------------

    def _supervisor_now(self) -> float:
        """The supervisor's monotonic clock (its event loop's time): only differences count."""
        return self.world.now / US

    def _start_supervisor(self, member: SimMember) -> None:
        """``member``'s supervisor starts (with the member): a fresh restart policy, told of
        each of the member's partition processes that runs."""
        self.supervisors[member.id] = self.options.restart_policy_class(self.partitions)
        for process in self.host(member):
            if process.up:
                self._tell_serving(process)

    def _tell_serving(self, process: SimMember) -> None:
        """The supervisor started ``process`` and hears it serve, as supervisor.py tells the
        policy: ``started`` at the spawn, ``serving`` at the child's SERVING (a simulated
        process serves as soon as it boots)."""
        policy = self.supervisors.get(process.id)
        if policy is not None:
            now = self._supervisor_now()
            policy.started(process.partition, now)
            policy.serving(process.partition, now)

    def crash_partition(self, process: SimMember) -> None:
        """One partition's process dies alone (kill -9 of the child): its member's supervisor
        hears it exit and does what its restart policy (dlm/node/supervision.py) decides, as
        supervisor.py does: start it again after the delay, leave it down, or stop every
        partition of the member and exit (the member then stays down: nothing restarts it)."""
        policy = self.supervisors.get(process.id)
        if process.machine is None or process.removed or policy is None:
            return
        self.crash(process)
        verdict = policy.exited(process.partition, -signal.SIGKILL, self._supervisor_now())
        if isinstance(verdict, GiveUp):
            self.stats["supervisors_gave_up"] += 1
            self.trace(f"G{self.world.now}{process.id}")
            for other in self.host(process):
                self.crash(other)
                other.abandoned = True
            self.supervisors.pop(process.id, None)
            return
        if isinstance(verdict, Leave):
            self.stats["partitions_left_down"] += 1
            process.abandoned = True
            return
        self.stats["partition_restarts"] += 1
        restart_at = self.world.now + round(verdict.delay_s * US)
        self.world.at(restart_at, partial(self._supervised_restart, process, policy))

    def _supervised_restart(self, process: SimMember, policy: RestartPolicy) -> None:
        # A supervisor that died since (its host crashed) starts nothing; the member's next
        # start brings every partition back.
        if self.supervisors.get(process.id) is not policy:
            return
        self.restart(process)
        if any(other.paused for other in self.host(process)):
            process.paused = True  # its host is stopped (the pause fault): so is the child

    def crash(self, member: SimMember) -> None:
        """One member process dies (with one partition: the member)."""
        if member.machine is None or member.removed:
            return
        acked = member.acked_hard_state
        checker = self._raft_checker_of(member)
        checker.observe_hard_state(member.id, acked.term, acked.vote)
        # A term adopted but not yet durable is legitimately forgotten by a crash (nothing
        # was promised in it: messages that promise wait for the disk).
        checker.max_term[member.id] = acked.term
        member.machine = None
        member.generation += 1
        member.paused = False
        member.held.clear()
        member.disk.clear()
        for conn in list(member.conns.values()):
            self._break(conn)
        member.conns.clear()
        member.storage = self.backend.after_crash(member.name, member.storage)
        self._reset_links(member.name)
        self.stats["crashes"] += 1
        self.trace(f"C{self.world.now}{member.name}")
        # The others' links to a crashed process break at once and their redials are
        # refused, and the runtime says so (server.py: peer_unreachable(gone=True); a
        # follower of it then campaigns sooner).
        for other in list(self._group_of(member).values()):
            if other is not member and other.up:
                self.on_member(other, self._link_broke(member.id, other))

    def _take_backup(self, end: int) -> None:
        """A backup of the most advanced member's applied state (as `dlm snapshot save`
        takes one from the leader), restored at ``end`` after every member and its data is
        lost (once a run, and early enough for the quarantine to pass before the heal)."""
        if self.stats["restores"] or self.world.now > self.heal_at // 2:
            return
        running = [m for m in self.members.values() if m.machine is not None and not m.removed]
        if not running:
            return
        source = max(running, key=lambda m: m.machine.locks.applied_index if m.machine else 0)
        assert source.machine is not None
        machine = source.machine
        # The node's image, as `dlm snapshot save` sends it (the run ledger included).
        image = node_image(machine.locks, machine.raft, machine.membership)
        backup = (machine.locks.applied_index, machine.raft.term, lock_machine_of(image))
        self.stats["restores"] += 1
        self.world.at(end, partial(self._restore, *backup))

    def _recover(self) -> None:
        """Majority lost: from the survivor whose log goes furthest (highest last term, then
        index), everything its log holds, committed or not, as `dlm node recover` does."""
        ids = self.current_ids()

        def last(member: SimMember) -> tuple[int, int]:
            storage = member.storage
            index = storage.last_index()
            return storage.term(index), index

        best = max((self.members[n] for n in ids), key=last)
        storage = best.storage
        snap = storage.snapshot()
        machine = lock_machine_of(snap.data) if snap is not None else locks.LockStateMachine()
        index = storage.last_index()
        first = max(storage.first_index(), machine.applied_index + 1)
        for entry in storage.entries(first, index + 1) if index >= first else []:
            if entry.kind is EntryKind.NORMAL:
                # Entries no member applied yet may grant and skip too: the checker hears.
                outcome = machine.apply(entry.index, entry.data)
                self.ledger_check.applied(outcome, machine.version)
                self.max_ttl_checkers.setdefault(0, MaxTtlChecker()).applied(outcome)
            else:
                machine.skip(entry.index)
        self.stats["recoveries"] += 1
        self._restore(index, storage.term(index), machine)

    def _restore(self, index: int, term: int, machine: locks.LockStateMachine) -> None:
        """Every member stops and loses its data; each is rebuilt from the backup as a
        member of a new incarnation (dlm/node/incarnation.py: the token jump, the
        quarantine), as `dlm node restore` builds them, and started."""
        ids = self.current_ids()
        members = {n: f"{n}:7700" for n in ids}
        self.ledger_check.restored(index)
        # As the runbook says: a quarantine that covers the longest TTL any client uses
        # (here the simulated clients' longest lease or hold, not the 30 s floor).
        quarantine_ms = max(locks.longest_ttl_ms(machine), RESTORE_QUARANTINE_MS)
        new = new_incarnation(
            machine,
            last_index=index,
            bump=self.options.restore_bump,
            members=members,
            quarantine_ms=quarantine_ms if self.options.restore_quarantine else 0,
        )
        self.trace(f"B{self.world.now}{new.index}")
        self.max_ttl_checkers.setdefault(0, MaxTtlChecker()).restored(index, new.index + 1)
        term = max([term, *(self.members[n].promised_term for n in ids)])
        term = max([term, *(self.members[n].acked_hard_state.term for n in ids)])
        conf = ConfState(voters=tuple(sorted(ids)))
        self.checker.new_incarnation(max(m.storage.last_index() for m in self.members.values()))
        for node_id in ids:
            member = self.members[node_id]
            self.crash(member)
            storage = self.backend.fresh(node_id)
            storage.apply_snapshot(Snapshot(SnapshotMeta(new.index, term, conf), new.image))
            storage.set_hard_state(HardState(term, None, new.index))
            member.storage = storage
            member.incarnation = new.index
            member.promised_term = term
        # Raft's own history starts again (the old log is gone by design), and so does the
        # record of executed requests: a request run after the backup may run again. What
        # clients saw holds across: one holder at a time, and tokens rising per key.
        self.raft_checker = SafetyChecker()
        self._commit_voters.clear()
        self.checker.executed.clear()
        self.checker.renewals.clear()
        # The old incarnation's leases: their clients may count on a TTL set after the
        # backup, which the restored lease does not have; the quarantine covers them.
        self.lease_views.clear()
        # The log's indexes start again too (by the bump, or, in a mutant, not at all):
        # each watcher starts a new watch, checked against the new log only.
        self.watch_truth.new_incarnation(self.watchers)
        for node_id in ids:
            self.restart(self.members[node_id])

    def _link_broke(
        self, dead: str, other: SimMember, gone: bool = True
    ) -> Callable[[NodeMachine], None]:
        def tell(machine: NodeMachine) -> None:
            machine.peer_unreachable(dead, self._now(other), gone=gone)

        return tell

    def restart(self, member: SimMember) -> None:
        if member.up or member.removed or member.abandoned:
            return
        self._boot(member)
        if self.partitions > 1:
            if member.id not in self.supervisors:
                self._start_supervisor(member)  # the member starts: its supervisor first
            else:
                self._tell_serving(member)
        recovered = member.storage.initial_state()[0]
        checker = self._raft_checker_of(member)
        checker.observe_hard_state(member.id, recovered.term, recovered.vote)
        assert member.machine is not None
        status = member.machine.raft.status()
        checker.check_promises(member.id, status.term, status.vote, member.promised_term)
        self.stats["restarts"] += 1
        self.trace(f"R{self.world.now}{member.name}")

    def restart_host(self, member: SimMember) -> None:
        for process in self.host(member):
            self.restart(process)

    def pause(self, member: SimMember) -> None:
        """The member's host is paused (SIGSTOP of the member: every partition's process)."""
        for process in self.host(member):
            process.paused = True
        self.trace(f"P{self.world.now}{member.id}")

    def resume_host(self, member: SimMember) -> None:
        for process in self.host(member):
            self.resume(process)

    def resume(self, member: SimMember) -> None:
        if not member.paused:
            return
        member.paused = False
        held, member.held = member.held, []
        for fn in held:
            fn()
        self._arm_timer(member)

    def pause_client(self, proc: ClientProc) -> None:
        proc.pauses += 1
        proc.paused = True

    def resume_client(self, proc: ClientProc, *, force: bool = False) -> None:
        proc.pauses = 0 if force else max(0, proc.pauses - 1)
        if not proc.paused or proc.pauses:
            return
        proc.paused = False
        deferred, proc.deferred = proc.deferred, []
        for fn in deferred:
            proc.run(fn)

    def leader(self, partition: int = 0) -> SimMember | None:
        """The partition's leader that is running (of the highest term), if any."""
        best: SimMember | None = None
        for member in self.groups[partition].values():
            machine = member.machine
            if machine is None or member.paused or machine.raft.role is not Role.LEADER:
                continue
            if best is None or machine.raft.term > best.machine.raft.term:  # type: ignore[union-attr]
                best = member
        return best

    # -- faults ------------------------------------------------------------------------

    def _stale_expires(self) -> None:
        """Now and then, the leader's log gets an Expire of a lease id's *older* incarnation:
        legal input the state machine must ignore (an Expire names what it expires)."""
        if self.world.now >= self.heal_at:
            return
        self.world.after(self.fault_rng.randint(100 * MS, 600 * MS), self._stale_expires)
        leader = self.leader()
        if leader is None or leader.machine is None:
            return
        machine = leader.machine
        reused = [
            (lease, seen)
            for lease, seen in self.incarnations.items()
            if len(seen) > 1 and machine.locks.lease(lease) is not None
        ]
        if not reused:
            return
        lease, seen = self.fault_rng.choice(reused)
        current = machine.locks.lease(lease)
        assert current is not None
        older = [i for i in seen if i not in (current.incarnation, 0)]
        if not older:
            return
        cmd = locks.ExpireCommand(lease, self.fault_rng.choice(older), 0)
        machine.raft.propose(locks.encode_command(cmd))
        self.faults["stale_expire"] += 1
        self.trace(f"X{self.world.now}{lease}")
        self.on_member(leader, lambda m: m.timer(self._now(leader)))

    def _schedule_faults(self) -> None:
        opts = self.options
        rng = self.fault_rng
        kinds = [k for k in FAULT_KINDS if opts.fault_weights.get(k, 0) > 0]
        weights = [opts.fault_weights[k] for k in kinds]
        total = rng.randint(*opts.fault_count)
        first = 2 * ELECTION_US
        for _ in range(total):
            kind = rng.choices(kinds, weights)[0]
            start = rng.randint(first, self.heal_at - 1)
            length = rng.randint(200 * MS, 3000 * MS)
            end = min(self.heal_at, start + length)
            self.world.at(start, partial(self.start_fault, kind, end))

    def start_fault(self, kind: str, end: int) -> None:
        if self.world.now >= self.heal_at:
            return
        rng = self.fault_rng
        self.faults[kind] += 1
        self.trace(f"F{self.world.now}{kind}")
        ids = self.current_ids()
        undo: Callable[[], None]
        # Which partition's leader a leader fault aims at (no draw with one partition).
        aim = rng.randrange(self.partitions) if self.partitions > 1 else 0
        if kind == "partition":
            rng.shuffle(ids)
            k = rng.randint(1, len(ids) // 2)
            links = [(a, b) for a in ids[:k] for b in ids[k:]]
            links += [(b, a) for a, b in links]
            undo = self._cut(links)
        elif kind == "isolate_leader":
            leader = self.leader(aim)
            victim = leader.id if leader is not None else rng.choice(ids)
            links = [(victim, o) for o in ids if o != victim]
            links += [(o, victim) for o in ids if o != victim]
            links += [(p.name, victim) for p in self.procs]
            undo = self._cut(links)
        elif kind in ("crash", "crash_leader", "crash_partition"):
            target = self.leader(aim) if kind != "crash" else None
            running = [m for m in self.members.values() if m.machine is not None]
            if target is None and running:
                target = rng.choice(running)
            if target is None:
                return
            down = target
            if kind == "crash_partition":
                # One partition's process dies; its member's supervisor decides when it
                # starts again, while the member's other partitions run on.
                self.crash_partition(self.groups[aim][down.id])
                return
            if rng.random() < 0.5 and self.backend.arm_crash(down.name, rng):
                self.faults["crash_mid_write"] += 1

                def disarm_restart() -> None:
                    self.backend.disarm(down.name)
                    self.restart_host(down)

                self.world.at(end, disarm_restart)
                return
            self.crash_host(down)
            self.world.at(end, lambda: self.restart_host(down))
            return
        elif kind == "restore":
            self._take_backup(end)
            return
        elif kind == "recover":
            if not self.stats["restores"] and self.world.now <= self.heal_at // 2:
                self.stats["restores"] += 1
                self.world.at(end, self._recover)
            return
        elif kind == "pause":
            running = [m for m in self.members.values() if m.machine is not None]
            if not running:
                return
            paused = rng.choice(running)
            self.pause(paused)
            undo = lambda: self.resume_host(paused)  # noqa: E731
        elif kind == "fsync_stall":
            leader = self.leader(aim)
            target = leader if leader is not None and rng.random() < 0.5 else None
            stalled = target or self.members[rng.choice(ids)]
            for process in self.host(stalled):  # one disk under all of them
                process.stall_until = end
            return
        elif kind == "slow_disks":
            undo = self._slow_disks(rng)
        elif kind == "lossy":
            extra = rng.choice((0.1, 0.3))
            self.extra_drop += extra

            def undo_drop() -> None:
                if not self.healed:
                    self.extra_drop -= extra

            undo = undo_drop
        elif kind == "reorder":
            spread = rng.choice((5 * MS, 20 * MS))
            self.extra_delay_us += spread

            def undo_delay() -> None:
                if not self.healed:
                    self.extra_delay_us -= spread

            undo = undo_delay
        elif kind in ("client_cut", "client_cut_leader"):
            proc = rng.choice(self.procs)
            if kind == "client_cut_leader":
                leader = self.leader(aim)
                targets = [leader.id] if leader is not None else [rng.choice(ids)]
            else:
                targets = ids
            undo = self._cut([(proc.name, t) for t in targets])
        elif kind == "one_way":
            # One direction of one pair loses everything: the connection that way stalls,
            # and so does the other way's (its acknowledgements are lost).
            rng.shuffle(ids)
            if len(ids) < 2:
                return
            undo = self._cut([(ids[0], ids[1])])
        elif kind == "stall":
            # A connection silently stops delivering, and stays so until it is replaced.
            rng.shuffle(ids)
            if len(ids) < 2:
                return
            src, dst = _process_name(ids[0], aim), _process_name(ids[1], aim)
            self._peer_link(src, dst).stalled = True
            return
        elif kind == "client_slow":
            proc = rng.choice(self.procs)
            self.slow[proc.name] = rng.choice((200 * MS, 500 * MS, 1000 * MS))

            def undo_slow() -> None:
                self.slow.pop(proc.name, None)

            undo = undo_slow
        elif kind == "client_pause":
            proc = rng.choice(self.procs)
            self.pause_client(proc)
            # Sometimes longer than the lease: the GC-pause zombie of fencing fame.
            end = min(self.heal_at, self.world.now + rng.randint(200 * MS, 4000 * MS))
            undo = lambda: self.resume_client(proc)  # noqa: E731
        elif kind == "host_suspend":
            awake = [p for p in self.procs if p.suspended_since is None]
            if not awake:
                return
            proc = rng.choice(awake)
            # A laptop's lid closed, a VM hibernated: sometimes far longer than any TTL.
            end = min(self.heal_at, self.world.now + rng.randint(300 * MS, 5000 * MS))
            self._suspend_host(proc)
            undo = lambda: self._wake_host(proc)  # noqa: E731
        else:
            raise ValueError(kind)
        self.world.at(end, undo)

    def _slow_disks(self, rng: random.Random) -> Callable[[], None]:
        """A majority of the members (or all) write slower than an election timeout: up to
        one or three times its longest draw, as a 500 ms or 2 s fsync is to the real
        300-600 ms (not longer: proposals time out after a second here)."""
        ids = sorted(self.members)
        count = rng.choice((majority(self.ids), len(ids)))
        slowed = [self.members[n] for n in rng.sample(ids, min(count, len(ids)))]
        write_us = rng.choice((ELECTION_US, 3 * ELECTION_US))
        for member in slowed:
            for process in self.host(member):
                process.slow_write_us = write_us
        self.trace(f"S{self.world.now}{','.join(m.id for m in slowed)}{write_us}")

        def fast() -> None:
            for member in slowed:
                for process in self.host(member):
                    process.slow_write_us = 0

        return fast

    def _suspend_host(self, proc: ClientProc) -> None:
        proc.suspended_since = self.world.now
        self.pause_client(proc)
        if proc.guard is not None:
            self.pause_client(proc.guard)

    def _wake_host(self, proc: ClientProc) -> None:
        if proc.suspended_since is None:
            return
        proc.suspended_us += self.world.now - proc.suspended_since
        proc.suspended_since = None
        # The guard first: its timer expired during the suspend, and it looks at once.
        if proc.guard is not None:
            self.resume_client(proc.guard)
        run = proc.cmd
        if run is not None and run.section is not None and run.ended_at is None:
            self.checker.cmd_resumed(run.section, self.world.now)
        self.resume_client(proc)

    def _cut(self, links: list[tuple[str, str]]) -> Callable[[], None]:
        for link in links:
            self.cuts[link] += 1

        def mend() -> None:
            for link in links:
                self.cuts[link] -= 1
                if self.cuts[link] <= 0:
                    del self.cuts[link]

        return mend

    def heal(self) -> None:
        self.healed = True
        self.cuts.clear()
        self.slow.clear()
        self.extra_drop = 0.0
        self.extra_delay_us = 0
        self.packet_loss = 0.0
        for member in self.all_members():
            member.stall_until = 0
            member.slow_write_us = 0
            self.backend.disarm(member.name)
            self.resume(member)
            self.restart(member)
        for proc in self.procs:
            self._wake_host(proc)
            self.resume_client(proc, force=True)
            if proc.guard is not None:
                self.resume_client(proc.guard, force=True)
            proc.stopping.set()
        for gateway in self.gateways.values():
            gateway.restart()
        self.trace(f"H{self.world.now}")

    # -- the workload --------------------------------------------------------------------

    def _enter(self, proc: ClientProc, grant: core.Grant, clock: core.LeaseClock) -> Section:
        """A library client's section: it lasts until its release or its deadline."""
        now = self.world.now

        def ends_by() -> int:
            return proc.clock.real_us(clock.deadline)

        section = Section(proc.name, grant.key, grant.token, grant.lease, now, ends_by)
        self.checker.enter(section, now)
        self.stats["sections"] += 1
        return section

    def _script(self, proc: ClientProc) -> Script:
        rng = proc.rng
        through = self._gateways_for(proc)
        main = SimClient(proc, proc.name, gateways=through)
        routed = self.partitions > 1 and proc.pinned is None
        quick = (
            proc.kind == "exec"
            and self.rng_for(f"deferred-renewals-{proc.name}").random()
            < self.options.deferred_renewals
        )
        if quick:
            _quick_budget(main)
        while not proc.stopping.is_set():
            if proc.reopen is not None:
                wait_us = proc.reopen[1] - self.world.now
                yield Sleep(max(0, wait_us) * proc.clock.rate / US)
            else:
                yield Sleep(rng.uniform(0.02, 0.3))
            if proc.stopping.is_set():
                break
            if proc.reopen is None and rng.random() < 0.2:
                yield from self._linearizable_read(main)
                continue
            if self.options.membership:
                # Members come and go: a client is configured with the members of the day.
                main.drop()
                main = SimClient(proc, proc.name, gateways=through)
                if quick:
                    _quick_budget(main)
            ttl_ms = rng.choice((800, 1000, 1500, 2000))
            self.leases_ttl_max_ms = max(self.leases_ttl_max_ms, ttl_ms)
            lease_id = _lease_id(rng)
            reopening = proc.reopen is not None  # (its TTL as before: it may still be open)
            if proc.reopen is not None:
                lease_id = proc.reopen[0]
                proc.reopen = None
            delay_ms = 0
            if self.options.lock_delays and self.options.peer_version >= 4:
                delay_rng = self.rng_for(f"lock-delay-{proc.name}-{lease_id}")
                if delay_rng.random() < self.options.lock_delays:
                    delay_ms = delay_rng.choice((300, 800, 1500))
            # With a default-ttl set, some opens name none (`dlm acquire` without --ttl): the
            # client fits the request to the member's version (core.for_member).
            asked: int | None = ttl_ms
            if (
                self.default_ttl_ms is not None
                and not reopening
                and self.rng_for(f"default-ttl-{proc.name}-{lease_id}").random() < 0.3
            ):
                asked = None
            try:
                lease: core.Lease = yield RunFlow(
                    main, core.open_lease_flow(main.ctx, asked, lease_id, lock_delay_ms=delay_ms)
                )
            except DlmError:
                self.stats["open_failed"] += 1
                continue
            if asked is None:
                self.stats["opened_with_default_ttl"] += 1
                if lease.ttl_ms != self.default_ttl_ms:
                    raise Violation(
                        "default-ttl",
                        f"lease {lease.id} opened naming no TTL got {lease.ttl_ms} ms, not "
                        f"the cluster's default-ttl of {self.default_ttl_ms} ms",
                    )
            # (The mutant counts from when the answer arrived, the correct client from the send.)
            start = proc.mono() if self.options.lease_clock_from_reply else lease.confirmed_at
            book: core.LeaseBook | None = None
            clock: Any
            if routed:
                # A lease with a part in each partition it takes a key of (issue 25): its
                # keeper renews every part, its deadline is the earliest part's.
                book = core.LeaseBook()
                book.opened(lease, lock_delay_ms=delay_ms)
                clock = self.options.part_clocks_class(
                    lease.ttl_ms,
                    start,
                    parts=[lease.partition],
                    opened=partial(book.parts, lease.id),  # as KeepAlive's: joined once opened
                )
            else:
                clock = self.options.lease_clock_class(lease.ttl_ms, start)
            self._watch_lease(proc, lease, clock, book)
            lost = Flag()
            keeper_client = SimClient(proc, proc.name + "k", gateways=through)
            holder: Any = None

            def start_keeper(
                keeper_client: SimClient = keeper_client,
                lease: core.Lease = lease,
                clock: Any = clock,
                lost: Flag = lost,
                book: core.LeaseBook | None = book,
            ) -> None:
                nonlocal holder
                if holder is None:
                    keeping = self._keeper(proc, keeper_client, lease, clock, lost, book)
                    holder = proc.spawn(keeping, f"{proc.name}-keeper")

            # dlm exec: an acquire that cannot outlast half the TTL lets the keep-alives
            # start once CMD has started (the runtime's own rule decides, on this budget).
            may_defer = (
                quick and book is None and renewals_can_wait(_budget_of(main), None, lease.ttl_ms)
            )
            if not may_defer:
                start_keeper()
            first_acquire = True
            zombie = rng.random() < 0.15
            handover = not zombie and rng.random() < 0.1 and not routed
            # dlm exec's zombie: the supervisor stopped (SIGSTOP) for longer than its lease
            # while CMD runs on; only the guard then ends CMD in time.
            frozen_supervisor = zombie and proc.kind == "exec"
            if proc.kind == "exec":
                zombie = False
            for _ in range(rng.randint(1, 4)):
                if lost.is_set() or proc.stopping.is_set():
                    break
                key = rng.choice(self._keys_for(proc))
                wait = rng.choice((None, 0.5, 2.0))
                if wait is not None or not first_acquire:
                    start_keeper()  # a queued acquire, or a later one: renewals run first
                first_acquire = False
                proc.acquire_sent = proc.mono()
                try:
                    acquiring = (
                        partial(core.acquire_flow, main.ctx)
                        if book is None
                        else partial(core.lease_acquire_flow, main.ctx, book)
                    )
                    grant = yield RunFlow(
                        main,
                        acquiring(
                            lease.id,
                            key,
                            wait=wait,
                            limit=self.limits[key],
                            # dlm exec names its command: the grant is a run (ledger.py).
                            meta={
                                "c": proc.name,
                                **({"cmd": proc.name} if proc.kind == "exec" else {}),
                            },
                            known_ttl_ms=lease.ttl_ms,
                        ),
                    )
                except LockHeld:
                    self.stats["conflicts"] += 1
                    continue
                except (LeaseLost, _Cancelled):
                    break
                except PermissionDenied:
                    self.stats["permission_denied"] += 1  # a key outside its prefixes
                    continue
                except DlmError:
                    self.stats["acquire_failed"] += 1
                    continue
                granted_by = proc.mono()  # the grant's reply is here: the hold counts from now
                if book is not None:
                    _join_parts(clock, book, lease.id)
                if lost.is_set() or self.world.now >= proc.clock.real_us(clock.deadline):
                    # The grant arrived after our deadline: it is not ours to use.
                    self.stats["late_grants"] += 1
                    break
                self.stats["grants"] += 1
                if proc.kind == "exec" and not handover:
                    # (A handover is a job's steps passing one lease on, as `dlm acquire`
                    # does: the library's flow below, for exec clients too.)
                    try:
                        ran = yield from self._supervise(
                            proc,
                            main,
                            lease,
                            clock,
                            lost,
                            grant,
                            frozen=frozen_supervisor,
                            on_started=start_keeper if holder is None else None,
                        )
                    except _Cancelled:
                        break
                    if not ran:
                        break  # the lease ran out (dlm exits 77): nothing to release
                    if proc.update_rng.random() < self.options.min_holds:
                        # `dlm exec --min-hold`: CMD ended before the hold is over; the rest
                        # of it goes to the cluster as the lease's last TTL, and dlm exits.
                        _cancel(holder)
                        yield from self._hand_over_hold(
                            proc, main, lease, clock, grant=grant, granted_by=granted_by
                        )
                        lost.set()  # the lease is left to run out: never closed
                        handover = True  # nor opened again by id
                        break
                    yield from self._release(main, lease, key, grant)
                    continue
                section = self._enter(proc, grant, clock)
                for _ in range(rng.randint(1, 3)):
                    yield Sleep(rng.uniform(0.01, 0.25))
                    self._write(proc, section, clock)
                if proc.kind == "library" and proc.update_rng.random() < self.options.ttl_updates:
                    yield from self._update_ttl(
                        proc, main, lease, clock, keeper=holder, section=section, book=book
                    )
                if zombie:
                    break  # stops renewing below and vanishes without releasing
                if handover:
                    # A CI job's next step takes over the lease (and so the lock) by
                    # joining it, as late as the moment the cluster expires it.
                    self.checker.leave(section, self.world.now)
                    _cancel(holder)
                    self._spawn_successor(proc, lease, clock, grant)
                    lost.set()
                    break
                self.checker.leave(section, self.world.now)
                if lost.is_set():
                    break
                yield from self._release(main, lease, key, grant)
            if zombie:
                _cancel(holder)
                opts_tombstone_us = self.options.tombstone_ms * MS
                if rng.random() < 0.5:
                    # Come back to the abandoned lease id: right about when the cluster
                    # expires it (a join of a doomed lease must be refused), or once it
                    # surely has (a new incarnation: tombstones are few here).
                    deadline = proc.clock.real_us(clock.deadline)
                    if routed:
                        continue  # (an id reopened by a routed client: not modelled)
                    if rng.random() < 0.5:
                        back = deadline + rng.randint(0, 60 * MS)
                    else:
                        back = deadline + 2 * lease.ttl_ms * MS + opts_tombstone_us
                    proc.reopen = (lease.id, back)
                continue
            _cancel(holder)
            if book is not None and len(book.parts(lease.id) or {}) > 1:
                self.stats["spanning_leases"] += 1  # a lease with parts in several partitions
            if not lost.is_set():
                closing = (
                    core.close_lease_flow(main.ctx, lease.id)
                    if book is None
                    else core.close_all_flow(main.ctx, book, lease.id)
                )
                try:
                    yield RunFlow(main, closing)
                except DlmError:
                    self.stats["close_failed"] += 1
            if routed:
                continue
            if not handover and rng.random() < 0.1:
                proc.reopen = (lease.id, self.world.now)  # a tombstone answers, or a new lease
        main.drop()

    def _release(self, main: SimClient, lease: core.Lease, key: str, grant: core.Grant) -> Script:
        """Releases ``key`` by its token; a lock already gone (lost, expired) is no error."""
        try:
            yield RunFlow(main, core.release_flow(main.ctx, lease.id, key, token=grant.token))
        except (NotHolder, LeaseLost, _Cancelled):
            pass
        except DlmError:
            self.stats["release_failed"] += 1

    def _update_ttl(
        self,
        proc: ClientProc,
        main: SimClient,
        lease: core.Lease,
        clock: core.LeaseClock,
        *,
        keeper: Task,
        section: Section,
        book: core.LeaseBook | None = None,
    ) -> Script:
        """``Client.update_lease`` while holding: the keeper hears of it before it is sent
        (as KeepAlive does), then the client holds on for a while, writing, as long as
        its clock says the lease lasts (a shorter TTL must not be outlived)."""
        urng = proc.update_rng
        ttl_ms = urng.choice((300, 500, 1000, 1000, 3000))
        # The liveness probe's bound counts the longest TTL a lease may have, updated too.
        self.leases_ttl_max_ms = max(self.leases_ttl_max_ms, ttl_ms)
        self.stats["ttl_shortened" if ttl_ms < clock.ttl_ms else "ttl_lengthened"] += 1
        ticket = clock.update_sent(proc.mono(), ttl_ms)
        keeper.nudge()
        try:
            timeout = urng.uniform(0.3, 3.0)
            updating = (
                core.update_lease_flow(main.ctx, lease.id, ttl_ms, timeout=timeout)
                if book is None
                else core.update_parts_flow(main.ctx, book, lease.id, ttl_ms, timeout=timeout)
            )
            confirmed = yield RunFlow(main, updating)
        except DlmError as exc:
            self.stats["ttl_update_failed"] += 1
            clock.update_settled(ticket, None, proc.mono(), applied=core.update_applied(exc))
        else:
            clock.update_settled(ticket, confirmed, proc.mono(), applied=True)
        keeper.nudge()
        # Hold on past the new TTL (as --min-hold keeps a lock), writing now and then.
        for _ in range(urng.randint(1, 4)):
            yield Sleep(urng.uniform(0.05, 0.4))
            self._write(proc, section, clock)

    def _hand_over_hold(
        self,
        proc: ClientProc,
        main: SimClient,
        lease: core.Lease,
        clock: core.LeaseClock,
        *,
        grant: core.Grant,
        granted_by: float,
    ) -> Script:
        """exec's ``_hand_over_hold``: the rest of a --min-hold becomes the lease's TTL
        (``lease_update`` with ``finished``). Once the cluster has confirmed it in time,
        no one else may hold the key before the hold is over."""
        urng = proc.update_rng
        hold = urng.uniform(0.2, 1.5)
        # The process counts on the lease no more (CMD has ended): its view is dropped.
        self._forget_lease(lease.id, clock)
        if urng.random() < self.options.late_handovers and self.world.now < self.heal_at:
            # Paused until just before the leader proposes the lease's Expire (the simulator
            # knows when: the leader's timer fires at the lease's deadline), so the update
            # is proposed before that Expire and applied after it, or just misses it.
            # (A fault like any other: it ends by the heal.)
            until = min(proc.clock.real_us(clock.deadline), self.heal_at)
            yield Sleep(max(0, until - self.world.now) * proc.clock.rate / US)
            leader = self.leader()
            left_ms = None
            if leader is not None and leader.machine is not None:
                left_ms = leader.machine.tracker.remaining_ms(
                    lease.id, leader.clock.mono(self.world.now)
                )
            if left_ms is not None:
                wake = self.world.now + left_ms * MS - urng.randint(0, 12 * MS)
                wake = min(wake, self.heal_at)
                yield Sleep(max(0, wake - self.world.now) * proc.clock.rate / US)
            hold += proc.mono() - granted_by
        counted_from = granted_by
        if self.options.min_hold_from_send:
            counted_from = proc.acquire_sent
        hold_ms = core.min_hold_ttl_ms(counted_from, hold, proc.mono())
        if hold_ms <= 0:
            try:
                yield RunFlow(main, core.close_lease_flow(main.ctx, lease.id))
            except DlmError:
                self.stats["close_failed"] += 1
            return
        self.stats["min_holds"] += 1
        ticket = clock.update_sent(proc.mono(), hold_ms)
        try:
            confirmed = yield RunFlow(
                main,
                core.update_lease_flow(
                    main.ctx, lease.id, hold_ms, finished=True, timeout=urng.uniform(0.5, 3.0)
                ),
            )
        except DlmError:
            self.stats["min_hold_unconfirmed"] += 1
            return
        if not clock.update_settled(ticket, confirmed, proc.mono(), applied=True):
            # Confirmed after our deadline for the lease. The library would count it lost,
            # but exec does not ask it: a confirmed update is the hold handed over, so the
            # leader must not confirm one that cannot restart the lease's clock (a lease
            # whose Expire it has proposed).
            self.stats["min_hold_late"] += 1
        until = proc.clock.real_us(granted_by) + int(hold * US)
        self.checker.held_until(grant.key, grant.lease, grant.token, until)

    # -- dlm exec: the supervisor, its guard and CMD ----------------------------------

    def _maybe_pause(self, proc: ClientProc) -> Script:
        """Between two steps of the supervisor: now and then it is stopped for a while
        (SIGSTOP, swap, an overloaded host), sometimes for longer than its TTL; its guard
        and its command run on."""
        rng = self.fault_rng
        if self.world.now >= self.heal_at or rng.random() >= SUPERVISOR_PAUSE_P:
            return
        short, long = rng.randint(20 * MS, 300 * MS), rng.randint(500 * MS, 3000 * MS)
        length = short if rng.random() < 0.5 else long
        self.faults["supervisor_pause"] += 1
        self.trace(f"S{self.world.now}{proc.name}")
        self.pause_client(proc)
        self.world.at(min(self.heal_at, self.world.now + length), lambda: self.resume_client(proc))
        yield Sleep(0.0)

    def _supervise(  # noqa: PLR0917
        self,
        proc: ClientProc,
        client: SimClient,
        lease: core.Lease,
        clock: core.LeaseClock,
        lost: Flag,
        grant: core.Grant,
        *,
        frozen: bool = False,
        on_started: Callable[[], None] | None = None,
    ) -> Generator[RunFlow | Sleep, Any, bool]:
        """``dlm exec`` after its grant (exec_cmd._Session): the CLI's StartGate decides,
        then the guard is told to spawn. True when CMD ran and ended with the lease held
        (the lock is then released); False when the lease ran out (exit 77).
        ``on_started``: called once the guard has started CMD and half a renewal
        interval has passed since the last confirmation (the keep-alives, when they
        were left until then)."""
        gate = self.options.start_gate_class(EXEC_GRACE_MS / 1000)
        yield from self._maybe_pause(proc)
        if lost.is_set():
            return False
        step = gate.before_start(proc.mono(), clock.deadline, clock.interval())
        if step == TOO_LATE:
            self.stats["exec_too_late"] += 1
            return False
        if step == RENEW:
            sent = proc.mono()
            try:
                ttl = yield RunFlow(
                    client,
                    core.keepalive_flow(
                        client.ctx,
                        lease.id,
                        incarnation=lease.incarnation,
                        timeout=max(0.001, gate.stop_time(clock.deadline) - sent),
                    ),
                )
            except DlmError:
                return False
            if not clock.confirmed(sent, ttl, proc.mono()):
                return False
            self.stats["exec_renewed_first"] += 1
        yield from self._maybe_pause(proc)
        if not gate.may_order_spawn(proc.mono(), clock.deadline):
            self.stats["exec_not_ordered"] += 1
            return False
        run = self._order_spawn(proc, grant, clock.deadline, long=frozen)
        if frozen and self.world.now < self.heal_at:
            self.faults["supervisor_frozen"] += 1
            self.pause_client(proc)
            length = int(clock.ttl_ms * MS * self.fault_rng.uniform(1.0, 3.0))
            self.world.at(
                min(self.heal_at, self.world.now + length), lambda: self.resume_client(proc)
            )
            yield Sleep(0.0)
        yield from self._maybe_pause(proc)
        # As the runtime: renewals left for later start half an interval after the last
        # confirmation, if CMD still runs then (a short CMD needs none).
        renewals_from = clock.last_sent + clock.interval() / 2
        while not run.done.is_set():
            if on_started is not None and run.started and proc.mono() >= renewals_from:
                self.stats["exec_renewals_deferred"] += 1
                on_started()
                on_started = None
            if not run.stop_sent and (lost.is_set() or clock.expired(proc.mono())):
                run.stop_sent = True
                self._tell_guard(proc, lambda r, now: r.rules.stop(now))
            yield Sleep(0.02)
        proc.cmd = None
        if on_started is not None and run.started:
            self.stats["exec_short_runs_unrenewed"] += 1  # CMD ended first: no keep-alives
        if not run.started:
            return False
        return not (run.killed or run.deadline_passed or lost.is_set())

    def _guard_rules(self) -> GuardRules:
        opts = self.options
        grace = EXEC_GRACE_MS / 1000
        if not opts.exec_kill_late_us:
            return opts.guard_rules_class(grace)
        late = opts.exec_kill_late_us / US

        class KillsLate(opts.guard_rules_class):  # type: ignore[name-defined,misc]
            def kill_at(self) -> float:
                return float(super().kill_at() + KILL_LEAD_S + late)

        return KillsLate(grace)

    def _guard_clock(self, guard: ClientProc) -> float:
        if self.options.guard_clock_stops_in_suspend:
            return guard.stopping_mono()
        return guard.mono()

    def _guard_of(self, proc: ClientProc) -> ClientProc:
        if proc.guard is None:
            proc.guard = ClientProc(self, f"{proc.name}g", "guard", host=proc)
        return proc.guard

    def _tell_guard(self, proc: ClientProc, fn: Callable[[CmdRun, float], None]) -> None:
        """A line down the pipe to the guard: read when the guard next runs."""
        run, guard = proc.cmd, self._guard_of(proc)
        if run is None:
            return

        def read() -> None:
            fn(run, self._guard_clock(guard))
            self._guard_watch(guard, run)

        guard.after(PIPE_S, read)

    def _order_spawn(
        self, proc: ClientProc, grant: core.Grant, deadline: float, *, long: bool
    ) -> CmdRun:
        guard = self._guard_of(proc)
        run = proc.cmd = CmdRun(self._guard_rules())
        run.long = long
        rng = self.fault_rng
        if self.world.now < self.heal_at and rng.random() < GUARD_STALL_P:
            # The guard is starved (an overloaded host) while the order waits in the pipe.
            # (Never between its look at the clock and the spawn: nothing could keep CMD
            # from starting then; the guard SIGKILLs it at once, tests/unit/cli/test_guard.)
            self.faults["guard_stall"] += 1
            self.pause_client(guard)
            length = rng.randint(20 * MS, 2000 * MS)
            self.world.at(
                min(self.heal_at, self.world.now + length), lambda: self.resume_client(guard)
            )
        guard.after(PIPE_S, lambda: self._guard_spawn(proc, guard, run, grant, deadline))
        return run

    def _guard_spawn(
        self, proc: ClientProc, guard: ClientProc, run: CmdRun, grant: core.Grant, deadline: float
    ) -> None:
        if not run.rules.may_spawn(self._guard_clock(guard), deadline):
            self.stats["exec_not_started"] += 1
            run.done.set()
            return
        run.started = True
        section = Section(
            proc.name,
            grant.key,
            grant.token,
            grant.lease,
            self.world.now,
            lambda: self._cmd_end(proc, run),
            cmd=True,
        )
        run.section = section
        partition = partition_of(grant.key, self.partitions)
        self._ledger_of(partition).cmd_started(grant.key, grant.token, grant.lease)
        self.checker.enter(section, self.world.now)
        self.stats["sections"] += 1
        self.stats["cmds"] += 1
        if not run.rules.spawned(self._guard_clock(guard)):
            self.stats["cmd_started_late"] += 1
        guard.spawn(self._cmd(proc, guard, run), f"{proc.name}-cmd")
        self._guard_watch(guard, run)

    def _cmd_end(self, proc: ClientProc, run: CmdRun) -> int:
        """Until when CMD runs, as it stands now: its end, or the start of the suspend that
        froze it, or not yet known."""
        if run.ended_at is not None:
            return run.ended_at
        if proc.suspended_since is not None:
            return proc.suspended_since
        return FOREVER

    def _guard_watch(self, guard: ClientProc, run: CmdRun) -> None:
        """One wake-up of the guard's loop: the CLI's GuardRules say what is due."""
        if run.ended_at is not None:
            return
        run.watch_epoch += 1
        epoch = run.watch_epoch
        now = self._guard_clock(guard)
        if run.rules.deadline_passed(now):
            run.deadline_passed = True
        due, wake_at = run.rules.next_signal(now)
        if due == KILL:  # (SIGTERM changes nothing: these commands ignore it)
            self._cmd_ended(run, killed=True)
            return

        def again() -> None:
            if epoch == run.watch_epoch:
                self._guard_watch(guard, run)

        guard.after(max(0.0, wake_at - now), again)

    def _cmd_ended(self, run: CmdRun, *, killed: bool) -> None:
        if run.ended_at is not None:
            return
        run.ended_at = self.world.now
        run.killed = killed
        if run.section is not None:
            self.checker.leave(run.section, self.world.now)
        if killed:
            self.stats["cmds_killed"] += 1
        run.done.set()

    def _cmd(self, proc: ClientProc, guard: ClientProc, run: CmdRun) -> Script:
        """CMD: writes to the fenced store with its token now and then, then exits."""
        rng = guard.rng
        # Mostly short; now and then one that outlasts several renewals (and its lease, if
        # those fail), which only the guard then stops.
        long = run.long or rng.random() < 0.3
        for _ in range(rng.randint(3, 12) if long else rng.randint(1, 3)):
            yield Sleep(rng.uniform(0.1, 0.4) if long else rng.uniform(0.01, 0.25))
            if run.ended_at is not None:
                return
            section = run.section
            assert section is not None

            def land(section: Section = section) -> None:
                zombie = self.world.now >= section.ends_by()
                self.checker.store.write(section.key, section.token, zombie=zombie)

            guard.after(0.002, land)
        self._cmd_ended(run, killed=False)

    def _spawn_successor(
        self, proc: ClientProc, lease: core.Lease, clock: core.LeaseClock, grant: core.Grant
    ) -> None:
        heir = ClientProc(self, f"{proc.name}h{self.client_count}", "library")
        heir.identity = proc.identity
        heir.pinned = proc.pinned  # (the lease it joins lives in that partition)
        self.procs.append(heir)
        # Aim at the moment the cluster expires the lease: a little after our deadline, by the
        # margin the deadline keeps (core.lease_deadline), give or take.
        ttl = lease.ttl_ms / 1000
        margin = 2 * core.CLOCK_RATE_BOUND * ttl + core.LEASE_SLACK_S
        spread = 0.01 * ttl + 0.02
        aim = margin + heir.rng.uniform(-spread, spread)
        join_at = proc.clock.real_us(clock.deadline) + int(aim * US)
        heir.spawn(self._successor(heir, lease, grant, join_at), heir.name)

    def _successor(
        self, proc: ClientProc, lease: core.Lease, grant: core.Grant, join_at: int
    ) -> Script:
        client = SimClient(proc, proc.name)
        yield Sleep(max(0, join_at - self.world.now) * proc.clock.rate / US)
        try:
            joined: core.Lease = yield RunFlow(
                client, core.open_lease_flow(client.ctx, lease.ttl_ms, lease.id)
            )
        except DlmError:
            self.stats["handover_refused"] += 1
            return
        clock = self.options.lease_clock_class(joined.ttl_ms, joined.confirmed_at)
        self._watch_lease(proc, joined, clock)
        if lease.incarnation and joined.incarnation == lease.incarnation:
            # The very lease the previous step held the lock under: the lock is ours, with
            # the token it handed over (as a CI step that got DLM_FENCING_TOKEN would).
            self.stats["handovers"] += 1
            section = self._enter(proc, grant, clock)
            yield Sleep(proc.rng.uniform(0.05, 0.4))
            self._write(proc, section, clock)
            self.checker.leave(section, self.world.now)
            try:
                yield RunFlow(client, core.close_lease_flow(client.ctx, lease.id))
            except DlmError:
                pass
            client.drop()
            return
        try:
            # A lease of another incarnation (or a version-1 one, which cannot tell): ask, as
            # `dlm acquire --lease` does, which gives the same grant if the lease holds it.
            mine = yield RunFlow(
                client,
                core.acquire_flow(
                    client.ctx,
                    lease.id,
                    grant.key,
                    wait=None,
                    limit=self.limits[grant.key],
                    meta={"c": proc.name},
                    known_ttl_ms=joined.ttl_ms,
                ),
            )
        except DlmError:
            self.stats["handover_lost"] += 1
            yield RunFlow(client, core.close_lease_flow(client.ctx, lease.id))
            return
        if clock.expired(proc.mono()):
            return
        self.stats["handovers"] += 1
        section = self._enter(proc, mine, clock)
        yield Sleep(proc.rng.uniform(0.05, 0.4))
        self._write(proc, section, clock)
        self.checker.leave(section, self.world.now)
        try:
            yield RunFlow(client, core.close_lease_flow(client.ctx, lease.id))
        except DlmError:
            pass
        client.drop()

    def _linearizable_read(self, client: SimClient) -> Script:
        """A read must reflect everything committed before it was sent, whichever member
        answers it."""
        pinned = client.proc.pinned
        checker = self.raft_checker if not pinned else self.group_checkers[pinned]
        floor = checker.commit_high_water
        client.ctx.router.redirect(f"{client.proc.rng.choice(self.current_ids())}:7700")
        try:
            view = yield RunFlow(client, core.status_flow(client.ctx))
        except DlmError:
            return
        applied = -1 if view.applied is None else view.applied
        self.stats["reads"] += 1
        if applied < floor:
            raise Violation(
                "stale-read",
                f"{client.name} read at applied index {applied}, but index {floor} was "
                "committed before it asked",
            )

    def _write(self, proc: ClientProc, section: Section, clock: core.LeaseClock) -> None:
        """A read-modify-write on the fenced store, if the client still believes it holds."""
        if section.released is not None:
            return
        if self.world.now >= proc.clock.real_us(clock.deadline):
            return

        # The write reaches the store a moment later; a pause in between makes a zombie.
        def land() -> None:
            zombie = self.world.now >= section.ends_by()
            self.checker.store.write(section.key, section.token, zombie=zombie)

        proc.after(0.002, land)

    def _keeper(  # noqa: PLR0917
        self,
        proc: ClientProc,
        client: SimClient,
        lease: core.Lease,
        clock: Any,
        lost: Flag,
        book: core.LeaseBook | None = None,
    ) -> Script:
        """KeepAlive's driver: performs what ``core.Renewer`` (the keep-alives' own logic)
        says, renew or ping, from its own connection until the lease is lost. A lease with
        parts (``book``) is renewed part by part, as KeepAlive does (``renew_parts_flow``)."""
        renewer = core.Renewer(clock, proc.mono())
        while True:
            step = renewer.next_step(proc.mono())
            if isinstance(step, core.Lost):
                lost.set()
                client.drop()
                return
            wait = step.at - proc.mono()
            if wait > 0:
                try:
                    nudged = yield Sleep(wait)
                except _Cancelled:
                    client.drop()
                    return
                if nudged:
                    continue  # a TTL update: the renewal may be due earlier now
            if isinstance(step, core.PingAt):
                conn = client.conn
                if conn is not None and not conn.broken:
                    try:
                        ping = _ping_flow(f"{conn.member.id}:7700", conn.member.partition)
                        yield RunFlow(client, ping)
                    except _Cancelled:
                        client.drop()
                        return
                renewer.pinged(proc.mono())
                continue
            sent = proc.mono()
            if sent >= clock.deadline:
                lost.set()
                client.drop()
                return
            if book is not None:
                try:
                    outcome = yield from self._renew_parts(
                        proc, client, lease=lease, clock=clock, book=book, renewer=renewer
                    )
                except _Cancelled:
                    client.drop()
                    return
                if outcome is None:
                    lost.set()
                    client.drop()
                    return
                continue
            try:
                ttl = yield RunFlow(
                    client,
                    core.keepalive_flow(
                        client.ctx,
                        lease.id,
                        incarnation=lease.incarnation,
                        timeout=clock.deadline - sent,
                    ),
                )
            except _Cancelled:
                client.drop()
                return
            except LeaseLost:
                lost.set()
                client.drop()
                return
            except (ClusterUnavailable, DlmError):
                self.stats["renew_failed"] += 1
                renewer.renewal_failed(proc.mono())
                continue
            now = proc.mono()
            confirmed_at = now if self.options.lease_clock_from_reply else sent
            if renewer.renewed(confirmed_at, ttl, now) is None:
                lost.set()
                self.stats["late_confirmations"] += 1
                client.drop()
                return
            self.stats["renewals"] += 1
            if proc.kind == "exec":  # the supervisor tells its guard each new D
                deadline = clock.deadline
                self._tell_guard(proc, partial(_offer, deadline))

    def _renew_parts(
        self,
        proc: ClientProc,
        client: SimClient,
        *,
        lease: core.Lease,
        clock: Any,
        book: core.LeaseBook,
        renewer: core.Renewer,
    ) -> Generator[RunFlow | Sleep, Any, bool | None]:
        """One renewal round of every part (``core.renew_parts_flow``), recorded as
        KeepAlive records it; None: the lease is lost (or the round came too late)."""
        _join_parts(clock, book, lease.id)
        sent = proc.mono()
        try:
            renewed = yield RunFlow(
                client,
                core.renew_parts_flow(client.ctx, book, lease.id, timeout=clock.deadline - sent),
            )
        except LeaseLost:
            return None
        except (ClusterUnavailable, DlmError):
            self.stats["renew_failed"] += 1
            renewer.renewal_failed(proc.mono())
            return False
        now = proc.mono()
        counted = renewer.renewed_parts(
            sent, renewed.ttls, now, complete=renewed.complete, whole=renewed.whole
        )
        if counted is None:
            self.stats["late_confirmations"] += 1
            return None
        self.stats["renewals"] += 1
        self.stats["part_renewals"] += len(renewed.ttls)
        return True

    # -- the end -----------------------------------------------------------------------

    def _recovery_probe(self) -> Script:
        """At the heal: a write (opening a lease) succeeds within ``RECOVERY_US``.

        Every fault is over, every member runs: what could still hold the cluster back
        is its own state, such as a connection that stopped delivering and was never
        replaced.
        """
        proc = ClientProc(self, "recovery", "library")
        client = SimClient(proc, "recovery", gateways=self._gateways_for(proc))
        budget_us = self._recovery_budget_us()
        client.ctx.timeout = budget_us / US
        started = self.world.now
        try:
            if self.settings_admin:
                # The write is the max-ttl's unset: after it (the log's last word on it)
                # the liveness probe's long lease is allowed.
                unset = ConfigSet(id=0, setting="max-ttl", value_ms=0)
                yield RunFlow(client, core.read_flow(client.ctx, unset))
            else:
                yield RunFlow(client, core.open_lease_flow(client.ctx, 5_000))
        except DlmError as exc:
            raise Violation(
                "slow-recovery",
                f"no write succeeded within {budget_us / US:.1f}s of the heal: {exc}",
            ) from None
        took = self.world.now - started
        if took > budget_us:
            raise Violation(
                "slow-recovery", f"the first write after the heal took {took / US:.2f}s"
            )
        self.stats["recovery_ms"] = took // MS
        self._recovered = True

    def _recovery_budget_us(self) -> int:
        """``RECOVERY_US`` when a leader serves at the heal (a healed member catching up);
        with none, an election must come first, and the members' election timeouts may be
        widened by the rounds that failed during the fault (election.py): one more of the
        widest of them on top."""
        if self.leader() is not None:
            return RECOVERY_US
        widest = 0
        for member in self.members.values():
            if member.machine is not None:
                widest = max(widest, member.machine.raft.election_timeout_range()[1])
        return RECOVERY_US + int(widest * TIMING.tick_s * US)

    def _start_recovery_probe(self) -> None:
        proc = ClientProc(self, "recovery", "library")
        self.procs.append(proc)
        proc.spawn(self._recovery_probe(), "recovery")

    def _liveness_probe(self) -> Script:
        """After the heal: every key is obtainable within TTL + an election timeout + slack."""
        proc = ClientProc(self, "probe", "library")
        deadline_s = (self.leases_ttl_max_ms / 1000) + 2 * ELECTION_US / US + 3.0
        started = self.world.now
        for pinned in range(self.partitions) if self.partitions > 1 else [None]:
            proc.pinned = pinned
            yield from self._probe_keys(proc, deadline_s)
        self.stats["probe_ms"] = (self.world.now - started) // MS
        self._probe_done = True

    def _probe_keys(self, proc: ClientProc, deadline_s: float) -> Script:
        """The liveness probe's acquires: every key (of its partition, if it has one)."""
        client = SimClient(proc, "probe", gateways=self._gateways_for(proc))
        lease: core.Lease = yield RunFlow(client, core.open_lease_flow(client.ctx, 60_000))
        for key in self._keys_for(proc):
            try:
                yield RunFlow(
                    client,
                    core.acquire_flow(
                        client.ctx,
                        lease.id,
                        key,
                        wait=deadline_s,
                        limit=self.limits[key],
                        meta={},
                        known_ttl_ms=lease.ttl_ms,
                    ),
                )
            except DlmError as exc:
                raise Violation(
                    "liveness",
                    f"after the heal, {key} was not obtainable within {deadline_s:.1f}s: {exc}",
                ) from None
        if proc.pinned is not None:
            client.drop()  # (the next partition's probe; one partition: the end of the run)

    def _steady_probe(self, proc: ClientProc) -> Script:
        """Under a fault that lasts until the heal, a client's write must still succeed."""
        # Configured for a slow cluster (a write here may take over a second): the test is
        # whether the cluster ever serves, not how fast.
        client = SimClient(proc, "steady", timeout=self.heal_at / US, attempt_timeout=3.0)
        started = self.world.now
        while self.world.now < self.heal_at:
            try:
                yield RunFlow(client, core.open_lease_flow(client.ctx, 60_000))
            except DlmError as exc:
                self.trace(f"steady:{type(exc).__name__}")
                if DEBUG_STEADY:
                    print(self.world.now, repr(exc))
                yield Sleep(0.05)
                continue
            self.stats["steady_ms"] = (self.world.now - started) // MS
            self._steady_done = True
            return

    def _start_steady(self) -> None:
        opts = self.options
        self.faults[f"steady_{opts.steady}"] += 1
        if opts.steady == "slow_disks":
            self._slow_disks(self.fault_rng)
        elif opts.steady == "lossy_links":
            self.packet_loss = 0.3
        else:
            raise ValueError(opts.steady)
        proc = ClientProc(self, "steady", "library")
        self.procs.append(proc)
        proc.spawn(self._steady_probe(proc), "steady")

        def check() -> None:
            if not self._steady_done:
                raise Violation(
                    "liveness",
                    f"under {opts.steady} from the start, no write succeeded in "
                    f"{self.heal_at / US:.0f}s (terms reached: "
                    f"{max(m.machine.raft.term for m in self.members.values() if m.machine)})",
                )

        self.world.at(self.heal_at - 1, check)

    def run(self) -> NodeSimResult:
        opts = self.options
        try:
            self._steady_done = False
            self._schedule_faults()
            members = [f"{n}:7700" for n in self.current_ids()]
            for i in range(opts.gateways):
                gateway = SimGateway(self, f"gw{i + 1}", members)
                self.gateways[gateway.name] = gateway
            self._schedule_gateways()
            self.world.after(ELECTION_US, self._stale_expires)
            self.world.after(LINK_POLL_US, self._poll_links)
            for proc in self.procs:
                proc.spawn(self._script(proc), proc.name)
            if opts.steady is not None:
                self._start_steady()
            if opts.membership:
                admin = ClientProc(self, "admin", "library")
                admin.spawn(self._admin(admin), "admin")
            if opts.backups:
                taker = ClientProc(self, "backups", "library")
                taker.spawn(self._backup_taker(taker), "backups")
            if opts.identities:
                operator = ClientProc(self, "operator", "library")
                operator.spawn(self._identity_admin(operator), "operator")
            if (
                opts.cluster_settings
                and self.partitions == 1
                and opts.steady is None  # (its probe's lease is not to be refused)
                and opts.peer_version >= 5
                and self.rng_for("cluster-settings").random() < opts.cluster_settings
            ):
                setter = ClientProc(self, "settings", "library")
                setter.spawn(self._settings_admin(setter), "settings")
                self.settings_admin = True
            self.world.at(self.heal_at, self.heal)
            self._recovered = False
            self.world.at(self.heal_at, self._start_recovery_probe)
            if opts.stranger:
                Stranger(self).start()
            self._start_watchers()
            self._probe_done = False
            probe_at = self.heal_at + 2 * US
            self.world.at(probe_at, self._start_probe)
            self.world.run_until(opts.duration_us)
            if not self._probe_done:
                raise Violation("liveness", "the probe client did not finish by the end of the run")
            if not self._recovered:
                raise Violation("slow-recovery", "the write after the heal never finished")
            self.checker.check_history()
            for member in self.all_members():
                if member.machine is not None:
                    ledger = self._ledger_of(member.partition)
                    ledger.check(member.name, member.machine.locks)
            self.stats["ledger_runs_checked"] += self.ledger_check.checked_runs
            for ledger in self.group_ledgers.values():
                self.stats["ledger_runs_checked"] += ledger.checked_runs
            if self.partitions > 1:
                self._check_spread()
            check_watchers(self.watchers, self.watch_truth)
            self._check_no_spans_held()
        except Violation as violation:
            raise SimFailure(self.seed, self.world.now, violation, self.REPLAY_TEST) from violation
        except Exception as error:
            raise SimFailure(
                self.seed,
                self.world.now,
                Violation("exception", f"{type(error).__name__}: {error}"),
                self.REPLAY_TEST,
            ) from error
        finally:
            self.backend.close()
        store = self.checker.store
        self.stats["store_accepted"] += store.accepted
        self.stats["zombie_writes_refused"] += store.zombie_refused
        self.stats["zombie_writes_accepted"] += store.zombie_accepted
        self.stats["events"] += self.world.events
        return NodeSimResult(
            seed=self.seed,
            nodes=len(self.ids),
            ticks=opts.duration_us // int(TIMING.tick_s * US),
            trace_hash=self._trace.hexdigest(),
            faults=self.faults,
            stats=self.stats,
        )

    def _start_watchers(self) -> None:
        for number in range(self.options.watchers):
            proc = ClientProc(self, f"w{number}", "library")
            proc.net_rng = self.rng_for(f"watcher-net-{number}")
            client = SimClient(proc, proc.name)
            self.client_count -= 1  # the other clients' draws stay as they were
            key, prefix = ("k0", None) if number % 2 == 0 else (None, "")
            watcher = SimWatcher(self, proc, client, key, prefix)
            self.watchers.append(watcher)
            start_at = proc.rng.randint(0, ELECTION_US)
            self.world.at(start_at, partial(proc.run, watcher.start))

    def _start_probe(self) -> None:
        proc = ClientProc(self, "probe", "library")
        self.procs.append(proc)
        proc.spawn(self._liveness_probe(), "probe")


class _LogView:
    """A member's log as the Raft checker reads it: stored entries and the unstable tail."""

    def __init__(self, member: SimMember) -> None:
        machine = member.machine
        assert machine is not None
        self._log = machine.raft._log

    def term(self, index: int) -> int:
        return self._log.term(index)

    def first_index(self) -> int:
        return self._log.first_index()

    def last_index(self) -> int:
        return self._log.last_index()


def _offer(deadline: float, run: CmdRun, _now: float) -> None:
    run.rules.offer(deadline)


def _lease_id(rng: random.Random) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(rng.choice(alphabet) for _ in range(12))


def _node_of(addr: str) -> str:
    return addr.partition(":")[0]


def _partition_of_action(action: Any) -> int:
    """The partition a client's Send or AwaitGrant is for (0 before routing existed)."""
    partition = getattr(action, "partition", 0)
    return partition if isinstance(partition, int) else 0


def _process_name(node: NodeId, partition: int) -> str:
    """The name of ``node``'s process of ``partition`` (SimMember.name)."""
    return node if partition == 0 else f"{node}/p{partition}"


def _node_of_process(name: str) -> NodeId:
    return name.partition("/")[0]


QUICK_BUDGET_S = 0.3
"""An exec client's --timeout when its acquire is to end within half the TTL (the
simulator's leases last 0.8 to 2 s); its --dial-timeout is as short."""


def _quick_budget(client: SimClient) -> None:
    client.ctx.timeout = QUICK_BUDGET_S
    client.ctx.attempt_timeout = QUICK_BUDGET_S / 2
    client.ctx.dial_timeout = QUICK_BUDGET_S / 4


def _budget_of(client: SimClient) -> Settings:
    """The budgets exec's renewals_can_wait reads, as the CLI's settings carry them."""
    return Settings((), client.ctx.timeout, False, client.ctx.dial_timeout or 0.0)


def _cancel(task: Any) -> None:
    if task is not None:
        task.cancel(_Cancelled())


def run_node_seed(seed: int, options: NodeSimOptions | None = None) -> NodeSimResult:
    return NodeSimulation(seed, options).run()


def _ping_flow(addr: str, partition: int = 0) -> Generator[core.Send, Any, None]:
    """One ping on the connection to ``addr`` (the keeper's idle connection, of
    ``partition``): its answer, or its failure, changes nothing."""
    yield core.Send(addr, core.ping_request(), 2.0, partition=partition)


def _join_parts(clock: Any, book: core.LeaseBook, lease: str) -> None:
    """The lease's parts opened since (an acquire in a new partition) get a clock from
    when their open was sent, as KeepAlive's ``_join_parts`` does (the clock joins them
    itself on every read, from the book it was given; a mutant's clock may not)."""
    for partition, part in (book.parts(lease) or {}).items():
        opened_at = part.confirmed_at if part.confirmed_at > 0 else None
        clock.add_part(partition, opened_at, part.ttl_ms)


def _replay_class(
    lock_base: type[locks.LockStateMachine] | None, opts: NodeSimOptions
) -> type[locks.LockStateMachine]:
    """The members' lock machine (any injected bug included) with their settings, and
    without the simulator's instruments: what the backup checker replays entries on."""

    class ReplayLocks(lock_base or locks.LockStateMachine):  # type: ignore[misc]
        tombstone_ms = opts.tombstone_ms
        max_stamp_step_ms = opts.max_stamp_step_ms

    return ReplayLocks


def _check_usage(member: NodeId, table: locks.LockStateMachine) -> bool:
    """What the per-identity quotas read (each owner's leases, held slots and places in
    queues) is what the member's lease table holds, whatever it applied, restored or
    installed. True when some lease had an owner (an identity) to count."""
    counted: dict[str, list[int]] = {}
    for view in table.list_leases()[0]:
        used = counted.setdefault(view.owner, [0, 0])
        used[0] += 1
        used[1] += len(view.holding) + len(view.waiting)
    expected = {owner: tuple(used) for owner, used in counted.items() if used != [0, 0]}
    kept = {owner: tuple(used) for owner, used in table.usage.by_owner().items()}
    if kept != expected:
        raise Violation(
            "usage", f"{member} counts per owner {kept}, but its leases hold {expected}"
        )
    return any(expected.keys() - {""})
