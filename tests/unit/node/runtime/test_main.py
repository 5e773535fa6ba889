"""`dlm node start`'s failures at start (a full disk: exit 74 and one line naming the directory
and the space; bad settings: exit 2 and one line), and the event loop it runs on."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from dlm import event_loop
from dlm.node.runtime import main
from dlm.node.runtime.config.node_config import election_timing
from dlm.store import StoreFull
from dlm.store.disk import DiskStorage

LINE = (
    "dlm node: error: no space left on /var/lib/dlm "
    "(needs at least 1.2 MB free; free some space and start again)"
)


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def start(tmp_path: Path) -> int:
    return main.start_node({"node_id": "n1", "listen": free_addr(), "data": str(tmp_path / "d")})


def test_a_full_disk_at_start_up_exits_74(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def full(*_: Any, **__: Any) -> None:
        raise StoreFull("/var/lib/dlm", 1_200_000)

    monkeypatch.setattr(DiskStorage, "open", full)
    assert start(tmp_path) == main.EXIT_IOERR == 74
    assert capsys.readouterr().err == LINE + "\n"


def test_a_full_disk_while_running_exits_74(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The runtime's task group wraps the failure; the line is the same."""

    async def run(*_: Any, **__: Any) -> None:
        async def persist() -> None:
            raise StoreFull("/var/lib/dlm", 1_200_000)

        async with anyio.create_task_group() as tg:
            tg.start_soon(persist)
            await anyio.sleep_forever()

    monkeypatch.setattr(main, "run", run)
    assert start(tmp_path) == 74
    # Before it, the JSON log (also on stderr) has the details.
    assert capsys.readouterr().err.splitlines()[-1] == LINE


def test_other_failures_still_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async def run(*_: Any, **__: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(main, "run", run)
    assert start(tmp_path) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("dlm node: error: stopped after an I/O error")


def test_join_without_the_command_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The runtime cannot ask the cluster itself (it does not import the client): `dlm node
    # start` hands it the way to; started without it, --join fails in one line.
    settings = {"node_id": "n5", "listen": free_addr(), "data": str(tmp_path / "d")}
    assert main.start_node({**settings, "join": "127.0.0.1:1"}) == main.EXIT_FAILURE
    assert capsys.readouterr().err.splitlines() == [
        "dlm node: error: --join needs `dlm node start`, which can ask the cluster"
    ]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("10ms", "--election-timeout must be between 150ms and 60s; got '10ms'"),
        ("2m", "--election-timeout must be between 150ms and 60s; got '2m'"),
        ("soon", "--election-timeout: 'soon' is not a duration"),
    ],
)
def test_a_bad_election_timeout_is_one_line_and_exit_2(
    value: str, says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = {"node_id": "n1", "data": str(tmp_path / "d"), "election_timeout": value}
    assert main.start_node(settings) == main.EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert err.startswith("dlm node: error: " + says) and err.count("\n") == 1
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(("value", "ticks"), [(None, 6), ("300ms", 6), ("1s", 20), ("0.15", 3)])
def test_the_election_timeout_becomes_ticks_of_the_member_timing(
    value: str | None, ticks: int
) -> None:
    timing = election_timing(value)
    assert timing.election_ticks == ticks
    assert timing.election_timeout_s == pytest.approx(ticks * timing.tick_s)


def test_the_election_timeout_comes_from_the_environment_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = {"node_id": "n1", "data": str(tmp_path / "d")}
    code = main.start_from_options(flags, {"DLM_NODE_ELECTION_TIMEOUT": "1h"})
    assert code == 2
    assert "(the value comes from DLM_NODE_ELECTION_TIMEOUT)" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["trio", "uvloop2"])
def test_an_unknown_event_loop_is_one_line_and_exit_2(
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv(event_loop.ENV, value)
    assert start(tmp_path) == main.EXIT_USAGE == 2
    assert capsys.readouterr().err == (
        f"dlm node: error: DLM_EVENT_LOOP must be asyncio or uvloop, not {value!r}: "
        "unset it to run on asyncio's own loop\n"
    )
    assert not (tmp_path / "d").exists()


def test_uvloop_chosen_where_it_is_not_installed_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv(event_loop.ENV, "uvloop")
    monkeypatch.setattr(event_loop, "uvloop_installed", lambda: False)
    assert start(tmp_path) == 2
    assert capsys.readouterr().err == (
        "dlm node: error: DLM_EVENT_LOOP=uvloop but uvloop is not installed: "
        "pip install uvloop, or set DLM_EVENT_LOOP=asyncio\n"
    )


@pytest.mark.parametrize(
    "loop",
    [
        event_loop.ASYNCIO,
        pytest.param(
            event_loop.UVLOOP,
            marks=pytest.mark.skipif(not event_loop.uvloop_installed(), reason="no uvloop"),
        ),
    ],
)
def test_the_member_runs_on_the_loop_chosen(
    loop: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran_on: list[str] = []

    async def run(*_: Any, **__: Any) -> int:
        ran_on.append(event_loop.running_loop_name(asyncio.get_running_loop()))
        return 0

    monkeypatch.setenv(event_loop.ENV, loop)
    monkeypatch.setattr(main, "run", run)
    assert start(tmp_path) == 0
    assert ran_on == [loop]
