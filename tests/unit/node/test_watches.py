"""Pushed watches (dlm/node/watches.py): events derived from each applied entry, served by
any member, resumed from an index within the window, COMPACTED beyond it, caps."""

from __future__ import annotations

from typing import Any

from dlm.node import watches
from dlm.node.locks import KeyState
from dlm.wire import ErrorCode

from .machine_driver import Client, Cluster


def started() -> Cluster:
    cluster = Cluster(3)
    cluster.elect("n1")
    return cluster


def events(client: Client, rid: int) -> list[dict[str, Any]]:
    return [
        e for f in client.frames if f.get("t") == "watch" and f["watch"] == rid for e in f["events"]
    ]


def lease(client: Client, name: str, ttl_ms: int = 10_000) -> None:
    assert client.call("open_lease", lease=name, ttl_ms=ttl_ms)["t"] == "ok"


def test_a_watch_on_a_follower_sees_grant_queue_release_and_the_next_grant_as_one_event() -> None:
    cluster = started()
    writer = cluster.connect("n1")
    watcher = cluster.connect("n2")
    rid = watcher.send("watch", key="jobs/a")
    start = watcher.reply(rid)
    assert start is not None and start["t"] == "ok"
    lease(writer, "A")
    lease(writer, "B")
    granted = writer.call("acquire", lease="A", key="jobs/a")
    writer.call("acquire", lease="B", key="jobs/a", wait=True)
    writer.call("acquire", lease="B", key="jobs/other", wait=True)  # another key: not seen
    writer.call("release", lease="A", key="jobs/a")
    cluster.run_until(lambda: len(events(watcher, rid)) >= 3, 2.0, "three events")
    seen = events(watcher, rid)
    assert [(e["event"], e["lease"]) for e in seen] == [
        ("granted", "A"),
        ("queued", "B"),
        ("released", "A"),
    ]
    assert seen[0]["token"] == granted["token"] and seen[1]["token"] is None
    assert [g["lease"] for g in seen[2]["granted"]] == ["B"]
    assert seen[2]["granted"][0]["token"] == seen[2]["index"]
    assert [e["index"] for e in seen] == sorted(e["index"] for e in seen)


def test_a_watch_resumed_from_an_index_gets_exactly_the_events_after_it() -> None:
    cluster = started()
    writer = cluster.connect("n1")
    first = cluster.connect("n3")
    rid = first.send("watch", prefix="p/")
    lease(writer, "A")
    for key in ("p/1", "p/2", "p/3"):
        writer.call("acquire", lease="A", key=key)
    cluster.run_until(lambda: len(events(first, rid)) == 3, 2.0, "three events")
    seen = events(first, rid)
    again = cluster.connect("n2")  # another member: the same log, the same events
    rid2 = again.send("watch", prefix="p/", after=seen[0]["index"])
    cluster.run_until(lambda: len(events(again, rid2)) == 2, 2.0, "the two after")
    assert events(again, rid2) == seen[1:]


def test_an_expiry_that_grants_the_next_waiter_is_one_expired_event() -> None:
    cluster = started()
    writer = cluster.connect("n1")
    watcher = cluster.connect("n1")
    rid = watcher.send("watch", key="k")
    lease(writer, "A", ttl_ms=1000)
    lease(writer, "B", ttl_ms=60_000)
    writer.call("acquire", lease="A", key="k")
    writer.call("acquire", lease="B", key="k", wait=True)
    # Only B is kept alive: A expires and B gets the key in the same entry.
    for _ in range(40):
        writer.call("keepalive", lease="B")
        cluster.advance(0.1)
    seen = events(watcher, rid)
    assert [e["event"] for e in seen] == ["granted", "queued", "expired"]
    assert seen[2]["lease"] == "A" and seen[2]["granted"][0]["lease"] == "B"


def test_a_prefix_watcher_gets_every_key_an_entry_changed() -> None:
    """A close of a lease holding two keys is one entry with two changes (the simulator
    found a hub that gave a watcher only the first change of an entry)."""
    cluster = started()
    writer = cluster.connect("n1")
    watcher = cluster.connect("n2")
    rid = watcher.send("watch", prefix="m/")
    lease(writer, "A")
    writer.call("acquire", lease="A", key="m/1")
    writer.call("acquire", lease="A", key="m/2")
    closed = writer.call("close_lease", lease="A")
    assert closed["t"] == "ok"
    cluster.run_until(lambda: len(events(watcher, rid)) >= 4, 2.0, "four events")
    last_two = events(watcher, rid)[2:]
    assert [(e["key"], e["event"]) for e in last_two] == [("m/1", "released"), ("m/2", "released")]
    assert last_two[0]["index"] == last_two[1]["index"]


def test_resuming_below_the_window_is_answered_compacted() -> None:
    cluster = started()
    for member in cluster.members.values():
        member.machine.watches.ring_events = 2
    writer = cluster.connect("n1")
    lease(writer, "A")
    for key in ("a", "b", "c", "d"):
        writer.call("acquire", lease="A", key=key)
    watcher = cluster.connect("n1")
    answer = watcher.call("watch", prefix="", after=1)
    assert answer["t"] == "error" and answer["code"] == ErrorCode.COMPACTED
    floor = cluster.members["n1"].machine.watches.floor
    resumed = watcher.call("watch", prefix="", after=floor)
    assert resumed["t"] == "ok"
    assert len(events(watcher, resumed["id"])) == 2


def test_a_watch_names_exactly_one_of_key_and_prefix_and_connections_are_capped() -> None:
    cluster = started()
    watcher = cluster.connect("n1")
    assert watcher.call("watch")["code"] == ErrorCode.BAD_REQUEST
    assert watcher.call("watch", key="k", prefix="k")["code"] == ErrorCode.BAD_REQUEST
    for _ in range(watches.MAX_PER_CONNECTION):
        assert watcher.call("watch", key="k")["t"] == "ok"
    assert watcher.call("watch", key="k")["code"] == ErrorCode.QUOTA_EXCEEDED
    watcher.close()
    assert not cluster.members["n1"].machine.watches.watchers


def test_changes_are_derived_from_the_state_before_and_after() -> None:
    holder = KeyState((("A", 5, {"value": "x"}),), ())
    proclaimed = KeyState((("A", 5, {"value": "y"}),), ())
    event = watches.changes(9, "k", holder, proclaimed)
    assert event is not None and (event.event, event.token, event.value) == (
        "proclaimed",
        5,
        {"value": "y"},
    )
    assert watches.changes(9, "k", holder, holder) is None
    left = watches.changes(9, "k", KeyState(holder.holders, ("B",)), holder)
    assert left is not None and (left.event, left.lease) == ("left_queue", "B")
    gone = watches.changes(9, "k", holder, None, expired=("A",))
    assert gone is not None and (gone.event, gone.token) == ("expired", 5)


def test_a_new_keys_event_is_the_one_an_empty_key_state_gives() -> None:
    """``changes`` reads a key the entry made (before None) by a shortcut: every holder and
    waiter new. It must give what the general comparison gives from an empty state."""
    empty = KeyState((), ())
    afters: list[KeyState | None] = [
        None,
        empty,
        KeyState((("A", 7, {"owner": "o"}),), ()),
        KeyState((("A", 7, {}), ("B", 8, {"x": "y"}), ("C", 9, {})), ()),
        KeyState((("A", 7, {}),), ("B", "C")),
        KeyState((), ("B",)),
        KeyState((), ("B", "C")),
    ]
    for after in afters:
        fast = watches.changes(12, "k", None, after, expired=("A",), at_ms=5)
        general = watches.changes(12, "k", empty, after, expired=("A",), at_ms=5)
        assert fast == general, after
    assert watches.changes(12, "k", None, afters[3]) is not None


def test_the_window_counts_each_event_once_and_keeps_whole_indexes() -> None:
    from dlm.node.outbox import Outbox
    from dlm.node.stats import Stats

    hub = watches.Watches(Outbox(Stats(), set()), Stats(), 0)
    hub.ring_events, hub.ring_bytes = 50, 4_000
    for index in range(1, 400):
        for key in ("a", "b/" + "x" * (index % 7)):  # two events an index, sizes vary
            meta = {"owner": "o" * (index % 40)}
            hub._record(watches.Event(index, key, watches.GRANTED, "L", index, meta))
        assert hub._ring_size == sum(event.size() for event in hub.ring) <= hub.ring_bytes
        assert len(hub.ring) <= hub.ring_events
        assert all(event.index > hub.floor for event in hub.ring)
        assert hub.ring[0].index == hub.floor + 1  # whole indexes go
