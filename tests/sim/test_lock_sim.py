"""The lock state machine replicated by the Raft core, under the simulator's faults.

See locksim.py for the workload and the lock invariants checked; the Raft
invariants and image comparisons of the harness apply as well.
"""

from __future__ import annotations

import pytest

from .conftest import SimTotals
from .harness import DiskBackend, MemoryBackend, SimFailure, SimNode
from .locksim import LockMachine, LockSimulation, lock_options


def run_lock_seed(
    seed: int, simulation: type[LockSimulation] = LockSimulation
) -> SimFailure | None:
    options = lock_options(backend=DiskBackend if seed % 2 else MemoryBackend)
    try:
        simulation(seed, options).run()
    except SimFailure as failure:
        return failure
    return None


@pytest.mark.sim_default_seeds(0, 100)
def test_lock_sim(sim_seeds: range, sim_totals: SimTotals) -> None:
    for seed in sim_seeds:
        options = lock_options(backend=DiskBackend if seed % 2 else MemoryBackend)
        result = LockSimulation(seed, options).run()
        assert result.stats["grants"] > 0
        sim_totals.add("locks", result)


class ShortensLeasesOnFailover(LockSimulation):
    """A new leader that counts every lease's TTL from a second before it took office."""

    def leader_elected(self, node: SimNode) -> None:
        machine = node.machine
        assert isinstance(machine, LockMachine)
        self.trackers[node.id].take_office(self._seconds() - 1.0, machine.sm.leases())


def test_lease_checker_catches_shortened_leases(sim_totals: SimTotals) -> None:
    for seed in range(50):
        failure = run_lock_seed(seed, ShortensLeasesOnFailover)
        if failure is not None:
            assert failure.violation.kind == "lease-expired-early", failure
            sim_totals.note(
                f"bug ShortensLeasesOnFailover: caught after {seed + 1} seed(s) as "
                f"{failure.violation.kind}"
            )
            return
    pytest.fail("a leader that shortens leases on failover went unnoticed for 50 seeds")
