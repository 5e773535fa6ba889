"""Prometheus metrics at ``/metrics``, served from the member's own event loop.

``dlm node start --metrics-listen HOST:PORT`` turns it on. The registry and
the text exposition are prometheus-client's; the HTTP side is a few lines of
asyncio here rather than prometheus-client's server, which starts a thread
per connection with no timeout: a scraper that connects and says nothing would
hold a thread forever. Ours answers ``GET /metrics`` (and HEAD) and nothing
else, reads at most ``REQUEST_LIMIT`` bytes within ``REQUEST_TIMEOUT`` seconds,
and keeps at most ``MAX_CONNECTIONS`` open, evicting the oldest idle one for a
newcomer, so neither a silent connection nor a flood of them stops a scrape.

Every metric is computed when scraped from what the node machine
(dlm/node/stats.py) and the adapter count, so nothing is updated on the hot
path but plain integers. Names follow Prometheus conventions: ``dlm_`` prefix,
``_total`` for counters, ``_seconds`` for durations. README.md lists them.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dlm import __version__
from dlm.node.locks.ledger import OUTCOMES
from dlm.node.raft.types import Role
from dlm.node.runtime.log import Logger
from dlm.node.stats import Histogram
from dlm.wire import PROTOCOL_VERSION

if TYPE_CHECKING:
    from dlm.node.machine import Instant, NodeMachine
    from dlm.node.runtime.config.node_config import NodeConfig
    from dlm.node.stats import BackupStats, DiskStats


class _Refusals(Protocol):
    @property
    def connections_refused(self) -> int: ...


class ObservedMember(Protocol):
    """What the metrics read of a running member (runtime/server.py's NodeServer): named
    here so that this room and the server do not import each other."""

    @property
    def machine(self) -> NodeMachine: ...

    @property
    def config(self) -> NodeConfig: ...

    @property
    def counters(self) -> _Refusals: ...

    @property
    def client_count(self) -> int: ...

    @property
    def disk_stats(self) -> DiskStats: ...

    @property
    def backup_stats(self) -> BackupStats: ...

    def now(self) -> Instant: ...


REQUEST_LIMIT = 8192
"""Bytes of request line and headers; a longer request gets 431."""
REQUEST_TIMEOUT = 5.0
"""Seconds to send the request (and to take the answer); then the connection is closed."""
MAX_CONNECTIONS = 64
"""Connections served at once; one more evicts the oldest still sending its request."""
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
ROLES = tuple(role.value for role in Role)
RELEASE_KINDS = ("released", "closed", "expired")

METRIC_HELP: dict[str, str] = {
    "dlm_requests_total": "Client requests this member answered, by type and result "
    "(OK or the error code).",
    "dlm_grants_total": "Locks granted (at once or to a waiter), as this member applied them.",
    "dlm_permission_refusals_total": "Requests refused for want of a permission (exit 77, "
    "PERMISSION_DENIED), by identity and action (the request kind); counted where refused: "
    "by the member that received it, or by every member that applied its entry.",
    "dlm_releases_total": "Held locks that ended, by how: released, closed (with their lease) "
    "or expired.",
    "dlm_lease_expiries_total": "Leases ended by the leader because their TTL passed.",
    "dlm_locks_lost_total": "Held locks freed because their holder's lease expired.",
    "dlm_acquire_wait_seconds": "Time from queued to granted, for acquires that waited "
    "(measured by the leader that queued them).",
    "dlm_hold_seconds": "Time from granted to released, closed or expired.",
    "dlm_sessions": "Live leases (sessions).",
    "dlm_locks_held": "Held lock slots (a semaphore with three holders counts three).",
    "dlm_waiters": "Leases queued for a lock.",
    "dlm_raft_term": "This member's Raft term.",
    "dlm_raft_role": "1 for this member's current Raft role, 0 for the others.",
    "dlm_raft_commit_index": "Highest log index this member knows is committed.",
    "dlm_raft_applied_index": "Highest log index applied to this member's lock table.",
    "dlm_raft_leader_changes_total": "Times this member saw the leader or the term change.",
    "dlm_raft_proposals_total": "Client commands this member proposed as leader.",
    "dlm_fsync_seconds": "Time to write and fsync one batch of log entries.",
    "dlm_fsync_batch_entries": "Log entries per fsync.",
    "dlm_peer_append_rtt_seconds": "Leader: time from sending entries to a peer to its "
    "acknowledgement.",
    "dlm_peer_reachable": "Leader only: 1 if the peer answered within two election timeouts, "
    "else 0.",
    "dlm_peer_last_contact_seconds": "Time since this member last heard from the peer.",
    "dlm_client_connections": "Open client connections.",
    "dlm_connections_refused_total": "Client connections refused because the member had too many.",
    "dlm_rejected_input_total": "Client requests and peer messages refused as malformed or "
    "not allowed.",
    "dlm_snapshots_total": "State-machine snapshots this member took.",
    "dlm_watchers": "Watches this member serves now (dlm watch, dlm observe, status --watch).",
    "dlm_watch_events_pushed_total": "Changes this member pushed to watchers (one per watcher).",
    "dlm_watchers_cut_off_total": "Watches ended because their client did not read what was "
    "pushed to it.",
    "dlm_quarantines_ended_total": "Quarantines of a restored or recovered cluster that "
    "this member saw end.",
    "dlm_lock_delays_started_total": "Keys that entered a lock-delay because their holder's "
    "lease expired or was revoked.",
    "dlm_lock_delays_ended_total": "Lock-delays that ended (the key may be granted again).",
    "dlm_keys_lock_delayed": "Keys in a lock-delay now (granted to nobody until it ends).",
    "dlm_quarantined": "1 while the cluster is quarantined after a restore or recovery "
    "(it grants no lock), else 0.",
    "dlm_incarnation": "The cluster incarnation this member belongs to (0: never restored or "
    "recovered; else the index its new log started after).",
    "dlm_backups_total": "Backups (dlm snapshot save) this member sent whole.",
    "dlm_backup_bytes_total": "Image bytes of the backups this member sent.",
    "dlm_backup_seconds": "Time to take and send one backup.",
    "dlm_image_fork_seconds": "Time the event loop spent forking the child that builds a "
    "snapshot or backup image.",
    "dlm_cluster_version": "The protocol version the replicated log runs.",
    "dlm_build_info": "Always 1; the labels say which release this member runs.",
    "dlm_job_last_success_timestamp_seconds": "Leader only, keys under --job-metrics: when "
    "the last `dlm exec` run of the key that exited 0 ended (the leader's clock, Unix time).",
    "dlm_job_runs_total": "Leader only, keys under --job-metrics: ended `dlm exec` runs of "
    "the key, by outcome (finished, killed, lock_lost, supervisor_gone).",
    "dlm_job_skips_total": "Leader only, keys under --job-metrics: `dlm exec` runs of the key "
    "skipped because another host held it.",
    "dlm_job_duration_seconds": "Leader only, keys under --job-metrics: how long the key's "
    "last ended run took.",
}
"""Every metric a member serves (besides prometheus-client's process_* metrics), with
its help text. README.md documents each; docs/grafana-dashboard.json uses only these."""


def _help(name: str) -> str:
    return METRIC_HELP[name]


def _histogram(name: str, histogram: Histogram, labels: dict[str, str] | None = None) -> Metric:
    family = HistogramMetricFamily(name, _help(name), labels=list(labels or {}))
    family.add_metric(
        list((labels or {}).values()), histogram.cumulative(), sum_value=histogram.sum
    )
    return family


class NodeCollector(Collector):
    """Reads the member's counters when Prometheus scrapes."""

    def __init__(self, server: ObservedMember) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        server = self._server
        machine = server.machine
        stats = machine.stats
        requests = CounterMetricFamily(
            "dlm_requests", _help("dlm_requests_total"), labels=["type", "result"]
        )
        for (kind, outcome), count in sorted(stats.requests.items()):
            requests.add_metric([kind, outcome], count)
        yield requests
        refusals = CounterMetricFamily(
            "dlm_permission_refusals",
            _help("dlm_permission_refusals_total"),
            labels=["identity", "action"],
        )
        for (identity, action), count in sorted(stats.refusals.items()):
            refusals.add_metric([identity, action], count)
        yield refusals
        releases = CounterMetricFamily("dlm_releases", _help("dlm_releases_total"), labels=["how"])
        for how in RELEASE_KINDS:
            releases.add_metric([how], stats.releases.get(how, 0))
        yield releases
        for name, value in (
            ("dlm_grants", stats.grants),
            ("dlm_lease_expiries", stats.expiries),
            ("dlm_locks_lost", stats.locks_lost),
            ("dlm_raft_leader_changes", stats.leader_changes),
            ("dlm_raft_proposals", stats.proposals),
            ("dlm_connections_refused", server.counters.connections_refused),
            ("dlm_rejected_input", stats.rejected_frames),
            ("dlm_snapshots", stats.snapshots_taken),
            ("dlm_quarantines_ended", stats.quarantines_ended),
            ("dlm_lock_delays_started", stats.lock_delays_started),
            ("dlm_lock_delays_ended", stats.lock_delays_ended),
            ("dlm_backups", server.backup_stats.backups),
            ("dlm_backup_bytes", server.backup_stats.backup_bytes),
            ("dlm_watch_events_pushed", stats.watch_events_pushed),
            ("dlm_watchers_cut_off", stats.watchers_cut_off),
        ):
            yield CounterMetricFamily(name, _help(name + "_total"), value=value)
        yield _histogram("dlm_acquire_wait_seconds", stats.acquire_wait)
        yield _histogram("dlm_hold_seconds", stats.hold_time)
        counts = machine.locks.counts()
        raft = machine.raft
        for name, gauge_value in (
            ("dlm_sessions", counts.sessions),
            ("dlm_locks_held", counts.locks),
            ("dlm_waiters", counts.waiters),
            ("dlm_raft_term", raft.term),
            ("dlm_raft_commit_index", raft.commit_index),
            ("dlm_raft_applied_index", machine.locks.applied_index),
            ("dlm_client_connections", server.client_count),
            ("dlm_cluster_version", machine.locks.version),
            ("dlm_quarantined", int(machine.locks.quarantine is not None)),
            ("dlm_keys_lock_delayed", len(machine.locks.delays)),
            ("dlm_incarnation", machine.config.incarnation),
            ("dlm_watchers", len(machine.watches.watchers)),
        ):
            yield GaugeMetricFamily(name, _help(name), value=gauge_value)
        role = GaugeMetricFamily("dlm_raft_role", _help("dlm_raft_role"), labels=["role"])
        for name in ROLES:
            role.add_metric([name], 1.0 if raft.role.value == name else 0.0)
        yield role
        yield _histogram("dlm_fsync_seconds", server.disk_stats.fsync)
        yield _histogram("dlm_fsync_batch_entries", server.disk_stats.batch)
        yield _histogram("dlm_backup_seconds", server.backup_stats.backup_seconds)
        yield _histogram("dlm_image_fork_seconds", server.backup_stats.image_fork_seconds)
        rtt = HistogramMetricFamily(
            "dlm_peer_append_rtt_seconds", _help("dlm_peer_append_rtt_seconds"), labels=["peer"]
        )
        for peer, histogram in sorted(stats.append_rtt.items()):
            rtt.add_metric([peer], histogram.cumulative(), sum_value=histogram.sum)
        yield rtt
        yield from self._peers()
        build = GaugeMetricFamily(
            "dlm_build_info", _help("dlm_build_info"), labels=["version", "protocol"]
        )
        build.add_metric([__version__, str(PROTOCOL_VERSION)], 1.0)
        yield build

    def _peers(self) -> Iterator[Metric]:
        server = self._server
        machine = server.machine
        reachable = GaugeMetricFamily(
            "dlm_peer_reachable", _help("dlm_peer_reachable"), labels=["peer"]
        )
        contact = GaugeMetricFamily(
            "dlm_peer_last_contact_seconds",
            _help("dlm_peer_last_contact_seconds"),
            labels=["peer"],
        )
        # Only the leader hears from every member; a follower would call them all silent.
        # Two of the longest election timeouts (a member draws one up to twice the base),
        # as `dlm status --check` counts: a tick without an answer is not an outage.
        leading = machine.role is Role.LEADER
        silent_after_ms = 4 * machine.config.timing.election_timeout_s * 1000
        for member in machine.members_view(server.now()).members:
            peer = member.id
            if peer is None or peer == server.config.node_id:
                continue
            last = member.last_contact_ms
            if leading:
                heard = last is not None and last <= silent_after_ms
                reachable.add_metric([peer], 1.0 if heard else 0.0)
            if last is not None:
                contact.add_metric([peer], last / 1000.0)
        yield reachable
        yield contact
        yield from job_metrics(server)


JOB_METRICS_MAX_KEYS = 1000
"""At most this many keys get dlm_job_* series (the first by name): labels stay bounded."""


def job_metrics(server: ObservedMember) -> Iterator[Metric]:
    """The run ledger of the keys under --job-metrics, from the leader only (a follower's
    ledger may lag; one member exporting keeps the series single)."""
    prefix = server.config.job_metrics
    machine = server.machine
    names = (
        "dlm_job_last_success_timestamp_seconds",
        "dlm_job_runs_total",
        "dlm_job_skips_total",
        "dlm_job_duration_seconds",
    )
    success = GaugeMetricFamily(names[0], _help(names[0]), labels=["key"])
    runs = CounterMetricFamily(
        names[1].removesuffix("_total"), _help(names[1]), labels=["key", "outcome"]
    )
    skips = CounterMetricFamily(names[2].removesuffix("_total"), _help(names[2]), labels=["key"])
    duration = GaugeMetricFamily(names[3], _help(names[3]), labels=["key"])
    exported = prefix is not None and machine.role is Role.LEADER
    ledger = machine.locks.ledger.totals(prefix) if prefix is not None and exported else []
    for key, totals in ledger[:JOB_METRICS_MAX_KEYS]:
        if totals.last_success_ms is not None:
            success.add_metric([key], totals.last_success_ms / 1000.0)
        for outcome in OUTCOMES:
            runs.add_metric([key, outcome], float(totals.runs.get(outcome, 0)))
        skips.add_metric([key], float(totals.skips))
        if totals.last_duration_ms is not None:
            duration.add_metric([key], totals.last_duration_ms / 1000.0)
    yield from (success, runs, skips, duration)


def registry_for(server: ObservedMember) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(server))
    ProcessCollector(registry=registry)
    return registry


class MetricsListener:
    """The /metrics endpoint: one asyncio server on the member's loop.

    A connection gets ``request_timeout`` seconds to send a request of at most
    ``request_limit`` bytes. At most ``max_connections`` are open at once; one
    more evicts the oldest that is still sending its request, so a flood of idle
    connections cannot lock the scraper out (its request comes at once, theirs
    never does).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None,
        *,
        collect: Callable[[], Awaitable[bytes]] | None = None,
        log: Logger | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        request_limit: int = REQUEST_LIMIT,
        max_connections: int = MAX_CONNECTIONS,
        token: bytes | None = None,
        tls: Any = None,
    ) -> None:
        self._registry = registry
        self._collect = collect
        """Builds the exposition instead of the registry (a supervisor's: its partitions'
        samples, fetched when scraped)."""
        self._token = token
        """A scrape must carry ``Authorization: Bearer <token>`` (None: no token needed)."""
        self._tls = tls
        """ssl.SSLContext to serve with (it requires a client certificate), or None."""
        self._log = log
        self._request_timeout = request_timeout
        self._request_limit = request_limit
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._open: dict[asyncio.StreamWriter, bool] = {}
        """Open connections, oldest first: True while still reading the request."""
        self.refused = 0
        self.evicted = 0
        self.unauthorized = 0

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            host,
            port,
            limit=self._request_limit,
            ssl=self._tls,
            ssl_handshake_timeout=self._request_timeout if self._tls is not None else None,
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.transport.abort()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if len(self._open) >= self._max_connections:
            oldest = next((w for w, reading in self._open.items() if reading), None)
            if oldest is None:
                self.refused += 1
                return False
            del self._open[oldest]
            oldest.transport.abort()
            self.evicted += 1
        self._open[writer] = True
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.transport.abort()
            return
        try:
            try:
                head = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), timeout=self._request_timeout
                )
            except asyncio.LimitOverrunError:
                head = None
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            if writer not in self._open:
                return  # evicted meanwhile
            self._open[writer] = False
            answer = self._answer(head)
            if not answer:  # _COLLECT: the exposition is collected asynchronously
                answer = await self._collected(head or b"")
            writer.write(answer)
            try:
                await asyncio.wait_for(writer.drain(), timeout=self._request_timeout)
            except (TimeoutError, ConnectionError):
                pass
        finally:
            self._open.pop(writer, None)
            writer.close()

    def _answer(self, head: bytes | None) -> bytes:
        if head is None:
            return _response(431, b"request too large\n")
        request_line = head.split(b"\r\n", 1)[0].split()
        if len(request_line) != 3 or not request_line[2].startswith(b"HTTP/"):
            return _response(400, b"not an HTTP request\n")
        method, target = request_line[0], request_line[1]
        if method not in (b"GET", b"HEAD"):
            return _response(405, b"only GET /metrics is served here\n")
        if target.split(b"?", 1)[0] != b"/metrics":
            return _response(404, b"metrics are at /metrics\n")
        if self._token is not None and not _bearer_matches(head, self._token):
            self.unauthorized += 1
            return _response(401, b"send the metrics token: Authorization: Bearer TOKEN\n")
        if self._collect is not None:
            return _COLLECT
        try:
            assert self._registry is not None
            body = generate_latest(self._registry)
        except Exception as exc:  # a bug in a collector: say so, keep serving
            return self._failed(exc)
        return _ok(body, head_only=method == b"HEAD")

    async def _collected(self, head: bytes) -> bytes:
        assert self._collect is not None
        try:
            body = await self._collect()
        except Exception as exc:
            return self._failed(exc)
        return _ok(body, head_only=head.startswith(b"HEAD "))

    def _failed(self, exc: Exception) -> bytes:
        if self._log is not None:
            self._log.error("metrics_failed", error=repr(exc))
        return _response(500, f"collecting metrics failed: {exc!r}\n".encode())


_COLLECT = b""
"""What ``_answer`` says when the exposition must be collected (asynchronously)."""


def _ok(body: bytes, *, head_only: bool) -> bytes:
    response = _response(200, body, CONTENT_TYPE)
    return response[: len(response) - len(body)] if head_only else response


def _bearer_matches(head: bytes, token: bytes) -> bool:
    """Whether the request's Authorization header carries ``token`` as a bearer token
    (compared in constant time, so its bytes cannot be guessed one at a time)."""
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"authorization":
            scheme, _, credentials = value.strip().partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token)
    return False


def _response(status: int, body: bytes, content_type: bytes = b"text/plain") -> bytes:
    lines = [
        b"HTTP/1.1 %d %s" % (status, _REASONS[status]),
        b"Content-Type: " + content_type,
        b"Content-Length: %d" % len(body),
        b"Connection: close",
    ]
    if status == 405:
        lines.append(b"Allow: GET, HEAD")
    if status == 401:
        lines.append(b"WWW-Authenticate: Bearer")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
}
