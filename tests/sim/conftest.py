"""Seed selection for the simulator tests.

A test that takes ``sim_seeds`` receives a batch of consecutive seeds (one
test case per batch keeps pytest's per-case overhead small). Without
``--sim-seeds`` the batches cover the CI range; with ``--sim-seeds=S:C`` they
cover exactly seeds S .. S+C-1, for every such test.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .harness import SimResult
    from .nodesim import NodeSimResult

CI_SEEDS = (0, 300)
BATCH = 10


def parse_seed_range(text: str) -> tuple[int, int]:
    start, sep, count = text.partition(":")
    if not sep:
        raise pytest.UsageError(f"--sim-seeds wants START:COUNT, got {text!r}")
    try:
        first, n = int(start), int(count)
    except ValueError:
        raise pytest.UsageError(f"--sim-seeds wants integers START:COUNT, got {text!r}") from None
    if first < 0 or n < 1:
        raise pytest.UsageError(f"--sim-seeds wants START >= 0 and COUNT >= 1, got {text!r}")
    return first, n


def seed_batches(first: int, count: int, batch: int = BATCH) -> list[range]:
    end = first + count
    return [range(s, min(s + batch, end)) for s in range(first, end, batch)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sim_seeds" not in metafunc.fixturenames:
        return
    option = metafunc.config.getoption("--sim-seeds")
    if option is None:
        marker = metafunc.definition.get_closest_marker("sim_default_seeds")
        first, count = marker.args if marker else CI_SEEDS
    else:
        first, count = parse_seed_range(option)
    batches = seed_batches(first, count)
    metafunc.parametrize(
        "sim_seeds", batches, ids=[f"seeds{b.start}-{b.stop - 1}" for b in batches]
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim_default_seeds(start, count): the seed range used without --sim-seeds"
    )


class SimTotals:
    """Figures summed over every seed the session ran, printed at the end."""

    def __init__(self) -> None:
        self.seeds: dict[str, int] = {}
        self.ticks: dict[str, int] = {}
        self.stats: dict[str, Counter[str]] = {}
        self.faults: dict[str, Counter[str]] = {}
        self.seconds: dict[str, float] = {}
        self.notes: list[str] = []
        self._started = time.perf_counter()

    def add(self, suite: str, result: SimResult | NodeSimResult) -> None:
        now = time.perf_counter()
        self.seconds[suite] = self.seconds.get(suite, 0.0) + (now - self._started)
        self._started = now
        self.seeds[suite] = self.seeds.get(suite, 0) + 1
        self.ticks[suite] = self.ticks.get(suite, 0) + result.ticks
        self.stats.setdefault(suite, Counter()).update(result.stats)
        self.faults.setdefault(suite, Counter()).update(result.faults)

    def note(self, line: str) -> None:
        self.notes.append(line)

    def restart_clock(self) -> None:
        self._started = time.perf_counter()

    def to_data(self) -> dict[str, Any]:
        """The figures as plain values, for an xdist worker to hand to the controller."""
        return {
            "seeds": self.seeds,
            "ticks": self.ticks,
            "stats": {k: dict(v) for k, v in self.stats.items()},
            "faults": {k: dict(v) for k, v in self.faults.items()},
            "seconds": self.seconds,
            "notes": self.notes,
        }

    def merge(self, data: dict[str, Any]) -> None:
        """Adds a worker's figures (``to_data``); seconds add up worker time."""
        for suite, seeds in data["seeds"].items():
            self.seeds[suite] = self.seeds.get(suite, 0) + seeds
            self.ticks[suite] = self.ticks.get(suite, 0) + data["ticks"][suite]
            self.seconds[suite] = self.seconds.get(suite, 0.0) + data["seconds"][suite]
            self.stats.setdefault(suite, Counter()).update(data["stats"][suite])
            self.faults.setdefault(suite, Counter()).update(data["faults"][suite])
        self.notes.extend(data["notes"])

    def lines(self) -> list[str]:
        out: list[str] = []
        for suite, seeds in self.seeds.items():
            secs = self.seconds[suite]
            stats = self.stats[suite]
            mix = ", ".join(
                f"{kind} {count / seeds:.1f}" for kind, count in sorted(self.faults[suite].items())
            )
            out.append(
                f"sim[{suite}]: {seeds} seeds, {self.ticks[suite]} ticks in {secs:.1f} s "
                f"({seeds / secs:.2f} seeds/s, {self.ticks[suite] / secs:.0f} ticks/s)"
            )
            out.append(f"  faults per seed: {mix}")
            keys = (
                "snapshot_installs",
                "snapshots_taken",
                "backups_checked",
                "backups_refused",
                "backups_cut_off",
                "elections",
                "crashes",
                "crashes_mid_write",
                "proposals",
                "reads_served",
                "transfers",
                "delivered",
                "sections",
                "handovers",
                "renewals",
                "reads",
                "zombie_writes_refused",
                "zombie_writes_accepted",
                "events",
                "slow_writes",
                "conf_add_learner",
                "conf_promote",
                "conf_remove",
                "conf_refused",
                "removal_noticed",
                "links_replaced",
                "cmds",
                "cmds_killed",
                "cmd_started_late",
                "exec_too_late",
                "exec_not_ordered",
                "exec_not_started",
            )
            out.append("  totals: " + ", ".join(f"{k} {stats[k]}" for k in keys if stats[k]))
            stranger = sorted(k for k in stats if k.startswith("stranger_") and stats[k])
            if stranger:  # stranger.py's acts, none of which may change a member
                out.append("  stranger: " + ", ".join(f"{k[9:]} {stats[k]}" for k in stranger))
        out.extend(f"sim: {note}" for note in self.notes)
        return out


_TOTALS = SimTotals()


@pytest.fixture
def sim_totals() -> SimTotals:
    _TOTALS.restart_clock()
    return _TOTALS


def pytest_sessionfinish(session: pytest.Session) -> None:
    # On an xdist worker: hand the figures to the controller, which prints them.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["sim_totals"] = _TOTALS.to_data()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: defined only where xdist is loaded
def pytest_testnodedown(node: Any, error: object) -> None:
    data = getattr(node, "workeroutput", {}).get("sim_totals")
    if data is not None:
        _TOTALS.merge(data)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _TOTALS.lines():
        terminalreporter.write_line(line)
