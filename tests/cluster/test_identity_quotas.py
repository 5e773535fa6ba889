"""Quotas per identity against real members: issue 23's "one identity flooding leases
leaves another's `dlm exec` working", by the command line.

One 3-member cluster whose members allow each identity 5 leases
(``--identity-max-leases 5``). The identity ``runaway`` takes locks in a loop, each
`dlm acquire` opening a lease, until the cluster refuses it with QUOTA_EXCEEDED naming
its own limit; meanwhile and afterwards ``deploy``'s `dlm exec` runs its command, and
the built-in admin keeps the cluster's caps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster

pytestmark = pytest.mark.cluster

PER_IDENTITY_LEASES = 5


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("identity-quotas"),
        size=3,
        node_args=lambda _: ["--identity-max-leases", str(PER_IDENTITY_LEASES)],
    )
    try:
        c.start_all()
        c.wait_for_leader(timeout=15.0)
        yield c
    finally:
        c.stop_all()


def _identity(admin: Dlm, name: str, prefix: str, tmp_path: Path) -> Dlm:
    credential = tmp_path / f"{name}.cred"
    admin.json(
        "auth", "add", name, "--role", "client", "--prefix", prefix, "--out", str(credential)
    )
    dlm = Dlm(admin.env["DLM_CLUSTER"], admin.cwd)
    dlm.env["DLM_SECRET_FILE"] = str(credential)
    return dlm


def test_one_identity_flooding_leases_leaves_another_identitys_exec_working(
    dev: Cluster, tmp_path: Path
) -> None:
    admin = Dlm(dev.members_env, tmp_path)
    runaway = _identity(admin, "runaway", "flood/", tmp_path)
    deploy = _identity(admin, "deploy", "deploy/", tmp_path)

    refusal: dict[str, object] | None = None
    for n in range(PER_IDENTITY_LEASES + 3):  # bounded: the limit is 5
        ran = runaway.run("acquire", f"flood/{n}", "--json")
        if ran.returncode != 0:
            assert ran.returncode == 77, (ran.returncode, ran.stderr)  # not permitted
            refusal = json.loads(ran.stdout)["error"]
            assert n == PER_IDENTITY_LEASES, (n, ran.stderr)
            break
    assert isinstance(refusal, dict), "the runaway identity was never refused"
    assert refusal["code"] == "QUOTA_EXCEEDED", refusal
    message = str(refusal["message"])
    assert "identity 'runaway'" in message and "its own limit" in message, message

    ran = deploy.run("exec", "--lock", "deploy/release", "--", "true")
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    # The built-in admin is held to the cluster's caps, not the per-identity ones.
    for n in range(PER_IDENTITY_LEASES + 1):
        admin.json("acquire", f"ops/{n}")


def test_an_admins_setting_binds_one_identity_and_the_others_keep_theirs(
    dev: Cluster, tmp_path: Path
) -> None:
    admin = Dlm(dev.members_env, tmp_path)
    ci = _identity(admin, "ci", "ci/", tmp_path)
    other = _identity(admin, "other", "other/", tmp_path)
    # `dlm auth set` waits (retrying) until the cluster runs version 4, as members start.
    assert admin.json("auth", "set", "ci", "--max-leases", "2") == {
        "set": {"name": "ci", "max_leases": 2}
    }
    listed = {row["name"]: row for row in admin.json("auth", "list")["identities"]}
    assert listed["ci"]["max_leases"] == 2 and listed["other"]["max_leases"] is None

    for n in range(2):
        ci.json("acquire", f"ci/{n}")
    ran = ci.run("acquire", "ci/2", "--json")
    assert ran.returncode == 77, (ran.returncode, ran.stderr)
    refusal = json.loads(ran.stdout)["error"]
    assert refusal["code"] == "QUOTA_EXCEEDED", refusal
    assert "identity 'ci' has 2 leases" in str(refusal["message"]), refusal

    # Raised: the next one goes through.
    admin.json("auth", "set", "ci", "--max-leases", "3")
    ci.json("acquire", "ci/2")

    # Another identity keeps the members' default (--identity-max-leases 5).
    for n in range(PER_IDENTITY_LEASES):
        other.json("acquire", f"other/{n}")
    ran = other.run("acquire", f"other/{PER_IDENTITY_LEASES}", "--json")
    assert ran.returncode == 77, (ran.returncode, ran.stderr)
    assert "identity 'other' has 5 leases" in json.loads(ran.stdout)["error"]["message"]


def test_a_removal_of_a_removed_identity_is_refused_in_one_line(
    dev: Cluster, tmp_path: Path
) -> None:
    admin = Dlm(dev.members_env, tmp_path)
    _identity(admin, "gone", "gone/", tmp_path)
    assert admin.json("auth", "remove", "gone") == {"removed": {"name": "gone"}}
    # A new `dlm auth remove` is another request (another request id): not taken for done.
    ran = admin.run("auth", "remove", "gone")
    assert ran.returncode == 2, (ran.returncode, ran.stderr)
    assert ran.stderr.count("\n") == 1 and "no identity 'gone'" in ran.stderr, ran.stderr
