"""A real cluster for a user's tests: member processes on loopback, kills, pauses and links.

Why child processes and not members running in the test's own process: a test must be
able to kill -9 a member and pause it (SIGSTOP) as a crash or a stall really happens, a
member must keep its heartbeats while the test's own code holds the GIL or blocks its
event loop, and a member in a process of its own can neither leak state into the test
nor be left half-stopped by it. The members are started and stopped with dlm.devcluster's
command line and stop routine (the same as ``make run``'s).

Ports: each start takes free ports from the kernel (bind to port 0); a member that finds
its port taken by the time it binds (another process got there first) exits saying so,
and the whole start is tried again on fresh ports (``START_ATTEMPTS`` times). Every wait
has a deadline. Everything started (members, links' proxies) is stopped in ``close``,
which the context manager runs also when its body raised, and at interpreter exit for a
cluster that was never closed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from dlm.client import core
from dlm.devcluster import describe_exit, member_command, stop_processes
from dlm.testing.proxy import Proxy

if TYPE_CHECKING:
    import dlm
    from dlm.client.sync import Client as RawClient

T = TypeVar("T")

START_ATTEMPTS = 3
"""Starts tried on fresh ports when a member found its port taken."""
STOP_GRACE = 5.0
"""Seconds a member has to stop on SIGTERM before SIGKILL."""
PROBE_TIMEOUT = 0.5
"""How long one member has to answer a status probe."""
POLL = 0.05
_PORT_TAKEN = "already in use"


class ClusterError(RuntimeError):
    """The test cluster could not do what was asked (it did not start, no leader in time)."""


class _View(NamedTuple):
    """What a member says of one partition: who it is, its role, term and leader."""

    node: str | None
    role: str | None
    term: int
    leader: str | None

    @classmethod
    def of(cls, reply: dict[str, Any]) -> _View:
        def text(name: str) -> str | None:
            value = reply.get(name)
            return value if isinstance(value, str) else None

        term = reply.get("term")
        return cls(text("node"), text("role"), term if isinstance(term, int) else 0, text("leader"))


class Member:
    """One member: its id, address, data directory and log, and its process (if running)."""

    def __init__(self, name: str, port: int, base: Path) -> None:
        self.name = name
        self.port = port
        self.data_dir = base / name
        self.log_path = base / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The PID of its process while it runs (None once it stopped)."""
        return self.proc.pid if self.alive and self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.alive else "stopped"
        return f"<Member {self.name} {self.address} {state}>"


MemberRef = Member | str


class _LinkRouter(core.Router):
    """Routes a client through a link: a leader named in a redirect by its own address is
    reached through the link's proxy for it, so the client never steps around the link."""

    def __init__(self, base: core.Router, through: Mapping[str, str]) -> None:
        super().__init__(base.members)
        self._turn = base._turn
        self.preferred = base.preferred
        self.through = dict(through)

    def redirect(self, addr: str, source: str | None = None) -> None:
        super().redirect(self.through.get(addr, addr), source)


def _route_through(client: Any, through: Mapping[str, str]) -> None:
    client._ctx.router = _LinkRouter(client._ctx.router, through)
    spawn = client.spawn

    def spawn_through() -> Any:
        # Renewals run from a spawned client: it must stay inside the link too.
        child = spawn()
        _route_through(child, through)
        return child

    client.spawn = spawn_through


class Link:
    """A client's own path to the cluster: one loopback proxy per member. Clients made
    from the link (``client()``) reach every member only through it; ``cut()`` drops
    every byte both ways (silence, as in a partition, for the link's clients alone), and
    ``restore()`` lets bytes through again (connections that lost bytes are closed, so
    the clients reconnect). Closed with the cluster."""

    def __init__(self, owner: Cluster) -> None:
        self._owner = owner
        self.proxies: dict[str, Proxy] = {}
        try:
            for member in owner.members:
                self.proxies[member.address] = Proxy(member.address).start()
        except BaseException:
            self.close()
            raise

    @property
    def cluster(self) -> str:
        """The --cluster string that goes through this link."""
        return ",".join(p.address for p in self.proxies.values())

    @property
    def through(self) -> dict[str, str]:
        """Each member's own address -> the link's address for it."""
        return {addr: p.address for addr, p in self.proxies.items()}

    def client(self, **options: Any) -> dlm.Client:
        """A ``dlm.Client`` that talks to the cluster only through this link."""
        client = self._owner.client(cluster=self.cluster, **options)
        _route_through(client._base, self.through)
        return client

    def async_client(self, **options: Any) -> dlm.AsyncClient:
        """A ``dlm.AsyncClient`` that talks to the cluster only through this link."""
        client = self._owner.async_client(cluster=self.cluster, **options)
        _route_through(client._base, self.through)
        return client

    def raw_client(self, **options: Any) -> RawClient:
        """dlm.client's internal client, only through this link (see Cluster.raw_client)."""
        client = self._owner.raw_client(members=self.cluster, **options)
        _route_through(client, self.through)
        return client

    def cut(self) -> None:
        """From now on no byte passes, either way, until ``restore()``."""
        for proxy in self.proxies.values():
            proxy.cut()

    def restore(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()


class Cluster:
    """``size`` members (n1, n2, ...) on free 127.0.0.1 ports under one temporary directory.

    ``election_timeout`` (a duration string, ``"300ms"``) and ``node_flags`` (more `dlm
    node start` flags) are given to every member. ``fsync=False`` (the default) runs the
    members with DLM_NO_FSYNC=1: a killed process loses nothing by it (its writes are in
    the kernel already); only a machine crash would. ``base_dir``: where the temporary
    directory goes (default: the system's). ``partitions``: the members' ``--partitions``
    (1, the default: no partitions); with more, ``start`` waits for a leader in every
    partition, and kills, pauses and resumes reach every process of a member.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        election_timeout: str | None = None,
        node_flags: Sequence[str] = (),
        fsync: bool = False,
        start_timeout: float = 30.0,
        base_dir: str | os.PathLike[str] | None = None,
        partitions: int = 1,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one member")
        from dlm.partitioning import check_partitions

        problem = check_partitions(partitions)
        if problem is not None:
            raise ValueError(problem)
        self.size = size
        self.partitions = partitions
        self.start_timeout = start_timeout
        self._flags = [*node_flags]
        if election_timeout is not None:
            self._flags += ["--election-timeout", election_timeout]
        if partitions > 1:
            self._flags += ["--partitions", str(partitions)]
        self._fsync = fsync
        self.base = Path(tempfile.mkdtemp(prefix="dlm-testing-", dir=base_dir))
        self.peer_secret_file = str(self.base / "peer.secret")
        self.secret_file = str(self.base / "client.secret")
        """The client secret: what ``dlm --secret-file`` and clients need to connect."""
        self.tls_ca: str | None = None
        """The CA clients verify the members with (None: the members serve plain TCP)."""
        self.members: list[Member] = []
        self._links: list[Link] = []
        self._cluster_id = "dlm-testing"
        self._closed = False
        self._lock = threading.Lock()
        _LIVE.add(self)  # its directory exists from here on

    # -- what a test reads --------------------------------------------------

    @property
    def cluster(self) -> str:
        """The --cluster string (``127.0.0.1:P1,127.0.0.1:P2,...``), as DLM_CLUSTER takes it."""
        return ",".join(m.address for m in self.members)

    @property
    def env(self) -> dict[str, str]:
        """The environment variables that point the `dlm` command at this cluster."""
        env = {"DLM_CLUSTER": self.cluster, "DLM_SECRET_FILE": self.secret_file}
        if self.tls_ca is not None:
            env["DLM_TLS_CA"] = self.tls_ca
        return env

    def member(self, ref: MemberRef) -> Member:
        if isinstance(ref, Member):
            return ref
        for member in self.members:
            if ref in (member.name, member.address):
                return member
        raise KeyError(f"no member {ref!r}: the members are {[m.name for m in self.members]}")

    def secret(self) -> bytes:
        from dlm.auth import load_secret

        return load_secret(self.secret_file)

    # -- clients ------------------------------------------------------------

    def client(self, **options: Any) -> dlm.Client:
        """A ``dlm.Client`` of this cluster, with its secret file (``timeout`` and the
        client's other options pass through)."""
        import dlm

        options.setdefault("secret_file", self.secret_file)
        options.setdefault("tls_ca", self.tls_ca)
        return dlm.Client(options.pop("cluster", self.cluster), **options)

    def async_client(self, **options: Any) -> dlm.AsyncClient:
        """A ``dlm.AsyncClient`` of this cluster (make it inside the event loop that uses it)."""
        import dlm

        options.setdefault("secret_file", self.secret_file)
        options.setdefault("tls_ca", self.tls_ca)
        return dlm.AsyncClient(options.pop("cluster", self.cluster), **options)

    def raw_client(self, **options: Any) -> RawClient:
        """dlm.client's internal blocking client (leases and keys by hand, as the CLI does):
        for tests of dlm itself; users want ``client()``."""
        from dlm.client.sync import Client as RawClient

        options.setdefault("secret", self.secret())
        return RawClient(options.pop("members", self.cluster), **options)

    def link(self) -> Link:
        """A new path to the cluster that ``cut()`` can silence for its own clients alone."""
        self._check_open()
        link = Link(self)
        self._links.append(link)
        return link

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> Cluster:
        """Starts every member and waits for a leader (``start_timeout``)."""
        self._check_open()
        from dlm.auth import write_secret_file

        for path in (self.peer_secret_file, self.secret_file):
            if not os.path.exists(path):
                write_secret_file(path)
        problem = ""
        for _ in range(START_ATTEMPTS):
            ports = free_ports(self.size)
            self.members = [Member(f"n{i + 1}", port, self.base) for i, port in enumerate(ports)]
            for member in self.members:
                self._spawn(member, first=True)
            try:
                self.wait_for_leaders(self.start_timeout)
                stopped = [m for m in self.members if not m.alive]
                if not stopped:
                    return self
                raise ClusterError(", ".join(f"{m.name} stopped: {m.log_tail(1)}" for m in stopped))
            except ClusterError as exc:
                problem = str(exc)
                taken = any(_PORT_TAKEN in m.log_tail() for m in self.members if not m.alive)
                self._stop_members()
                if not taken:
                    break
                for member in self.members:
                    shutil.rmtree(member.data_dir, ignore_errors=True)
        self.close()
        raise ClusterError(f"the test cluster did not start: {problem}")

    def close(self) -> None:
        """Stops every process started (by PID) and every link, and removes the data."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            for link in self._links:
                with contextlib.suppress(Exception):
                    link.close()
            self._stop_members()
        finally:
            _LIVE.discard(self)
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            # The members' last words, for the failed test's report (the logs go away).
            for member in self.members:
                exc.add_note(f"--- {member.name} ({member.address}) log:\n{member.log_tail()}")
        self.close()

    # -- faults -------------------------------------------------------------

    def kill(self, ref: MemberRef) -> Member:
        """kill -9 the member (each of its processes), and reap it."""
        member = self.member(ref)
        if member.proc is not None and member.proc.poll() is None:
            children = _children(member.proc.pid)
            member.proc.kill()
            _kill_all(children)
            member.proc.wait(timeout=STOP_GRACE)
        member.paused = False
        return member

    def kill_leader(self, timeout: float = 10.0) -> Member:
        """kill -9 the current leader (waiting up to ``timeout`` for one); returns it."""
        return self.kill(self.wait_for_leader(timeout))

    def restart(self, ref: MemberRef) -> Member:
        """Starts the member again on its address and data (killing it first if it runs);
        it rejoins the cluster and catches up on its own."""
        member = self.kill(ref)
        self._check_open()
        self._spawn(member, first=False)
        return member

    def pause(self, ref: MemberRef) -> Member:
        """SIGSTOP: the member stalls, its sockets stay open (a long GC pause, a frozen VM)."""
        member = self._running(ref)
        assert member.proc is not None
        _signal_member(member.proc.pid, signal.SIGSTOP)
        member.paused = True
        return member

    def resume(self, ref: MemberRef) -> Member:
        member = self._running(ref)
        assert member.proc is not None
        _signal_member(member.proc.pid, signal.SIGCONT)
        member.paused = False
        return member

    # -- waiting ------------------------------------------------------------

    def leader(self, partition: int = 0) -> Member | None:
        """The member that says it leads ``partition``, in its newest term, named by a
        majority; None if no member is such now."""
        views: list[_View] = []
        live = [m for m in self.members if m.alive and not m.paused]
        if partition == 0:
            with self.raw_client(timeout=PROBE_TIMEOUT) as probe:
                for member in live:
                    view = probe.member_status(member.address, timeout=PROBE_TIMEOUT)
                    if view is not None:
                        views.append(_View(view.node, view.role, view.term or 0, view.leader))
        else:
            from dlm.testing.probe import partition_status

            for member in live:
                reply = partition_status(
                    member.address,
                    partition,
                    secret=self.secret(),
                    tls_ca=self.tls_ca,
                    timeout=PROBE_TIMEOUT,
                )
                if reply is not None:
                    views.append(_View.of(reply))
        if not views:
            return None
        term = max(v.term for v in views)
        named = [v.leader for v in views if v.term == term]
        for seen in views:
            if (
                seen.role == "leader"
                and seen.term == term
                and named.count(seen.node) > self.size // 2
            ):
                return self.member(str(seen.node))
        return None

    def wait_for_leader(
        self, timeout: float = 10.0, *, not_: MemberRef | None = None, partition: int = 0
    ) -> Member:
        """The leader of ``partition``, once there is one (other than ``not_``);
        ClusterError after ``timeout`` seconds."""
        avoid = self.member(not_) if not_ is not None else None

        def found() -> Member | None:
            leader = self.leader(partition)
            return leader if leader is not None and leader is not avoid else None

        what = "a leader" if self.partitions == 1 else f"a leader of partition {partition}"
        try:
            return _wait_for(found, timeout, what, self.members)
        except ClusterError as exc:
            logs = "\n".join(
                f"--- {m.name} ({'running' if m.alive else 'not running'}):\n{m.log_tail(8)}"
                for m in self.members
            )
            raise ClusterError(f"{exc}\n{logs}") from None

    def wait_for_leaders(
        self, timeout: float = 10.0, *, not_: MemberRef | None = None
    ) -> dict[int, Member]:
        """Every partition's leader (other than ``not_``), by partition, once each has one;
        ClusterError after ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        return {
            partition: self.wait_for_leader(
                max(POLL, deadline - time.monotonic()), not_=not_, partition=partition
            )
            for partition in range(self.partitions)
        }

    # -- inside -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClusterError("this test cluster was closed")

    def _running(self, ref: MemberRef) -> Member:
        member = self.member(ref)
        if not member.alive:
            raise ClusterError(f"{member.name} is not running")
        return member

    def _spawn(self, member: Member, *, first: bool) -> None:
        peers = ",".join(f"{m.name}={m.address}" for m in self.members)
        command = member_command(
            member.name,
            member.address,
            member.data_dir,
            self._cluster_id,
            # Read at the first start only; a restart finds the members in its data.
            peers=peers if first else None,
            flags=[
                "--peer-secret-file",
                self.peer_secret_file,
                "--client-secret-file",
                self.secret_file,
                *self._flags,
            ],
        )
        with open(member.log_path, "ab") as log:
            member.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.base,
                env=self._member_env(),
            )
        member.paused = False

    def _member_env(self) -> dict[str, str]:
        # The user's own member settings (DLM_NODE_*) must not reach the test's members.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLM_NODE_")}
        if not self._fsync:
            env["DLM_NO_FSYNC"] = "1"
        # The members run the same dlm as the test imported.
        code = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code, env.get("PYTHONPATH")]))
        return env

    def _stop_members(self) -> None:
        procs = {m.name: m.proc for m in self.members if m.proc is not None}
        children = [pid for proc in procs.values() for pid in _children(proc.pid)]
        stop_processes(procs, STOP_GRACE)
        # A supervisor stops its partition processes; one that had to be killed leaves
        # them to stop when they notice, which they are not left to do here.
        _kill_all(children)
        for member in self.members:
            member.paused = False


_LIVE: set[Cluster] = set()
"""Clusters made and not closed: closed at interpreter exit at the latest."""


@atexit.register
def _close_forgotten() -> None:
    for left in list(_LIVE):
        left.close()


@contextlib.contextmanager
def cluster(size: int = 3, **options: Any) -> Iterator[Cluster]:
    """``with dlm.testing.cluster(3) as c:`` a started cluster with a leader; every process
    stopped and the data removed when the block ends, however it ends."""
    with Cluster(size, **options) as started:
        yield started


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (a partitioned member's partition processes)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _kill_all(pids: Sequence[int]) -> None:
    """kill -9 each of ``pids`` still running, and wait (bounded) until none runs."""
    for pid in pids:
        if _running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_GRACE
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(POLL)


def _signal_member(pid: int, signum: int) -> None:
    """``signum`` to a member's process and each of its partition processes."""
    for target in (*_children(pid), pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signum)


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_next_port: list[int] = []
"""Where this process looks for its next listening port (see ``free_ports``)."""


def _listening_ports() -> tuple[int, int] | None:
    """Ports below the kernel's ephemeral range (which outgoing connections draw from),
    or None where that range is unknown."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (10_000, low - 1) if low > 12_000 else None


def free_ports(count: int) -> list[int]:
    """Ports free now, all different (held open together while chosen).

    A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, which
    outgoing connections use too: a test's own client connection could take it in the
    moment before the member binds it, and that member then fails to start. So ports
    are taken below that range, each process from its own starting point (pid), in turn.
    """
    span = _listening_ports()
    socks: list[socket.socket] = []
    try:
        if span is None:
            for _ in range(count):
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                socks.append(s)
        else:
            low, high = span
            size = high - low + 1
            if not _next_port:
                _next_port.append(low + (os.getpid() * 7_919) % size)
            for _ in range(size):
                if len(socks) == count:
                    break
                port = _next_port[0]
                _next_port[0] = low + (port - low + 1) % size
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
            if len(socks) < count:
                raise OSError(f"no {count} free ports between {low} and {high}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_for(
    condition: Callable[[], T | None], timeout: float, what: str, members: Sequence[Member]
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if members and all(m.proc is not None and not m.alive for m in members):
            exits = ", ".join(
                f"{m.name} {describe_exit(m.proc.returncode)}" for m in members if m.proc
            )
            raise ClusterError(f"no {what}: every member stopped ({exits})")
        if time.monotonic() > deadline:
            raise ClusterError(f"no {what} within {timeout:g}s")
        time.sleep(POLL)
