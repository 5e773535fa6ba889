"""A TLS client certificate's name as the client's identity (issue 23 item 1), with real
members and the command line.

One member with ``--tls-cert``/``--tls-key``/``--tls-ca`` and no secret (a throwaway CA
from the ``openssl`` command, tests/pki.py; skipped where it is missing). The operator,
connecting with the CA only, is the built-in admin and adds the identity ``ci``; a
certificate the CA signed whose CN is ``ci`` then makes its client ``ci`` without any
secret, held to ``ci``'s prefixes; one whose name no identity has is refused in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlm import tls
from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, NodeProc
from tests.pki import OPENSSL, make_leaf, make_pki

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(OPENSSL is None, reason="the openssl command is not installed"),
]


@pytest.fixture(scope="module")
def pki_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    base = tmp_path_factory.mktemp("tls-identities")
    pki = make_pki(base / "pki", ["n1"])
    make_leaf(pki, "ci", "ca", None)  # CN=ci, no subjectAltName
    make_leaf(pki, "runner", "ca", "DNS:runner.example.net,DNS:ci")  # ci in its SANs
    make_leaf(pki, "mallory", "ca", None)

    def flags(node: NodeProc) -> list[str]:
        name = node.node_id
        return [
            "--tls-cert", str(pki / f"{name}.crt"),
            "--tls-key", str(pki / f"{name}.key"),
            "--tls-ca", str(pki / "ca.crt"),
        ]  # fmt: skip

    (base / "cluster").mkdir()
    cluster = Cluster(
        base / "cluster",
        size=1,
        node_args=flags,
        client_tls=tls.client_context(str(pki / "ca.crt")),
    )
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        yield cluster, pki
    finally:
        cluster.stop_all()


def with_cert(cluster: Cluster, pki: Path, tmp_path: Path, cert: str | None) -> Dlm:
    dlm = Dlm(cluster.members_env, tmp_path)
    dlm.env.pop("DLM_SECRET_FILE", None)
    dlm.env["DLM_TLS_CA"] = str(pki / "ca.crt")
    if cert is not None:
        dlm.env["DLM_TLS_CERT"] = str(pki / f"{cert}.crt")
        dlm.env["DLM_TLS_KEY"] = str(pki / f"{cert}.key")
    else:
        dlm.env.pop("DLM_TLS_CERT", None)
        dlm.env.pop("DLM_TLS_KEY", None)
    return dlm


def test_a_certificate_named_after_an_identity_is_that_identity_without_a_secret(
    pki_cluster: tuple[Cluster, Path], tmp_path: Path
) -> None:
    cluster, pki = pki_cluster
    admin = with_cert(cluster, pki, tmp_path, None)
    # Before any identity exists, a client certificate is the admin, as before.
    admin.json("acquire", "before/identities")
    ran = with_cert(cluster, pki, tmp_path, "mallory").run("acquire", "x/1", "--json")
    assert ran.returncode == 0, ran.stderr

    admin.json("auth", "add", "ci", "--prefix", "ci/", "--out", str(tmp_path / "ci.cred"))
    for cert in ("ci", "runner"):  # by its CN, or by a subjectAltName DNS name
        ci = with_cert(cluster, pki, tmp_path, cert)
        grant = ci.json("acquire", f"ci/{cert}")
        assert grant["key"] == f"ci/{cert}"
        leases = ci.json("lease", "list")["leases"]
        assert {lease["owner"] for lease in leases} == {"ci"}, leases
        ran = ci.run("acquire", "prod/deploy", "--json")
        assert ran.returncode == 77, (ran.returncode, ran.stderr)
        error = json.loads(ran.stdout)["error"]
        assert error["code"] == "PERMISSION_DENIED" and "identity 'ci'" in error["message"]

    # A certificate the CA signed but whose names no identity has: refused in one line.
    ran = with_cert(cluster, pki, tmp_path, "mallory").run("acquire", "ci/x")
    assert ran.returncode == 78, (ran.returncode, ran.stderr)
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr
    assert "the TLS client certificate names 'mallory'" in lines[0], lines
    assert "Traceback" not in ran.stderr
    # The operator without a certificate is still the admin.
    admin.json("acquire", "prod/deploy")
