"""Membership changes on real `dlm node start` processes, driven through `dlm members`.

A cluster grows from 3 to 5 members with `--join` while a client takes and
gives back locks, loses its leader to `dlm members remove`, shrinks back to 3
and has a member that was killed with SIGKILL replaced by a new one on a new
address; throughout, a lock held from the start keeps its holder and token,
every key's tokens keep rising, and the removed members stop on their own with
exit 0 (and stop at once when their data directory is started again). The
command's refusals keep their exit codes: 2 for a request that makes no sense
or a removal that would leave no quorum, 75 while another change is pending,
69 without a quorum.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from dlm import auth
from dlm.client import Client, KeepAlive
from dlm.client.errors import DlmError, LockHeld
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, NodeProc, RawConn, free_ports, wait_for
from tests.cluster.proxy import Proxy

CHANGE_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


class Workload:
    """One client taking and giving back locks in a loop; records every grant and the gaps
    between successful operations."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.grants: list[tuple[str, int]] = []
        self.done_at: list[float] = []
        """When each successful acquire-and-release ended (monotonic)."""
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.addresses, timeout=15.0) as client:
            lease = client.open_lease(30_000)
            keeper = KeepAlive(client, lease).start()
            try:
                for i in range(1_000_000):
                    if self.stop.is_set():
                        return
                    key = f"k{i % 3}"
                    try:
                        grant = client.acquire(lease, key)
                        self.grants.append((key, grant.token))
                        client.release(lease, key)
                    except LockHeld as exc:
                        self.errors.append(f"LockHeld: {exc}")  # nobody else takes these
                        continue
                    except DlmError as exc:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    self.done_at.append(time.monotonic())
            finally:
                keeper.stop()

    def more(self, count: int = 5, timeout: float = 30.0) -> None:
        """Waits until ``count`` more operations have succeeded."""
        target = len(self.done_at) + count
        wait_for(lambda: len(self.done_at) >= target, timeout, f"{count} more grants")

    def longest_pause(self, start: float, end: float) -> float:
        """The longest gap between successful operations that overlaps [start, end]."""
        times = [t for t in self.done_at if t >= start - 5.0]
        gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
        return max(gaps, default=0.0)


def members_json(dlm: Dlm) -> dict[str, Any]:
    return dlm.json("members", "list")


def member(view: dict[str, Any], node: str) -> dict[str, Any] | None:
    return next((m for m in view["members"] if m["id"] == node), None)


def voter_serving(dlm: Dlm, node: str) -> dict[str, Any] | None:
    """The membership once ``node`` is a voter that answers and has caught up."""
    view = members_json(dlm)
    row = member(view, node)
    if row and row["voter"] and row["reachable"] and row["lag"] == 0:
        return view
    return None


def stopped_on_its_own(node: NodeProc) -> None:
    code = node.wait_exit(STOP_TIMEOUT)
    assert code == 0, node.log_tail()
    assert "was removed from this cluster" in node.log_tail(5)


def restarted_data_dir_stops(node: NodeProc) -> None:
    """A removed member's data directory, started again, stops by itself (exit 0) with one
    line saying why and what to do."""
    node.log_path.write_bytes(b"")
    node.start()
    assert node.wait_exit(STOP_TIMEOUT) == 0
    said = [line for line in node.log_tail(50).splitlines() if line.startswith("dlm node:")]
    assert len(said) == 1 and "was removed" in said[0] and "--join" in said[0], said


def test_grow_remove_the_leader_shrink_and_replace_a_dead_member_under_load(
    tmp_path: Path,
) -> None:
    # With a peer secret: a removed follower, whose log never gets its removal, learns it
    # from a refusal the others seal after the handshake (without authentication it would
    # not believe one, and would keep running: admission.py).
    secret = tmp_path / "peer.secret"
    auth.write_secret_file(str(secret))
    cluster = Cluster(tmp_path, size=3, node_args=lambda _: ["--peer-secret-file", str(secret)])
    spare = dict(zip(("n4", "n5", "n6"), free_ports(3), strict=True))
    # Clients know every address a member will have, as an operator's DLM_CLUSTER would.
    everyone = [*cluster.addresses, *(f"127.0.0.1:{port}" for port in spare.values())]
    dlm = Dlm(",".join(everyone), tmp_path)
    workload = Workload(everyone)
    keeper: KeepAlive | None = None
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        with Client(everyone, timeout=CHANGE_TIMEOUT) as client:
            held_lease = client.open_lease(20_000)
            held = client.acquire(held_lease, "held-throughout")
            keeper = KeepAlive(client, held_lease).start()
            workload.thread.start()
            workload.more(10)

            # Grow to five with --join while the workload runs.
            for node_id in ("n4", "n5"):
                node = cluster.add_node(node_id, port=spare[node_id])
                node.start()
                wait_for(partial(voter_serving, dlm, node_id), CHANGE_TIMEOUT, f"{node_id} a voter")
                workload.more()
            assert [m["id"] for m in members_json(dlm)["members"]] == ["n1", "n2", "n3", "n4", "n5"]

            # Remove the leader: it hands over, then leaves.
            leader = cluster.wait_for_leader()
            started = time.monotonic()
            out = dlm.json("members", "remove", leader.node_id)
            removed_in = time.monotonic() - started
            assert leader.node_id not in [m["id"] for m in out["members"]]
            assert out["leader"] not in (None, leader.node_id)
            stopped_on_its_own(leader)
            cluster.retire(leader.node_id)
            workload.more()
            pause = workload.longest_pause(started, started + removed_in)

            # Shrink back to three: a follower goes.
            follower = next(n for n in cluster.nodes.values() if n is not cluster.wait_for_leader())
            dlm.json("members", "remove", follower.node_id)
            stopped_on_its_own(follower)
            cluster.retire(follower.node_id)
            workload.more()
            assert len(members_json(dlm)["members"]) == 3

            # A member dies (kill -9) and is replaced by a new one on a new address.
            lead = cluster.wait_for_leader()
            dead, live = [n for n in cluster.nodes.values() if n is not lead]
            dead.kill()
            wait_for(
                lambda: not (member(members_json(dlm), dead.node_id) or {}).get("reachable"),
                10.0,
                f"{dead.node_id} to be reported unreachable",
            )
            unsafe = dlm.run("members", "remove", live.node_id)
            assert unsafe.returncode == 2, unsafe.stderr
            assert unsafe.stderr.count("\n") == 1 and "--force" in unsafe.stderr
            out = dlm.json("members", "remove", dead.node_id)
            assert [m["id"] for m in out["members"]] == sorted([lead.node_id, live.node_id])
            cluster.retire(dead.node_id)
            new = cluster.add_node("n6", port=spare["n6"])
            new.start()
            wait_for(lambda: voter_serving(dlm, "n6"), CHANGE_TIMEOUT, "n6 a voter")
            workload.more(10)

            # What was acknowledged is still there: the lock held from the start, and
            # every key's fencing tokens rose all along.
            workload.stop.set()
            workload.thread.join(timeout=30.0)
            assert not keeper.lost.is_set(), keeper.reason
            holders = client.get("held-throughout").holders
            assert [(h.lease, h.token) for h in holders] == [(held_lease.id, held.token)]
        by_key: dict[str, list[int]] = {}
        for key, token in workload.grants:
            by_key.setdefault(key, []).append(token)
        for key, tokens in by_key.items():
            assert all(a < b for a, b in itertools.pairwise(tokens)), key
        assert not [e for e in workload.errors if e.startswith("LockHeld")], workload.errors

        # The removed members' data directories stop at once when started again: the one
        # removed while running knows it from its log, the dead one is told by the others.
        restarted_data_dir_stops(leader)
        restarted_data_dir_stops(dead)
        print(
            f"membership under load: {len(workload.grants)} grants, leader removal answered "
            f"in {removed_in:.2f}s, longest pause around it {pause:.2f}s, "
            f"{len(workload.errors)} failed operations"
        )
    finally:
        workload.stop.set()
        if keeper is not None:
            keeper.stop()
        cluster.stop_all()


def test_the_last_voter_cannot_be_removed(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, size=1)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        proc = Dlm(cluster.members_env, tmp_path).run("members", "remove", "n1")
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "n1 is the last voter" in proc.stderr
        assert "add another member first" in proc.stderr
    finally:
        cluster.stop_all()


def leader_config(leader: NodeProc) -> list[str]:
    """The members in the leader's latest configuration, committed or not (a stale read)."""
    with RawConn(leader.address) as conn:
        view = conn.request({"t": "status", "stale": True})
    return [m["id"] for m in view["members"]]


def test_refusals_a_pending_change_and_a_learner_promoted_by_hand(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, size=3)
    for node in cluster.nodes.values():
        node.flags = ("--auto-promote", "off")
    # Members reach each other through proxies, so that a change can be held pending.
    proxies = {n: Proxy(node.address).start() for n, node in cluster.nodes.items()}
    cluster.peers_flag = ",".join(f"{n}={p.address}" for n, p in proxies.items())
    dlm = Dlm(cluster.members_env, tmp_path)
    n5_port, n6_port = free_ports(2)
    try:
        cluster.start_all()
        leader = cluster.wait_for_leader(timeout=15.0)
        follower = next(n for n in cluster.nodes.values() if n is not leader)

        # Requests that make no sense: exit 2, one line.
        for args, words in [
            (("add", follower.node_id, "127.0.0.1:1"), "already a member"),
            (("add", "n9", proxies[follower.node_id].address), "already"),
            (("remove", "n9"), "not a member"),
            (("promote", "n9"), "not a member"),
            (("promote", follower.node_id), "already a voter"),
        ]:
            proc = dlm.run("members", *args)
            assert proc.returncode == 2, (args, proc.stderr)
            assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr

        # A change while another is pending: exit 75. Every message between members now
        # takes 1.5 s each way, so a change commits three seconds after it is proposed;
        # the delay grows in small steps, or followers would miss heartbeats and campaign.
        for step in range(1, 31):
            for proxy in proxies.values():
                proxy.delay(step / 20)
            time.sleep(0.1)  # pacing the fault, not waiting for an event
        assert cluster.leader_now() is leader, "the leader changed while the delay grew"

        def add_n5() -> None:
            with Client([leader.address], timeout=60.0) as client, contextlib.suppress(DlmError):
                # (A re-sent copy may find its own first copy pending: CONFLICT.)
                client.add_member("n5", f"127.0.0.1:{n5_port}")

        adder = threading.Thread(target=add_n5, daemon=True)
        adder.start()
        wait_for(lambda: "n5" in leader_config(leader), 5.0, "n5 in the leader's log")
        pending = Dlm(leader.address, tmp_path).run("members", "add", "n6", f"127.0.0.1:{n6_port}")
        assert pending.returncode == 75, pending.stderr
        assert pending.stderr.count("\n") == 1 and "retry" in pending.stderr
        for proxy in proxies.values():
            proxy.heal()
        adder.join(timeout=CHANGE_TIMEOUT)
        wait_for(lambda: member(members_json(dlm), "n5"), CHANGE_TIMEOUT, "n5 added")

        # n5 was added before its process ran; started with --join, it finds itself a
        # member already, catches up, and stays a learner until promoted by hand.
        status = dlm.json("status")
        n5_row = next(m for m in status["members"] if m["id"] == "n5")
        assert n5_row["voter"] is False and n5_row["reachable"] is False
        assert status["health"]["state"] == "healthy" and status["health"]["voters"] == 3
        n5 = cluster.add_node("n5", port=n5_port, flags=("--auto-promote", "off"))
        n5.start()

        def caught_up_learner() -> dict[str, Any] | None:
            row = member(members_json(dlm), "n5")
            return row if row and row["reachable"] and row["lag"] == 0 else None

        row = wait_for(caught_up_learner, CHANGE_TIMEOUT, "n5 to catch up")
        assert (row["role"], row["voter"]) == ("learner", False)
        workload_lease = None
        with Client(cluster.addresses, timeout=CHANGE_TIMEOUT) as client:
            workload_lease = client.open_lease(10_000)
            client.acquire(workload_lease, "while-learning")
        assert member(members_json(dlm), "n5")["role"] == "learner"  # type: ignore[index]
        out = dlm.json("members", "promote", "n5")
        assert member(out, "n5")["voter"] is True  # type: ignore[index]
        human = dlm.run("members", "list", "--format", "table")
        assert human.returncode == 0 and "n5" in human.stdout and "learner" not in human.stdout

        # No quorum: exit 69 once the time is up.
        for node in [n for n in cluster.nodes.values() if n is not leader][:2]:
            node.kill()
        n5.kill()
        wait_for(lambda: (leader.status() or {}).get("role") != "leader", 10.0, "no leader")
        proc = dlm.run("members", "add", "n9", "127.0.0.1:2", "--timeout", "2s")
        assert proc.returncode == 69, proc.stderr
        assert proc.stderr.count("\n") == 1
    finally:
        cluster.stop_all()
        for proxy in proxies.values():
            proxy.stop()


def test_members_list_json_is_one_object_with_the_documented_fields(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, size=3)
    try:
        cluster.start_all()
        leader = cluster.wait_for_leader(timeout=15.0)
        dlm = Dlm(cluster.members_env, tmp_path)

        def all_answer() -> dict[str, Any] | None:
            view = members_json(dlm)
            return view if all(m["reachable"] for m in view["members"]) else None

        view = wait_for(all_answer, 10.0, "every member to answer")
        assert view["leader"] == leader.node_id
        for row in view["members"]:
            assert set(row) >= {"id", "address", "role", "reachable", "lag"}
            assert row["role"] == ("leader" if row["id"] == leader.node_id else "follower")
            assert row["lag"] is not None and row["lag"] >= 0
        tsv = dlm.run("members", "list")
        assert tsv.returncode == 0
        assert tsv.stdout.splitlines()[0].split("\t")[:5] == [
            "id", "address", "role", "voter", "reachable",
        ]  # fmt: skip
        killed = next(n for n in cluster.nodes.values() if n is not leader)
        killed.kill()

        def unreachable_row() -> dict[str, Any] | None:
            found = member(members_json(dlm), killed.node_id)
            return found if found is not None and not found["reachable"] else None

        row = wait_for(unreachable_row, 10.0, f"{killed.node_id} reported unreachable")
        assert (row["role"], row["lag"]) == ("unknown", None)
        assert json.loads(dlm.run("members", "list", "--json").stdout)["leader"] == leader.node_id
    finally:
        cluster.stop_all()


def test_an_added_member_whose_address_never_proves_the_secret_stays_a_learner(
    tmp_path: Path,
) -> None:
    """Issue 23, item 4: `dlm members add mallory ADDR` where an impostor answers (and
    never proves the peer secret) leaves mallory a learner for good: not promoted by the
    leader, refused by `dlm members promote` (exit 2), and `dlm members list` says why;
    the members keep serving."""
    import os
    import subprocess
    import sys

    from tests.cluster.harness import REPO

    secret = tmp_path / "peer.secret"
    auth.write_secret_file(str(secret))
    base = tmp_path / "cluster"
    base.mkdir()
    cluster = Cluster(base, size=3, node_args=lambda _: ["--peer-secret-file", str(secret)])
    (port,) = free_ports(1)
    log = tmp_path / "impostor.log"
    impostor: subprocess.Popen[bytes] | None = None
    dlm = Dlm(cluster.members_env, tmp_path)
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        env = {**os.environ, "PYTHONPATH": str(REPO), "IMPOSTOR_CLUSTER": cluster.cluster_id}
        impostor = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.impostor", str(port), str(log)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        added = dlm.json("members", "add", "mallory", f"127.0.0.1:{port}")
        assert added["added"]["id"] == "mallory"

        def dialled_and_refused_often() -> bool:
            # The members dial mallory, and each dial is answered by the impostor: several
            # rounds of redials give auto-promotion every chance it would take.
            lines = log.read_text().splitlines() if log.exists() else []
            return sum(line.startswith("refused") for line in lines) >= 6

        wait_for(dialled_and_refused_often, 30.0, "the members to dial mallory, refused")
        row = member(members_json(dlm), "mallory")
        assert row is not None
        assert (row["role"], row["voter"]) == ("learner", False)
        assert row["reason"] == "never proved the peer secret"
        table = dlm.run("members", "list", "--format", "table")
        assert "mallory is not a voter: never proved the peer secret" in table.stdout
        promote = dlm.run("members", "promote", "mallory")
        assert promote.returncode == 2, promote.stderr
        assert promote.stderr.count("\n") == 1
        assert "mallory never proved the peer secret" in promote.stderr
        assert all(node.alive for node in cluster.nodes.values())
        with Client(cluster.addresses, timeout=CHANGE_TIMEOUT) as client:
            lease = client.open_lease(10_000)
            assert client.acquire(lease, "with-mallory-a-learner").token > 0
        out = dlm.json("members", "remove", "mallory")
        assert member(out, "mallory") is None
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait(timeout=10)
        cluster.stop_all()
