"""How many connections a member takes: its descriptor budget, from the open-files limit."""

from __future__ import annotations

from dlm.node.runtime.accepting import FD_RESERVE, HANDSHAKE_ROOM, MAX_CONNECTIONS, Budget, Limits


def test_a_large_limit_leaves_the_configured_cap() -> None:
    budget = Budget(1 << 20, peers=3, max_clients=MAX_CONNECTIONS)
    assert budget.clients == MAX_CONNECTIONS
    assert budget.transports == (1 << 20) - FD_RESERVE - 3


def test_a_small_limit_lowers_the_cap_and_keeps_room_for_peers_and_newcomers() -> None:
    budget = Budget(1024, peers=5, max_clients=MAX_CONNECTIONS)
    assert budget.transports == 1024 - FD_RESERVE - 5
    # Clients full, the five inbound peers and HANDSHAKE_ROOM newcomers still fit.
    assert budget.clients + 5 + HANDSHAKE_ROOM == budget.transports


def test_a_tiny_limit_still_serves_someone() -> None:
    budget = Budget(64, peers=3, max_clients=MAX_CONNECTIONS)
    assert budget.clients >= 1 and budget.transports >= 8


def test_the_default_timeouts_are_a_few_seconds_and_two_minutes_idle() -> None:
    limits = Limits()
    assert limits.hello_timeout <= 5.0
    assert limits.frame_stall_timeout <= 5.0
    assert limits.idle_timeout == 120.0
