"""Whole members and real clients under the simulator (nodesim.py), and the bugs it must catch.

``test_node_sim`` runs batches of seeds (300 in CI; ``--sim-seeds`` picks any
range, ``make soak`` runs thousands). Each mutant test switches one known bug
on and requires a violation within a bounded number of seeds, so a checker
that can no longer fail is noticed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from dlm.node.leases import LeaseTracker
from dlm.node.locks import LockStateMachine
from dlm.node.locks.machine import _Lease
from dlm.node.machine import NodeMachine
from dlm.node.raft.core import RaftNode
from dlm.node.raft.quorum import quorum_index
from dlm.node.raft.types import HeartbeatResponse, Ready
from dlm.node.read_rounds import Read, ReadRounds

from .bugs import (
    AdmitsClientsWithoutTheProof,
    AppliesWithoutPermission,
    AsksTheMemberBeforeTheProof,
    BelievesRefusalsBeforeTheProof,
    ConfirmsUpdatesOfDoomedLeases,
    CountsOnTheLatestPart,
    DropsTheFsyncSpan,
    EndsLockDelaysOnFailover,
    ExpiresWithoutTheLockDelay,
    ForgetsSkips,
    FreesARemovedIdentitysLeases,
    IgnoresIdentityLimits,
    IgnoresMaxTtlAfterRestore,
    ImagesWithoutRuns,
    JoinsPartsAtRoundsOnly,
    LabelsBackupsWithTheLastIndex,
    MisordersTheApplySpan,
    NeverReplacesLinks,
    NeverSpreads,
    OrdersSpawnWithoutLooking,
    OutlivesShortenedLeases,
    PrefersItsHint,
    PromotesTheUnproved,
    RelaysAnyTarget,
    ReplacesLinksTcpWouldRetry,
    RestoresWithoutUsage,
    ResumesFromNow,
    ServesBackupsWithoutARound,
    ServesEveryPartitionsKeys,
    SkipsPermissionChecks,
    SpawnsWithoutLooking,
    SpreadsWithoutRotation,
    StopsTheMemberAtAnyCrash,
    names_30s_to_every_member,
)
from .conftest import SimTotals
from .harness import DiskBackend, MemoryBackend
from .nodesim import (
    CLIENT_FAULTS,
    DEFAULT_WEIGHTS,
    FAULT_KINDS,
    NodeSimOptions,
    NodeSimResult,
    run_node_seed,
)
from .world import US

ROOT = Path(__file__).resolve().parents[2]
MIN_FAULTS = 10
MIN_TICKS = 2000


def options_for(seed: int, **overrides: object) -> NodeSimOptions:
    options = NodeSimOptions(backend=DiskBackend if seed % 2 else MemoryBackend)
    for name, value in overrides.items():
        setattr(options, name, value)
    return options


def test_node_sim(sim_seeds: range, sim_totals: SimTotals) -> None:
    sections = 0
    for seed in sim_seeds:
        result = run_node_seed(seed, options_for(seed))
        assert result.ticks >= MIN_TICKS
        faults = sum(result.faults[k] for k in FAULT_KINDS)
        assert faults >= MIN_FAULTS, f"seed {seed} drew only {faults} faults"
        sections += result.stats["sections"]
        sim_totals.add("nodes", result)
    assert sections > 0, f"no client ever held a lock in seeds {sim_seeds}"


LOCK_DELAY_SEEDS = 8
"""Seeds run with lock-delays on 30 % of the leases (about 3 s each)."""


def test_lock_delays_hold_across_failovers(sim_totals: SimTotals) -> None:
    """Issue 27 item 4: leases with a lock-delay expire holding keys through crashes,
    partitions and leader changes, and no entry grants a key inside the delay an earlier
    entry put it in (lockcheck.DelayChecker; a new leader counts the delay again)."""
    delays = 0
    for seed in range(LOCK_DELAY_SEEDS):
        result = run_node_seed(seed, options_for(seed, lock_delays=0.3))
        delays += result.stats["lock_delays"]
        sim_totals.add("lock-delay", result)
    assert delays > 0, "no lock-delay started"


DEFERRED_RENEWAL_SEEDS = 8
"""Seeds run with half the exec clients on an acquire budget under half their TTL."""


def test_exec_renewals_left_until_cmd_started_keep_every_check(sim_totals: SimTotals) -> None:
    """Issue 29 item 3: `dlm exec` whose acquire cannot outlast half the TTL starts its
    keep-alives only once CMD has started and half a renewal interval has passed, and
    not at all for a CMD that ended by then (exec_cmd.renewals_can_wait decides, on the
    client's budget). CMD still never runs past the lease, through pauses, partitions
    and failovers: the deadline moves only with confirmed renewals (every checker)."""
    deferred = short = 0
    for seed in range(DEFERRED_RENEWAL_SEEDS):
        result = run_node_seed(seed, options_for(seed, deferred_renewals=0.5))
        deferred += result.stats["exec_renewals_deferred"]
        short += result.stats["exec_short_runs_unrenewed"]
        sim_totals.add("deferred-renewals", result)
    assert deferred > 0, "no exec run started its renewals while CMD ran"
    assert short > 0, "no exec run ended CMD before its renewals were due to start"


IDENTITY_SEEDS = 4
"""Seeds run at cluster version 3 with two client identities (leases with owners)."""


def test_node_sim_with_identities_at_version_3(sim_totals: SimTotals) -> None:
    """Leases record their owners and every member's per-owner counts stay those of its
    lease table through faults, restarts and installed snapshots (``usage``)."""
    for seed in range(IDENTITY_SEEDS):
        result = run_node_seed(seed, options_for(seed, identities=True, peer_version=3))
        assert result.ticks >= MIN_TICKS
        assert result.stats["owned_lease_checks"] > 0, f"seed {seed}: no lease had an owner"
        sim_totals.add("identities", result)


LEDGER_MUTANT_SEEDS = 10
"""Seeds within which each run ledger mutant must be caught."""
LOCK_DELAY_MUTANT_SEEDS = 40
SETTINGS_MUTANT_SEEDS = 20
"""Seeds within which each lock-delay mutant must be caught."""
STEADY_SEEDS = 12
"""Seeds of each steady fault in `make test` (about a second each)."""
STEADY_MUTANT_SEEDS = 40
RESTORE_SEEDS = 12
"""Seeds of the restore fault in `make test` (about 2 s each)."""
RESTORE_MUTANT_SEEDS = 12
WATCH_MUTANT_SEEDS = 5


PARTITIONED_SEEDS = 30
"""Seeds of the partitioned slice in `make test` (P = 2, 3, 4 in turn; about 3 s each)."""
PARTITIONED_MUTANT_SEEDS = 10


def partitioned_options(seed: int, **overrides: object) -> NodeSimOptions:
    """A partitioned run: P = 2, 3 or 4 by the seed (nodesim.partitioned_options says what
    else changes)."""
    return options_for(seed, **{"partitions": 2 + seed % 3, **overrides})


@pytest.mark.sim_default_seeds(0, PARTITIONED_SEEDS)
def test_node_sim_partitioned(sim_seeds: range, sim_totals: SimTotals) -> None:
    """Issue 25, items 2 and 6: every member hosts P partitions, each its own Raft group;
    clients route each key to its partition; host faults take every partition of a member
    down at once, ``crash_partition`` one of them while the others keep their leaders. The
    checkers hold per key across partitions and Raft's per partition, and once healthy no
    member leads more than ceil(P/N) partitions (the spread, dlm/node/spread.py)."""
    totals: Counter[str] = Counter()
    for seed in sim_seeds:
        result = run_node_seed(seed, partitioned_options(seed))
        assert result.ticks >= MIN_TICKS
        totals.update(result.stats)
        totals.update(result.faults)
        sim_totals.add("partitioned", result)
    assert totals["sections"] > 0, f"no client ever held a lock in seeds {sim_seeds}"
    if len(sim_seeds) >= 6:  # (a replay of one seed need not show each)
        assert totals["spread_transfers"] > 0, "no leader handed over to spread the leaders"
        assert totals["lone_leader_moves"] > 0, "no partition's leader moved alone"
        assert totals["crash_partition"] > 0, "no partition's process crashed alone"
        assert totals["partition_restarts"] > 0, "no supervisor restarted a partition"
        assert totals["wrong_partition"] > 0, "no request reached another partition's process"
        assert totals["spanning_leases"] > 0, "no lease held keys in several partitions"


def test_a_partitioned_seed_replays_the_same_run() -> None:
    seed = 4
    first = run_node_seed(seed, partitioned_options(seed))
    second = run_node_seed(seed, partitioned_options(seed))
    assert first.trace_hash == second.trace_hash
    assert first.stats == second.stats


def steady_options(seed: int, steady: str, **overrides: object) -> NodeSimOptions:
    """No scheduled faults: only ``steady``, from the start to the heal."""
    # Healed at 8 s (12 s on lossy links): the slowest of 40 seeds served its first write
    # after 4.5 s on slow disks, of 60 seeds 8.1 s on lossy links.
    healed_at = 12 if steady == "lossy_links" else 8
    # The operators' backups and identity changes stay out: on disks this slow their
    # entries alone kept the probe's write from finishing before the run ended (seed 3).
    return options_for(
        seed,
        **{
            "steady": steady,
            "fault_count": (0, 0),
            "duration_us": (healed_at + 4) * US,
            "quiet_us": 4 * US,
            "backups": False,
            "identities": False,
            **overrides,
        },
    )


@pytest.mark.parametrize("steady", ["slow_disks", "lossy_links"])
def test_a_write_succeeds_under_a_steady_fault(steady: str, sim_totals: SimTotals) -> None:
    """Issue 20, item 5: elections converge on slow disks (a majority or all of them slower
    than an election timeout) and on lossy links (30 % of peer messages lost on every link),
    and a client's write then succeeds, before the fault ends (the check is in nodesim)."""
    for seed in range(STEADY_SEEDS):
        result = run_node_seed(seed, steady_options(seed, steady))
        assert result.faults[f"steady_{steady}"] == 1
        sim_totals.add(f"steady {steady}", result)


def test_fault_mix_includes_client_faults() -> None:
    result = run_node_seed(5, options_for(5))
    assert sum(result.faults[k] for k in CLIENT_FAULTS) > 0


# ---------------------------------------------------------------------------
# Replays
# ---------------------------------------------------------------------------


def _hash_in_subprocess(seed: int, hashseed: str) -> str:
    code = (
        "from tests.sim.test_node_sim import options_for; "
        "from tests.sim.nodesim import run_node_seed; "
        f"print(run_node_seed({seed}, options_for({seed})).trace_hash)"
    )
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


TRACING_MUTANT_SEEDS = 3
"""Seeds within which each tracing mutant must be caught."""


def test_traced_seeds_check_their_spans_and_change_nothing_else(sim_totals: SimTotals) -> None:
    """Issue 30: clients that trace send the same requests plus a trace context, so a run
    is the same run traced or not (same trace hash), and its span batches are checked."""
    seed = 3
    plain = run_node_seed(seed, options_for(seed, traces=0.0))
    traced = run_node_seed(seed, options_for(seed, traces=1.0))
    assert traced.trace_hash == plain.trace_hash
    assert plain.stats["traced_requests"] == 0
    assert traced.stats["traced_requests"] > 0 and traced.stats["traced_commits"] > 0
    sim_totals.add("nodes", traced)


def test_same_seed_same_run() -> None:
    seed = 7
    first: NodeSimResult = run_node_seed(seed, options_for(seed))
    second = run_node_seed(seed, options_for(seed))
    assert first.trace_hash == second.trace_hash
    assert first.stats == second.stats
    assert run_node_seed(seed + 2, options_for(seed + 2)).trace_hash != first.trace_hash
    # A replay happens in a new process, where str hashes (and so set order) differ.
    assert _hash_in_subprocess(seed, "1") == first.trace_hash
    assert _hash_in_subprocess(seed, "2") == first.trace_hash


# ---------------------------------------------------------------------------
# Mutants: each known bug must be caught within a bounded number of seeds
# ---------------------------------------------------------------------------


class ConfirmedIsReady(ReadRounds):
    """Takes a confirmed round as ready without waiting for the state machine to reach
    its index."""

    def ready(self, applied: int) -> list[Read]:
        done = [ctx for ctx, r in self.rounds.items() if r.index >= 0]
        return [read for ctx in done for read in self.rounds.pop(ctx).reads]


class ServesReadsBeforeApplying(NodeMachine):
    """Serves a confirmed read without waiting for the state machine to reach its index."""

    read_rounds_class = ConfirmedIsReady


class CountsItselfBeforeDurable(RaftNode):
    """A leader that counts its own copy of an entry as soon as it appends it, not once its
    write is durable (what Raft dissertation 10.2.1 forbids)."""

    def _quorum_match_index(self) -> int:
        progress = self._tracker.progress
        matches = {v: progress[v].match for v in self.voters if v in progress}
        matches[self._id] = self._log.last_index()
        return quorum_index(self.voters, matches)


class CommitsBeforeItsOwnWriteIsDurable(NodeMachine):
    raft_class = CountsItselfBeforeDurable


class FixedElectionTimeout(RaftNode):
    """Draws every election timeout from [election_ticks, 2 * election_ticks): no back-off
    after failed rounds, no allowance for the disk (what dlm did before issue 20)."""

    def election_timeout_range(self) -> tuple[int, int]:
        ticks = self._cfg.election_ticks
        return ticks, 2 * ticks


class ElectsWithAFixedTimeout(NodeMachine):
    raft_class = FixedElectionTimeout


class HeartbeatReplyAfterTheDisk(RaftNode):
    """Holds its heartbeat replies until every earlier write is durable, as if they promised
    something about the disk (they do not: invariant 7)."""

    def ready(self) -> Ready:
        rd = super().ready()
        held = tuple(m for m in rd.messages_now if isinstance(m, HeartbeatResponse))
        if not held:
            return rd
        now = tuple(m for m in rd.messages_now if not isinstance(m, HeartbeatResponse))
        slower = replace(rd, messages=rd.messages + held, messages_now=now)
        if self._unadvanced and self._unadvanced[-1] is rd:
            self._unadvanced[-1] = slower
        return slower


class AnswersHeartbeatsAfterTheDisk(NodeMachine):
    raft_class = HeartbeatReplyAfterTheDisk


class RenewsDoomedLeases(NodeMachine):
    """Answers keep-alives of a lease whose Expire is already proposed."""

    def _doomed(self, lease: str) -> bool:
        return False


class ExpiresAnyIncarnation(LockStateMachine):
    """An Expire ends whatever lease has the id, not the incarnation it was meant for."""

    def _is_incarnation(self, lease: _Lease, incarnation: int) -> bool:
        return True


class ShortensLeasesOnFailover(LeaseTracker):
    """A new leader that counts every lease's TTL from a second before it took office."""

    def take_office(self, now: float, leases: object) -> None:
        super().take_office(now - 1.0, leases)  # type: ignore[arg-type]


GATEWAY_SEEDS = 8
"""Seeds of the gateway slice in `make test` (two gateways; about 2 s each)."""
GATEWAY_MUTANT_SEEDS = 5


def gateway_options(seed: int, **overrides: object) -> NodeSimOptions:
    """Two `dlm gateway` processes between half the library clients and the cluster
    (issue 30). Membership changes are off: a gateway relays only to its --cluster."""
    return options_for(seed, **{"gateways": 2, "membership": False, **overrides})


@pytest.mark.sim_default_seeds(0, GATEWAY_SEEDS)
def test_node_sim_with_gateways(sim_seeds: range, sim_totals: SimTotals) -> None:
    """Issue 30, item 4: gateways crash (every connection through them breaks) and
    restart (hints lost) between clients and the cluster, clients follow leaders through
    them, a hostile client asks them for outsiders, and every checker holds; with P = 2
    on odd seeds (partition preambles through the gateway)."""
    totals: Counter[str] = Counter()
    for seed in sim_seeds:
        options = gateway_options(seed)
        if seed % 2:
            options = partitioned_options(seed, partitions=2, gateways=2)
        result = run_node_seed(seed, options)
        assert result.ticks >= MIN_TICKS
        totals.update(result.stats)
        sim_totals.add("gateways", result)
    assert totals["sections"] > 0, f"no client ever held a lock in seeds {sim_seeds}"
    assert totals["gateway_connections"] > 0, "no client went through a gateway"
    assert totals["gateway_crashes"] > 0, "no gateway crashed"
    assert totals["gateway_refused"] > 0, "no gateway refused an outsider"


MUTANTS: dict[str, tuple[Callable[[int], NodeSimOptions], set[str], int]] = {
    # Issue 30: every traced request's spans are checked as the member hands them out
    # (nodesim._check_spans); with every client tracing, the first traced commit shows it.
    "a traced request's spans leave without the leader's fsync": (
        lambda seed: options_for(seed, machine_class=DropsTheFsyncSpan, traces=1.0),
        {"spans"},
        TRACING_MUTANT_SEEDS,
    ),
    "a traced request's apply is recorded before its commit": (
        lambda seed: options_for(seed, machine_class=MisordersTheApplySpan, traces=1.0),
        {"spans"},
        TRACING_MUTANT_SEEDS,
    ),
    # Issue 30: both caught at seed 0 (each gateway is asked for an outsider three times a
    # run; a targeted connection follows each leader change).
    "gateway relays to any target": (
        lambda seed: gateway_options(seed, gateway_router_class=RelaysAnyTarget),
        {"gateway-open-relay"},
        GATEWAY_MUTANT_SEEDS,
    ),
    "gateway prefers its hint to the named member": (
        lambda seed: gateway_options(seed, gateway_router_class=PrefersItsHint),
        {"gateway-target"},
        GATEWAY_MUTANT_SEEDS,
    ),
    "client counts its lease from the reply": (
        # A weak mutant: its deadline is late only by one reply's latency. The parent
        # commit caught it at seed 0 and at no other of seeds 0-59; with the exec and
        # host faults' draws in the schedule, the first seed that does is 101.
        lambda seed: options_for(seed, lease_clock_from_reply=True),
        {"two-holders", "lease-outlived", "cmd-after-grant"},
        120,
    ),
    # Issue 20, hole 3: caught after 1 seed (seed 0) as lease-outlived, and after 1 by the
    # holder check alone (since the late handovers; 2 and 2 before).
    "client outlives a shortened lease": (
        lambda seed: options_for(seed, lease_clock_class=OutlivesShortenedLeases),
        {"lease-outlived", "two-holders"},
        20,
    ),
    # Seen by the holder check: as two holders, or as a semaphore slot taken while both
    # others are held, one by a minimum hold and one by a client outliving its lease
    # (min-hold: seed 0, once the late handovers went in).
    "client outlives a shortened lease (two holders seen)": (
        lambda seed: options_for(
            seed, lease_clock_class=OutlivesShortenedLeases, check_outlived=False
        ),
        {"two-holders", "min-hold"},
        20,
    ),
    # Issue 23: every request kind's permission unchecked, at the receiving member and at
    # apply; the workload's limited identities ask for keys outside their prefixes. Caught
    # as unpermitted in every one of seeds 0-19, within 0.14-2.03 s of simulated time.
    "requests applied without their permission": (
        lambda seed: options_for(
            seed, machine_class=SkipsPermissionChecks, lock_machine_class=AppliesWithoutPermission
        ),
        {"unpermitted"},
        3,
    ),
    # Only the apply-time check off: seen when an identity is removed between a request's
    # proposal and its apply (seed 1 of 0-19, at 6.4 s: a removed identity's open applied).
    "an identity removed between propose and apply is not refused at apply": (
        lambda seed: options_for(seed, lock_machine_class=AppliesWithoutPermission),
        {"unpermitted"},
        5,
    ),
    "read served before applying to the read index": (
        lambda seed: options_for(seed, machine_class=ServesReadsBeforeApplying),
        {"stale-read"},
        40,
    ),
    "keep-alive of a lease being expired": (
        # A renewed doomed lease ends anyway: a --min-hold handed over on it is cut short
        # too (min-hold), the same bug seen by another check.
        lambda seed: options_for(seed, machine_class=RenewsDoomedLeases),
        {"two-holders", "lease-outlived", "cmd-after-grant", "min-hold"},
        120,
    ),
    # Caught after 6 seeds (seed 5), by the late handovers (NodeSimOptions.late_handovers).
    "a TTL update of a lease being expired is confirmed": (
        lambda seed: options_for(seed, machine_class=ConfirmsUpdatesOfDoomedLeases),
        {"min-hold"},
        30,
    ),
    # Caught after 4 seeds (seed 3; 3 before the late handovers).
    "--min-hold counted from the acquire's send": (
        lambda seed: options_for(seed, min_hold_from_send=True),
        {"min-hold"},
        20,
    ),
    "exec guard kills after the deadline": (
        lambda seed: options_for(seed, exec_kill_late_us=300_000),
        {"two-holders", "cmd-after-grant"},
        40,
    ),
    "exec starts CMD without comparing its deadline with the clock (hole 4)": (
        lambda seed: options_for(
            seed,
            guard_rules_class=SpawnsWithoutLooking,
            start_gate_class=OrdersSpawnWithoutLooking,
        ),
        {"cmd-after-grant", "two-holders"},
        40,
    ),
    "exec guard counts on a clock that stops in a suspend": (
        lambda seed: options_for(seed, guard_clock_stops_in_suspend=True),
        {"cmd-after-grant", "two-holders"},
        40,
    ),
    "expire ignores the incarnation": (
        lambda seed: options_for(seed, lock_machine_class=ExpiresAnyIncarnation),
        {"two-holders", "lost-grant", "lease-outlived", "cmd-after-grant"},
        120,
    ),
    "leader counts its own write before it is durable": (
        lambda seed: options_for(seed, machine_class=CommitsBeforeItsOwnWriteIsDurable),
        {"applied-before-durable"},
        40,
    ),
    "new leader shortens leases": (
        lambda seed: options_for(seed, tracker_class=ShortensLeasesOnFailover),
        {"two-holders", "lease-outlived", "cmd-after-grant"},
        40,
    ),
    # Issue 27 item 4: a key whose holder's lease expired is granted to nobody for the
    # lease's lock-delay, a new leader counting it again from its election.
    "a new leader ends every lock-delay at once": (
        lambda seed: options_for(seed, tracker_class=EndsLockDelaysOnFailover, lock_delays=0.3),
        {"lock-delay"},
        LOCK_DELAY_MUTANT_SEEDS,
    ),
    # Issue 30: a replica restored from a snapshot image stops enforcing the max-ttl.
    "the max-ttl is not enforced after a snapshot restore": (
        lambda seed: options_for(
            seed, lock_machine_class=IgnoresMaxTtlAfterRestore, cluster_settings=1.0
        ),
        {"over-max-ttl"},
        SETTINGS_MUTANT_SEEDS,
    ),
    # Issue 30: an open naming no TTL must get the cluster's default-ttl.
    "the client names 30s to a member that takes the cluster's default-ttl": (
        lambda seed: options_for(seed, fit_request=names_30s_to_every_member, cluster_settings=1.0),
        {"default-ttl"},
        SETTINGS_MUTANT_SEEDS,
    ),
    "an expiry ignores the lease's lock-delay": (
        lambda seed: options_for(
            seed, lock_machine_class=ExpiresWithoutTheLockDelay, lock_delays=0.3
        ),
        {"lock-delay"},
        LOCK_DELAY_MUTANT_SEEDS,
    ),
    "a peer connection that stopped delivering is never replaced": (
        lambda seed: options_for(seed, link_watch_class=NeverReplacesLinks),
        {"slow-recovery"},
        10,
    ),
    # Issue 20: a stranger's frames before a proof reach the member (stranger.py).
    "a refusal before the proof is believed (hole 1)": (
        lambda seed: options_for(seed, dialing_class=BelievesRefusalsBeforeTheProof),
        {"unauthenticated"},
        2,
    ),
    "a learner that never proved the peer secret is promoted on request (issue 23)": (
        lambda seed: options_for(seed, machine_class=PromotesTheUnproved),
        {"unproved-voter"},
        20,
    ),
    # Caught in the first seed: the workload's admin removes an identity while its clients
    # hold locks, every few seconds.
    "a removed identity's leases ended at its removal (issue 23)": (
        lambda seed: options_for(
            seed, identities=True, peer_version=3, lock_machine_class=FreesARemovedIdentitysLeases
        ),
        {"removed-lease-freed"},
        5,
    ),
    "per-owner counts not rebuilt from a snapshot (issue 23, quotas)": (
        lambda seed: options_for(
            seed, identities=True, peer_version=3, lock_machine_class=RestoresWithoutUsage
        ),
        {"usage"},
        20,
    ),
    # Issue 28, the run ledger (ledgercheck.py).
    "exec acquires answered held are not counted as skips": (
        lambda seed: options_for(seed, ledger_class=ForgetsSkips),
        {"ledger"},
        LEDGER_MUTANT_SEEDS,
    ),
    "the snapshot image leaves the runs out": (
        lambda seed: options_for(seed, ledger_class=ImagesWithoutRuns),
        {"ledger"},
        LEDGER_MUTANT_SEEDS,
    ),
    "an admin's per-identity quotas never looked up (issue 23, dlm auth set)": (
        lambda seed: options_for(seed, lock_machine_class=IgnoresIdentityLimits),
        {"over-quota"},
        20,
    ),
    "the member hears a hello before its proof (hole 2)": (
        lambda seed: options_for(seed, acceptance_class=AsksTheMemberBeforeTheProof),
        {"unauthenticated"},
        2,
    ),
    "a client admitted without its proof": (
        lambda seed: options_for(seed, acceptance_class=AdmitsClientsWithoutTheProof),
        {"unauthenticated"},
        2,
    ),
    # Caught after 2 seeds (seed 1).
    "a backup labelled with the log's last index, not its image's": (
        lambda seed: options_for(seed, machine_class=LabelsBackupsWithTheLastIndex),
        {"backup-uncommitted", "backup-inconsistent"},
        10,
    ),
    # Caught after 1 seed (seed 0) as a watch-gap (watchcheck.py): the watchers hang up
    # every few seconds and resume on another member.
    "a resumed watch served from now, not after the index it names": (
        lambda seed: options_for(seed, watches_class=ResumesFromNow),
        {"watch-gap"},
        WATCH_MUTANT_SEEDS,
    ),
    # Caught after 15 seeds (seed 14): it needs a leader cut off while the backup's client
    # still reaches it, so leaders are isolated four times as often as in the default mix
    # (with it, 64 seeds, and 160 once members looked at their peer links on a timer).
    "a backup served without a read round": (
        lambda seed: options_for(
            seed,
            machine_class=ServesBackupsWithoutARound,
            identities=False,
            fault_weights={**DEFAULT_WEIGHTS, "isolate_leader": 12},
        ),
        {"backup-stale"},
        120,
    ),
    "election timeout fixed, however slow the disks": (
        lambda seed: steady_options(seed, "slow_disks", machine_class=ElectsWithAFixedTimeout),
        {"liveness"},
        STEADY_MUTANT_SEEDS,
    ),
    # Issue 24: a restore (or a recovery) is one more fault. Without the quarantine, a holder
    # of the old cluster still holds when the restored one grants its key (caught after 7
    # seeds, seed 6, as two-holders; with restores alone, after 4 as min-hold).
    "a restored cluster grants at once (no quarantine)": (
        lambda seed: restore_options(seed, restore_quarantine=False),
        {"two-holders", "min-hold", "cmd-after-grant"},
        RESTORE_MUTANT_SEEDS,
    ),
    # Without the token jump, the restored log continues at the backup's index: grants below
    # what the old cluster wrote (caught after 3 seeds as tokens-rise). (With the quarantine
    # on, the entries of its 5 s usually carry the log past the old one before any grant.)
    "a restored log continues at the backup's index (no bump, no quarantine)": (
        lambda seed: restore_options(seed, restore_quarantine=False, restore_bump=0),
        {"tokens-rise", "two-holders", "min-hold", "cmd-after-grant", "history"},
        RESTORE_MUTANT_SEEDS,
    ),
    # Issue 25: caught by the end-of-run spread check (nodesim._check_spread).
    "every partition prefers the same voter (no rotation)": (
        lambda seed: partitioned_options(seed, machine_class=SpreadsWithoutRotation),
        {"spread"},
        PARTITIONED_MUTANT_SEEDS,
    ),
    "a partition's process serves another partition's keys (no WRONG_PARTITION)": (
        lambda seed: partitioned_options(seed, machine_class=ServesEveryPartitionsKeys),
        {"two-holders", "token-order", "history", "lost-grant", "cmd-after-grant", "min-hold"},
        PARTITIONED_MUTANT_SEEDS,
    ),
    "a lease with parts counts on its latest part's deadline": (
        # A weak mutant: the parts' deadlines differ only after a renewal round that some
        # partition missed. Caught after 15 seeds (seed 14), as lease-outlived.
        lambda seed: partitioned_options(seed, part_clocks_class=CountsOnTheLatestPart),
        {"lease-outlived", "two-holders", "min-hold"},
        4 * PARTITIONED_MUTANT_SEEDS,
    ),
    # Issue 30: a part whose open was retried through another gateway past its TTL joins
    # the keeper's clocks only at the next round. Seed 33 of the gateway runs found it,
    # and no other of seeds 0-1099 catches it (the links' retransmission rule shifted
    # seed 33's timing): such an open is rare, so these runs make half of them late
    # (late_part_opens; test_late_part_opens_leave_no_violation runs them unmutated).
    # Caught after 10 seeds (seed 9), as lease-outlived; P = 2 with two gateways.
    "a lease's part joins its clocks only at the next renewal round": (
        lambda seed: late_part_open_options(seed, part_clocks_class=JoinsPartsAtRoundsOnly),
        {"lease-outlived", "two-holders", "min-hold"},
        40,
    ),
    # Raft's checks run per partition (each group its own SafetyChecker, durable copies
    # counted among the group's own members): caught in the first seed.
    "leader counts its own write before it is durable (partitioned)": (
        lambda seed: partitioned_options(seed, machine_class=CommitsBeforeItsOwnWriteIsDurable),
        {"applied-before-durable"},
        PARTITIONED_MUTANT_SEEDS,
    ),
    "a leader never hands over to spread the leaders": (
        lambda seed: partitioned_options(seed, machine_class=NeverSpreads),
        {"spread"},
        PARTITIONED_MUTANT_SEEDS,
    ),
    # Issue 25, the supervisor: crash_partition's restart is what the member's restart
    # policy decides (dlm/node/supervision.py, as supervisor.py asks it).
    "a member's supervisor stops the member at a partition's first crash": (
        lambda seed: partitioned_options(seed, restart_policy_class=StopsTheMemberAtAnyCrash),
        {"liveness", "slow-recovery", "spread"},
        PARTITIONED_MUTANT_SEEDS,
    ),
    # Lossy links (tests/chaos/netns.py): a connection TCP is about to retry on, replaced
    # after an election timeout of silence, left no leader long enough to serve a write.
    "a peer connection is replaced while TCP is about to retransmit on it": (
        lambda seed: steady_options(
            seed, "lossy_links", link_watch_class=ReplacesLinksTcpWouldRetry
        ),
        {"liveness"},
        STEADY_MUTANT_SEEDS,
    ),
    "heartbeat replies wait for the disk": (
        lambda seed: steady_options(
            seed, "slow_disks", machine_class=AnswersHeartbeatsAfterTheDisk
        ),
        {"liveness"},
        STEADY_MUTANT_SEEDS,
    ),
}


def late_part_open_options(seed: int, **overrides: object) -> NodeSimOptions:
    """P = 2 behind two gateways, half the answers to a lease part's open a TTL late (and
    no cluster settings, as the mutant budgets were measured)."""
    options = {"partitions": 2, "gateways": 2, "late_part_opens": 0.5, "cluster_settings": 0.0}
    return partitioned_options(seed, **{**options, **overrides})


LATE_PART_OPEN_SEEDS = 6


def test_late_part_opens_leave_no_violation(sim_totals: SimTotals) -> None:
    """The runs the late-part mutant is caught in, with the library's own PartClocks: a
    part whose open came back after its TTL counts at once, so the lease is lost, not
    outlived (the 1,100 seeds before this fault never had such an open)."""
    late = 0
    for seed in range(LATE_PART_OPEN_SEEDS):
        result = run_node_seed(seed, late_part_open_options(seed))
        late += result.stats["late_part_opens"]
        sim_totals.add("late part opens", result)
    assert late > 0, "no part's open came back late"


def restore_options(seed: int, **overrides: object) -> NodeSimOptions:
    """The usual run, with the restore fault drawn often enough that most seeds have one."""
    weights = dict(DEFAULT_WEIGHTS)
    weights["restore"] = 3
    weights["recover"] = 3
    # No backups in these runs: the backup checker follows one incarnation's log, and a
    # backup taken at a restored cluster's first index has no entry there to compare.
    return options_for(seed, **{"fault_weights": weights, "backups": False, **overrides})


def test_a_restore_is_one_more_fault_and_the_checkers_hold_across_it(
    sim_totals: SimTotals,
) -> None:
    """Issue 24: a backup is taken, every member and its data is lost and the cluster is
    restored from the backup (dlm/node/incarnation.py, as `dlm node restore` builds it), or
    the survivor whose log goes furthest is recovered (`dlm node recover`) and the others
    rebuilt from it, while clients and the old cluster's holders run on: one holder at a
    time in real time, tokens rising per key (and above every index of the old
    incarnation), through it."""
    restored = recovered = 0
    for seed in range(RESTORE_SEEDS):
        result = run_node_seed(seed, restore_options(seed))
        restored += result.stats["restores"]
        recovered += result.stats["recoveries"]
        sim_totals.add("restore", result)
    assert restored >= RESTORE_SEEDS // 3, f"only {restored} of {RESTORE_SEEDS} seeds restored"
    assert recovered > 0, "no seed recovered a survivor"


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught(name: str, sim_totals: SimTotals) -> None:
    make_options, kinds, budget = MUTANTS[name]
    from .nodesim import SimFailure

    for seed in range(budget):
        options = make_options(seed)
        if options.cluster_settings == NodeSimOptions.cluster_settings:
            # The budgets were measured on runs without the max-ttl operator (issue 30),
            # whose requests shift every later draw of a run it is in.
            options.cluster_settings = 0.0
        try:
            run_node_seed(seed, options)
        except SimFailure as failure:
            assert failure.violation.kind in kinds, failure
            sim_totals.note(
                f"mutant '{name}': caught after {seed + 1} seed(s) as {failure.violation.kind}"
            )
            return
    pytest.fail(f"mutant '{name}' went unnoticed for {budget} seeds")


def test_stalled_peer_connections_are_replaced_and_never_replacing_them_is_caught() -> None:
    """Only the ``stall`` fault (a connection that silently stops delivering until its
    sender replaces it): LinkWatch replaces them and the cluster recovers at the heal;
    a member that never replaces one leaves the cluster without a quorum after it."""
    from .nodesim import SimFailure

    seed = 0
    result = run_node_seed(seed, options_for(seed, fault_weights={"stall": 1}, membership=False))
    assert result.faults["stall"] >= MIN_FAULTS
    assert result.stats["links_replaced"] > 0
    mutant = options_for(
        seed, fault_weights={"stall": 1}, membership=False, link_watch_class=NeverReplacesLinks
    )
    with pytest.raises(SimFailure) as failure:
        run_node_seed(seed, mutant)
    assert failure.value.violation.kind == "slow-recovery"


def test_a_stalled_connection_nothing_is_written_to_is_replaced() -> None:
    """A member looks at its connections on a timer, as peers.py does, not only when it
    writes: a follower's connection to another follower carries nothing while a leader
    serves, and one that a cut stalled must still be replaced within ``stall_after`` and
    two looks, once TCP's retransmission timeout has doubled past a new connection's
    (three unanswered retransmissions: 7 first timeouts). Looked at only when written
    to, the connections a partition stalled stayed so after the heal until the first
    election round wrote to them and was lost with them (seed 3601 at 2afbbb1: no leader
    for 3.1 s after the heal, the liveness probe unfinished at the end of the run)."""
    from .nodesim import LINK_POLL_US, MS, RETRANSMIT_US, NodeSimulation, SimPeerLink

    seed = 0
    sim = NodeSimulation(seed, options_for(seed, fault_count=(0, 0), membership=False))
    stalled_at = 2 * US
    stalled: list[tuple[SimPeerLink, int]] = []
    looked: list[tuple[bool, bool]] = []

    def stall() -> None:
        leader = sim.leader()
        assert leader is not None, "no leader 2 s into a run without faults"
        src, dst = sorted(n for n in sim.members if n != leader.id)[:2]
        link = sim._peer_link(src, dst)
        link.sent += 1  # a vote request a cut kept: written, never to be acknowledged
        link.stalled = True
        stalled.append((link, link.conn))

    def look() -> None:
        link, conn = stalled[0]
        looked.append((link.conn != conn, link.stalled))

    sim.world.at(stalled_at, stall)
    sim.world.at(stalled_at + 7 * RETRANSMIT_US + 2 * LINK_POLL_US + 10 * MS, look)
    sim.run()
    assert looked == [(True, False)], "a stalled connection nobody wrote to was not replaced"
