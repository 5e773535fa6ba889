"""Single-server membership changes: what one change does, and which configuration holds where.

A configuration (``ConfState``: voters and learners) changes one member at a
time, through ``EntryKind.CONF_CHANGE`` entries. A member uses the latest
configuration in its log, committed or not, from the moment the entry is in
its log; when a conflicting suffix is cut from the log, the configurations
that suffix introduced go with it. ``ConfHistory`` keeps, for the part of the
log a member still needs, the index at which each configuration took effect,
so that truncation can fall back to the one before and the runtime can ask
which configuration a snapshot at a given index was taken under.

``check_change`` is the one rule book: it says why a change does not apply to
a configuration (or None when it does), and ``apply_change`` applies it.
Every member computes the same configuration from the same log because both
are pure functions of the configuration and the entry; an entry that does not
decode or does not apply (which a correct leader never appends) changes
nothing, on every member alike.
"""

from __future__ import annotations

from bisect import bisect_right

from dlm.records import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    NodeId,
    decode_conf_change,
)


def check_change(conf: ConfState, change: ConfChange) -> str | None:
    """Why ``change`` cannot be applied to ``conf``, or None if it can."""
    node = change.node
    if not node:
        return "a member id must not be empty"
    is_voter = node in conf.voters
    is_learner = node in conf.learners
    kind = change.kind
    if kind is ConfChangeKind.ADD_LEARNER:
        if is_voter or is_learner:
            return f"{node} is already a member"
        return None
    if kind is ConfChangeKind.PROMOTE:
        if is_voter:
            return f"{node} is already a voter"
        if not is_learner:
            return f"{node} is not a member (add it as a learner first)"
        return None
    if is_voter:
        if len(conf.voters) == 1:
            return f"{node} is the last voter"
        return None
    if not is_learner:
        return f"{node} is not a member"
    return None


def apply_change(conf: ConfState, change: ConfChange) -> ConfState:
    """``conf`` after ``change``; the caller has checked that it applies."""
    node = change.node
    voters = conf.voters
    learners = conf.learners
    if change.kind is ConfChangeKind.ADD_LEARNER:
        return ConfState(voters, (*learners, node))
    if change.kind is ConfChangeKind.PROMOTE:
        return ConfState((*voters, node), tuple(n for n in learners if n != node))
    return ConfState(tuple(n for n in voters if n != node), tuple(n for n in learners if n != node))


def conf_after_entry(conf: ConfState, entry: Entry) -> ConfState | None:
    """The configuration ``entry`` switches to, or None when it changes nothing."""
    if entry.kind is not EntryKind.CONF_CHANGE:
        return None
    try:
        change = decode_conf_change(entry.data)
    except ValueError:
        return None
    if check_change(conf, change) is not None:
        return None
    return apply_change(conf, change)


def includes(conf: ConfState, node: NodeId) -> bool:
    return node in conf.voters or node in conf.learners


class ConfHistory:
    """Configurations by the log index they took effect at; never empty.

    The first element is the base: the configuration of the snapshot the log
    starts from (or of the bootstrap, at index 0).
    """

    __slots__ = ("_confs", "_indexes", "base_index", "latest_index")

    def __init__(self, index: int, conf: ConfState) -> None:
        self._indexes: list[int] = [index]
        self._confs: list[ConfState] = [conf]
        # Plain attributes, not properties: the core reads them on every step.
        self.base_index = index
        self.latest_index = index

    def __repr__(self) -> str:
        return f"ConfHistory({list(zip(self._indexes, self._confs, strict=True))})"

    @property
    def latest(self) -> ConfState:
        return self._confs[-1]

    def push(self, index: int, conf: ConfState) -> None:
        """``conf`` took effect at ``index`` (above every index already held)."""
        self._indexes.append(index)
        self._confs.append(conf)
        self.latest_index = index

    def truncate(self, index: int) -> bool:
        """The log lost its entries from ``index`` on; True if the latest configuration changed."""
        indexes = self._indexes
        keep = max(1, bisect_right(indexes, index - 1))
        if keep == len(indexes):
            return False
        del indexes[keep:]
        del self._confs[keep:]
        self.latest_index = indexes[-1]
        return True

    def at(self, index: int) -> ConfState:
        """The configuration in force once the entry at ``index`` is in the log."""
        if index < self._indexes[0]:
            raise ValueError(
                f"the configuration at index {index} is no longer known "
                f"(history starts at {self._indexes[0]})"
            )
        return self._confs[bisect_right(self._indexes, index) - 1]

    def since(self, index: int) -> list[tuple[int, ConfState]]:
        """The configurations that took effect after ``index``, oldest first."""
        start = bisect_right(self._indexes, index)
        return list(zip(self._indexes[start:], self._confs[start:], strict=True))

    def forget_before(self, index: int) -> None:
        """Drop what no one will ask for again: configurations superseded at or before ``index``."""
        drop = bisect_right(self._indexes, index) - 1
        if drop > 0:
            del self._indexes[:drop]
            del self._confs[:drop]
            self.base_index = self._indexes[0]
