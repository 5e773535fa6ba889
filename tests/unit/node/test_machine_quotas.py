"""Quotas per identity (dlm/node/quotas.py): one identity that floods leases, locks,
connections or requests reaches its own limit, and another identity keeps working.

Leases and locks are counted in the replicated state and decided at apply time from the
limit the leader wrote into the entry, so every replica refuses alike, even requests
proposed before the first of them was applied.
"""

from __future__ import annotations

from typing import Any

from dlm import auth
from dlm.node.machine import Quotas

from .machine_driver import Client, Cluster


def started(size: int = 1, **quotas: int) -> Cluster:
    cluster = Cluster(size, quotas=Quotas(**quotas), max_version=3, peer_version=3)
    cluster.elect("n1")
    assert cluster["n1"].machine.locks.version == 3
    return cluster


EVERY_KEY = "abcdefghijklmnopqrstuvwxyz"
"""One-character prefixes that cover the keys these tests lock."""


def as_identity(cluster: Cluster, node: str, name: str) -> Client:
    """A connection of client identity ``name`` (added first, allowed every key: the
    permissions are not what these tests are about)."""
    member = cluster[node].machine
    if member.locks.identities.get(name) is None:
        _, (key_id, stored_key, server_key) = auth.new_credential(name)
        answer = cluster.connect(cluster.leader.id).call(
            "auth_add",
            name=name,
            role="client",
            prefixes=list(EVERY_KEY),
            key_id=key_id,
            stored_key=stored_key,
            server_key=server_key,
        )
        assert answer["t"] == "ok", answer
    return cluster.connect(node, identity=name)


def _refused(answer: dict[str, Any], identity: str, limit: str) -> None:
    assert answer["t"] == "error", answer
    assert (answer["code"], answer["limit"], answer["identity"]) == (
        "QUOTA_EXCEEDED",
        limit,
        identity,
    )
    assert f"identity {identity!r}" in answer["message"]
    assert "--" + limit.replace("_", "-") in answer["message"]
    assert "cluster" not in answer["message"]


def test_an_identity_at_its_lease_limit_is_refused_and_another_is_not() -> None:
    cluster = started(identity_max_leases=2)
    flood = as_identity(cluster, "n1", "runaway")
    for lease in ("A", "B"):
        assert flood.call("open_lease", lease=lease, ttl_ms=5_000)["t"] == "ok"
    _refused(flood.call("open_lease", lease="C", ttl_ms=5_000), "runaway", "identity_max_leases")
    # Joining a lease it has adds nothing.
    assert flood.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"
    other = as_identity(cluster, "n1", "deploy")
    assert other.call("open_lease", lease="D", ttl_ms=5_000)["t"] == "ok"
    assert other.call("acquire", lease="D", key="prod")["result"] == "granted"
    # Once one of its leases ends, the runaway may open another.
    assert flood.call("close_lease", lease="B")["t"] == "ok"
    assert flood.call("open_lease", lease="C", ttl_ms=5_000)["t"] == "ok"


def test_the_lease_limit_holds_for_opens_proposed_before_any_was_applied() -> None:
    # The leader's early check sees none of them applied; apply decides, on every replica.
    cluster = started(3, identity_max_leases=1)
    flood = as_identity(cluster, "n1", "runaway")
    sent = [flood.send("open_lease", lease=lease, ttl_ms=5_000) for lease in ("A", "B", "C")]
    answers = [flood.wait(rid) for rid in sent]
    assert [a["t"] for a in answers] == ["ok", "error", "error"]
    for refused in answers[1:]:
        _refused(refused, "runaway", "identity_max_leases")
    cluster.advance(0.5)
    for node in ("n1", "n2", "n3"):
        locks = cluster[node].machine.locks
        assert [view.lease for view in locks.list_leases()[0]] == ["A"], node
        assert locks.usage.of("runaway").leases == 1


def test_held_locks_and_places_in_queues_count_toward_the_owners_lock_limit() -> None:
    cluster = started(identity_max_locks=2)
    other = as_identity(cluster, "n1", "deploy")
    other.call("open_lease", lease="D", ttl_ms=5_000)
    assert other.call("acquire", lease="D", key="busy")["result"] == "granted"
    flood = as_identity(cluster, "n1", "runaway")
    flood.call("open_lease", lease="A", ttl_ms=5_000)
    assert flood.call("acquire", lease="A", key="k1")["result"] == "granted"
    assert flood.call("acquire", lease="A", key="busy", wait=True)["result"] == "queued"
    _refused(flood.call("acquire", lease="A", key="k2"), "runaway", "identity_max_locks")
    # A lock it holds already is still answered (it adds nothing) ...
    assert flood.call("acquire", lease="A", key="k1")["result"] == "granted"
    # ... and the other identity is not held back.
    assert other.call("acquire", lease="D", key="k4")["result"] == "granted"
    # Its place in the queue becomes a hold when the key is freed: still two.
    assert other.call("release", lease="D", key="busy")["t"] == "ok"
    assert cluster["n1"].machine.locks.usage.of("runaway").locks == 2
    assert flood.call("release", lease="A", key="k1")["t"] == "ok"
    assert flood.call("acquire", lease="A", key="k2")["result"] == "granted"


def test_an_identity_at_its_connection_limit_is_refused_and_another_is_not() -> None:
    cluster = started(identity_max_connections=2)
    machine = cluster["n1"].machine
    held = [as_identity(cluster, "n1", "pinger") for _ in range(2)]
    refusal = machine.client_refusal("pinger")
    assert refusal is not None
    _refused(refusal, "pinger", "identity_max_connections")
    assert machine.client_refusal("deploy") is None
    held[0].close()
    assert machine.client_refusal("pinger") is None


def test_by_default_one_identity_may_take_three_quarters_of_the_members_connections() -> None:
    cluster = started()
    machine = cluster["n1"].machine
    machine.member_connections(8)
    for _ in range(6):
        assert machine.client_refusal("pinger") is None
        as_identity(cluster, "n1", "pinger")
    assert machine.client_refusal("pinger") is not None
    assert machine.client_refusal("deploy") is None


def test_requests_in_flight_on_one_connection_are_bounded() -> None:
    cluster = started(3, identity_max_inflight=2)
    flood = as_identity(cluster, "n1", "runaway")
    # Nothing is delivered to the followers yet: the first two wait for their commit.
    first = [flood.send("open_lease", lease=lease, ttl_ms=5_000) for lease in ("A", "B")]
    third = flood.send("open_lease", lease="C", ttl_ms=5_000)
    answer = flood.reply(third)
    assert answer is not None
    _refused(answer, "runaway", "identity_max_inflight")
    # Another connection of the same identity has its own count.
    assert as_identity(cluster, "n1", "runaway").send("ping") and True
    assert [flood.wait(rid)["t"] for rid in first] == ["ok", "ok"]
    assert flood.call("open_lease", lease="C", ttl_ms=5_000)["t"] == "ok"


def test_limits_for_is_the_seam_an_admins_setting_replaces() -> None:
    from dataclasses import replace

    cluster = started()
    machine = cluster["n1"].machine
    tight = replace(machine.default_limits, max_leases=1)
    machine.limits_for = lambda identity: tight if identity == "ci" else machine.default_limits
    ci = as_identity(cluster, "n1", "ci")
    assert ci.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"
    _refused(ci.call("open_lease", lease="B", ttl_ms=5_000), "ci", "identity_max_leases")
    assert (
        as_identity(cluster, "n1", "ops").call("open_lease", lease="B", ttl_ms=5_000)["t"] == "ok"
    )


def test_the_anonymous_identity_keeps_the_clusters_and_the_members_caps() -> None:
    # Without identities every client is "": there is no other identity to keep room
    # for, so the defaults take nothing from a cluster that has none.
    cluster = started(max_leases=4)
    machine = cluster["n1"].machine
    machine.member_connections(8)
    assert machine.limits_for("").max_connections == 8
    assert machine.limits_for("").max_leases == 4
    assert machine.limits_for("team-a").max_leases == 2
    for _ in range(7):
        cluster.connect("n1")
    assert machine.client_refusal("") is None  # the member's own cap answers at 8
    anonymous = cluster.connect("n1")
    for lease in ("A", "B", "C", "D"):
        assert anonymous.call("open_lease", lease=lease, ttl_ms=5_000)["t"] == "ok"
    refused = anonymous.call("open_lease", lease="E", ttl_ms=5_000)
    assert (refused["code"], refused["limit"]) == ("QUOTA_EXCEEDED", "max_leases")
