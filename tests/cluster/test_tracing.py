"""Issue 30, tracing end to end: `dlm acquire` given a TRACEPARENT, three real members
exporting with OpenTelemetry to an OTLP receiver the test starts (tests/otlp_receiver.py);
the operator finds the client's span, the leader's request, proposal, fsync and
replication spans under the job's trace id, and, through a gateway, the gateway's
routing span between the client's and the leader's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dlm.partitioning import partition_of
from tests.cluster.cli_harness import Dlm
from tests.cluster.gateways import GatewayProc, unreachable_env
from tests.cluster.harness import Cluster
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.proto")

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID, PARENT_SPAN = PARENT.split("-")[1:3]


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[Cluster, OtlpReceiver, dict[str, str]]]:
    """A receiver, and three members that export to it (their batches leave every 100 ms)."""
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        base = tmp_path / "cluster"
        base.mkdir()
        cluster = Cluster(base, size=3, env=env)
        try:
            cluster.start_all()
            cluster.wait_for_leader(timeout=15.0)
            yield cluster, receiver, env
        finally:
            cluster.stop_all()


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.name == name]


def _acquire_traced(spans: list[ReceivedSpan]) -> bool:
    """The client's span and, under it, the leader's acquire with its fsync are in."""
    mine = [s for s in spans if s.trace_id == TRACE_ID]
    clients = [s for s in mine if s.name == "dlm.acquire"]
    for client in clients:
        for request in _children(mine, client, "dlm.request"):
            if request.attributes.get("dlm.request") != "acquire":
                continue
            for proposal in _children(mine, request, "raft.proposal"):
                if _children(mine, proposal, "wal.fsync"):
                    return True
    return False


def test_an_acquire_is_traced_from_the_client_to_the_leaders_fsync(
    traced: tuple[Cluster, OtlpReceiver, dict[str, str]], tmp_path: Path
) -> None:
    cluster, receiver, env = traced
    leader = cluster.wait_for_leader(timeout=15.0)
    dlm = Dlm(cluster.members_env, tmp_path)
    took = dlm.run("acquire", "jobs/traced", "--json", env={**env, "TRACEPARENT": PARENT})
    assert took.returncode == 0, took.stderr
    spans = [s for s in receiver.wait_for(_acquire_traced) if s.trace_id == TRACE_ID]

    (client,) = [s for s in spans if s.name == "dlm.acquire"]
    assert (client.service, client.parent_span_id) == ("dlm", PARENT_SPAN)
    (request,) = [
        s
        for s in _children(spans, client, "dlm.request")
        if s.attributes.get("dlm.request") == "acquire"
    ]
    assert request.service == "dlm-node"
    assert request.attributes["dlm.member"] == leader.node_id
    assert request.attributes["dlm.key"] == "jobs/traced"
    (proposal,) = _children(spans, request, "raft.proposal")
    assert proposal.attributes["dlm.committed"] is True
    (fsync,) = _children(spans, proposal, "wal.fsync")
    (apply,) = _children(spans, request, "raft.apply")
    # Nested in time as in the tree (one batch, one clock).
    assert request.start_ns <= proposal.start_ns <= fsync.start_ns <= fsync.end_ns
    assert proposal.end_ns <= apply.start_ns <= request.end_ns
    # The round trips to the followers that made the quorum, named by follower.
    round_trips = _children(spans, proposal, "raft.replicate")
    peers = {s.attributes["dlm.peer"] for s in round_trips}
    assert peers and peers <= set(cluster.nodes) - {leader.node_id}
    if fsync.end_ns > proposal.end_ns:
        # Both followers had the entry before the leader's own write ended: they made the
        # commit alone, and the spans waited for that write.
        assert len([r for r in round_trips if r.end_ns <= proposal.end_ns]) == 2
    # The lease the command opened first is in the same trace.
    opened = [
        s
        for s in _children(spans, client, "dlm.request")
        if s.attributes.get("dlm.request") == "open_lease"
    ]
    assert opened


def test_an_acquire_through_a_gateway_is_traced_from_the_client_through_the_gateway(
    traced: tuple[Cluster, OtlpReceiver, dict[str, str]], tmp_path: Path
) -> None:
    cluster, receiver, env = traced
    leader = cluster.wait_for_leader(timeout=15.0)
    gateway = GatewayProc(tmp_path, "gw", cluster.members_env, env=env).start()
    try:
        # A host that reaches the gateway and no member.
        dlm = Dlm(gateway.address, tmp_path)
        dlm.env.update(unreachable_env(cluster))
        took = dlm.run("acquire", "jobs/gw-traced", "--json", env={**env, "TRACEPARENT": PARENT})
        assert took.returncode == 0, took.stderr

        def found(spans: list[ReceivedSpan]) -> bool:
            mine = [s for s in spans if s.trace_id == TRACE_ID]
            return _acquire_traced(mine) and any(s.name == "dlm.gateway.route" for s in mine)

        spans = [s for s in receiver.wait_for(found) if s.trace_id == TRACE_ID]
    finally:
        assert gateway.terminate() == 0
    (client,) = [s for s in spans if s.name == "dlm.acquire"]
    routes = [s for s in spans if s.name == "dlm.gateway.route"]
    # One span per connection the client opened through the gateway, each a child of the
    # client's span, from the gateway's process.
    assert routes and all(r.parent_span_id == client.span_id for r in routes)
    assert {r.service for r in routes} == {"dlm-gateway"}
    assert all(r.attributes["dlm.dial_attempts"] >= 1 for r in routes)
    assert {r.attributes["dlm.partition"] for r in routes} == {0}
    # The connection that carried the acquire reached the leader (named by the client
    # after a redirect, or found first).
    (request,) = [
        s
        for s in _children(spans, client, "dlm.request")
        if s.attributes.get("dlm.request") == "acquire"
    ]
    assert request.attributes["dlm.member"] == leader.node_id
    assert leader.address in {r.attributes["dlm.member"] for r in routes}
    (proposal,) = _children(spans, request, "raft.proposal")
    assert _children(spans, proposal, "wal.fsync")


def test_with_tracing_off_in_the_client_its_traceparent_still_joins_the_members_spans(
    traced: tuple[Cluster, OtlpReceiver, dict[str, str]], tmp_path: Path
) -> None:
    cluster, receiver, _ = traced
    dlm = Dlm(cluster.members_env, tmp_path)
    # No OTLP endpoint in the command's environment: it sends TRACEPARENT on unchanged.
    took = dlm.run("acquire", "jobs/untraced-client", "--json", env={"TRACEPARENT": PARENT})
    assert took.returncode == 0, took.stderr

    def found(spans: list[ReceivedSpan]) -> bool:
        return any(
            s.trace_id == TRACE_ID
            and s.name == "dlm.request"
            and s.attributes.get("dlm.key") == "jobs/untraced-client"
            for s in spans
        )

    spans = receiver.wait_for(found)
    requests = [
        s
        for s in spans
        if s.name == "dlm.request" and s.attributes.get("dlm.key") == "jobs/untraced-client"
    ]
    assert {s.parent_span_id for s in requests} == {PARENT_SPAN}
    assert not [s for s in spans if s.service == "dlm"]  # the client exported nothing


def test_dlm_exec_puts_its_lock_in_the_jobs_trace(
    traced: tuple[Cluster, OtlpReceiver, dict[str, str]], tmp_path: Path
) -> None:
    cluster, receiver, env = traced
    dlm = Dlm(cluster.members_env, tmp_path)
    ran = dlm.run(
        "exec", "--lock", "jobs/exec-traced", "--", "true", env={**env, "TRACEPARENT": PARENT}
    )
    assert ran.returncode == 0, ran.stderr

    def found(spans: list[ReceivedSpan]) -> bool:
        mine = [s for s in spans if s.trace_id == TRACE_ID]
        return any(
            r.attributes.get("dlm.key") == "jobs/exec-traced"
            for e in mine
            if e.name == "dlm.exec"
            for r in _children(mine, e, "dlm.request")
        )

    spans = [s for s in receiver.wait_for(found) if s.trace_id == TRACE_ID]
    (job,) = [s for s in spans if s.name == "dlm.exec"]
    assert job.parent_span_id == PARENT_SPAN
    kinds = {r.attributes.get("dlm.request") for r in _children(spans, job, "dlm.request")}
    assert {"open_lease", "acquire"} <= kinds


def test_a_partitioned_clusters_spans_name_the_partition(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        base = tmp_path / "cluster"
        base.mkdir()
        cluster = Cluster(base, size=3, env=env, partitions=2)
        try:
            cluster.start_all()
            cluster.wait_for_leaders()
            dlm = Dlm(cluster.members_env, tmp_path)
            took = dlm.run("acquire", "jobs/p", "--json", env={**env, "TRACEPARENT": PARENT})
            assert took.returncode == 0, took.stderr
            spans = receiver.wait_for(_acquire_traced)
        finally:
            cluster.stop_all()
    (request,) = [
        s for s in spans if s.name == "dlm.request" and s.attributes.get("dlm.request") == "acquire"
    ]
    assert request.attributes["dlm.partition"] == partition_of("jobs/p", 2)


def test_the_python_api_sends_a_locks_traceparent_to_the_members(
    traced: tuple[Cluster, OtlpReceiver, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlm

    cluster, receiver, _ = traced
    # Tracing off in this process (no endpoint): the lock's context goes to the members as
    # it was given, so their spans are its children.
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TRACEPARENT", raising=False)
    with (
        dlm.Client(cluster.members_env) as client,
        client.lock("jobs/api-traced", traceparent=PARENT),
    ):
        pass

    def found(spans: list[ReceivedSpan]) -> bool:
        return any(
            s.name == "dlm.request"
            and s.attributes.get("dlm.key") == "jobs/api-traced"
            and s.attributes.get("dlm.request") == "acquire"
            for s in spans
        )

    spans = receiver.wait_for(found)
    mine = [s for s in spans if s.attributes.get("dlm.key") == "jobs/api-traced"]
    assert {(s.trace_id, s.parent_span_id) for s in mine} == {(TRACE_ID, PARENT_SPAN)}
    assert "acquire" in {s.attributes.get("dlm.request") for s in mine}
