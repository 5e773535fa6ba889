"""The partition function is part of the data format: these values must never change."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm.partitioning import (
    MAX_PARTITIONS,
    PREAMBLE_SIZE,
    check_partitions,
    partition_of,
    partition_order,
    preamble,
    read_preamble,
)


def test_the_function_is_blake2b_of_the_utf8_key_modulo_the_count() -> None:
    import hashlib

    for key in ("a", "nightly-report", "ci/build", "ключ", ""):
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        for count in (2, 3, 4, 16, 64):
            assert partition_of(key, count) == int.from_bytes(digest, "big") % count


def test_fixed_values_never_change() -> None:
    # Pinned once from the documented definition: a change here breaks every cluster that
    # has data (a member would refuse its own keys after an upgrade).
    assert [partition_of(k, 4) for k in "abcdefgh"] == [3, 1, 3, 3, 3, 3, 0, 0]
    assert partition_of("nightly-report", 4) == 1


@given(st.text(max_size=40), st.integers(min_value=1, max_value=MAX_PARTITIONS))
def test_every_key_has_one_partition_in_range(key: str, count: int) -> None:
    assert 0 <= partition_of(key, count) < count
    assert partition_of(key, 1) == 0


def test_keys_are_taken_in_one_global_order() -> None:
    keys = [f"k{i}" for i in range(40)]
    first = partition_order(keys, 4)
    second = partition_order(list(reversed(keys)), 4)
    assert first == second
    assert [p for p, _ in first] == sorted(p for p, _ in first)
    assert sorted(k for _, ks in first for k in ks) == sorted(keys)


@pytest.mark.parametrize("count", [0, -1, MAX_PARTITIONS + 1, True, 2.0])
def test_bad_counts_are_refused(count: object) -> None:
    assert check_partitions(count) is not None  # type: ignore[arg-type]


def test_preambles_round_trip_and_strangers_are_told_apart() -> None:
    assert preamble(0) == b""
    for p in (1, 7, MAX_PARTITIONS - 1):
        raw = preamble(p)
        assert len(raw) == PREAMBLE_SIZE
        assert read_preamble(raw) == p
    assert read_preamble(b"\x00\x00\x00\x10") == 0  # a frame's length prefix
    assert read_preamble(b"\x16\x03\x01") == 0  # a TLS ClientHello
    assert read_preamble(b"\xffDLMX\x01") is None
    assert read_preamble(b"\xffDLMP\x00") is None
    assert read_preamble(b"\xffDLMP" + bytes([MAX_PARTITIONS])) is None
    with pytest.raises(ValueError):
        preamble(MAX_PARTITIONS)
