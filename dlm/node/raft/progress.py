"""What a leader knows about each follower's log, and how fast it may send to it.

A follower is in one of three states:

* PROBE: we do not know where its log ends. Send one AppendEntries and wait
  for the answer (or a heartbeat answer) before sending another.
* REPLICATE: its log is known to match up to ``match``; stream entries
  optimistically, at most ``max_inflight`` unacknowledged messages at a time.
* SNAPSHOT: it needs entries we have compacted; send the snapshot chunk by
  chunk (one chunk in flight) and append nothing until it is installed.
"""

from __future__ import annotations

import enum
from collections import deque

from dlm.records import Snapshot


class ProgressState(enum.IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Progress:
    """One follower (or learner) as seen by the leader; the leader keeps one for itself too."""

    __slots__ = (
        "hb_match",
        "inflight",
        "is_learner",
        "match",
        "max_inflight",
        "next",
        "probe_sent",
        "recent_active",
        "snap_need_send",
        "snap_offset",
        "snapshot",
        "stall",
        "state",
    )

    def __init__(self, next_index: int, max_inflight: int, is_learner: bool = False) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight: deque[int] = deque()
        self.max_inflight = max_inflight
        self.recent_active = False
        self.is_learner = is_learner
        self.snapshot: Snapshot | None = None
        self.snap_offset = 0
        self.snap_need_send = False
        # Stall detection: heartbeat answers that arrived while match stood still.
        self.hb_match = 0
        self.stall = 0

    def __repr__(self) -> str:
        return (
            f"Progress({self.state.name} match={self.match} next={self.next} "
            f"inflight={len(self.inflight)} paused={self.is_paused()})"
        )

    @property
    def pending_snapshot(self) -> int:
        return self.snapshot.meta.index if self.snapshot is not None else 0

    def is_paused(self) -> bool:
        """Whether AppendEntries must wait (a snapshot transfer is always 'paused' for appends)."""
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        return True

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            # Whatever the follower installed covers the snapshot's index.
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.snapshot = None
        self.stall = 0

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()
        self.snapshot = None
        self.stall = 0

    def become_snapshot(self, snapshot: Snapshot) -> None:
        self.state = ProgressState.SNAPSHOT
        self.snapshot = snapshot
        self.snap_offset = 0
        self.snap_need_send = True
        self.probe_sent = False
        self.inflight.clear()
        self.stall = 0

    def maybe_update(self, index: int) -> bool:
        """Record an acknowledgement up to ``index``; False if it taught us nothing new."""
        updated = False
        if index > self.match:
            self.match = index
            self.probe_sent = False
            self.stall = 0
            updated = True
        self.next = max(self.next, index + 1)
        return updated

    def sent_entries(self, last: int) -> None:
        """An AppendEntries ending at ``last`` left for this follower."""
        if self.state is ProgressState.REPLICATE:
            self.next = last + 1
            self.inflight.append(last)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True

    def free_to(self, index: int) -> None:
        """Acknowledgement up to ``index`` frees every in-flight message ending at or before it."""
        inflight = self.inflight
        while inflight and inflight[0] <= index:
            inflight.popleft()
