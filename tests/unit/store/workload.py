"""A seeded workload against DiskStorage and a model of what it acknowledged.

Shared by the crash-point tests and the property tests: the same seed always
produces the same sequence of calls, so a run can be repeated up to any
operation of the filesystem and crashed there.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from dlm.records import ConfState, Entry, EntryKind, HardState, Snapshot, SnapshotMeta
from dlm.store.disk import DiskStorage

CONF = ConfState(("a", "b", "c"))


@dataclass
class Model:
    """What the store has acknowledged, entry by entry."""

    log: dict[int, Entry] = field(default_factory=dict)
    history: dict[int, Entry] = field(default_factory=dict)
    """The acknowledged entry at each index, kept after compaction (recovery may
    hold on to compacted entries; they must still be the right ones)."""
    first: int = 1
    last: int = 0
    snap: Snapshot | None = None
    term: int = 0
    vote: str | None = None
    max_term: int = 0

    def snap_index(self) -> int:
        return self.snap.meta.index if self.snap else 0


@dataclass(frozen=True)
class Op:
    kind: str  # append | hard_state | create_snapshot | compact | apply_snapshot
    entries: tuple[Entry, ...] = ()
    hard_state: HardState | None = None
    index: int = 0
    snapshot: Snapshot | None = None


def _entries(rng: random.Random, start: int, count: int, term: int) -> tuple[Entry, ...]:
    return tuple(
        Entry(
            i,
            term,
            rng.randbytes(rng.randint(0, 60)),
            EntryKind.CONF_CHANGE if rng.random() < 0.05 else EntryKind.NORMAL,
        )
        for i in range(start, start + count)
    )


def next_op(rng: random.Random, m: Model) -> Op:
    roll = rng.random()
    if roll < 0.55 or m.last < 3:
        if m.max_term == 0:
            m.max_term = 1
        if rng.random() < 0.8 or m.last < m.first:
            start = m.last + 1
            term = max(m.max_term, m.log[m.last].term if m.last in m.log else 0)
        else:
            start = rng.randint(max(m.first, m.snap_index() + 1), m.last + 1)
            term = m.max_term + 1
        return Op("append", entries=_entries(rng, start, rng.choice([1, 1, 2, 5, 12]), term))
    if roll < 0.72:
        if rng.random() < 0.5:
            return Op("hard_state", hard_state=HardState(m.term, m.vote, rng.randint(0, m.last)))
        return Op(
            "hard_state",
            hard_state=HardState(m.term + 1, rng.choice([None, "a", "b"]), rng.randint(0, m.last)),
        )
    if roll < 0.84 and m.last > m.snap_index():
        return Op("create_snapshot", index=rng.randint(m.snap_index() + 1, m.last))
    if roll < 0.93 and m.snap_index() >= m.first:
        return Op("compact", index=rng.randint(m.first, m.snap_index()))
    if roll < 0.97:
        index = rng.randint(m.snap_index() + 1, m.last + 10)
        meta = SnapshotMeta(index, m.max_term + 1, CONF)
        return Op("apply_snapshot", snapshot=Snapshot(meta, rng.randbytes(rng.randint(0, 200))))
    return Op("hard_state", hard_state=HardState(m.term, m.vote, m.last))


def run_op(store: DiskStorage, op: Op) -> None:
    if op.kind == "append":
        store.append(op.entries)
    elif op.kind == "hard_state":
        assert op.hard_state is not None
        store.set_hard_state(op.hard_state)
    elif op.kind == "create_snapshot":
        store.create_snapshot(op.index, CONF, f"image@{op.index}".encode())
    elif op.kind == "compact":
        store.compact(op.index)
    else:
        assert op.snapshot is not None
        store.apply_snapshot(op.snapshot)


def acknowledge(m: Model, op: Op) -> None:
    """Fold a completed ``op`` into the model."""
    if op.kind == "append":
        start = op.entries[0].index
        for i in range(start, m.last + 1):
            m.log.pop(i, None)
            m.history.pop(i, None)
        for e in op.entries:
            m.log[e.index] = e
            m.history[e.index] = e
        m.last = op.entries[-1].index
        m.max_term = max(m.max_term, op.entries[-1].term)
    elif op.kind == "hard_state":
        assert op.hard_state is not None
        m.term, m.vote = op.hard_state.term, op.hard_state.vote
        m.max_term = max(m.max_term, m.term)
    elif op.kind == "create_snapshot":
        meta = SnapshotMeta(op.index, m.log[op.index].term, CONF)
        m.snap = Snapshot(meta, f"image@{op.index}".encode())
    elif op.kind == "compact":
        for i in range(m.first, op.index + 1):
            m.log.pop(i, None)
        m.first = op.index + 1
    else:
        assert op.snapshot is not None
        m.snap = op.snapshot
        m.log.clear()
        m.history.clear()
        m.first = op.snapshot.meta.index + 1
        m.last = op.snapshot.meta.index
        m.max_term = max(m.max_term, op.snapshot.meta.term)


def ops(seed: int, count: int) -> Iterator[tuple[Op, Model]]:
    """Yield ``count`` operations, each with the model as it stands *before* it.

    The caller runs the op and then calls ``acknowledge``.
    """
    rng = random.Random(seed)
    model = Model()
    for _ in range(count):
        yield next_op(rng, model), model


def log_of(store: DiskStorage) -> dict[int, Entry]:
    first, last = store.first_index(), store.last_index()
    return {e.index: e for e in store.entries(first, last + 1)} if last >= first else {}


def check_recovered(store: DiskStorage, acked: Model, pending: Op | None) -> None:
    """The reopened ``store`` holds everything ``acked`` promised; ``pending`` (the
    call interrupted by the crash) may have landed whole, in part, or not at all."""
    hs, _ = store.initial_state()
    term_vote = (hs.term, hs.vote)
    allowed = {(acked.term, acked.vote)}
    if pending is not None and pending.kind == "hard_state" and pending.hard_state is not None:
        allowed.add((pending.hard_state.term, pending.hard_state.vote))
    assert term_vote in allowed, f"term/vote {term_vote} not in {allowed}"

    snap = store.snapshot()
    snap_index = snap.meta.index if snap else 0
    allowed_snaps = {acked.snap}
    if pending is not None and pending.kind == "apply_snapshot":
        allowed_snaps.add(pending.snapshot)
    if pending is not None and pending.kind == "create_snapshot":
        meta = SnapshotMeta(pending.index, acked.log[pending.index].term, CONF)
        allowed_snaps.add(Snapshot(meta, f"image@{pending.index}".encode()))
    assert snap in allowed_snaps, f"snapshot {snap and snap.meta} unexpected"
    assert store.first_index() <= snap_index + 1
    assert store.term(snap_index) == (snap.meta.term if snap else 0)

    log = log_of(store)
    installed = (
        pending is not None
        and pending.kind == "apply_snapshot"
        and snap == pending.snapshot
        and snap != acked.snap
    )
    cut = len(acked.log) + acked.last + 2  # beyond any index
    batch: dict[int, Entry] = {}
    if pending is not None and pending.kind == "append":
        cut = pending.entries[0].index
        batch = {e.index: e for e in pending.entries}
    if not installed:
        for i, e in acked.log.items():
            if snap_index < i < cut:
                assert log.get(i) == e, f"acknowledged entry {i} lost or changed"
    # Everything present is either acknowledged or part of the interrupted batch,
    # and the part from the batch is all-or-prefix, never mixed with old entries.
    suffix = [log[i] for i in sorted(log) if i >= cut]
    old_suffix = [acked.history[i] for i in sorted(acked.history) if i >= cut]
    if suffix and batch:
        new_prefix = [batch[i] for i in sorted(batch)][: len(suffix)]
        assert suffix in (old_suffix, new_prefix), "recovered suffix is neither old nor new"
    for i, e in log.items():
        assert acked.history.get(i) == e or batch.get(i) == e, f"entry {i} came from nowhere"
