"""Snapshots of the applied state: when to take one, and the image's layout.

Every ``snapshot_every`` applied entries the machine records an image of the applied
state and lets the log be compacted up to ``snapshot_keep`` entries behind it. From
cluster version 2 the image holds the lock state and the address book of the
configuration in force at its index (``NODE_IMAGE_FORMAT``); at version 1, the bare
lock image, which a member of the previous release restores. Only replicated facts
go in, so every member's image at one index is the same bytes. Pure: part of the
node machine (machine.py).

Building an image walks the whole lock table (two seconds at 100,000 locks): the
machine does not build it itself but asks its ``Imager`` at the moment the state is
at the image's index. The pure default builds it there and then (the simulator, the
unit tests); the runtime's forks a child that builds it from copy-on-write memory
while the member goes on serving (runtime/imaging.py), and hands back a
``PendingImage``. An imager may also say "not now" (None: an image of that purpose
is still being built); a periodic snapshot is then tried again after the next
entries, and a backup request is refused as busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2

from dlm.node import locks
from dlm.node.locks.identities import IdentityTable
from dlm.node.membership import Membership
from dlm.node.outbox import Outbox, PendingImage, SaveSnapshot
from dlm.node.raft.core import RaftNode
from dlm.records import ConfState

NODE_IMAGE_FORMAT = 4
"""Layout of this member's snapshot image from cluster version 4: format 3 whose identity
rows end with each identity's own quotas, ``identity_removals`` (the last removals and
the request ids that made them, identities.py), and the run ledger (``ledger``:
dlm/node/locks/ledger.py's image). Still opened: formats 3 and 2 (no runs)."""
NODE_IMAGE_FORMAT_V3 = 3
"""The layout at cluster version 3: format 2 (version 2) and the identity table
(``identities``: names, roles, prefixes and key verifiers, never a secret). Version 1:
the bare lock image."""
NODE_IMAGE_FORMATS = (2, 3, 4)
"""The node image layouts a member opens (a dict with ``format``)."""
NODE_IMAGE_FORMAT_V2 = 2
"""The layout at cluster version 2, without identities (still restored)."""
PERIODIC = "periodic"
"""The purpose of an image that compacts the log."""
BACKUP = "backup"
"""The purpose of an image a client asked for (``dlm snapshot save``)."""

Imager = Callable[[Callable[[], bytes], str], "bytes | PendingImage | None"]
"""Given the function that builds the image of the state as it is now, and the image's
purpose: the bytes, a ``PendingImage``, or None for "not now"."""


def build_now(build: Callable[[], bytes], purpose: str) -> bytes:
    """The pure imager: builds the image on the spot."""
    return build()


class BackupImage(tuple[int, int, ConfState, "bytes | PendingImage"]):
    """``(index, term, conf, image)`` of a backup taken at the applied index."""

    __slots__ = ()


class Snapshots:
    """The index of the last image, and the rule for taking the next."""

    def __init__(self, out: Outbox, every: int, keep: int, imager: Imager = build_now) -> None:
        self._out = out
        self._every = every
        self._keep = keep
        self.imager = imager
        self.index = 0
        """The index of the last image taken or installed."""

    def take_if_due(
        self, machine: locks.LockStateMachine, raft: RaftNode, membership: Membership
    ) -> None:
        index = machine.applied_index
        if index - self.index < self._every:
            return
        made = self.imager(lambda: image(machine, raft, membership), PERIODIC)
        if made is None:
            return  # the last one is still being built: try again after the next entries
        conf = raft.conf_state_at(index)
        keep_from = max(0, index - self._keep)
        self.index = index
        self._out.stats.snapshots_taken += 1
        if isinstance(made, bytes):
            self._out.emit(SaveSnapshot(index, conf, made, keep_from))
            self._out.log("info", "snapshot_taken", index=index, bytes=len(made))
        else:
            self._out.emit(SaveSnapshot(index, conf, b"", keep_from, made))
            self._out.log("info", "snapshot_taken", index=index)

    def backup(
        self, machine: locks.LockStateMachine, raft: RaftNode, membership: Membership
    ) -> BackupImage | None:
        """The image of the applied state for a backup, with its index (committed: only
        committed entries are applied), the term of the entry there and the configuration
        in force; None while another backup's image is still being built."""
        index = machine.applied_index
        made = self.imager(lambda: image(machine, raft, membership), BACKUP)
        if made is None:
            return None
        return BackupImage((index, raft.term_at(index), raft.conf_state_at(index), made))


def restore_image(
    data: bytes, lock_machine_class: type[locks.LockStateMachine], membership: Membership
) -> locks.LockStateMachine:
    """The applied state of a snapshot image of either layout (the address book of a
    format 2 image goes to ``membership``)."""
    try:
        item = cbor2.loads(data)
    except Exception as exc:
        raise ValueError(f"snapshot image is corrupt: {exc!r}") from None
    if isinstance(item, dict) and item.get("format") in NODE_IMAGE_FORMATS:
        lock_image = item.get("locks")
        members = item.get("members")
        if not isinstance(lock_image, bytes) or not isinstance(members, dict):
            raise ValueError("snapshot image has an unknown layout")
        machine = lock_machine_class.restore(lock_image)
        machine.identities = identities_of(item)
        if item["format"] == NODE_IMAGE_FORMAT:
            machine.ledger = lock_machine_class.ledger_class.restore(item.get("ledger"))
            # From cluster version 5 (absent before: no settings).
            machine.settings = locks.ClusterSettings.restore(item.get("settings"))
        membership.restore(members, item.get("removed", []))
        return machine
    return lock_machine_class.restore(data)


def image(machine: locks.LockStateMachine, raft: RaftNode, membership: Membership) -> bytes:
    """The image of the applied state, in the layout the cluster's version reads."""
    lock_image = machine.snapshot()
    if machine.version < 2:
        return lock_image  # what a member of the previous release restores
    # The members of the configuration in force here, with the addresses their entries gave.
    members = membership.image_members(raft.conf_state_at(machine.applied_index))
    layout: dict[str, object] = {
        "format": NODE_IMAGE_FORMAT_V2,
        "locks": lock_image,
        "members": members,
        "removed": sorted(membership.removed),
    }
    if machine.version >= 3:
        layout.update(identities_layout(machine.identities, machine.version))
    if machine.version >= 4:
        layout["ledger"] = machine.ledger.image()
    if machine.version >= 5:
        # Format 4 still: a key older members never see (no such member at version 5).
        layout["settings"] = machine.settings.image()
    return bytes(cbor2.dumps(layout, canonical=True))


def identities_layout(table: IdentityTable, version: int) -> dict[str, object]:
    """The parts of a node image that carry the identity table, in the layout of cluster
    ``version`` (3 or later): format 3 at version 3, which members of the previous release
    read, and format 4 (limits, removals) from version 4 on."""
    if version < 4:
        return {"format": NODE_IMAGE_FORMAT_V3, "identities": table.image(with_limits=False)}
    return {
        "format": NODE_IMAGE_FORMAT,
        "identities": table.image(),
        "identity_removals": table.removals_image(),
    }


def identities_of(item: dict[Any, Any]) -> IdentityTable:
    """The identity table of a node image of any format (empty in format 2);
    ValueError for a malformed one."""
    layout = item.get("format")
    if layout == NODE_IMAGE_FORMAT_V2:
        return IdentityTable()
    if layout == NODE_IMAGE_FORMAT_V3:
        return IdentityTable.restore(item.get("identities"), with_limits=False)
    return IdentityTable.restore(item.get("identities"), item.get("identity_removals"))


@dataclass(frozen=True, slots=True)
class ImageContents:
    """What an image holds, as ``dlm snapshot inspect`` reports it."""

    leases: int
    locks: int
    """Held lock slots (a semaphore with three holders counts three)."""
    waiters: int
    highest_token: int
    """The highest fencing token among the held locks (0 when none is held)."""
    longest_ttl_ms: int
    """The default quarantine of a restore from this image: see ``longest_ttl_source``."""
    longest_ttl_source: str
    """``recorded``: the longest TTL the cluster ever granted, as its replicated state
    records it; ``leases``: the longest TTL among the leases in the image (an image from
    before that record existed)."""
    addresses: dict[str, str]
    """The members' addresses as the image records them (empty for a version-1 image)."""
    cluster_version: int


def describe_image(data: bytes, index: int) -> ImageContents:
    """Opens an image of either layout as a member restoring it would, and counts what it
    holds; ValueError (a sentence) if it is not an image of the applied state at ``index``."""
    try:
        item = cbor2.loads(data)
    except Exception:
        raise ValueError("its image is not CBOR") from None
    addresses: dict[str, str] = {}
    lock_image: object = data
    if isinstance(item, dict):
        lock_image = item.get("locks")
        members = item.get("members")
        if not isinstance(lock_image, bytes) or not isinstance(members, dict):
            raise ValueError("its image has an unknown layout")
        addresses = {str(k): str(v) for k, v in members.items()}
    assert isinstance(lock_image, bytes)
    machine = locks.LockStateMachine.restore(lock_image)
    if machine.applied_index != index:
        raise ValueError(f"its image is at index {machine.applied_index}, its header says {index}")
    counts = machine.counts()
    views, _ = machine.list_locks()
    highest = max((h.token for view in views for h in view.holders), default=0)
    if machine.max_ttl_ms > 0:
        # What a restore's default quarantine covers (locks.longest_ttl_ms).
        longest, source = locks.longest_ttl_ms(machine), "recorded"
    else:
        longest = max((ttl for _, ttl, _ in machine.leases()), default=0)
        source = "leases"
    return ImageContents(
        leases=counts.sessions,
        locks=counts.locks,
        waiters=counts.waiters,
        highest_token=highest,
        longest_ttl_ms=longest,
        longest_ttl_source=source,
        addresses=addresses,
        cluster_version=machine.version,
    )
