"""Snapshots of the applied state: when to take one, and the image's layout.

Every ``snapshot_every`` applied entries the machine records an image of the applied
state and lets the log be compacted up to ``snapshot_keep`` entries behind it. From
cluster version 2 the image holds the lock state and the address book of the
configuration in force at its index (``NODE_IMAGE_FORMAT``); at version 1, the bare
lock image, which a member of the previous release restores. Only replicated facts
go in, so every member's image at one index is the same bytes. Pure: part of the
node machine (machine.py).
"""

from __future__ import annotations

import cbor2

from dlm.node import locks
from dlm.node.locks.identities import IdentityTable
from dlm.node.membership import Membership
from dlm.node.outbox import Outbox, SaveSnapshot
from dlm.node.raft.core import RaftNode

NODE_IMAGE_FORMAT = 3
"""Layout of this member's snapshot image from cluster version 3: format 2 (version 2) and
the identity table (``identities``: names, roles, prefixes and key verifiers, never a
secret). Version 1: the bare lock image."""
NODE_IMAGE_FORMAT_V2 = 2
"""The layout at cluster version 2, without identities (still restored)."""


class Snapshots:
    """The index of the last image, and the rule for taking the next."""

    def __init__(self, out: Outbox, every: int, keep: int) -> None:
        self._out = out
        self._every = every
        self._keep = keep
        self.index = 0
        """The index of the last image taken or installed."""

    def take_if_due(
        self, machine: locks.LockStateMachine, raft: RaftNode, membership: Membership
    ) -> None:
        index = machine.applied_index
        if index - self.index < self._every:
            return
        data = image(machine, raft, membership)
        conf = raft.conf_state_at(index)
        keep_from = index - self._keep
        self._out.emit(SaveSnapshot(index, conf, data, max(0, keep_from)))
        self.index = index
        self._out.stats.snapshots_taken += 1
        self._out.log("info", "snapshot_taken", index=index, bytes=len(data))


def restore_image(
    data: bytes, lock_machine_class: type[locks.LockStateMachine], membership: Membership
) -> locks.LockStateMachine:
    """The applied state of a snapshot image of either layout (the address book of a
    format 2 image goes to ``membership``)."""
    try:
        item = cbor2.loads(data)
    except Exception as exc:
        raise ValueError(f"snapshot image is corrupt: {exc!r}") from None
    if isinstance(item, dict) and item.get("format") in (NODE_IMAGE_FORMAT_V2, NODE_IMAGE_FORMAT):
        lock_image = item.get("locks")
        members = item.get("members")
        if not isinstance(lock_image, bytes) or not isinstance(members, dict):
            raise ValueError("snapshot image has an unknown layout")
        machine = lock_machine_class.restore(lock_image)
        if item["format"] == NODE_IMAGE_FORMAT:
            machine.identities = IdentityTable.restore(item.get("identities"))
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
        layout["format"] = NODE_IMAGE_FORMAT
        layout["identities"] = machine.identities.image()
    return bytes(cbor2.dumps(layout, canonical=True))
