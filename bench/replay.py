"""A member's restart with a long log: bench.scale's "follower restart, replaying", alone.

``make bench-scale`` times one restart after filling a cluster for half a minute;
this takes the same measurement several times from one data directory, so it can
be compared between revisions and profiled:

    python -m bench.replay create DIR            # a 3-member cluster, ~98,000 locks, stopped
    python -m bench.replay time DIR --rounds 3   # restart one follower 3 times, timed
    python -m bench.replay time DIR --profile out.svg   # the same under py-spy

``create`` fills a cluster as bench.scale's locks part does (locks with 100 bytes of
owner metadata under a hundred long leases, no snapshot) and kill -9s every member.
``time`` copies the three data directories to a scratch directory, starts the two
members that were not the victim, waits until they lead and have applied the whole
log, then times the victim from its start until it has applied the leader's commit
index (what bench.scale times: process start, reading the log, hearing the leader,
applying every entry), kill -9 and again, ``--rounds`` times.

``--dlm-src DIR`` runs the members from another source tree (a ``git worktree`` of
an older revision): ``PYTHONPATH=DIR``. An older revision may not read a newer
log, so create each revision's data directory with that revision's members.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from bench.locks import LEADER_TIMEOUT_S, DlmCluster
from bench.procs import tree_usage

VICTIM = 2
"""The member restarted (n3); the other two form the quorum it catches up with."""
CATCH_UP_TIMEOUT_S = 300.0
STATE_FILE = "replay.json"


class _SourceCluster(DlmCluster):
    """Members run with ``python -P``: ``-m dlm`` would otherwise put the current directory
    (this tree) before PYTHONPATH, and run this tree's dlm whatever --dlm-src says."""

    def _command(self, i: int) -> list[str]:
        argv = super()._command(i)
        return [argv[0], "-P", *argv[1:]]


def _cluster(base_dir: str, addrs: list[str] | None, dlm_src: str | None) -> DlmCluster:
    cluster = _SourceCluster(base_dir)
    if addrs is not None:
        cluster.addrs = addrs
        cluster._client.close()
        from dlm.client.sync import Client

        cluster._client = Client(addrs)
    env = {**os.environ}
    env.pop("DLM_SNAPSHOT_EVERY", None)
    if dlm_src:
        env["PYTHONPATH"] = os.path.abspath(dlm_src)
    env["DLM_SNAPSHOT_EVERY"] = str(10**9)  # the log is replayed whole, never a snapshot
    cluster.env = env
    return cluster


def _applied(cluster: DlmCluster, i: int) -> tuple[int, int, str | None]:
    view = cluster._client.member_status(cluster.addrs[i], timeout=2.0)
    if view is None:
        return 0, 0, None
    return view.applied or 0, view.commit or 0, view.role


def create(args: argparse.Namespace) -> int:
    from bench import scale

    os.makedirs(args.dir, exist_ok=False)
    base = os.path.join(args.dir, "cluster")
    os.makedirs(base)
    cluster = _cluster(base, None, args.dlm_src)
    ctx = multiprocessing.get_context("spawn")
    try:
        cluster.start()
        endpoints = scale._ordered(cluster)
        seconds, errors = scale._fill(
            ctx, endpoints, 0, args.locks, procs=args.procs, prefix="replay/lock"
        )
        leader = cluster.leader_index(LEADER_TIMEOUT_S)
        commit = _applied(cluster, leader)[1]
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while any(_applied(cluster, i)[0] < commit for i in range(3)):
            if time.monotonic() > deadline:
                raise TimeoutError("the members did not all apply the log")
            time.sleep(0.1)
        print(f"{args.locks:,} locks in {seconds:.1f} s ({errors} errors); commit {commit:,}")
    finally:
        for i in range(3):
            cluster.kill(i)
        cluster._client.close()
    with open(os.path.join(args.dir, STATE_FILE), "w") as f:
        json.dump({"addrs": cluster.addrs, "commit": commit, "locks": args.locks}, f)
    return 0


def _profile_argv(cluster: DlmCluster, i: int, svg: str) -> list[str]:
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    form = ["--format", "raw"] if svg.endswith(".txt") else []  # collapsed stacks
    return [py_spy, "record", "-r", "200", *form, "-o", svg, "--", *cluster._command(i)]


def time_restarts(args: argparse.Namespace) -> int:
    with open(os.path.join(args.dir, STATE_FILE)) as f:
        state = json.load(f)
    scratch = tempfile.mkdtemp(prefix="dlm-replay-", dir=args.scratch)
    base = os.path.join(scratch, "cluster")
    shutil.copytree(os.path.join(args.dir, "cluster"), base)
    for log in os.listdir(base):
        if log.endswith(".log"):
            os.remove(os.path.join(base, log))
    cluster = _cluster(base, state["addrs"], args.dlm_src)
    times: list[float] = []
    cpus: list[float] = []
    """CPU seconds the restarted member used until caught up: less at the mercy of the
    machine's load than the wall time."""
    try:
        for i in range(3):
            if i != VICTIM:
                cluster._spawn(i)
        leader = cluster.leader_index(CATCH_UP_TIMEOUT_S)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while True:
            commit = _applied(cluster, leader)[1]
            others = [_applied(cluster, i)[0] for i in range(3) if i != VICTIM]
            if commit >= state["commit"] and min(others) >= commit:
                break  # both busy replaying no longer: the victim's restart has the CPU
            if time.monotonic() > deadline:
                raise TimeoutError("the leader did not apply its log")
            time.sleep(0.1)
        for round_no in range(args.rounds):
            started = time.monotonic()
            if args.profile and round_no == args.rounds - 1:
                with open(os.path.join(base, "n3.log"), "ab") as log:
                    cluster.procs[VICTIM] = subprocess.Popen(
                        _profile_argv(cluster, VICTIM, args.profile),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        env=cluster.env,
                    )
            else:
                cluster.restart(VICTIM)
            deadline = started + CATCH_UP_TIMEOUT_S
            elapsed = cpu = math.inf
            while time.monotonic() < deadline:
                if _applied(cluster, VICTIM)[0] >= commit:
                    elapsed = time.monotonic() - started
                    victim = cluster.procs[VICTIM]
                    assert victim is not None
                    cpu = tree_usage([victim.pid])[0].cpu_s
                    break
                time.sleep(0.02)
            times.append(elapsed)
            cpus.append(cpu)
            print(
                f"restart {round_no + 1}: {elapsed:.2f} s ({cpu:.2f} s of CPU) to apply "
                f"{commit:,} entries (load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            proc = cluster.procs[VICTIM]
            if args.profile and round_no == args.rounds - 1 and proc is not None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its profile and stops dlm
                proc.wait(timeout=60)
            else:
                cluster.kill(VICTIM)
    finally:
        cluster.stop()
        cluster._client.close()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    label = f" ({args.label})" if args.label else ""
    print(
        f"median{label}: {statistics.median(times):.2f} s of {[round(t, 2) for t in times]}; "
        f"CPU {statistics.median(cpus):.2f} s of {[round(t, 2) for t in cpus]}"
    )
    if args.json:
        with open(args.json, "a") as f:
            record = {"label": args.label, "times": times, "cpu": cpus}
            f.write(json.dumps({**record, "load": os.getloadavg()[0]}) + "\n")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replay", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("create", help="fill a cluster and keep its stopped data directories")
    make.add_argument("dir")
    make.add_argument("--locks", type=int, default=98_000)
    make.add_argument("--procs", type=int, default=2, help="load processes")
    make.add_argument("--dlm-src", default=None, help="run the members from this source tree")
    run = sub.add_parser("time", help="restart a follower of a created cluster, timed")
    run.add_argument("dir")
    run.add_argument("--rounds", type=int, default=3)
    run.add_argument("--dlm-src", default=None, help="run the members from this source tree")
    run.add_argument(
        "--profile", default=None, metavar="SVG", help="py-spy the last round (.txt: raw stacks)"
    )
    run.add_argument("--scratch", default=None, help="where the copy runs (default: /tmp)")
    run.add_argument("--label", default="")
    run.add_argument("--json", default=None, help="append the times to this file")
    run.add_argument("--keep", action="store_true", help="keep the scratch copy")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return create(args) if args.command == "create" else time_restarts(args)


if __name__ == "__main__":
    # The fill's worker processes are spawned: their functions must belong to bench.scale.
    raise SystemExit(main())
