"""Pushed watches: every change of a key, or of the keys under a prefix, as it is applied.

Every member applies the same log, so every member (followers too) can serve a watch
from its own applied state; the client talks to whichever member it reached. What
changed is derived from the effect of each applied entry on a key's state, never from
the kind of command: the lock machine records each key an entry touches with its state
before the entry (``ApplyOutcome.before``, through ``LockStateMachine._touch``), and
``changes`` compares it with the state after (``key_state``). So a new kind of change (a proclaimed
value, a lock-delay ending) shows without this room learning of it.

One event per key per log entry, in log order: ``granted``, ``released``, ``expired``
(a holder's lease ended by expiry), ``queued``, ``left_queue`` and ``proclaimed`` (a
holder's value changed without a new grant). A release or an expiry that grants the
key to the next waiter in the same entry is one event, with the new grant(s) in
``granted``.

The window: the hub keeps the most recent events of all keys, at most ``RING_EVENTS``
of them and ``RING_BYTES`` of their estimated encoded size, and ``floor``: every event
above that index is kept. A watch asking to resume after an index below the floor is
answered COMPACTED (re-read, then watch from now). A member's floor starts at the
index of the image it started from or installed; a restarted member applies its log
again from there, which rebuilds the events above it.

Caps: ``MAX_PER_CONNECTION`` watches on one connection and ``MAX_PER_MEMBER`` on one
member. A watcher that does not read is cut off by the runtime when its connection's
unsent bytes pass ``WATCH_BUFFER_BYTES`` (``cut_off``), never buffered further.

Pure: part of the node machine (machine.py), driven by the runtime and the simulator.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlm.node.locks import key_state
from dlm.wire import ErrorCode, error, ok, watch_end, watch_push

if TYPE_CHECKING:
    from collections.abc import Iterable

    from dlm.node.locks import ApplyOutcome, KeyState, LockStateMachine
    from dlm.node.outbox import Outbox
    from dlm.node.stats import Stats
    from dlm.wire import Watch

RING_EVENTS = 16_384
"""Most events a member keeps for watchers resuming after a reconnect."""
RING_BYTES = 1 << 20
"""Most estimated encoded bytes of the kept events (1 MiB: a resume of a whole-cluster
watch replays at most this, well under WATCH_BUFFER_BYTES)."""
MAX_PER_CONNECTION = 16
"""Watches one client connection may hold."""
MAX_PER_MEMBER = 4096
"""Watches one member serves at once."""
WATCH_BUFFER_BYTES = 2 << 20
"""Unsent bytes of a watching connection beyond which the runtime cuts it off."""
EVENTS_PER_FRAME = 256
"""Events in one pushed frame, past which the next frame starts at the next log entry
(a frame stays far under the client's frame limit)."""

GRANTED = "granted"
RELEASED = "released"
EXPIRED = "expired"
QUEUED = "queued"
LEFT_QUEUE = "left_queue"
PROCLAIMED = "proclaimed"
EVENTS = (GRANTED, RELEASED, EXPIRED, QUEUED, LEFT_QUEUE, PROCLAIMED)


@dataclass(frozen=True, slots=True)
class Event:
    """One key's change at one log index. ``lease`` and ``token`` name the grant (or the
    place in the queue: no token) the event is about; ``value`` is that holder's
    metadata (granted, proclaimed); ``granted``: (lease, token, metadata) of grants the
    same entry made after a release or an expiry."""

    index: int
    key: str
    event: str
    lease: str
    token: int | None
    value: dict[str, str] | None = None
    granted: tuple[tuple[str, int, dict[str, str]], ...] = ()
    at_ms: int = 0
    """The entry's stamp (the proposing leader's wall clock, ms): when it happened."""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "event": self.event,
            "index": self.index,
            "lease": self.lease,
            "token": self.token,
            "at_ms": self.at_ms,
        }
        if self.value is not None:
            out["value"] = self.value
        if self.granted:
            out["granted"] = [
                {"lease": lease, "token": token, "value": meta}
                for lease, token, meta in self.granted
            ]
        return out

    def size(self) -> int:
        """An estimate of its encoded bytes (what the ring counts)."""
        meta = sum(len(k) + len(v) + 2 for k, v in (self.value or {}).items())
        for lease, _token, value in self.granted:
            meta += len(lease) + 16 + sum(len(k) + len(v) + 2 for k, v in value.items())
        return 48 + len(self.key) + len(self.lease) + meta


def changes(
    index: int,
    key: str,
    before: KeyState | None,
    after: KeyState | None,
    *,
    expired: Iterable[str] = (),
    at_ms: int = 0,
) -> Event | None:
    """What entry ``index`` (stamped ``at_ms``) did to ``key`` (state ``before`` ->
    ``after``), as one event; None if nothing a watcher sees changed. ``expired``: the
    leases the entry expired."""
    if before is None:
        # A key the entry made (every grant of a fresh key, the bulk of a long log's
        # replay): all its holders are new, and so are all its waiters.
        if after is None:
            return None
        if after.holders:
            lid, token, meta = after.holders[0]
            return Event(index, key, GRANTED, lid, token, dict(meta), after.holders[1:], at_ms)
        if after.waiters:
            return Event(index, key, QUEUED, after.waiters[0], None, None, (), at_ms)
        return None
    held_before = {lid: (token, meta) for lid, token, meta in (before.holders if before else ())}
    held_after = {lid: (token, meta) for lid, token, meta in (after.holders if after else ())}
    waiting_before = before.waiters if before else ()
    waiting_after = after.waiters if after else ()
    gone = [lid for lid in held_before if held_after.get(lid, (None,))[0] != held_before[lid][0]]
    new = [
        (lid, token, meta)
        for lid, (token, meta) in held_after.items()
        if held_before.get(lid, (None,))[0] != token
    ]
    if gone:
        lid = gone[0]
        kind = EXPIRED if lid in set(expired) else RELEASED
        return Event(index, key, kind, lid, held_before[lid][0], None, tuple(new), at_ms)
    if new:
        lid, token, meta = new[0]
        return Event(index, key, GRANTED, lid, token, dict(meta), tuple(new[1:]), at_ms)
    for lid, (token, meta) in held_after.items():
        if held_before[lid][1] != meta:
            return Event(index, key, PROCLAIMED, lid, token, dict(meta), (), at_ms)
    queued = [lid for lid in waiting_after if lid not in waiting_before]
    if queued:
        return Event(index, key, QUEUED, queued[0], None, None, (), at_ms)
    left = [lid for lid in waiting_before if lid not in waiting_after]
    if left:
        return Event(index, key, LEFT_QUEUE, left[0], None, None, (), at_ms)
    return None


@dataclass(slots=True, eq=False)
class Watcher:
    conn: int
    rid: int
    key: str | None
    prefix: str | None
    after: int
    """The index the watch starts after: it is given the changes of later entries only
    (a member behind the index a resuming client asked for skips what it saw)."""
    given: int = 0
    """The last index it was given (or ``after``): what an installed image must not pass."""
    pending: list[dict[str, Any]] = field(default_factory=list)

    def wants(self, event: Event) -> bool:
        if event.index <= self.after:
            return False
        if self.key is not None:
            return event.key == self.key
        assert self.prefix is not None
        return event.key.startswith(self.prefix)


class Watches:
    """The member's watchers and its window of recent events."""

    ring_events = RING_EVENTS
    ring_bytes = RING_BYTES
    max_per_connection = MAX_PER_CONNECTION
    max_per_member = MAX_PER_MEMBER

    def __init__(self, out: Outbox, stats: Stats, floor: int) -> None:
        self.out = out
        self.stats = stats
        self.floor = floor
        """Every event above this index is in the ring."""
        self.ring: deque[Event] = deque()
        self._sizes: deque[int] = deque()
        """The estimated size of each event of ``ring``, in step: counted once per event."""
        self._ring_size = 0
        self.watchers: dict[tuple[int, int], Watcher] = {}
        self._by_key: dict[str, list[Watcher]] = {}
        self._by_prefix: list[Watcher] = []
        self._dirty: list[Watcher] = []
        self.per_connection: dict[int, int] = {}
        """Watches by connection (the runtime asks whether a connection watches)."""

    # -- requests ----------------------------------------------------------------

    def request(self, conn: int, req: Watch, applied: int) -> None:
        """Starts the watch ``req`` on ``conn`` (a member applied up to ``applied``)."""
        problem = None
        if (req.key is None) == (req.prefix is None):
            problem = "a watch names either a key or a prefix (exactly one of the two)"
        elif (conn, req.id) in self.watchers:
            problem = f"this connection has a watch with id {req.id} already"
        if problem is not None:
            self.out.answer(conn, req.TYPE, error(req.id, ErrorCode.BAD_REQUEST, problem))
            return
        if self.per_connection.get(conn, 0) >= self.max_per_connection:
            message = (
                f"a connection holds at most {self.max_per_connection} watches: "
                "open another connection, or watch a prefix"
            )
            self.out.answer(conn, req.TYPE, error(req.id, ErrorCode.QUOTA_EXCEEDED, message))
            return
        if len(self.watchers) >= self.max_per_member:
            message = (
                f"this member serves {self.max_per_member} watches already: "
                "try another member, or later"
            )
            self.out.answer(
                conn, req.TYPE, error(req.id, ErrorCode.UNAVAILABLE, message, retry_after_ms=1000)
            )
            return
        after = applied if req.after is None else req.after
        if after < self.floor:
            message = (
                f"changes after index {after} are no longer kept here (this member keeps "
                f"those after {self.floor}): read the key again, then watch from now"
            )
            self.out.answer(
                conn, req.TYPE, error(req.id, ErrorCode.COMPACTED, message, floor=self.floor)
            )
            return
        watcher = Watcher(conn, req.id, req.key, req.prefix, after, after)
        self.watchers[(conn, req.id)] = watcher
        self.per_connection[conn] = self.per_connection.get(conn, 0) + 1
        if req.key is not None:
            self._by_key.setdefault(req.key, []).append(watcher)
        else:
            self._by_prefix.append(watcher)
        self.stats.watches_started += 1
        self.out.answer(conn, req.TYPE, ok(req.id, index=after, applied=applied))
        for event in self.ring:
            if watcher.wants(event):
                self._queue(watcher, event)
        self.flush()

    def closed(self, conn: int) -> None:
        if conn in self.per_connection:
            for key in [k for k in self.watchers if k[0] == conn]:
                self._drop(self.watchers[key])

    def cut_off(self, conn: int, reason: str) -> list[dict[str, Any]]:
        """The runtime cuts ``conn`` off (it did not read what was pushed to it): its
        watches end; returns the frames that say why, for the runtime to write last."""
        if conn not in self.per_connection:
            return []
        mine = [w for w in self.watchers.values() if w.conn == conn]
        for watcher in mine:
            self.stats.watchers_cut_off += 1
            self._drop(watcher)
        self.out.log("warning", "watcher_cut_off", conn=conn, watches=len(mine), reason=reason)
        return [watch_end(w.rid, ErrorCode.TOO_LARGE, reason) for w in mine]

    def _drop(self, watcher: Watcher) -> None:
        if self.watchers.pop((watcher.conn, watcher.rid), None) is None:
            return
        left = self.per_connection[watcher.conn] - 1
        if left:
            self.per_connection[watcher.conn] = left
        else:
            del self.per_connection[watcher.conn]
        if watcher.key is not None:
            same = self._by_key.get(watcher.key, [])
            if watcher in same:
                same.remove(watcher)
            if not same:
                self._by_key.pop(watcher.key, None)
        elif watcher in self._by_prefix:
            self._by_prefix.remove(watcher)

    # -- applying ----------------------------------------------------------------

    def applied(self, outcome: ApplyOutcome, machine: LockStateMachine) -> None:
        """Entry ``outcome.index`` was applied: its changes go to the ring and the
        watchers (pushed at ``flush``)."""
        at_ms = outcome.command.at_ms if outcome.command is not None else 0
        for key, before in outcome.before:
            after = key_state(machine, key)
            event = changes(outcome.index, key, before, after, expired=outcome.expired, at_ms=at_ms)
            if event is not None:
                self._record(event)

    def _record(self, event: Event) -> None:
        ring, sizes = self.ring, self._sizes
        size = event.size()
        ring.append(event)
        sizes.append(size)
        self._ring_size += size
        while len(ring) > self.ring_events or self._ring_size > self.ring_bytes:
            # Whole indexes go: every event above the floor stays in the ring.
            self.floor = ring[0].index
            while ring and ring[0].index <= self.floor:
                ring.popleft()
                self._ring_size -= sizes.popleft()
        watchers = self._by_key.get(event.key, ())
        for watcher in (*watchers, *self._by_prefix) if self._by_prefix else watchers:
            if watcher.wants(event):
                self._queue(watcher, event)

    def _queue(self, watcher: Watcher, event: Event) -> None:
        if not watcher.pending:
            self._dirty.append(watcher)
        watcher.pending.append(event.to_wire())
        # Not ``after``: the entry's changes of other keys are still to come.
        watcher.given = max(watcher.given, event.index)

    def flush(self) -> None:
        """Pushes what each watcher has pending (one frame per EVENTS_PER_FRAME events)."""
        dirty, self._dirty = self._dirty, []
        for watcher in dirty:
            events, watcher.pending = watcher.pending, []
            if (watcher.conn, watcher.rid) not in self.watchers:
                continue
            start = 0
            while start < len(events):
                # A frame ends with a whole log entry: a client resuming after the last
                # index of the frames it got misses nothing of that entry.
                end = min(start + EVENTS_PER_FRAME, len(events))
                while end < len(events) and events[end]["index"] == events[end - 1]["index"]:
                    end += 1
                chunk = events[start:end]
                start = end
                self.stats.watch_events_pushed += len(chunk)
                self.out.reply(watcher.conn, watch_push(watcher.rid, chunk))

    def after_snapshot(self, index: int) -> None:
        """An installed image jumped the state to ``index``: what changed in between is
        unknown here. The window restarts there; a watcher that had not seen up to it
        is told to re-read."""
        self.ring.clear()
        self._sizes.clear()
        self._ring_size = 0
        self.floor = max(self.floor, index)
        for watcher in list(self.watchers.values()):
            if watcher.given < index:
                message = (
                    f"this member jumped to index {index} from an image: read the key "
                    "again, then watch from now"
                )
                self.out.reply(watcher.conn, watch_end(watcher.rid, ErrorCode.COMPACTED, message))
                self._drop(watcher)
