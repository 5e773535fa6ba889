"""README.md's shell examples, pasted as a newcomer pastes them, against a real dev cluster.

Every fenced ``sh`` and ``console`` block of README.md is run here, unless the
line right before its fence is a marker saying why it cannot be
(``<!-- readme-test: skip: REASON -->``): so the README cannot drift from the
program. Each block gets a fresh `make run` dev cluster (dlm.devcluster)
on free ports and data of its own, and runs in a scratch directory where
``.venv/bin/dlm`` and ``dlm`` (on PATH) are this tree's, with the few
substitutions a test needs and a reader does not:

- the README's ports move with the cluster: ``127.0.0.1:770N`` becomes the
  dev cluster's port N, and ``10.0.0.N:7700`` (the production examples) too;
- the scripts a job runs (``./deploy.sh``, ``/usr/local/bin/backup.sh``) are
  stubs that record their run and print nothing; ``/etc/dlm`` is a scratch
  directory;
- a command that runs until Ctrl-C (``--watch``) gets a SIGINT after a moment
  and must exit 0; an example lease id is the id of a lease opened first;
- a block that talks to 127.0.0.1:7704 has the fourth member the README tells
  the reader to start (the line `make run` printed) running, and a voter.

A ``sh`` block runs under ``bash -e``: every command must succeed. A
``console`` block's ``$`` commands must succeed and print the table header
the README shows. A block of crontab lines runs each line as a simulated tick
of five hosts (five ``sh -c`` at once, with the line's command): with
``--min-hold``, exactly one host runs the job and the hosts that skip print
nothing at all (cron mails any output); with ``--wait`` and no hold, every
host runs it, one at a time; any other line (``dlm status --check | grep``)
prints nothing while the cluster is healthy.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from tests.cluster.harness import REPO, wait_for
from tests.cluster.test_devcluster import (
    _banner,
    _read_until,
    _refused,
    _start,
    _stop,
    _three_free_ports_after,
)

# serial: each example's dev cluster takes ports chosen by probing (test_devcluster.py),
# which a parallel test could race.
pytestmark = pytest.mark.serial("probed-ports")

README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- readme-test: (.+?) -->$")
CRON_LINE = re.compile(r"^(?:[\d*/,-]+\s+){5}(\S.*)$")
EXAMPLE_LEASE = re.compile(r"\b[0-9a-z]{16}\b")
TIMEOUT = 120.0
HOSTS = 5
"""Hosts in the simulated cron tick."""


@dataclass(frozen=True)
class Block:
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    text: str
    marker: str | None
    """The readme-test marker right before the fence, if any."""

    @property
    def skip_reason(self) -> str | None:
        if self.marker is None or not self.marker.startswith("skip:"):
            return None
        return self.marker.removeprefix("skip:").strip()

    @property
    def cron_lines(self) -> list[str]:
        return [line for line in self.text.splitlines() if CRON_LINE.match(line)]

    @property
    def kind(self) -> str:
        if self.skip_reason is not None:
            return "skipped"
        if self.cron_lines:
            return "crontab"
        return "console" if self.lang == "console" else "script"

    def __str__(self) -> str:
        return f"README.md:{self.line}"


def readme_blocks() -> list[Block]:
    """README's fenced sh and console blocks, in order, with their markers."""
    blocks: list[Block] = []
    lines = README.read_text(encoding="utf-8").splitlines()
    inside: tuple[int, str, str | None] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if inside is None and fence:
            previous = lines[number - 2] if number > 1 else ""
            mark = MARKER.match(previous)
            inside, body = (number, fence[1], mark[1] if mark else None), []
        elif inside is not None and line.startswith("```"):
            start, lang, marker = inside
            if lang in ("sh", "console"):
                blocks.append(Block(start, lang, "\n".join(body) + "\n", marker))
            inside = None
        elif inside is not None:
            body.append(line)
    return blocks


BLOCKS = readme_blocks()


def test_every_shell_example_runs_or_says_why_not() -> None:
    assert len(BLOCKS) >= 20
    for block in BLOCKS:
        if block.marker is not None:
            assert block.skip_reason, f"{block}: a marker must be 'skip: REASON'"
        if block.kind == "crontab":
            # A crontab block holds crontab lines and comments only: nothing else to run.
            for line in block.text.splitlines():
                assert not line.strip() or line.startswith("#") or CRON_LINE.match(line), line
    text = README.read_text(encoding="utf-8")
    markers = re.findall(r"^<!-- readme-test:", text, re.M)
    assert len(markers) == sum(1 for b in BLOCKS if b.marker is not None), (
        "every readme-test marker must be the line right before a ```sh or ```console fence"
    )


# ---------------------------------------------------------------------------
# The scratch directory and the dev cluster a block runs against


@dataclass
class Scene:
    cwd: Path
    env: dict[str, str]
    base: int
    """The dev cluster's base port (members at base+1..base+3, the fourth at base+4)."""
    devcluster: subprocess.Popen[bytes] | None = None
    banner: str = ""
    extra: subprocess.Popen[bytes] | None = None
    """The fourth member, when a block needs it."""

    def rewrite(self, text: str) -> str:
        """The block as this scene runs it (see the module's docstring)."""
        text = re.sub(r"127\.0\.0\.1:770(\d)", lambda m: f"127.0.0.1:{self.base + int(m[1])}", text)
        text = re.sub(r"10\.0\.0\.(\d+):7700", lambda m: f"127.0.0.1:{self.base + int(m[1])}", text)
        text = text.replace("/etc/dlm/", f"{self.cwd}/etc/dlm/")
        text = text.replace("/usr/local/bin/", f"{self.cwd}/usr/local/bin/")
        return "\n".join(
            f"timeout --preserve-status -s INT 3 {line.strip()}"
            if "--watch" in line and not line.rstrip().endswith("&")
            else line
            for line in text.splitlines()
        )

    @property
    def cluster(self) -> str:
        return ",".join(f"127.0.0.1:{self.base + i}" for i in (1, 2, 3))

    def dlm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["dlm", *args], cwd=self.cwd, env=self.env, capture_output=True, text=True,
            timeout=TIMEOUT, check=False,
        )  # fmt: skip


STUB = """#!/bin/sh
# A job's stand-in: records that it ran (and whether another run overlapped), prints nothing.
tally={tally}
mkdir "$tally.running" 2>/dev/null || echo overlap >> "$tally.overlaps"
echo "$$ $*" >> "$tally"
sleep 0.2
rmdir "$tally.running"
"""


def make_stubs(scene: Scene, text: str) -> dict[str, Path]:
    """Stub scripts for every job the block runs; their tally files, by script name."""
    tallies: dict[str, Path] = {}
    for where, name in re.findall(r"(\./|/usr/local/bin/)([\w.-]+\.sh)\b", text):
        path = scene.cwd / name if where == "./" else scene.cwd / "usr/local/bin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tally = scene.cwd / f"{name}.runs"
        path.write_text(STUB.format(tally=shlex.quote(str(tally))), encoding="utf-8")
        path.chmod(0o755)
        tallies[name] = tally
    return tallies


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    bin_dir = tmp_path / "bin"
    venv_bin = tmp_path / "work" / ".venv" / "bin"
    dlm = Path(sys.executable).parent / "dlm"
    if not dlm.exists():
        pytest.skip(f"no dlm beside {sys.executable} (make install)")
    for directory in (bin_dir, venv_bin, tmp_path / "work" / "etc" / "dlm"):
        directory.mkdir(parents=True)
        if directory != tmp_path / "work" / "etc" / "dlm":
            (directory / "dlm").symlink_to(dlm)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("DLM_") or name == "DLM_NO_FSYNC"
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    made = Scene(cwd=tmp_path / "work", env=env, base=0)
    try:
        yield made
    finally:
        for proc in (made.extra, made.devcluster):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT if proc is made.devcluster else signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=30)
            if proc is not None:
                _stop(proc) if proc is made.devcluster else _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def start_dev_cluster(scene: Scene, tmp_path: Path) -> None:
    proc, base, _ = _start(tmp_path)
    scene.devcluster, scene.base = proc, base
    scene.banner = _banner(proc)
    scene.env["DLM_CLUSTER"] = scene.cluster
    # As a reader would, a moment after the banner: a leader every member follows (on a
    # loaded test machine the first leader may still be settling).
    wait_for(lambda: scene.dlm("status", "--check").returncode == 0, TIMEOUT, "a healthy cluster")


def start_fourth_member(scene: Scene) -> None:
    """The README's replacement: paste the fourth member's line `make run` printed, and
    wait until it votes."""
    [line] = [x.strip() for x in scene.banner.splitlines() if "node start --id n4" in x]
    scene.extra = subprocess.Popen(
        ["sh", "-c", f"exec {line}"], cwd=scene.cwd, env=scene.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    everyone = {**scene.env, "DLM_CLUSTER": f"{scene.cluster},127.0.0.1:{scene.base + 4}"}

    def n4_votes() -> bool:
        listed = subprocess.run(
            ["dlm", "members", "list", "--json"], cwd=scene.cwd, env=everyone,
            capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )  # fmt: skip
        return (
            listed.returncode == 0
            and '"id": "n4"' in listed.stdout
            and ('"learner"' not in listed.stdout)
        )

    wait_for(n4_votes, TIMEOUT, "n4 to join and become a voter")


# ---------------------------------------------------------------------------
# sh and console blocks


def _runnable(kind: str) -> list[object]:
    return [pytest.param(block, id=f"line{block.line}") for block in BLOCKS if block.kind == kind]


@pytest.mark.parametrize("block", _runnable("script"))
def test_a_shell_example_runs_as_written(block: Block, scene: Scene, tmp_path: Path) -> None:
    starts_members = "dlm node start" in block.text
    if starts_members:
        # It starts members of its own (the TLS walk-through): free ports for them.
        scene.base = _three_free_ports_after()
    else:
        start_dev_cluster(scene, tmp_path)
    if "127.0.0.1:7704" in block.text:
        start_fourth_member(scene)
    text = block.text
    if "lease revoke" in text:
        opened = scene.dlm("acquire", "readme-example", "--ttl", "1m", "--format", "env")
        assert opened.returncode == 0, opened.stderr
        lease = re.findall(r"DLM_LEASE_ID='?([0-9a-z]+)", opened.stdout)[0]
        text = EXAMPLE_LEASE.sub(lease, text)
    make_stubs(scene, text)
    script = (
        "set -e\n"
        "trap 'echo \"README example failed at its line $((LINENO - 2)) (exit $?)\" >&2' ERR\n"
        + scene.rewrite(text)
    )
    # Files, not pipes: members an example starts in the background would hold a pipe open.
    out_path, err_path = tmp_path / "example.out", tmp_path / "example.err"
    with open(out_path, "wb") as out_file, open(err_path, "wb") as err_file:
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=scene.cwd, env=scene.env, stdout=out_file,
            stderr=err_file, start_new_session=True,
        )  # fmt: skip
    try:
        proc.wait(timeout=TIMEOUT)
    finally:
        # Whatever it left running in the background (members it started) goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    out, err = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    if starts_members:
        for i in (1, 2, 3):
            wait_for(partial(_refused, scene.base + i), 30.0, "the example's members to stop")
    assert proc.returncode == 0, (
        f"{block} failed:\n{block.text}\n--- stdout\n{out}\n--- stderr\n{err}"
    )
    if "members remove n1" in block.text and scene.devcluster is not None:
        # The README's comment: the dev cluster says "exited with 0" for n1.
        assert "n1 (pid" in _read_until(scene.devcluster, "exited with 0", TIMEOUT)


@pytest.mark.parametrize("block", _runnable("console"))
def test_a_console_example_runs_and_shows_the_readmes_header(
    block: Block, scene: Scene, tmp_path: Path
) -> None:
    start_dev_cluster(scene, tmp_path)
    lines = block.text.splitlines()
    [command] = [line[2:] for line in lines if line.startswith("$ ")]
    [header] = [line.split() for line in lines if line.startswith("ID ")]
    ran = subprocess.run(
        ["bash", "-c", scene.rewrite(command)], cwd=scene.cwd, env=scene.env,
        capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    shown = [line.split() for line in ran.stdout.splitlines() if line.startswith("ID ")]
    assert shown == [header], ran.stdout


# ---------------------------------------------------------------------------
# crontab lines: a simulated tick of five hosts


def _cron_lines() -> list[object]:
    return [
        pytest.param(block, line, id=f"line{block.line}-{i}")
        for block in BLOCKS
        if block.kind == "crontab"
        for i, line in enumerate(block.cron_lines)
    ]


@pytest.mark.parametrize(("block", "line"), _cron_lines())
def test_a_crontab_line_on_a_five_host_tick(
    block: Block, line: str, scene: Scene, tmp_path: Path
) -> None:
    start_dev_cluster(scene, tmp_path)
    match = CRON_LINE.match(line)
    assert match is not None
    command = scene.rewrite(match[1])
    tallies = make_stubs(scene, command)
    # Five simulated hosts: DLM_HOST gives each the name the run ledger records.
    hosts = [
        subprocess.Popen(
            ["sh", "-c", command],
            cwd=scene.cwd,
            env={**scene.env, "DLM_HOST": f"host-{i}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(1, HOSTS + 1)
    ]
    results = []
    for host in hosts:
        out, err = host.communicate(timeout=TIMEOUT)
        results.append((host.returncode, out, err))
    said = [(code, out, err) for code, out, err in results if out or err]
    if "dlm exec" not in command:
        # A check: silent while the cluster is healthy.
        assert not said, said
        return
    [tally] = tallies.values()
    runs = tally.read_text().splitlines() if tally.exists() else []
    assert not (tally.parent / f"{tally.name}.overlaps").exists(), "two runs overlapped"
    if "--min-hold" not in command:
        # One host at a time, each waiting its turn: every host runs it.
        assert len(runs) == HOSTS and [c for c, _, _ in results] == [0] * HOSTS, results
        assert not said, said
        return
    assert len(runs) == 1, f"{len(runs)} hosts ran the job in one tick: {results}"
    skip_code = 75
    conflict = re.search(r"--conflict-exit-code (\d+)", command)
    if conflict:
        skip_code = int(conflict[1])
    codes = sorted(code for code, _, _ in results)
    assert codes == sorted([0] + [skip_code] * (HOSTS - 1)), results
    # The contract cron needs: a host that skips prints nothing, or cron mails it.
    assert not said, f"hosts that skipped printed something (cron would mail it): {said}"
    check_the_run_ledger(scene, command)


def check_the_run_ledger(scene: Scene, command: str) -> None:
    """`dlm runs` shows the tick as one run and four skips (issue 28), and the dead-man's
    switch says so, then flips to 1 once no run has ended within its age (the job is
    gone from the crontab: no tick follows)."""
    import json

    lock = re.search(r"--lock (\S+)", command)
    assert lock is not None
    key = lock[1]
    shown = scene.dlm("runs", key, "--json")
    assert shown.returncode == 0, shown.stderr
    runs = json.loads(shown.stdout)["runs"]
    assert len(runs) == 1 and runs[0]["skips"] == HOSTS - 1, runs
    assert runs[0]["host"].startswith("host-") and runs[0]["outcome"] == "finished", runs
    check = scene.dlm("runs", key, "--check", "--max-age", "25h", "--success")
    assert check.returncode == 0 and check.stdout.startswith("ok:"), check
    # No further tick: once a second has passed since the run ended, a 1s age misses it.
    wait_for(
        lambda: scene.dlm("runs", key, "--check", "--max-age", "1s").returncode == 1,
        TIMEOUT,
        "the check to flip to 1",
    )
    missing = scene.dlm("runs", key, "--check", "--max-age", "1s")
    assert missing.stdout.startswith("missing:") and len(missing.stdout.splitlines()) == 1
