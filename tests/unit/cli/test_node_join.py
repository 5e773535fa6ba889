"""`dlm node start --join` waiting its turn behind another membership change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlm.cli import node_join
from dlm.cli.node_join import join_cluster
from dlm.views import MembersView


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

    def add_member(self, member: str, address: str) -> MembersView:
        from dlm.client.errors import ChangeInProgress

        BusyCluster.attempts += 1
        if BusyCluster.attempts <= BusyCluster.busy:
            raise ChangeInProgress("another membership change is in progress; retry")
        return MembersView.from_wire(
            {
                "members": [
                    {"id": "n1", "address": "10.0.0.1:7700"},
                    {"id": "n4", "address": "10.0.0.4:7700"},
                    {"id": "n6"},  # no address said: the log will tell
                    {"id": member, "address": address},
                ],
                "bootstrap": {"n1": "10.0.0.1:7700"},
                "incarnation": 4294967300,
            }
        )


def test_a_join_waits_its_turn_behind_another_membership_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dlm.node.runtime.config.node_config import NodeConfig

    monkeypatch.setattr(node_join, "Client", BusyCluster)
    monkeypatch.setattr(BusyCluster, "attempts", 0)
    config = NodeConfig.from_settings(
        {"node_id": "n5", "listen": "10.0.0.5:7700", "data": str(tmp_path), "join": "10.0.0.1"}
    )
    joined = join_cluster(config, None)
    assert BusyCluster.attempts == 3
    assert joined.peers == {"n1": ("10.0.0.1", 7700)}
    assert joined.join_members == {"n1": ("10.0.0.1", 7700), "n4": ("10.0.0.4", 7700)}
    assert joined.incarnation == 4294967300
