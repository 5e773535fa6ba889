"""The replies a member sends, pinned to their bytes: a scripted session that draws every
kind of answer (each lock and lease result, every read, the status and members views,
from the leader and from a follower) must give the frames it gave before the replies
were built as records (dlm/node/replies.py). Field order is part of the bytes.

Regenerate (only for a deliberate protocol change) with
``python -m tests.unit.node.test_replies``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cbor2

from .machine_driver import Cluster

GOLDEN = Path(__file__).parent / "testdata" / "replies_golden.json"


def session() -> list[str]:
    """Every frame the clients of one scripted session received, as CBOR hex."""
    cluster = Cluster(3)
    cluster.elect("n1")
    a, b = cluster.connect("n1"), cluster.connect("n1")
    follower = cluster.connect("n2")
    a.call("ping")
    a.call("open_lease", lease="A", ttl_ms=10_000, meta={"host": "h"})
    b.call("open_lease", lease="B", ttl_ms=10_000, ephemeral=True)
    a.call("keepalive", lease="A", client="client-a", seq=1)
    a.call("acquire", lease="A", key="k", meta={"pid": "1"})
    b.call("acquire", lease="B", key="k")  # LOCKED, naming the holder
    b.call("acquire", lease="B", key="k", wait=True)  # queued
    for request in ("get", "list", "lease_list", "status", "members"):
        fields = {"key": "k"} if request == "get" else {}
        a.call(request, **fields)
        follower.call(request, stale=True, **fields) if request != "members" else None
    a.call("lease_info", lease="A")
    a.call("lease_update", lease="A", ttl_ms=5_000, finished=True)
    a.call("get", key="k")  # a finished hold: its end is shown
    b.call("release", lease="B", key="other")  # NOT_HOLDER
    a.call("release", lease="A", key="k")  # B is granted by a push
    b.call("release", lease="B", key="k")  # the ephemeral lease ends with it
    a.call("close_lease", lease="A")
    a.call("keepalive", lease="A")  # gone: closed
    a.call("lease_info", lease="Z")  # gone: unknown
    a.call("close_lease", lease="A", seq=1)  # answered before
    a.call("acquire", lease="A", key="k", limit=5000)  # refused before it is proposed
    a.call("member_remove", member="n3", force=True)
    frames = [*a.frames, *b.frames, *follower.frames]
    return [cbor2.dumps(frame).hex() for frame in frames]


def test_a_scripted_session_gets_the_golden_reply_bytes() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = session()
    assert len(now) == len(golden)
    for was, is_now in zip(golden, now, strict=True):
        assert is_now == was, (cbor2.loads(bytes.fromhex(was)), cbor2.loads(bytes.fromhex(is_now)))


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(session(), indent=0) + "\n")
    sys.exit(0)
