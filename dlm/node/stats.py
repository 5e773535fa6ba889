"""What a member counts about itself, as plain numbers: the metrics exporter reads them.

Pure (no clock, no IO, no metrics library): the node machine counts as it
decides, the adapter counts what it does to sockets and the disk, and
dlm/node/runtime/metrics.py turns both into Prometheus metrics when scraped. A
``Histogram`` keeps fixed buckets, so its memory does not grow with traffic.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Seconds: from a fast fsync to a slow one."""
WAIT_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Seconds: how long locks are waited for and held (cron jobs run for minutes or hours)."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
"""Entries per fsync."""


class Histogram:
    """Counts of observations per bucket (upper bounds, inclusive), their sum and number."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it), as Prometheus wants them."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(slots=True)
class Stats:
    """The node machine's counters."""

    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    """(request type, "OK" or the error code) -> answers; every answer to a request counts."""
    grants: int = 0
    releases: dict[str, int] = field(default_factory=dict)
    """How a held lock ended ("released", "closed" with its lease, "expired") -> count."""
    expiries: int = 0
    quarantines_ended: int = 0
    """Quarantines of a restored or recovered cluster this member saw end (0 or 1)."""
    lock_delays_started: int = 0
    """Keys that entered a lock-delay (their holder's lease expired or was revoked)."""
    lock_delays_ended: int = 0
    """Lock-delays that ended (their key may be granted again)."""
    locks_lost: int = 0
    """Locks whose lease expired while holding them (the holder lost them)."""
    leader_changes: int = 0
    watches_started: int = 0
    """Watches this member started serving (dlm/node/watches.py)."""
    watch_events_pushed: int = 0
    """Changes pushed to watchers (one per event per watcher)."""
    watchers_cut_off: int = 0
    """Watches ended because their connection did not read what was pushed."""
    proposals: int = 0
    """Client commands proposed as leader (not the leader's own Expire entries)."""
    persist_jobs: int = 0
    entries_persisted: int = 0
    snapshots_taken: int = 0
    rejected_frames: int = 0
    acquire_wait: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS_S))
    """Seconds from queued to granted, for acquires that waited."""
    hold_time: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS_S))
    """Seconds from granted to released (or expired)."""
    append_rtt: dict[str, Histogram] = field(default_factory=dict)
    """Per peer: seconds from sending entries to their acknowledgement."""
    refusals: dict[tuple[str, str], int] = field(default_factory=dict)
    """(identity, action) -> requests refused for want of a permission (identities.py)."""

    def count(self, kind: str, outcome: str) -> None:
        key = (kind, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1

    def refused(self, identity: str, action: str) -> None:
        key = (identity, action)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def released(self, how: str) -> None:
        self.releases[how] = self.releases.get(how, 0) + 1

    def rtt(self, peer: str) -> Histogram:
        histogram = self.append_rtt.get(peer)
        if histogram is None:
            histogram = self.append_rtt[peer] = Histogram(LATENCY_BUCKETS_S)
        return histogram


@dataclass(slots=True)
class DiskStats:
    """What the adapter's disk thread measured."""

    fsync: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    """Seconds per persistence job (write and fsync)."""
    batch: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    """Entries per persistence job."""


@dataclass(slots=True)
class BackupStats:
    """What the adapter measured of the backups it served (``dlm snapshot save``) and of
    the images it built off its event loop."""

    backups: int = 0
    """Backups sent whole to their client."""
    backup_bytes: int = 0
    """Image bytes of those backups."""
    backup_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    """From the request's read point to the last chunk handed to the connection."""
    image_fork_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    """How long each fork held the event loop (periodic snapshots and backups alike)."""
