"""One chaos run: a real cluster on 127.0.0.1, a workload, a fault schedule, a history.

Topology
--------
Every member of the first configuration reaches every other through a
proxy of its own (``n1>n2`` carries what n1 sends n2: a member only *sends*
on the connection it dials, see dlm/node/runtime/peers.py), by giving each member its
own ``--peers`` in which the others' addresses are those proxies. So a
one-way cut is one proxy cut, and a partition is the set of proxies between
two groups. Two clients, the library worker ``w0`` and the exec lane ``x0``,
reach each member through proxies of their own (``w0@n1``): their partitions
cut only them. Every client follows redirects through a map (routed.py), so a
client never takes a path between members. Members that join later listen on
their real address, not behind a proxy; they reach the first members through
the addresses the member that added them knows (its own proxies).

Workload
--------
Library workers (worker.py): ``w0`` (behind its proxies), ``w1`` (careless:
it writes without looking at its deadline, the zombie maker) and ``w2``; a
prober (an acquire and release every 100 ms: the availability timeline); two
`dlm exec` lanes (``x0`` behind its proxies, ``x1``), each running
``dlm exec --lock KEY --ttl 2s -- python -m tests.chaos.critical`` in a loop.
Every one of them does read-modify-writes on the fenced store (store.py).

A run: start, let the workload warm up, inject the faults one after the other,
heal everything, then kill every lock holder (SIGKILL) and time how long each
key takes to be granted again; stop everything by PID, read the histories and
the members' audit logs, and check (checker.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlm.client import DlmError
from dlm.client.sync import Client
from tests.chaos import history as history_mod
from tests.chaos.checker import Verdict, check
from tests.chaos.netproxy import Network
from tests.chaos.record import Recorder, read_records
from tests.chaos.schedule import MEMBERSHIP_KINDS, Fault, Schedule
from tests.chaos.store import StoreServer
from tests.cluster.harness import REPO, Cluster, NodeProc, free_ports, wait_for

TTL_MS = 2000
TTL = "2s"
KEYS = ("k0", "k1", "k2")
ELECTION_TIMEOUT_MAX_S = 0.6
"""Twice the configured election timeout: the core draws one between 300 and 600 ms."""
RECOVERY_SLACK_S = 1.5
"""What a loaded 2-core machine adds to TTL + election before a dead holder's lock is free."""
RECOVERY_BOUND_S = TTL_MS / 1000 + ELECTION_TIMEOUT_MAX_S + RECOVERY_SLACK_S
REMOVE_RETRY_S = 10.0
SPARES = 2
"""Members that may join during a run (replace-member faults)."""
PROXIED_CLIENTS = ("w0", "x0")
"""The clients that reach the members through proxies of their own (their partitions)."""
LONG_WORK_S = 4.0
"""How long CMD works in the exec run a client fault is aimed at: past the TTL, so that the
lease must be renewed while it runs."""


class Member(NodeProc):
    """A member with its own ``--peers`` (the proxies it uses), or one that joins."""

    def __init__(self, cluster: Cluster, node_id: str, port: int) -> None:
        super().__init__(cluster, node_id, port)
        self.peers_flag = ""
        self.join = ()
        self.extra_env: dict[str, str] = {}
        self.is_member = False
        self.joined = False

    def command(self) -> list[str]:
        mutant = os.environ.get("DLM_CHAOS_MUTANT")
        launcher = ["tests.chaos.mutant_node", mutant] if mutant else ["dlm"]
        base = [
            sys.executable, "-m", *launcher, "node", "start", "--id", self.node_id,
            "--listen", self.address, "--data", str(self.data_dir),
            "--cluster-id", self.cluster.cluster_id,
            # Authenticated peers: a removed member believes only a proved refusal.
            "--peer-secret-file", str(self.cluster.base / "peer.secret"),
        ]  # fmt: skip
        if self.join:
            return [*base, "--join", ",".join(self.join)]
        return [*base, "--peers", self.peers_flag]

    def start(self) -> None:
        assert not self.alive, f"{self.node_id} is already running"
        env = dict(os.environ)
        env["DLM_LOG_LEVEL"] = "info"
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("DLM_TEST_FSYNC_DELAY_MS", None)
        env.pop("DLM_CHAOS_MUTANT", None)
        env.update(self.extra_env)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=log, cwd=self.cluster.base, env=env
            )
        self.paused = False


class ChaosCluster(Cluster):
    """The first members and the spares that may join; majorities count members only."""

    def __init__(self, base: Path, size: int, ports: list[int]) -> None:
        # Not Cluster.__init__: the ports come from the run's one allocation (proxies too),
        # and the members are Member objects; the rest is Cluster's plain defaults.
        self.base = base
        self.env = {}
        self.cluster_id = "chaos"
        self.node_args = lambda _: []
        self.client_secret = None
        self.client_tls = None
        self.open_files = None
        self.partitions = 1
        self.retired: dict[str, NodeProc] = {}
        self.nodes: dict[str, NodeProc] = {}
        self.members: dict[str, Member] = {}
        for i, port in enumerate(ports):
            node = Member(self, f"n{i + 1}", port)
            self.nodes[node.node_id] = node
            self.members[node.node_id] = node
            node.is_member = i < size
        self.first = [m for m in self.members.values() if m.is_member]
        self.spares = [m for m in self.members.values() if not m.is_member]
        self.peers_flag = ""
        if not (base / "peer.secret").exists():
            from dlm.auth import write_secret_file

            base.mkdir(parents=True, exist_ok=True)
            write_secret_file(str(base / "peer.secret"))

    def current(self) -> list[Member]:
        return [m for m in self.members.values() if m.is_member]

    def leader_now(self, partition: int = 0) -> NodeProc | None:
        members = self.current()
        views = [s for s in (n.status(partition=partition) for n in members) if s is not None]
        if not views:
            return None
        term = max(v["term"] for v in views)
        named = [v["leader"] for v in views if v["term"] == term and v["leader"]]
        majority = len(members) // 2 + 1
        for view in views:
            node = self.members.get(view["node"])
            if (
                node is not None
                and node.is_member
                and view["role"] == "leader"
                and view["term"] == term
                and named.count(view["node"]) >= majority
            ):
                return node
        return None


@dataclass
class ExecLane:
    """A thread running `dlm exec` again and again; ``current`` is the run in progress."""

    name: str
    cluster: list[str]
    routes: dict[str, str]
    directory: Path
    rng: random.Random
    proc: subprocess.Popen[bytes] | None = None
    run_id: str | None = None
    runs: int = 0
    stopping: bool = False
    long_next: bool = False
    """The next run's CMD works past the TTL (a fault is waiting to hit it)."""
    long_run: str | None = None
    thread: threading.Thread | None = None
    cmd_pids: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    schedule: Schedule
    verdict: Verdict
    history: Any
    faults: list[dict[str, Any]]
    probes: list[tuple[float, float, bool]]
    """(call, ret, ok) of every probe acquire: the availability timeline."""
    started: float
    ended: float
    healed: float
    workdir: Path
    notes: list[str]


class ChaosRun:
    def __init__(self, schedule: Schedule, workdir: Path) -> None:
        self.schedule = schedule
        self.workdir = workdir
        self.rng = random.Random(f"run-{schedule.seed}")
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "hist").mkdir(exist_ok=True)
        # Every port of the run in one go (members, spares, proxies, the store): ports
        # chosen one at a time could come back twice, once released.
        size = schedule.size
        proxies = size * (size - 1) + len(PROXIED_CLIENTS) * size
        ports = free_ports(size + SPARES + proxies + 1)
        self.cluster = ChaosCluster(workdir / "cluster", size, ports[: size + SPARES])
        self.proxy_ports = ports[size + SPARES : -1]
        self.store_port = ports[-1]
        (workdir / "cluster").mkdir(exist_ok=True)
        self.events = Recorder(workdir / "hist" / "runner.jsonl", "runner")
        self.notes: list[str] = []
        self.faults: list[dict[str, Any]] = []
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.worker_status: dict[str, Path] = {}
        self.lanes: dict[str, ExecLane] = {}
        self.paused_pids: set[int] = set()
        self.killed_members: set[str] = set()
        self.slow_members: set[str] = set()
        self.cut_links: set[str] = set()
        self.store: StoreServer | None = None
        self.net: Network | None = None
        self.replacements = 0

    # -- set-up ----------------------------------------------------------------------

    def _links(self) -> dict[str, tuple[int, str]]:
        """Each proxy: its name, the port it listens on, the member it leads to."""
        links: dict[str, str] = {}
        for a in self.cluster.first:
            for b in self.cluster.first:
                if a is not b:
                    links[f"{a.node_id}>{b.node_id}"] = b.address
        for client in PROXIED_CLIENTS:
            for m in self.cluster.first:
                links[f"{client}@{m.node_id}"] = m.address
        pairs = zip(links.items(), self.proxy_ports, strict=True)
        return {name: (port, upstream) for (name, upstream), port in pairs}

    def routes_for(self, client: str | None) -> dict[str, str]:
        """Where this client goes when a redirect names an address: its own proxy for that
        member if it has one, else the member's real address."""
        assert self.net is not None
        routes: dict[str, str] = {}
        for name, addr in self.net.addresses.items():
            if ">" in name:
                target = name.split(">")[1]
                routes[addr] = self._client_address(client, target)
        for m in self.cluster.first:
            routes[m.address] = self._client_address(client, m.node_id)
        return routes

    def _client_address(self, client: str | None, member: str) -> str:
        assert self.net is not None
        proxied = self.net.addresses.get(f"{client}@{member}")
        return proxied or self.cluster.members[member].address

    def cluster_list(self, client: str | None) -> list[str]:
        return [self._client_address(client, m.node_id) for m in self.cluster.first]

    def setup(self) -> None:
        self.store = StoreServer(self.workdir / "hist" / "store.jsonl", self.store_port).start()
        self.net = Network(self._links(), self.workdir / "netproxy.log")
        for m in self.cluster.first:
            peers = []
            for other in self.cluster.first:
                addr = (
                    m.address if other is m else self.net.addresses[f"{m.node_id}>{other.node_id}"]
                )
                peers.append(f"{other.node_id}={addr}")
            m.peers_flag = ",".join(peers)
        for m in self.cluster.first:
            m.start()
        self.cluster.wait_for_leader(timeout=20.0)
        dead = [m for m in self.cluster.first if not m.alive]
        if dead:  # a run with a member missing from the start would test something else
            raise RuntimeError(
                "members did not start: " + "; ".join(f"{m.node_id}: {m.log_tail(3)}" for m in dead)
            )

    def _start_worker(self, name: str, **extra: Any) -> None:
        assert self.store is not None
        status = self.workdir / "hist" / f"{name}.status"
        routed_as = name if name == "w0" else None
        config = {
            "name": name,
            "seed": self.rng.randrange(1 << 30),
            "cluster": self.cluster_list(routed_as),
            "routes": self.routes_for(routed_as),
            "store": self.store.address,
            "history": str(self.workdir / "hist" / f"{name}.jsonl"),
            "status": str(status),
            "keys": list(KEYS),
            "ttl_ms": TTL_MS,
            **extra,
        }
        path = self.workdir / "hist" / f"{name}.config.json"
        path.write_text(json.dumps(config))
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.workdir / "hist" / f"{name}.out", "ab") as out:
            self.workers[name] = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.worker", str(path)],
                cwd=REPO, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.worker_status[name] = status

    def _start_lane(self, name: str) -> None:
        routed_as = name if name == "x0" else None
        lane = ExecLane(
            name,
            self.cluster_list(routed_as),
            self.routes_for(routed_as),
            self.workdir / "hist" / name,
            random.Random(self.rng.randrange(1 << 30)),
        )
        lane.directory.mkdir(exist_ok=True)
        lane.thread = threading.Thread(target=self._lane_loop, args=(lane,), daemon=True)
        self.lanes[name] = lane
        lane.thread.start()

    def _lane_loop(self, lane: ExecLane) -> None:
        assert self.store is not None
        rec = Recorder(lane.directory / "runs.jsonl", lane.name)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["DLM_CLUSTER"] = ",".join(lane.cluster)
        env["DLM_CHAOS_ROUTES"] = json.dumps(lane.routes)
        for name in ("DLM_LOCK_KEY", "DLM_FENCING_TOKEN", "DLM_LEASE_ID", "DLM_LEASE_TTL_MS"):
            env.pop(name, None)
        while not lane.stopping:
            lane.runs += 1
            run_id = f"{lane.name}-{lane.runs}"
            key = lane.rng.choice(KEYS)
            wait = lane.rng.random() < 0.4
            work = round(lane.rng.uniform(0.1, 0.5), 3)
            if lane.long_next:
                lane.long_next, lane.long_run, work, wait = False, run_id, LONG_WORK_S, True
            events = lane.directory / f"{run_id}.jsonl"
            argv = [
                sys.executable, "-m", "tests.chaos.routed", "exec", "--lock", key, "--ttl", TTL,
                "--timeout", "5s", *(["--wait", "1s"] if wait else []), "--",
                sys.executable, "-m", "tests.chaos.critical", self.store.address, str(events),
                run_id, str(work),
            ]  # fmt: skip
            with open(lane.directory / f"{run_id}.out", "wb") as out:
                started = time.monotonic()
                proc = subprocess.Popen(
                    argv, cwd=REPO, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL
                )
                rec.event("exec_start", run=run_id, pid=proc.pid, key=key, wait=wait,
                          started=started)  # fmt: skip
                lane.proc, lane.run_id = proc, run_id
                try:
                    code = proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    code = proc.wait(timeout=10)
                rec.event("exec_end", run=run_id, code=code)
            lane.proc = None
            for item in read_records(events):
                if item.get("k") == "cmd_start" and isinstance(item.get("pid"), int):
                    lane.cmd_pids.append(item["pid"])
            time.sleep(lane.rng.uniform(0.05, 0.3))
        rec.close()

    # -- helpers for faults ------------------------------------------------------------

    def leader(self, timeout: float = 8.0) -> Member | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.cluster.leader_now()
            if isinstance(leader, Member):
                return leader
            time.sleep(0.05)
        return None

    def _member(self, rng: random.Random, leader: bool) -> Member | None:
        current = [m for m in self.cluster.current() if m.alive and not m.paused]
        lead = self.leader()
        if leader and lead is not None:
            return lead
        followers = [m for m in current if m is not lead]
        return rng.choice(followers) if followers else None

    def _links_between(self, group: set[str], others: set[str]) -> list[str]:
        assert self.net is not None
        names = []
        for a in group:
            for b in others:
                for name in (f"{a}>{b}", f"{b}>{a}"):
                    if name in self.net.addresses:
                        names.append(name)
        return names

    def _in_section(self, name: str, timeout: float = 4.0) -> bool:
        status = self.worker_status.get(name)

        def inside() -> bool:
            try:
                return status is not None and status.read_text() == "1"
            except OSError:
                return False

        try:
            wait_for(inside, timeout, f"{name} in a critical section", interval=0.01)
        except AssertionError:
            return False
        return True

    def _running_exec(self, lane: ExecLane, timeout: float = 10.0) -> tuple[int, int, str] | None:
        """(supervisor pid, CMD pid, run id) once a run of the lane whose CMD works past the
        TTL has started CMD (the lane's next run is made one)."""
        lane.long_next = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc, run_id = lane.proc, lane.run_id
            if (
                proc is not None
                and run_id is not None
                and run_id == lane.long_run
                and proc.poll() is None
            ):
                for item in read_records(lane.directory / f"{run_id}.jsonl"):
                    if item.get("k") == "cmd_start" and not any(
                        i.get("k") == "cmd_end"
                        for i in read_records(lane.directory / f"{run_id}.jsonl")
                    ):
                        return proc.pid, int(item["pid"]), run_id
            time.sleep(0.01)
        return None

    def _signal(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGSTOP:
            self.paused_pids.add(pid)
        elif sig == signal.SIGCONT:
            self.paused_pids.discard(pid)

    # -- the faults --------------------------------------------------------------------

    def start_fault(self, fault: Fault) -> tuple[str, Callable[[], None] | None]:
        """Starts ``fault``; returns what it hit and how to end it (None: nothing to end)."""
        rng = random.Random(fault.seed)
        kind, p = fault.kind, fault.params
        assert self.net is not None
        net = self.net
        if kind in ("kill-leader", "kill-follower"):
            m = self._member(rng, kind == "kill-leader")
            if m is None:
                return "skipped: no such member", None
            member: Member = m
            member.kill()
            self.killed_members.add(member.node_id)
            self.events.event("member_killed", member=member.node_id, leader=kind == "kill-leader")

            def restart() -> None:
                self.killed_members.discard(member.node_id)
                if member.is_member and not member.alive:
                    member.start()

            return member.node_id, restart
        if kind == "pause-member":
            m = self._member(rng, p["leader"])
            if m is None:
                return "skipped: no such member", None
            paused: Member = m
            paused.pause()
            self.paused_pids.add(paused.pid)

            def resume() -> None:
                if paused.alive:
                    paused.resume()
                    self.paused_pids.discard(paused.pid)

            return paused.node_id, resume
        if kind == "restart":
            m = self._member(rng, p["leader"])
            if m is None:
                return "skipped: no such member", None
            m.terminate(grace=5.0)
            if m.is_member:
                m.start()
            return m.node_id, None
        if kind == "slow-disk":
            m = self._member(rng, p["leader"])
            if m is None:
                return "skipped: no such member", None
            slowed: Member = m
            slowed.extra_env = {"DLM_TEST_FSYNC_DELAY_MS": str(p["fsync_ms"])}
            slowed.restart()
            self.slow_members.add(slowed.node_id)

            def fast() -> None:
                slowed.extra_env = {}
                self.slow_members.discard(slowed.node_id)
                if slowed.is_member:
                    slowed.restart()

            return slowed.node_id, fast
        if kind == "partition":
            current = {m.node_id for m in self.cluster.current()}
            lead = self.leader()
            lead_id = lead.node_id if lead is not None else rng.choice(sorted(current))
            if p["split"] == "isolate-leader":
                group = {lead_id}
            elif p["split"] == "minority":
                group = set(rng.sample(sorted(current), (len(current) - 1) // 2 or 1))
            else:  # a majority that leaves the leader with the minority
                rest = sorted(current - {lead_id})
                group = set(rng.sample(rest, len(current) // 2 + 1)) if rest else set()
            links = self._links_between(group, current - group)
            net.cut(links)
            self.cut_links.update(links)
            return f"{sorted(group)} | {sorted(current - group)}", lambda: self._heal(links)
        if kind == "one-way":
            lead = self.leader()
            if lead is None:
                return "skipped: no leader", None
            others = {m.node_id for m in self.cluster.current()} - {lead.node_id}
            if p["way"] == "leader-mute":
                links = [f"{lead.node_id}>{o}" for o in others]
            elif p["way"] == "leader-deaf":
                links = [f"{o}>{lead.node_id}" for o in others]
            else:
                links = [f"{rng.choice(sorted(others))}>{lead.node_id}"] if others else []
            links = [name for name in links if name in net.addresses]
            net.cut(links)
            self.cut_links.update(links)
            return ",".join(links) or "skipped: no links", lambda: self._heal(links)
        if kind == "delay":
            m = self._member(rng, p["leader"])
            if m is None:
                return "skipped: no such member", None
            others = {x.node_id for x in self.cluster.current()} - {m.node_id}
            links = self._links_between({m.node_id}, others)
            net.delay(links, p["seconds"])
            self.cut_links.update(links)
            return f"{m.node_id} ({p['seconds']}s)", lambda: self._heal(links)
        if kind in ("replace-member", "replace-leader"):
            return self._replace(rng, kind == "replace-leader"), None
        if kind == "pause-client":
            name = "w1"
            proc = self.workers.get(name)
            if proc is None or proc.poll() is not None or not self._in_section(name):
                return "skipped: w1 not in a section", None
            self._signal(proc.pid, signal.SIGSTOP)
            self.events.event("client_paused", client=name)
            return name, lambda: self._signal(proc.pid, signal.SIGCONT)
        if kind in ("pause-exec", "freeze-exec", "kill-exec"):
            lane = self.lanes["x1"]
            running = self._running_exec(lane)
            if running is None:
                return "skipped: no exec running", None
            supervisor, cmd, run_id = running
            if kind == "kill-exec":
                self._signal(supervisor, signal.SIGKILL)
                return run_id, None
            if kind == "pause-exec":
                self._signal(supervisor, signal.SIGSTOP)
                return run_id, lambda: self._signal(supervisor, signal.SIGCONT)
            guard = _parent_of(cmd)
            pids = [pid for pid in (guard, supervisor, cmd) if pid is not None]
            self.events.event("frozen", run=run_id)
            for pid in pids:
                self._signal(pid, signal.SIGSTOP)

            def thaw() -> None:
                for pid in pids:
                    self._signal(pid, signal.SIGCONT)

            return run_id, thaw
        if kind == "kill-client":
            candidates = [n for n in ("w2", "w0") if n in self.workers]
            name = next((n for n in candidates if self._in_section(n, 2.0)), candidates[0])
            proc = self.workers.pop(name)
            self._signal(proc.pid, signal.SIGKILL)
            proc.wait(10)
            self.events.event("killed", victim=name)
            self.replacements += 1
            fresh = f"{name}r{self.replacements}"
            self._start_worker(fresh)
            return f"{name} (replaced by {fresh})", None
        if kind == "client-partition":
            client = "w0" if p["client"] == "library" else "x0"
            links = [name for name in net.addresses if name.startswith(f"{client}@")]
            if p.get("delay"):
                net.delay(links, p["delay"], p["dirs"])
                how = f"slowed {p['delay']}s"
            else:
                net.cut(links, p["dirs"])
                how = "cut"
            self.cut_links.update(links)
            return f"{client} {how} {'+'.join(p['dirs'])}", lambda: self._heal(links)
        raise ValueError(f"unknown fault kind {kind!r}")

    def _heal(self, links: list[str]) -> None:
        assert self.net is not None
        self.net.heal(links)
        self.cut_links.difference_update(links)

    def _replace(self, rng: random.Random, leader: bool) -> str:
        """A spare joins; once it is a voter, a member (the leader, or another) is removed."""
        if not self.cluster.spares:
            return "skipped: no spare left"
        spare = self.cluster.spares.pop(0)
        current = self.cluster.current()
        spare.join = tuple(m.address for m in current)
        spare.start()
        spare.joined = True
        with Client([m.address for m in current], timeout=10.0) as client:
            try:
                wait_for(lambda: _is_voter(client, spare.node_id), 30.0, f"{spare.node_id} a voter")
            except AssertionError:
                return f"{spare.node_id} joined but was not promoted within 30s"
            spare.is_member = True
            lead = self.leader()
            others = [m for m in current if m is not lead]
            victim = lead if leader and lead is not None else rng.choice(others)
            # The leader refuses a removal that would leave it without a quorum it can see
            # (UNSAFE); right after a promotion, or a healed fault, its view may lag.
            refusal = _remove(client, victim.node_id, REMOVE_RETRY_S)
            if refusal is not None:
                return f"+{spare.node_id}; removing {victim.node_id} failed: {refusal}"
        victim.is_member = False
        try:
            wait_for(lambda: not victim.alive, 15.0, f"{victim.node_id} to stop")
        except AssertionError:
            victim.terminate()
        return f"+{spare.node_id} -{victim.node_id}"

    def heal_all(self) -> None:
        """Every fault ends: links healed, processes resumed, members back at full speed."""
        assert self.net is not None
        self.net.heal(sorted(self.cut_links))
        self.cut_links.clear()
        for pid in list(self.paused_pids):
            self._signal(pid, signal.SIGCONT)
        for m in self.cluster.current():
            if m.node_id in self.slow_members:
                m.extra_env = {}
                m.restart()
            elif not m.alive:
                m.start()
        self.slow_members.clear()
        for m in self.cluster.current():
            try:
                wait_for(m.status, 10.0, f"{m.node_id} to answer after healing")
            except AssertionError:
                self.notes.append(
                    f"harness: {m.node_id} is not serving after the faults healed: {m.log_tail(3)}"
                )

    # -- the run -------------------------------------------------------------------------

    def run(self) -> RunResult:
        started = self.events.event(
            "run_started", seed=self.schedule.seed, profile=self.schedule.profile
        )
        healed = started
        try:
            self.setup()
            self._start_worker("w0")
            self._start_worker("w1", careless=True, work=(0.3, 0.9))
            self._start_worker("w2")
            self._start_worker(
                "p0", mode="probe", key="probe", interval=0.1, timeout=1.0, attempt_timeout=0.3
            )
            for lane in ("x0", "x1"):
                self._start_lane(lane)
            t0 = time.monotonic()
            self.events.event("workload_started")
            for fault in self.schedule.faults:
                _sleep_until(t0 + fault.at)
                begin = time.monotonic()
                try:
                    target, end = self.start_fault(fault)
                except Exception as exc:  # a fault that could not be injected is a note
                    target, end = f"failed: {exc!r}", None
                    self.notes.append(f"{fault.describe()}: {exc!r}")
                # A fault starts when it hits, after its target was found (the leader, a
                # client inside a section); a membership change is all of its steps.
                if fault.kind not in MEMBERSHIP_KINDS:
                    begin = time.monotonic()
                record = {"kind": fault.kind, "target": target, "start": begin,
                          "params": fault.params}  # fmt: skip
                if end is not None:
                    _sleep_until(begin + fault.duration)
                    try:
                        end()
                    except Exception as exc:
                        self.notes.append(f"ending {fault.describe()}: {exc!r}")
                record["end"] = time.monotonic()
                self.faults.append(record)
                self.events.event("fault", **record)
            _sleep_until(t0 + self.schedule.length)
            self.heal_all()
            healed = time.monotonic()
            self.events.event("healed")
            self._recover(healed)
        finally:
            self.teardown()
        return judge(self.schedule, self.workdir, self.faults, self.notes)

    def _recover(self, healed: float) -> None:
        """Kills every lock holder, then times how soon each key is granted again."""
        for lane in self.lanes.values():
            lane.stopping = True
        died = time.monotonic()
        for name, proc in list(self.workers.items()):
            if name != "p0":
                self._signal(proc.pid, signal.SIGKILL)
                self.events.event("killed", victim=name)
        for lane in self.lanes.values():
            running = lane.proc
            if running is not None:
                self._signal(running.pid, signal.SIGKILL)
        rec = Recorder(self.workdir / "hist" / "recovery.jsonl", "recovery")
        cluster = [m.address for m in self.cluster.current()]
        results: dict[str, float | None] = {}

        def recover(key: str) -> None:
            limit = RECOVERY_BOUND_S + 8.0
            with Client(cluster, timeout=limit) as client:
                try:
                    lease = client.open_lease(10_000)
                except DlmError:
                    results[key] = None
                    return
                rec.renew(lease.id, lease.confirmed_at, lease.ttl_ms)
                op = rec.call("acquire", key=key, lease=lease.id, wait=True)
                try:
                    grant = client.acquire(lease, key, wait=limit)
                except DlmError as exc:
                    rec.ret(op, "unknown" if "held" not in str(exc) else "fail",
                            detail="held" if "held" in str(exc) else str(exc)[:200])  # fmt: skip
                    results[key] = None
                else:
                    rec.ret(op, "ok", token=grant.token)
                    results[key] = time.monotonic()
                op = rec.call("close", lease=lease.id)
                try:
                    client.close_lease(lease)
                    rec.ret(op, "ok")
                except DlmError:
                    rec.ret(op, "unknown")

        threads = [threading.Thread(target=recover, args=(k,), daemon=True) for k in KEYS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RECOVERY_BOUND_S + 30)
        for key in KEYS:
            self.events.event(
                "recovery", key=key, died=died, healed=healed, available=results.get(key),
                bound=RECOVERY_BOUND_S,
            )  # fmt: skip
        rec.close()

    def teardown(self) -> None:
        """Stops every process this run started, by PID."""
        for pid in list(self.paused_pids):
            self._signal(pid, signal.SIGCONT)
        for lane in self.lanes.values():
            lane.stopping = True
            proc = lane.proc
            if proc is not None and proc.poll() is None:
                self._signal(proc.pid, signal.SIGKILL)
        for lane in self.lanes.values():
            if lane.thread is not None:
                lane.thread.join(70)
        for proc in self.workers.values():
            if proc.poll() is None:
                self._signal(proc.pid, signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                self._signal(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # CMDs are the guard's to stop; any left behind (a guard killed with them) go now.
        for lane in self.lanes.values():
            for pid in lane.cmd_pids:
                if _running(pid):
                    self._signal(pid, signal.SIGKILL)
        self.cluster.stop_all()
        if self.net is not None:
            self.net.stop()
        if self.store is not None:
            self.store.stop()
        self.events.event("run_ended")
        self.events.close()


def judge(
    schedule: Schedule,
    workdir: Path,
    faults: list[dict[str, Any]] | None = None,
    notes: list[str] | None = None,
) -> RunResult:
    """Reads a finished run's records and checks them (faults from the runner's own record
    when not given: how a run directory is checked again later)."""
    events = read_records(workdir / "hist" / "runner.jsonl")

    def moment(kind: str, default: float) -> float:
        return next((float(e["t"]) for e in events if e.get("k") == kind), default)

    if faults is None:
        faults = [
            {k: e[k] for k in ("kind", "target", "start", "end", "params")}
            for e in events
            if e.get("k") == "fault"
        ]
    started = moment("run_started", min((float(e["t"]) for e in events), default=0.0))
    ended = moment("run_ended", max((float(e["t"]) for e in events), default=started))
    hist = history_mod.load(workdir)
    verdict = check(hist)
    probes = [
        (op.call, op.ret, op.outcome == "ok")
        for op in hist.ops
        if op.client == "p0" and op.f == "acquire"
    ]
    healed = moment("healed", ended)
    return RunResult(
        schedule, verdict, hist, faults, probes, started, ended, healed, workdir, notes or []
    )


def _remove(client: Client, node: str, patience: float) -> str | None:
    """Removes ``node``, retrying while the leader says it would be unsafe; None when done."""
    deadline = time.monotonic() + patience
    while True:
        try:
            client.remove_member(node)
        except DlmError as exc:
            if "UNSAFE" not in str(exc) or time.monotonic() > deadline:
                return str(exc)
            time.sleep(0.2)
            continue
        return None


def _is_voter(client: Client, node: str) -> bool:
    try:
        view = client.members_view()
    except DlmError:
        return False
    return any(m.id == node and m.role != "learner" for m in view.members)


def _sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
