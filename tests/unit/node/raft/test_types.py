"""The Ready batch: what the Raft core hands its runtime (dlm/node/raft/types.py)."""

from __future__ import annotations

from dlm.node.raft.types import Ready


def test_ready_is_empty_and_must_persist() -> None:
    assert Ready().is_empty() and not Ready().must_persist()
    assert not Ready(messages_now=(object(),)).is_empty()  # type: ignore[arg-type]
    assert not Ready(messages_now=(object(),)).must_persist()  # type: ignore[arg-type]
