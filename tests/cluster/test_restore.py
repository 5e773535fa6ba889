"""The worst day, with real members (issue 24): a cluster restored from a backup after every
member's data is lost, a majority lost and recovered from the best survivor, and a member
of the old incarnation started by mistake against the new one.

The backup is made from a copy of a running member's data directory (``backup_of``),
the state that member had stored; `dlm snapshot save` takes it from the leader instead,
and both give `dlm node restore` the same kind of file.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import cbor2

from dlm import auth
from dlm.node import locks
from dlm.node.incarnation import lock_machine_of
from dlm.node.snapshots import NODE_IMAGE_FORMAT_V2
from dlm.records import EntryKind
from dlm.store.backup import Backup, write_backup
from dlm.store.disk import DiskStorage
from tests.cluster.cli_harness import Dlm, first_line, stop
from tests.cluster.harness import Cluster, NodeProc, wait_for

DEFAULT_BUMP = 2**32


def backup_of(node: NodeProc, path: Path) -> int:
    """Writes a backup of what ``node`` has stored to ``path``; returns its index."""
    copy = node.cluster.base / f"{node.node_id}.copy"
    shutil.copytree(node.data_dir, copy, ignore=shutil.ignore_patterns("LOCK"))
    with DiskStorage.open(copy, fsync=False) as storage:
        snap = storage.snapshot()
        machine = lock_machine_of(snap.data) if snap else locks.LockStateMachine()
        last = storage.last_index()
        for entry in storage.entries(storage.first_index(), last + 1):
            if entry.index <= machine.applied_index:
                continue
            if entry.kind is EntryKind.NORMAL:
                machine.apply(entry.index, entry.data)
            else:
                machine.skip(entry.index)
        term = storage.term(last)
        voters = storage.initial_state()[1].voters
    shutil.rmtree(copy)
    image = {"format": NODE_IMAGE_FORMAT_V2, "locks": machine.snapshot(), "members": {}}
    image["removed"] = []
    data = bytes(cbor2.dumps(image, canonical=True))
    write_backup(str(path), Backup(node.cluster.cluster_id, last, term, 0, voters, (), data))
    return last


def restore_all(dlm: Dlm, cluster: Cluster, backup: Path, *flags: str) -> list[dict[str, object]]:
    reports = []
    for node in cluster.nodes.values():
        reports.append(
            dlm.json(
                "node",
                "restore",
                str(backup),
                "--data",
                str(node.data_dir),
                "--id",
                node.node_id,
                "--peers",
                cluster.peers_flag,
                *flags,
            )["restored"]
        )
    return reports


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_restore_waits_out_the_old_clusters_holders_and_tokens_jump(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    cluster = Cluster(tmp_path / "c", size=3)
    dlm = Dlm(cluster.members_env, tmp_path)
    holder = None
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        before = dlm.json("acquire", "kept", "--ttl", "30s")
        backup = tmp_path / "cluster.dlmbackup"
        backup_index = backup_of(cluster.nodes["n1"], backup)
        # After the backup: a holder the backup knows nothing of, which runs on.
        pid_file, token_file = tmp_path / "cmd.pid", tmp_path / "cmd.token"
        holder = dlm.start(
            "exec",
            "--lock",
            "job",
            "--ttl",
            "3s",
            "--",
            "sh",
            "-c",
            f'echo "$DLM_FENCING_TOKEN" > {token_file}; echo $$ > {pid_file}; exec sleep 600',
        )
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30.0, "CMD")
        cmd_pid = int(pid_file.read_text())
        old_token = int(token_file.read_text())
        # Every member and its data is lost.
        cluster.kill_all()
        for node in cluster.nodes.values():
            shutil.rmtree(node.data_dir)
        started = time.monotonic()
        reports = restore_all(dlm, cluster, backup, "--quarantine", "15s")
        restore_s = time.monotonic() - started
        assert {r["incarnation"] for r in reports} == {backup_index + DEFAULT_BUMP}
        assert reports[0]["quarantine_ms"] == 15_000 and reports[0]["locks"] == 1
        cluster.start_all()
        cluster.wait_for_leader(timeout=30.0)
        # Quarantined: an acquire is told so, and the status says until when.
        refused = dlm.run("acquire", "other")
        assert refused.returncode == 75, refused.stderr
        assert "quarantined until" in refused.stderr
        status = dlm.json("status")
        assert status["incarnation"] == backup_index + DEFAULT_BUMP
        assert status["quarantine"]["ms"] == 15_000
        # The key the old holder had: granted only after its CMD is gone.
        got = dlm.json("acquire", "job", "--wait", "90s")
        assert gone(cmd_pid), "the new incarnation granted a key whose old CMD still runs"
        assert got["token"] > backup_index + DEFAULT_BUMP > old_token
        assert holder.wait(timeout=30) == 77
        # The lock held at the backup is held still, by its lease, with its old token.
        kept = dlm.json("status", "kept")
        assert [h["token"] for h in kept["holders"]] == [before["token"]]
        logs = "".join(n.log_path.read_text() for n in cluster.nodes.values())
        assert '"event":"restored"' in logs and '"event":"quarantine_ended"' in logs
        print(f"restore of 3 members: {restore_s:.3f}s")
    finally:
        if holder is not None:
            stop(holder)
        cluster.stop_all()


def test_five_members_lose_three_and_the_best_survivor_is_recovered(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    cluster = Cluster(tmp_path / "c", size=5)
    dlm = Dlm(cluster.members_env, tmp_path)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=20.0)
        tokens = [dlm.json("acquire", f"k{i}", "--ttl", "5s")["token"] for i in range(5)]
        lost = ("n1", "n2", "n3")
        for node_id in lost:
            cluster.nodes[node_id].kill()
            shutil.rmtree(cluster.nodes[node_id].data_dir)
        for node_id in ("n4", "n5"):
            cluster.nodes[node_id].terminate()
        survivors = [cluster.nodes["n4"], cluster.nodes["n5"]]
        inspected = {
            n.node_id: dlm.json("store", "inspect", str(n.data_dir))["index_range"]
            for n in survivors
        }
        best = max(
            survivors,
            key=lambda n: (inspected[n.node_id]["last_term"], inspected[n.node_id]["last"]),
        )
        last = inspected[best.node_id]["last"]
        assert last >= max(tokens)
        refused = dlm.run("node", "recover", "--data", str(best.data_dir))
        assert refused.returncode == 2 and "--force" in refused.stderr
        started = time.monotonic()
        report = dlm.json(
            "node", "recover", "--data", str(best.data_dir), "--force", "--quarantine", "2s"
        )["recovered"]
        recover_s = time.monotonic() - started
        assert report["incarnation"] == last + DEFAULT_BUMP and report["members"] == [best.node_id]
        assert report["locks"] == 5
        for node_id in ("n1", "n2", "n3", "n4", "n5"):
            if node_id != best.node_id:
                cluster.retire(node_id)
        best.by_hand = True
        best.start()
        cluster.wait_for_leader(timeout=20.0)
        joiner = cluster.add_node("n6", join=[best.address])
        joiner.start()
        wait_for(
            lambda: any(
                m["id"] == "n6" and m["voter"] for m in dlm.json("members", "list")["members"]
            ),
            60.0,
            "n6 to join and be promoted",
        )
        got = dlm.json("acquire", "k0", "--wait", "60s")
        assert got["token"] > last + DEFAULT_BUMP > max(tokens)
        assert json.loads((joiner.data_dir / "node.json").read_text())["incarnation"] == (
            last + DEFAULT_BUMP
        )
        print(f"recovery of the survivor: {recover_s:.3f}s")
    finally:
        cluster.stop_all()


def test_a_member_of_the_old_incarnation_is_refused_in_one_line_and_stops(tmp_path: Path) -> None:
    auth.write_secret_file(str(tmp_path / "peer.secret"))
    flags = ["--peer-secret-file", str(tmp_path / "peer.secret")]
    (tmp_path / "c").mkdir()
    cluster = Cluster(tmp_path / "c", size=3, node_args=lambda _: list(flags))
    dlm = Dlm(cluster.members_env, tmp_path)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        dlm.json("acquire", "x", "--ttl", "2s")
        backup = tmp_path / "b.dlmbackup"
        backup_of(cluster.nodes["n1"], backup)
        cluster.stop_all()
        old_n3 = cluster.nodes["n3"].data_dir
        kept = tmp_path / "old-n3"
        shutil.move(old_n3, kept)
        for node in cluster.nodes.values():
            if node.data_dir.exists():
                shutil.rmtree(node.data_dir)
        restore_all(dlm, cluster, backup, "--quarantine", "1s")
        for node_id in ("n1", "n2"):
            cluster.nodes[node_id].start()
        cluster.wait_for_leader(timeout=20.0)
        # n3 started on its old data directory by mistake.
        shutil.rmtree(old_n3)
        shutil.move(kept, old_n3)
        n3 = cluster.nodes["n3"]
        n3.by_hand = True
        n3.start()
        assert n3.wait_exit(timeout=60.0) == 65
        said = [
            line
            for line in n3.log_path.read_text().splitlines()
            if "cluster incarnation mismatch" in line
        ]
        assert said and all("so n3 belongs to the old cluster" in line for line in said)
        # Each member it dialled says so once, however often n3 redials before it stops.
        # (Other lines may name the mismatch too: under load n3 lives long enough for
        # n1 or n2 to dial it and be refused in turn.)
        refused_by: list[str] = []
        for node_id in ("n1", "n2"):
            for line in cluster.nodes[node_id].log_path.read_text().splitlines():
                record = json.loads(line) if line.startswith("{") else {}
                if record.get("event") == "peer_refused" and "incarnation mismatch" in str(
                    record.get("reason")
                ):
                    refused_by.append(node_id)
        assert refused_by and len(refused_by) == len(set(refused_by)), refused_by
    finally:
        cluster.stop_all()


def test_a_corrupted_backup_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.dlmbackup"
    bad.write_bytes(b"DLMBACKUP\x00" + b"\x01" * 40)
    dlm = Dlm("127.0.0.1:1", tmp_path)
    proc = dlm.run(
        "node",
        "restore",
        str(bad),
        "--data",
        str(tmp_path / "d"),
        "--id",
        "n1",
        "--peers",
        "n1=127.0.0.1:17711",
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr
    assert not (tmp_path / "d").exists()


_ = first_line
