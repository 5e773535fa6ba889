"""What a backup (``dlm snapshot save``) promises, checked against the simulated cluster.

A backup's header names an index and its term, and its image is the state there:

* **committed** (``backup-uncommitted``): some member applied the entry at the index,
  with that term (only committed entries are applied), and the image's own applied
  index is the header's;
* **not stale** (``backup-stale``): the index is at least the commit index the cluster
  had reached when the request was sent, so the backup holds every change acknowledged
  before it (the leader confirms it leads with a read round first);
* **a state that existed** (``backup-inconsistent``): the image's lock table is, byte
  for byte, the table that applying the committed entries up to the index to an empty
  one gives (replayed here from what the members applied, with the members' own lock
  machine class, so an injected lock-table bug replays alike).
"""

from __future__ import annotations

from typing import Any

import cbor2

from dlm.node import locks
from dlm.wire import SnapshotHeader

from .checkers import SafetyChecker, Violation


class BackupChecker:
    def __init__(self, safety: SafetyChecker, lock_class: type[locks.LockStateMachine]) -> None:
        self._safety = safety
        self._lock_class = lock_class
        self._replay = lock_class()
        self._skipped: dict[int, int] = {}
        """Index -> term of the entries members applied as not theirs (membership changes)."""
        self.checked = 0

    def skipped(self, index: int, term: int) -> None:
        """A member applied the entry at ``index`` (of ``term``) as one of the membership's."""
        self._skipped[index] = term

    def floor(self) -> int:
        """What a backup asked for now must hold at least: the highest commit so far."""
        return self._safety.commit_high_water

    def check(self, floor: int, header: SnapshotHeader, image: bytes) -> None:
        index = header.index
        applied = self._safety.applied.get(index)
        term = applied.term if applied is not None else self._skipped.get(index)
        if index > 0 and term != header.term:
            seen = "never applied" if term is None else f"applied in term {term}"
            raise Violation(
                "backup-uncommitted",
                f"a backup at index {index} (term {header.term}): that entry was {seen}",
            )
        if index < floor:
            raise Violation(
                "backup-stale",
                f"a backup at index {index}, but index {floor} was committed before it was "
                "asked for",
            )
        lock_image = _lock_image(image)
        try:
            taken = self._lock_class.restore(lock_image)
        except ValueError as exc:
            raise Violation("backup-inconsistent", f"the backup's image: {exc}") from None
        if taken.applied_index != index:
            raise Violation(
                "backup-uncommitted",
                f"a backup says index {index}, its image is at {taken.applied_index}",
            )
        expected = self._state_at(index)
        if lock_image != expected:
            raise Violation(
                "backup-inconsistent",
                f"the backup's lock table at index {index} is not the one the committed "
                f"entries give ({len(lock_image)} vs {len(expected)} bytes)",
            )
        self.checked += 1

    def _state_at(self, index: int) -> bytes:
        """The lock image at ``index``, replaying the applied entries (skipped ones, as
        membership changes, are not in ``applied``)."""
        if index < self._replay.applied_index:
            self._replay = self._lock_class()
        applied = self._safety.applied
        for i in range(self._replay.applied_index + 1, index + 1):
            entry = applied.get(i)
            if entry is None:
                self._replay.skip(i)
            else:
                self._replay.apply(i, entry.data)
        return self._replay.snapshot()


def _lock_image(image: bytes) -> bytes:
    item: Any = cbor2.loads(image)
    if isinstance(item, dict):
        locks_part = item.get("locks")
        if isinstance(locks_part, bytes):
            return locks_part
    return image
