"""Options shared by all test directories (`pytest tests` and `pytest tests/sim` accept them),
and the signal dispositions every test starts from."""

from __future__ import annotations

import signal

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Started under nohup, or as a background job of a script, the test run inherits
    # SIGHUP or SIGINT ignored, and so would every `dlm` it starts: dlm rightly keeps an
    # ignored signal ignored (as CMD would), and the tests of what a signal does would see
    # nothing happen. They test what a user's terminal gives: the default dispositions.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sim-seeds",
        action="store",
        default=None,
        metavar="START:COUNT",
        help="run the simulator on exactly seeds START .. START+COUNT-1 (default: the CI range)",
    )
