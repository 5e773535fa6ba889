"""The spans of traced requests, recorded from the times the machine is given (issue 30).

A request that carries a trace context (wire ``trace``: a W3C traceparent) is followed
from the frame's arrival to its answer. The machine tells this room what happens to it,
each time with the event's Instant: it was received; its entry was handed out for the
leader's own write (job number, log index); an append holding the entry left for a peer;
the peer acknowledged it; the write was durable; the entry was committed and applied;
the request was answered (the outbox tells us, whatever room answered). Once answered,
its spans leave as one ``ExportSpans`` action of plain data, parents before children:

    dlm.request      received -> answered (the remote parent: the client's span)
      raft.proposal    proposed -> committed (or answered, when it never committed)
        wal.fsync        the leader's write of the batch that held the entry
        raft.replicate   per peer: the append holding the entry left -> acknowledged
      raft.apply       committed -> applied

A replication round trip not yet acknowledged when the request is answered (a peer
behind the quorum) is left out. The leader's own write may end after the answer (a
quorum of followers committed the entry first): the spans then leave once it has.
The runtime exports the spans through dlm/tracing.py when tracing is on and drops them
otherwise; the simulator checks every batch with ``span_problems``.

Cost: an untraced request costs the machine one test (its ``trace`` is None); the
other hooks run only while ``busy``. At most MAX_TRACED requests are
followed at once: more are answered as usual, untraced, and counted in ``dropped``.
Pure: no clock, no IO; the times are the Instants passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dlm.node.outbox import ExportSpans, FinishedSpan, Instant, Outbox
from dlm.node.raft.types import AppendEntries, Message
from dlm.records import Entry, NodeId

MAX_TRACED = 256
"""Traced requests followed at once (each holds a few numbers per peer until answered)."""

REQUEST, PROPOSAL, FSYNC, REPLICATE, APPLY = (
    "dlm.request",
    "raft.proposal",
    "wal.fsync",
    "raft.replicate",
    "raft.apply",
)


class _Traced:
    """What happened to one traced request so far (monotonic seconds)."""

    __slots__ = (
        "acked",
        "answered",
        "applied",
        "attributes",
        "conn",
        "fsync_done",
        "fsync_job",
        "fsync_start",
        "index",
        "received",
        "rid",
        "sent",
        "traceparent",
    )

    def __init__(
        self, conn: int, rid: int, traceparent: str, received: float, attributes: dict[str, Any]
    ) -> None:
        self.conn = conn
        self.rid = rid
        self.traceparent = traceparent
        self.received = received
        self.attributes = attributes
        self.index: int | None = None
        self.fsync_job: int | None = None
        self.fsync_start = 0.0
        self.fsync_done: float | None = None
        self.sent: dict[NodeId, float] = {}
        self.acked: dict[NodeId, tuple[float, float]] = {}
        self.applied: float | None = None
        self.answered: float | None = None


class SpanRecorder:
    """The traced requests a member follows until they are answered."""

    def __init__(self, out: Outbox, node_id: NodeId, partition: int | None = None) -> None:
        self._out = out
        self._node_id = node_id
        self._partition = partition
        """This process's partition, named on its spans (None: a cluster of one)."""
        self.open: dict[tuple[int, int], _Traced] = {}
        """By (connection, request id)."""
        self._by_index: dict[int, _Traced] = {}
        """Traced requests by the index of their entry, until their spans leave."""
        self._answered: list[_Traced] = []
        self._lingering: dict[int, _Traced] = {}
        """Answered, and waiting for the leader's write of their entry, by its index."""
        self.busy = False
        """Some traced request is followed (the machine's hooks test this first)."""
        self._next_id = 1
        self.dropped = 0
        """Traced requests not followed because MAX_TRACED were open."""

    @property
    def answered(self) -> bool:
        """Some traced request was answered since the last ``settle``."""
        return bool(self._answered)

    # -- what the machine tells ------------------------------------------------------

    def received(self, conn: int, request: Any, traceparent: str, now: Instant) -> None:
        key = (conn, request.id)
        if key in self.open:
            return  # a client reusing an id in flight: the first one is followed
        if len(self.open) + len(self._lingering) >= MAX_TRACED:
            self.dropped += 1
            return
        attributes: dict[str, Any] = {"dlm.request": request.TYPE, "dlm.member": self._node_id}
        if self._partition is not None:
            attributes["dlm.partition"] = self._partition
        for name in ("key", "lease"):
            value = getattr(request, name, None)
            if isinstance(value, str):
                attributes[f"dlm.{name}"] = value
        self.open[key] = _Traced(conn, request.id, traceparent, now.mono, attributes)
        self._out.on_traced_answer = self._note_answer
        self.busy = True

    def handed_out(
        self, job: int | None, entries: Iterable[Entry], pending: Mapping[int, Any], now: Instant
    ) -> None:
        """The leader hands ``entries`` out for its own write ``job``; ``pending``: its
        proposals by index, to tell which entries are those of traced requests."""
        for entry in entries:
            proposal = pending.get(entry.index)
            if proposal is None:
                continue
            traced = self.open.get((proposal.conn, proposal.request.id))
            if traced is None or traced.index is not None:
                continue
            traced.index = entry.index
            traced.fsync_job = job
            traced.fsync_start = now.mono
            self._by_index[entry.index] = traced

    def messages_sent(self, messages: Iterable[Message], now: Instant) -> None:
        if not self._by_index:
            return
        for msg in messages:
            if type(msg) is not AppendEntries or not msg.entries:
                continue
            first, last = msg.entries[0].index, msg.entries[-1].index
            for index, traced in self._by_index.items():
                if first <= index <= last and traced.answered is None:
                    traced.sent.setdefault(msg.dst, now.mono)

    def acknowledged(self, peer: NodeId, index: int, now: Instant) -> None:
        for traced in self._by_index.values():
            sent = traced.sent.get(peer)
            if sent is None or traced.answered is not None:
                continue  # not sent to it, or answered: only the own write is awaited
            if traced.index is not None and traced.index <= index:
                traced.acked.setdefault(peer, (sent, now.mono))

    def durable(self, job: int, now: Instant) -> None:
        """Write ``job``, and so every job before it, is durable."""
        for traced in self._by_index.values():
            waiting = traced.fsync_job is not None and traced.fsync_done is None
            if waiting and traced.fsync_job is not None and traced.fsync_job <= job:
                traced.fsync_done = now.mono
        if self._lingering:
            for index, traced in list(self._lingering.items()):
                if traced.fsync_done is not None:
                    del self._lingering[index]
                    self._export(traced, now)
            self._quiet_if_idle()

    def applied(self, index: int, now: Instant) -> None:
        """The entry at ``index`` was committed and applied (one event: the machine
        applies what is committed as soon as the core hands it out)."""
        traced = self._by_index.get(index)
        if traced is not None:
            traced.applied = now.mono

    def closed(self, conn: int) -> None:
        """A connection closed: its traced requests will not be answered."""
        if not self.open:
            return
        for key in [k for k in self.open if k[0] == conn]:
            self._forget(self.open.pop(key))
        self._quiet_if_idle()

    def settle(self, now: Instant) -> None:
        """Hands out the spans of the requests answered since the last call, ``now``
        being the time of the event that answered them."""
        answered, self._answered = self._answered, []
        for traced in answered:
            if self.open.pop((traced.conn, traced.rid), None) is not traced:
                continue
            traced.answered = now.mono
            index = traced.index
            if index is not None and traced.fsync_done is None and traced.applied is not None:
                # Committed by followers before our own write ended: wait for it.
                self._lingering[index] = traced
            else:
                self._export(traced, now)
        self._quiet_if_idle()

    def awaiting_writes(self) -> dict[int, int | None]:
        """The answered requests whose spans wait for the leader's write: their entry's
        index and the write's job number (a check that none waits for a finished job)."""
        return {index: traced.fsync_job for index, traced in self._lingering.items()}

    # -- inside ---------------------------------------------------------------------

    def _export(self, traced: _Traced, now: Instant) -> None:
        self._forget(traced)
        answered = traced.answered if traced.answered is not None else now.mono
        self._out.emit(ExportSpans(tuple(self._spans_of(traced, answered)), now))

    def _note_answer(self, conn: int, rid: object) -> None:
        if isinstance(rid, int):
            traced = self.open.get((conn, rid))
            if traced is not None:
                self._answered.append(traced)

    def _forget(self, traced: _Traced) -> None:
        if traced.index is not None and self._by_index.get(traced.index) is traced:
            del self._by_index[traced.index]

    def _quiet_if_idle(self) -> None:
        if not self.open:
            self._out.on_traced_answer = None  # untraced answers cost one test again
            self.busy = bool(self._lingering)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _spans_of(self, traced: _Traced, answered: float) -> list[FinishedSpan]:
        def span(
            name: str, parent: int | None, start: float, end: float, **attributes: Any
        ) -> FinishedSpan:
            made = FinishedSpan(
                name=name,
                local_id=self._new_id(),
                parent=parent,
                traceparent=traced.traceparent,
                start=start,
                end=end,
                attributes=tuple(attributes.items()),
            )
            spans.append(made)
            return made

        spans: list[FinishedSpan] = []
        request = span(REQUEST, None, traced.received, answered, **traced.attributes)
        if traced.index is None:
            return spans
        committed = traced.applied is not None
        proposal = span(
            PROPOSAL,
            request.local_id,
            traced.received,
            traced.applied if traced.applied is not None else answered,
            **{"dlm.index": traced.index, "dlm.committed": committed},
        )
        if traced.fsync_done is not None:
            span(
                FSYNC,
                proposal.local_id,
                traced.fsync_start,
                traced.fsync_done,
                **{"dlm.index": traced.index},
            )
        for peer in sorted(traced.acked):
            sent, acked = traced.acked[peer]
            span(REPLICATE, proposal.local_id, sent, acked, **{"dlm.peer": peer})
        if traced.applied is not None:
            span(
                APPLY,
                request.local_id,
                traced.applied,
                traced.applied,
                **{"dlm.index": traced.index},
            )
        return spans


def span_problems(spans: Iterable[FinishedSpan]) -> list[str]:
    """What is wrong with one request's spans (one ExportSpans batch), as sentences; []
    when well formed: one request span, the remote parent's child, first; every other
    span's parent given before it; nothing ends before it starts, or outside the request
    (but the leader's fsync, which may end after the answer); a committed proposal has
    one fsync and one apply, which starts at or after the commit; the replication round
    trips start after the proposal; and a commit before the leader's own write ended was
    made by followers alone, so at least two of them had acknowledged it by then."""
    problems: list[str] = []
    batch = list(spans)
    seen: dict[int, FinishedSpan] = {}
    roots = [s for s in batch if s.parent is None]
    if len(roots) != 1 or roots[0].name != REQUEST or batch[0] is not roots[0]:
        return [f"expected one {REQUEST} span first, got {[s.name for s in batch]}"]
    request = roots[0]
    for s in batch:
        if s.end < s.start:
            problems.append(f"{s.name} ends before it starts")
        if s.parent is not None and s.parent not in seen:
            problems.append(f"{s.name}'s parent is not given before it")
        if s.traceparent != request.traceparent:
            problems.append(f"{s.name} is in another trace")
        if s is not request and not request.start <= s.start <= request.end:
            problems.append(f"{s.name} does not start within the request")
        if s.name != FSYNC and s.end > request.end:
            problems.append(f"{s.name} ends after the request")
        seen[s.local_id] = s
    by_name: dict[str, list[FinishedSpan]] = {}
    for s in batch:
        by_name.setdefault(s.name, []).append(s)
    proposals = by_name.get(PROPOSAL, [])
    if len(proposals) > 1:
        problems.append("more than one proposal span")
    if not proposals:
        if len(batch) > 1:
            problems.append("spans of a proposal without the proposal")
        return problems
    proposal = proposals[0]
    committed = dict(proposal.attributes).get("dlm.committed") is True
    fsyncs, applies = by_name.get(FSYNC, []), by_name.get(APPLY, [])
    if committed and (len(fsyncs), len(applies)) != (1, 1):
        problems.append(
            f"a committed proposal has {len(fsyncs)} fsync and {len(applies)} apply spans"
        )
    round_trips = by_name.get(REPLICATE, [])
    for fsync in fsyncs:
        if fsync.parent != proposal.local_id or not proposal.start <= fsync.start:
            problems.append("the fsync is not the proposal's")
        acked = sum(1 for r in round_trips if r.end <= proposal.end)
        if committed and fsync.end > proposal.end and acked < 2:
            problems.append(f"the fsync ends after a commit only {acked} follower(s) acknowledged")
    for apply in applies:
        if apply.start < proposal.end:
            problems.append("the apply starts before the commit")
    for round_trip in round_trips:
        if round_trip.parent != proposal.local_id or round_trip.start < proposal.start:
            problems.append("a replication round trip is not the proposal's")
    return problems
