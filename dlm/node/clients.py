"""The client connections a member serves, and who waits for a grant push.

A queued acquire leaves its connection waiting for the (lease, key) it asked for:
when the lock is granted (by apply, or inside an installed snapshot) the grant is
pushed to every connection waiting for it, and a connection that closes, or a lease
that ends, stops the wait. Connections that keep sending bad requests are closed.
Pure: part of the node machine (machine.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlm.node import locks
from dlm.node.outbox import CloseConnection, Instant, Outbox
from dlm.wire import ErrorCode, error, grant_push

MAX_BAD_REQUESTS = 16
"""Bad requests of any kind tolerated on one client connection before it is closed."""


@dataclass(slots=True, eq=False)
class ClientConn:
    conn: int
    remote: str
    identity: str = ""
    """Who the connection authenticated as ("" when nothing named anyone): the owner of the
    leases it opens, and whose quotas it counts against. The runtime always names one
    (admission.py: ``admin`` for the cluster's client secret or none); "" counts as the
    built-in admin for the permission rule (identities.py)."""
    waiting: set[tuple[str, str]] = field(default_factory=set)
    """(lease, key) pairs this connection waits for a grant push on."""
    bad_requests: int = 0
    inflight: int = 0
    """Requests received and not yet answered (the per-identity quota bounds it)."""


class Clients:
    """Open connections by number, and the connections waiting on each (lease, key)."""

    def __init__(self) -> None:
        self.conns: dict[int, ClientConn] = {}
        self.waiters: dict[tuple[str, str], list[int]] = {}
        self._per_identity: dict[str, int] = {}

    def connected(self, conn: int, remote: str, identity: str = "") -> None:
        if conn in self.conns:
            self.closed(conn)
        self.conns[conn] = ClientConn(conn, remote, identity)
        self._per_identity[identity] = self._per_identity.get(identity, 0) + 1

    def connections_of(self, identity: str) -> int:
        """Open connections of ``identity`` on this member."""
        return self._per_identity.get(identity, 0)

    def answered(self, conn: int) -> None:
        """One request of ``conn`` was answered (every answer leaves through the outbox)."""
        state = self.conns.get(conn)
        if state is not None and state.inflight > 0:
            state.inflight -= 1

    def close_identity(self, name: str, out: Outbox) -> None:
        """Closes every connection of identity ``name`` (it was removed)."""
        for state in [s for s in self.conns.values() if s.identity == name]:
            out.emit(CloseConnection(state.conn, f"identity {name!r} was removed"))

    def closed(self, conn: int) -> None:
        state = self.conns.pop(conn, None)
        if state is None:
            return
        left = self._per_identity[state.identity] - 1
        if left:
            self._per_identity[state.identity] = left
        else:
            del self._per_identity[state.identity]
        for pair in state.waiting:
            conns = self.waiters.get(pair)
            if conns is not None and conn in conns:
                conns.remove(conn)
                if not conns:
                    del self.waiters[pair]

    def bad_request(
        self,
        state: ClientConn,
        kind: str,
        rid: int | None,
        code: ErrorCode,
        message: str,
        *,
        now: Instant,
        out: Outbox,
    ) -> None:
        state.bad_requests += 1
        out.reject(now, "client_bad_request", remote=state.remote, error=message)
        out.answer(state.conn, kind, error(rid, code, message))
        if state.bad_requests > MAX_BAD_REQUESTS:
            out.emit(CloseConnection(state.conn, "too many bad requests"))

    def register_waiter(self, conn: int, lease: str, key: str) -> None:
        state = self.conns.get(conn)
        if state is None:
            return
        conns = self.waiters.setdefault((lease, key), [])
        if conn not in conns:
            conns.append(conn)
        state.waiting.add((lease, key))

    def push_grant(self, lease: str, key: str, token: int, out: Outbox) -> None:
        conns = self.waiters.pop((lease, key), None)
        if not conns:
            return
        frame = grant_push(lease, key, token)
        for conn in conns:
            state = self.conns.get(conn)
            if state is not None:
                state.waiting.discard((lease, key))
                out.reply(conn, frame)

    def drop_waiter(self, lease: str, key: str, conns: list[int]) -> None:
        self.waiters.pop((lease, key), None)
        for conn in conns:
            state = self.conns.get(conn)
            if state is not None:
                state.waiting.discard((lease, key))

    def left_office(self, out: Outbox) -> None:
        """This member stopped leading: close every connection waiting for a grant.

        Only the leader queues a waiter, and a member that lost office may never apply
        the grant (cut off from the others, it stepped down for want of a quorum):
        its waiters would sit out their whole wait while another member's commit
        granted them the lock. A closed connection is what every client already
        handles: it re-sends the same acquire, and the new leader answers from its
        state (granted, or queued there).
        """
        if not self.waiters:
            return
        self.waiters = {}
        for state in self.conns.values():
            if state.waiting:
                state.waiting.clear()
                out.emit(CloseConnection(state.conn, "stopped leading: re-send the acquire"))

    def forget_lease(self, lease: str) -> None:
        if not self.waiters:
            return
        for pair in [p for p in self.waiters if p[0] == lease]:
            self.drop_waiter(*pair, self.waiters[pair])

    def after_snapshot(self, machine: locks.LockStateMachine, out: Outbox) -> None:
        """Grants that happened inside an installed snapshot never passed through apply:
        push them now, and stop waits whose lease the snapshot no longer has."""
        for (lease, key), conns in list(self.waiters.items()):
            state = machine.get(key)
            for holder in state.holders if state is not None else ():
                if holder.lease == lease:
                    self.push_grant(lease, key, holder.token, out)
                    break
            else:
                if machine.lease_terms(lease) is None:
                    self.drop_waiter(lease, key, conns)
