"""The settings of one Raft member: its id, the bootstrap voters, timers and message budgets."""

from __future__ import annotations

from dataclasses import dataclass

from dlm.records import NodeId


@dataclass(frozen=True, slots=True)
class Config:
    id: NodeId
    voters: tuple[NodeId, ...]
    """Bootstrap voters: the configuration at log index 0.

    Used only when storage.initial_state() has an empty ConfState. Every member
    the cluster ever has, including one added later, must be started with the
    same bootstrap voters, because the log's configuration changes are relative
    to it (a member added later is not among them, and stays passive until its
    log or a snapshot makes it a member). A member id must never be reused.
    """
    group: int = 0
    election_ticks: int = 10
    """Followers time out after a random draw from [election_ticks, 2 * election_ticks),
    widened after failed rounds and lengthened by the disk's latency (``election_timeout``)."""
    max_backoff_doublings: int = 2
    """How many times failed rounds in a row may double the election timeout's range."""
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 64
    """Unacknowledged AppendEntries messages allowed per follower in replicate mode."""
    max_entries_bytes: int = 1 << 20
    """Payload budget of one AppendEntries (one entry is always sent, however big)."""
    snapshot_chunk_bytes: int = 1 << 16

    def validate(self) -> None:
        if self.heartbeat_ticks < 1:
            raise ValueError("heartbeat_ticks must be >= 1")
        if self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("election_ticks must exceed heartbeat_ticks")
        if not 0 <= self.max_backoff_doublings <= 10:
            raise ValueError("max_backoff_doublings must be between 0 and 10")
        if self.max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        if self.max_entries_bytes < 1 or self.snapshot_chunk_bytes < 1:
            raise ValueError("message budgets must be positive")
