"""One clock for every lease deadline of a host, and one that runs on in a suspend."""

from __future__ import annotations

import sys
import time

import pytest

from dlm.cli import guard
from dlm.client import aio, clock, sync


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CLOCK_BOOTTIME is Linux's")
def test_on_linux_the_lease_clock_is_boottime() -> None:
    assert clock.CLOCK_NAME == "CLOCK_BOOTTIME"
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    reading = clock.lease_clock()
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert before <= reading <= after


def test_the_lease_clock_never_runs_backwards() -> None:
    readings = [clock.lease_clock() for _ in range(1000)]
    assert readings == sorted(readings)


def test_the_guard_and_every_keep_alive_read_the_same_clock() -> None:
    # A deadline the supervisor hands its guard must mean the same instant in both.
    for module in (guard, sync, aio):
        assert module.lease_clock is clock.lease_clock, module.__name__


def test_waiting_for_a_deadline_looks_at_the_clock_at_least_every_100ms() -> None:
    from dlm.cli import exec_rules

    assert clock.RECHECK_S <= 0.1
    assert exec_rules.RECHECK_S <= 0.1
    assert guard.IDLE_WAKE_S <= 0.1
