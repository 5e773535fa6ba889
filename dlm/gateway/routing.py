"""Which member a gateway relays a connection to: the pure room of `dlm gateway`.

A gateway knows its members (its --cluster addresses) and nothing else of the
cluster. Each accepted connection arrives with a ``Routing`` (dlm/partitioning.py
``read_routing``): a partition, and possibly a target member the client names
(after a member told it NOT_LEADER and who leads). ``GatewayRouter.plan`` turns
that into the members to dial, in order:

* a target that is not one of the known members is refused (None): the gateway
  is never an open relay to wherever a client points it;
* a known target is dialed alone (the client asked for that member; if it is
  down the client hears the connection close and asks again without a target),
  and becomes the partition's leader hint;
* without a target: the partition's hint first, then every known member in a
  rotating order (each plan starts one further on, spreading first contacts),
  each at most once.

``dial_failed`` forgets a hint whose member could not be dialed. A hint is only
a guess: a wrong one costs the next client one NOT_LEADER redirect, never
safety, because the member the connection reaches decides everything. The
router holds nothing else, so a restarted gateway (hints lost) routes correctly
from its first connection.

Pure: no IO, no clock, no randomness (tests/unit/node/test_purity.py). Used by
dlm/gateway/relay.py and by the simulator (tests/sim/nodesim.py).
Tested by tests/unit/gateway/test_routing.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlm.partitioning import MAX_PARTITIONS
from dlm.wire import format_addr, parse_addr


def canonical(address: str) -> str | None:
    """``address`` as HOST:PORT the way members are compared (None: not an address)."""
    try:
        return format_addr(*parse_addr(address))
    except ValueError:
        return None


class GatewayRouter:
    """A gateway's routing state: its known members and a leader hint per partition."""

    __slots__ = ("_hints", "_turn", "members")

    def __init__(self, members: Sequence[str], start: int = 0) -> None:
        known: list[str] = []
        for member in members:
            address = canonical(member)
            if address is None:
                raise ValueError(f"bad member address {member!r}")
            if address not in known:
                known.append(address)
        if not known:
            raise ValueError("a gateway needs at least one member")
        self.members: tuple[str, ...] = tuple(known)
        self._turn = start % len(known)
        self._hints: dict[int, str] = {}

    def hint(self, partition: int) -> str | None:
        """The member last named as ``partition``'s leader (None: none known)."""
        return self._hints.get(partition)

    def plan(self, partition: int, target: str | None) -> list[str] | None:
        """The members to dial for a connection to ``partition`` naming ``target``, in
        order (the first that answers takes it); None: refuse the connection."""
        if not 0 <= partition < MAX_PARTITIONS:
            return None
        if target is not None:
            address = canonical(target)
            if address is None or address not in self.members:
                return None
            self._hints[partition] = address
            return [address]
        order: list[str] = []
        hinted = self._hints.get(partition)
        if hinted is not None:
            order.append(hinted)
        count = len(self.members)
        for step in range(count):
            member = self.members[(self._turn + step) % count]
            if member not in order:
                order.append(member)
        self._turn = (self._turn + 1) % count
        return order

    def dial_failed(self, partition: int, member: str) -> None:
        """``member`` could not be dialed for ``partition``: it is no hint any more."""
        if self._hints.get(partition) == member:
            del self._hints[partition]
