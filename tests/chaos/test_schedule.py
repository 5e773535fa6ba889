"""Fault schedules are a pure function of their seed, and cover what they promise."""

from __future__ import annotations

from tests.chaos.schedule import KINDS, SHORT_ORDER, make_schedule


def test_a_seed_gives_the_same_schedule_every_time() -> None:
    assert make_schedule(7) == make_schedule(7)
    assert make_schedule(7) != make_schedule(8)


def test_the_short_schedules_of_make_test_cover_twelve_kinds_on_both_sizes() -> None:
    short = [make_schedule(seed, "short") for seed in (0, 1, 2)]
    kinds = {f.kind for s in short for f in s.faults}
    assert len(kinds) == 12
    assert {s.size for s in short} == {3, 5}
    assert set(SHORT_ORDER) == set(KINDS)


def test_thirty_long_schedules_use_every_kind_and_both_sizes() -> None:
    long = [make_schedule(seed) for seed in range(100, 130)]
    assert {f.kind for s in long for f in s.faults} == set(KINDS)
    assert {s.size for s in long} == {3, 5}
    for s in long:
        starts = [f.at for f in s.faults]
        assert starts == sorted(starts)
        assert all(f.at + f.duration < s.length for f in s.faults)
