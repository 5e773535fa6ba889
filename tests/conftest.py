"""Options shared by all test directories (`pytest tests` and `pytest tests/sim` accept them),
the signal dispositions every test starts from, and how tests share workers under xdist.

``PYTEST_WORKERS=4 make test`` runs the suite on four pytest-xdist workers (``--dist loadgroup``):
most tests wait on processes and sockets, not on the CPU. Two kinds of test are kept
together on one worker, by xdist_group:

- those marked ``serial`` run one after another on a worker of their own group: they use
  fixed ports or machine-wide resources (network namespaces), load the whole machine
  (floods, chaos schedules), or time what they do against a bound; ``serial("name")``
  makes a group of its own, for tests that only race each other (the dev clusters' ports);
- those that share a fixture wider than a test (a module's cluster of three members, a
  built zipapp) run on the worker that made it, so it is made once, not once per worker.

`make test` itself runs two workers with ``--processes-on-one-worker``: every test that
starts processes (tests/cluster, tests/chaos, tests/compat) runs on one of them, one after
another as without xdist, while the simulator and the unit tests run on the other.
"""

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


SERIAL_GROUP = "serial"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (it renames the items)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    one_worker = config.getoption("--processes-on-one-worker")
    for item in items:
        if one_worker and _starts_processes(item):
            # Every test that starts members runs on one worker, one after another, as
            # without xdist; the simulator and the unit tests share the other workers.
            item.add_marker(pytest.mark.xdist_group(PROCESS_GROUP))
            continue
        serial = item.get_closest_marker("serial")
        if serial is not None:
            # serial("name"): a group of its own, for tests that only race each other.
            group = f"{SERIAL_GROUP}-{serial.args[0]}" if serial.args else SERIAL_GROUP
            item.add_marker(pytest.mark.xdist_group(group))
        elif _shares_a_wide_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


PROCESS_GROUP = "processes"
PROCESS_DIRS = ("chaos", "cluster", "compat")
"""The test folders whose tests start members and clients as processes."""


def _starts_processes(item: pytest.Item) -> bool:
    parts = item.nodeid.split("/")
    return len(parts) > 2 and parts[0] == "tests" and parts[1] in PROCESS_DIRS


def _shares_a_wide_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses one of our fixtures (not pytest's, like tmp_path_factory) that
    lives longer than a test."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs and defs[-1].scope != "function" and defs[-1].baseid
        for defs in info.name2fixturedefs.values()
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--processes-on-one-worker",
        action="store_true",
        default=False,
        help="under xdist, run every test of tests/cluster, tests/chaos and tests/compat on "
        "one worker, one at a time (make test: they wait on processes; the simulator and "
        "the unit tests, which compute, run beside them on the other workers)",
    )
    parser.addoption(
        "--sim-seeds",
        action="store",
        default=None,
        metavar="START:COUNT",
        help="run the simulator on exactly seeds START .. START+COUNT-1 (default: the CI range)",
    )
