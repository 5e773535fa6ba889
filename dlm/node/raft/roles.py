"""One step function per role: what a message or a tick does to a member in that role.

The core looks its role up here once per input, instead of asking "am I the
leader?" in every handler (etcd-io/raft swaps ``r.step``/``r.tick`` likewise).
A message reaches the step function after the core's term rules, which may
have changed the role (a higher term makes any member a follower), so the role
looked up is the one the message meets. Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dlm.node.raft import leader
from dlm.node.raft.election import on_timeout_now, on_vote_response, tick_election
from dlm.node.raft.follower import (
    on_leader_message,
    on_read_index_response,
    on_vote_request,
    refuse_read_index,
)
from dlm.node.raft.member import RaftMember
from dlm.node.raft.progress import ProgressState
from dlm.node.raft.types import (
    AppendEntries,
    Heartbeat,
    InstallSnapshot,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import NodeId


@dataclass(frozen=True, slots=True)
class RoleRules:
    """What an input does to a member in one role."""

    step: Callable[[RaftMember, Message], None]
    tick: Callable[[RaftMember], None]
    unreachable: Callable[[RaftMember, NodeId, bool], None]
    """The runtime lost its link to a peer (``gone``: its process is not there at all)."""


def _step_follower(node: RaftMember, m: Message) -> None:
    _step_not_leading(node, m, holds_campaign=True)


def _step_learner(node: RaftMember, m: Message) -> None:
    _step_not_leading(node, m, holds_campaign=False)


def _step_not_leading(node: RaftMember, m: Message, *, holds_campaign: bool) -> None:
    if isinstance(m, AppendEntries | Heartbeat | InstallSnapshot):
        node._leader = m.src
        on_leader_message(node, m)
    else:
        _step_common(node, m, holds_campaign=holds_campaign)


def _step_pre_candidate(node: RaftMember, m: Message) -> None:
    if isinstance(m, VoteResponse):
        if m.pre_vote:
            on_vote_response(node, m)
    else:
        _step_campaigning(node, m)


def _step_candidate(node: RaftMember, m: Message) -> None:
    if isinstance(m, VoteResponse):
        if not m.pre_vote:
            on_vote_response(node, m)
    else:
        _step_campaigning(node, m)


def _step_campaigning(node: RaftMember, m: Message) -> None:
    if isinstance(m, AppendEntries | Heartbeat | InstallSnapshot):
        # A leader of our term exists: our round is over.
        node._become_follower(node._term, m.src)
        on_leader_message(node, m)
    else:
        _step_common(node, m, holds_campaign=False)


def _step_common(node: RaftMember, m: Message, *, holds_campaign: bool) -> None:
    """What every member that is not leading does with the rest."""
    if isinstance(m, VoteRequest):
        on_vote_request(node, m, holds_campaign=holds_campaign)
    elif isinstance(m, TimeoutNow):
        on_timeout_now(node)
    elif isinstance(m, ReadIndexRequest):
        refuse_read_index(node, m)
    elif isinstance(m, ReadIndexResponse):
        on_read_index_response(node, m)
    # Answers to a leader's messages (and stale vote answers) are not for us.


def _follower_unreachable(node: RaftMember, peer: NodeId, gone: bool) -> None:
    if gone and peer == node._leader and node._tracker.is_voter(node._id):
        ticks = node._cfg.election_ticks
        lease = ticks << node._failed_rounds  # as widened as in_lease counts it
        node._election_elapsed = max(node._election_elapsed, lease)
        node._randomized_timeout = node._election_elapsed + node._rng.randrange(1, ticks + 1)


def _leader_unreachable(node: RaftMember, peer: NodeId, gone: bool) -> None:
    pr = node._tracker.progress.get(peer)
    if pr is not None and pr.state is ProgressState.REPLICATE:
        pr.become_probe()


def _nothing(node: RaftMember, peer: NodeId, gone: bool) -> None:
    """A learner or a campaigning member counts on no leader's lease and sends no appends."""
    return


RULES: dict[Role, RoleRules] = {
    Role.FOLLOWER: RoleRules(_step_follower, tick_election, _follower_unreachable),
    Role.LEARNER: RoleRules(_step_learner, tick_election, _nothing),
    Role.PRE_CANDIDATE: RoleRules(_step_pre_candidate, tick_election, _nothing),
    Role.CANDIDATE: RoleRules(_step_candidate, tick_election, _nothing),
    Role.LEADER: RoleRules(leader.step_leader, leader.tick_leader, _leader_unreachable),
}
"""The rules each role follows, looked up by the core on every input."""
