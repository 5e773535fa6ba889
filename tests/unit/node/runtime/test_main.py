"""`dlm node start` on a full disk: exit 74 and one line naming the directory and the space;
`--join` waiting its turn behind another membership change."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from dlm.node.runtime import main
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


class BusyCluster:
    """Stands in for dlm.client.sync.Client: another change is pending for the first
    ``busy`` attempts to add a member, then the member is added."""

    busy = 2
    attempts = 0

    def __init__(self, members: list[str], timeout: float, secret: Any, tls: Any) -> None:
        pass

    def __enter__(self) -> BusyCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def add_member(self, member: str, address: str) -> dict[str, Any]:
        from dlm.client.errors import ChangeInProgress

        BusyCluster.attempts += 1
        if BusyCluster.attempts <= BusyCluster.busy:
            raise ChangeInProgress("another membership change is in progress; retry")
        return {
            "members": [
                {"id": "n1", "address": "10.0.0.1:7700"},
                {"id": "n4", "address": "10.0.0.4:7700"},
                {"id": member, "address": address},
            ],
            "bootstrap": {"n1": "10.0.0.1:7700"},
        }


def test_a_join_waits_its_turn_behind_another_membership_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dlm.node.runtime.config.node_config import NodeConfig

    monkeypatch.setattr("dlm.client.sync.Client", BusyCluster)
    monkeypatch.setattr(BusyCluster, "attempts", 0)
    config = NodeConfig.from_settings(
        {"node_id": "n5", "listen": "10.0.0.5:7700", "data": str(tmp_path), "join": "10.0.0.1"}
    )
    joined = main._join(config, None)
    assert BusyCluster.attempts == 3
    assert joined.peers == {"n1": ("10.0.0.1", 7700)}
    assert joined.join_members == {"n1": ("10.0.0.1", 7700), "n4": ("10.0.0.4", 7700)}
