"""`dlm snapshot save` against real members while 16 clients acquire at full speed.

Each backup must be intact (``dlm snapshot inspect`` says so) and consistent: its
index is committed (a member's log has the entry, with the backup's term, and the
member applied it), and its lock table is exactly the state the cluster was in at
that index: replaying the member's own log up to the index from an empty table gives
the very bytes of the backup's image. The periodic snapshots that compact the log
are taken in forked children all along (every 150 entries here).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2

from dlm.client.errors import DlmError
from dlm.node import locks
from dlm.records import EntryKind
from dlm.store.backup import read_backup
from dlm.store.disk import DiskStorage
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, wait_for

CLIENTS = 16
BACKUPS = 3
KEYS = 8


def _acquire_until(cluster: Cluster, number: int, stop: threading.Event, grants: list[int]) -> None:
    with cluster.client(timeout=20.0) as client:
        lease = client.open_lease(60_000)
        for turn in range(1_000_000):  # bounded; ends when the backups are done
            if stop.is_set():
                break
            key = f"busy/{(number + turn) % KEYS}"
            try:
                grant = client.acquire(lease, key, wait=True)
                grants.append(grant.token)
                client.release(lease, key)
            except DlmError:
                continue  # a slow turn under load; the test checks the backups, not this


def _more_grants(grants: list[list[int]], more: int) -> Callable[[], bool | None]:
    """A wait_for condition: ``more`` grants on top of those made so far."""
    target = sum(map(len, grants)) + more
    return lambda: sum(map(len, grants)) >= target or None


def _replayed_lock_image(data_dir: Path, index: int) -> tuple[bytes, int]:
    """The lock image at ``index`` rebuilt from the member's own log, and the term there."""
    with DiskStorage.open(data_dir) as storage:
        assert storage.first_index() == 1, "the log was compacted below the backup"
        machine = locks.LockStateMachine()
        for entry in storage.entries(1, index + 1):
            if entry.kind is EntryKind.NORMAL:
                machine.apply(entry.index, entry.data)
            else:
                machine.skip(entry.index)
        return machine.snapshot(), storage.term(index)


def test_backups_taken_under_full_load_are_intact_and_a_state_that_existed(
    tmp_path: Path,
) -> None:
    # Snapshots often, and a log kept whole behind them, so the replay can start at 1.
    env = {"DLM_SNAPSHOT_EVERY": "150", "DLM_SNAPSHOT_KEEP": "1000000"}
    cluster = Cluster(tmp_path, env=env)
    stop = threading.Event()
    grants: list[list[int]] = [[] for _ in range(CLIENTS)]
    threads = [
        threading.Thread(target=_acquire_until, args=(cluster, n, stop, grants[n]), daemon=True)
        for n in range(CLIENTS)
    ]
    dlm = Dlm(cluster.members_env, tmp_path)
    saved: list[dict[str, Any]] = []
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        for thread in threads:
            thread.start()
        wait_for(lambda: sum(map(len, grants)) >= 200 or None, 60.0, "the clients to get going")
        for n in range(BACKUPS):
            saved.append(dlm.json("snapshot", "save", str(tmp_path / f"b{n}.dlm")))
            # The next backup comes after more grants, so the backups stand at other indexes.
            wait_for(_more_grants(grants, 50), 60.0, "more grants")
        stop.set()
        for thread in threads:
            thread.join(timeout=60.0)
        leader = cluster.wait_for_leader(timeout=15.0)
        status = leader.status(timeout=5.0)
        assert status is not None
        applied = status["applied"]
        taken_events = leader.log_path.read_text().count('"event":"snapshot_written"')
    finally:
        stop.set()
        cluster.stop_all()

    assert all(not thread.is_alive() for thread in threads)
    assert sum(map(len, grants)) >= 300
    assert taken_events >= 2, "the periodic snapshots were taken while the clients ran"
    indexes = [report["index"] for report in saved]
    assert indexes == sorted(indexes) and len(set(indexes)) == BACKUPS
    for n, report in enumerate(saved):
        path = tmp_path / f"b{n}.dlm"
        inspected = dlm.json("snapshot", "inspect", str(path))
        assert inspected["intact"] is True
        assert inspected["index"] == report["index"] and inspected["cluster"] == "test"
        assert inspected["voters"] == ["n1", "n2", "n3"]
        assert 0 < inspected["index"] <= applied
        backup = read_backup(str(path))
        image = cbor2.loads(backup.image)
        for member in ("n1", "n2", "n3"):
            lock_image, term = _replayed_lock_image(tmp_path / member, backup.index)
            assert term == backup.term, member
            assert image["locks"] == lock_image, f"{member}'s log at {backup.index} differs"
        held = inspected["locks"]
        assert 0 <= held <= KEYS and inspected["highest_token"] <= backup.index
