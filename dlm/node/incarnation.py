"""A new incarnation of a cluster: the first state of a restored or recovered cluster.

``dlm node restore`` (from a backup file) and ``dlm node recover --force`` (from the
log of the one survivor of a lost majority) both end here: an applied state, the index
it stands for, and the rules that make the new cluster safe to serve from:

* **The token jump.** The new log continues at the old index plus ``bump`` (default
  2**32), so every fencing token the new cluster hands out (the index of its grant) is
  above every token the old cluster could have handed out after the backup, or after
  the last entry the survivor received: it assumes the old cluster wrote fewer than
  ``bump`` entries after that point. The first index must stay below ``INDEX_CEILING``
  so that tokens stay below 2**53 (exact in JSON) for a long while.
* **The quarantine.** The new cluster grants nothing until its first leader has been in
  office for the quarantine (a later leader counts it afresh from its own election), so
  every holder that took a lock after the backup has lost it by then. By default it
  covers the longest TTL the old cluster recorded (``--min-hold`` holds included), and
  is at least ``MIN_QUARANTINE_MS``.
* **The incarnation number** is the new first index minus one (the index of the image):
  every member built from one file with one bump agrees on it, and it differs from the
  old cluster's (0 for a cluster never restored), so members of the old incarnation
  cannot talk to the new one.

Pure: the runtime's builder (dlm/node/runtime/incarnation.py) reads and writes the disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import cbor2

from dlm.node import locks
from dlm.node.locks.ledger import RunLedger
from dlm.node.snapshots import (
    NODE_IMAGE_FORMAT,
    NODE_IMAGE_FORMATS,
    identities_layout,
    identities_of,
)

DEFAULT_BUMP = 2**32
"""How far the new log's first index is above the old one's last."""
INDEX_CEILING = 2**52
"""A new incarnation starts below this, leaving 2**52 indexes before tokens reach 2**53."""
MIN_QUARANTINE_MS = 30_000
"""The shortest default quarantine."""


class IncarnationError(ValueError):
    """A new incarnation cannot be made as asked; the message is one line to act on."""


@dataclass(frozen=True, slots=True)
class NewIncarnation:
    """The first state of a new incarnation: a snapshot ``image`` at ``index``."""

    index: int
    """The image's index; the new log continues at index + 1. Also the incarnation."""
    image: bytes
    quarantine_ms: int
    longest_ttl_ms: int
    """The longest lease TTL the old cluster recorded (what the quarantine must cover)."""
    warning: str | None
    """Set when the quarantine asked for is shorter than ``longest_ttl_ms``."""
    counts: locks.Counts


def parse_bump(text: str | None) -> int:
    """``--bump N`` (a positive whole number, ``_`` allowed; default 2**32)."""
    if text is None or not text.strip():
        return DEFAULT_BUMP
    raw = text.strip().replace("_", "")
    if not raw.isdigit() or int(raw) < 1 or int(raw) >= INDEX_CEILING:
        raise IncarnationError(
            f"--bump must be a whole number from 1 to 2**52 - 1; got {text.strip()!r}"
        )
    return int(raw)


def lock_machine_of(image: bytes) -> locks.LockStateMachine:
    """The lock state of a snapshot image of either node layout; IncarnationError if it
    is not one."""
    try:
        item = cbor2.loads(image)
        lock_image = image
        node_image = isinstance(item, dict) and item.get("format") in NODE_IMAGE_FORMATS
        if node_image:
            lock_image = item["locks"]
            if not isinstance(lock_image, bytes):
                raise ValueError("no lock image")
        machine = locks.LockStateMachine.restore(lock_image)
        if node_image:
            # The identities (their key verifiers, their limits) come along: a restored
            # cluster keeps the credentials its clients hold.
            machine.identities = identities_of(item)
        if node_image and item["format"] == NODE_IMAGE_FORMAT:
            # And the run ledger: a restored cluster still knows what ran before.
            machine.ledger = RunLedger.restore(item.get("ledger"))
            # And the cluster settings (`dlm config set`, version 5; none before).
            machine.settings = locks.ClusterSettings.restore(item.get("settings"))
        return machine
    except Exception as exc:
        raise IncarnationError(f"the state image cannot be read ({exc})") from None


def new_incarnation(
    machine: locks.LockStateMachine,
    *,
    last_index: int,
    bump: int,
    members: Mapping[str, str],
    quarantine_ms: int | None,
) -> NewIncarnation:
    """The image of a new incarnation whose log continues at ``last_index + bump + 1``,
    from ``machine`` (the old state, applied up to ``last_index`` or less), with
    ``members`` (id to address) as its address book. ``quarantine_ms`` None: the
    default. Changes ``machine``."""
    index = last_index + bump
    if index >= INDEX_CEILING:
        raise IncarnationError(
            f"the new log would start at {index + 1}, above 2**52: tokens near 2**53 are not "
            "exact in JSON; use a smaller --bump"
        )
    longest = locks.longest_ttl_ms(machine)
    default = max(MIN_QUARANTINE_MS, longest)
    warning = None
    if quarantine_ms is None:
        quarantine_ms = default
    elif quarantine_ms < longest:
        warning = (
            f"the quarantine ({quarantine_ms / 1000:g}s) is shorter than the longest lease TTL "
            f"the cluster recorded ({longest / 1000:g}s): a holder of the old cluster may "
            "still hold its lock when the new cluster grants it"
        )
    locks.start_incarnation(machine, index, quarantine_ms)
    image = bytes(
        cbor2.dumps(
            {
                "locks": machine.snapshot(),
                "members": dict(sorted(members.items())),
                "removed": [],
                **identities_layout(machine.identities, machine.version),
                **({"ledger": machine.ledger.image()} if machine.version >= 4 else {}),
                **({"settings": machine.settings.image()} if machine.version >= 5 else {}),
            },
            canonical=True,
        )
    )
    return NewIncarnation(index, image, quarantine_ms, longest, warning, machine.counts())


def members_book(members: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The address book of the new incarnation's members (id to HOST:PORT), sorted."""
    return dict(sorted(members))
