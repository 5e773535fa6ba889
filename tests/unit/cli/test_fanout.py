"""Admin changes in a partitioned cluster (dlm/cli/fanout.py): `dlm auth ...` and `dlm members
add|remove|promote` go to every partition, a re-run completes what some partitions missed,
and a partial change exits non-zero with one line naming the partitions that missed it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlm.cli.fanout import FanOut, settle, to_every_partition
from dlm.cli.main import run
from dlm.client.errors import BadRequest, ClusterUnavailable
from dlm.views import MembersView
from tests.unit.cli.conftest import FakeClient

Capture = pytest.CaptureFixture[str]
PARTITIONS = 4


class Partitioned(FakeClient):
    """A cluster of PARTITIONS partitions: each keeps its own identity table and members;
    ``down`` partitions answer nothing."""

    down: set[int] = set()
    tables: list[dict[str, bytes]] = []
    removed: list[dict[str, bytes]] = []
    members: list[dict[str, str]] = []  # type: ignore[assignment]
    sent: list[tuple[str, int]] = []

    @classmethod
    def reset(cls) -> None:
        cls.down = set()
        cls.tables = [{} for _ in range(PARTITIONS)]
        cls.removed = [{} for _ in range(PARTITIONS)]
        cls.members = [{"n1": "127.0.0.1:7701", "n2": "127.0.0.1:7702"} for _ in range(PARTITIONS)]
        cls.sent = []

    partitions = PARTITIONS

    def _reach(self, what: str, partition: int) -> None:
        Partitioned.sent.append((what, partition))
        if partition in Partitioned.down:
            raise ClusterUnavailable(f"no leader within 1s (partition {partition})")

    def auth_change(self, request: Any, partition: int = 0) -> dict[str, Any]:
        self._reach(request.TYPE, partition)
        table = Partitioned.tables[partition]
        if request.TYPE == "auth_add":
            if request.name in table and table[request.name] != request.key_id:
                raise BadRequest(f"identity {request.name!r} exists: remove it first")
            table[request.name] = request.key_id
        elif request.TYPE == "auth_remove":
            if request.name not in table:
                earlier = Partitioned.removed[partition].get(request.name)
                if earlier == request.request:
                    return {"op": "remove", "name": request.name}
                suffix = " (identity 'admin' removed it earlier)" if earlier else ""
                raise BadRequest(f"no identity {request.name!r}{suffix}")
            del table[request.name]
            Partitioned.removed[partition][request.name] = request.request
        return {"op": request.TYPE.removeprefix("auth_"), "name": request.name}

    def _view(self, partition: int) -> MembersView:
        members = Partitioned.members[partition]
        return MembersView.from_wire(
            {
                "members": [
                    {"id": m, "address": a, "role": "follower", "reachable": True}
                    for m, a in sorted(members.items())
                ],
                "leader": "n1",
                "bootstrap": {},
            }
        )

    def members_view(self, partition: int = 0) -> MembersView:
        self._reach("members", partition)
        return self._view(partition)

    def add_member(self, member: str, address: str, partition: int = 0) -> MembersView:
        self._reach("member_add", partition)
        if member in Partitioned.members[partition]:
            raise BadRequest(f"{member} is already a member: pick an id not in use")
        Partitioned.members[partition][member] = address
        return self._view(partition)

    def member_status(self, addr: str, timeout: float = 2.0) -> Any:
        return None


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, fake_cluster: Any) -> None:
    from dlm.cli.settings import Settings

    Partitioned.reset()
    monkeypatch.setattr(
        Settings, "connect", lambda self: Partitioned(["127.0.0.1:7701"], self.timeout)
    )


@pytest.mark.usefixtures("cluster")
def test_auth_add_reaches_every_partition(capsys: Capture, tmp_path: Path) -> None:
    out = tmp_path / "ci.cred"
    assert run(["auth", "add", "ci", "--prefix", "ci/", "--out", str(out)]) == 0
    assert [p for _, p in Partitioned.sent] == [0, 1, 2, 3]
    keys = {t["ci"] for t in Partitioned.tables}
    assert len(keys) == 1
    assert "added identity ci" in capsys.readouterr().out
    assert run(["auth", "set", "ci", "--max-locks", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partitions"] == PARTITIONS


@pytest.mark.usefixtures("cluster")
def test_a_partition_that_missed_it_is_named_and_a_rerun_completes_it(
    capsys: Capture, tmp_path: Path
) -> None:
    out = tmp_path / "ci.cred"
    Partitioned.down = {2}
    assert run(["auth", "add", "ci", "--prefix", "ci/", "--out", str(out)]) == 69
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("dlm: auth add ci: partition(s) 2 of 4 did not take it (3 did;")
    assert "run the same command again" in line
    # The credential stays: three partitions know its key.
    assert out.exists() and "ci" not in Partitioned.tables[2]
    Partitioned.down = set()
    assert run(["auth", "add", "ci", "--prefix", "ci/", "--out", str(out)]) == 0
    assert len({t["ci"] for t in Partitioned.tables}) == 1


@pytest.mark.usefixtures("cluster")
def test_a_refusal_everywhere_is_the_one_partition_refusal_and_leaves_no_file(
    capsys: Capture, tmp_path: Path
) -> None:
    for table in Partitioned.tables:
        table["ci"] = b"other key"
    out = tmp_path / "ci.cred"
    assert run(["auth", "add", "ci", "--prefix", "ci/", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.usefixtures("cluster")
def test_auth_remove_rerun_counts_partitions_that_removed_it_already(capsys: Capture) -> None:
    for table in Partitioned.tables:
        table["ci"] = b"k"
    Partitioned.down = {1, 3}
    assert run(["auth", "remove", "ci"]) == 69
    assert "partition(s) 1, 3 of 4 did not take it" in capsys.readouterr().err
    Partitioned.down = set()
    assert run(["auth", "remove", "ci"]) == 0
    assert all("ci" not in t for t in Partitioned.tables)
    # Gone everywhere already: refused, as one partition says it.
    assert run(["auth", "remove", "ci"]) == 2
    assert "no identity 'ci'" in capsys.readouterr().err


@pytest.mark.usefixtures("cluster")
def test_members_add_joins_every_group_and_list_shows_disagreement(capsys: Capture) -> None:
    Partitioned.down = {3}
    assert run(["members", "add", "n4", "127.0.0.1:7704"]) == 69
    assert "partition(s) 3 of 4 did not take it" in capsys.readouterr().err
    Partitioned.down = set()
    assert run(["members", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["partitions"] == 4
    assert listed["disagree"] == [{"partition": 3, "problem": "n4 is not a member"}]
    assert run(["members", "list"]) == 0
    assert "partition 3: n4 is not a member" in capsys.readouterr().err
    assert run(["members", "add", "n4", "127.0.0.1:7704", "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["partitions"] == 4 and added["added"]["id"] == "n4"
    assert all("n4" in m for m in Partitioned.members)
    assert run(["members", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disagree"] == []


def test_one_partition_raises_its_own_error() -> None:
    def send(p: int) -> int:
        raise ClusterUnavailable("no leader")

    with pytest.raises(ClusterUnavailable):
        to_every_partition(lambda: 1, send)


def test_settle_passes_a_change_every_partition_took() -> None:
    settle(FanOut(partitions=3, took={0: 1, 1: 1}, had={2: BadRequest("had")}), "x")
