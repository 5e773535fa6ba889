"""The fenced store of the chaos runs: the token rule, and a log the checker can trust."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.checker import OK, WRITE, History, Op, StoreEvent, Verdict, check
from tests.chaos.record import read_records
from tests.chaos.store import StoreClient, StoreRefused, StoreServer


def test_a_lower_token_is_refused_on_read_and_write_once_a_higher_one_was_seen(
    tmp_path: Path,
) -> None:
    server = StoreServer(tmp_path / "store.jsonl").start()
    old, new = StoreClient(server.address), StoreClient(server.address)
    try:
        seen = old.read("k", 5, "old:1")
        assert new.read("k", 6, "new:1") == seen == 0
        assert new.write("k", 6, 0, "new:2") == 1
        with pytest.raises(StoreRefused):
            old.write("k", 5, seen, "old:2")  # a zombie: its read is stale, and refused
        with pytest.raises(StoreRefused):
            old.read("k", 5, "old:3")
        assert new.read("k", 7, "new:3") == 1  # a higher token is always let in
    finally:
        old.close()
        new.close()
        server.stop()
    log = read_records(tmp_path / "store.jsonl")
    assert [(r["client_op"], r["accepted"]) for r in log] == [
        ("old:1", True), ("new:1", True), ("new:2", True), ("old:2", False),
        ("old:3", False), ("new:3", True),
    ]  # fmt: skip
    events = [StoreEvent(**{k: v for k, v in r.items() if k != "k"}) for r in log]
    # The write the client saw acknowledged; without it the final value would be a lost
    # update in reverse (a write nobody made).
    acked = Op("new:2", "new", WRITE, "k", None, events[2].t - 0.001, events[2].t + 0.001, OK, 6)
    verdict: Verdict = check(History(ops=[acked], store=events))
    assert verdict.ok, verdict.violations
    assert verdict.stats["store_refused"] == 2
