"""The hard state file: terms and commit indexes stay within what it can store and read back."""

from __future__ import annotations

import os
import random
import struct
import zlib

import pytest

from dlm.records import Entry, HardState
from dlm.store import StoreCorrupted, StoreError
from dlm.store.disk import DiskStorage
from dlm.store.fs import CrashableFS
from dlm.store.inspect import inspect_store_json
from dlm.store.state import MAGIC, VERSION

ROOT = "/node"


@pytest.mark.parametrize("term", [2**63, 2**64 - 1, 2**64, 2**70])
def test_a_term_at_or_above_2_63_is_refused_before_anything_is_written(term: int) -> None:
    """2**64 once crashed the member with struct.error; 2**64 - 1 was persisted and then
    crashed every member at its next campaign (term + 1 did not fit)."""
    fs = CrashableFS(random.Random(1))
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.set_hard_state(HardState(5, "a", 0))
        before = fs.read(os.path.join(ROOT, "state"))
        with pytest.raises(StoreError, match=r"refusing to persist the hard state: term \d+ is"):
            store.set_hard_state(HardState(term, None, 0))
        with pytest.raises(StoreError, match="commit index"):
            store.set_hard_state(HardState(6, None, term))
        assert store.initial_state()[0] == HardState(5, "a", 0)
        assert fs.read(os.path.join(ROOT, "state")) == before
    with DiskStorage.open(ROOT, fs=fs) as store:
        assert store.initial_state()[0] == HardState(5, "a", 0)


def test_the_largest_term_is_stored_and_read_back() -> None:
    fs = CrashableFS(random.Random(2))
    with DiskStorage.open(ROOT, fs=fs) as store:
        store.append([Entry(1, 2**63 - 1)])
        store.set_hard_state(HardState(2**63 - 1, "a", 1))
    with DiskStorage.open(ROOT, fs=fs) as store:
        assert store.initial_state()[0] == HardState(2**63 - 1, "a", 1)


def planted_state(term: int, commit: int) -> bytes:
    """A hard state file as dlm 0.1 wrote it, whatever u64 it was given."""
    body = struct.pack("<4sBQQ", MAGIC, VERSION, term, commit) + b"\xff\xff" + b"\x00"
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize(
    ("term", "commit", "offset", "what"),
    [(2**64 - 1, 0, 5, "term 18446744073709551615"), (3, 2**63, 13, "commit index 2**63")],
)
def test_a_stored_value_out_of_range_is_corruption_at_its_offset(
    term: int, commit: int, offset: int, what: str
) -> None:
    fs = CrashableFS(random.Random(3))
    fs.makedirs(ROOT)
    fs.write_file(os.path.join(ROOT, "state"), planted_state(term, commit))
    with pytest.raises(StoreCorrupted) as info:
        DiskStorage.open(ROOT, fs=fs)
    assert info.value.offset == offset
    message = str(info.value).replace(str(2**63), "2**63")
    assert f"hard state state is corrupt at byte {offset} ({what} is outside [0, 2**63))" in message
    report = inspect_store_json(ROOT, fs=fs)
    assert not report["ok"]
    assert any(f"byte {offset}" in p for p in report["problems"])
