"""Majority arithmetic: how many voters make a quorum, which index a quorum holds, who won a vote.

Kept apart from the core so that joint consensus (membership changes, a later
issue) can replace these few functions with their two-majority versions
without touching the protocol logic.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping

from dlm.records import NodeId


class VoteResult(enum.Enum):
    PENDING = 0
    WON = 1
    LOST = 2


def majority(voters: Collection[NodeId]) -> int:
    """The smallest number of voters that forms a quorum."""
    return len(voters) // 2 + 1


def quorum_index(voters: Collection[NodeId], match: Mapping[NodeId, int]) -> int:
    """The highest index that a quorum of voters is known to hold (0 without voters)."""
    if not voters:
        return 0
    ranked = sorted((match.get(v, 0) for v in voters), reverse=True)
    # Ranked high to low, the entry at position majority-1 is held by at least
    # a majority of voters.
    return ranked[len(ranked) // 2]


def vote_result(voters: Collection[NodeId], votes: Mapping[NodeId, bool]) -> VoteResult:
    """Tally the answers of ``voters``; answers from non-voters do not count."""
    need = majority(voters)
    granted = rejected = 0
    for v in voters:
        answer = votes.get(v)
        if answer is True:
            granted += 1
        elif answer is False:
            rejected += 1
    if granted >= need:
        return VoteResult.WON
    if len(voters) - rejected < need:
        return VoteResult.LOST
    return VoteResult.PENDING
