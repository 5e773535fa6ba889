"""What a lock object reports of what it holds (dlm/_api/held.py), without a cluster."""

from __future__ import annotations

import dlm


def test_on_lost_gets_the_lock_unless_it_takes_no_argument() -> None:
    client = dlm.Client("127.0.0.1:1")
    calls: list[object] = []
    with_lock = client.lock("k", on_lost=calls.append)
    with_lock._call_on_lost()
    bare = client.lock("k", on_lost=lambda: calls.append("bare"))
    bare._call_on_lost()
    assert calls == [with_lock, "bare"]
