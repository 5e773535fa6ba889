"""Rot on disk: a flipped bit must stop the node with the file and byte named.

Flips land at seeded random positions in sealed WAL segments, in snapshots,
in the hard state, and in the middle and in the last record of the active
segment. Each time the
store must refuse to open (never quietly cut good data away), and the
inspector must point at the same file.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from dlm.records import ConfState, Entry, HardState
from dlm.store import StoreCorrupted
from dlm.store.disk import SNAP_DIR, WAL_DIR, DiskStorage
from dlm.store.inspect import inspect_store, inspect_store_json

FLIPS = 25
CONF = ConfState(("a", "b", "c"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with several sealed segments, two snapshots and a hard state."""
    path = tmp_path_factory.mktemp("pristine") / "node"
    rng = random.Random(5)
    with DiskStorage.open(path, segment_bytes=1024, bootstrap_conf=CONF) as store:
        index = 0
        for _ in range(60):
            batch = [Entry(index + k + 1, 1, rng.randbytes(40)) for k in range(rng.randint(1, 4))]
            store.append(batch)
            index = batch[-1].index
            if index > 40 and store.snapshot() is None:
                store.create_snapshot(20, CONF, b"image-one" * 50)
            if index > 80 and store.snapshot() is not None and store.snapshot().meta.index == 20:  # type: ignore[union-attr]
                store.create_snapshot(60, CONF, b"image-two" * 50)
        store.set_hard_state(HardState(3, "b", 50))
    return path


def copy_of(pristine: Path, tmp_path: Path) -> Path:
    target = tmp_path / "node"
    shutil.copytree(pristine, target)
    return target


def flip(path: Path, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def assert_refuses(store_dir: Path, victim: Path, bit: int) -> None:
    with pytest.raises(StoreCorrupted) as info:
        DiskStorage.open(store_dir, segment_bytes=1024)
    message = str(info.value)
    assert victim.name in message
    assert "refusing to start" in message
    assert info.value.offset <= bit // 8 + 8 or "checksum" in message
    report = inspect_store_json(store_dir)
    assert not report["ok"]
    assert any(victim.name in p for p in report["problems"])
    assert victim.name in inspect_store(store_dir)


def test_pristine_store_opens_and_inspects_clean(pristine: Path, tmp_path: Path) -> None:
    store_dir = copy_of(pristine, tmp_path)
    report = inspect_store_json(store_dir)
    assert report["ok"], report["problems"]
    assert len(report["segments"]) >= 4
    assert [s["index"] for s in report["snapshots"]] == [20, 60]
    assert report["hard_state"]["term"] == 3
    with DiskStorage.open(store_dir, segment_bytes=1024) as store:
        assert store.snapshot() is not None
        assert store.last_index() == report["index_range"]["last"]


def test_flips_in_sealed_segments_refuse_to_start(pristine: Path, tmp_path: Path) -> None:
    rng = random.Random(11)
    sealed = sorted(os.listdir(pristine / WAL_DIR))[:-1]
    for attempt in range(FLIPS):
        store_dir = copy_of(pristine, tmp_path / str(attempt))
        victim = store_dir / WAL_DIR / rng.choice(sealed)
        bit = rng.randrange(victim.stat().st_size * 8)
        flip(victim, bit)
        assert_refuses(store_dir, victim, bit)


def test_flips_in_snapshots_refuse_to_start(pristine: Path, tmp_path: Path) -> None:
    rng = random.Random(12)
    snaps = sorted(os.listdir(pristine / SNAP_DIR))
    assert len(snaps) == 2
    for attempt in range(FLIPS):
        store_dir = copy_of(pristine, tmp_path / str(attempt))
        victim = store_dir / SNAP_DIR / rng.choice(snaps)
        bit = rng.randrange(victim.stat().st_size * 8)
        flip(victim, bit)
        assert_refuses(store_dir, victim, bit)


def test_flips_in_hard_state_refuse_to_start(pristine: Path, tmp_path: Path) -> None:
    rng = random.Random(13)
    for attempt in range(10):
        store_dir = copy_of(pristine, tmp_path / str(attempt))
        victim = store_dir / "state"
        bit = rng.randrange(victim.stat().st_size * 8)
        flip(victim, bit)
        assert_refuses(store_dir, victim, bit)


def test_flip_before_valid_records_in_active_segment_refuses(
    pristine: Path, tmp_path: Path
) -> None:
    rng = random.Random(14)
    active = sorted(os.listdir(pristine / WAL_DIR))[-1]
    size = (pristine / WAL_DIR / active).stat().st_size
    for attempt in range(10):
        store_dir = copy_of(pristine, tmp_path / str(attempt))
        victim = store_dir / WAL_DIR / active
        # Anywhere but the final record, which a torn write could also explain.
        bit = rng.randrange((size - 120) * 8)
        flip(victim, bit)
        assert_refuses(store_dir, victim, bit)


def test_flip_in_the_last_record_of_the_active_segment_refuses(
    pristine: Path, tmp_path: Path
) -> None:
    """Rot in the last acknowledged batch is not a torn write (dlm 0.1 cut it off silently).

    The flips land in the last entry's bytes, short of the final 8: the copy of the
    record's head, which a crash may damage alone (see test_wal.py).
    """
    rng = random.Random(16)
    active = sorted(os.listdir(pristine / WAL_DIR))[-1]
    size = (pristine / WAL_DIR / active).stat().st_size
    for attempt in range(10):
        store_dir = copy_of(pristine, tmp_path / str(attempt))
        victim = store_dir / WAL_DIR / active
        bit = rng.randrange((size - 48) * 8, (size - 8) * 8)
        flip(victim, bit)
        assert_refuses(store_dir, victim, bit)


def test_cut_tail_of_active_segment_is_repaired(pristine: Path, tmp_path: Path) -> None:
    rng = random.Random(15)
    active = sorted(os.listdir(pristine / WAL_DIR))[-1]
    with DiskStorage.open(pristine, segment_bytes=1024) as store:
        full = store.entries(store.first_index(), store.last_index() + 1)
    for attempt in range(10):
        store_dir = copy_of(pristine, tmp_path / str(attempt))
        victim = store_dir / WAL_DIR / active
        data = victim.read_bytes()
        cut = rng.randrange(1, len(data))
        victim.write_bytes(data[:cut] + rng.choice([b"", bytes(30), rng.randbytes(30)]))
        report = inspect_store_json(store_dir)
        assert report["ok"], report["problems"]
        with DiskStorage.open(store_dir, segment_bytes=1024) as store:
            kept = store.entries(store.first_index(), store.last_index() + 1)
        assert kept == full[: len(kept)]
        # Everything before the cut survives: entries of sealed segments at least.
        assert len(kept) >= report["segments"][-2]["last_index"]


def test_missing_middle_segment_is_reported(pristine: Path, tmp_path: Path) -> None:
    store_dir = copy_of(pristine, tmp_path)
    segments = sorted(os.listdir(store_dir / WAL_DIR))
    (store_dir / WAL_DIR / segments[-2]).unlink()
    with pytest.raises(StoreCorrupted, match="a segment is missing"):
        DiskStorage.open(store_dir, segment_bytes=1024)
