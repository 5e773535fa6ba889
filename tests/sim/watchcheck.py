"""Watchers in the whole-node simulator, and the check of what they were pushed.

A ``SimWatcher`` is a client process that watches a key or a prefix with the client
library's own ``WatchStream`` (dlm/client/watching.py), over one connection at a time
to a member drawn at random: followers too, since every member serves watches from
its applied log. Its connection breaks when the member crashes, restarts or is cut
off, a pushed frame lost on the way breaks it too (as TCP would, rather than skip it),
and the watcher now and then hangs up by itself; each time it resumes on another
member after the last index it was given. COMPACTED (it asked beyond a member's
window) starts a new segment from now, as `dlm watch` does.

``WatchTruth`` records, for every applied index, the events that entry caused on the
first member to apply it (``watches.changes`` of the entry's effect), and that every
other member applying that index derives the same ones (``watch-diverged``). The
check (``watch-gap``, ``watch-duplicate``, ``watch-order``, ``watch-wrong``): within
each segment, the watcher received, in index order and once each, exactly the
events of its keys that the applied log holds between the segment's start and the
last index it was given.

The watchers have their own random draws (their latencies too) and are not among
the processes the client faults pick, so turning them on leaves the rest of a
seed's run as it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlm.client import core
from dlm.client.watching import WatchBroken, WatchCompacted, WatchStream
from dlm.node import locks, watches

from .checkers import Violation

if TYPE_CHECKING:
    from .nodesim import ClientProc, NodeSimulation, SimClient, SimConn

US = 1_000_000
HANG_UP_EVERY_US = (1 * US, 4 * US)
"""A watcher hangs up by itself (and resumes elsewhere) after a time drawn from this."""
RETRY_US = (20_000, 200_000)
ANSWER_WAIT_US = 1 * US


class WatchTruth:
    """The events each applied index caused, as the first member to apply it derived them."""

    def __init__(self) -> None:
        self.by_index: dict[int, tuple[watches.Event, ...]] = {}
        self.applied_by: dict[int, str] = {}

    def new_incarnation(self, watchers: list[SimWatcher]) -> None:
        """The cluster was restored or recovered: what the watchers got from the old log is
        checked now; then a new log, and new watches on it."""
        check_watchers(watchers, self)
        self.by_index.clear()
        self.applied_by.clear()
        for watcher in watchers:
            watcher.segments.clear()
            watcher.restart()

    def applied(
        self, member: str, outcome: locks.ApplyOutcome, machine: locks.LockStateMachine
    ) -> None:
        at_ms = outcome.command.at_ms if outcome.command is not None else 0
        found = []
        for key, before in outcome.before:
            after = locks.key_state(machine, key)
            event = watches.changes(
                outcome.index, key, before, after, expired=outcome.expired, at_ms=at_ms
            )
            if event is not None:
                found.append(event)
        events = tuple(found)
        known = self.by_index.get(outcome.index)
        if known is None:
            self.by_index[outcome.index] = events
            self.applied_by[outcome.index] = member
        elif known != events:
            raise Violation(
                "watch-diverged",
                f"index {outcome.index}: {member} derived {events}, "
                f"{self.applied_by[outcome.index]} {known}",
            )


@dataclass
class Segment:
    """What one watch (from its start to a COMPACTED or the end) was given."""

    start: int
    received: list[tuple[int, str, str, str, int | None]] = field(default_factory=list)


def _row(event: Any) -> tuple[int, str, str, str, int | None]:
    return (event.index, event.key, event.event, event.lease, event.token)


class SimWatcher:
    """One watching client process (see the module docstring)."""

    def __init__(
        self,
        sim: NodeSimulation,
        proc: ClientProc,
        client: SimClient,
        key: str | None,
        prefix: str | None,
    ) -> None:
        self.sim = sim
        self.proc = proc
        self.client = client
        self.key = key
        self.prefix = prefix
        self.rng: random.Random = sim.rng_for(f"watcher-{proc.name}")
        self.stream = WatchStream(key, prefix, None, timeout=1e9)
        self.segments: list[Segment] = []
        self.watch_id: int | None = None
        self.conn: SimConn | None = None
        self.stopped = False
        client.watcher = self

    def wants(self, key: str) -> bool:
        return key == self.key if self.key is not None else key.startswith(self.prefix or "")

    # -- connecting ----------------------------------------------------------------

    def start(self) -> None:
        if self.stopped or self.conn is not None:
            return
        sim = self.sim
        ids = sim.current_ids()
        member = sim.members.get(self.rng.choice(ids))
        if member is None or member.machine is None:
            self._retry()
            return
        client = self.client
        conn = sim.connect(client, member)
        self.conn = conn
        client.next_id += 1
        rid = client.next_id
        self.watch_id = None
        client.waiting = (rid, lambda frame: self._answered(conn, frame))
        sim.client_send(conn, {**self.stream.request(), "id": rid})
        sim.world.after(ANSWER_WAIT_US, lambda: self._no_answer(conn))

    def _no_answer(self, conn: SimConn) -> None:
        if self.conn is conn and self.watch_id is None:
            self._hang_up()

    def _retry(self) -> None:
        if not self.stopped:
            self.sim.world.after(self.rng.randint(*RETRY_US), lambda: self.proc.run(self.start))

    def _hang_up(self) -> None:
        conn, self.conn = self.conn, None
        self.watch_id = None
        self.client.waiting = None
        if conn is not None and self.client.conn is conn:
            self.client.drop()
        self._retry()

    def broken(self, conn: SimConn) -> None:
        """The connection broke (the member crashed, was cut off, or closed it)."""
        if self.conn is conn:
            self.conn = None
            self.watch_id = None
            self._retry()

    # -- what the member says ----------------------------------------------------------

    def _answered(self, conn: SimConn, frame: Any) -> None:
        if self.conn is not conn:
            return
        if isinstance(frame, core.Failed):
            self.broken(conn)
            return
        try:
            started = self.stream.started(frame, conn.member.id)
        except WatchCompacted:
            self._compacted()
            return
        if not started:
            self._hang_up()
            return
        self.watch_id = int(frame["id"])
        if not self.segments:
            self.segments.append(Segment(int(frame["index"])))
        elif self.segments[-1].start < 0:
            self.segments[-1].start = int(frame["index"])
        self.sim.world.after(self.rng.randint(*HANG_UP_EVERY_US), lambda: self._tire(conn))

    def _tire(self, conn: SimConn) -> None:
        if self.conn is conn and not self.stopped:
            self._hang_up()

    def _compacted(self) -> None:
        """Beyond the window: a new watch from now, as `dlm watch` starts one."""
        self.sim.stats["watch_compacted"] += 1
        self.restart()

    def restart(self) -> None:
        """A new watch from now, in a new segment."""
        self.stream = WatchStream(self.key, self.prefix, None, timeout=1e9)
        self.segments.append(Segment(-1))
        if self.conn is not None:
            self._hang_up()

    def pushed(self, conn: SimConn, frame: dict[str, Any]) -> None:
        if self.conn is not conn or self.watch_id is None:
            return
        try:
            events = self.stream.take(frame, self.watch_id)
        except WatchBroken:
            self._hang_up()
            return
        except WatchCompacted:
            self._compacted()
            return
        segment = self.segments[-1]
        segment.received.extend(_row(e) for e in events)
        self.sim.stats["watch_events"] += len(events)

    def lost(self, conn: SimConn) -> None:
        """A pushed frame was lost on the way: TCP would not skip it, the connection dies."""
        if self.conn is conn:
            self._hang_up()


def check_watchers(watchers: list[SimWatcher], truth: WatchTruth) -> None:
    """Each segment got exactly the log's events of its keys, in order, once each."""
    for watcher in watchers:
        for segment in watcher.segments:
            received = segment.received
            if not received or segment.start < 0:
                continue
            indexes = [row[0] for row in received]
            seen = [(row[0], row[1]) for row in received]
            if len(set(seen)) != len(seen):
                raise Violation(
                    "watch-duplicate", f"{watcher.proc.name} was given a change twice: {received}"
                )
            if indexes != sorted(indexes):
                raise Violation("watch-order", f"{watcher.proc.name}: {indexes}")
            last = indexes[-1]
            expected = [
                _row(event)
                for index in sorted(truth.by_index)
                if segment.start < index <= last
                for event in truth.by_index[index]
                if watcher.wants(event.key)
            ]
            if received != expected:
                missing = [row for row in expected if row not in received]
                kind = "watch-gap" if missing else "watch-wrong"
                raise Violation(
                    kind,
                    f"{watcher.proc.name} after index {segment.start}: missing {missing[:5]}, "
                    f"given {[r for r in received if r not in expected][:5]}",
                )
