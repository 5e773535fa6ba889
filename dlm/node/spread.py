"""Leader spread: which member each partition's leader should hand leadership to.

A cluster of P partitions runs P Raft groups over the same N members. Left to
elections alone, whichever member starts first, or is restarted last, ends up
leading most groups and does most of the work. Each partition therefore has a
preference order over the voters: the voters sorted by id, rotated left by the
partition's index, so partition i prefers the (i mod N)-th voter, then the
next. A partition's leader hands leadership over (the Raft core's transfer:
proposals stop, the target is caught up, TimeoutNow) to the most-preferred
voter that is healthy and caught up, unless that is itself. Once every member
is healthy each member is first in the order of at most ceil(P/N) partitions,
so no member leads more than that.

A transfer always goes to a voter the leader ranks above itself, so while the
leader's view holds still leadership only climbs the order and stops; a member
that falls silent loses its groups to ordinary elections, and gets them back
once it has been healthy for ``settle_s`` (a member that flaps never becomes
a target, so it causes no churn). Nothing is decided while a transfer is in
flight, while a configuration change is uncommitted, within ``settle_s`` of the
previous attempt (a target that could not take over is not asked again at
once), or when P = 1 (one group: no spread to keep).

Pure: time is passed in (tests/unit/node/test_purity.py). The node machine
asks ``decide`` on each leader tick (machine.py); tested by
tests/unit/node/test_spread.py and the simulator's partitioned runs
(tests/sim/test_node_sim.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from dlm.node.raft.core import RaftNode
from dlm.records import NodeId

CAUGHT_UP_LAG = 8
"""Entries a target may still lack and count as caught up. Under steady load the
leader's last index is nearly always a round trip ahead of every follower's match; the
core's transfer then stops proposals and sends the rest before TimeoutNow, which takes
one round trip for a handful of entries, while a target far behind is not chosen."""


def preference(voters: Iterable[NodeId], partition: int) -> list[NodeId]:
    """The voters in partition ``partition``'s order: sorted by id, rotated left by
    ``partition`` (so partition i prefers voter i mod N first)."""
    ordered = sorted(voters)
    if not ordered:
        return ordered
    shift = partition % len(ordered)
    return ordered[shift:] + ordered[:shift]


def leader_counts_bound(partitions: int, members: int) -> int:
    """The most partitions a member leads once every member is healthy: ceil(P/N)."""
    return -(-partitions // max(1, members))


class LeaderSpread:
    """One partition's leader-spread decisions; one per node machine."""

    def __init__(self, partition: int, partitions: int, settle_s: float) -> None:
        self.partition = partition
        self.partitions = partitions
        self.settle_s = settle_s
        self._healthy_since: dict[NodeId, float] = {}
        """Since when each voter has been healthy without a break (absent: not healthy)."""
        self._last_attempt = float("-inf")

    @property
    def active(self) -> bool:
        return self.partitions > 1

    def observe(
        self, voters: Iterable[NodeId], healthy: Callable[[NodeId], bool], now: float
    ) -> None:
        """Note which voters are healthy at ``now`` (a break restarts a voter's settle time)."""
        since = self._healthy_since
        for voter in voters:
            if healthy(voter):
                since.setdefault(voter, now)
            else:
                since.pop(voter, None)

    def target(
        self,
        me: NodeId,
        voters: Iterable[NodeId],
        match: Mapping[NodeId, int],
        last_index: int,
        now: float,
    ) -> NodeId | None:
        """The voter this leader should hand over to now (None: keep leading).

        ``match`` is the leader's replication progress per voter. A voter qualifies when it
        has been healthy for ``settle_s`` and is within CAUGHT_UP_LAG entries of
        ``last_index``; the leader itself always qualifies.
        """
        for voter in preference(voters, self.partition):
            if voter == me:
                return None
            since = self._healthy_since.get(voter)
            if since is None or now - since < self.settle_s:
                continue
            if last_index - match.get(voter, 0) > CAUGHT_UP_LAG:
                continue
            return voter
        return None

    def decide(
        self,
        *,
        me: NodeId,
        voters: tuple[NodeId, ...],
        healthy: Callable[[NodeId], bool],
        match: Mapping[NodeId, int],
        last_index: int,
        transferring: bool,
        conf_pending: bool,
        now: float,
    ) -> NodeId | None:
        """A leader's tick: the voter to transfer leadership to now, or None.

        Records the attempt, so that the next one waits ``settle_s``.
        """
        if not self.active:
            return None
        self.observe(voters, healthy, now)
        if transferring or conf_pending or now - self._last_attempt < self.settle_s:
            return None
        to = self.target(me, voters, match, last_index, now)
        if to is not None:
            self._last_attempt = now
        return to

    def left_office(self) -> None:
        """Leadership is lost: what this member saw as leader starts afresh next time."""
        self._healthy_since.clear()


SETTLE_ELECTION_TIMEOUTS = 10
"""A returning voter becomes a target after this many election timeouts of health (3 s
with the default timing): long enough that a member restarting in a loop never does."""


def spread_tick(
    spread: LeaderSpread, raft: RaftNode, answers: Callable[[NodeId], bool], now: float
) -> NodeId | None:
    """A leader's tick: start the transfer ``spread`` decides on, if any; returns its target.

    ``answers`` says whether a member is connected and recently heard (peer_health.py).
    """
    if not spread.active:
        return None
    status = raft.status()
    to = spread.decide(
        me=status.id,
        voters=status.voters,
        healthy=answers,
        match={peer: pr.match for peer, pr in status.progress.items()},
        last_index=status.last_index,
        transferring=raft.lead_transferee is not None,
        conf_pending=status.conf_pending,
        now=now,
    )
    if to is not None:
        raft.transfer_leadership(to)
    return to
