"""Client identities against real members: issue 23's "done when", by the command line.

One 3-member cluster without a client secret, as `make run`'s dev cluster runs: every
client without a credential is the built-in admin, and a credential made by
`dlm auth add` authenticates as its identity. A `client` identity limited to ``ci/``
locks ``ci/build``, and gets exit 77 (PERMISSION_DENIED) for ``prod/deploy``, for
`dlm members remove`, and for revoking or releasing the admin's lease; the admin
does all of it. Removing the identity closes its way in; a credential whose key was
rotated keeps working until `--finish`.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("identities"), size=3)
    try:
        c.start_all()
        c.wait_for_leader(timeout=15.0)
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def admin(dev: Cluster, tmp_path: Path) -> Dlm:
    return Dlm(dev.members_env, tmp_path)


def as_identity(admin: Dlm, credential: Path) -> Dlm:
    dlm = Dlm(admin.env["DLM_CLUSTER"], admin.cwd)
    dlm.env["DLM_SECRET_FILE"] = str(credential)
    return dlm


def refused(dlm: Dlm, *args: str) -> dict[str, object]:
    """Runs ``args`` expecting exit 77 and a PERMISSION_DENIED error naming the identity."""
    error = dlm.json(*args, code=77)["error"]
    assert isinstance(error, dict)
    assert error["code"] == "PERMISSION_DENIED", error
    message = str(error["message"])
    assert "\n" not in message
    return error


def test_a_client_limited_to_a_prefix_may_lock_only_there_and_an_admin_does_it_all(
    admin: Dlm, dev: Cluster, tmp_path: Path
) -> None:
    credential = tmp_path / "ci.cred"
    added = admin.json(
        "auth", "add", "ci", "--role", "client", "--prefix", "ci/", "--out", str(credential)
    )
    assert added["added"] == {
        "name": "ci",
        "role": "client",
        "prefixes": ["ci/"],
        "key_id": added["added"]["key_id"],
    }
    assert stat.S_IMODE(os.stat(credential).st_mode) == 0o600
    secret = credential.read_text().split()[2]

    # The cluster keeps a verifier, never the secret: not in `dlm auth list`, nor on disk.
    listed = admin.json("auth", "list")["identities"]
    assert [(i["name"], i["role"], i["prefixes"]) for i in listed] == [("ci", "client", ["ci/"])]
    assert secret not in json.dumps(listed)
    for member_dir in dev.base.rglob("*"):
        if member_dir.is_file():
            assert secret.encode() not in member_dir.read_bytes(), member_dir

    ci = as_identity(admin, credential)
    # dlm exec as the identity: open, acquire, keep-alives, a minimum hold, release.
    ran = ci.run("exec", "--lock", "ci/job", "--min-hold", "1s", "--", "true")
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    ran = ci.run("exec", "--lock", "prod/job", "--", "true")
    assert ran.returncode == 77 and "PERMISSION_DENIED" not in ran.stdout, ran.stderr
    assert "identity 'ci' may not acquire 'prod/job'" in ran.stderr
    grant = ci.json("acquire", "ci/build")
    assert grant["key"] == "ci/build"

    error = refused(ci, "acquire", "prod/deploy")
    assert "'ci'" in str(error["message"]) and "prod/deploy" in str(error["message"])
    refused(ci, "members", "remove", "n3")
    refused(ci, "auth", "list")

    mine = admin.json("acquire", "prod/deploy")
    lease = str(mine["lease"])
    error = refused(ci, "release", "prod/deploy", "--lease", lease)
    assert "admin" in str(error["message"])
    refused(ci, "lease", "revoke", lease)

    # What the limited client sees: its own keys and leases only. (`ci/job` may still be held
    # here: `--min-hold 1s` leaves the lock to expire a second after its grant.)
    seen = {lock["key"] for lock in ci.json("locks")["locks"]}
    assert "ci/build" in seen and seen <= {"ci/build", "ci/job"}, seen
    own = {item["id"] for item in ci.json("lease", "list")["leases"]}
    assert grant["lease"] in own and lease not in own, own
    assert len(own) <= 2, own
    refused(ci, "status", "prod/deploy")

    # The admin does all of it: the client's release of its own lock works too.
    ci.json("release", "ci/build", "--lease", str(grant["lease"]))
    admin.json("release", "prod/deploy", "--lease", lease)
    other = ci.json("acquire", "ci/other")
    admin.json("lease", "revoke", str(other["lease"]))


def test_a_removed_identity_cannot_connect_and_a_rotated_one_keeps_working_until_finish(
    admin: Dlm, tmp_path: Path
) -> None:
    old, new = tmp_path / "deploy.cred", tmp_path / "deploy2.cred"
    admin.json("auth", "add", "deploy", "--prefix", "deploy/", "--out", str(old))
    admin.json("auth", "rotate", "deploy", "--out", str(new))
    for credential in (old, new):
        got = as_identity(admin, credential).json("acquire", "deploy/x")
        as_identity(admin, credential).json("release", "deploy/x", "--lease", str(got["lease"]))
    (row,) = [i for i in admin.json("auth", "list")["identities"] if i["name"] == "deploy"]
    assert row["rotating"] is True
    admin.json("auth", "rotate", "deploy", "--finish")
    proc = as_identity(admin, old).run("acquire", "deploy/x", "--json")
    assert proc.returncode == 78, (proc.stdout, proc.stderr)
    as_identity(admin, new).json("status", "deploy/x")

    admin.json("auth", "remove", "deploy")
    proc = as_identity(admin, new).run("acquire", "deploy/x", "--json")
    assert proc.returncode == 78, (proc.stdout, proc.stderr)
    assert "deploy" in proc.stdout


def test_with_a_client_secret_its_holder_is_the_admin_and_a_credential_still_works(
    tmp_path: Path,
) -> None:
    from dlm import auth

    auth.write_secret_file(str(tmp_path / "peer.secret"))
    auth.write_secret_file(str(tmp_path / "client.secret"))

    def flags(_: object) -> list[str]:
        return [
            "--peer-secret-file",
            str(tmp_path / "peer.secret"),
            "--client-secret-file",
            str(tmp_path / "client.secret"),
        ]

    (tmp_path / "cluster").mkdir()
    cluster = Cluster(
        tmp_path / "cluster",
        size=3,
        node_args=flags,
        client_secret=auth.load_secret(str(tmp_path / "client.secret")),
    )
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        admin = Dlm(cluster.members_env, tmp_path)
        admin.env["DLM_SECRET_FILE"] = str(tmp_path / "client.secret")
        credential = tmp_path / "ci.cred"
        admin.json("auth", "add", "ci", "--prefix", "ci/", "--out", str(credential))
        ci = as_identity(admin, credential)
        ci.json("acquire", "ci/x")
        refused(ci, "acquire", "prod/x")
        anonymous = Dlm(cluster.members_env, tmp_path)
        proc = anonymous.run("acquire", "ci/y", "--json")
        assert proc.returncode == 78, (proc.stdout, proc.stderr)
    finally:
        cluster.stop_all()
