"""RaftLog (stable prefix + unstable tail), MemoryStorage, quorum and read-only helpers."""

from __future__ import annotations

import pytest

from dlm.node.raft.log import RaftLog
from dlm.node.raft.memory import MemoryStorage
from dlm.node.raft.quorum import VoteResult, quorum_index, vote_result
from dlm.node.raft.read_only import ReadOnly
from dlm.records import (
    ENTRY_OVERHEAD,
    ConfState,
    Entry,
    HardState,
    LogCompacted,
    LogUnavailable,
    Snapshot,
    SnapshotMeta,
)

CONF = ConfState(("a", "b", "c"))


def stored(terms: list[int], compact_to: int = 0) -> MemoryStorage:
    s = MemoryStorage(CONF)
    s.append([Entry(i, t, b"%d" % i) for i, t in enumerate(terms, start=1)])
    if compact_to:
        s.create_snapshot(compact_to, CONF, b"img")
        s.compact(compact_to)
    return s


# -- MemoryStorage ------------------------------------------------------------


def test_memory_storage_starts_empty_with_the_given_conf() -> None:
    s = MemoryStorage(CONF)
    assert s.initial_state() == (HardState(), CONF)
    assert (s.first_index(), s.last_index(), s.term(0), s.snapshot()) == (1, 0, 0, None)
    assert MemoryStorage().initial_state()[1] == ConfState()
    assert "MemoryStorage" in repr(s)


def test_memory_storage_term_and_entries_bounds() -> None:
    s = stored([1, 1, 2, 2, 3], compact_to=2)
    assert (s.first_index(), s.last_index()) == (3, 5)
    assert s.term(2) == 1  # the compaction point's term is still known
    with pytest.raises(LogCompacted):
        s.term(1)
    with pytest.raises(LogUnavailable):
        s.term(6)
    with pytest.raises(LogCompacted):
        s.entries(2, 4)
    with pytest.raises(LogUnavailable):
        s.entries(3, 7)
    assert s.entries(4, 4) == []
    assert [e.index for e in s.entries(3, 6)] == [3, 4, 5]


def test_memory_storage_entries_size_limit_returns_at_least_one() -> None:
    s = stored([1, 1, 1])
    one = len(b"1") + ENTRY_OVERHEAD
    assert len(s.entries(1, 4, max_bytes=1)) == 1
    assert len(s.entries(1, 4, max_bytes=2 * one)) == 2
    assert len(s.entries(1, 4, max_bytes=100 * one)) == 3


def test_memory_storage_append_truncates_conflicts_and_refuses_gaps() -> None:
    s = stored([1, 1, 1])
    s.append([Entry(2, 2, b"x")])
    assert [s.term(i) for i in (1, 2)] == [1, 2]
    assert s.last_index() == 2
    s.append([])
    with pytest.raises(ValueError):
        s.append([Entry(9, 2)])


def test_memory_storage_append_skips_entries_already_compacted() -> None:
    s = stored([1, 1, 1, 1], compact_to=3)
    s.append([Entry(2, 1, b"2"), Entry(3, 1, b"3")])  # all compacted: a stale duplicate
    assert s.last_index() == 4
    s.append([Entry(3, 1, b"3"), Entry(4, 1, b"4"), Entry(5, 2)])
    assert [e.index for e in s.entries(4, 6)] == [4, 5]


def test_memory_storage_snapshots_create_apply_and_compact() -> None:
    s = stored([1, 1, 2])
    snap = s.create_snapshot(2, ConfState(("a", "b")), b"img")
    assert snap.meta == SnapshotMeta(2, 1, ConfState(("a", "b")))
    assert s.initial_state()[1].voters == ("a", "b")
    assert s.first_index() == 1  # creating a snapshot keeps the log
    with pytest.raises(LogUnavailable):
        s.create_snapshot(9, CONF, b"")
    s.compact(2)
    s.compact(1)  # already compacted: nothing to do
    assert s.first_index() == 3
    with pytest.raises(LogCompacted):
        s.create_snapshot(1, CONF, b"")
    with pytest.raises(ValueError):
        s.compact(3)  # past the snapshot
    newer = Snapshot(SnapshotMeta(10, 4, CONF), b"new")
    s.apply_snapshot(newer)
    assert (s.first_index(), s.last_index(), s.term(10), s.snapshot()) == (11, 10, 4, newer)
    s.apply_snapshot(snap)  # older than what we hold: ignored
    assert s.snapshot() == newer
    s.set_hard_state(HardState(4, "a", 10))
    assert s.hard_state == HardState(4, "a", 10)


# -- RaftLog ------------------------------------------------------------------


def test_raft_log_reads_through_stable_and_unstable_parts() -> None:
    log = RaftLog(stored([1, 1, 2]))
    log.append(Entry(4, 3, b"u4"))
    log.append(Entry(5, 3, b"u5"))
    assert (log.first_index(), log.last_index(), log.last_term()) == (1, 5, 3)
    assert [e.index for e in log.entries(2, 6)] == [2, 3, 4, 5]
    assert [e.index for e in log.entries(4, 6)] == [4, 5]
    assert log.entries(3, 3) == []
    with pytest.raises(LogUnavailable):
        log.entries(1, 7)
    with pytest.raises(LogUnavailable):
        log.term(6)
    assert log.term_or_none(6) is None
    assert "RaftLog" in repr(log)


def test_raft_log_entries_size_limit_spans_both_parts() -> None:
    log = RaftLog(stored([1, 1]))
    log.append(Entry(3, 1, b"3"))
    log.append(Entry(4, 1, b"4"))
    one = 1 + ENTRY_OVERHEAD
    assert [e.index for e in log.entries(1, 5, max_bytes=3 * one)] == [1, 2, 3]
    assert [e.index for e in log.entries(1, 5, max_bytes=one)] == [1]
    assert [e.index for e in log.entries(3, 5, max_bytes=1)] == [3]


def test_raft_log_below_first_index_is_compacted() -> None:
    log = RaftLog(stored([1, 1, 2, 2], compact_to=2))
    with pytest.raises(LogCompacted):
        log.entries(1, 3)
    assert log.term(2) == 1
    assert log.snapshot() is not None


def test_raft_log_truncate_and_append_inside_the_unstable_tail() -> None:
    log = RaftLog(stored([1]))
    for i in range(2, 6):
        log.append(Entry(i, 1))
    assert log.take_unstable()[0].index == 2
    log.truncate_and_append([Entry(4, 2)])
    assert log.last_index() == 4
    assert [e.index for e in log.take_unstable()] == [4]  # only the rewritten part again
    log.truncate_and_append([Entry(1, 3)])  # before the tail: replaces it all
    assert (log.last_index(), log.term(1)) == (1, 3)


def test_raft_log_find_conflict_by_term() -> None:
    log = RaftLog(stored([1, 1, 1, 4, 4, 5, 5, 6, 6, 6]))
    assert log.find_conflict_by_term(10, 3) == (3, 1)
    assert log.find_conflict_by_term(10, 5) == (7, 5)
    assert log.find_conflict_by_term(10, 6) == (10, 6)
    assert log.find_conflict_by_term(20, 4) == (5, 4)
    assert log.find_conflict_by_term(4, 0) == (0, 0)
    compacted = RaftLog(stored([1, 2, 3, 4], compact_to=2))
    assert compacted.find_conflict_by_term(1, 1) == (1, 0)  # below what we can read
    assert compacted.find_conflict_by_term(4, 1) == (2, 2)  # lowest readable index


def test_raft_log_refuses_to_rewrite_committed_entries() -> None:
    log = RaftLog(stored([1, 1, 1]))
    log.committed = 3
    assert log.maybe_append(1, 1, 3, [Entry(2, 2)]) is None
    assert log.term(2) == 1


def test_raft_log_restore_and_stable_snapshot() -> None:
    log = RaftLog(stored([1, 1]))
    snap = Snapshot(SnapshotMeta(10, 3, CONF), b"img")
    log.restore(snap)
    assert (log.first_index(), log.last_index(), log.committed) == (11, 10, 10)
    assert log.term(10) == 3
    with pytest.raises(LogCompacted):
        log.term(9)
    with pytest.raises(LogUnavailable):
        log.term(11)
    assert log.snapshot() is snap
    assert log.take_snapshot() is snap
    assert log.take_snapshot() is None
    log.stable_snap_to(9)  # not that snapshot: keep it
    assert log.snapshot() is snap
    log.stable_snap_to(10)
    assert log.snapshot(storage_snapshot=False) is None


def test_raft_log_stable_to_ignores_unknown_positions() -> None:
    log = RaftLog(stored([]))
    log.append(Entry(1, 1))
    log.stable_to(5, 1)
    log.stable_to(1, 9)
    assert log.has_unstable()
    log.take_unstable()
    log.stable_to(1, 1)
    assert not log.has_unstable()


# -- quorum and read-only -----------------------------------------------------


def test_quorum_index_and_vote_results() -> None:
    assert quorum_index((), {}) == 0
    assert quorum_index(("a", "b", "c"), {"a": 5, "b": 3, "c": 1}) == 3
    assert quorum_index(("a", "b", "c", "d"), {"a": 5, "b": 3, "c": 1, "d": 9}) == 3
    voters = ("a", "b", "c")
    assert vote_result(voters, {"a": True}) is VoteResult.PENDING
    assert vote_result(voters, {"a": True, "b": True}) is VoteResult.WON
    assert vote_result(voters, {"a": True, "b": False, "c": False}) is VoteResult.LOST
    assert vote_result(voters, {"x": True, "y": True, "a": True}) is VoteResult.PENDING


def test_read_only_confirms_in_order() -> None:
    ro = ReadOnly()
    assert ro.last_ctx() == b""
    assert ro.add(b"1", 5, "a") and ro.add(b"2", 6, "b")
    assert not ro.add(b"1", 7, "a")
    assert ro.ack(b"nope", "b") == set()
    assert ro.ack(b"2", "b") == {"b"}
    assert ro.confirm(b"nope") == []
    assert [r.ctx for r in ro.confirm(b"2")] == [b"1", b"2"]
    assert len(ro) == 0


def test_raft_log_an_acknowledgement_covers_the_batches_taken_before_it() -> None:
    log = RaftLog(stored([1]))
    log.append(Entry(2, 1))
    log.take_unstable()
    log.append(Entry(3, 1))
    log.take_unstable()
    log.stable_to(3, 9)  # no batch ends there: ignored
    assert log.durable_index() == 1
    log.stable_to(3, 1)  # the disk writes in order: the first batch is on it as well
    assert log.durable_index() == 3
    log.stable_to(2, 1)  # already covered: ignored
    assert log.durable_index() == 3
