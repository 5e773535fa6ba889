"""The pure membership rules: what a single change does, and the history of configurations."""

from __future__ import annotations

import pytest

from dlm.node.raft.membership import (
    ConfHistory,
    apply_change,
    check_change,
    conf_after_entry,
    includes,
)
from dlm.records import ConfChange, ConfChangeKind, ConfState, Entry, EntryKind, encode_conf_change

ADD, PROMOTE, REMOVE = ConfChangeKind.ADD_LEARNER, ConfChangeKind.PROMOTE, ConfChangeKind.REMOVE
CONF = ConfState(("a", "b", "c"), ("l",))


@pytest.mark.parametrize(
    ("change", "after"),
    [
        (ConfChange(ADD, "d"), ConfState(("a", "b", "c"), ("l", "d"))),
        (ConfChange(PROMOTE, "l"), ConfState(("a", "b", "c", "l"), ())),
        (ConfChange(REMOVE, "b"), ConfState(("a", "c"), ("l",))),
        (ConfChange(REMOVE, "l"), ConfState(("a", "b", "c"), ())),
    ],
)
def test_changes_that_apply(change: ConfChange, after: ConfState) -> None:
    assert check_change(CONF, change) is None
    assert apply_change(CONF, change) == after


@pytest.mark.parametrize(
    ("conf", "change", "why"),
    [
        (CONF, ConfChange(ADD, "a"), "already a member"),
        (CONF, ConfChange(ADD, "l"), "already a member"),
        (CONF, ConfChange(ADD, ""), "must not be empty"),
        (CONF, ConfChange(PROMOTE, "a"), "already a voter"),
        (CONF, ConfChange(PROMOTE, "zz"), "not a member"),
        (CONF, ConfChange(REMOVE, "zz"), "not a member"),
        (ConfState(("a",)), ConfChange(REMOVE, "a"), "last voter"),
    ],
)
def test_changes_that_do_not_apply(conf: ConfState, change: ConfChange, why: str) -> None:
    reason = check_change(conf, change)
    assert reason is not None and why in reason


def conf_entry(index: int, change: ConfChange) -> Entry:
    return Entry(index, 1, encode_conf_change(change), EntryKind.CONF_CHANGE)


def test_conf_after_entry_ignores_what_changes_nothing() -> None:
    assert conf_after_entry(CONF, Entry(1, 1, b"x")) is None
    assert conf_after_entry(CONF, Entry(1, 1, b"\x01garbage", EntryKind.CONF_CHANGE)) is None
    assert conf_after_entry(CONF, conf_entry(1, ConfChange(ADD, "a"))) is None
    assert conf_after_entry(CONF, conf_entry(1, ConfChange(ADD, "d"))) == ConfState(
        ("a", "b", "c"), ("l", "d")
    )
    assert includes(CONF, "l") and includes(CONF, "a") and not includes(CONF, "d")


def test_history_follows_the_log() -> None:
    base = ConfState(("a", "b", "c"))
    h = ConfHistory(10, base)
    one = ConfState(("a", "b", "c"), ("d",))
    two = ConfState(("a", "b", "c", "d"))
    h.push(12, one)
    h.push(15, two)
    assert (h.latest, h.latest_index, h.base_index) == (two, 15, 10)
    assert [h.at(i) for i in (10, 11, 12, 14, 15, 99)] == [base, base, one, one, two, two]
    with pytest.raises(ValueError):
        h.at(9)
    assert h.since(11) == [(12, one), (15, two)]
    assert h.since(15) == []
    assert not h.truncate(16)  # nothing at or after 16
    assert h.truncate(13)  # the log lost 13.. : the change at 15 goes
    assert (h.latest, h.latest_index) == (one, 12)
    assert h.truncate(5)  # below the base: the base stays
    assert (h.latest, h.latest_index) == (base, 10)
    assert "ConfHistory" in repr(h)


def test_history_forgets_only_what_is_superseded() -> None:
    base = ConfState(("a",))
    h = ConfHistory(0, base)
    for i, name in enumerate("bcd", start=1):
        h.push(i * 10, ConfState(("a",), (name,)))
    h.forget_before(15)  # the configuration in force at 15 (from 10) stays
    assert h.base_index == 10 and h.at(15) == ConfState(("a",), ("b",))
    h.forget_before(5)  # already gone: nothing to do
    assert h.base_index == 10
