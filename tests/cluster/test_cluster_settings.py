"""`dlm config set|get|list` against real members: cluster-wide settings through the log
(dlm/node/locks/settings.py, dlm/cli/config_cmd.py), admin only, audited, and in a
partitioned cluster written into every partition's group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, RawConn, wait_for

pytestmark = pytest.mark.cluster


def _audited(cluster: Cluster, setting: str) -> bool:
    for node in cluster.nodes.values():
        for line in node.log_tail(400).splitlines():
            if '"config_set"' in line and f'"{setting}"' in line and "admin_action" in line:
                return True
    return False


def test_max_ttl_refuses_a_longer_lease_and_config_get_shows_it(
    shared: Cluster, tmp_path: Path
) -> None:
    admin = Dlm(shared.members_env, tmp_path)
    # `dlm config set` waits (retrying) until the cluster runs version 5, as members start.
    assert admin.json("config", "set", "max-ttl", "10s") == {
        "set": {"setting": "max-ttl", "value_ms": 10_000}
    }
    ran = admin.run("acquire", "settings/long", "--ttl", "60s")
    assert ran.returncode == 2, (ran.returncode, ran.stdout, ran.stderr)
    assert "max-ttl" in ran.stderr and "10s" in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    admin.json("acquire", "settings/short", "--ttl", "5s")

    assert admin.json("config", "get", "max-ttl") == {"settings": {"max-ttl": 10_000}}
    listed = admin.json("config", "list")["settings"]
    assert listed == {"default-ttl": None, "lock-delay": None, "max-ttl": 10_000}
    wait_for(lambda: _audited(shared, "max-ttl"), 10.0, "the audit line of config set")

    # Unset: the long lease is fine again.
    admin.json("config", "set", "max-ttl", "0")
    admin.json("acquire", "settings/long", "--ttl", "60s")
    assert admin.json("config", "get", "max-ttl") == {"settings": {"max-ttl": None}}


def test_a_value_out_of_bounds_or_an_unknown_setting_is_one_line(
    shared: Cluster, tmp_path: Path
) -> None:
    admin = Dlm(shared.members_env, tmp_path)
    for args in (("max-ttl", "100ms"), ("lock-delay", "2h"), ("max-tll", "10s")):
        ran = admin.run("config", "set", *args)
        assert ran.returncode == 2, (args, ran.stderr)
        assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr


def test_a_client_identity_may_not_change_or_read_the_settings(
    shared: Cluster, tmp_path: Path
) -> None:
    admin = Dlm(shared.members_env, tmp_path)
    credential = tmp_path / "ci.cred"
    admin.json("auth", "add", "ci", "--role", "client", "--prefix", "ci/", "--out", str(credential))
    ci = Dlm(shared.members_env, tmp_path)
    ci.env["DLM_SECRET_FILE"] = str(credential)
    ran = ci.run("config", "set", "max-ttl", "5s", "--json")
    assert ran.returncode == 77, (ran.returncode, ran.stdout, ran.stderr)
    assert json.loads(ran.stdout)["error"]["code"] == "PERMISSION_DENIED"
    ran = ci.run("config", "list")
    assert ran.returncode == 77, (ran.returncode, ran.stderr)
    assert admin.json("config", "get", "max-ttl")["settings"]["max-ttl"] is None


def test_default_ttl_fills_in_an_open_that_names_none(shared: Cluster, tmp_path: Path) -> None:
    admin = Dlm(shared.members_env, tmp_path)
    admin.json("config", "set", "default-ttl", "45s")
    try:
        leader = shared.wait_for_leader(timeout=15.0)
        hello = {"t": "hello", "role": "client", "version": 1, "max_version": 5}
        with RawConn(leader.address, hello=hello) as conn:
            reply = conn.request(
                {"t": "open_lease", "lease": "rawdefault", "client": "raw", "seq": 1}
            )
        assert reply.get("t") == "ok", reply
        assert reply["ttl_ms"] == 45_000, reply
    finally:
        admin.json("config", "set", "default-ttl", "0")


def test_the_cli_leaves_the_ttl_to_the_cluster_when_given_none(
    shared: Cluster, tmp_path: Path
) -> None:
    """`dlm acquire`/`dlm exec` without --ttl get the cluster's default-ttl; --ttl wins."""
    admin = Dlm(shared.members_env, tmp_path)
    admin.json("config", "set", "default-ttl", "45s")
    try:
        got = admin.json("acquire", "settings/default-ttl")
        assert got["ttl_ms"] == 45_000, got
        leases = admin.json("lease", "list")
        listed = [each for each in _leases_of(leases) if each.get("id") == got["lease"]]
        assert listed and listed[0]["ttl_ms"] == 45_000, leases

        explicit = admin.json("acquire", "settings/explicit-ttl", "--ttl", "10s")
        assert explicit["ttl_ms"] == 10_000, explicit

        ran = admin.json("exec", "--lock", "settings/exec-default", "--", "true")
        assert ran["exit_code"] == 0 and ran["ttl_ms"] == 45_000, ran
    finally:
        admin.json("config", "set", "default-ttl", "0")


def _leases_of(listing: object) -> list[dict[str, object]]:
    if isinstance(listing, dict):
        listing = listing.get("leases", [])
    assert isinstance(listing, list), listing
    return [each for each in listing if isinstance(each, dict)]


def test_a_partitioned_cluster_takes_the_setting_in_every_partition(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, size=1, partitions=2)
    try:
        cluster.start_all()
        cluster.wait_for_leaders(timeout=20.0)
        admin = Dlm(cluster.members_env, tmp_path)
        assert admin.json("config", "set", "max-ttl", "10s") == {
            "set": {"setting": "max-ttl", "value_ms": 10_000},
            "partitions": 2,
        }
        from dlm.partitioning import partition_of

        keys: dict[int, str] = {}
        for n in range(64):  # bounded: two partitions are found within a few keys
            keys.setdefault(partition_of(f"p/{n}", 2), f"p/{n}")
            if len(keys) == 2:
                break
        for key in keys.values():
            ran = admin.run("acquire", key, "--ttl", "60s")
            assert ran.returncode == 2 and "max-ttl" in ran.stderr, (key, ran.stderr)
            admin.json("acquire", key, "--ttl", "5s")
    finally:
        cluster.stop_all()
