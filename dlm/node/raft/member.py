"""What the role rooms (leader, follower, election, roles) may read and change of a member.

``RaftNode`` (core.py) is the one implementation. The role functions take a
``RaftMember`` rather than a ``RaftNode`` so that they need not import the core
that imports them: the state stays in one object, and this protocol names the
part of it they share. The methods listed are the core's own, test seams
included, so that the simulator's mutants (subclasses of ``RaftNode``) are
heard from every role. Pure: no IO, no clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from dlm.node.raft.config import Config
from dlm.node.raft.log import RaftLog
from dlm.node.raft.membership import ConfHistory
from dlm.node.raft.read_only import ReadOnly
from dlm.node.raft.tracker import ProgressTracker
from dlm.node.raft.types import Message, ReadState, Role
from dlm.records import ConfState, NodeId, SnapshotMeta


@dataclass(slots=True)
class SnapshotReceipt:
    """A snapshot a follower is reassembling from chunks."""

    src: NodeId
    term: int
    meta: SnapshotMeta
    chunks: list[bytes]
    size: int = 0


class RaftMember(Protocol):
    """The state of one Raft member, as the role functions see it."""

    _cfg: Config
    _id: NodeId
    _group: int
    _rng: random.Random
    _log: RaftLog
    _tracker: ProgressTracker
    _conf_history: ConfHistory
    _read_only: ReadOnly

    _role: Role
    _term: int
    _vote: NodeId | None
    _leader: NodeId | None
    _removed: bool
    _lead_transferee: NodeId | None
    _committed_in_term: bool

    _election_elapsed: int
    _heartbeat_elapsed: int
    _randomized_timeout: int
    _failed_rounds: int
    _steady_ticks: int
    _in_round: bool

    _append_all: bool
    _commit_bcast: bool
    _heartbeat_due: bool
    _pending_append: set[NodeId]
    _read_states: list[ReadState]
    _reads_waiting_commit: list[tuple[bytes, NodeId]]
    _snap_receipt: SnapshotReceipt | None

    def election_timeout_range(self) -> tuple[int, int]: ...
    def _send(self, msg: Message) -> None: ...
    def _reset(self, term: int) -> None: ...
    def _become_follower(self, term: int, leader: NodeId | None) -> None: ...
    def _apply_conf(self, conf: ConfState) -> None: ...
    def _maybe_commit(self) -> bool: ...
    def _log_is_up_to_date(self, last_index: int, last_term: int) -> bool: ...
