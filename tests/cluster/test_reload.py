"""SIGHUP against real members: settings re-read from --config and taken on live, or
refused as a whole with one line (dlm/node/runtime/reload.py).

Each test starts its own one-member cluster whose settings come from a TOML file it
rewrites, sends SIGHUP to the member's PID, and waits for the member's log to say
``config_reloaded`` or ``reload_refused``.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cli_harness import Dlm
from tests.cluster.harness import Cluster, NodeProc, free_ports, wait_for
from tests.pki import OPENSSL, make_ca, make_leaf, make_pki

pytestmark = pytest.mark.cluster


BASE: dict[Path, dict[str, str]] = {}
"""What each test's file always says (where the member listens, its peers)."""


def _write(path: Path, settings: dict[str, str]) -> None:
    every = {**BASE.get(path, {}), **settings}
    path.write_text("".join(f'{key} = "{value}"\n' for key, value in every.items()))


def _events(node: NodeProc, event: str) -> list[dict[str, Any]]:
    found = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"event":"{event}"' in line.replace(" ", ""):
            found.append(json.loads(line))
    return found


def _hup(node: NodeProc, event: str, before: int) -> dict[str, Any]:
    """SIGHUP to the member; the first ``event`` line after the ``before`` ones."""
    os.kill(node.pid, signal.SIGHUP)

    def after() -> dict[str, Any] | None:
        found = _events(node, event)[before:]
        return found[0] if found else None

    return wait_for(
        after,
        20.0,
        f"{event} in {node.node_id}'s log",
    )


@pytest.fixture
def single(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    config = tmp_path / "member.toml"
    c = Cluster(
        tmp_path,
        size=1,
        node_args=lambda _: ["--config", str(config), "--log-format", "json"],
    )
    # Where it listens comes from the file, so that the file can try to change it.
    node = c.nodes["n1"]
    node.by_hand = True
    BASE[config] = {"listen": node.address, "peers": c.peers_flag}
    _write(config, {"log-level": "warning"})
    try:
        c.start_all()
        c.wait_for_leader(timeout=15.0)
        yield c, config
    finally:
        c.stop_all()


def test_sighup_changes_the_log_level_and_a_quota_live(
    single: tuple[Cluster, Path], tmp_path: Path
) -> None:
    cluster, config = single
    node = cluster.nodes["n1"]
    dlm = Dlm(cluster.members_env, tmp_path)
    dlm.json("acquire", "a/1")
    # At warning, not one info line (the start itself is at info).
    assert not [line for line in node.log_tail(200).splitlines() if '"level":"info"' in line]

    _write(config, {"log-level": "info", "max-leases": "2"})
    reloaded = _hup(node, "config_reloaded", 0)
    assert reloaded["changed"] == ["--log-level", "--max-leases"]
    assert reloaded["level"] == "info"

    dlm.json("acquire", "a/2")  # two leases now: the cap
    ran = dlm.run("acquire", "a/3", "--json")
    assert ran.returncode != 0, ran.stdout
    refusal = json.loads(ran.stdout)["error"]
    assert refusal["code"] == "QUOTA_EXCEEDED", refusal
    # Info lines again, after the reload's own.
    wait_for(
        lambda: [
            line
            for line in node.log_tail(400).splitlines()
            if '"level":"info"' in line and "config_reloaded" not in line
        ],
        10.0,
        "an info line after the reload",
    )

    # Raised again: the third lease goes through.
    _write(config, {"log-level": "info", "max-leases": "10"})
    assert _hup(node, "config_reloaded", 1)["changed"] == ["--max-leases"]
    dlm.json("acquire", "a/3")


def test_a_change_of_listen_is_refused_and_nothing_else_is_applied(
    single: tuple[Cluster, Path], tmp_path: Path
) -> None:
    cluster, config = single
    node = cluster.nodes["n1"]
    [other] = free_ports(1)
    _write(config, {"log-level": "info", "listen": f"127.0.0.1:{other}", "max-leases": "1"})
    refused = _hup(node, "reload_refused", 0)
    assert "--listen" in refused["reason"] and "restart" in refused["reason"]
    assert "--max-leases" not in refused["reason"] and "\n" not in refused["reason"]
    assert not _events(node, "config_reloaded")
    # Still serving where it was, with its old quota (the default) and level.
    dlm = Dlm(cluster.members_env, tmp_path)
    for n in range(3):
        dlm.json("acquire", f"b/{n}")
    assert node.alive

    # A file that does not parse: refused the same way, the member untouched.
    config.write_text("log-level = \n")
    bad = _hup(node, "reload_refused", 1)
    assert "not valid TOML" in bad["reason"]
    assert node.alive


def test_sighup_starts_moves_and_stops_the_metrics_listener(
    single: tuple[Cluster, Path],
) -> None:
    _cluster, config = single
    node = _cluster.nodes["n1"]
    first, second = free_ports(2)

    def scrape(port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    _write(config, {"log-level": "warning", "metrics-listen": f"127.0.0.1:{first}"})
    assert _hup(node, "config_reloaded", 0)["changed"] == ["--metrics-listen"]
    assert "dlm_" in scrape(first)

    _write(config, {"log-level": "warning", "metrics-listen": f"127.0.0.1:{second}"})
    _hup(node, "config_reloaded", 1)
    assert "dlm_" in scrape(second)
    with pytest.raises(OSError):
        scrape(first)

    _write(config, {"log-level": "warning"})
    _hup(node, "config_reloaded", 2)
    with pytest.raises(OSError):
        scrape(second)


def test_a_partitioned_member_reloads_every_partition_and_refuses_once(tmp_path: Path) -> None:
    config = tmp_path / "member.toml"
    _write(config, {"log-level": "info"})
    cluster = Cluster(
        tmp_path,
        size=1,
        partitions=2,
        node_args=lambda _: ["--config", str(config), "--log-format", "json"],
    )
    try:
        cluster.start_all()
        cluster.wait_for_leaders(timeout=20.0)
        node = cluster.nodes["n1"]
        dlm = Dlm(cluster.members_env, tmp_path)

        _write(config, {"log-level": "info", "max-leases": "1"})
        os.kill(node.pid, signal.SIGHUP)

        def reloaded() -> set[int | None]:
            return {event.get("partition") for event in _events(node, "config_reloaded")}

        wait_for(lambda: reloaded() == {None, 0, 1}, 20.0, "every partition reloaded")
        # Each partition holds its own leases against its own cap of one.
        keys = [f"k{n}" for n in range(40)]
        refused = 0
        for key in keys[:6]:
            ran = dlm.run("acquire", key, "--json")
            refused += ran.returncode != 0
        assert refused >= 4, refused

        # The metrics listener, started by a reload: the supervisor serves every
        # partition's samples, which each partition process now serves it on loopback.
        [port] = free_ports(1)
        _write(
            config, {"log-level": "info", "max-leases": "1", "metrics-listen": f"127.0.0.1:{port}"}
        )
        os.kill(node.pid, signal.SIGHUP)

        def scraped() -> str | None:
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as reply:
                    text = str(reply.read().decode())
            except OSError:
                return None
            return text if 'partition="1"' in text and 'partition="0"' in text else None

        wait_for(scraped, 20.0, "metrics of both partitions from the supervisor")

        _write(config, {"log-level": "info", "election-timeout": "2s"})
        os.kill(node.pid, signal.SIGHUP)
        refusals = wait_for(
            lambda: _events(node, "reload_refused"), 20.0, "the supervisor's refusal"
        )
        assert "--election-timeout" in refusals[0]["reason"]
        # The supervisor refused it once, and forwarded nothing.
        assert {event.get("partition") for event in refusals} == {None}
    finally:
        cluster.stop_all()


def _new_secret(path: Path) -> bytes:
    """Writes a new secret where ``path`` is (mode 600, as members require); its bytes."""
    from dlm import auth

    if path.exists():
        path.unlink()
    auth.write_secret_file(str(path))
    return auth.load_secret(str(path))


def _keep_copy(path: Path, copy: Path) -> None:
    from dlm import auth

    if copy.exists():
        copy.unlink()
    auth.write_secret_file(str(copy))
    copy.write_bytes(path.read_bytes())


def test_a_client_secret_rotates_with_an_overlap_until_the_next_reload(tmp_path: Path) -> None:
    config = tmp_path / "member.toml"
    secret = tmp_path / "client.secret"
    old_copy = tmp_path / "old-client.secret"
    _new_secret(secret)
    _keep_copy(secret, old_copy)
    cluster = Cluster(
        tmp_path,
        size=1,
        node_args=lambda _: ["--config", str(config), "--log-format", "json"],
        client_secret=(tmp_path / "old-client.secret").read_bytes().strip(),
    )
    node = cluster.nodes["n1"]
    node.by_hand = True
    BASE[config] = {
        "listen": node.address,
        "peers": cluster.peers_flag,
        "client-secret-file": str(secret),
    }
    _write(config, {})
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        old = Dlm(cluster.members_env, tmp_path)
        old.env["DLM_SECRET_FILE"] = str(old_copy)
        old.json("acquire", "r/1")

        _new_secret(secret)  # the new secret, where the old one was
        new = Dlm(cluster.members_env, tmp_path)
        new.env["DLM_SECRET_FILE"] = str(secret)
        assert new.run("acquire", "r/2").returncode != 0  # not before the reload
        reloaded = _hup(node, "config_reloaded", 0)
        assert reloaded["rotated"] == ["--client-secret-file"]
        # The overlap: both are accepted.
        old.json("acquire", "r/3")
        new.json("acquire", "r/4")

        second = _hup(node, "config_reloaded", 1)
        assert second["previous_secrets_dropped"] == ["--client-secret-file"]
        new.json("acquire", "r/5")
        ran = old.run("acquire", "r/6")
        assert ran.returncode != 0 and "secret" in ran.stderr, (ran.returncode, ran.stderr)
    finally:
        cluster.stop_all()


def test_a_peer_secret_rotates_member_by_member(tmp_path: Path) -> None:
    """Three members rotate their peer secret one at a time; a member restarted in the
    middle (with the old secret, or the new) rejoins, so the overlap covers both ways."""
    secrets = {n: tmp_path / f"{n}.peer" for n in ("n1", "n2", "n3")}
    first = _new_secret(secrets["n1"])
    for n in ("n2", "n3"):
        _keep_copy(secrets["n1"], secrets[n])
    cluster = Cluster(
        tmp_path,
        size=3,
        node_args=lambda node: ["--peer-secret-file", str(secrets[node.node_id])],
    )
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        dlm = Dlm(cluster.members_env, tmp_path)
        n1 = cluster.nodes["n1"]

        # n1 first: it takes the new secret and still accepts the old.
        newer = _new_secret(secrets["n1"])
        assert newer != first
        os.kill(n1.pid, signal.SIGHUP)
        wait_for(lambda: _any_line(n1, "config_reloaded"), 20.0, "n1 reloaded")
        # n2 restarts with the old secret only, and n3 is down: n1 and n2 make the only
        # majority, which needs each to take the other's connection in.
        cluster.nodes["n3"].kill()
        cluster.nodes["n2"].kill()
        cluster.nodes["n2"].start()
        dlm.json("acquire", "peer/1")
        cluster.nodes["n3"].start()
        wait_for(lambda: _all_see_leader(cluster), 30.0, "every member following one leader")

        # Now the others get the new secret; n1 drops the old at its next reload.
        for n in ("n2", "n3"):
            _keep_copy(secrets["n1"], secrets[n])
            os.kill(cluster.nodes[n].pid, signal.SIGHUP)
        for n in ("n1", "n2", "n3"):
            os.kill(cluster.nodes[n].pid, signal.SIGHUP)
        # n3 restarts with the new secret alone and rejoins.
        cluster.nodes["n3"].kill()
        cluster.nodes["n3"].start()
        wait_for(lambda: _all_see_leader(cluster), 30.0, "every member following one leader")
        dlm.json("acquire", "peer/2")
    finally:
        cluster.stop_all()


def _any_line(node: NodeProc, event: str) -> bool:
    return any(event in line for line in node.log_tail(400).splitlines())


def _all_see_leader(cluster: Cluster) -> bool:
    leaders = set()
    for node in cluster.nodes.values():
        status = node.status()
        if status is None or not status.get("leader"):
            return False
        leaders.add(status["leader"])
    return len(leaders) == 1


@pytest.mark.skipif(OPENSSL is None, reason="the openssl command is not installed")
def test_new_tls_files_are_served_after_a_reload_and_the_old_ca_stays_trusted(
    tmp_path: Path,
) -> None:
    """The member's certificate and CA are replaced in place (a new CA, a new
    certificate it signed); after SIGHUP new handshakes present the new certificate,
    and a client certificate the old CA signed is still accepted."""
    import shutil

    from dlm import tls

    pki = make_pki(tmp_path / "pki", ["n1"])
    live = tmp_path / "live"
    live.mkdir()
    for name in ("n1.crt", "n1.key", "ca.crt"):
        shutil.copy(pki / name, live / name)
    (live / "n1.key").chmod(0o600)
    config = tmp_path / "member.toml"
    cluster = Cluster(
        tmp_path,
        size=1,
        node_args=lambda _: ["--config", str(config), "--log-format", "json"],
        client_tls=tls.client_context(str(pki / "ca.crt")),
    )
    node = cluster.nodes["n1"]
    node.by_hand = True
    BASE[config] = {
        "listen": node.address,
        "peers": cluster.peers_flag,
        "tls-cert": str(live / "n1.crt"),
        "tls-key": str(live / "n1.key"),
        "tls-ca": str(live / "ca.crt"),
    }
    _write(config, {})
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout=15.0)
        make_ca(pki, "ca2")
        make_leaf(pki, "n1b", "ca2", "DNS:n1,IP:127.0.0.1")
        new_ca = tls.client_context(str(pki / "ca2.crt"))
        cluster.client_tls = new_ca
        assert node.status() is None  # the member still presents the old certificate

        shutil.copy(pki / "n1b.crt", live / "n1.crt")
        shutil.copy(pki / "n1b.key", live / "n1.key")
        shutil.copy(pki / "ca2.crt", live / "ca.crt")
        _hup(node, "config_reloaded", 0)
        assert node.status() is not None  # the new certificate, which ca2 signed
        # A client certificate of the old CA is still accepted (the overlap).
        cluster.client_tls = tls.client_context(
            str(pki / "ca2.crt"), str(pki / "client.crt"), str(pki / "client.key")
        )
        assert node.status() is not None
    finally:
        cluster.stop_all()
