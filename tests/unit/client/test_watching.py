"""The client's watch decisions (dlm/client/watching.py): resume point, dedupe, the answers
that end a watch, giving up, and an election followed through its key's changes."""

from __future__ import annotations

from typing import Any

import pytest

from dlm.client.errors import BadRequest, ClusterUnavailable, PermissionDenied
from dlm.client.watching import Observer, WatchBroken, WatchCompacted, WatchStream, parse_event


def push(*events: dict[str, Any], watch: int = 3) -> dict[str, Any]:
    return {"t": "watch", "watch": watch, "events": list(events)}


def change(index: int, event: str = "granted", **extra: Any) -> dict[str, Any]:
    return {"key": "k", "event": event, "index": index, "lease": "L", "token": index, **extra}


def test_a_resumed_watch_asks_after_the_last_index_and_drops_what_it_saw() -> None:
    stream = WatchStream("k", None, None, timeout=5)
    assert stream.request()["after"] is None
    assert stream.started({"t": "ok", "index": 10, "id": 3}, "n1")
    assert [e.index for e in stream.take(push(change(11), change(12)), 3)] == [11, 12]
    assert stream.request()["after"] == 12
    # Another member resumes; a frame it repeats (it had been pushed before) is dropped.
    assert stream.started({"t": "ok", "index": 12, "id": 1}, "n2")
    assert [e.index for e in stream.take(push(change(12), change(13), watch=1), 1)] == [13]
    assert stream.take(push(change(14), watch=9), 1) == []  # another watch's frame


def test_the_answers_that_end_a_watch() -> None:
    stream = WatchStream(None, "p/", 5, timeout=5)
    with pytest.raises(WatchCompacted):
        stream.started({"t": "error", "code": "COMPACTED", "message": "gone", "floor": 9}, "n1")
    with pytest.raises(PermissionDenied):
        stream.started({"t": "error", "code": "PERMISSION_DENIED", "message": "no"}, "n1")
    with pytest.raises(BadRequest, match="n1 does not serve watches"):
        stream.started(
            {"t": "error", "code": "BAD_REQUEST", "message": "unknown request type 'watch'"}, "n1"
        )
    assert not stream.started({"t": "error", "code": "UNAVAILABLE", "message": "full"}, "n1")
    with pytest.raises(WatchBroken):
        stream.take({"t": "watch_end", "watch": 3, "code": "TOO_LARGE", "message": "slow"}, 3)
    with pytest.raises(WatchBroken):
        parse_event({"key": "k", "event": "granted", "index": -1, "lease": "L"})


def test_it_gives_up_only_after_the_timeout_without_any_member() -> None:
    stream = WatchStream("k", None, None, timeout=5)
    assert stream.failed(100.0, 3) == 0.0  # the next member at once
    assert stream.failed(100.1, 3) == 0.0
    assert stream.failed(100.2, 3) > 0  # a pause after a whole round
    with pytest.raises(ClusterUnavailable, match="--timeout 5s"):
        stream.failed(105.0, 3)


def test_an_observer_says_each_new_leader_and_value_once() -> None:
    observer = Observer("svc")
    first = observer.start("A", 7, {"value": "a"}, 1000, 7)
    assert (first.value, first.token) == ("a", 7)
    queued = parse_event(change(8, "queued", token=None, lease="B"))
    assert observer.change(queued) is None
    handover = parse_event(
        change(9, "expired", token=7, granted=[{"lease": "B", "token": 9, "value": {"value": "b"}}])
    )
    said = observer.change(handover)
    assert said is not None and (said.lease, said.value, said.token) == ("B", "b", 9)
    proclaimed = parse_event(change(10, "proclaimed", token=9, lease="B", value={"value": "c"}))
    said = observer.change(proclaimed)
    assert said is not None and (said.value, said.token) == ("c", 9)
    gone = observer.change(parse_event(change(11, "released", token=9, lease="B")))
    assert gone is not None and gone.to_json()["value"] is None and gone.token is None
