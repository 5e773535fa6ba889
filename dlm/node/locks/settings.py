"""Cluster-wide settings changed through the log (`dlm config set`, cluster version 5).

Three settings, each a duration in milliseconds, 0 meaning "not set":

* ``default-ttl``: the TTL of a lease whose open names none (the leader fills it in
  when it builds the entry, so the entry, not the setting, is what replicas apply);
* ``max-ttl``: no lease is opened, or has its TTL updated, above it. The leader
  refuses such a request with one line naming the limit, and every replica refuses
  the entry again at apply (a request proposed just before the setting committed);
* ``lock-delay``: the lock-delay of a lease that names none.

The table is replicated state: changed only by applying a ``SettingsCommand``, kept in
the node's snapshot image (snapshots.py), the same on every member at one index. With
partitions every partition's group holds its own copy; `dlm config set` writes each
(the client fans out, as it does for identities).

Pure: part of the lock state machine (machine.py), which holds one.
"""

from __future__ import annotations

from typing import Any

from dlm.limits import LOCK_DELAY_MAX_MS, TTL_MAX_MS, TTL_MIN_MS

DEFAULT_TTL = "default-ttl"
MAX_TTL = "max-ttl"
LOCK_DELAY = "lock-delay"
KEYS = (DEFAULT_TTL, LOCK_DELAY, MAX_TTL)
"""Every setting, in the order `dlm config list` shows them."""

BOUNDS = {
    DEFAULT_TTL: (TTL_MIN_MS, TTL_MAX_MS),
    MAX_TTL: (TTL_MIN_MS, TTL_MAX_MS),
    LOCK_DELAY: (0, LOCK_DELAY_MAX_MS),
}
"""The values each setting may take (ms), besides 0 (unset)."""


def setting_problem(key: str, value_ms: int) -> str | None:
    """Why ``key`` cannot be set to ``value_ms`` (one line), or None."""
    if key not in BOUNDS:
        return f"unknown setting {key[:40]!r}: the settings are {', '.join(KEYS)}"
    if value_ms == 0:
        return None
    low, high = BOUNDS[key]
    if not low <= value_ms <= high:
        return f"{key} is {_text(low)} to {_text(high)} (or 0 to unset it), not {value_ms}ms"
    return None


def _text(ms: int) -> str:
    if ms % 3_600_000 == 0 and ms:
        return f"{ms // 3_600_000}h"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


class ClusterSettings:
    """The settings in force at the applied index (0: not set)."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        """Set values only, by key."""

    def get(self, key: str) -> int:
        return self.values.get(key, 0)

    def set(self, key: str, value_ms: int) -> str | None:
        """Sets (0: unsets) ``key``; the problem, changing nothing, if it is not allowed."""
        problem = setting_problem(key, value_ms)
        if problem is not None:
            return problem
        if value_ms:
            self.values[key] = value_ms
        else:
            self.values.pop(key, None)
        return None

    def ttl_problem(self, ttl_ms: int) -> str | None:
        """Why a lease may not have ``ttl_ms`` under max-ttl (one line naming it), or None."""
        limit = self.get(MAX_TTL)
        if limit and ttl_ms > limit:
            return (
                f"a TTL of {_text(ttl_ms)} is above this cluster's max-ttl of {_text(limit)} "
                "(dlm config get max-ttl): ask for less"
            )
        return None

    def rows(self) -> dict[str, int | None]:
        """Every setting by key, in ms (None: not set)."""
        return {key: self.values.get(key) for key in KEYS}

    def image(self) -> list[list[Any]]:
        return [[key, value] for key, value in sorted(self.values.items())]

    @classmethod
    def restore(cls, item: Any) -> ClusterSettings:
        """The table of ``image()`` (None: an image from before version 5: empty);
        ValueError for a malformed one."""
        table = cls()
        if item is None:
            return table
        if type(item) is not list:
            raise ValueError("snapshot image: the settings must be a list")
        for row in item:
            if type(row) is not list or len(row) != 2:
                raise ValueError("snapshot image: a setting of an unknown layout")
            key, value = row
            if type(key) is not str or type(value) is not int:
                raise ValueError("snapshot image: a setting of an unknown layout")
            problem = table.set(key, value)
            if problem is not None:
                raise ValueError(f"snapshot image: {problem}")
        return table

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterSettings) and self.values == other.values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.values.items())))
