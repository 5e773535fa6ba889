"""Recovery after the network failures of issue 20 (item 5), with real members in network
namespaces (netns.py): a healed follower catches up within 2 s, and the cluster serves
within 3 s when the other follower dies right after.

The short case (a 3.5 s cut: TCP's retransmission back-off already waits 2.7 s by then)
runs under `make test` wherever network namespaces can be made (Linux, root); the long
ones (``DLM_CHAOS_NETNS=1``, which `make chaos` sets) cut for 30 s, lose only the
follower's traffic for 30 s, drop the leader's outbound traffic for 15 s, and lose 30 %
of every packet on every link for 20 s. Skipped, saying why, where namespaces (or, for
the lossy links, a random packet filter) cannot be made.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos import netns

# serial: network namespaces are the machine's, and the recovery bounds are timed.
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

CATCH_UP_S = 2.0
SERVE_S = 3.0
LONG = os.environ.get("DLM_CHAOS_NETNS") == "1"


@pytest.fixture(scope="module")
def namespaces() -> None:
    why = netns.available()
    if why is not None:
        pytest.skip(why)


@pytest.mark.parametrize(
    "cut_s",
    [
        3.5,
        pytest.param(
            30.0, marks=pytest.mark.skipif(not LONG, reason="long: make chaos (DLM_CHAOS_NETNS=1)")
        ),
    ],
)
def test_a_healed_follower_catches_up_and_the_cluster_survives_losing_the_other_follower(
    namespaces: None, cut_s: float, tmp_path: Path
) -> None:
    with netns.lab(tmp_path) as lab:
        recovery = netns.cut_then_heal(lab, cut_s)
    print(f"cut {cut_s}s: {recovery}")
    assert recovery.cut_then_heal_s <= CATCH_UP_S, recovery
    assert recovery.kill_other_follower_s <= SERVE_S, recovery


@pytest.mark.skipif(not LONG, reason="long: make chaos (DLM_CHAOS_NETNS=1)")
def test_after_one_way_loss_the_cluster_survives_losing_the_other_follower(
    namespaces: None, tmp_path: Path
) -> None:
    """Only the follower's traffic is lost: it still hears the leader, but its answers
    wait in a connection that backs off; then the other follower dies."""
    with netns.lab(tmp_path) as lab:
        recovery = netns.cut_then_heal(lab, 30.0, one_way=True)
    print(f"one-way loss for 30s: {recovery}")
    assert recovery.cut_then_heal_s <= CATCH_UP_S, recovery
    assert recovery.kill_other_follower_s <= SERVE_S, recovery


@pytest.mark.skipif(not LONG, reason="long: make chaos (DLM_CHAOS_NETNS=1)")
def test_a_leader_whose_outbound_traffic_is_lost_is_replaced_at_once(
    namespaces: None, tmp_path: Path
) -> None:
    with netns.lab(tmp_path) as lab:
        served = netns.leader_outbound_dropped(lab, 15.0)
    print(f"leader's outbound traffic dropped: a write succeeded after {served}s")
    assert served <= SERVE_S


LOSSY_FIRST_WRITE_S = 5.0
LOSSY_TERMS = 5


@pytest.mark.skipif(not LONG, reason="long: make chaos (DLM_CHAOS_NETNS=1)")
def test_on_links_that_lose_30_percent_of_packets_writes_keep_succeeding(
    tmp_path: Path,
) -> None:
    """Every member loses 30 % of what it sends, to its peers and to the clients, for
    20 s: a leader is elected and stays, and most writes succeed (issue 20, item 5: the
    issue saw terms 4 -> 16 and no write in 20 s). Writes are tried one after another,
    each with 2 s, each on a new connection whose own handshake suffers the loss."""
    why = netns.loss_available()
    if why is not None:
        pytest.skip(why)
    with netns.lab(tmp_path) as lab:
        lossy = netns.lossy_links(lab, 30, 20.0)
    print(f"30% loss on every link for 20s: {lossy}")
    assert lossy.first_write_s <= LOSSY_FIRST_WRITE_S, lossy
    assert lossy.writes_ok * 2 >= lossy.writes_tried, lossy
    assert lossy.terms <= LOSSY_TERMS, lossy
