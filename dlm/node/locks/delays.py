"""Lock-delays: keys granted to nobody for a while after their holder's lease vanished.

A lease opened with a lock-delay (``--lock-delay D``, cluster version 4) that expires or
is revoked while holding keys leaves each of those keys *delayed*: its process may still
be running somewhere, unfenced, so the key waits D before its next grant (Chubby's and
Consul's lock-delay). A release, or a close by the lease's own process, delays nothing.

The delay is timed exactly as the restore quarantine is: each delayed key is a
pseudo-lease ``~delay:KEY`` (``commands.delay_lease``) that the state machine lists
beside the real leases, so the leader's lease deadlines arm it (D from the entry that
started it) and end it by proposing an Expire of it; a new leader arms it afresh, in
full, from its own election, never trusting another member's clock. Each delay carries
the index of the entry that started it (its incarnation), so a stale Expire of an
earlier delay of the same key ends nothing.

Pure: the log carries the times; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from dlm.node.locks.commands import delay_lease
from dlm.node.locks.results import _Plain


@dataclass(frozen=True, slots=True)
class LockDelay(_Plain):
    """A key's lock-delay: ``ms`` long, started by the expiry (or revocation) of ``lease``
    at the leader's wall clock ``since_ms``. ``until_ms`` (since + ms) is for display: a
    new leader counts the whole delay again from its own election, so it may end later."""

    lease: str
    ms: int
    since_ms: int
    until_ms: int
    incarnation: int
    """The index of the entry that started it: only an Expire naming it ends it."""


class LockDelays:
    """The keys in their lock-delay, by key; changed only by the lock state machine's apply."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[str, LockDelay] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: str) -> LockDelay | None:
        return self._by_key.get(key)

    def start(
        self, lease: str, delay_ms: int, keys: Iterable[str], index: int, at_ms: int
    ) -> list[str]:
        """``lease`` (with ``delay_ms``) expired or was revoked at entry ``index`` holding
        ``keys``: each enters its delay. Returns the keys, sorted (so every replica arms
        and grants in one order)."""
        started = sorted(keys)
        for key in started:
            previous = self._by_key.get(key)
            # A second expiry during a delay (another holder of a semaphore) starts it
            # again, never shorter than the one it replaces.
            ms = max(delay_ms, 0 if previous is None else previous.ms)
            self._by_key[key] = LockDelay(lease, ms, at_ms, at_ms + ms, index)
        return started

    def end(self, key: str, incarnation: int) -> bool:
        """The leader's Expire of ``key``'s delay: True if it ended the delay it names."""
        delay = self._by_key.get(key)
        if delay is None or delay.incarnation != incarnation:
            return False
        del self._by_key[key]
        return True

    def pseudo_leases(self) -> Iterator[tuple[str, int, int]]:
        """(pseudo-lease id, ms, incarnation) of every delay, sorted by key: what a new
        leader arms beside the live leases."""
        for key in sorted(self._by_key):
            delay = self._by_key[key]
            yield delay_lease(key), delay.ms, delay.incarnation

    def rows(self) -> list[list[Any]]:
        """The snapshot's rows (layout 4), sorted by key."""
        return [
            [key, d.ms, d.incarnation, d.lease, d.since_ms]
            for key, d in sorted(self._by_key.items())
        ]

    def restore_row(self, key: str, ms: int, incarnation: int, lease: str, since_ms: int) -> None:
        self._by_key[key] = LockDelay(lease, ms, since_ms, since_ms + ms, incarnation)
