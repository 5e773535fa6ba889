"""Runs `dlm node` with a known bug switched on, to show the chaos suite catches it end to end.

``python -m tests.chaos.mutant_node MUTANT node start ...``: the `dlm` command,
with one class of the member patched in this process only (nothing in dlm
reads a switch; the runner uses this launcher instead of ``python -m dlm``
when ``DLM_CHAOS_MUTANT`` names a mutant). Mutants:

``early-expiry``: the leader counts every lease's TTL as a quarter of what the
client asked for (less than the third after which clients renew), so it
expires leases, and grants their locks to the next in line, while their
clients still count on them: the bug invariant 4 exists
against (and, seen from a waiter, the class etcd #11456 belongs to: a lock
handed on while its holder's lease was still good).
"""

from __future__ import annotations

import sys

MUTANTS = ("early-expiry",)


def early_expiry() -> None:
    from dlm.node.leases import LeaseTracker

    arm = LeaseTracker._arm

    def short_arm(self: LeaseTracker, lease: str, ttl: float, incarnation: int, now: float) -> None:
        arm(self, lease, ttl / 4, incarnation, now)

    # Renewals count from the TTL the lease was armed with: they are short too.
    LeaseTracker._arm = short_arm  # type: ignore[method-assign]


def main() -> None:
    mutant, argv = sys.argv[1], sys.argv[2:]
    if mutant not in MUTANTS:
        raise SystemExit(f"unknown mutant {mutant!r}; the mutants are {', '.join(MUTANTS)}")
    early_expiry()
    from dlm.cli.main import main as dlm_main

    dlm_main(argv)


if __name__ == "__main__":
    main()
