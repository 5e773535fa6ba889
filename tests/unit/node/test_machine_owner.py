"""The identity a client connection authenticated as becomes the owner of the leases it
opens, once the cluster runs version 3 (docs/PROTOCOL.md, "Mixed versions")."""

from __future__ import annotations

from dlm import auth

from .machine_driver import Cluster


def _add(cluster: Cluster, name: str) -> None:
    _, (key_id, stored_key, server_key) = auth.new_credential(name)
    answer = cluster.connect("n1").call(
        "auth_add",
        name=name,
        role="client",
        prefixes=["k"],
        key_id=key_id,
        stored_key=stored_key,
        server_key=server_key,
    )
    assert answer["t"] == "ok", answer


def _owners(cluster: Cluster) -> dict[str, str]:
    listed = cluster.connect("n1").call("lease_list")
    return {lease["id"]: lease["owner"] for lease in listed["leases"]}


def test_a_lease_is_owned_by_the_identity_of_the_connection_that_opened_it() -> None:
    cluster = Cluster(3, max_version=3, peer_version=3)
    leader = cluster.elect()
    assert leader.machine.locks.version == 3
    _add(cluster, "team-a")
    _add(cluster, "team-b")
    team_a = cluster.connect("n1", identity="team-a")
    assert team_a.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"
    anonymous = cluster.connect("n1")
    assert anonymous.call("open_lease", lease="B", ttl_ms=5_000)["t"] == "ok"
    # Another identity may not join A (only its opener, or an admin, may act on it).
    joined = cluster.connect("n1", "team-b").call("open_lease", lease="A", ttl_ms=5_000)
    assert joined["code"] == "PERMISSION_DENIED"
    # A connection that names no identity is the built-in admin (identities.py).
    assert _owners(cluster) == {"A": "team-a", "B": "admin"}
    # Every replica recorded the same owner.
    for node in ("n2", "n3"):
        view = cluster[node].machine.locks.lease("A")
        assert view is not None and view.owner == "team-a"


def test_while_a_member_speaks_only_version_2_no_owner_enters_the_log() -> None:
    cluster = Cluster(3, max_version=3, peer_version=2)
    leader = cluster.elect()
    assert leader.machine.locks.version == 2
    team_a = cluster.connect("n1", identity="team-a")
    assert team_a.call("open_lease", lease="A", ttl_ms=5_000)["t"] == "ok"
    assert _owners(cluster) == {"A": ""}
