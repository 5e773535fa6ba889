"""Identities in the node machine: who may do what, at the member that receives a request and
again when its entry is applied (issue 23 items 1, 2 and 6)."""

from __future__ import annotations

from typing import Any

from dlm import auth
from dlm.node.locks.identities import IdentityTable
from dlm.node.snapshots import image, restore_image
from tests.unit.node.machine_driver import Client, Cluster


def at_version_3() -> Cluster:
    cluster = Cluster(3, max_version=3, peer_version=3)
    cluster.elect("n1")
    leader = cluster["n1"]
    cluster.run_until(lambda: leader.machine.locks.version == 3, 5.0, "cluster version 3")
    return cluster


def verifier(name: str) -> dict[str, bytes]:
    _, (key_id, stored_key, server_key) = auth.new_credential(name)
    return {"key_id": key_id, "stored_key": stored_key, "server_key": server_key}


def add(admin: Client, name: str, *prefixes: str, role: str = "client") -> dict[str, Any]:
    return admin.call("auth_add", name=name, role=role, prefixes=list(prefixes), **verifier(name))


def logged(cluster: Cluster, node: str, event: str) -> list[dict[str, Any]]:
    return [e.fields for e in cluster[node].events if e.event == event]


def test_a_client_may_lock_under_its_prefixes_and_act_only_on_its_own_leases() -> None:
    cluster = at_version_3()
    admin = cluster.connect("n1")
    assert add(admin, "ci", "ci/")["t"] == "ok"
    ci = cluster.connect("n1", "ci")
    assert ci.call("open_lease", lease="C", ttl_ms=5_000)["t"] == "ok"
    assert ci.call("acquire", lease="C", key="ci/build")["result"] == "granted"
    denied = ci.call("acquire", lease="C", key="prod/deploy")
    assert denied["code"] == "PERMISSION_DENIED"
    assert denied["message"] == (
        "identity 'ci' may not acquire 'prod/deploy': it lacks a prefix for it "
        "(its prefixes: 'ci/')"
    )
    assert admin.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"
    assert admin.call("acquire", lease="A", key="prod/deploy")["result"] == "granted"
    for t, extra in (("release", {"key": "prod/deploy"}), ("close_lease", {}), ("keepalive", {})):
        answer = ci.call(t, lease="A", **extra)
        assert answer["code"] == "PERMISSION_DENIED", (t, answer)
        assert "opened by identity 'admin'" in answer["message"]
    assert ci.call("member_remove", member="n3")["code"] == "PERMISSION_DENIED"
    assert ci.call("auth_list")["code"] == "PERMISSION_DENIED"
    # What it sees: its keys and its leases.
    assert [lock["key"] for lock in ci.call("list")["locks"]] == ["ci/build"]
    assert [lease["id"] for lease in ci.call("lease_list")["leases"]] == ["C"]
    assert ci.call("get", key="prod/deploy")["code"] == "PERMISSION_DENIED"
    # The admin may end the client's lease; the audit trail says so.
    assert admin.call("close_lease", lease="C")["t"] == "ok"
    (action,) = [f for f in logged(cluster, "n1", "admin_action") if f["action"] == "close_lease"]
    assert action == {"identity": "admin", "action": "close_lease", "target": "C", "owner": "ci"}
    refusals = cluster["n1"].machine.stats.refusals
    assert refusals[("ci", "acquire")] == 1 and refusals[("ci", "member_remove")] == 1


def test_an_identity_removed_between_propose_and_apply_is_refused_at_apply() -> None:
    cluster = at_version_3()
    admin = cluster.connect("n1")
    add(admin, "ci", "ci/")
    ci = cluster.connect("n1", "ci")
    assert ci.call("open_lease", lease="C", ttl_ms=5_000)["t"] == "ok"
    # The removal is proposed first; the acquire passes the leader's check (the removal is
    # not applied yet) and is proposed after it, so it is applied after it.
    admin.send("auth_remove", name="ci")
    ci.send("acquire", lease="C", key="ci/build")
    cluster.deliver()
    cluster.run_until(lambda: ci.closed, 2.0, "the removed identity's connection closed")
    cluster.advance(0.5)  # the followers apply too
    for member in cluster.members.values():
        assert member.machine.locks.get("ci/build") is None
        assert member.machine.locks.identities.get("ci") is None
        assert member.machine.stats.refusals == {("ci", "acquire"): 1}
    # Its lease was not freed at once: it runs out at its TTL, renewed by nobody.
    assert cluster["n1"].machine.locks.lease("C") is not None


def test_identity_changes_are_admin_only_and_logged_without_keys() -> None:
    cluster = at_version_3()
    admin = cluster.connect("n1")
    add(admin, "ops", role="admin")
    add(admin, "ci", "ci/")
    ci = cluster.connect("n1", "ci")
    assert ci.call("auth_add", name="x", role="client", **verifier("x"))["code"] == (
        "PERMISSION_DENIED"
    )
    ops = cluster.connect("n1", "ops")
    assert ops.call("auth_remove", name="ci")["t"] == "ok"
    actions = logged(cluster, "n2", "admin_action")
    assert [(a["identity"], a["action"], a["target"]) for a in actions] == [
        ("admin", "auth_add", "ops"),
        ("admin", "auth_add", "ci"),
        ("ops", "auth_remove", "ci"),
    ]
    text = repr(cluster["n2"].events)
    table = cluster["n1"].machine.locks.identities
    for name in table.names():
        for key in table.get(name).keys:  # type: ignore[union-attr]
            assert key.stored_key.hex() not in text and repr(key.stored_key) not in text


def test_before_version_3_identity_changes_wait_for_the_upgrade() -> None:
    cluster = Cluster(3, max_version=3, peer_version=2)
    cluster.elect("n1")
    admin = cluster.connect("n1")
    answer = admin.call("auth_add", name="ci", role="client", prefixes=["ci/"], **verifier("ci"))
    assert answer["code"] == "UNAVAILABLE"
    assert "protocol version 3" in answer["message"]


def test_the_snapshot_image_keeps_the_table_and_a_format_2_image_still_opens() -> None:
    cluster = at_version_3()
    admin = cluster.connect("n1")
    add(admin, "ci", "ci/", "x/")
    leader = cluster["n1"].machine
    data = image(leader.locks, leader.raft, leader.membership)
    restored = restore_image(data, type(leader.locks), leader.membership)
    assert restored.identities.image() == leader.locks.identities.image()
    assert restored.identities.rows() == [
        {
            "name": "ci",
            "role": "client",
            "prefixes": ["ci/", "x/"],
            "key_id": leader.locks.identities.rows()[0]["key_id"],
            "rotating": False,
            "old_key_until_ms": None,
            "max_leases": None,
            "max_locks": None,
            "max_connections": None,
            "max_inflight": None,
        }
    ]
    # A version-2 cluster's image (format 2) has no table: it opens with an empty one.
    v2 = Cluster(1)
    v2.elect("n1")
    m = v2["n1"].machine
    old = restore_image(image(m.locks, m.raft, m.membership), type(m.locks), m.membership)
    assert isinstance(old.identities, IdentityTable) and len(old.identities) == 0


def test_store_inspect_shows_the_identities_of_an_image_without_any_key() -> None:
    from dlm.store.inspect import _identities_of

    cluster = at_version_3()
    admin = cluster.connect("n1")
    add(admin, "ci", "ci/")
    leader = cluster["n1"].machine
    data = image(leader.locks, leader.raft, leader.membership)
    shown = _identities_of(data)
    assert shown == [{"name": "ci", "role": "client", "prefixes": ["ci/"], "keys": 1}]
    (identity,) = [leader.locks.identities.get("ci")]
    assert identity is not None
    assert identity.keys[0].stored_key.hex() not in repr(shown)
