"""When a member's supervisor restarts a partition process, and when it gives up.

A member started with ``--partitions P`` (P > 1) runs one child process per
partition (dlm/node/runtime/supervisor.py). A child that dies is started
again after a pause that doubles with each failure in a row (``RETRY_FIRST_S``
up to ``RETRY_MAX_S``), so a child that cannot start does not spin; the pause
falls back to the first once a child has served for ``HEALTHY_AFTER_S``. A
child that exits ``GIVE_UP_AFTER`` times in a row before it ever served (its
data directory is unusable, its disk is gone) makes the supervisor stop every
partition and exit non-zero, as a member that cannot start does. Exit codes a
restart cannot fix (settings, a foreign data directory, a full disk: the codes
of dlm.node.runtime.main) stop the member at once with that code; exit 0 (the
member was removed from the cluster) is not restarted.

Pure: no IO, no clock (time is passed in), no randomness. Tested by
tests/unit/node/test_supervision.py.
"""

from __future__ import annotations

from dataclasses import dataclass

RETRY_FIRST_S = 0.25
RETRY_MAX_S = 5.0
HEALTHY_AFTER_S = 10.0
"""A child that served this long and then died is restarted at once (first pause)."""
GIVE_UP_AFTER = 5
"""Exits in a row before serving after which a child is given up (and the member stops)."""
FINAL_CODES = frozenset({2, 65, 74, 78})
"""Exit codes no restart can fix (dlm.node.runtime.main): usage, foreign data dir,
disk full, authentication/TLS settings."""


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the child again after ``delay_s`` seconds."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class Leave:
    """Do not start the child again: it stopped cleanly (the member was removed)."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop every partition and exit with ``exit_code``; ``message`` is the one line."""

    exit_code: int
    message: str


Verdict = Restart | Leave | GiveUp


class _Seat:
    __slots__ = ("failures", "serving_since", "started_at")

    def __init__(self) -> None:
        self.failures = 0
        """Exits in a row since the child last served long enough to count as healthy."""
        self.started_at: float | None = None
        self.serving_since: float | None = None


class RestartPolicy:
    """The supervisor's decisions about its partition children, one seat per partition."""

    __slots__ = ("_seats",)

    def __init__(self, partitions: int) -> None:
        self._seats = [_Seat() for _ in range(partitions)]

    def started(self, partition: int, now: float) -> None:
        seat = self._seats[partition]
        seat.started_at = now
        seat.serving_since = None

    def serving(self, partition: int, now: float) -> None:
        """The child reported that it serves (its connections are being adopted)."""
        self._seats[partition].serving_since = now

    def exited(self, partition: int, code: int, now: float) -> Verdict:
        """What to do about a child that exited with ``code`` (negative: killed by that
        signal) while the member was not stopping."""
        seat = self._seats[partition]
        served = seat.serving_since
        seat.started_at = None
        seat.serving_since = None
        if code == 0:
            return Leave()
        if code in FINAL_CODES:
            return GiveUp(code, f"partition {partition} stopped with exit code {code}")
        if served is not None and now - served >= HEALTHY_AFTER_S:
            seat.failures = 0
        if served is None:
            seat.failures += 1
            if seat.failures >= GIVE_UP_AFTER:
                return GiveUp(
                    1,
                    f"partition {partition} failed to start {seat.failures} times in a row "
                    f"(last {_exit_text(code)}): see its log lines above",
                )
        else:
            seat.failures = min(seat.failures + 1, GIVE_UP_AFTER - 1)
        return Restart(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, seat.failures - 1)))


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"
