"""dlm.testing's port picker: listening ports come from outside the kernel's ephemeral range.

A port from ``bind(0)`` could be taken by one of the test's own outgoing connections
before the member binds it (a member of a fresh cluster then fails to start, and the
test meets ConnectionRefused); ports below the ephemeral range never are.
"""

from __future__ import annotations

import socket

import pytest

from dlm.testing import processes
from dlm.testing.processes import free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    span = processes._listening_ports()
    if span is None:
        pytest.skip("this kernel does not say its ephemeral port range")
    ports = free_ports(8) + free_ports(8)
    assert len(set(ports)) == 16
    low, high = span
    assert all(low <= port <= high for port in ports)
    for port in ports[:3]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over() -> None:
    if processes._listening_ports() is None:
        pytest.skip("this kernel does not say its ephemeral port range")
    taken = free_ports(1)[0]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        processes._next_port[0] = taken  # the next pick would be the port held
        assert taken not in free_ports(2)


def test_without_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE_FILE", "/nonexistent/port_range")
    ports = free_ports(3)
    assert len(set(ports)) == 3
