"""Snapshot files: index and term stay within what the store can read back."""

from __future__ import annotations

import os
import random

import pytest

from dlm.records import ConfState, Snapshot, SnapshotMeta
from dlm.store import StoreCorrupted, StoreError, snapshot
from dlm.store.disk import SNAP_DIR, DiskStorage
from dlm.store.fs import CrashableFS

ROOT = "/node"
CONF = ConfState(("a", "b", "c"))


@pytest.mark.parametrize(("index", "term"), [(2**63, 1), (5, 2**63), (5, 2**64 - 1)])
def test_installing_a_snapshot_out_of_range_is_refused(index: int, term: int) -> None:
    fs = CrashableFS(random.Random(1))
    with DiskStorage.open(ROOT, fs=fs) as store:
        with pytest.raises(StoreError, match=r"refusing to save a snapshot: \w+ \d+ is outside"):
            store.apply_snapshot(Snapshot(SnapshotMeta(index, term, CONF), b"img"))
        assert store.snapshot() is None
        assert fs.listdir(os.path.join(ROOT, SNAP_DIR)) == []


def test_a_stored_snapshot_out_of_range_is_corruption(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checksummed file from a release that wrote any u64 it was given (or a forgery)."""
    fs = CrashableFS(random.Random(2))
    DiskStorage.open(ROOT, fs=fs).close()
    index, term = 2**63 + 7, 2
    with monkeypatch.context() as patch:
        patch.setattr(snapshot, "out_of_range", lambda what, value: None)
        data = snapshot.encode_snapshot(Snapshot(SnapshotMeta(index, term, CONF), b"x"))
    fs.write_file(os.path.join(ROOT, SNAP_DIR, snapshot.snapshot_name(index, term)), data)
    with pytest.raises(StoreCorrupted) as info:
        DiskStorage.open(ROOT, fs=fs)
    assert info.value.offset == 8
    assert f"index {index} is outside [0, 2**63)" in str(info.value)
