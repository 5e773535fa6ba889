"""Elections: the timer that starts them, the campaign (pre-vote, then vote), the tally.

Functions over the ``RaftMember`` they are given, split out of the core by role.
A member that is not leading counts ticks towards its randomized election
timeout; on reaching it, a voter campaigns (as a pre-candidate first, when
pre-vote is on), widening the back-off when its last round reached others but
found no leader. The vote tally is the tracker's. Pure: no IO, no clock.
"""

from __future__ import annotations

from dlm.node.raft.follower import narrow_back_off
from dlm.node.raft.leader import become_leader
from dlm.node.raft.member import RaftMember
from dlm.node.raft.quorum import VoteResult, vote_result
from dlm.node.raft.types import Role, VoteRequest, VoteResponse


def tick_election(node: RaftMember) -> None:
    """A tick on a member that is not leading."""
    node._election_elapsed += 1
    if node._tracker.is_voter(node._id) and node._election_elapsed >= node._randomized_timeout:
        if node._in_round:
            # The last round (ours, or one we voted in) reached others but ended without
            # a leader: widen the range the next timeouts are drawn from, so that members
            # whose rounds keep colliding, or keep running out before slow votes arrive,
            # spread out. A round that reached nobody (we are cut off) widens nothing:
            # the timeouts after the heal must still be short.
            node._failed_rounds = min(node._failed_rounds + 1, node._cfg.max_backoff_doublings)
            node._steady_ticks = 0
            node._in_round = False
        campaign(node, pre_vote=node._cfg.pre_vote)
    elif node._leader is not None:
        narrow_back_off(node, leading=False)


def campaign(node: RaftMember, pre_vote: bool, transfer: bool = False) -> None:
    tracker = node._tracker
    if pre_vote:
        node._reset(node._term)
        node._role = Role.PRE_CANDIDATE
        vote_term = node._term + 1
    else:
        node._reset(node._term + 1)
        node._role = Role.CANDIDATE
        node._vote = node._id
        vote_term = node._term
    tracker.votes[node._id] = True
    if vote_result(tracker.voters, tracker.votes) is VoteResult.WON:
        _won_election(node, pre_vote)
        return
    log = node._log
    last_index = log.last_index()
    last_term = log.last_term()
    for peer in tracker.voters:
        if peer != node._id:
            node._send(
                VoteRequest(
                    group=node._group,
                    term=vote_term,
                    src=node._id,
                    dst=peer,
                    last_log_index=last_index,
                    last_log_term=last_term,
                    pre_vote=pre_vote,
                    transfer=transfer,
                )
            )


def on_timeout_now(node: RaftMember) -> None:
    """The leader asked us to stand at once (a leadership transfer)."""
    if not node._tracker.is_voter(node._id):
        return
    # The leader asked for it: skip pre-vote and tell voters to ignore their lease.
    campaign(node, pre_vote=False, transfer=True)


def on_vote_response(node: RaftMember, m: VoteResponse) -> None:
    """An answer to our own round (the caller checked it answers the round we run)."""
    node._in_round = True  # our round reached someone
    result = node._tracker.record_vote(m.src, m.granted)
    if result is VoteResult.WON:
        _won_election(node, m.pre_vote)
    elif result is VoteResult.LOST:
        node._become_follower(node._term, None)


def _won_election(node: RaftMember, pre_vote: bool) -> None:
    if pre_vote:
        campaign(node, pre_vote=False)
    else:
        become_leader(node)
