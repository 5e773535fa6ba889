"""`dlm watch` and `dlm observe` against real members: the JSON line contract, a watcher
that misses no change through a leader kill, and exit 69 once the cluster stays
unreachable past --timeout."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import Cluster, free_ports, wait_for

pytestmark = pytest.mark.cluster

WATCH_FIELDS = {"key", "event", "index", "lease", "token"}


class Lines:
    """A started dlm's stdout lines, read by a thread, each taken with a bounded wait."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._lines: queue.Queue[str] = queue.Queue()
        stream = proc.stdout
        assert stream is not None

        def pump() -> None:
            for line in stream:
                self._lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def take(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        out = []
        for _ in range(count):
            try:
                out.append(json.loads(self._lines.get(timeout=timeout)))
            except queue.Empty:
                raise AssertionError(f"only {len(out)} of {count} lines: {out}") from None
        return out


def test_watch_json_is_one_line_per_change_with_the_next_grant_in_a_release(
    shared: Cluster, tmp_path: Path
) -> None:
    client = shared.client()
    try:
        first = client.open_lease(30_000)
        second = client.open_lease(30_000)
        grant = client.acquire(first, "wj/a")
        proc = Dlm(shared.members_env, tmp_path).start(
            "watch", "wj/a", "--after", str(grant.token - 1), "--json"
        )
        try:
            lines = Lines(proc)
            waiter = threading.Thread(
                target=lambda: client.spawn().acquire(second, "wj/a", wait=30)
            )
            waiter.start()
            wait_for(lambda: client.get("wj/a").waiting == 1, 15.0, "the second lease queued")
            client.release(first, "wj/a")
            waiter.join(30)
            seen = lines.take(3)
        finally:
            stop(proc)
    finally:
        client.close()
    granted, queued, released = seen
    assert set(granted) == WATCH_FIELDS and set(queued) == WATCH_FIELDS
    assert set(released) == WATCH_FIELDS | {"granted"}
    assert granted == {
        "key": "wj/a",
        "event": "granted",
        "index": grant.token,
        "lease": first.id,
        "token": grant.token,
    }
    assert (queued["event"], queued["lease"], queued["token"]) == ("queued", second.id, None)
    assert (released["event"], released["lease"], released["token"]) == (
        "released",
        first.id,
        grant.token,
    )
    assert released["granted"] == {"lease": second.id, "token": released["index"]}
    assert granted["index"] < queued["index"] < released["index"]


def test_a_watcher_connected_through_a_killed_leader_misses_no_change(
    cluster: Cluster, tmp_path: Path
) -> None:
    leader = cluster.wait_for_leader()
    others = [n.address for n in cluster.nodes.values() if n is not leader]
    client = cluster.client()
    caused: list[tuple[str, str, str]] = []
    try:
        lease = client.open_lease(60_000)
        start = client.acquire(lease, "lk/start")
        caused.append(("lk/start", "granted", lease.id))
        # The watcher talks to the leader first: the kill breaks its connection.
        env = ",".join([leader.address, *others])
        proc = Dlm(env, tmp_path).start(
            "watch",
            "--prefix",
            "lk/",
            "--after",
            str(start.token - 1),
            "--json",
            "--timeout",
            "30s",
        )
        try:
            lines = Lines(proc)
            assert lines.take(1)[0]["key"] == "lk/start"
            for n in range(5):
                client.acquire(lease, f"lk/{n}")
                caused.append((f"lk/{n}", "granted", lease.id))
            # The watcher is paused through the kill and the changes after it, so it finds
            # its connection gone only once they are made: it must resume after the last
            # index it printed, not from "now" on the member it reaches next.
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                leader.kill()
                cluster.wait_for_leader(timeout=20.0, not_=leader.node_id)
                for n in range(5):
                    client.release(lease, f"lk/{n}")
                    caused.append((f"lk/{n}", "released", lease.id))
                for n in range(5, 8):
                    client.acquire(lease, f"lk/{n}")
                    caused.append((f"lk/{n}", "granted", lease.id))
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            seen = lines.take(len(caused) - 1)
        finally:
            stop(proc)
    finally:
        client.close()
    assert [(e["key"], e["event"], e["lease"]) for e in seen] == caused[1:]
    indexes = [e["index"] for e in seen]
    assert indexes == sorted(set(indexes)), "out of order or repeated"


def test_watch_exits_69_once_the_cluster_stays_unreachable_past_timeout(tmp_path: Path) -> None:
    nowhere = ",".join(f"127.0.0.1:{port}" for port in free_ports(3))
    dlm = Dlm(nowhere, tmp_path)
    code, out, err = finish(dlm.start("watch", "wk", "--timeout", "2s"), timeout=60)
    assert code == 69, (code, out, err)
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "--timeout" in err
    code, out, err = finish(dlm.start("watch", "wk", "--json", "--timeout", "2s"), timeout=60)
    assert code == 69, (code, out, err)
    assert json.loads(out)["error"]["code"] == "UNAVAILABLE"


def test_observe_shows_the_leader_and_each_change(shared: Cluster, tmp_path: Path) -> None:
    client = shared.client()
    try:
        first = client.open_lease(30_000)
        second = client.open_lease(30_000)
        lead = client.acquire(first, "ob/svc", meta={"value": "host-a"})
        proc = Dlm(shared.members_env, tmp_path).start("observe", "ob/svc", "--json")
        try:
            lines = Lines(proc)
            now = lines.take(1)[0]
            waiter = threading.Thread(
                target=lambda: client.spawn().acquire(
                    second, "ob/svc", wait=30, meta={"value": "host-b"}
                )
            )
            waiter.start()
            wait_for(lambda: client.get("ob/svc").waiting == 1, 15.0, "the second candidate")
            client.release(first, "ob/svc")
            waiter.join(30)
            after = lines.take(1)[0]
            client.release(second, "ob/svc")
            gone = lines.take(1)[0]
        finally:
            stop(proc)
    finally:
        client.close()
    assert set(now) == {"name", "value", "token", "since", "index"}
    assert (now["name"], now["value"], now["token"]) == ("ob/svc", "host-a", lead.token)
    assert (after["value"], after["token"]) == ("host-b", after["index"])
    assert after["token"] > lead.token
    assert (gone["value"], gone["token"]) == (None, None)


def test_status_key_watch_shows_the_lock_again_after_each_pushed_change(
    shared: Cluster, tmp_path: Path
) -> None:
    client = shared.client()
    proc = Dlm(shared.members_env, tmp_path).start("status", "sw/a", "--watch", "--json")
    try:
        lines = Lines(proc)
        assert lines.take(1)[0]["holders"] == []
        lease = client.open_lease(30_000)
        grant = client.acquire(lease, "sw/a")
        held = lines.take(1)[0]
        client.release(lease, "sw/a")
        free = lines.take(1)[0]
    finally:
        stop(proc)
        client.close()
    assert [(h["lease"], h["token"]) for h in held["holders"]] == [(lease.id, grant.token)]
    assert free["holders"] == []


def test_watch_without_a_key_or_prefix_is_a_usage_error(dlm: Dlm) -> None:
    proc = dlm.run("watch")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
