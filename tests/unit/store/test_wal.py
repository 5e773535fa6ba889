"""The WAL format: rot in the last batch told apart from a torn write, bounds, and dlm 0.1 logs.

Everything here runs on CrashableFS with files planted or damaged byte by
byte, so each case names exactly which bytes a crash or rot changed.
"""

from __future__ import annotations

import os
import random
import struct
import zlib

import pytest

from dlm.records import Entry, EntryKind, HardState
from dlm.store import StoreCorrupted, StoreError
from dlm.store.disk import WAL_DIR, DiskStorage
from dlm.store.fs import CrashableFS, CrashMode
from dlm.store.inspect import inspect_store, inspect_store_json
from dlm.store.wal import WAL_VERSION, encode_batch, scan_segment, segment_name
from tests.unit.store import wal_v1

ROOT = "/node"
SEGMENT = os.path.join(ROOT, WAL_DIR, segment_name(1))


def batch(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [Entry(i, term, b"entry-%d" % i * 3) for i in range(lo, hi)]


def store_with_batches(fs: CrashableFS) -> tuple[list[Entry], int]:
    """A store of three batches in one segment; returns its entries and where the last
    batch's record starts."""
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append(batch(1, 4))
        store.append(batch(4, 6))
        before = fs.size(SEGMENT)
        store.append(batch(6, 9))
        assert fs.size(SEGMENT) - before == len(encode_batch(batch(6, 9)))
        return store.entries(1, 9), before


def reopen(fs: CrashableFS) -> list[Entry]:
    with DiskStorage.open(ROOT, fs=fs) as store:
        return store.entries(store.first_index(), store.last_index() + 1)


def test_a_bit_flip_in_the_head_or_payload_of_the_last_batch_is_corruption() -> None:
    fs = CrashableFS(random.Random(1))
    _, last_at = store_with_batches(fs)
    size = fs.size(SEGMENT)
    copy_at = size - 8
    for bit in range(last_at * 8, copy_at * 8):
        damaged = CrashableFS(random.Random(1))
        store_with_batches(damaged)
        damaged.flip_bit(SEGMENT, bit)
        with pytest.raises(StoreCorrupted) as info:
            DiskStorage.open(ROOT, fs=damaged)
        assert info.value.file == segment_name(1)
        assert info.value.offset == last_at
        assert not inspect_store_json(ROOT, fs=damaged)["ok"]


def test_a_bit_flip_in_the_copy_of_the_last_head_loses_nothing() -> None:
    """Only the copy is damaged: the payload verified, so the batch is kept and the copy
    is written again (a crash in the middle of writing it looks exactly the same)."""
    for bit in range(64):
        fs = CrashableFS(random.Random(2))
        entries, _ = store_with_batches(fs)
        fs.flip_bit(SEGMENT, (fs.size(SEGMENT) - 8) * 8 + bit)
        report = inspect_store_json(ROOT, fs=fs)
        assert report["ok"]
        assert report["segments"][0]["status"] == "damaged copy of the last head"
        assert reopen(fs) == entries
        with DiskStorage.open(ROOT, fs=fs) as store:
            store.append(batch(9, 10))
        assert reopen(fs) == entries + batch(9, 10)


def test_a_bit_flip_in_an_earlier_copy_is_corruption() -> None:
    fs = CrashableFS(random.Random(3))
    _, last_at = store_with_batches(fs)
    fs.flip_bit(SEGMENT, (last_at - 8) * 8 + 3)
    with pytest.raises(StoreCorrupted, match="copy of the record's head"):
        DiskStorage.open(ROOT, fs=fs)


@pytest.mark.parametrize("filler", [b"", b"\x00" * 64, b"\xa5" * 64], ids=["cut", "zeros", "junk"])
def test_a_last_batch_cut_anywhere_is_a_torn_write(filler: bytes) -> None:
    fs = CrashableFS(random.Random(4))
    entries, last_at = store_with_batches(fs)
    whole = fs.read(SEGMENT)
    for cut in range(last_at, len(whole)):
        # What a crash leaves: a prefix of the write, then possibly zeros or junk
        # (never more than the write itself would have covered, here or beyond).
        tail = (whole[:cut] + filler)[: len(whole) + 64]
        if tail[: len(whole)] == whole:
            continue  # the write landed whole
        torn = CrashableFS(random.Random(4))
        torn.makedirs(os.path.join(ROOT, WAL_DIR))
        torn.write_file(SEGMENT, tail)
        report = inspect_store_json(ROOT, fs=torn)
        assert report["ok"], (cut, report["problems"])
        kept = reopen(torn)
        assert kept in (entries[:5], entries), cut
        assert torn.size(SEGMENT) in (last_at, len(whole))


def test_a_torn_write_of_a_new_segment_is_removed_whole() -> None:
    fs = CrashableFS(random.Random(5))
    with DiskStorage.open(ROOT, fs=fs, segment_bytes=100) as store:
        store.append(batch(1, 6))
        store.append(batch(6, 8))  # rolls: header and batch in one write
        names = store.segment_names
    second = os.path.join(ROOT, WAL_DIR, names[-1])
    whole = fs.read(second)
    fs.write_file(second, whole[:20] + bytes(40))
    assert reopen(fs) == batch(1, 6)
    assert not fs.exists(second)


def test_appends_refuse_terms_and_indexes_at_2_63() -> None:
    fs = CrashableFS(random.Random(6))
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append([Entry(1, 2**63 - 1)])
        size = fs.size(SEGMENT)
        with pytest.raises(StoreError, match=r"term 9223372036854775808 is outside \[0, 2\*\*63\)"):
            store.append([Entry(2, 2**63)])
        assert fs.size(SEGMENT) == size
        store.set_hard_state(HardState(2**63 - 1, "a", 1))
    assert reopen(fs) == [Entry(1, 2**63 - 1)]
    text = inspect_store(ROOT, fs=fs)
    assert "OK" in text.splitlines()[0]
    assert "WARNING: hard state: term 9223372036854775807 is above 2**62" in text
    assert "WARNING: wal segment" in text


def plant_v1_store(fs: CrashableFS, segments: list[tuple[int, int, int, list[Entry]]]) -> None:
    wal_dir = os.path.join(ROOT, WAL_DIR)
    fs.makedirs(wal_dir)
    fs.makedirs(os.path.join(ROOT, "snap"))
    for seq, prev_index, prev_term, entries in segments:
        fs.write_file(
            os.path.join(wal_dir, segment_name(seq)),
            wal_v1.segment(seq, prev_index, prev_term, entries),
        )


V1_LOG = [(1, 0, 0, batch(1, 6)), (2, 5, 1, batch(6, 9) + batch(7, 9, term=2))]
V1_ENTRIES = batch(1, 7) + batch(7, 9, term=2)


def test_a_store_written_by_dlm_0_1_opens_and_continues_in_the_new_format() -> None:
    fs = CrashableFS(random.Random(7))
    plant_v1_store(fs, V1_LOG)
    old_bytes = {
        name: fs.read(os.path.join(ROOT, WAL_DIR, name))
        for name in fs.listdir(os.path.join(ROOT, WAL_DIR))
    }
    assert reopen(fs) == V1_ENTRIES
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append(batch(9, 11, term=2))
        store.append(batch(11, 12, term=2))
        assert len(store.segment_names) == 3  # never appended to the 0.1 segment
    for name, data in old_bytes.items():
        assert fs.read(os.path.join(ROOT, WAL_DIR, name)) == data
    assert reopen(fs) == V1_ENTRIES + batch(9, 12, term=2)
    report = inspect_store_json(ROOT, fs=fs)
    assert report["ok"]
    assert [s["version"] for s in report["segments"]] == [1, 1, WAL_VERSION]
    assert "format 1, from dlm 0.1" in inspect_store(ROOT, fs=fs)
    # A conflicting suffix replaced across formats is replayed in order too.
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append(batch(8, 9, term=3))
    assert reopen(fs) == batch(1, 7) + batch(7, 8, term=2) + batch(8, 9, term=3)


def test_a_dlm_0_1_segment_keeps_its_own_tail_rule() -> None:
    """Version 1 cannot tell rot in its last record from a tear: cut, as 0.1 did."""
    fs = CrashableFS(random.Random(8))
    plant_v1_store(fs, V1_LOG[:1])
    path = os.path.join(ROOT, WAL_DIR, segment_name(1))
    fs.flip_bit(path, (fs.size(path) - 3) * 8)
    assert reopen(fs) == batch(1, 5)
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append(batch(5, 7))
    assert reopen(fs) == batch(1, 7)
    # Anywhere before the last record it is corruption, as in 0.1.
    fs = CrashableFS(random.Random(8))
    plant_v1_store(fs, V1_LOG[:1])
    fs.flip_bit(path, 40 * 8)
    with pytest.raises(StoreCorrupted):
        DiskStorage.open(ROOT, fs=fs)


@pytest.mark.parametrize(
    ("field", "value"), [("index", 2**63), ("term", 2**64 - 1), ("term", 2**63)]
)
def test_values_out_of_range_in_a_0_1_segment_are_corruption(field: str, value: int) -> None:
    """0.1 wrote whatever u64 it was given; 2**64 - 1 then crashed the next election."""
    entries = batch(1, 4)
    bad = Entry(4, value, b"") if field == "term" else Entry(value, 1, b"")
    fs = CrashableFS(random.Random(9))
    plant_v1_store(fs, [(1, 0, 0, [*entries, bad])])
    offset = len(wal_v1.header(1, 0, 0) + wal_v1.entries(entries))
    with pytest.raises(StoreCorrupted) as info:
        DiskStorage.open(ROOT, fs=fs)
    assert info.value.offset == offset
    assert f"{field} {value} is outside [0, 2**63)" in str(info.value)
    assert segment_name(1) in str(info.value)


def test_a_forged_batch_with_a_valid_checksum_is_corruption() -> None:
    fs = CrashableFS(random.Random(11))
    store_with_batches(fs)
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append([Entry(9, 1, b"x", EntryKind.NORMAL)])
    data = fs.read(SEGMENT)
    scan = scan_segment(data, segment_name(1), 1, last=True)
    assert scan.problem is None and scan.records == 5
    # A batch that claims more entries than it holds, correctly checksummed.
    forged = bytearray(encode_batch([Entry(10, 1, b"y")]))
    forged[9:13] = struct.pack("<I", 2)
    crc = zlib.crc32(bytes(forged[8:-8]), zlib.crc32(bytes(forged[:4])))
    forged[4:8] = forged[-4:] = struct.pack("<I", crc)
    fs.write_file(SEGMENT, data + bytes(forged))
    with pytest.raises(StoreCorrupted, match="batch promises 2 entries"):
        DiskStorage.open(ROOT, fs=fs)


def test_power_loss_right_after_an_upgrade_roll() -> None:
    fs = CrashableFS(random.Random(12))
    plant_v1_store(fs, V1_LOG)
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append(batch(9, 10, term=2))
    fs.crash(CrashMode.POWER_LOSS)
    assert reopen(fs) == V1_ENTRIES + batch(9, 10, term=2)
