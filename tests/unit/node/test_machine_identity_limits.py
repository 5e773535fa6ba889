"""An admin's per-identity quotas (``dlm auth set``, issue 23 item 3) and idempotent removal
in the node machine: stored in the replicated identity table through the log (cluster
version 4), looked up by every member's ``limits_for`` and held at apply."""

from __future__ import annotations

from typing import Any

import cbor2

from dlm.node import locks
from dlm.node.machine import Quotas
from dlm.node.snapshots import NODE_IMAGE_FORMAT, NODE_IMAGE_FORMAT_V3, image, restore_image

from .machine_driver import Cluster
from .test_machine_quotas import _refused, as_identity


def started(size: int = 1, version: int = 4, **quotas: int) -> Cluster:
    cluster = Cluster(size, quotas=Quotas(**quotas), max_version=version, peer_version=version)
    cluster.elect("n1")
    leader = cluster["n1"].machine
    cluster.run_until(lambda: leader.locks.version == version, 5.0, f"version {version}")
    return cluster


def set_limits(cluster: Cluster, name: str, **limits: int) -> dict[str, Any]:
    return cluster.connect("n1").call("auth_set", name=name, **limits)


def test_an_admins_setting_binds_that_identity_on_every_member_and_no_other() -> None:
    cluster = started(3, identity_max_leases=10)
    ci = as_identity(cluster, "n1", "ci")
    other = as_identity(cluster, "n1", "deploy")
    assert set_limits(cluster, "ci", max_leases=2)["t"] == "ok"
    cluster.advance(0.5)
    for node in ("n1", "n2", "n3"):
        machine = cluster[node].machine
        assert machine.limits_for("ci").max_leases == 2, node
        assert machine.limits_for("deploy").max_leases == 10, node
    for lease in ("A", "B"):
        assert ci.call("open_lease", lease=lease, ttl_ms=5_000)["t"] == "ok"
    refused = ci.call("open_lease", lease="C", ttl_ms=5_000)
    _refused(refused, "ci", "identity_max_leases")
    assert "has 2 leases" in refused["message"] and "dlm auth set" in refused["message"]
    for lease in ("D", "E", "F"):
        assert other.call("open_lease", lease=lease, ttl_ms=5_000)["t"] == "ok"
    # Raised: the next one goes through.
    assert set_limits(cluster, "ci", max_leases=3)["t"] == "ok"
    assert ci.call("open_lease", lease="C", ttl_ms=5_000)["t"] == "ok"
    # Back to the members' default (0), the others unchanged (-1, the default).
    assert set_limits(cluster, "ci", max_leases=0, max_inflight=7)["t"] == "ok"
    assert set_limits(cluster, "ci", max_locks=4)["t"] == "ok"
    rows = cluster.connect("n1").call("auth_list")["identities"]
    row = next(r for r in rows if r["name"] == "ci")
    limits = {k: row[k] for k in ("max_leases", "max_locks", "max_connections", "max_inflight")}
    assert limits == {
        "max_leases": None,
        "max_locks": 4,
        "max_connections": None,
        "max_inflight": 7,
    }
    assert cluster["n2"].machine.limits_for("ci").max_inflight == 7


def test_the_setting_binds_entries_proposed_before_it_was_applied() -> None:
    # The open carries the default (10) it was proposed with; apply holds it to the table's.
    cluster = started(identity_max_leases=10)
    ci = as_identity(cluster, "n1", "ci")
    ci.call("open_lease", lease="A", ttl_ms=5_000)
    machine = cluster["n1"].machine.locks
    cmd = locks.IdentityCommand(
        "limits", "ci", "", (), b"", b"", b"", "admin", 0, limits=(1, -1, -1, -1)
    )
    index = machine.applied_index
    assert isinstance(machine.apply_command(index + 1, cmd).result, locks.IdentityChanged)
    opening = locks.OpenLeaseCommand("B", 5_000, locks.Origin("c", 9), 0, owner="ci", quota=10)
    result = machine.apply_command(index + 2, opening).result
    assert result == locks.QuotaExceeded("ci", "leases", 1)


def test_connections_and_requests_in_flight_follow_the_setting() -> None:
    cluster = started(identity_max_connections=10)
    machine = cluster["n1"].machine
    as_identity(cluster, "n1", "pinger")
    assert machine.client_refusal("pinger") is None
    assert set_limits(cluster, "pinger", max_connections=1)["t"] == "ok"
    refusal = machine.client_refusal("pinger")
    assert refusal is not None
    _refused(refusal, "pinger", "identity_max_connections")
    assert machine.client_refusal("deploy") is None


def test_before_version_4_a_setting_waits_for_the_upgrade_and_replicas_refuse_it() -> None:
    cluster = started(3, version=3)
    as_identity(cluster, "n1", "ci")
    answer = set_limits(cluster, "ci", max_leases=2)
    assert answer["code"] == "UNAVAILABLE"
    assert "protocol version 4" in answer["message"]
    # An entry of the new kind in a version-3 log: every replica refuses it alike.
    machine = cluster["n2"].machine.locks
    cmd = locks.IdentityCommand(
        "limits", "ci", "", (), b"", b"", b"", "admin", 0, limits=(2, -1, -1, -1)
    )
    outcome = machine.apply(machine.applied_index + 1, locks.encode_command(cmd))
    assert isinstance(outcome.result, locks.Invalid)
    assert "cluster version 4" in outcome.result.message
    assert machine.identities.limits_of("ci") == (0, 0, 0, 0)


def test_a_resent_removal_is_answered_done_another_is_refused() -> None:
    cluster = started(3)
    as_identity(cluster, "n1", "ci")
    admin = cluster.connect("n1")
    assert admin.call("auth_remove", name="ci", request=b"once")["t"] == "ok"
    # The client's re-send of the same request (its answer was lost), at another member.
    again = cluster.connect("n1").call("auth_remove", name="ci", request=b"once")
    assert (again["t"], again["op"], again["name"]) == ("ok", "remove", "ci")
    other = admin.call("auth_remove", name="ci", request=b"another")
    assert other["code"] == "BAD_REQUEST"
    assert other["message"] == "no identity 'ci' (identity 'admin' removed it earlier)"
    assert admin.call("auth_remove", name="typo", request=b"x")["code"] == "BAD_REQUEST"


def test_before_version_4_a_removal_goes_without_its_request_id() -> None:
    cluster = started(version=3)
    as_identity(cluster, "n1", "ci")
    admin = cluster.connect("n1")
    assert admin.call("auth_remove", name="ci", request=b"once")["t"] == "ok"
    assert admin.call("auth_remove", name="ci", request=b"once")["code"] == "BAD_REQUEST"


def test_the_node_image_is_format_4_with_the_limits_and_format_3_still_opens() -> None:
    cluster = started()
    as_identity(cluster, "n1", "ci")
    set_limits(cluster, "ci", max_leases=2)
    cluster.connect("n1").call("auth_remove", name="ci", request=b"r1")
    as_identity(cluster, "n1", "ops")
    set_limits(cluster, "ops", max_locks=3)
    leader = cluster["n1"].machine
    data = image(leader.locks, leader.raft, leader.membership)
    assert cbor2.loads(data)["format"] == NODE_IMAGE_FORMAT == 4
    restored = restore_image(data, type(leader.locks), leader.membership)
    assert restored.identities.limits_of("ops") == (0, 3, 0, 0)
    assert restored.identities.remove("ci", b"r1") is None  # the removal came along
    # A version-3 cluster's image (format 3): rows without limits, opened by this release.
    old = started(version=3)
    as_identity(old, "n1", "ci")
    m = old["n1"].machine
    data = image(m.locks, m.raft, m.membership)
    assert cbor2.loads(data)["format"] == NODE_IMAGE_FORMAT_V3
    again = restore_image(data, type(m.locks), m.membership)
    assert again.identities.names() == ["ci"] and again.identities.limits_of("ci") == (0,) * 4


def test_store_inspect_shows_each_identitys_own_limits_of_a_format_4_image() -> None:
    from dlm.store.inspect import _identities_of

    cluster = started()
    as_identity(cluster, "n1", "ci")
    set_limits(cluster, "ci", max_leases=2, max_inflight=9)
    leader = cluster["n1"].machine
    shown = _identities_of(image(leader.locks, leader.raft, leader.membership))
    assert shown is not None
    (row,) = shown
    assert (row["name"], row["keys"]) == ("ci", 1)
    limits = [row[f"max_{kind}"] for kind in ("leases", "locks", "connections", "inflight")]
    assert limits == [2, None, None, 9]


def test_a_setting_is_an_admin_action_in_the_audit_trail() -> None:
    cluster = started()
    as_identity(cluster, "n1", "ci")
    set_limits(cluster, "ci", max_leases=2, max_locks=0)
    actions = [e.fields for e in cluster["n1"].events if e.event == "admin_action"]
    assert actions[-1]["action"] == "auth_set" and actions[-1]["target"] == "ci"
    assert (actions[-1]["max_leases"], actions[-1]["max_locks"]) == (2, 0)
    assert "max_connections" not in actions[-1]
