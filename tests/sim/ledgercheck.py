"""The run ledger's checker (issue 28): every `dlm exec` run whose CMD started is in the
ledger once, at its grant's token, and every skip is counted on the run it found.

The simulator tells it two things as they happen: a CMD started under a grant (key, token,
lease), and an entry was applied (an exec acquire answered "held" is a skip on the newest
holder that is a run). At the end, each member's ledger must hold each started run it has
applied, exactly once and with its lease, and each run's skip count must be the number of
such answers in the log up to that member's applied index, whether the member applied
those entries or restored them from a snapshot image.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlm.node import locks
from dlm.node.locks.ledger import COMMAND_META, RunLedger

from .checkers import Violation


class SimLedger(RunLedger):
    """The members' ledger in the simulator: no retention by count or age, so the checker
    can ask for every run (retention has its unit tests)."""

    runs_per_key = 1 << 30
    max_age_ms = 1 << 60
    max_keys = 1 << 30


@dataclass
class LedgerChecker:
    started: dict[tuple[str, int], str] = field(default_factory=dict)
    """(key, token) -> lease of every run whose CMD started."""
    at_version_4: set[int] = field(default_factory=set)
    """Tokens of the grants made at cluster version 4 or later (only those are runs)."""
    skips: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Log index of each exec acquire answered held -> the (key, token) it counts on."""
    asked: dict[tuple[str, int], int] = field(default_factory=dict)
    """The first entry of each exec acquire answered held, by (client, seq)."""
    checked_runs: int = 0

    def cmd_started(self, key: str, token: int, lease: str) -> None:
        self.started[(key, token)] = lease

    def applied(self, outcome: locks.ApplyOutcome, version: int) -> None:
        cmd, result = outcome.command, outcome.result
        if version < 4:
            return
        if isinstance(result, locks.Granted) and result.token == outcome.index:
            self.at_version_4.add(result.token)
        self.at_version_4.update(p.token for p in outcome.promotions)
        if not isinstance(result, locks.Locked):
            return
        if not isinstance(cmd, locks.AcquireCommand) or COMMAND_META not in cmd.meta:
            return
        runs = [
            h.token
            for h in result.holders
            if COMMAND_META in h.meta and h.token in self.at_version_4
        ]
        # A re-sent acquire is answered its remembered result in an entry of its own: one
        # request, one skip (at the entry where it ran).
        request = (cmd.origin.client, cmd.origin.seq)
        first = self.asked.setdefault(request, outcome.index)
        if runs and first == outcome.index:
            self.skips[outcome.index] = (cmd.key, max(runs))

    def restored(self, index: int) -> None:
        """The cluster was restored (or recovered) from its state at ``index``: what came
        after is gone with the old incarnation."""
        self.started = {run: lease for run, lease in self.started.items() if run[1] <= index}
        self.skips = {i: run for i, run in self.skips.items() if i <= index}

    def check(self, member: str, table: locks.LockStateMachine) -> None:
        applied = table.applied_index
        ledger = table.ledger
        for (key, token), lease in self.started.items():
            if token > applied or token not in self.at_version_4:
                continue
            found = [r for r in ledger.runs_of(key) if r.token == token and r.lease == lease]
            if len(found) != 1:
                raise Violation(
                    "ledger",
                    f"{member} (applied {applied}) holds {len(found)} runs of {key!r} at "
                    f"token {token} (lease {lease}); a started CMD's run appears exactly once",
                )
            self.checked_runs += 1
        expected: dict[tuple[str, int], int] = {}
        for index, found_held in self.skips.items():
            if index <= applied:
                expected[found_held] = expected.get(found_held, 0) + 1
        for key, _ in ledger.totals(""):
            # Runs that share a token (semaphore slots granted in one step) share its skips.
            counted: dict[int, int] = {}
            for run in ledger.runs_of(key):
                counted[run.token] = counted.get(run.token, 0) + run.skips
            for token, skips in counted.items():
                want = expected.get((key, token), 0)
                if skips != want:
                    raise Violation(
                        "ledger",
                        f"{member}: the runs of {key!r} at token {token} count {skips} "
                        f"skips; the log answered {want} exec acquires held by them",
                    )
