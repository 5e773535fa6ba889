"""A local 3-member cluster in the foreground, for trying dlm out: `python -m dlm.node.devcluster`.

Starts members n1..n3 on 127.0.0.1:7701-7703 (cluster id ``devcluster``)
with their data in ./dlm-data/devcluster/n1..n3, so locks survive a restart
of the dev cluster, and a peer secret (made on the first run) in
./dlm-data/devcluster/peer.secret. It waits until they have elected a leader, prints each
member's PID (and the command that kills the leader), a ready-to-paste
command that starts a fourth member joining the cluster (to try a
replacement), and the line that takes a lock (last; all with absolute paths,
so they work from any directory), and then watches. A member that dies (kill it to watch
a failover) is reported on stdout and the others keep running. Ctrl-C (or
SIGTERM) stops every member still running, by PID - SIGTERM first, SIGKILL
after a grace period - and exits 0; if every member died on its own,
devcluster says so and exits 1.

``--base-port`` and ``--data`` move it elsewhere (two dev clusters side by side).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

SIZE = 3
CLUSTER_ID = "devcluster"
STOP_GRACE = 5.0
LEADER_TIMEOUT = 20.0


class DevCluster:
    def __init__(self, base_port: int, data: Path) -> None:
        self.ports = [base_port + i for i in range(1, SIZE + 1)]
        self.ids = [f"n{i}" for i in range(1, SIZE + 1)]
        self.data = data
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.peers = ",".join(
            f"{node}=127.0.0.1:{port}" for node, port in zip(self.ids, self.ports, strict=True)
        )

    @property
    def members(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

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
        self.make_peer_secret()
        for node, port in zip(self.ids, self.ports, strict=True):
            command = [
                sys.executable,
                "-m",
                "dlm",
                "node",
                "start",
                "--id",
                node,
                "--listen",
                f"127.0.0.1:{port}",
                "--peers",
                self.peers,
                "--data",
                str(self.data / node),
                "--cluster-id",
                CLUSTER_ID,
                "--peer-secret-file",
                str(self.peer_secret),
            ]
            # Members log JSON lines to our stderr; stdout stays for the instructions. Their
            # own session keeps a terminal Ctrl-C away from them: we stop them, in order.
            self.procs[node] = subprocess.Popen(
                command, stdout=sys.stderr, stderr=sys.stderr, start_new_session=True
            )

    def join_command(self) -> str:
        """The line that starts a fourth member, n4 on the next port, joining this cluster."""
        node = f"n{SIZE + 1}"
        port = self.ports[-1] + 1
        return (
            f"{_dlm_command()} node start --id {node} --listen 127.0.0.1:{port} "
            f"--join {self.members} --data {shlex.quote(str(self.data / node))} "
            f"--cluster-id {CLUSTER_ID} "
            f"--peer-secret-file {shlex.quote(str(self.peer_secret))}"
        )

    def dead(self) -> list[tuple[str, int]]:
        return [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def wait_for_leader(self, timeout: float) -> str | None:
        from dlm.client.sync import Client

        deadline = time.monotonic() + timeout
        with Client(self.members, timeout=timeout) as client:
            while time.monotonic() < deadline and not self.dead():
                for port in self.ports:
                    view = client.member_status(f"127.0.0.1:{port}", timeout=0.5)
                    if view is not None and view.get("role") == "leader":
                        return str(view.get("node"))
                time.sleep(0.1)
        return None

    def stop(self) -> None:
        """SIGTERM to every member, then SIGKILL to any still running after the grace."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for node, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"devcluster: {node} (pid {proc.pid}) did not stop; killing it", flush=True)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


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


def watch(cluster: DevCluster, poll: float = 0.2) -> int:
    """Reports members that stop on their own, until Ctrl-C (0) or until none is left (1)."""
    reported: set[str] = set()
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
            print(f"devcluster: {node} (pid {pid}) {describe_exit(code)}; {rest}", flush=True)
        if not cluster.alive():
            return 1
        time.sleep(poll)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlm.node.devcluster",
        description="Run a local 3-member dlm cluster in the foreground (Ctrl-C stops it).",
    )
    parser.add_argument("--base-port", type=int, default=7700, help="members use +1..+3")
    parser.add_argument("--data", default=os.path.join("dlm-data", "devcluster"))
    args = parser.parse_args(argv)

    cluster = DevCluster(args.base_port, Path(os.path.abspath(args.data)))
    busy = [port for port in cluster.ports if _busy(port)]
    if busy:
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
        if leader is None:
            died = ", ".join(f"{n} exited with {rc}" for n, rc in cluster.dead())
            why = died or f"no leader within {LEADER_TIMEOUT:.0f}s"
            print(f"devcluster: error: the cluster did not come up ({why})", file=sys.stderr)
            return 1
        pids = ", ".join(
            f"{node} pid {proc.pid} on 127.0.0.1:{port}"
            for (node, proc), port in zip(cluster.procs.items(), cluster.ports, strict=True)
        )
        print(
            f"\ndlm dev cluster is up: {cluster.members} (leader {leader})\n"
            f"members: {pids}\n"
            f"data: {cluster.data}\n"
            "Ctrl-C stops all three members. To watch a failover, kill the leader: "
            f"kill -9 {cluster.procs[leader].pid}\n"
            "To try a replacement, start a fourth member in another terminal (it joins, "
            "catches up and becomes a voter), then remove one of the first three with "
            "`dlm members remove ID`:\n\n"
            f"    {cluster.join_command()}\n\n"
            "Take a lock from another terminal:\n\n"
            f"    DLM_CLUSTER={cluster.members} {_dlm_command()} exec --lock demo -- "
            "sh -c 'echo \"hello, token $DLM_FENCING_TOKEN\"'\n",
            flush=True,
        )
        code = watch(cluster)
    except (KeyboardInterrupt, _Stop):
        running = ", ".join(cluster.alive()) or "nothing: no member is running"
        print(f"\ndevcluster: stopping {running}", flush=True)
    finally:
        # A second Ctrl-C during the stop must not leave members behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
