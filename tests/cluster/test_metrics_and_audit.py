"""The operator's view of real members: /metrics scraped over HTTP, and the JSON audit log.

One 3-member cluster for the module, each member serving metrics on a free
127.0.0.1 port (``--metrics-listen``). Counters are compared before and after
an operation, on the leader (the member that answers and proposes); the audit
trail is read from the leader's stderr, which the harness keeps in
``<id>.log``. The test that stops a follower runs last and brings it back.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dlm.node.runtime.metrics import METRIC_HELP
from dlm.wire import PROTOCOL_VERSION
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, NodeProc, RawConn, free_ports, wait_for
from tests.unit.test_docs import readme_metrics

pytestmark = pytest.mark.cluster

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
ELECTION_TIMEOUT_S = 0.3
"""dlm.node.machine.Timing's default (6 ticks of 50 ms); a member draws up to twice it."""


class MeteredNode(NodeProc):
    """A member that also serves /metrics on its own free port."""

    def __init__(self, cluster: Cluster, node_id: str, port: int, metrics_port: int) -> None:
        super().__init__(cluster, node_id, port)
        self.metrics_port = metrics_port

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--metrics-listen",
            f"127.0.0.1:{self.metrics_port}",
            # The run ledger of the keys under m-doc as dlm_job_* metrics (issue 28).
            "--job-metrics",
            "m-doc",
        ]

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def scrape_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5.0) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body: bytes = response.read()
        return body.decode()

    def scrape(self) -> Samples:
        """Every sample served, by sample name and labels."""
        out: Samples = {}
        for family in text_string_to_metric_families(self.scrape_text()):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    def audit(self) -> list[dict[str, Any]]:
        """The JSON lines this member logged (stderr and stdout share the harness's file)."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        return records


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("metered"), size=3)
    ports = free_ports(6)  # all at once, so no two are the same
    cluster.nodes = {
        f"n{i + 1}": MeteredNode(cluster, f"n{i + 1}", ports[i], ports[3 + i]) for i in range(3)
    }
    cluster.peers_flag = ",".join(f"{n.node_id}={n.address}" for n in cluster.nodes.values())
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        # A member serves metrics once its endpoint is bound, a moment after it serves
        # the protocol: the first test to connect must not find the port closed.
        for node in metered_nodes(cluster):
            wait_for(partial(_serving, node), 15.0, f"{node.node_id}'s metrics endpoint")
        yield cluster
    finally:
        cluster.stop_all()


def _serving(node: MeteredNode) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", node.metrics_port), timeout=1.0):
            return True
    except OSError:
        return False


@pytest.fixture
def leader(metered: Cluster) -> MeteredNode:
    node = metered.wait_for_leader()
    assert isinstance(node, MeteredNode)
    return node


@pytest.fixture
def dlm(metered: Cluster, tmp_path: Path) -> Dlm:
    return Dlm(metered.members_env, tmp_path)


def metered_nodes(cluster: Cluster) -> list[MeteredNode]:
    nodes = [n for n in cluster.nodes.values() if isinstance(n, MeteredNode)]
    assert len(nodes) == len(cluster.nodes)
    return nodes


# ---------------------------------------------------------------------------
# What is served
# ---------------------------------------------------------------------------


def test_every_metric_is_served_with_the_type_and_labels_the_readme_gives(
    leader: MeteredNode, dlm: Dlm
) -> None:
    # A grant and a release, so that every labelled family has samples to show its labels
    # (a `dlm exec` run of a key under --job-metrics, once the ledger's version is in force).
    wait_for(
        lambda: value(leader.scrape(), "dlm_cluster_version") == PROTOCOL_VERSION,
        10.0,
        "the cluster at the ledger's version",
    )
    assert dlm.run("exec", "--lock", "m-doc", "--", "true").returncode == 0
    # And a refusal at the leader: a client identity may not list the identities.
    credential = dlm.cwd / "m-doc.cred"
    dlm.json("auth", "add", "m-doc", "--prefix", "m-doc/", "--out", str(credential))
    limited = Dlm(leader.address, dlm.cwd)
    limited.env["DLM_SECRET_FILE"] = str(credential)
    assert limited.json("auth", "list", code=77)["error"]["code"] == "PERMISSION_DENIED"
    documented = readme_metrics()
    wait_for(lambda: value(leader.scrape(), "dlm_hold_seconds_count") >= 1, 10.0, "a hold measured")
    served = {f.name: f for f in text_string_to_metric_families(leader.scrape_text())}
    for name, (kind, labels) in documented.items():
        family_name = name.removesuffix("_total") if kind == "counter" else name
        if name.startswith("process_"):
            assert family_name in served, f"{name} is documented but not served"
            continue
        family = served.get(family_name)
        assert family is not None, f"{name} is documented but not served"
        assert family.type == kind, (name, family.type, kind)
        assert family.samples, f"{name} has no samples on the leader"
        seen = {label for sample in family.samples for label in sample.labels} - {"le"}
        assert seen == set(labels), (name, seen, labels)
    dlm_served = {name for name in served if name.startswith("dlm_")}
    documented_families = {
        n.removesuffix("_total") if kind == "counter" else n for n, (kind, _) in documented.items()
    }
    assert dlm_served <= documented_families, dlm_served - documented_families
    assert {n for n in documented if n.startswith("dlm_")} == set(METRIC_HELP)


def test_the_endpoint_serves_metrics_only(metered: Cluster) -> None:
    node = metered_nodes(metered)[0]
    base = f"http://127.0.0.1:{node.metrics_port}"
    for path in ("/", "/metric", "/metrics/x", "/debug/pprof"):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(base + path, timeout=5.0)
        assert caught.value.code == 404, path
    request = urllib.request.Request(node.metrics_url, data=b"x=1", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5.0)
    assert caught.value.code == 405


@pytest.mark.serial  # a flood of connections, like test_floods.py's
def test_a_flood_of_idle_connections_does_not_stop_a_scrape(metered: Cluster) -> None:
    from dlm.node.runtime.metrics import MAX_CONNECTIONS

    node = metered_nodes(metered)[0]
    idle: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS + 36):
            idle.append(socket.create_connection(("127.0.0.1", node.metrics_port), timeout=5.0))
        for _ in range(3):
            assert "dlm_raft_term" in node.scrape_text()
        # The member's own protocol port is not affected either.
        assert node.status() is not None
    finally:
        for sock in idle:
            sock.close()


# ---------------------------------------------------------------------------
# Counters move with what happens
# ---------------------------------------------------------------------------


def test_an_exec_is_a_request_a_grant_a_release_and_an_audited_grant(
    leader: MeteredNode, dlm: Dlm
) -> None:
    before = leader.scrape()
    proc = dlm.run("exec", "--lock", "m-exec", "--", "true")
    assert proc.returncode == 0, proc.stderr

    def released() -> Samples | None:
        after = leader.scrape()
        done = value(after, "dlm_hold_seconds_count") > value(before, "dlm_hold_seconds_count")
        return after if done else None

    after = wait_for(released, 10.0, "the release to be applied on the leader")
    acquire_ok = {"type": "acquire", "result": "OK"}
    assert value(after, "dlm_requests_total", **acquire_ok) == (
        value(before, "dlm_requests_total", **acquire_ok) + 1
    )
    assert value(after, "dlm_grants_total") == value(before, "dlm_grants_total") + 1
    releases_after = sum(value(after, "dlm_releases_total", how=h) for h in ("released", "closed"))
    releases_before = sum(
        value(before, "dlm_releases_total", how=h) for h in ("released", "closed")
    )
    assert releases_after == releases_before + 1
    assert value(after, "dlm_raft_proposals_total") > value(before, "dlm_raft_proposals_total")
    assert value(after, "dlm_fsync_seconds_count") > value(before, "dlm_fsync_seconds_count")
    assert value(after, "dlm_fsync_batch_entries_count") > value(
        before, "dlm_fsync_batch_entries_count"
    )
    grants = [r for r in leader.audit() if r["event"] == "lock_granted" and r["key"] == "m-exec"]
    assert len(grants) == 1, grants
    grant = grants[0]
    assert isinstance(grant["token"], int) and grant["token"] > 0
    assert isinstance(grant["lease"], str) and grant["lease"]
    owner = grant["owner"]
    assert set(owner) >= {"host", "user", "pid", "cmd"}, owner
    assert owner["host"] == socket.gethostname() and owner["cmd"] == "true"
    assert owner["pid"].isdigit()
    assert {"time", "ts", "level", "node"} <= set(grant) and grant["node"] == leader.node_id
    ends = [r for r in leader.audit() if r["event"] == "lock_released" and r["key"] == "m-exec"]
    assert [(r["lease"], r["how"]) for r in ends] in (
        [(grant["lease"], "released")],
        [(grant["lease"], "closed")],
    )
    assert ends[0]["index"] > grant["token"]


def test_a_conflict_is_counted_as_locked(metered: Cluster, leader: MeteredNode, dlm: Dlm) -> None:
    with metered.client() as holder:
        lease = holder.open_lease(30_000)
        holder.acquire(lease, "m-busy")
        before = leader.scrape()
        proc = dlm.run("exec", "--lock", "m-busy", "--", "true")
        assert proc.returncode == 75, proc.stderr
        after = leader.scrape()
        holder.close_lease(lease)
    locked = {"type": "acquire", "result": "LOCKED"}
    assert value(after, "dlm_requests_total", **locked) == (
        value(before, "dlm_requests_total", **locked) + 1
    )


def test_a_lease_left_to_expire_is_counted_and_audited(
    metered: Cluster, leader: MeteredNode
) -> None:
    before = leader.scrape()
    with metered.client() as client:
        lease = client.open_lease(1_000)
        first = client.acquire(lease, "m-lost-1")
        client.acquire(lease, "m-lost-2")

    def expired() -> Samples | None:
        after = leader.scrape()
        more = value(after, "dlm_lease_expiries_total") > value(before, "dlm_lease_expiries_total")
        return after if more else None

    after = wait_for(expired, 10.0, "the lease to expire")
    assert value(after, "dlm_lease_expiries_total") == value(before, "dlm_lease_expiries_total") + 1
    assert value(after, "dlm_locks_lost_total") == value(before, "dlm_locks_lost_total") + 2
    assert value(after, "dlm_releases_total", how="expired") == (
        value(before, "dlm_releases_total", how="expired") + 2
    )
    records = leader.audit()
    (expiry,) = [r for r in records if r["event"] == "lease_expired" and r["lease"] == lease.id]
    assert expiry["released"] == ["m-lost-1", "m-lost-2"] and expiry["index"] > first.token
    deadlines = [
        r for r in records if r["event"] == "lease_deadline_passed" and r["lease"] == lease.id
    ]
    assert expiry["index"] in [r["index"] for r in deadlines]
    lost = [(r["key"], r["how"]) for r in records if r.get("lease") == lease.id and "how" in r]
    assert lost == [("m-lost-1", "expired"), ("m-lost-2", "expired")]
    assert [r["event"] for r in records if r.get("lease") == lease.id][:1] == ["lease_opened"]


# ---------------------------------------------------------------------------
# Gauges agree with `dlm status`
# ---------------------------------------------------------------------------


def test_sessions_locks_and_waiters_match_dlm_status(
    metered: Cluster, leader: MeteredNode, dlm: Dlm
) -> None:
    with metered.client() as holder, RawConn(leader.address) as waiter:
        lease = holder.open_lease(30_000)
        holder.acquire(lease, "m-gauge")
        opened = waiter.request(
            {"t": "open_lease", "lease": "m-waiter", "ttl_ms": 30_000, "seq": 1}
        )
        assert opened["t"] == "ok", opened
        queued = waiter.request(
            {"t": "acquire", "lease": "m-waiter", "key": "m-gauge", "wait": True, "seq": 2}
        )
        assert queued.get("result") == "queued", queued

        def agree() -> tuple[dict[str, Any], Samples] | None:
            status = dlm.json("status")
            samples = leader.scrape()
            again = dlm.json("status")
            figures = ("sessions", "locks", "waiters")
            if any(status[f] != again[f] for f in figures):
                return None  # something changed meanwhile: look again
            return status, samples

        status, samples = wait_for(agree, 10.0, "a quiet moment")
        assert value(samples, "dlm_sessions") == status["sessions"] >= 2
        assert value(samples, "dlm_locks_held") == status["locks"] >= 1
        assert value(samples, "dlm_waiters") == status["waiters"] >= 1
        holder.close_lease(lease)
        waiter.request({"t": "close_lease", "lease": "m-waiter", "seq": 3})


def test_one_leader_one_term_and_the_raft_figures(metered: Cluster, leader: MeteredNode) -> None:
    # The log reaches this release's version once every member has told the leader what
    # it speaks, a moment after the election: this may be the first test of a fresh cluster.
    wait_for(
        lambda: all(
            value(node.scrape(), "dlm_cluster_version") == PROTOCOL_VERSION
            for node in metered_nodes(metered)
        ),
        15.0,
        "every member at this release's cluster version",
    )
    scrapes = {node.node_id: node.scrape() for node in metered_nodes(metered)}
    leaders = [n for n, s in scrapes.items() if value(s, "dlm_raft_role", role="leader") == 1]
    assert leaders == [leader.node_id]
    for node_id, samples in scrapes.items():
        roles = [value(samples, "dlm_raft_role", role=r) for r in ("follower", "leader")]
        assert sorted(roles) == [0.0, 1.0], node_id
        assert value(samples, "dlm_raft_term") >= 1
        assert value(samples, "dlm_raft_leader_changes_total") >= 1
        assert value(samples, "dlm_raft_applied_index") <= value(samples, "dlm_raft_commit_index")
        assert value(samples, "dlm_cluster_version") == PROTOCOL_VERSION
    assert len({value(s, "dlm_raft_term") for s in scrapes.values()}) == 1
    mine = scrapes[leader.node_id]
    for peer in metered.nodes:
        if peer != leader.node_id:
            assert value(mine, "dlm_peer_reachable", peer=peer) == 1
            assert value(mine, "dlm_peer_append_rtt_seconds_count", peer=peer) >= 1
    # Followers say nothing about reachability: only the leader hears from everyone.
    for node_id, samples in scrapes.items():
        if node_id != leader.node_id:
            assert not [k for k in samples if k[0] == "dlm_peer_reachable"]


# ---------------------------------------------------------------------------
# A follower stops and comes back (last: it changes the cluster)
# ---------------------------------------------------------------------------


def test_a_stopped_follower_is_unreachable_silent_then_regained(
    metered: Cluster, leader: MeteredNode
) -> None:
    follower = next(n for n in metered_nodes(metered) if n is not leader)
    peer = follower.node_id
    # The starting state: a loaded host can leave a link a moment behind the election.
    wait_for(
        lambda: value(leader.scrape(), "dlm_peer_reachable", peer=peer) == 1,
        10 * ELECTION_TIMEOUT_S,
        f"the leader to reach {peer}",
    )
    mark = len(leader.audit())  # start-up may have logged a peer_silent already
    follower.terminate()
    wait_for(
        lambda: value(leader.scrape(), "dlm_peer_reachable", peer=peer) == 0,
        10 * ELECTION_TIMEOUT_S,
        f"the leader to report {peer} unreachable",
    )

    def silent() -> dict[str, Any] | None:
        for record in leader.audit()[mark:]:
            if record["event"] == "peer_silent" and record["peer"] == peer:
                return record
        return None

    warning = wait_for(silent, 10.0, "a peer_silent warning")
    assert warning["level"] == "warning" and warning["address"] == follower.address
    assert warning["silent_ms"] >= ELECTION_TIMEOUT_S * 1000
    follower.start()
    wait_for(
        lambda: value(leader.scrape(), "dlm_peer_reachable", peer=peer) == 1,
        15.0,
        f"the leader to hear from {peer} again",
    )

    def regained() -> dict[str, Any] | None:
        for record in leader.audit()[mark:]:
            if record["event"] == "peer_regained" and record["peer"] == peer:
                return record
        return None

    back = wait_for(regained, 10.0, "a peer_regained line")
    assert back["level"] == "info" and back["silent_ms"] >= warning["silent_ms"]
    assert metered.wait_for_leader().node_id == leader.node_id
