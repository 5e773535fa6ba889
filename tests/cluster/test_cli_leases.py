"""Leases from the command line against real members: a release acts on one grant, a lease
opened by `dlm acquire` ends with its release, and operators list and revoke leases.

The module has a cluster of its own, and every test gives back whatever it took, so
that `dlm lease list` can be checked for being empty after the first.
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import wait_for

pytestmark = pytest.mark.cluster


def leases(dlm: Dlm) -> list[dict[str, object]]:
    listed = dlm.json("lease", "list")
    assert set(listed) == {"leases"}
    return list(listed["leases"])


def lease_ids(dlm: Dlm) -> list[object]:
    return [item["id"] for item in leases(dlm)]


def test_acquire_then_release_leaves_no_lease(dlm: Dlm) -> None:
    grant = dlm.json("acquire", "el-key", "--meta", "job=ci-42")
    lease = str(grant["lease"])
    (listed,) = leases(dlm)
    assert set(listed) == {"id", "ttl_ms", "left_ms", "holding", "waiting", "meta", "owner"}
    assert listed["owner"] == ""  # no identity proved: the anonymous one
    assert (listed["id"], listed["ttl_ms"], listed["holding"], listed["waiting"]) == (
        lease, 30000, ["el-key"], []
    )  # fmt: skip
    assert isinstance(listed["left_ms"], int) and 0 < listed["left_ms"] <= 30000
    meta = listed["meta"]
    assert isinstance(meta, dict) and meta["job"] == "ci-42" and {"host", "user"} <= set(meta)

    released = dlm.json("release", "el-key", "--lease", lease)
    assert released == {
        "key": "el-key",
        "lease": lease,
        "released": True,
        "token": grant["token"],
        "lease_ended": True,
    }
    assert leases(dlm) == []
    # Nothing is left for a stray keep-alive to hold on to.
    assert dlm.run("renew", lease).returncode == 77
    table = dlm.run("lease", "list", "--format", "table")
    assert (table.returncode, table.stdout) == (0, "no leases\n")


def test_keep_lease_keeps_it_and_revoke_ends_it(dlm: Dlm) -> None:
    grant = dlm.json("acquire", "kl-key")
    lease = str(grant["lease"])
    kept = dlm.json("release", "kl-key", "--lease", lease, "--keep-lease")
    assert kept["lease_ended"] is False
    assert [item["holding"] for item in leases(dlm) if item["id"] == lease] == [[]]
    assert dlm.json("renew", lease)["lease"] == lease
    assert dlm.json("lease", "revoke", lease) == {"lease": lease, "revoked": True, "released": []}
    assert lease not in lease_ids(dlm)


def test_a_stale_release_after_a_new_grant_under_the_same_lease_is_refused(dlm: Dlm) -> None:
    first = dlm.json("acquire", "sr-key")
    lease = str(first["lease"])
    dlm.json("release", "sr-key", "--lease", lease, "--keep-lease")
    second = dlm.json("acquire", "sr-key", "--lease", lease)
    assert second["token"] > first["token"]

    stale = dlm.run("release", "sr-key", "--lease", lease, "--token", str(first["token"]))
    assert stale.returncode == 77, stale.stderr
    assert stale.stdout == ""
    assert stale.stderr == (
        f"dlm: lease {lease} now holds 'sr-key' under another grant (token {second['token']}), "
        f"not token {first['token']}: nothing was released\n"
    )
    error = dlm.json("release", "sr-key", "--lease", lease, "--token", str(first["token"]), code=77)
    assert error["error"]["code"] == "NOT_HOLDER"
    assert [(h["lease"], h["token"]) for h in error["error"]["holders"]] == [
        (lease, second["token"])
    ]
    (holder,) = dlm.json("status", "sr-key")["holders"]
    assert (holder["lease"], holder["token"]) == (lease, second["token"])  # still held

    done = dlm.json("release", "sr-key", "--lease", lease, "--token", str(second["token"]))
    assert (done["token"], done["lease_ended"]) == (second["token"], True)
    assert lease not in lease_ids(dlm)


def test_revoke_frees_the_lock_and_wakes_the_next_waiter(dlm: Dlm) -> None:
    holder = dlm.json("acquire", "rv-key")
    waiter = dlm.start("acquire", "rv-key", "--wait", "60s", "--json")
    try:
        wait_for(lambda: dlm.json("status", "rv-key")["waiters"], 30.0, "the waiter in the queue")
        revoked = dlm.json("lease", "revoke", str(holder["lease"]))
        assert revoked == {"lease": holder["lease"], "revoked": True, "released": ["rv-key"]}
        code, out, err = finish(waiter)
    finally:
        stop(waiter)
    assert code == 0, err
    woken = json.loads(out)
    assert woken["token"] > holder["token"]
    (now,) = dlm.json("status", "rv-key")["holders"]
    assert now["lease"] == woken["lease"]
    assert dlm.json("release", "rv-key", "--lease", woken["lease"])["lease_ended"] is True
    assert not {holder["lease"], woken["lease"]} & set(lease_ids(dlm))


def test_revoking_an_unknown_or_ended_lease_exits_77(dlm: Dlm) -> None:
    unknown = dlm.run("lease", "revoke", "nosuchlease0000")
    assert unknown.returncode == 77
    assert unknown.stderr.startswith("dlm: there is no lease nosuchlease0000 (no such lease")
    assert "expired" not in unknown.stderr
    assert len(unknown.stderr.splitlines()) == 1
    grant = dlm.json("acquire", "gone-key")
    assert dlm.json("lease", "revoke", str(grant["lease"]))["released"] == ["gone-key"]
    error = dlm.json("lease", "revoke", str(grant["lease"]), code=77)["error"]
    assert (error["code"], error["lease"]) == ("SESSION_EXPIRED", grant["lease"])
    assert "it was closed already" in error["message"]
