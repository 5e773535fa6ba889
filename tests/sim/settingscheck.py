"""The simulator's check of the cluster's max-ttl (`dlm config set`, cluster version 5).

Written apart from dlm/node/locks/settings.py on purpose: the checker keeps its own
record of when each max-ttl took effect, from the ``SettingChanged`` results replicas
report at apply (every replica applies the same log, so the first to apply an index
tells it), and never asks a replica what its table says. Then every open of a new lease
and every TTL update that takes effect at index i must give a TTL no longer than the
max-ttl the log set before i: a replica that forgot a setting (lost across a snapshot it
restored, say) and applied a longer one is an ``over-max-ttl`` violation.
"""

from __future__ import annotations

import bisect

from dlm.node import locks
from dlm.node.locks.settings import MAX_TTL

from .checkers import Violation


class MaxTtlChecker:
    """The max-ttl in force at each index of one partition's log, and the check."""

    def __init__(self) -> None:
        self._indexes: list[int] = []
        self._values: dict[int, int] = {}

    def in_force_before(self, index: int) -> int:
        """The max-ttl (ms, 0: none) set by the last entry before ``index``."""
        at = bisect.bisect_left(self._indexes, index)
        return self._values[self._indexes[at - 1]] if at else 0

    def restored(self, backup_index: int, first_index: int) -> None:
        """The cluster was restored from its state at ``backup_index`` (or recovered from a
        log that ends there) into a new incarnation whose log starts at ``first_index``:
        the max-ttl in force then is in force there, whatever the image says."""
        value = self.in_force_before(backup_index + 1)
        self._indexes = [index for index in self._indexes if index < first_index]
        for index in [i for i in self._values if i >= first_index]:
            del self._values[index]
        bisect.insort(self._indexes, first_index - 1)
        self._values[first_index - 1] = value

    def applied(self, outcome: locks.ApplyOutcome) -> bool:
        """Checks one applied entry; True when it gave a TTL under a max-ttl that was set."""
        result, cmd = outcome.result, outcome.command
        if isinstance(result, locks.SettingChanged) and result.setting == MAX_TTL:
            if outcome.index not in self._values:
                bisect.insort(self._indexes, outcome.index)
            self._values[outcome.index] = result.value_ms
            return False
        # Only what this entry armed: an answer replayed from memory (a re-sent request
        # applied before the max-ttl came) sets no TTL now.
        opened = isinstance(result, locks.LeaseOpened) and not result.joined
        updated = isinstance(result, locks.LeaseUpdated) and isinstance(
            cmd, locks.UpdateLeaseCommand
        )
        if not (opened or updated) or not outcome.armed:
            return False
        ttl_ms = max(ttl for _, ttl, _ in outcome.armed)
        limit = self.in_force_before(outcome.index)
        if not limit:
            return False
        if ttl_ms > limit:
            raise Violation(
                "over-max-ttl",
                f"index {outcome.index} gave lease TTL {ttl_ms} ms while the log's max-ttl "
                f"was {limit} ms",
            )
        return True
