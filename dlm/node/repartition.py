"""Merging the states of a cluster's partitions and splitting them again by a new count.

A restore that changes the partition count (``dlm node restore --partitions P``) and a
restore of a partitioned backup both come here: the applied states of the old
partitions (one lock machine each, with its identities and run ledger) become the
applied states of the new ones. The rules:

* **Keys move with everything they carry.** Each key goes to ``partition_of(key, P)``
  with its limit, holders (and their fencing tokens), waiters in queue order, its
  lock-delay and its run-ledger rows. A key is in exactly one old partition (two is a
  damaged backup: refused).
* **A lease goes wherever it holds or waits.** A lease is in every new partition where
  it holds or waits for a key; a lease that holds and waits for nothing anywhere lives
  in ``partition_of(lease_id, P)`` (the rule the client follows). Where several old
  parts of one lease meet in one new partition they become one: the first old part's
  terms (TTL, incarnation, metadata, owner, lock-delay), finished if any part was, and
  the at-most-once records of every part (per client: the lowest floor, so no request
  a client may still send is refused as stale, and every remembered result on which
  the parts agree).
* **Ended leases stay ended everywhere.** Every tombstone goes to every new partition
  where its lease is not live (a client opens parts lazily, in any partition), aged as
  it was: log time is per partition, so each old partition's tombstones are moved onto
  the merged clock by the difference between the clocks.
* **Cluster-wide state is copied.** The identity table (with its removals) is copied
  from the first old partition into every new one (the admin commands write it into
  every partition alike); membership is the restore's own (its ``--peers``).
* **Tokens only rise.** A holder keeps its token; the caller starts every new partition's
  log above every old partition's index (``dlm.node.incarnation``), so a new grant of a
  key is above every token the key ever had, in whichever partition it was.

Pure: no IO, no clock, no randomness (tests/unit/node/test_purity.py). Tested by
tests/unit/node/test_repartition.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cbor2

from dlm.node import locks
from dlm.node.locks.identities import IdentityTable
from dlm.node.locks.machine import MAX_UNANSWERED, TOMBSTONES
from dlm.partitioning import check_partitions, partition_of

_LAYOUT_V3 = 3
_LAYOUT_V4 = 4
_V3_LENGTH = 9
_V4_LENGTH = 10


class RepartitionError(ValueError):
    """The old partitions' states cannot be merged (one line saying why)."""


def _layout(machine: locks.LockStateMachine) -> list[Any]:
    """``machine``'s snapshot rows in layout 4 (a machine below cluster version 3 is first
    brought to it, as a restore does anyway)."""
    copy = type(machine).restore(machine.snapshot())
    if copy.version < 3:
        kept = copy.quarantine
        locks.start_incarnation(copy, copy.applied_index, 0)
        copy.quarantine = kept
    item: list[Any] = cbor2.loads(copy.snapshot())
    if item[0] == _LAYOUT_V3 and len(item) == _V3_LENGTH:
        item = [_LAYOUT_V4, *item[1:], []]
        item[3] = [[*row, 0] for row in item[3]]
    if item[0] != _LAYOUT_V4 or len(item) != _V4_LENGTH:
        raise RepartitionError("a partition's state has a layout this release cannot split")
    return item


def _merge_clients(rows: list[list[Any]]) -> list[list[Any]]:
    """The at-most-once records of several parts of one lease, as one list of rows."""
    merged: dict[str, tuple[int, dict[int, Any], set[int]]] = {}
    for row in rows:
        for client, floor, results in row[7]:
            low, kept, clashes = merged.get(client, (floor, {}, set()))
            for seq, result in results:
                if seq in kept and kept[seq] != result:
                    clashes.add(seq)
                kept.setdefault(seq, result)
            merged[client] = (min(low, floor), kept, clashes)
    out = []
    for client in sorted(merged):
        floor, kept, clashes = merged[client]
        seqs = sorted(s for s in kept if s > floor and s not in clashes)[-MAX_UNANSWERED:]
        out.append([client, floor, [[s, kept[s]] for s in seqs]])
    return out


def _merge_lease(parts: list[list[Any]]) -> list[Any]:
    """One lease row from the rows of its parts (the first part's terms)."""
    if len(parts) == 1:
        return list(parts[0])
    row = list(parts[0])
    row[6] = next((p[6] for p in parts if p[6] is not None), None)
    row[7] = _merge_clients(parts)
    return row


def _lease_keys(keys: list[list[Any]]) -> dict[str, set[str]]:
    """Each lease's keys (held or waited for) among ``keys`` rows."""
    out: dict[str, set[str]] = {}
    for key, _limit, holders, waiters in keys:
        for row in (*holders, *waiters):
            out.setdefault(row[0], set()).add(key)
    return out


def _ledger_rows(machines: Sequence[locks.LockStateMachine]) -> list[list[Any]]:
    """Every old partition's run-ledger rows, in one order: oldest newest run first (the
    order a ledger forgets keys in)."""
    rows = [row for m in machines for row in m.ledger.image()]
    return sorted(rows, key=lambda row: row[1][-1][5] if row[1] else -1)


def split(
    machines: Sequence[locks.LockStateMachine], partitions: int
) -> list[locks.LockStateMachine]:
    """The applied states of ``partitions`` new partitions, from ``machines``, the applied
    states of the old ones (in partition order; a single one for an unpartitioned
    cluster). Each output is applied up to the highest input index; the caller makes it
    the first state of a new incarnation. The inputs are not changed."""
    bad = check_partitions(partitions)
    if bad is not None:
        raise RepartitionError(bad)
    if not machines:
        raise RepartitionError("no partition states to split")
    layouts = [_layout(m) for m in machines]
    version = max(item[2] for item in layouts)
    log_ms = max(item[6][0] for item in layouts)
    last_stamp_ms = max(item[6][1] for item in layouts)

    keys: dict[str, list[Any]] = {}
    delays: dict[str, list[Any]] = {}
    parts: dict[str, list[list[Any]]] = {}
    stones: dict[str, list[Any]] = {}
    for item in layouts:
        for row in item[4]:
            if row[0] in keys:
                raise RepartitionError(
                    f"key {row[0]!r} is in two partitions of the backup: it is damaged"
                )
            keys[row[0]] = row
        for row in item[9]:
            delays[row[0]] = row
        for row in item[3]:
            parts.setdefault(row[0], []).append(row)
        # Tombstones keep their age on the merged clock (never shorter: that would let a
        # re-sent open bring an ended lease back sooner).
        shift = log_ms - item[6][0]
        for lease_id, client, seq, result, ended in item[5]:
            old = stones.get(lease_id)
            if old is None or ended + shift > old[4]:
                stones[lease_id] = [lease_id, client, seq, result, ended + shift]
    by_lease = _lease_keys(list(keys.values()))
    homes: dict[str, set[int]] = {}
    for lease_id in parts:
        owned = by_lease.get(lease_id)
        homes[lease_id] = (
            {partition_of(k, partitions) for k in owned}
            if owned
            else {partition_of(lease_id, partitions)}
        )
    ledger = _ledger_rows(machines)
    max_ttl = max(item[7] for item in layouts)
    quarantine = next((item[8] for item in layouts if item[8] is not None), None)
    applied = max(m.applied_index for m in machines)
    ordered_stones = sorted(stones.values(), key=lambda s: s[4])[-TOMBSTONES:]

    out = []
    for p in range(partitions):
        mine = [row for key, row in sorted(keys.items()) if partition_of(key, partitions) == p]
        leases = [
            _merge_lease(parts[lease_id]) for lease_id in sorted(parts) if p in homes[lease_id]
        ]
        live = {row[0] for row in leases}
        image = [
            _LAYOUT_V4,
            applied,
            version,
            leases,
            mine,
            [s for s in ordered_stones if s[0] not in live],
            [log_ms, last_stamp_ms],
            max_ttl,
            quarantine,
            [row for key, row in sorted(delays.items()) if partition_of(key, partitions) == p],
        ]
        try:
            machine = type(machines[0]).restore(bytes(cbor2.dumps(image, canonical=True)))
        except ValueError as exc:
            raise RepartitionError(
                f"the merged state of partition {p} is impossible: {exc}"
            ) from None
        machine.identities = _copy_identities(machines[0].identities)
        runs = [row for row in ledger if partition_of(row[0], partitions) == p]
        machine.ledger = machine.ledger_class.restore(runs[-machine.ledger_class.max_keys :])
        out.append(machine)
    return out


def _copy_identities(table: IdentityTable) -> IdentityTable:
    return IdentityTable.restore(table.image(), table.removals_image())


def identities_differ(machines: Sequence[locks.LockStateMachine]) -> list[int]:
    """The old partitions whose identity table is not the first one's (the copy every new
    partition gets): an admin change that some partitions did not take."""
    first = machines[0].identities.image() if machines else []
    return [i for i, m in enumerate(machines) if m.identities.image() != first]
