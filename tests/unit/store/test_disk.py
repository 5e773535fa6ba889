"""DiskStorage against the Storage contract, on the real disk and on CrashableFS."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlm.records import (
    ConfState,
    Entry,
    HardState,
    LogCompacted,
    LogUnavailable,
    Snapshot,
    SnapshotMeta,
    Storage,
)
from dlm.store import StoreError, StoreFull
from dlm.store.disk import SNAP_DIR, WAL_DIR, DiskStorage
from dlm.store.fs import CrashableFS, CrashMode
from dlm.store.inspect import inspect_store, inspect_store_json
from tests.unit.store.workload import Model, acknowledge, check_recovered, log_of, ops, run_op

CONF = ConfState(("a", "b", "c"))


def entries(lo: int, hi: int, term: int = 1, size: int = 10) -> list[Entry]:
    return [Entry(i, term, b"%d" % i * size) for i in range(lo, hi)]


def test_is_a_storage(tmp_path: Path) -> None:
    store: Storage = DiskStorage.open(tmp_path / "s")
    assert isinstance(store, DiskStorage)
    store.close()


def test_fresh_store(tmp_path: Path) -> None:
    with DiskStorage.open(tmp_path / "s") as store:
        assert store.initial_state() == (HardState(), ConfState())
        assert (store.first_index(), store.last_index()) == (1, 0)
        assert store.term(0) == 0
        with pytest.raises(LogUnavailable):
            store.term(1)
        assert store.entries(1, 1) == []
        assert store.snapshot() is None


def test_append_overwrite_and_read(tmp_path: Path) -> None:
    with DiskStorage.open(tmp_path / "s", segment_bytes=256) as store:
        store.append(entries(1, 6))
        store.append(entries(6, 11))
        store.append(entries(6, 8, term=2))  # drops 6..10, then writes 6..7
        assert store.last_index() == 7
        assert [store.term(i) for i in range(1, 8)] == [1] * 5 + [2, 2]
        assert store.entries(3, 6) == entries(3, 6)
        with pytest.raises(LogUnavailable):
            store.entries(1, 9)
        with pytest.raises(ValueError, match="gap"):
            store.append(entries(9, 10))
        # max_bytes: at least one entry, then as many as fit.
        assert len(store.entries(1, 8, max_bytes=1)) == 1
        assert len(store.entries(1, 8, max_bytes=2 * (10 + 24))) == 2
        assert len(store.segment_names) > 1
    with DiskStorage.open(tmp_path / "s", segment_bytes=256) as store:
        assert store.entries(1, 8) == entries(1, 6) + entries(6, 8, term=2)


def test_one_write_and_one_fsync_per_append() -> None:
    fs = CrashableFS(random.Random(1))
    with DiskStorage.open("/s", fs=fs) as store:
        for batch in (1, 16, 256):
            before = fs.ops
            store.append(entries(store.last_index() + 1, store.last_index() + 1 + batch))
            assert fs.ops - before == 2  # one write, one fsync


def test_commit_only_changes_are_not_written(tmp_path: Path) -> None:
    fs = CrashableFS(random.Random(1))
    with DiskStorage.open("/s", fs=fs) as store:
        store.append(entries(1, 5))
        store.set_hard_state(HardState(1, "a", 0))
        before = fs.ops
        store.set_hard_state(HardState(1, "a", 3))
        assert fs.ops == before
        assert store.initial_state()[0] == HardState(1, "a", 3)
        with pytest.raises(ValueError, match="go back"):
            store.set_hard_state(HardState(0, None, 3))
    # close() flushed the commit index.
    with DiskStorage.open("/s", fs=fs) as store:
        assert store.initial_state()[0] == HardState(1, "a", 3)
        store.set_hard_state(HardState(1, "a", 4))
    fs.crash(CrashMode.POWER_LOSS)
    with DiskStorage.open("/s", fs=fs) as store:
        hs = store.initial_state()[0]
        assert (hs.term, hs.vote) == (1, "a")
        assert hs.commit in (3, 4)


def test_snapshots_compaction_and_install(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with DiskStorage.open(path, segment_bytes=200, bootstrap_conf=CONF) as store:
        for lo in range(1, 41, 5):
            store.append(entries(lo, lo + 5))
        assert store.initial_state()[1] == CONF
        snap = store.create_snapshot(20, ConfState(("a", "b")), b"img20")
        assert snap.meta == SnapshotMeta(20, 1, ConfState(("a", "b")))
        assert store.first_index() == 1  # the log is kept until compact
        segments = len(store.segment_names)
        store.compact(15)
        assert store.first_index() == 16
        assert store.term(15) == 1
        with pytest.raises(LogCompacted):
            store.term(14)
        with pytest.raises(LogCompacted):
            store.entries(15, 20)
        assert len(store.segment_names) < segments
        with pytest.raises(ValueError):
            store.compact(30)  # beyond the snapshot
        store.create_snapshot(30, CONF, b"img30")
        store.create_snapshot(35, CONF, b"img35")
        assert len(os.listdir(path / SNAP_DIR)) == 2  # older pruned
    with DiskStorage.open(path, segment_bytes=200) as store:
        assert store.snapshot() == Snapshot(SnapshotMeta(35, 1, CONF), b"img35")
        assert store.initial_state()[0].commit == 35
        assert store.last_index() == 40
        assert store.entries(36, 41) == entries(36, 41)
        installed = Snapshot(SnapshotMeta(100, 3, CONF), b"leader image")
        store.apply_snapshot(installed)
        assert (store.first_index(), store.last_index(), store.term(100)) == (101, 100, 3)
        assert len(store.segment_names) == 1
        store.append(entries(101, 104, term=3))
    with DiskStorage.open(path, segment_bytes=200) as store:
        assert store.snapshot() == installed
        assert store.entries(101, 104) == entries(101, 104, term=3)
        assert inspect_store_json(path)["index_range"]["first"] == 101


def test_store_is_locked_while_open(tmp_path: Path) -> None:
    with DiskStorage.open(tmp_path / "s"), pytest.raises(StoreError, match="in use"):
        DiskStorage.open(tmp_path / "s")
    DiskStorage.open(tmp_path / "s").close()


def test_unusable_paths_give_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        DiskStorage.open(tmp_path / "file")
    with pytest.raises(StoreError, match="cannot open store"):
        DiskStorage.open(tmp_path / "file" / "below")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(StoreError, match="cannot open store"):
            DiskStorage.open(locked)
    finally:
        locked.chmod(0o755)


def test_inspect_text_names_everything(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with DiskStorage.open(path, segment_bytes=200) as store:
        store.append(entries(1, 30))
        store.append(entries(25, 27, term=2))
        store.set_hard_state(HardState(2, "b", 20))
        store.create_snapshot(20, CONF, b"img")
    segment = sorted(os.listdir(path / WAL_DIR))[-1]
    with open(path / WAL_DIR / segment, "ab") as f:
        f.write(b"\x07\x00")
    text = inspect_store(path)
    assert "OK" in text.splitlines()[0]
    assert "term 2, vote b" in text
    assert "index 20 term 1" in text
    assert "torn tail: 2 bytes" in text and segment in text
    assert "log: indexes 1..26" in text


def test_crashable_fs_models_lost_writes() -> None:
    fs = CrashableFS(random.Random(3))
    fs.makedirs("/d")
    f = fs.create("/d/a")
    f.write(b"hello")
    f.fsync()
    f.write(b" world")
    fs.crash(CrashMode.PROCESS)
    assert fs.read("/d/a") == b"hello world"
    fs.crash(CrashMode.POWER_LOSS)
    assert not fs.exists("/d/a")  # never made durable in its directory
    g = fs.create("/d/b")
    g.write(b"abc")
    g.fsync()
    fs.fsync_dir("/d")
    g.write(b"def")
    fs.crash(CrashMode.POWER_LOSS)
    assert fs.read("/d/b") == b"abc"
    with pytest.raises(Exception, match="after a crash"):
        g.write(b"x")


def test_crashable_fs_takes_relative_paths_and_crashes_one_subtree() -> None:
    fs = CrashableFS(random.Random(4))
    one = DiskStorage.open("n1", fs=fs)
    two = DiskStorage.open("n2", fs=fs)
    one.append(entries(1, 3))
    two.append(entries(1, 4))
    fs.crash(CrashMode.POWER_LOSS, under="n1")
    two.append(entries(4, 5))  # n2 is unaffected and keeps running
    with DiskStorage.open("n1", fs=fs) as again:
        assert again.entries(1, 3) == entries(1, 3)
    two.close()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), restarts=st.lists(st.integers(0, 39), max_size=5))
def test_model_based_with_restarts(seed: int, restarts: list[int]) -> None:
    """Random calls agree with a model op by op, across clean and process-crash restarts."""
    fs = CrashableFS(random.Random(seed))
    store = DiskStorage.open("/s", fs=fs, segment_bytes=300)
    model = Model()
    for step, (op, model) in enumerate(ops(seed, 40)):
        run_op(store, op)
        acknowledge(model, op)
        assert store.last_index() == model.last
        assert store.first_index() == model.first
        assert log_of(store) == model.log
        if step in restarts:
            if step % 2:
                store.close()
            else:
                fs.crash(CrashMode.PROCESS)
            store = DiskStorage.open("/s", fs=fs, segment_bytes=300)
            check_recovered(store, model, None)
            model.first = store.first_index()
            model.log = {i: e for i, e in model.history.items() if i >= model.first}
    store.close()


@pytest.mark.parametrize("full_errno", [errno.ENOSPC, errno.EDQUOT])
@pytest.mark.parametrize("mode", [CrashMode.PROCESS, CrashMode.POWER_LOSS])
def test_a_full_disk_raises_store_full_and_loses_nothing(full_errno: int, mode: CrashMode) -> None:
    fs = CrashableFS(random.Random(21))
    fs.full_errno = full_errno
    store = DiskStorage.open("/data/n1", fs=fs, segment_bytes=4096)
    for lo in range(1, 41, 4):
        store.append(entries(lo, lo + 4, size=20))
    store.set_hard_state(HardState(3, "n2", 30))
    acked = store.entries(1, 41)
    fs.capacity = sum(fs.size(p) for p in _files(fs, "/data")) + 100
    big = entries(41, 61, size=100)
    with pytest.raises(StoreFull) as info:
        store.append(big)
    assert str(info.value) == (
        "no space left on /data/n1 (needs at least 1.0 MB free; free some space and start again)"
    )
    assert info.value.path == "/data/n1"
    assert info.value.needed >= sum(len(e.data) for e in big)
    assert store.last_index() == 40
    fs.capacity = None
    with pytest.raises(StoreError, match="refuses writes after a failed one"):
        store.append(entries(41, 42))
    fs.crash(mode)  # the member stops; the operator frees space and starts it again
    with DiskStorage.open("/data/n1", fs=fs, segment_bytes=4096) as again:
        assert again.entries(1, 41) == acked
        assert again.last_index() == 40
        assert again.initial_state()[0].term == 3
        again.append(big)
    with DiskStorage.open("/data/n1", fs=fs, segment_bytes=4096) as again:
        assert again.entries(41, 61) == big


def test_a_failed_fsync_for_want_of_space_is_store_full() -> None:
    fs = CrashableFS(random.Random(22))
    store = DiskStorage.open("/n1", fs=fs)
    store.append(entries(1, 5))
    fs.fsync_errno = errno.ENOSPC
    with pytest.raises(StoreFull, match="no space left on /n1"):
        store.append(entries(5, 9))
    fs.fsync_errno = None
    fs.crash(CrashMode.POWER_LOSS)
    with DiskStorage.open("/n1", fs=fs) as again:
        assert again.entries(1, 5) == entries(1, 5)
        assert again.last_index() == 4  # the failed batch was never made durable


def test_a_full_disk_during_a_segment_roll_is_store_full() -> None:
    fs = CrashableFS(random.Random(23))
    store = DiskStorage.open("/n1", fs=fs, segment_bytes=100)
    store.append(entries(1, 9))
    fs.capacity = sum(fs.size(p) for p in _files(fs, "/n1")) + 30
    with pytest.raises(StoreFull, match="no space left on /n1"):
        store.append(entries(9, 12))  # the active segment is full: this opens a new one
    fs.capacity = None
    fs.crash(CrashMode.TORN)
    with DiskStorage.open("/n1", fs=fs, segment_bytes=100) as again:
        assert again.entries(1, 9) == entries(1, 9)
        again.append(entries(9, 12))
        assert again.last_index() == 11


def test_a_full_disk_keeps_the_old_hard_state_and_snapshot() -> None:
    fs = CrashableFS(random.Random(24))
    store = DiskStorage.open("/n1", fs=fs, bootstrap_conf=CONF)
    store.append(entries(1, 21))
    store.set_hard_state(HardState(2, "a", 10))
    fs.capacity = sum(fs.size(p) for p in _files(fs, "/n1")) + 10
    with pytest.raises(StoreFull, match="no space left on /n1 "):
        store.set_hard_state(HardState(3, "b", 10))
    with pytest.raises(StoreFull, match="no space left on /n1 "):
        store.create_snapshot(10, CONF, b"image" * 100)
    fs.capacity = None
    fs.crash(CrashMode.PROCESS)
    with DiskStorage.open("/n1", fs=fs) as again:
        hs, _ = again.initial_state()
        assert (hs.term, hs.vote) == (2, "a")
        assert again.snapshot() is None
        assert again.entries(1, 21) == entries(1, 21)


def test_opening_a_store_on_a_full_disk_is_store_full() -> None:
    fs = CrashableFS(random.Random(25))
    fs.capacity = 10
    with pytest.raises(StoreFull, match=r"^no space left on /n1 \(needs at least 1.0 MB free"):
        DiskStorage.open("/n1", fs=fs, bootstrap_conf=CONF)
    fs.capacity = None
    with DiskStorage.open("/n1", fs=fs, bootstrap_conf=CONF) as store:
        assert store.initial_state()[1] == CONF


def _files(fs: CrashableFS, root: str) -> list[str]:
    found = []
    for name in fs.listdir(root):
        path = os.path.join(root, name)
        found.extend(_files(fs, path) if fs.isdir(path) else [path])
    return found
