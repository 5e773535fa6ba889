"""The run ledger: what became of each `dlm exec` run, replicated with the lock table.

A *run* is a grant whose owner metadata names a command (``cmd``, which `dlm exec`
sends with its acquire, with ``host`` and ``user``; bounded by dlm/limits.py's metadata
rules). So the run's start costs no entry of its own: it is the grant's entry, at the
grant's token and the proposing leader's time. Its end rides on the request that ends
the grant: the ``close_lease`` (or, under ``--min-hold``, the finishing ``lease_update``)
carries a ``RunReport`` (how CMD ended). A grant that ends without a report (its lease
expired, or was closed or released by something else) ends its run as
``supervisor_gone``: nobody said how CMD ended. A host whose exec acquire is answered
"held" adds one to the ``skips`` of the run whose grant it found, inside the entry of
that acquire (which the log carries anyway), so a skip costs no write of its own.

Bounds (constants, not settings: every replica must forget the same runs, so they
cannot differ between members): per key the newest ``RUNS_PER_KEY`` runs, none whose
start is more than ``RUN_MAX_AGE_MS`` older than the newest entry's time on that key;
at most ``MAX_KEYS`` keys, the one whose newest run is oldest forgotten first. Per key
the ledger also keeps running totals (runs by outcome, skips, the last success), which
the leader exports as metrics.

Pure and deterministic: times come in from the applied entries (``at_ms``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

RUNS_PER_KEY = 10
"""Runs kept per key (newest first in `dlm runs KEY`)."""
RUN_MAX_AGE_MS = 30 * 24 * 3600 * 1000
"""A run started more than 30 days before a later run of the key started is forgotten."""
MAX_KEYS = 10_000
"""Keys the ledger keeps; beyond, the key whose newest run is the oldest is forgotten."""

FINISHED = "finished"
"""CMD ran and ended by itself (``exit_code``, or ``signal`` when a signal ended it)."""
KILLED = "killed"
"""`dlm exec`'s guard stopped CMD at the lease's deadline (renewals failed)."""
LOCK_LOST = "lock_lost"
"""The lease was lost (the cluster said so) before CMD ended or could start."""
SUPERVISOR_GONE = "supervisor_gone"
"""The grant ended without a report: the lease expired (or was ended by someone else)."""
RUNNING = "running"
"""Not ended yet."""
REPORTED = (FINISHED, KILLED, LOCK_LOST)
"""The outcomes a client may report; ``supervisor_gone`` is the cluster's own."""
OUTCOMES = (FINISHED, KILLED, LOCK_LOST, SUPERVISOR_GONE)

SIGNAL_MAX = 128
EXIT_CODE_MAX = 255
COMMAND_META = "cmd"
"""The metadata entry that makes a grant a run."""


@dataclass(frozen=True, slots=True)
class RunReport:
    """How a run ended, as `dlm exec` reports it with the request that ends its grant."""

    outcome: str
    exit_code: int | None = None
    signal: int | None = None

    def problem(self) -> str | None:
        """Why this report is not one (None: it is)."""
        if self.outcome not in REPORTED:
            return f"a run's outcome is one of {', '.join(REPORTED)} (got {self.outcome[:40]!r})"
        if self.exit_code is not None and not 0 <= self.exit_code <= EXIT_CODE_MAX:
            return f"an exit code is between 0 and {EXIT_CODE_MAX}"
        if self.signal is not None and not 1 <= self.signal <= SIGNAL_MAX:
            return f"a signal number is between 1 and {SIGNAL_MAX}"
        return None

    def item(self) -> list[Any]:
        return [self.outcome, self.exit_code, self.signal]


@dataclass(slots=True)
class Run:
    """One run of a key: who ran what, when (the leaders' wall clocks), and how it ended."""

    key: str
    token: int
    lease: str
    host: str
    user: str
    command: str
    start_ms: int
    end_ms: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    outcome: str = RUNNING
    skips: int = 0

    @property
    def succeeded(self) -> bool:
        return self.outcome == FINISHED and self.exit_code == 0

    def row(self) -> list[Any]:
        return [
            self.token,
            self.lease,
            self.host,
            self.user,
            self.command,
            self.start_ms,
            self.end_ms,
            self.exit_code,
            self.signal,
            self.outcome,
            self.skips,
        ]


@dataclass(slots=True)
class Totals:
    """Running totals of one key since the ledger first saw it (for the metrics)."""

    runs: dict[str, int] = field(default_factory=dict)
    """Ended runs by outcome."""
    skips: int = 0
    last_success_ms: int | None = None
    """When the last run that finished with exit code 0 ended."""
    last_duration_ms: int | None = None
    """How long the last ended run took."""

    def row(self) -> list[Any]:
        return [dict(sorted(self.runs.items())), self.skips, self.last_success_ms,
                self.last_duration_ms]  # fmt: skip


@dataclass(slots=True)
class _KeyRuns:
    runs: list[Run] = field(default_factory=list)
    """Oldest first."""
    totals: Totals = field(default_factory=Totals)


class RunLedger:
    """The runs of every key, changed only by the lock machine's apply steps."""

    runs_per_key = RUNS_PER_KEY
    max_age_ms = RUN_MAX_AGE_MS
    max_keys = MAX_KEYS

    def __init__(self) -> None:
        self._keys: OrderedDict[str, _KeyRuns] = OrderedDict()
        """By key, the key with the most recent run start last."""
        self._open: dict[str, list[tuple[str, int]]] = {}
        """Per lease: (key, token) of its runs not ended yet."""

    # -- apply-time changes ---------------------------------------------------

    def started(
        self, key: str, token: int, lease: str, meta: Mapping[str, str], at_ms: int
    ) -> None:
        """A grant was made; a run if its metadata names a command."""
        command = meta.get(COMMAND_META)
        if command is None:
            return
        runs = self._keys.pop(key, None)
        if runs is None:
            runs = _KeyRuns()
        self._keys[key] = runs  # now the most recent
        runs.runs.append(
            Run(key, token, lease, meta.get("host", ""), meta.get("user", ""), command, at_ms)
        )
        self._open.setdefault(lease, []).append((key, token))
        self._trim(key, runs, at_ms)
        while len(self._keys) > self.max_keys:
            gone_key, gone = self._keys.popitem(last=False)
            for run in gone.runs:
                if run.end_ms is None:
                    self._forget_open(run.lease, gone_key, run.token)

    def ended(
        self, lease: str, at_ms: int, report: RunReport | None, key: str | None = None
    ) -> None:
        """The grants of ``lease`` (only its grant of ``key``, if given) ended, or its CMD
        did (``report``: how; None: nobody said, ``supervisor_gone``)."""
        open_runs = self._open.get(lease)
        if not open_runs:
            return
        for run_key, token in list(open_runs):
            if key is not None and run_key != key:
                continue
            self._forget_open(lease, run_key, token)
            run = self._find(run_key, token, lease)
            if run is None:
                continue
            run.end_ms = at_ms
            if report is None:
                run.outcome = SUPERVISOR_GONE
            else:
                run.outcome = report.outcome
                run.exit_code = report.exit_code
                run.signal = report.signal
            totals = self._keys[run_key].totals
            totals.runs[run.outcome] = totals.runs.get(run.outcome, 0) + 1
            totals.last_duration_ms = max(0, at_ms - run.start_ms)
            if run.succeeded:
                totals.last_success_ms = at_ms

    def skipped(self, key: str, tokens: list[int]) -> None:
        """An exec acquire found ``key`` held by the grants ``tokens``: one skip, on the
        newest of those grants that is a run."""
        runs = self._keys.get(key)
        if runs is None:
            return
        for token in sorted(tokens, reverse=True):
            run = self._find(key, token)
            if run is not None:
                run.skips += 1
                runs.totals.skips += 1
                return

    def _find(self, key: str, token: int, lease: str | None = None) -> Run | None:
        # One step can grant several slots of a semaphore (a quarantine's end): they share
        # the token, and the lease tells their runs apart.
        runs = self._keys.get(key)
        if runs is None:
            return None
        for run in reversed(runs.runs):
            if run.token == token and (lease is None or run.lease == lease):
                return run
        return None

    def _forget_open(self, lease: str, key: str, token: int) -> None:
        open_runs = self._open.get(lease)
        if open_runs is None:
            return
        try:
            open_runs.remove((key, token))
        except ValueError:
            return
        if not open_runs:
            del self._open[lease]

    def _trim(self, key: str, runs: _KeyRuns, now_ms: int) -> None:
        kept = runs.runs
        horizon = now_ms - self.max_age_ms
        # Oldest first; a run still going is never forgotten by age, only by count.
        while kept and (
            len(kept) > self.runs_per_key
            or (kept[0].start_ms < horizon and kept[0].end_ms is not None)
        ):
            gone = kept.pop(0)
            if gone.end_ms is None:
                self._forget_open(gone.lease, key, gone.token)

    # -- queries --------------------------------------------------------------

    def runs_of(self, key: str) -> list[Run]:
        """The runs of ``key``, newest first."""
        runs = self._keys.get(key)
        return [] if runs is None else list(reversed(runs.runs))

    def last_runs(self, prefix: str = "") -> list[Run]:
        """The newest run of each key under ``prefix``, sorted by key."""
        return [
            runs.runs[-1]
            for key, runs in sorted(self._keys.items())
            if key.startswith(prefix) and runs.runs
        ]

    def totals(self, prefix: str) -> list[tuple[str, Totals]]:
        """The running totals of each key under ``prefix``, sorted by key."""
        return [
            (key, runs.totals) for key, runs in sorted(self._keys.items()) if key.startswith(prefix)
        ]

    def __len__(self) -> int:
        return len(self._keys)

    # -- image ----------------------------------------------------------------

    def image(self) -> list[Any]:
        """Plain CBOR-able rows in the ledger's order (equal ledgers give equal bytes)."""
        return [
            [key, [r.row() for r in runs.runs], runs.totals.row()]
            for key, runs in self._keys.items()
        ]

    @classmethod
    def restore(cls, rows: object) -> Self:
        """The ledger of ``image()``; ValueError for anything else."""
        ledger = cls()
        if type(rows) is not list:
            raise ValueError("run ledger: expected a list")
        for row in rows:
            if type(row) is not list or len(row) != 3:
                raise ValueError("run ledger: a key has an unknown layout")
            key, run_rows, totals = row
            key = _text(key)
            entry = _KeyRuns()
            if type(run_rows) is not list:
                raise ValueError("run ledger: runs are not a list")
            for r in run_rows:
                if type(r) is not list or len(r) != 11:
                    raise ValueError("run ledger: a run has an unknown layout")
                token, lease, host, user, command, start, end, code, sig, outcome, skips = r
                run = Run(
                    key,
                    _int(token),
                    _text(lease),
                    _text(host),
                    _text(user),
                    _text(command),
                    _int(start),
                    _opt_int(end),
                    _opt_int(code),
                    _opt_int(sig),
                    _text(outcome),
                    _int(skips),
                )
                if run.outcome not in (*OUTCOMES, RUNNING) or (run.end_ms is None) != (
                    run.outcome == RUNNING
                ):
                    raise ValueError("run ledger: a run has an impossible outcome")
                entry.runs.append(run)
                if run.end_ms is None:
                    ledger._open.setdefault(run.lease, []).append((key, run.token))
            if type(totals) is not list or len(totals) != 4:
                raise ValueError("run ledger: totals have an unknown layout")
            by_outcome, skips_total, last_success, last_duration = totals
            if type(by_outcome) is not dict:
                raise ValueError("run ledger: totals by outcome are not a map")
            entry.totals = Totals(
                {_text(k): _int(v) for k, v in by_outcome.items()},
                _int(skips_total),
                _opt_int(last_success),
                _opt_int(last_duration),
            )
            ledger._keys[key] = entry
        return ledger


def report_from_item(item: object) -> RunReport | None:
    """The report of ``RunReport.item()`` (None for None); ValueError for anything else."""
    if item is None:
        return None
    if type(item) is not list or len(item) != 3:
        raise ValueError("a run report is [outcome, exit code, signal]")
    outcome, code, sig = item
    report = RunReport(_text(outcome), _opt_int(code), _opt_int(sig))
    problem = report.problem()
    if problem is not None:
        raise ValueError(problem)
    return report


def _int(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"run ledger: expected an integer, got {type(value).__name__}")
    return value


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _text(value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"run ledger: expected text, got {type(value).__name__}")
    return value
