"""Read rounds: reads and keep-alives answered once a ReadIndex round confirms them.

Keep-alives and linearizable reads do not enter the log. A leader batches them:
every request that arrives while its round waits for a quorum waits for the next
round, which starts as soon as that one is confirmed; so one heartbeat round
confirms every read that arrived before it started (and none that came later), and a
leader under 2,000 keep-alives a second sends a round per round trip rather than one
per keep-alive. A follower forwards each round to the leader at once (its reads are
few, and a forwarded request that is lost produces no answer, which must not hold up
the reads behind it). A confirmed round is served once the state machine has applied
up to its read point. Pure: part of the node machine (machine.py).

Keep-alives alone wait a little longer for their round: a leader starts a round that
holds only keep-alives no sooner than ``KEEPALIVE_ROUND_GAP_S`` after its last round
started (any other read starts one as before). On a quiet machine a round is confirmed
within a tenth of a millisecond, so without the gap nearly every keep-alive paid for a
round of its own (a heartbeat to each follower and their answers, most of the 462 us of
server CPU each one cost at 2,000 a second); with it, at most 100 rounds a second carry
every keep-alive; and once a round carries ``BUSY_ROUND_READS`` or more, the next one
waits ``BUSY_ROUND_GAP_S`` (20 ms): at 2,000 keep-alives a second that halves the rounds
(about 40 keep-alives each instead of 20) and cut the server CPU per keep-alive by about a
fifth on a quiet machine (the followers' share most), for a p50 of 12.5 ms instead of 7 ms.
A keep-alive that comes after a quiet spell still starts its round at once. Nothing is
weakened: a keep-alive is still answered only by a round that started after it arrived,
and the lease's clock still restarts at its arrival, so waiting longer only makes the
renewal more conservative. The machine's timer comes at the deferred round's time
(``deferred_until``), or earlier with any other pump.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dlm.node import locks
from dlm.node.leases import LeaseTracker
from dlm.node.outbox import Instant, NotLeaderReply, Outbox
from dlm.node.raft.core import RaftNode
from dlm.node.raft.types import NotLeader, ReadState
from dlm.wire import ClientRequest, ErrorCode, Renew, error

KEEPALIVE_ROUND_GAP_S = 0.01
"""A leader's round of keep-alives alone starts at least this long after its last round."""
BUSY_ROUND_READS = 16
"""A round that carried at least this many reads makes the next gap ``BUSY_ROUND_GAP_S``."""
BUSY_ROUND_GAP_S = 0.02
"""The gap after a busy round: under load, at most 50 rounds a second carry the keep-alives."""


@dataclass(slots=True)
class Read:
    """A request that needs a confirmed read point (or, for keep-alives, confirmed leadership)."""

    conn: int
    request: ClientRequest
    received: float


@dataclass(slots=True)
class ReadRound:
    reads: list[Read]
    started: float
    as_leader: bool
    index: int = -1
    """The confirmed read point, once the core reported it."""


class ReadRounds:
    """The reads waiting for a round, and the rounds waiting for their read point."""

    def __init__(
        self,
        out: Outbox,
        not_leader: NotLeaderReply,
        ctx_prefix: bytes,
        keepalive_gap_s: float = KEEPALIVE_ROUND_GAP_S,
        busy_gap_s: float = BUSY_ROUND_GAP_S,
    ) -> None:
        self._out = out
        self._not_leader = not_leader
        self._ctx_prefix = ctx_prefix
        """Unique per process incarnation: a late answer to a read round from before a
        restart must not be taken for one of ours."""
        self._seq = 0
        self._keepalive_gap_s = keepalive_gap_s
        self._busy_gap_s = busy_gap_s
        self._gap_s = keepalive_gap_s
        """The gap after the last round: the busy one if it carried BUSY_ROUND_READS or more."""
        self._last_started = float("-inf")
        self._only_keepalives = True
        """Every queued read is a keep-alive (so its round may wait for the gap)."""
        self.queued: list[Read] = []
        self.rounds: dict[bytes, ReadRound] = {}

    def queue(self, read: Read) -> None:
        self.queued.append(read)
        if not isinstance(read.request, Renew):
            self._only_keepalives = False

    def leader_round_open(self, leading: bool) -> bool:
        """A round we started as leader is still waiting for its quorum (see the module)."""
        if not leading:
            return False
        return any(r.as_leader and r.index < 0 for r in self.rounds.values())

    def _gathering(self, raft: RaftNode, leading: bool) -> bool:
        """Only keep-alives wait, for a leader with followers to ask (alone, a leader
        confirms a round at once: there is nothing to save)."""
        return leading and self._only_keepalives and len(raft.voters) > 1

    def deferred_until(self, raft: RaftNode, leading: bool) -> float:
        """When the keep-alives waiting out the gap may start their round (monotonic s);
        infinity when none wait for the gap alone (the machine's timer comes no later)."""
        if not self.queued or not self._gathering(raft, leading):
            return float("inf")
        if self.leader_round_open(leading):
            return float("inf")  # the open round's confirmation pumps
        return self._last_started + self._gap_s

    def due(self, raft: RaftNode, leading: bool, mono: float) -> bool:
        """Reads are queued and may start their round at monotonic time ``mono``: no
        leader's round is open, and keep-alives alone have waited out their gap."""
        if not self.queued or self.leader_round_open(leading):
            return False
        # Keep-alives alone gather more for one round until the gap is over (see the module).
        return mono >= self._last_started + self._gap_s or not self._gathering(raft, leading)

    def start_if_due(self, raft: RaftNode, leading: bool, now: Instant) -> None:
        """Starts a round for the queued reads, if they are ``due``."""
        if not self.due(raft, leading, now.mono):
            return
        reads, self.queued = self.queued, []
        self._only_keepalives = True
        self._last_started = now.mono
        busy = len(reads) >= BUSY_ROUND_READS
        self._gap_s = self._busy_gap_s if busy else self._keepalive_gap_s
        self._seq += 1
        ctx = self._ctx_prefix + self._seq.to_bytes(8, "big")
        result = raft.read_index(ctx)
        if isinstance(result, NotLeader):
            for read in reads:
                self._not_leader(read.conn, read.request, result.leader)
            return
        self.rounds[ctx] = ReadRound(reads, now.mono, as_leader=leading)

    def confirmed(self, read_states: Iterable[ReadState]) -> None:
        for rs in read_states:
            read_round = self.rounds.get(rs.ctx)
            if read_round is not None:
                read_round.index = rs.index

    def any_ready(self, applied: int) -> bool:
        """A confirmed round's read point is applied (``ready`` would serve its reads)."""
        return any(0 <= r.index <= applied for r in self.rounds.values())

    def ready(self, applied: int) -> list[Read]:
        """The reads of every confirmed round whose read point is applied, in order."""
        done = [ctx for ctx, r in self.rounds.items() if 0 <= r.index <= applied]
        return [read for ctx in done for read in self.rounds.pop(ctx).reads]

    def time_out(self, started_before: float) -> None:
        for ctx in [c for c, r in self.rounds.items() if r.started < started_before]:
            read_round = self.rounds.pop(ctx)
            code = ErrorCode.NO_QUORUM if read_round.as_leader else ErrorCode.TIMEOUT
            self.fail(read_round.reads, code)

    def leadership_lost(self) -> None:
        """Rounds started as leader will not be confirmed: their clients try the new one."""
        for ctx in [c for c, r in self.rounds.items() if r.as_leader]:
            self.fail(self.rounds.pop(ctx).reads, ErrorCode.NOT_LEADER)

    def shut_down(self) -> None:
        for read_round in self.rounds.values():
            for read in read_round.reads:
                self._out.answer(
                    read.conn,
                    read.request.TYPE,
                    error(read.request.id, ErrorCode.SHUTTING_DOWN, "member is shutting down"),
                )
        self.rounds.clear()

    def fail(self, reads: Iterable[Read], code: ErrorCode) -> None:
        for read in reads:
            kind = read.request.TYPE
            if code is ErrorCode.NOT_LEADER:
                self._not_leader(read.conn, read.request)
            elif code is ErrorCode.NO_QUORUM:
                self._out.answer(
                    read.conn,
                    kind,
                    error(
                        read.request.id,
                        code,
                        "the leader cannot reach a majority",
                        retry_after_ms=500,
                    ),
                )
            else:
                self._out.answer(
                    read.conn, kind, error(read.request.id, code, "read was not confirmed in time")
                )


def renew_confirmed(
    req: Renew,
    received: float,
    machine: locks.LockStateMachine,
    tracker: LeaseTracker,
    *,
    doomed: bool,
) -> int | str:
    """The leader renews a confirmed keep-alive, restarting the lease's clock at
    ``received`` (when the request arrived, before the round confirmed it): the lease's
    TTL in ms, or how the lease ended (locks.LEASE_*, or "" when that is lost) when it
    may not be renewed."""
    info = machine.lease_terms(req.lease)
    stale = info is not None and req.incarnation not in (0, info.incarnation)
    if info is None or stale or doomed:
        if doomed:
            return locks.LEASE_EXPIRED
        if info is None:
            return machine.lease_ending(req.lease)
        return ""  # a later lease reuses the id: how the renewed one ended is lost
    if not tracker.renew(req.lease, received, req.client, req.seq):
        # Not tracked (a lease applied before we took office is always tracked, so this
        # is a race with its opening): start its clock now.
        tracker.arm(req.lease, info.ttl_ms, info.incarnation, received)
    return info.ttl_ms
