"""LinkWatch: which outbound peer connections are replaced, and when (dlm/node/linkwatch.py)."""

from __future__ import annotations

import pytest

from dlm.node.linkwatch import LinkWatch


def test_a_connection_with_data_and_no_acknowledgement_for_stall_after_is_replaced() -> None:
    watch = LinkWatch(0.3)
    assert not watch.observe(10.0, outstanding=True, acknowledged=0)
    assert not watch.observe(10.29, outstanding=True, acknowledged=0)
    assert watch.observe(10.3, outstanding=True, acknowledged=0)
    assert watch.waiting_since == 10.0


def test_an_idle_connection_is_never_suspect() -> None:
    watch = LinkWatch(0.3)
    for step in range(100):
        assert not watch.observe(step * 1.0, outstanding=False, acknowledged=0)


def test_acknowledgements_keep_a_busy_connection_however_long_it_stays_busy() -> None:
    watch = LinkWatch(0.3)
    for step in range(100):
        # Always something in flight, but the peer acknowledges a little every 0.2 s.
        assert not watch.observe(step * 0.2, outstanding=True, acknowledged=step)


def test_the_wait_counts_from_the_last_acknowledgement() -> None:
    watch = LinkWatch(0.3)
    watch.observe(0.0, outstanding=True, acknowledged=0)
    assert not watch.observe(0.25, outstanding=True, acknowledged=100)
    assert not watch.observe(0.5, outstanding=True, acknowledged=100)
    assert watch.observe(0.55, outstanding=True, acknowledged=100)


def test_everything_acknowledged_ends_the_wait() -> None:
    watch = LinkWatch(0.3)
    watch.observe(0.0, outstanding=True, acknowledged=0)
    watch.observe(0.2, outstanding=False, acknowledged=50)
    assert watch.waiting_since is None
    # New data later starts a new wait.
    assert not watch.observe(5.0, outstanding=True, acknowledged=50)
    assert not watch.observe(5.2, outstanding=True, acknowledged=50)
    assert watch.observe(5.31, outstanding=True, acknowledged=50)


def test_a_new_connection_starts_afresh() -> None:
    watch = LinkWatch(0.3)
    watch.observe(0.0, outstanding=True, acknowledged=7)
    assert watch.observe(1.0, outstanding=True, acknowledged=7)
    watch.connected()
    assert not watch.stalled(1.0)
    # The new connection's counter starts again from 0: that is no progress, but no stall
    # either until data waits on it.
    assert not watch.observe(1.1, outstanding=True, acknowledged=0)
    assert watch.observe(1.41, outstanding=True, acknowledged=0)


def test_stall_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LinkWatch(0)


def test_a_connection_whose_retransmission_comes_sooner_than_a_new_ones_is_kept() -> None:
    """Silent for long, but TCP retries within 0.4 s: a new connection, whose lost SYN
    waits 1 s, could not do better (a lossy link, not a dead one)."""
    watch = LinkWatch(0.3)
    for step in range(30):
        assert not watch.observe(step * 0.1, outstanding=True, acknowledged=0, retransmit_after=0.4)


def test_a_connection_whose_retransmissions_backed_off_past_a_new_ones_is_replaced() -> None:
    watch = LinkWatch(0.3)
    assert not watch.observe(0.0, outstanding=True, acknowledged=0, retransmit_after=0.2)
    assert not watch.observe(0.5, outstanding=True, acknowledged=0, retransmit_after=0.8)
    assert watch.observe(1.4, outstanding=True, acknowledged=0, retransmit_after=1.6)


def test_the_backed_off_timer_alone_is_not_enough_without_the_silence() -> None:
    watch = LinkWatch(0.3, worth_replacing=0.5)
    assert not watch.observe(0.0, outstanding=True, acknowledged=0, retransmit_after=52.0)
    assert not watch.observe(0.29, outstanding=True, acknowledged=0, retransmit_after=52.0)
    assert watch.observe(0.3, outstanding=True, acknowledged=0, retransmit_after=52.0)
