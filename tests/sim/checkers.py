"""Safety checkers for the simulator: Raft's invariants, fed one observation at a time.

The harness reports what it sees (a node's role and term after every event,
entries as they reach stable storage, entries as they are applied, votes as
they leave a node, read states as they come back) and the checker raises
``Violation`` the moment one of them contradicts Raft's guarantees. Every
check costs O(1) or O(entries observed): a run of thousands of ticks must not
slow down as its logs grow.

Log matching is checked by induction rather than by comparing whole logs: if
every (index, term) pair ever persisted anywhere maps to one payload and one
predecessor term, then any two logs that share an (index, term) share the
whole prefix below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dlm.records import Entry, LogCompacted, LogUnavailable, NodeId


class Violation(AssertionError):
    """A safety or liveness property failed; ``kind`` names which one."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class LogReader(Protocol):
    """What the checker reads of a member's log: a LogStorage, or the core's log with its
    unstable tail (a commit may run ahead of the member's own writes)."""

    def term(self, index: int) -> int: ...

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...


@dataclass
class _Applied:
    term: int
    data: bytes


@dataclass
class SafetyChecker:
    """Cross-node invariants of one simulated cluster."""

    leader_of_term: dict[int, NodeId] = field(default_factory=dict)
    # (index, term) -> (payload, term of index - 1): the log matching witness.
    persisted: dict[tuple[int, int], tuple[bytes, int]] = field(default_factory=dict)
    applied: dict[int, _Applied] = field(default_factory=dict)
    snapshot_images: dict[int, bytes] = field(default_factory=dict)
    max_term: dict[NodeId, int] = field(default_factory=dict)
    last_vote: dict[NodeId, tuple[int, NodeId | None]] = field(default_factory=dict)
    votes_cast: dict[tuple[NodeId, int], NodeId] = field(default_factory=dict)
    # Highest commit index first reached while a leader of each term was in office,
    # and the term of the entry at each such high-water mark.
    commit_by_term: dict[int, int] = field(default_factory=dict)
    committed_entry_term: dict[int, int] = field(default_factory=dict)
    commit_high_water: int = 0
    read_floor: dict[bytes, int] = field(default_factory=dict)
    reads_checked: int = 0

    # -- elections --------------------------------------------------------

    def observe_role(self, node: NodeId, term: int, is_leader: bool) -> bool:
        """Record a node's term and role; returns True when it just became leader of ``term``."""
        if term < self.max_term.get(node, 0):
            raise Violation(
                "term-regressed",
                f"{node} is at term {term} after having reached {self.max_term[node]}",
            )
        self.max_term[node] = term
        if not is_leader:
            return False
        holder = self.leader_of_term.get(term)
        if holder is None:
            self.leader_of_term[term] = node
            return True
        if holder != node:
            raise Violation("two-leaders", f"{holder} and {node} are both leader of term {term}")
        return False

    def observe_vote_granted(self, voter: NodeId, term: int, candidate: NodeId) -> None:
        """A (real, not pre-) vote left ``voter``: it may grant one per term."""
        earlier = self.votes_cast.setdefault((voter, term), candidate)
        if earlier != candidate:
            raise Violation(
                "double-vote",
                f"{voter} voted for {earlier} and then for {candidate} in term {term}",
            )

    def observe_hard_state(self, node: NodeId, term: int, vote: NodeId | None) -> None:
        """A node's remembered (term, vote), checked at crash and restart time."""
        previous = self.last_vote.get(node)
        if previous is not None:
            old_term, old_vote = previous
            if term < old_term:
                raise Violation(
                    "term-regressed",
                    f"{node} restarted at term {term}, below the term {old_term} it had",
                )
            if term == old_term and old_vote is not None and vote != old_vote:
                raise Violation(
                    "vote-regressed",
                    f"{node} voted for {old_vote} in term {term} but came back with vote {vote}",
                )
        self.last_vote[node] = (term, vote)
        self.max_term[node] = max(self.max_term.get(node, 0), term)

    def observe_crash(self, node: NodeId, term: int, vote: NodeId | None) -> None:
        """``node`` lost everything but its disk, which holds (``term``, ``vote``).

        A term it held only in memory may be lost with it (no message carried
        it: ``check_promises`` sees to that), so its term may restart lower.
        """
        self.observe_hard_state(node, term, vote)
        self.max_term[node] = term

    def check_promises(
        self, node: NodeId, term: int, vote: NodeId | None, promised_term: int
    ) -> None:
        """A restarted node must keep what its messages promised before the crash.

        Messages leave only after their Ready is durable, so the term on any
        message and any vote granted must survive, even a crash in mid-write.
        """
        if term < promised_term:
            raise Violation(
                "term-regressed",
                f"{node} restarted at term {term} after sending messages of term {promised_term}",
            )
        granted = self.votes_cast.get((node, term))
        if granted is not None and vote != granted:
            raise Violation(
                "vote-regressed",
                f"{node} granted its term-{term} vote to {granted} but restarted with vote {vote}",
            )

    # -- logs --------------------------------------------------------------

    def observe_persisted(self, node: NodeId, entries: Sequence[Entry], prev_term: int) -> None:
        """``entries`` just reached ``node``'s stable log after an entry of term ``prev_term``."""
        for entry in entries:
            key = (entry.index, entry.term)
            witness = (entry.data, prev_term)
            known = self.persisted.setdefault(key, witness)
            if known != witness:
                raise Violation(
                    "log-matching",
                    f"{node} stores index {entry.index} term {entry.term} as "
                    f"{entry.data!r} after term {prev_term}, elsewhere it is "
                    f"{known[0]!r} after term {known[1]}",
                )
            prev_term = entry.term

    def observe_commit(self, node: NodeId, term: int, commit: int, log: LogReader) -> bool:
        """``node`` (in ``term``) reports ``commit``; the first to pass the high water owns it.

        Returns True when the high water moved, so the caller can hold every
        sitting leader of a later term to the new entry.
        """
        if commit <= self.commit_high_water:
            return False
        try:
            entry_term = log.term(commit)
        except (LogCompacted, LogUnavailable):
            # Committed beyond its own stable log is impossible for a leader and
            # a follower only learns commit indexes it stores.
            raise Violation(
                "commit-beyond-log",
                f"{node} reports commit {commit} but does not store that entry",
            ) from None
        self.commit_high_water = commit
        self.committed_entry_term[commit] = entry_term
        if commit > self.commit_by_term.get(term, 0):
            self.commit_by_term[term] = commit
        return True

    def check_leader_completeness(self, node: NodeId, term: int, log: LogReader) -> None:
        """A leader of ``term`` must hold every entry committed in an earlier term.

        Checking the highest such entry suffices: log matching (checked on
        every persist) carries the prefix below it.
        """
        index = 0
        for commit_term, commit in self.commit_by_term.items():
            if commit_term < term and commit > index:
                index = commit
        if index == 0:
            return
        want = self.committed_entry_term[index]
        if index < log.first_index() - 1:
            return  # inside the leader's snapshot; the image is compared on restore
        try:
            have = log.term(index)
        except LogUnavailable:
            raise Violation(
                "leader-completeness",
                f"{node} leads term {term} without committed index {index} (term {want}); "
                f"its log ends at {log.last_index()}",
            ) from None
        if have != want:
            raise Violation(
                "leader-completeness",
                f"{node} leads term {term} with term {have} at committed index {index}, "
                f"where the committed entry has term {want}",
            )

    # -- state machines ----------------------------------------------------

    def observe_apply(self, node: NodeId, entry: Entry) -> None:
        """Every node must apply the same command at the same index."""
        seen = self.applied.get(entry.index)
        if seen is None:
            self.applied[entry.index] = _Applied(entry.term, entry.data)
            return
        if seen.term != entry.term or seen.data != entry.data:
            raise Violation(
                "state-machine-safety",
                f"{node} applied {entry.data!r} (term {entry.term}) at index {entry.index}, "
                f"another node applied {seen.data!r} (term {seen.term})",
            )

    def observe_image(self, node: NodeId, index: int, image: bytes) -> None:
        """A state-machine image at applied ``index``: all nodes must agree byte for byte."""
        known = self.snapshot_images.setdefault(index, image)
        if known != image:
            raise Violation(
                "state-divergence",
                f"{node}'s state machine at applied index {index} differs from another node's "
                f"({len(image)} vs {len(known)} bytes)",
            )

    # -- reads -------------------------------------------------------------

    def read_started(self, ctx: bytes) -> None:
        """A ReadIndex request begins: it must observe everything committed so far."""
        self.read_floor[ctx] = self.commit_high_water

    def observe_read_state(self, node: NodeId, ctx: bytes, index: int) -> None:
        floor = self.read_floor.pop(ctx, None)
        if floor is None:
            return  # a duplicate answer to a read already checked
        self.reads_checked += 1
        if index < floor:
            raise Violation(
                "stale-read",
                f"{node} answered read {ctx!r} at index {index}, but index {floor} was "
                f"committed before the read began",
            )
