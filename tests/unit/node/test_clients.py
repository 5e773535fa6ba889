"""Client connections on their own: grant pushes reach the waiting connections only."""

from __future__ import annotations

from dlm.node.clients import MAX_BAD_REQUESTS, Clients
from dlm.node.outbox import CloseConnection, Instant, Outbox, SendFrame
from dlm.node.stats import Stats
from dlm.wire import ErrorCode

NOW = Instant(1.0, 0)


def _room() -> tuple[Clients, Outbox]:
    clients = Clients()
    return clients, Outbox(Stats(), clients.conns)


def test_a_grant_is_pushed_to_each_waiting_connection_once() -> None:
    clients, out = _room()
    for conn in (1, 2, 3):
        clients.connected(conn, f"127.0.0.1:{conn}")
    clients.register_waiter(1, "L", "k")
    clients.register_waiter(2, "L", "k")
    clients.register_waiter(2, "L", "k")  # a re-sent acquire waits once
    clients.push_grant("L", "k", 7, out)
    clients.push_grant("L", "k", 7, out)
    sent = [a for a in out.take() if isinstance(a, SendFrame)]
    assert [a.conn for a in sent] == [1, 2]
    assert not clients.waiters
    assert not clients.conns[1].waiting


def test_a_closed_connection_or_an_ended_lease_stops_waiting() -> None:
    clients, out = _room()
    clients.connected(1, "a")
    clients.connected(2, "b")
    clients.register_waiter(1, "L", "k")
    clients.register_waiter(2, "M", "k")
    clients.closed(1)
    clients.forget_lease("M")
    clients.push_grant("L", "k", 7, out)
    clients.push_grant("M", "k", 8, out)
    assert out.take() == []
    assert not clients.waiters


def test_a_connection_is_closed_after_too_many_bad_requests() -> None:
    clients, out = _room()
    clients.connected(1, "a")
    state = clients.conns[1]
    for _ in range(MAX_BAD_REQUESTS + 1):
        clients.bad_request(state, "invalid", None, ErrorCode.BAD_REQUEST, "bad", now=NOW, out=out)
    actions = out.take()
    assert sum(isinstance(a, SendFrame) for a in actions) == MAX_BAD_REQUESTS + 1
    assert isinstance(actions[-1], CloseConnection)


def test_a_member_that_stops_leading_closes_only_the_connections_waiting_for_a_grant() -> None:
    """Cut off, the old leader never applies the grant the new leader commits: its waiters
    must re-send their acquire elsewhere rather than sit out their wait (chaos seed 0)."""
    clients, out = _room()
    for conn in (1, 2, 3):
        clients.connected(conn, f"127.0.0.1:{conn}")
    clients.register_waiter(1, "L", "k")
    clients.register_waiter(2, "M", "j")
    clients.register_waiter(2, "M", "k")
    clients.left_office(out)
    closed = [a.conn for a in out.take() if isinstance(a, CloseConnection)]
    assert closed == [1, 2]
    assert not clients.waiters and 3 in clients.conns
    clients.left_office(out)
    assert out.take() == []
