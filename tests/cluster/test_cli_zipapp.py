"""dist/dlm.pyz: one file that runs with a bare `python3 -I`, from an empty directory.

The archive is built here (tools/build_zipapp.py, the same as `make zipapp`)
into a temp dir, then every subcommand runs through it, including a
`node start` whose member serves the others. No compiled extension is in the
archive, so cbor2 runs its pure-Python codec on both sides.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cli_harness import Dlm, finish, stop
from tests.cluster.harness import REPO, free_ports, wait_for

pytestmark = pytest.mark.cluster


def real_python3() -> str:
    """python3 as a shell finds it, resolved past version-manager shims."""
    proc = subprocess.run(
        ["python3", "-I", "-c", "import sys; print(sys.executable)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("zipapp")
    out = base / "dlm.pyz"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "build_zipapp.py"), "--output", str(out),
         "--work", str(base / "work")],
        check=True,
        timeout=600,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def node(pyz: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One member started from the zipapp; yields its address and data dir."""
    base = tmp_path_factory.mktemp("zipapp-node")
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    data = base / "data"
    log = open(base / "node.log", "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [real_python3(), "-I", str(pyz), "node", "start", "--id", "z1", "--listen", address,
         "--data", str(data)],
        cwd=base,
        stdout=log,
        stderr=log,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )  # fmt: skip
    try:
        probe = Dlm(address, base, [real_python3(), "-I", str(pyz)])
        wait_for(
            lambda: probe.run("status", "--timeout", "300ms").returncode == 0,
            30.0,
            "the zipapp node to lead",
        )
        yield address, data
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def zdlm(pyz: Path, node: tuple[str, Path], tmp_path: Path) -> Dlm:
    empty = tmp_path / "empty"
    empty.mkdir()
    runner = Dlm(node[0], empty, [real_python3(), "-I", str(pyz)])
    runner.env = {k: v for k, v in runner.env.items() if not k.startswith("PYTHON")}
    return runner


def test_the_archive_has_no_compiled_code_and_a_main(pyz: Path) -> None:
    with zipfile.ZipFile(pyz) as z:
        names = z.namelist()
    assert "__main__.py" in names
    assert "dlm/cli/main.py" in names and "dlm/cli/main.pyc" in names
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert any(n.startswith("typer/") for n in names)
    assert any(n.startswith("cbor2/") for n in names)
    assert not any(n.startswith("pydantic") for n in names)


def test_help_without_any_site_packages(zdlm: Dlm) -> None:
    for flags in (["-I"], ["-I", "-S"]):
        command = [zdlm.command[0], *flags, zdlm.command[-1], "--help"]
        proc = subprocess.run(
            command,
            cwd=zdlm.cwd,
            env=zdlm.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Exit codes" in proc.stdout and "75" in proc.stdout


def test_every_subcommand_through_the_zipapp(zdlm: Dlm, node: tuple[str, Path]) -> None:
    grant = zdlm.json("acquire", "zk", "--ttl", "10s")
    lease = str(grant["lease"])
    assert zdlm.json("renew", lease)["ttl_ms"] == 10000
    assert zdlm.json("status", "zk")["holders"][0]["token"] == grant["token"]
    assert [lock["key"] for lock in zdlm.json("locks")["locks"]] == ["zk"]
    assert zdlm.json("status")["leader"] == "z1"
    assert zdlm.json("acquire", "zk", code=75)["error"]["code"] == "LOCKED"
    assert zdlm.json("release", "zk", "--lease", lease)["lease_ended"] is True
    # The lease ended with its one lock: a second release finds it gone.
    gone = zdlm.json("release", "zk", "--lease", lease, code=77)
    assert gone["error"]["code"] == "SESSION_EXPIRED"
    assert zdlm.json("store", "inspect", str(node[1]))
    assert zdlm.run("acquire", "zk", "--ttl", "bad").returncode == 2


def test_exec_through_the_zipapp(zdlm: Dlm) -> None:
    proc = zdlm.run("exec", "--lock", "zx", "--", "sh", "-c", 'echo "$DLM_FENCING_TOKEN"; exit 7')
    assert proc.returncode == 7, proc.stderr
    assert int(proc.stdout) > 0
    keeper = zdlm.start("exec", "--lock", "zx", "--ttl", "1s", "--", "sleep", "60")
    try:
        wait_for(lambda: zdlm.json("status", "zx")["holders"], 30.0, "exec to hold zx")
        keeper.send_signal(signal.SIGTERM)
        code, _, err = finish(keeper)
    finally:
        stop(keeper)
    assert code == 128 + signal.SIGTERM, err


def test_a_member_of_two_partitions_runs_from_the_zipapp(pyz: Path, tmp_path: Path) -> None:
    """Its supervisor starts each partition's process from the same archive."""
    from dlm.testing.probe import partition_status

    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    empty = tmp_path / "empty"
    empty.mkdir()
    with open(tmp_path / "node.log", "wb") as log:
        proc = subprocess.Popen(
            [real_python3(), "-I", str(pyz), "node", "start", "--id", "z1", "--listen", address,
             "--data", str(tmp_path / "data"), "--partitions", "2"],
            cwd=empty,
            stdout=log,
            stderr=log,
            env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        )  # fmt: skip
    try:

        def leads(partition: int) -> bool:
            view = partition_status(address, partition, secret=None)
            return view is not None and view.get("role") == "leader"

        wait_for(lambda: leads(0) and leads(1), 60.0, "both partitions to lead")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
