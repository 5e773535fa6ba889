"""A local 3-member cluster in the foreground, for trying dlm out: `python -m dlm.devcluster`.

Starts members n1..n3 on 127.0.0.1:7701-7703 (cluster id ``devcluster``) with their data
in ./dlm-data/devcluster/n1..n3, so locks survive a restart of the dev cluster. A later
run starts the members the data directory holds now: after the README's member
replacement, n4 (which joined) too, each at the address it recorded; one that cannot
come back (removed, or its address taken) gets one line saying why. The members
authenticate each other with a peer secret made on the first run in ./dlm-
data/devcluster/peer.secret. It waits until they have elected a leader, prints each
member's PID (and the command that kills the leader), a ready-to-paste command that
starts a fourth member joining the cluster (to try a replacement), and the line that
takes a lock (last; all with absolute paths, so they work from any directory), and then
watches. A member that dies (kill it to watch a failover) is reported on stdout and the
others keep running. Ctrl-C (or SIGTERM) stops every member still running, by PID -
SIGTERM first, SIGKILL after a grace period - and exits 0; if every member died on its
own, devcluster says so and exits 1.

The members' logs go to devcluster's stderr, as text on a terminal; the
events a restarted member applies again from its log (``replayed``) are
left out, as they are not news.

``--base-port`` and ``--data`` move it elsewhere (two dev clusters side by side).
``--partitions P`` (``make run PARTITIONS=4``) starts members of P partitions, each
a supervisor of P processes, one Raft group per partition; it is recorded in the
members' data, so a later run without it starts them as they were.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

SIZE = 3
CLUSTER_ID = "devcluster"
STOP_GRACE = 5.0
LEADER_TIMEOUT = 20.0


@dataclass(frozen=True, slots=True)
class Member:
    node: str
    port: int
    first_start: bool
    """No data yet: started with --peers (one of the first three)."""


_ID = re.compile(r"^n(\d+)$")
_CONSOLE_LOCK = threading.Lock()


def _recorded_port(meta: dict[str, object], node: str) -> int | None:
    """Where node.json says this member listens (format 3), or its entry among the first
    members (the previous release's format)."""
    peers = meta.get("peers")
    own = peers.get(node) if isinstance(peers, dict) else None
    for raw in (meta.get("listen"), own):
        if isinstance(raw, str) and raw.rpartition(":")[2].isdigit():
            return int(raw.rpartition(":")[2])
    return None


class DevCluster:
    def __init__(self, base_port: int, data: Path, partitions: int | None = None) -> None:
        self.base_port = base_port
        self.partitions = partitions
        """--partitions for every member (None: not given, each keeps what it recorded)."""
        self.ports = [base_port + i for i in range(1, SIZE + 1)]
        self.ids = [f"n{i}" for i in range(1, SIZE + 1)]
        self.data = data
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.peers = ",".join(
            f"{node}=127.0.0.1:{port}" for node, port in zip(self.ids, self.ports, strict=True)
        )
        self.unusable: dict[str, str] = {}
        """Members that cannot come back, and why (one line each)."""
        self.members = self._current_members()
        self._said: dict[str, str] = {}
        """The last ``dlm node:`` line of each member's stderr: why it stopped."""
        self._pumps: list[threading.Thread] = []

    def _current_members(self) -> list[Member]:
        """The first three (new, or as their data left them) and every member that joined
        since and has a data directory here, at the addresses they recorded."""
        found: dict[str, Member] = {}
        for node, port in zip(self.ids, self.ports, strict=True):
            meta = self._meta(node)
            recorded = _recorded_port(meta, node) if meta else None
            found[node] = Member(node, recorded or port, first_start=meta is None)
        extra = (
            sorted(
                (p.name for p in self.data.iterdir() if p.is_dir() and p.name not in found),
                key=lambda name: (int(m[1]) if (m := _ID.match(name)) else 1 << 30, name),
            )
            if self.data.is_dir()
            else []
        )
        for node in extra:
            meta = self._meta(node)
            if meta is None and _ID.match(node):
                self.unusable[node] = (
                    f"{self.data / node} has no node.json: it never finished joining "
                    f"(rm -rf {shlex.quote(str(self.data / node))} frees its id)"
                )
                continue
            if meta is None or meta.get("cluster") != CLUSTER_ID or meta.get("node") != node:
                continue  # not one of ours
            recorded = _recorded_port(meta, node)
            if recorded is None and (m := _ID.match(node)):
                recorded = self.base_port + int(m[1])  # the join line's convention
            if recorded is None:
                self.unusable[node] = f"{self.data / node}/node.json does not say where it listens"
                continue
            found[node] = Member(node, recorded, first_start=False)
        return list(found.values())

    def _meta(self, node: str) -> dict[str, object] | None:
        """A member's node.json (a member of several partitions: its partition 0's)."""
        for path in (self.data / node / "node.json", self.data / node / "p0" / "node.json"):
            try:
                meta = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            return meta if isinstance(meta, dict) else None
        return None

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{m.port}" for m in self.members)

    def serving(self) -> str:
        """The addresses of the members that did not stop (those running elsewhere too)."""
        stopped = {node for node, _ in self.dead()}
        return ",".join(f"127.0.0.1:{m.port}" for m in self.members if m.node not in stopped)

    def port_of(self, node: str) -> int:
        return next(m.port for m in self.members if m.node == node)

    def skip_busy(self) -> list[int]:
        """Leaves out members whose port is taken (each gets its line); the ports taken."""
        busy = [m for m in self.members if _busy(m.port)]
        for member in busy:
            self.unusable[member.node] = (
                f"127.0.0.1:{member.port} is already in use (is {member.node} still running "
                "in another terminal?); not starting it"
            )
        return [m.port for m in busy]

    @property
    def peer_secret(self) -> Path:
        return self.data / "peer.secret"

    def make_peer_secret(self) -> None:
        """The members authenticate each other, as in production: a removed member then
        believes the others' refusal and stops (an unauthenticated one is not believed)."""
        if self.peer_secret.exists():
            return
        from dlm.auth import write_secret_file

        self.data.mkdir(parents=True, exist_ok=True)
        write_secret_file(str(self.peer_secret))

    def start(self) -> None:
        # On a terminal the members log text, as when they wrote to it themselves.
        text = sys.stderr.isatty() and "DLM_NODE_LOG_FORMAT" not in os.environ
        self.make_peer_secret()
        for member in self.members:
            if member.node in self.unusable:
                continue
            command = member_command(
                member.node,
                f"127.0.0.1:{member.port}",
                self.data / member.node,
                CLUSTER_ID,
                # Read at the first start only; the same as recorded after it.
                peers=self.peers if member.node in self.ids else None,
                flags=["--peer-secret-file", str(self.peer_secret)],
            )
            if self.partitions is not None:
                command += ["--partitions", str(self.partitions)]
            if text:
                command += ["--log-format", "text"]
            # Members log to our stderr, through us (to leave replayed events out); stdout
            # stays for the instructions. Their own session keeps a terminal Ctrl-C away
            # from them: we stop them, in order.
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self.procs[member.node] = proc
            assert proc.stderr is not None
            pump = threading.Thread(target=self._pump, args=(member.node, proc.stderr), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def _pump(self, node: str, stream: IO[bytes]) -> None:
        """Copies a member's log lines to our stderr, but for replayed events."""
        out = getattr(sys.stderr, "buffer", None)
        for line in stream:
            if line.startswith(b"dlm node: "):
                self._said[node] = line.decode(errors="replace").strip()
            if is_replayed(line) or out is None:
                continue
            with _CONSOLE_LOCK, contextlib.suppress(OSError, ValueError):
                out.write(line)
                out.flush()
        stream.close()

    def why_stopped(self, node: str, code: int) -> str:
        said = self._said.get(node, "")
        for prefix in ("dlm node: error: ", "dlm node: "):
            if said.startswith(prefix):
                return said[len(prefix) :]
        return describe_exit(code)

    def join_command(self) -> str:
        """The line that starts one more member, on the next id and port, joining this
        cluster (n4 on the base port + 4, the first time)."""
        numbers = [int(m[1]) for node in self.procs.keys() | self.unusable.keys()
                   if (m := _ID.match(node))]  # fmt: skip
        number = max([SIZE, *numbers]) + 1
        node = f"n{number}"
        port = max([self.base_port + number, *(m.port + 1 for m in self.members)])
        return (
            f"{_dlm_command()} node start --id {node} --listen 127.0.0.1:{port} "
            f"--join {self.serving()} --data {shlex.quote(str(self.data / node))} "
            f"--cluster-id {CLUSTER_ID} "
            f"--peer-secret-file {shlex.quote(str(self.peer_secret))}"
        )

    def dead(self) -> list[tuple[str, int]]:
        return [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def wait_for_leader(self, timeout: float) -> str | None:
        """The leader, once one answers as such; None if none within ``timeout`` or once
        every member we started has stopped."""
        from dlm.client.sync import Client

        deadline = time.monotonic() + timeout
        with Client(self.addresses, timeout=timeout) as client:
            while time.monotonic() < deadline and self.alive():
                for member in self.members:
                    view = client.member_status(f"127.0.0.1:{member.port}", timeout=0.5)
                    if view is not None and view.role == "leader":
                        return str(view.node)
                time.sleep(0.1)
        return None

    def stop(self) -> None:
        """SIGTERM to every member, then SIGKILL to any still running after the grace."""

        def killing(node: str, pid: int) -> None:
            print(f"devcluster: {node} (pid {pid}) did not stop; killing it", flush=True)

        stop_processes(self.procs, STOP_GRACE, on_kill=killing)
        for pump in self._pumps:
            pump.join(timeout=STOP_GRACE)


def member_command(
    node: str,
    listen: str,
    data: Path,
    cluster_id: str,
    *,
    peers: str | None = None,
    flags: Sequence[str] = (),
) -> list[str]:
    """The `dlm node start` command line of one member, run by this interpreter (dlm.testing
    starts its members with it too). ``peers``: the --peers flag, for a first start."""
    command = [
        sys.executable,
        "-m",
        "dlm",
        "node",
        "start",
        "--id",
        node,
        "--listen",
        listen,
        "--data",
        str(data),
        "--cluster-id",
        cluster_id,
        *flags,
    ]
    if peers is not None:
        command += ["--peers", peers]
    return command


def stop_processes(
    procs: Mapping[str, subprocess.Popen[bytes]],
    grace: float,
    *,
    on_kill: Callable[[str, int], None] | None = None,
) -> None:
    """SIGTERM to every process still running (resumed first, if stopped), then SIGKILL, by
    PID, to any still running after ``grace``; every one is reaped (dlm.testing uses it too)."""
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if on_kill is not None:
                on_kill(name, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def is_replayed(line: bytes) -> bool:
    """Whether a member's log line is an event it applied again after a restart: the
    ``replayed`` field comes last, as JSON or as text."""
    line = line.rstrip(b"\r\n")
    return line.endswith((b',"replayed":true}', b" replayed=true"))


def _busy(port: int) -> bool:
    with socket.socket() as s:
        # As the members' own listeners do, so a port in TIME_WAIT counts as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _dlm_command() -> str:
    """The `dlm` beside this interpreter, by absolute path: the paste line must work from
    any directory, whatever PATH holds. Not resolved: a venv's python is a symlink."""
    beside = Path(os.path.abspath(sys.executable)).parent / "dlm"
    if beside.exists():
        return shlex.quote(str(beside))
    return f"{shlex.quote(os.path.abspath(sys.executable))} -m dlm"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


def watch(cluster: DevCluster, reported: set[str], poll: float = 0.2) -> int:
    """Reports members that stop on their own, until Ctrl-C (0) or until none is left (1)."""
    while True:
        for node, code in cluster.dead():
            if node in reported:
                continue
            reported.add(node)
            pid = cluster.procs[node].pid
            left = cluster.alive()
            rest = (
                f"{', '.join(left)} keep running (Ctrl-C stops them)"
                if left
                else "no member is left"
            )
            why = cluster.why_stopped(node, code)
            said = "" if why == describe_exit(code) else f" ({why})"
            print(f"devcluster: {node} (pid {pid}) {describe_exit(code)}{said}; {rest}", flush=True)
        if not cluster.alive():
            return 1
        time.sleep(poll)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlm.devcluster",
        description="Run a local 3-member dlm cluster in the foreground (Ctrl-C stops it).",
    )
    parser.add_argument("--base-port", type=int, default=7700, help="members use +1..+3")
    parser.add_argument("--data", default=os.path.join("dlm-data", "devcluster"))
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        metavar="P",
        help="members of P partitions (1 to 64; default: as their data says, else 1)",
    )
    args = parser.parse_args(argv)
    if args.partitions is not None and not 1 <= args.partitions <= 64:
        parser.error(f"--partitions must be 1 to 64, not {args.partitions}")

    cluster = DevCluster(args.base_port, Path(os.path.abspath(args.data)), args.partitions)
    new = [m.port for m in cluster.members if m.first_start]
    busy = cluster.skip_busy()
    if set(busy) & set(new) or len(busy) == len(cluster.members):
        taken = ", ".join(f"127.0.0.1:{p}" for p in busy)
        print(
            f"devcluster: error: {taken} already in use: stop the other process "
            "(another devcluster?) or pass --base-port",
            file=sys.stderr,
        )
        return 1

    # Installed explicitly: a shell may start us with SIGINT ignored (a background job).
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    code = 0
    try:
        cluster.start()
        leader = cluster.wait_for_leader(LEADER_TIMEOUT)
        reported: set[str] = set()
        for node, why in cluster.unusable.items():
            print(f"devcluster: {node} cannot come back: {why}", flush=True)
        for node, rc in cluster.dead():
            reported.add(node)
            print(f"devcluster: {node} cannot come back: {cluster.why_stopped(node, rc)}")
        if leader is None:
            died = ", ".join(f"{n} exited with {rc}" for n, rc in cluster.dead())
            why = died or f"no leader within {LEADER_TIMEOUT:.0f}s"
            print(f"devcluster: error: the cluster did not come up ({why})", file=sys.stderr)
            return 1
        running = cluster.alive()
        pids = ", ".join(
            f"{node} pid {cluster.procs[node].pid} on 127.0.0.1:{cluster.port_of(node)}"
            for node in running
        )
        leader_proc = cluster.procs.get(leader)
        kill = (
            f"To watch a failover, kill the leader: kill -9 {leader_proc.pid}\n"
            if leader_proc is not None and leader_proc.poll() is None
            else ""
        )
        shape = (
            f", {cluster.partitions} partitions, each with its own leader"
            if cluster.partitions is not None and cluster.partitions > 1
            else ""
        )
        print(
            f"\ndlm dev cluster is up: {cluster.serving()} (leader {leader}{shape})\n"
            f"members: {pids}\n"
            f"data: {cluster.data}\n"
            f"Ctrl-C stops {', '.join(running)}. {kill}"
            "To try a replacement, start one more member in another terminal (it joins, "
            "catches up and becomes a voter), then remove one of the others with "
            "`dlm members remove ID`:\n\n"
            f"    {cluster.join_command()}\n\n"
            "Take a lock from another terminal:\n\n"
            f"    DLM_CLUSTER={cluster.serving()} {_dlm_command()} exec --lock demo -- "
            "sh -c 'echo \"hello, token $DLM_FENCING_TOKEN\"'\n",
            flush=True,
        )
        code = watch(cluster, reported)
    except (KeyboardInterrupt, _Stop):
        running_now = ", ".join(cluster.alive()) or "nothing: no member is running"
        print(f"\ndevcluster: stopping {running_now}", flush=True)
    finally:
        # A second Ctrl-C during the stop must not leave members behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
