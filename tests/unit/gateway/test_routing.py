"""The gateway's pure decisions: reading routing bytes and choosing the member."""

from __future__ import annotations

import pytest

from dlm.gateway.routing import GatewayRouter
from dlm.partitioning import (
    MAX_PARTITIONS,
    TARGET_MAGIC,
    Routing,
    preamble,
    read_routing,
    target_preamble,
)

MEMBERS = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


def _read_all(data: bytes) -> Routing | None:
    """Feeds ``data`` to read_routing the way the gateway does: exactly what it asks."""
    have = 0
    for _ in range(5):
        answer = read_routing(data[:have])
        if not isinstance(answer, int):
            return answer
        assert have < answer <= len(TARGET_MAGIC) + 2 + 255
        have = answer
    raise AssertionError("read_routing kept asking")


def test_target_preamble_round_trips() -> None:
    data = target_preamble(3, "10.0.0.7:7000")
    assert data == b"\xffDLMG\x03\x0d10.0.0.7:7000"
    assert _read_all(data + b"\x00\x00hello") == Routing(3, "10.0.0.7:7000", len(data))


def test_partition_zero_target_and_longest_address() -> None:
    address = "h" * 249 + ":65535"
    data = target_preamble(0, address)
    assert _read_all(data) == Routing(0, address, 7 + 255)


def test_partition_preamble_and_plain_first_bytes() -> None:
    assert _read_all(preamble(5) + b"\x16\x03") == Routing(5, None, 6)
    assert read_routing(b"\x00") == Routing(0, None, 0)
    assert read_routing(b"\x16") == Routing(0, None, 0)
    assert read_routing(b"") == 1


@pytest.mark.parametrize(
    "data",
    [
        b"\xffDLMX\x01",
        b"\xffDLMP\x00",
        b"\xffDLMP" + bytes([MAX_PARTITIONS]),
        TARGET_MAGIC + bytes([MAX_PARTITIONS, 3]) + b"a:1",
        TARGET_MAGIC + bytes([1, 0]),
        TARGET_MAGIC + bytes([1, 3]) + b"a 1",
        TARGET_MAGIC + bytes([1, 3]) + b"a\xff1",
    ],
)
def test_malformed_routing_bytes_are_refused(data: bytes) -> None:
    assert _read_all(data) is None


@pytest.mark.parametrize("address", ["", "h" * 256, "hôte:1"])
def test_target_preamble_refuses_what_it_cannot_carry(address: str) -> None:
    with pytest.raises(ValueError):
        target_preamble(1, address)
    with pytest.raises(ValueError):
        target_preamble(MAX_PARTITIONS, "a:1")


def test_a_target_outside_the_known_members_is_refused() -> None:
    router = GatewayRouter(MEMBERS)
    assert router.plan(0, "127.0.0.1:9999") is None
    assert router.plan(0, "evil.example:7001") is None
    assert router.plan(0, "not an address:x") is None
    assert router.hint(0) is None


def test_a_known_target_is_dialed_alone_and_becomes_the_hint() -> None:
    router = GatewayRouter(MEMBERS)
    assert router.plan(2, "127.0.0.1:7003") == ["127.0.0.1:7003"]
    assert router.hint(2) == "127.0.0.1:7003"
    assert router.hint(0) is None
    # The next client of partition 2 that names no one goes to the hint first.
    assert router.plan(2, None) == ["127.0.0.1:7003", "127.0.0.1:7001", "127.0.0.1:7002"]


def test_the_client_named_target_wins_over_the_hint() -> None:
    router = GatewayRouter(MEMBERS)
    router.plan(0, "127.0.0.1:7002")
    assert router.plan(0, "127.0.0.1:7001") == ["127.0.0.1:7001"]
    assert router.hint(0) == "127.0.0.1:7001"


def test_without_a_hint_members_rotate_each_once() -> None:
    router = GatewayRouter(MEMBERS)
    firsts = [router.plan(0, None) for _ in range(3)]
    assert [plan[0] for plan in firsts if plan] == MEMBERS
    for plan in firsts:
        assert plan is not None and sorted(plan) == sorted(MEMBERS)


def test_a_failed_dial_forgets_the_hint() -> None:
    router = GatewayRouter(MEMBERS)
    router.plan(1, "127.0.0.1:7002")
    router.dial_failed(1, "127.0.0.1:7001")  # not the hint: kept
    assert router.hint(1) == "127.0.0.1:7002"
    router.dial_failed(1, "127.0.0.1:7002")
    assert router.hint(1) is None


def test_members_are_compared_in_canonical_form() -> None:
    router = GatewayRouter(["127.0.0.1:7001", " 127.0.0.1:7001", "[::1]:7002"])
    assert router.members == ("127.0.0.1:7001", "[::1]:7002")
    assert router.plan(0, "[::1]:7002") == ["[::1]:7002"]
    with pytest.raises(ValueError):
        GatewayRouter([])
