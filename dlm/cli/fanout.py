"""Admin changes that go to every partition: membership and identities.

A partitioned cluster (``--partitions P``, P > 1) keeps its cluster-wide state (the
members, the identities and their permissions) in every partition's Raft group: each
partition enforces its own replicated copy, and an admin command writes the change into
each group in turn, partition 0 first (whose greeting tells the client P). Every change
is idempotent per partition (a re-sent identity add or rotate carries the same key, a
removal the same request id, a membership change is checked against the partition's
own membership), so a command that some partitions did not take is simply run again.

The rules of the outcome:

* every partition took it (or had it already, and at least one took it): done, as
  for one partition;
* none took it and every one had it already: the refusal one partition gives;
* every partition refused it alike (a typo, a name in use): that refusal, exactly as a
  cluster of one partition says it;
* some took it and some did not: exit non-zero with one line naming the partitions that
  did not and why, and saying to run the same command again.

A cluster of one partition never comes here twice: the first answer is the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dlm.cli.exits import CliError, from_client_error

T = TypeVar("T")


@dataclass(slots=True)
class FanOut(Generic[T]):
    """What each partition answered."""

    partitions: int = 1
    took: dict[int, T] = field(default_factory=dict)
    had: dict[int, Exception] = field(default_factory=dict)
    """Partitions that refused it because they had it already (a re-run), and how."""
    failed: dict[int, Exception] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return not self.failed

    def first_answer(self) -> T | None:
        return next((self.took[p] for p in sorted(self.took)), None)


def to_every_partition(
    partitions: Callable[[], int],
    send: Callable[[int], T],
    *,
    had_it: Callable[[Exception], bool] = lambda exc: False,
) -> FanOut[T]:
    """``send(p)`` for partition 0, then (once ``partitions()`` says how many there are)
    for every other. An exception from ``send`` is that partition's failure, unless
    ``had_it`` says the partition has the change already. In a cluster of one partition
    partition 0's exception is raised as it is."""
    from dlm.client.errors import DlmError

    out: FanOut[T] = FanOut()
    try:
        out.took[0] = send(0)
    except DlmError as exc:
        if partitions() <= 1:
            raise
        if had_it(exc):
            out.had[0] = exc
        else:
            out.failed[0] = exc
    out.partitions = partitions()
    for p in range(1, out.partitions):
        try:
            out.took[p] = send(p)
        except DlmError as exc:
            if had_it(exc):
                out.had[p] = exc
            else:
                out.failed[p] = exc
    return out


def settle(result: FanOut[Any], what: str) -> None:
    """Raises the CliError of a change not every partition took (nothing if all did)."""
    if not result.took and not result.failed and result.had:
        # Nothing changed anywhere: say so as one partition would (removing a name that
        # is gone everywhere is refused, however it went).
        raise _as_cli_error(result.had[min(result.had)])
    if result.done:
        return
    if len(result.failed) == result.partitions:
        # Refused everywhere: say it as one partition would (a typo is never success).
        raise _as_cli_error(result.failed[min(result.failed)])
    missing = sorted(result.failed)
    first = result.failed[missing[0]]
    reason = str(first).splitlines()[0] if str(first) else type(first).__name__
    cli = _as_cli_error(first)
    took = result.partitions - len(missing)
    raise CliError(
        "PARTITIONS_MISSED",
        f"{what}: partition(s) {', '.join(str(p) for p in missing)} of {result.partitions} "
        f"did not take it ({took} did; partition {missing[0]}: {reason}): run the same "
        "command again, it is safe to repeat",
        cli.exit_code,
        partitions=result.partitions,
        missing=missing,
    )


def _as_cli_error(exc: Exception) -> CliError:
    from dlm.client.errors import DlmError

    if isinstance(exc, DlmError):
        return from_client_error(exc)
    raise exc
