"""A member reachable from other machines must authenticate its peers, or be told not to.

`dlm node start --listen` beyond the loopback range without a peer secret or TLS
exits 78 with one line saying what to add, before it opens anything. With
``--insecure`` (or authentication) it starts; that half runs in a private network
namespace (``unshare``), where 0.0.0.0 reaches nothing outside the test, and is
skipped where namespaces are not available.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dlm import auth
from tests.cluster.harness import REPO, free_ports, wait_for

pytestmark = pytest.mark.cluster

UNSHARE = shutil.which("unshare")


def node_start(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "dlm", "node", "start", "--data", str(tmp_path / "d"), *args]


def environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLM_NODE_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


@pytest.mark.parametrize(
    ("args", "variables"),
    [
        (["--listen", "0.0.0.0:{port}"], {}),
        (["--listen", "10.11.12.13:{port}"], {}),
        (["--listen", "[::]:{port}"], {}),
        ([], {"DLM_NODE_LISTEN": "0.0.0.0:{port}"}),
        (["--listen", "0.0.0.0:{port}", "--tls-cert", "c.pem"], {}),
    ],
)
def test_a_reachable_listen_address_without_peer_authentication_exits_78(
    tmp_path: Path, args: list[str], variables: dict[str, str]
) -> None:
    (port,) = free_ports(1)
    argv = node_start(tmp_path, *(a.format(port=port) for a in args))
    env = environ({k: v.format(port=port) for k, v in variables.items()})
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 78, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlm node: error: "), proc.stderr
    if "--tls-cert" in args:
        assert "--tls-key and --tls-ca" in lines[0]
    else:
        assert "--peer-secret-file" in lines[0] and "--tls-cert" in lines[0]
        assert "--insecure" in lines[0]
    if variables:
        assert "DLM_NODE_LISTEN" in lines[0]
    assert not (tmp_path / "d").exists()  # refused before touching anything


@pytest.mark.skipif(UNSHARE is None, reason="unshare is not installed")
@pytest.mark.parametrize("how", ["--insecure", "DLM_NODE_INSECURE", "--peer-secret-file"])
def test_it_starts_with_insecure_or_peer_authentication(tmp_path: Path, how: str) -> None:
    assert UNSHARE is not None
    probe = subprocess.run([UNSHARE, "-rn", "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip("network namespaces are not available here")
    (port,) = free_ports(1)
    args = ["--listen", f"0.0.0.0:{port}"]
    extra = {}
    if how == "--insecure":
        args.append("--insecure")
    elif how == "DLM_NODE_INSECURE":
        extra["DLM_NODE_INSECURE"] = "true"
    else:
        auth.write_secret_file(str(tmp_path / "peer.secret"))
        args += ["--peer-secret-file", str(tmp_path / "peer.secret")]
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        # A network namespace of its own: 0.0.0.0 there is reachable from nowhere.
        proc = subprocess.Popen(
            [UNSHARE, "-rn", *node_start(tmp_path, *args)],
            env=environ(extra),
            stdout=out,
            stderr=out,
        )
    try:
        wait_for(lambda: '"role":"leader"' in log.read_text(), 20.0, "the member leading")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_a_peer_secret_equal_to_the_client_secret_exits_78(tmp_path: Path) -> None:
    """Every client host holds the client secret: with the peers' it could act as a member."""
    (port,) = free_ports(1)
    peer, client = tmp_path / "peer.secret", tmp_path / "client.secret"
    auth.write_secret_file(str(peer))
    client.write_bytes(peer.read_bytes())  # another file, the same secret
    client.chmod(0o600)
    argv = node_start(
        tmp_path,
        "--listen",
        f"127.0.0.1:{port}",
        "--peer-secret-file",
        str(peer),
        "--client-secret-file",
        str(client),
    )
    proc = subprocess.run(
        argv, env=environ(), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 78, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlm node: error: "), proc.stderr
    assert "same secret" in lines[0] and "dlm secret new" in lines[0]
    assert not (tmp_path / "d").exists()  # refused before touching anything
