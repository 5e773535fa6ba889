"""A second load generator for dlm's own benchmark cells, sharing no code with the first.

Issue 29 (item 4) asks that the figures of dlm's own cells be confirmed by a
second, independent load generator within 25 %. bench/locks.py drives dlm
through dlm's own client library (asyncio, dlm.client, dlm.wire's codec); a
bug or a bias there (a reply taken for a grant, a latency read from the wrong
clock, a percentile off by one) would show in its figures and could not be
seen from them. This module reaches the same members by another road:

- blocking sockets in OS threads, one thread per simulated client, the threads
  spread over several worker processes (so one GIL does not cap c=64);
- its own frame encoder and decoder, written from docs/PROTOCOL.md ("Frames",
  "Connection", the request table) on the ``cbor2`` package directly: nothing
  of dlm.wire, dlm.client, dlm.cbor_codec or bench.locks is imported, no
  constant either (the protocol page names every value used here);
- the real handshake (hello, welcome), NOT_LEADER redirects followed to the
  leader, and every reply checked: a grant must name our lease and key and
  carry a fencing token above the last one this process saw for that key, a
  release must give back the token it released;
- its own clock (``time.perf_counter_ns`` around each pair), its own
  nearest-rank percentiles, its own reading of the members' CPU from
  /proc/PID/stat (each member's process tree, reaped children included).

The cells are the ones item 4 names, with bench/locks.py's definitions: a
*pair* is acquire then release by one client on its own connection and
lease, measured from sending the acquire to the release's answer; "distinct"
gives each client a key of its own, "hot" puts every client on one key with
``wait`` (FIFO queue, grant pushed). pairs/s counts the pairs that ended in
the window; latencies only those that also started in it. Server CPU per pair
is the members' CPU over the window divided by the pairs.

``make bench`` runs it after each matching cell of bench.locks, on the same
cluster (bench/locks.py calls :func:`interleaved_hook`), and its results get
a table "Second load generator". Alone::

    python -m bench.loadgen --cluster 127.0.0.1:7701,127.0.0.1:7702,127.0.0.1:7703

(the members' PIDs are found from their listening ports when they run here
as this user; ``--pids`` names them otherwise). Clusters of one partition
only: the cells item 4 names are P = 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import cbor2

# ---------------------------------------------------------------------------
# Frames (docs/PROTOCOL.md, "Frames"): a 4-byte big-endian length, then one CBOR map
# ---------------------------------------------------------------------------

REPLY_CAP_BYTES = 1 << 20
"""The largest reply body read: the replies to the requests sent here are small maps, so
a bigger length means the stream is out of step (or hostile)."""
NESTING_CAP = 16
"""PROTOCOL.md: dlm's CBOR nests at most 16 containers deep."""
INT_BOUND = 1 << 63
"""PROTOCOL.md: integers have |n| < 2^63."""


class LoadError(Exception):
    """What went wrong with one request: an error reply, a bad reply, a broken link."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """The bytes of one frame holding ``message``."""
    body: bytes = cbor2.dumps(message)
    return len(body).to_bytes(4, "big") + body


def _check_plain(value: object, depth: int = 0) -> None:
    """Refuses anything outside the CBOR subset dlm writes (PROTOCOL.md, "Frames")."""
    if depth > NESTING_CAP:
        raise LoadError("reply nested too deeply")
    if value is None or isinstance(value, (bool, str, bytes)):
        return
    if isinstance(value, int):
        if not -INT_BOUND < value < INT_BOUND:
            raise LoadError("reply integer out of range")
        return
    if isinstance(value, list):
        for item in value:
            _check_plain(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise LoadError("reply map with a key that is not text")
            _check_plain(item, depth + 1)
        return
    raise LoadError(f"reply holds a {type(value).__name__}, which dlm never sends")


def decode_body(body: bytes) -> dict[str, Any]:
    """One frame's body as a map; LoadError for anything else.

    dlm writes each item in its shortest form, definite lengths, no tags; so a body is
    taken only if encoding what it decoded to gives its bytes back. That refuses tags
    (a bignum decodes to a plain int), indefinite lengths, long forms and bytes after the
    item without a CBOR walker of our own."""
    try:
        value = cbor2.loads(body)
    except Exception as exc:
        raise LoadError(f"reply is not CBOR: {exc}") from None
    if not isinstance(value, dict):
        raise LoadError("reply is not a map")
    _check_plain(value)
    if cbor2.dumps(value) != body:
        raise LoadError("reply is not in the shortest definite CBOR form dlm writes")
    return value


class FrameSplitter:
    """Bytes in, whole frames' bodies out (a frame may arrive in pieces)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_body(self) -> bytes | None:
        if len(self._buffer) < 4:
            return None
        size = int.from_bytes(self._buffer[:4], "big")
        if size > REPLY_CAP_BYTES:
            raise LoadError(f"reply frame of {size} bytes: the stream is out of step")
        if len(self._buffer) < 4 + size:
            return None
        body = bytes(self._buffer[4 : 4 + size])
        del self._buffer[: 4 + size]
        return body


# The requests this generator sends, with the fields PROTOCOL.md's request table gives
# them. ``client``, ``seq`` and ``acked`` are the request's origin ("Requests that change
# state"); ``id`` pairs the reply with the request.

HELLO_VERSION = 1
"""PROTOCOL.md, "Connection": a client sends ``version: 1`` (what the previous release
checks) and the highest version it speaks as ``max_version``."""
HELLO_MAX_VERSION = 5
"""The request table's newest requests are of version 5; nothing sent here needs more
than version 2 (origins, tokens on release), which the welcome must grant."""
NEEDED_VERSION = 2


def hello_message() -> dict[str, Any]:
    return {
        "t": "hello",
        "role": "client",
        "version": HELLO_VERSION,
        "max_version": HELLO_MAX_VERSION,
    }


def open_lease_message(
    rid: int, *, lease: str, ttl_ms: int, client: str, seq: int, acked: int
) -> dict[str, Any]:
    return {
        "t": "open_lease",
        "id": rid,
        "lease": lease,
        "ttl_ms": ttl_ms,
        "client": client,
        "seq": seq,
        "acked": acked,
    }


def acquire_message(
    rid: int, *, lease: str, key: str, wait: bool, client: str, seq: int, acked: int
) -> dict[str, Any]:
    return {
        "t": "acquire",
        "id": rid,
        "lease": lease,
        "key": key,
        "wait": wait,
        "limit": 1,
        "meta": {},
        "client": client,
        "seq": seq,
        "acked": acked,
    }


def release_message(
    rid: int, *, lease: str, key: str, token: int, client: str, seq: int, acked: int
) -> dict[str, Any]:
    return {
        "t": "release",
        "id": rid,
        "lease": lease,
        "key": key,
        "token": token,
        "client": client,
        "seq": seq,
        "acked": acked,
    }


def close_lease_message(
    rid: int, *, lease: str, client: str, seq: int, acked: int
) -> dict[str, Any]:
    return {
        "t": "close_lease",
        "id": rid,
        "lease": lease,
        "client": client,
        "seq": seq,
        "acked": acked,
    }


# ---------------------------------------------------------------------------
# One client: a blocking connection, its lease, its requests
# ---------------------------------------------------------------------------

LEASE_TTL_MS = 30_000
"""bench.locks' lease TTL; a cell whose warm-up and window are longer gets leases that
outlive it instead, since nothing here sends keep-alives (nor does dlm's client within
bench.locks' few-second cells: it renews every TTL/3)."""
LEASE_TTL_MAX_MS = 86_400_000
"""PROTOCOL.md: ``ttl_ms`` between 1 s and 24 h."""


def lease_ttl_ms(warmup: float, seconds: float) -> int:
    """bench.locks' TTL while a cell is short; for a longer one, twice the cell and 20 s
    (the hot key's queue drains after the window)."""
    cell_ms = int((warmup + seconds) * 2000) + 20_000
    return min(LEASE_TTL_MAX_MS, max(LEASE_TTL_MS, cell_ms))


DIAL_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 40.0
"""A hot-key acquire waits in the queue behind every other client; far more than that."""
REDIRECT_BUDGET = 20
"""NOT_LEADER answers one request may follow before it gives up."""
NO_LEADER_PAUSE_S = 0.05


def _random_id() -> str:
    """A lease or client id: hex digits are inside the lease id alphabet."""
    return secrets.token_hex(12)


class TokenLedger:
    """The last fencing token seen per key, in this process. A mutex's grant N+1 is made
    only after grant N's holder released, and its holder records grant N before it sends
    that release, so within one process the tokens recorded for a key must rise: a
    repeated or lower one is a bogus grant."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, int] = {}
        self.checked = 0

    def record(self, key: str, token: int) -> None:
        with self._lock:
            last = self._last.get(key)
            if last is not None and token <= last:
                raise LoadError(f"grant of {key!r} with token {token}, not above {last}")
            self._last[key] = token
            self.checked += 1


class Session:
    """One simulated client: its own connection (to the leader), client id and lease."""

    def __init__(
        self, endpoints: Sequence[str], ledger: TokenLedger, ttl_ms: int = LEASE_TTL_MS
    ) -> None:
        if not endpoints:
            raise LoadError("no member address given")
        self._endpoints = list(endpoints)
        self._next_endpoint = 0
        self._ledger = ledger
        self._ttl_ms = ttl_ms
        self._sock: socket.socket | None = None
        self._frames = FrameSplitter()
        self._address = ""
        self._pushes: list[dict[str, Any]] = []
        self._rid = 0
        self.client = _random_id()
        # PROTOCOL.md: seq starts at a random 62-bit offset and rises with every request.
        self._seq = secrets.randbits(62)
        self._acked = 0
        self.lease = ""

    # --- the connection

    def _dial(self, address: str) -> None:
        self.close_connection()
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=DIAL_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(REQUEST_TIMEOUT_S)
        self._sock, self._frames, self._address = sock, FrameSplitter(), address
        self._pushes = []
        self._send(hello_message())
        welcome = self._read()
        if welcome.get("t") != "welcome":
            raise LoadError(f"{address} answered the hello with {_describe(welcome)}")
        version = welcome.get("version")
        if not isinstance(version, int) or version < NEEDED_VERSION:
            raise LoadError(f"{address} speaks protocol version {version!r}; need 2 or more")
        if welcome.get("partitions", 1) != 1:
            raise LoadError(
                f"{address} is a member of a cluster of {welcome.get('partitions')} "
                "partitions; this generator drives clusters of one partition"
            )

    def _dial_some_member(self) -> None:
        problems = []
        for _ in range(len(self._endpoints)):
            address = self._endpoints[self._next_endpoint % len(self._endpoints)]
            self._next_endpoint += 1
            try:
                self._dial(address)
                return
            except (OSError, LoadError) as exc:
                problems.append(f"{address}: {exc}")
        raise LoadError("no member answered: " + "; ".join(problems))

    def close_connection(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _send(self, message: dict[str, Any]) -> None:
        assert self._sock is not None
        self._sock.sendall(encode_frame(message))

    def _read(self) -> dict[str, Any]:
        assert self._sock is not None
        while (body := self._frames.next_body()) is None:
            data = self._sock.recv(65536)
            if not data:
                raise LoadError(f"{self._address} closed the connection")
            self._frames.feed(data)
        return decode_body(body)

    # --- requests

    def _call(self, build: Callable[[int, int, int], dict[str, Any]]) -> dict[str, Any]:
        """Sends one state-changing request (``build(id, seq, acked)``) until a member that
        leads answers it, re-sending the same seq after NOT_LEADER as PROTOCOL.md asks."""
        self._seq += 1
        seq = self._seq
        for _ in range(REDIRECT_BUDGET):
            if self._sock is None:
                self._dial_some_member()
            self._rid += 1
            rid = self._rid
            try:
                self._send(build(rid, seq, self._acked))
                while True:
                    reply = self._read()
                    if reply.get("id") == rid and reply.get("t") in ("ok", "error"):
                        break
                    if reply.get("t") == "grant":
                        self._pushes.append(reply)
                    # any other push (none is asked for here) is passed over
            except OSError as exc:
                raise LoadError(f"{self._address}: {exc}") from None
            if reply.get("t") == "error" and reply.get("code") == "NOT_LEADER":
                leader = reply.get("leader_address")
                if isinstance(leader, str) and leader:
                    self._dial(leader)
                else:  # an election is on: ask another member in a moment
                    self.close_connection()
                    time.sleep(NO_LEADER_PAUSE_S)
                continue
            self._acked = seq  # one request at a time: every seq up to this one answered
            if reply.get("t") == "error":
                raise LoadError(f"{reply.get('code')}: {reply.get('message')}")
            return reply
        raise LoadError(f"no leader after {REDIRECT_BUDGET} NOT_LEADER answers")

    def open(self) -> None:
        lease = _random_id()

        def build(rid: int, seq: int, acked: int) -> dict[str, Any]:
            return open_lease_message(
                rid, lease=lease, ttl_ms=self._ttl_ms, client=self.client, seq=seq, acked=acked
            )

        reply = self._call(build)
        if reply.get("lease") != lease:
            raise LoadError(f"open_lease answered for lease {reply.get('lease')!r}")
        self.lease = lease

    def acquire(self, key: str, *, wait: bool) -> int:
        """Holds ``key`` (queued first if ``wait``); returns the grant's fencing token."""
        lease = self.lease

        def build(rid: int, seq: int, acked: int) -> dict[str, Any]:
            return acquire_message(
                rid, lease=lease, key=key, wait=wait, client=self.client, seq=seq, acked=acked
            )

        reply = self._call(build)
        if reply.get("key") != key or reply.get("lease") != lease:
            raise LoadError(f"acquire of {key!r} answered for {_describe(reply)}")
        result = reply.get("result")
        if result == "granted":
            token = reply.get("token")
        elif result == "queued" and wait:
            token = self._await_grant(key)
        else:
            raise LoadError(f"acquire of {key!r} answered {result!r}")
        if not isinstance(token, int) or isinstance(token, bool) or token < 1:
            raise LoadError(f"grant of {key!r} with token {token!r}")
        self._ledger.record(key, token)
        return token

    def _await_grant(self, key: str) -> object:
        while True:
            for push in self._pushes:
                if push.get("lease") == self.lease and push.get("key") == key:
                    self._pushes.remove(push)
                    return push.get("token")
            try:
                frame = self._read()
            except OSError as exc:
                raise LoadError(f"{self._address} while queued: {exc}") from None
            if frame.get("t") == "grant":
                self._pushes.append(frame)

    def release(self, key: str, token: int) -> None:
        lease = self.lease

        def build(rid: int, seq: int, acked: int) -> dict[str, Any]:
            return release_message(
                rid, lease=lease, key=key, token=token, client=self.client, seq=seq, acked=acked
            )

        reply = self._call(build)
        if reply.get("key") != key or reply.get("released") != "lock":
            raise LoadError(f"release of {key!r} answered {_describe(reply)}")
        if reply.get("token") != token:
            raise LoadError(f"release of token {token} answered for {reply.get('token')!r}")

    def close(self) -> None:
        """Ends the lease (best effort) and the connection."""
        if self.lease:
            lease = self.lease

            def build(rid: int, seq: int, acked: int) -> dict[str, Any]:
                return close_lease_message(
                    rid, lease=lease, client=self.client, seq=seq, acked=acked
                )

            with contextlib.suppress(Exception):  # best effort: it expires otherwise
                self._call(build)
            self.lease = ""
        self.close_connection()


def _describe(reply: dict[str, Any]) -> str:
    return repr({k: reply[k] for k in list(reply)[:8]})[:200]


# ---------------------------------------------------------------------------
# Percentiles
# ---------------------------------------------------------------------------


def percentile(sorted_ns: Sequence[int], percent: int) -> int | None:
    """Nearest rank: the smallest sample with at least ``percent`` % of the samples at or
    below it (``sorted_ns`` ascending; None when empty). Integer arithmetic only."""
    if not sorted_ns:
        return None
    if not 0 < percent <= 100:
        raise ValueError("percent must be in 1..100")
    rank = -(-percent * len(sorted_ns) // 100)  # ceil(percent/100 * n), 1-based
    return sorted_ns[rank - 1]


def _ms(ns: int | None) -> float:
    return math.nan if ns is None else ns / 1e6


# ---------------------------------------------------------------------------
# The members' CPU, from /proc (a member is its process tree)
# ---------------------------------------------------------------------------

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_after_name(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or ')': cut at the last one.
    return text[text.rfind(")") + 2 :].split()


def members_cpu_s(roots: Iterable[int]) -> float:
    """User + system CPU seconds of every process under ``roots`` (the roots included),
    plus what each has reaped of its children's (cutime, cstime)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat_after_name(int(name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    ticks = 0
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        fields = _stat_after_name(pid)
        if fields is None or len(fields) < 15:
            continue
        # fields[11..14]: utime, stime, cutime, cstime (stat fields 14-17)
        ticks += sum(int(x) for x in fields[11:15])
        todo.extend(children.get(pid, ()))
    return ticks / _TICKS_PER_S


def listening_pids(addresses: Sequence[str], attempts: int = 5) -> list[int]:
    """The PIDs of the processes listening on the ports of ``addresses`` (same order), from
    /proc/net/tcp{,6} and the processes' open files; empty when one cannot be found (not
    this machine, or another user's). /proc/net/tcp is read in pieces while the machine's
    sockets come and go, so a pass may miss a line: a few passes are tried."""
    for _ in range(attempts):
        found = _listening_pids_once([int(a.rpartition(":")[2]) for a in addresses])
        if found:
            return found
    return []


def _listening_pids_once(ports: Sequence[int]) -> list[int]:
    sockets: dict[str, int] = {}  # "socket:[inode]" -> port, of every listening socket
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f:
                cols = line.split()
                if len(cols) < 10 or cols[3] != "0A":  # 0A: LISTEN (the header is not)
                    continue
                with contextlib.suppress(ValueError):
                    port = int(cols[1].rsplit(":", 1)[1], 16)
                    if port in ports:
                        sockets[f"socket:[{cols[9]}]"] = port
    holders: dict[int, set[int]] = {}  # port -> PIDs holding a socket listening there
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{name}/fd"):
                with contextlib.suppress(OSError):
                    port_of = sockets.get(os.readlink(f"/proc/{name}/fd/{fd}"))
                    if port_of is not None:
                        holders.setdefault(port_of, set()).add(int(name))
    out = []
    for port in ports:
        pids = holders.get(port, set())
        # A child forked with the socket open (a snapshot writer) holds it too: the
        # member is the holder whose parent holds none of it.
        roots = [pid for pid in pids if _parent_of(pid) not in pids]
        if len(roots) != 1:
            return []
        out.append(roots[0])
    return out


def _parent_of(pid: int) -> int | None:
    fields = _stat_after_name(pid)
    return None if fields is None or len(fields) < 2 else int(fields[1])


# ---------------------------------------------------------------------------
# A cell: worker processes of client threads, a window, the figures
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CellSpec:
    hot: bool
    clients: int

    @property
    def label(self) -> str:
        return f"{'hot key' if self.hot else 'distinct keys'}, c={self.clients}"


@dataclass(slots=True)
class WorkerReport:
    """What one worker process measured (plain values: it crosses a pipe)."""

    pair_ns: list[int] = field(default_factory=list)
    acquire_ns: list[int] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    first_error: str = ""
    tokens_checked: int = 0
    cpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ClientJob:
    """One client thread's part: its session and key, and what it shares with its worker."""

    session: Session
    key: str
    hot: bool
    window: list[int]
    """[measure from, stop at], perf_counter_ns (CLOCK_MONOTONIC: one clock machine-wide)."""
    go: threading.Event
    report: WorkerReport
    guard: threading.Lock


def _client_thread(job: ClientJob) -> None:
    session, key, hot, report = job.session, job.key, job.hot, job.report
    job.go.wait()
    measure_from, stop_at = job.window
    pairs: list[int] = []
    acquires: list[int] = []
    completed = errors = 0
    first_error = ""
    while (start := time.perf_counter_ns()) < stop_at:
        try:
            token = session.acquire(key, wait=hot)
            held = time.perf_counter_ns()
            session.release(key, token)
        except Exception as exc:  # counted, never a thread that dies with its figures
            errors += 1
            first_error = first_error or f"{type(exc).__name__}: {exc}"
            # Start again on a fresh connection and lease (the old one is closed, which
            # frees whatever it held), after a pause: a failing cluster is not spun on.
            session.close()
            time.sleep(0.01)
            with contextlib.suppress(Exception):  # the next acquire says what is wrong
                session.open()
            continue
        done = time.perf_counter_ns()
        if measure_from <= done <= stop_at:
            completed += 1
            if start >= measure_from:
                acquires.append(held - start)
                pairs.append(done - start)
    with job.guard:
        report.pair_ns += pairs
        report.acquire_ns += acquires
        report.completed += completed
        report.errors += errors
        report.first_error = report.first_error or first_error


def worker_main(pipe: Any, endpoints: list[str], hot: bool, keys: list[str], ttl_ms: int) -> None:
    """One worker process: a thread per key, each with its own session. Says "ready" (or
    why not) once every session holds a lease, waits for the window, measures, reports."""
    ledger = TokenLedger()
    report = WorkerReport()
    sessions: list[Session] = []
    try:
        try:
            for _ in keys:
                session = Session(endpoints, ledger, ttl_ms)
                sessions.append(session)
                session.open()
        except Exception as exc:  # said to the parent in one line, not a traceback
            pipe.send(("failed", f"{type(exc).__name__}: {exc}"))
            return
        pipe.send(("ready", ""))
        try:
            window: list[int] = list(pipe.recv())
        except EOFError:  # the parent gave up on the cell (another worker failed)
            return
        go = threading.Event()
        guard = threading.Lock()
        threads = [
            threading.Thread(
                target=_client_thread,
                args=(ClientJob(s, k, hot, window, go, report, guard),),
                daemon=True,
            )
            for s, k in zip(sessions, keys, strict=True)
        ]
        for t in threads:
            t.start()
        go.set()
        time.sleep(max(0.0, (window[0] - time.perf_counter_ns()) / 1e9))
        cpu_before = time.process_time()
        time.sleep(max(0.0, (window[1] - time.perf_counter_ns()) / 1e9))
        report.cpu_s = time.process_time() - cpu_before
        for t in threads:
            t.join(REQUEST_TIMEOUT_S + 5)
        report.tokens_checked = ledger.checked
        pipe.send(("done", asdict(report)))
    finally:
        for s in sessions:
            s.close()


@dataclass(slots=True)
class CellFigures:
    label: str
    hot: bool
    clients: int
    procs: int
    seconds: float
    pairs_per_s: float
    pair_p50_ms: float
    pair_p99_ms: float
    acquire_p50_ms: float
    acquire_p99_ms: float
    samples: int
    errors: int
    first_error: str
    tokens_checked: int
    client_cpu: float
    """Cores' worth of CPU the worker processes used in the window."""
    server_cpu: float | None
    """Cores' worth of CPU the members used in the window (None: their PIDs unknown)."""
    load_average: float

    @property
    def server_cpu_per_pair_us(self) -> float:
        if self.server_cpu is None or not self.pairs_per_s:
            return math.nan
        return self.server_cpu / self.pairs_per_s * 1e6

    @property
    def p99_over_p50(self) -> float:
        return self.pair_p99_ms / self.pair_p50_ms if self.pair_p50_ms else math.nan


SETUP_TIMEOUT_S = 60.0


def run_cell(
    endpoints: Sequence[str],
    spec: CellSpec,
    *,
    seconds: float,
    warmup: float,
    procs: int,
    member_pids: Sequence[int] = (),
    key_prefix: str = "",
) -> CellFigures:
    """One closed-loop cell: ``spec.clients`` client threads over up to ``procs`` worker
    processes; every worker process is stopped (killed if it must be) before returning."""
    prefix = key_prefix or f"bench/loadgen/{os.getpid()}/{time.monotonic_ns()}"
    prefix += f"/{'h' if spec.hot else 'd'}{spec.clients}"
    keys = [f"{prefix}/hot" if spec.hot else f"{prefix}/{i}" for i in range(spec.clients)]
    shares = [keys[k :: max(1, procs)] for k in range(max(1, procs))]
    shares = [s for s in shares if s]
    ctx = multiprocessing.get_context("spawn")
    pipes, workers = [], []
    for share in shares:
        ours, theirs = ctx.Pipe()
        worker = ctx.Process(
            target=worker_main,
            args=(theirs, list(endpoints), spec.hot, share, lease_ttl_ms(warmup, seconds)),
            daemon=True,
        )
        pipes.append(ours)
        workers.append(worker)
    reports: list[WorkerReport] = []
    problems: list[str] = []
    server_cpu: float | None = None
    load_average = math.nan
    started: list[Any] = []
    try:
        for w in workers:
            w.start()
            started.append(w)
        for p in pipes:
            if not p.poll(SETUP_TIMEOUT_S):
                problems.append("a worker process did not open its sessions in time")
                continue
            state, why = p.recv()
            if state != "ready":
                problems.append(why)
        if not problems:
            start = time.perf_counter_ns() + int(warmup * 1e9)
            stop = start + int(seconds * 1e9)
            for p in pipes:
                p.send((start, stop))
            time.sleep(max(0.0, (start - time.perf_counter_ns()) / 1e9))
            cpu_before = members_cpu_s(member_pids) if member_pids else None
            time.sleep(max(0.0, (stop - time.perf_counter_ns()) / 1e9))
            if cpu_before is not None:
                server_cpu = (members_cpu_s(member_pids) - cpu_before) / seconds
            load_average = os.getloadavg()[0]
            for p in pipes:
                if not p.poll(REQUEST_TIMEOUT_S + 15):
                    problems.append("a worker process sent no result")
                    continue
                state, body = p.recv()
                reports.append(WorkerReport(**body))
    except (EOFError, OSError) as exc:
        problems.append(f"a worker process ended early: {exc}")
    finally:
        for p in pipes:  # a worker still waiting for its window reads EOF and ends
            p.close()
        for w in started:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
                w.join(timeout=5)
    pairs = sorted(x for r in reports for x in r.pair_ns)
    acquires = sorted(x for r in reports for x in r.acquire_ns)
    first_error = next((r.first_error for r in reports if r.first_error), "")
    return CellFigures(
        label=spec.label,
        hot=spec.hot,
        clients=spec.clients,
        procs=len(workers),
        seconds=seconds,
        pairs_per_s=sum(r.completed for r in reports) / seconds,
        pair_p50_ms=_ms(percentile(pairs, 50)),
        pair_p99_ms=_ms(percentile(pairs, 99)),
        acquire_p50_ms=_ms(percentile(acquires, 50)),
        acquire_p99_ms=_ms(percentile(acquires, 99)),
        samples=len(pairs),
        errors=sum(r.errors for r in reports) + len(problems),
        first_error=first_error or "; ".join(problems),
        tokens_checked=sum(r.tokens_checked for r in reports),
        client_cpu=sum(r.cpu_s for r in reports) / seconds,
        server_cpu=server_cpu,
        load_average=load_average,
    )


# ---------------------------------------------------------------------------
# Which figures are compared with bench.locks', and how
# ---------------------------------------------------------------------------

AGREEMENT = 0.25
"""Item 4: the second generator confirms a figure when it is within 25 % of the first's."""


def cell_specs(clients: Sequence[int]) -> list[CellSpec]:
    """Item 4's cells of dlm's own: c=1 and the top c, distinct keys and hot key."""
    one, top = 1, max(clients)
    wanted = [CellSpec(False, one), CellSpec(True, one), CellSpec(True, top), CellSpec(False, top)]
    out: list[CellSpec] = []
    for spec in wanted:
        if spec not in out and spec.clients in clients:
            out.append(spec)
    return out


def figures_of(spec: CellSpec, top: int) -> list[str]:
    """Item 4's figures of a cell: c=1 distinct keys' pair p50 and pairs/s; the hot key's
    pairs/s and p99/p50 at c=1 and the top c; the top c distinct keys' pairs/s and server
    CPU per pair."""
    if not spec.hot and spec.clients == 1:
        return ["pair p50", "pairs/s"]
    if spec.hot:
        return ["pairs/s", "pair p99/p50"]
    if spec.clients == top:
        return ["pairs/s", "server CPU per pair"]
    return ["pairs/s"]


def pick(figure: str, cell: dict[str, Any]) -> float:
    """One figure from a cell given as plain values: this module's CellFigures (asdict,
    plus the properties) or bench.locks' CellResult (asdict, plus its properties)."""
    if figure == "pairs/s":
        return float(cell["pairs_per_s"])
    if figure == "pair p50":
        return float(cell["pair_p50_ms"])
    if figure == "pair p99/p50":
        p50, p99 = float(cell["pair_p50_ms"]), float(cell["pair_p99_ms"])
        return p99 / p50 if p50 else math.nan
    if figure == "server CPU per pair":
        return float(cell["server_cpu_per_pair_us"])
    raise ValueError(f"unknown figure {figure!r}")


def plain_cell(figures: CellFigures) -> dict[str, Any]:
    out = asdict(figures)
    out["server_cpu_per_pair_us"] = figures.server_cpu_per_pair_us
    return out


def plain_locks_cell(cell: Any) -> dict[str, Any]:
    """bench.locks' CellResult as the plain values :func:`pick` reads (duck-typed: this
    module does not import bench.locks)."""
    return {
        "pairs_per_s": cell.pairs_per_s,
        "pair_p50_ms": cell.pair.p50_ms,
        "pair_p99_ms": cell.pair.p99_ms,
        "server_cpu_per_pair_us": cell.server_cpu_per_pair_us,
        "load_average": cell.load_average,
    }


@dataclass(frozen=True, slots=True)
class Agreement:
    cell: str
    figure: str
    first: float | None
    """bench.locks' figure (dlm's client library)."""
    second: float | None
    """This generator's."""
    first_load: float = math.nan
    second_load: float = math.nan
    """The machine's 1-minute load average as each cell's window ended: other work on
    the machine moves both figures, and not always alike."""

    @property
    def ratio(self) -> float | None:
        if self.first is None or self.second is None or not self.first:
            return None
        if math.isnan(self.first) or math.isnan(self.second):
            return None
        return self.second / self.first

    @property
    def within(self) -> bool | None:
        ratio = self.ratio
        return None if ratio is None else abs(ratio - 1.0) <= AGREEMENT


def agreements(
    second: Sequence[dict[str, Any]], first: Callable[[bool, int], dict[str, Any] | None]
) -> list[Agreement]:
    """Each item-4 figure of each cell this generator ran, beside bench.locks' figure of
    the same cell (``first(hot, clients)``; None when it did not run it)."""
    top = max((c["clients"] for c in second), default=1)
    rows = []
    for cell in second:
        spec = CellSpec(cell["hot"], cell["clients"])
        theirs = first(spec.hot, spec.clients)
        for figure in figures_of(spec, top):
            rows.append(
                Agreement(
                    spec.label,
                    figure,
                    None if theirs is None else pick(figure, theirs),
                    pick(figure, cell),
                    math.nan if theirs is None else theirs.get("load_average", math.nan),
                    cell.get("load_average", math.nan),
                )
            )
    return rows


def _fmt(figure: str, value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if figure == "pairs/s":
        return f"{value:,.0f}"
    if figure == "pair p50":
        return f"{value:.2f} ms"
    if figure == "server CPU per pair":
        return f"{value:,.0f} us"
    return f"{value:.2f}"


def _load(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def render_agreements(rows: Sequence[Agreement]) -> str:
    lines = [
        "| cell | figure | bench.locks (dlm client) | bench.loadgen (second) | second/first "
        "| within 25 % | load average |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        within = {None: "-", True: "yes", False: "**no**"}[r.within]
        lines.append(
            f"| {r.cell} | {r.figure} | {_fmt(r.figure, r.first)} "
            f"| {_fmt(r.figure, r.second)} | {ratio} | {within} "
            f"| {_load(r.first_load)} / {_load(r.second_load)} |"
        )
    return "\n".join(lines)


def render_cells(cells: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| cell | procs | pairs/s | pair p50 | pair p99 | p99/p50 | server CPU/pair "
        "| client CPU | tokens checked | errors | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c['label']} | {c['procs']} | {c['pairs_per_s']:,.0f} "
            f"| {_fmt('pair p50', c['pair_p50_ms'])} | {_fmt('pair p50', c['pair_p99_ms'])} "
            f"| {_fmt('', pick('pair p99/p50', c))} "
            f"| {_fmt('server CPU per pair', c['server_cpu_per_pair_us'])} "
            f"| {c['client_cpu']:.2f} | {c['tokens_checked']:,} | {c['errors']} "
            f"| {_load(c['load_average'])} |"
        )
    return "\n".join(lines)


def progress_line(c: CellFigures) -> str:
    note = f"  errors {c.errors} ({c.first_error})" if c.errors else ""
    return (
        f"  loadgen: {c.label:20} procs={c.procs}  {c.pairs_per_s:8.0f} pairs/s"
        f"  pair p50 {c.pair_p50_ms:7.2f} p99 {c.pair_p99_ms:7.2f} ms"
        f"  cpu client {c.client_cpu:4.2f} server "
        f"{'-' if c.server_cpu is None else f'{c.server_cpu:4.2f}'}"
        f" ({c.server_cpu_per_pair_us:5.0f} us/pair)  tokens {c.tokens_checked}{note}"
    )


# ---------------------------------------------------------------------------
# Inside make bench: after each of bench.locks' matching dlm cells, on its cluster
# ---------------------------------------------------------------------------


DEFAULT_SECONDS = 3.0
DEFAULT_WARMUP = 1.0
DEFAULT_PROCS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench.locks' flags for the second generator."""
    parser.add_argument(
        "--no-second-generator",
        action="store_true",
        help="skip the second load generator (bench/loadgen.py) after dlm's cells",
    )
    parser.add_argument(
        "--second-seconds", type=float, default=DEFAULT_SECONDS, help="its window per cell"
    )
    parser.add_argument(
        "--second-warmup", type=float, default=DEFAULT_WARMUP, help="its warm-up per cell"
    )
    parser.add_argument(
        "--second-procs", type=int, default=DEFAULT_PROCS, help="its worker processes"
    )


@dataclass(slots=True)
class SecondRun:
    """The second generator's cells within one bench.locks run."""

    seconds: float
    warmup: float
    procs: int
    cells: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    elapsed_s: float = 0.0
    """Wall time its cells added to the run (worker start-up and set-up included)."""


def interleaved_hook(
    plan: Sequence[tuple[bool, int, int]],
    endpoints: Callable[[], Sequence[str]],
    member_pids: Callable[[], Sequence[int]],
    out: SecondRun,
) -> Callable[[int], None]:
    """What bench.locks calls after step ``n`` of its cell plan (``(hot, clients, procs)``
    each): once the last load model of a cell item 4 names has run on dlm, the same cell
    runs here, on the same cluster (``endpoints()``: the members, the leader first;
    ``member_pids()``: their PIDs)."""
    specs = cell_specs(sorted({c for _, c, _ in plan}))
    last_step = {(hot, c): n for n, (hot, c, _) in enumerate(plan)}

    def after_step(n: int) -> None:
        hot, clients, _ = plan[n]
        spec = CellSpec(hot, clients)
        if spec not in specs or last_step[(hot, clients)] != n or out.error:
            return
        began = time.monotonic()
        try:
            figures = run_cell(
                endpoints(),
                spec,
                seconds=out.seconds,
                warmup=out.warmup,
                procs=min(out.procs, clients),
                member_pids=member_pids(),
            )
        except Exception as exc:
            out.error = f"{type(exc).__name__}: {exc}"
            print(f"  loadgen: skipped the rest: {out.error}", flush=True)
            return
        finally:
            out.elapsed_s += time.monotonic() - began
        out.cells.append(plain_cell(figures))
        print(progress_line(figures), flush=True)

    return after_step


def section(run: SecondRun, first: Callable[[bool, int], Any | None]) -> tuple[str, str]:
    """The results page's section: bench.locks' figure and this generator's, per figure
    item 4 names (``first(hot, clients)``: bench.locks' CellResult of that cell, or None)."""

    def theirs(hot: bool, clients: int) -> dict[str, Any] | None:
        cell = first(hot, clients)
        return None if cell is None else plain_locks_cell(cell)

    rows = agreements(run.cells, theirs)
    intro = (
        f"bench/loadgen.py (blocking sockets in threads over {run.procs} processes, its own "
        "CBOR frames, clock and percentiles; see bench/README.md) ran each of these cells "
        f"right after bench.locks' on the same cluster, {run.seconds:g} s after "
        f"{run.warmup:g} s warm-up ({run.elapsed_s:.0f} s in all). Within 25 %: "
        "second/first between 0.75 and 1.25."
    )
    parts = [intro, "", render_agreements(rows), "", render_cells(run.cells)]
    if run.error:
        parts += ["", f"second generator: {run.error}"]
    return "Second load generator", "\n".join(parts)


def first_from_json(path: str) -> Callable[[bool, int], dict[str, Any] | None]:
    """bench.locks' dlm cells from its ``--json`` file (or bench/results/locks.json), as
    :func:`agreements` reads them: the best load model of each cell, as bench.locks'
    table shows it."""
    with open(path) as f:
        cells = json.load(f).get("dlm", {}).get("cells", [])

    def first(hot: bool, clients: int) -> dict[str, Any] | None:
        same = [c for c in cells if c["hot"] == hot and c["clients"] == clients]
        if not same:
            return None
        best = max(same, key=lambda c: c["pairs_per_s"])
        rate = best["pairs_per_s"]
        return {
            "pairs_per_s": rate,
            "pair_p50_ms": best["pair"]["p50_ms"],
            "pair_p99_ms": best["pair"]["p99_ms"],
            "server_cpu_per_pair_us": best["server_cpu"] / rate * 1e6 if rate else math.nan,
            "load_average": best.get("load_average", math.nan),
        }

    return first


def jsonable(run: SecondRun, first: Callable[[bool, int], Any | None]) -> dict[str, Any]:
    def theirs(hot: bool, clients: int) -> dict[str, Any] | None:
        cell = first(hot, clients)
        return None if cell is None else plain_locks_cell(cell)

    out = asdict(run)
    out["agreement"] = [
        {**asdict(r), "ratio": r.ratio, "within_25_percent": r.within}
        for r in agreements(run.cells, theirs)
    ]
    return out


# ---------------------------------------------------------------------------
# Alone: python -m bench.loadgen --cluster ADDR,...
# ---------------------------------------------------------------------------


def _counts(text: str) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError("expected positive integers, e.g. 1,64")
    return counts


def _addresses(text: str) -> list[str]:
    out = [a.strip() for a in text.split(",") if a.strip()]
    for a in out:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            raise argparse.ArgumentTypeError(f"expected HOST:PORT,...; got {a!r}")
    return out


def _pids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected PIDs, e.g. 4242,4243,4244") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description="dlm's benchmark cells from a second, independent load generator "
        "(blocking sockets in threads, its own frames; clusters of one partition).",
    )
    parser.add_argument(
        "--cluster", type=_addresses, required=True, metavar="ADDR,...", help="HOST:PORT,..."
    )
    parser.add_argument(
        "--pids",
        type=_pids,
        default=None,
        help="the members' PIDs, for server CPU (default: found from the listening ports)",
    )
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="window per cell")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP, help="before each window")
    parser.add_argument("--clients", type=_counts, default=[1, 64], help="e.g. 1,64")
    parser.add_argument("--procs", type=int, default=DEFAULT_PROCS, help="worker processes")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    parser.add_argument(
        "--compare",
        metavar="LOCKS_JSON",
        help="also print each figure beside bench.locks' from its --json file, within 25 %%?",
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.warmup < 0 or args.procs < 1:
        parser.error("--seconds must be above 0, --warmup at least 0, --procs at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pids = args.pids if args.pids is not None else listening_pids(args.cluster)
    if not pids:
        print("server CPU: the members' PIDs were not found here (--pids names them)")
    load_before = os.getloadavg()[0]
    cells = []
    for spec in cell_specs(args.clients):
        figures = run_cell(
            args.cluster,
            spec,
            seconds=args.seconds,
            warmup=args.warmup,
            procs=min(args.procs, spec.clients),
            member_pids=pids,
        )
        print(progress_line(figures), flush=True)
        cells.append(plain_cell(figures))
    print(
        f"\nbench.loadgen: {len(args.cluster)} members, {args.seconds:g} s per cell after "
        f"{args.warmup:g} s warm-up; {os.cpu_count()} CPUs; load average {load_before:.1f} "
        f"before, {os.getloadavg()[0]:.1f} after"
    )
    print(render_cells(cells))
    if args.compare:
        print()
        print(render_agreements(agreements(cells, first_from_json(args.compare))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cells": cells, "settings": vars(args)}, f, indent=2)
    return 1 if any(c["errors"] for c in cells) else 0


if __name__ == "__main__":
    # Worker processes are spawned: their function must belong to bench.loadgen, not
    # __main__, so that a fresh interpreter finds it.
    from bench import loadgen  # noqa: PLW0406

    sys.exit(loadgen.main())
