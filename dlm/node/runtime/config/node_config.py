"""A node's configuration: what `dlm node start` was told, checked and completed.

``NodeConfig.from_flags`` turns the raw flag values into a checked config
with the embedded defaults filled in (no flags at all: a single-node cluster
``n1`` on 127.0.0.1:7700 with data in ./dlm-data). Every problem is a
``ConfigError`` whose message is one line a user can act on.

The data directory remembers which node and cluster created it, in
``DIR/node.json``; ``check_data_dir`` refuses to start a node on a directory
made for another one, because mixing two members' logs loses acknowledged
writes. It also remembers where the member listens (format 3), so a member
restarted without ``--listen`` serves where the others expect it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dlm.durations import DurationError, parse_duration
from dlm.node.machine import Quotas, Timing
from dlm.partitioning import check_partitions
from dlm.wire import format_addr, parse_addr

DEFAULT_NODE_ID = "n1"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7700
DEFAULT_DATA_DIR = "dlm-data"
DEFAULT_CLUSTER = "dlm"
META_FILE = "node.json"
META_FORMAT = 4
"""node.json's layout: 1 names the member and cluster, 2 adds the first members and
the members a joined one was told of, 3 adds ``listen`` (and ``advertise`` when given),
4 adds ``incarnation`` (0 for a cluster never restored or recovered: docs/ARCHITECTURE.md).
Each release reads every earlier one, and ignores keys it does not know."""
DEFAULT_MAX_CONNECTIONS = 8192
ELECTION_TIMEOUT_MIN_S = 0.15
"""Three ticks: a leader's heartbeats (one a tick) must be able to arrive twice within it."""
ELECTION_TIMEOUT_MAX_S = 60.0

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ConfigError(Exception):
    """A flag or the data directory does not make sense; the message is one line."""


class ForeignDataDir(ConfigError):
    """The data directory was made for another member or cluster: no restart fixes that,
    so `dlm node start` gives it an exit code of its own (65), which a service manager
    can be told not to restart on."""


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str
    listen: tuple[str, int]
    peers: dict[str, tuple[str, int]]
    """The cluster's first members (its bootstrap configuration) and their addresses: this
    member included, unless it joined later. After the first start the configuration
    comes from the log and snapshots; this map only says who the first voters were."""
    data_dir: Path
    cluster: str
    timing: Timing = field(default_factory=Timing)
    quotas: Quotas = field(default_factory=Quotas)
    shutdown_grace_s: float = 2.0
    """How long a stopping member waits for its in-flight requests."""
    snapshot_every: int = 10_000
    """Take a state-machine snapshot after this many applied entries."""
    snapshot_keep: int = 1_000
    """Entries kept in the log behind a snapshot, so a briefly lagging peer needs no snapshot."""
    fsync: bool = True
    metrics_listen: tuple[str, int] | None = None
    """Where to serve Prometheus metrics (None: nowhere)."""
    job_metrics: str | None = None
    """The key prefix whose run ledger the leader exports as dlm_job_* metrics (None: off)."""
    join: tuple[str, ...] = ()
    """Members to ask to be added, for a member that joins a running cluster."""
    advertise: tuple[str, int] | None = None
    """The address others reach this member at (default: its --peers entry, else --listen)."""
    auto_promote: bool = True
    join_members: dict[str, tuple[str, int]] = field(default_factory=dict)
    """For a member that joined: the cluster's members when it joined, with their addresses
    (recorded in node.json). It reaches them until its log names the configuration."""
    peers_given: bool = False
    """Whether --peers was given (it is only needed, and only used, at the first start)."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Client connections served at once (the runtime lowers it to fit the open-files limit)."""
    listen_given: bool = False
    """Whether --listen was given: when not, a data directory that recorded one listens there."""
    incarnation: int = 0
    """Which incarnation of the cluster this member belongs to: 0 for one never restored,
    else the index its restored or recovered log starts after (dlm/node/incarnation.py).
    Members of different incarnations refuse each other's links."""
    made_by: str = ""
    """``restored`` or ``recovered`` for a directory `dlm node restore`/`recover` built."""
    partition: int = 0
    """Which partition's Raft group this process serves (0 for a member of one partition)."""
    partitions: int = 1
    """How many partitions the cluster has (``--partitions``; 1: one group, no supervisor)."""

    @property
    def address(self) -> str:
        if self.advertise is not None:
            return format_addr(*self.advertise)
        if self.node_id in self.peers:
            return format_addr(*self.peers[self.node_id])
        return format_addr(*self.listen)

    @property
    def voters(self) -> tuple[str, ...]:
        return tuple(sorted(self.peers))

    def address_of(self, node_id: str | None) -> str | None:
        if node_id is None or node_id not in self.peers:
            return None
        host, port = self.peers[node_id]
        return format_addr(host, port)

    @classmethod
    def from_settings(cls, settings: Mapping[str, str | None]) -> NodeConfig:
        """The config for `dlm node start`'s settings (config/options.py), by parameter."""
        config = cls.from_flags(
            node_id=settings.get("node_id"),
            listen=settings.get("listen"),
            peers=settings.get("peers"),
            data=settings.get("data"),
            cluster=settings.get("cluster"),
        )
        metrics = settings.get("metrics_listen")
        default = Quotas()
        quotas = Quotas(
            max_leases=_count(settings.get("max_leases"), "--max-leases", default.max_leases),
            max_locks=_count(settings.get("max_locks"), "--max-locks", default.max_locks),
            max_meta_bytes=_count(
                settings.get("max_meta_bytes"), "--max-meta-bytes", default.max_meta_bytes
            ),
            max_connections=_count(
                settings.get("max_connections"), "--max-connections", DEFAULT_MAX_CONNECTIONS
            ),
            # 0: derived from the caps above (dlm/node/quotas.py, default_limits).
            identity_max_leases=_count(
                settings.get("identity_max_leases"), "--identity-max-leases", 0
            ),
            identity_max_locks=_count(
                settings.get("identity_max_locks"), "--identity-max-locks", 0
            ),
            identity_max_connections=_count(
                settings.get("identity_max_connections"), "--identity-max-connections", 0
            ),
            identity_max_inflight=_count(
                settings.get("identity_max_inflight"), "--identity-max-inflight", 0
            ),
        )
        join = settings.get("join")
        join_addrs: tuple[str, ...] = ()
        if join:
            join_addrs = tuple(format_addr(*_parse(a, "--join")) for a in join.split(",") if a)
            if settings.get("peers"):
                raise ConfigError(
                    "--join and --peers do not go together: --peers names the members of a new "
                    "cluster, --join asks a running one to add this member"
                )
        advertise = settings.get("advertise")
        auto = (settings.get("auto_promote") or "on").strip().lower()
        if auto not in ("on", "off"):
            raise ConfigError(f"--auto-promote takes on or off, not {auto!r}")
        if join_addrs:
            # A joining member is not among the first members: it learns them when it joins.
            config = replace(config, peers={})
        return replace(
            config,
            metrics_listen=parse_metrics_listen(metrics) if metrics else None,
            job_metrics=settings.get("job_metrics"),
            quotas=quotas,
            join=join_addrs,
            advertise=_parse(advertise, "--advertise") if advertise else None,
            auto_promote=auto == "on",
            peers_given=bool(settings.get("peers")),
            max_connections=_count(
                settings.get("max_connections"), "--max-connections", DEFAULT_MAX_CONNECTIONS
            ),
            timing=election_timing(settings.get("election_timeout")),
        )

    @classmethod
    def from_flags(
        cls,
        *,
        node_id: str | None,
        listen: str | None,
        peers: str | None,
        data: str | None,
        cluster: str | None,
    ) -> NodeConfig:
        node = node_id.strip() if node_id is not None else DEFAULT_NODE_ID
        check_id(node, "--id")
        cluster_id = cluster.strip() if cluster is not None else DEFAULT_CLUSTER
        check_id(cluster_id, "--cluster-id")

        peer_map = parse_peers(peers) if peers is not None else {}
        listen_addr = _parse(listen, "--listen") if listen is not None else None
        if not peer_map:
            peer_map = {node: listen_addr or (DEFAULT_HOST, DEFAULT_PORT)}
        elif node not in peer_map:
            known = ", ".join(sorted(peer_map))
            raise ConfigError(
                f"--peers does not include this node {node!r} (it names {known}): "
                f"add {node}=HOST:PORT to --peers or pick one of them with --id"
            )
        if listen_addr is None:
            listen_addr = peer_map[node]

        data_dir = Path(data) if data is not None else Path(DEFAULT_DATA_DIR)
        return cls(
            node_id=node,
            listen=listen_addr,
            peers=peer_map,
            data_dir=data_dir,
            cluster=cluster_id,
            listen_given=listen is not None,
        )


def _count(text: str | None, flag: str, default: int) -> int:
    if text is None or not text.strip():
        return default
    text = text.strip().replace("_", "")
    if not text.isdigit() or not 0 < int(text) < 2**62:
        raise ConfigError(f"{flag} must be a positive whole number; got {text!r}")
    return int(text)


def election_timing(text: str | None) -> Timing:
    """The member's timing for ``--election-timeout`` (a duration, like 300ms or 1s).

    The core draws each timeout between this and twice it (then widens and lengthens
    it after failed rounds and on a slow disk); it counts in ticks, so the value is
    rounded to the nearest tick (50 ms)."""
    default = Timing()
    if text is None or not text.strip():
        return default
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise ConfigError(f"--election-timeout: {exc}") from None
    if not ELECTION_TIMEOUT_MIN_S <= seconds <= ELECTION_TIMEOUT_MAX_S:
        raise ConfigError(f"--election-timeout must be between 150ms and 60s; got {text.strip()!r}")
    ticks = max(3, round(seconds / default.tick_s))
    return replace(default, election_ticks=ticks)


def check_id(value: str, flag: str) -> None:
    if not _ID_RE.match(value):
        raise ConfigError(
            f"{flag} {value!r} is not a valid name: use 1-63 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )


def _parse(text: str, what: str) -> tuple[str, int]:
    try:
        return parse_addr(text)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}; expected HOST:PORT, e.g. 127.0.0.1:7701") from None


def parse_metrics_listen(text: str) -> tuple[str, int]:
    """``--metrics-listen``: HOST:PORT with both given (a bare port or host would otherwise
    mean the member's own port, 7700, on that host); ConfigError, one line."""
    stripped = text.strip()
    if stripped.isdigit():
        raise ConfigError(
            f"--metrics-listen {stripped} is a bare port: give HOST:PORT, e.g. 127.0.0.1:{stripped}"
        )
    host, port = _parse(stripped, "--metrics-listen")
    if not (stripped.endswith(f":{port}") and stripped[: -len(f":{port}")]):
        raise ConfigError(
            f"--metrics-listen {stripped!r} names no port: give HOST:PORT, e.g. 127.0.0.1:9464"
        )
    return host, port


def parse_peers(text: str) -> dict[str, tuple[str, int]]:
    """Parses ``ID=HOST:PORT,ID=HOST:PORT``; raises ConfigError naming the bad item."""
    out: dict[str, tuple[str, int]] = {}
    items = [item.strip() for item in text.split(",")]
    for item in items:
        if not item:
            continue
        name, sep, addr = item.partition("=")
        name = name.strip()
        if not sep or not name or not addr.strip():
            raise ConfigError(
                f"--peers item {item!r} is malformed: expected ID=HOST:PORT, "
                "e.g. --peers n1=127.0.0.1:7701,n2=127.0.0.1:7702"
            )
        check_id(name, "--peers id")
        if name in out:
            raise ConfigError(f"--peers names {name!r} twice: each member must appear once")
        out[name] = _parse(addr, f"--peers address of {name}")
    if not out:
        raise ConfigError("--peers is empty: expected ID=HOST:PORT,ID=HOST:PORT,...")
    addrs = list(out.values())
    if len(set(addrs)) != len(addrs):
        raise ConfigError("--peers gives two members the same address: each needs its own port")
    return out


@dataclass(frozen=True, slots=True)
class DataDirMeta:
    """What ``node.json`` says: whose directory this is, and the cluster's first members."""

    node: str
    cluster: str
    peers: dict[str, tuple[str, int]] | None
    """The bootstrap members (None in a directory of the previous release, which did not
    record them)."""
    format: int
    join_members: dict[str, tuple[str, int]] = field(default_factory=dict)
    """For a member that joined: the members it was told of then."""
    listen: tuple[str, int] | None = None
    """Where the member listened when it last started (None before format 3)."""
    advertise: tuple[str, int] | None = None
    """The --advertise it was last given, if any (format 3)."""
    incarnation: int = 0
    """The cluster incarnation the directory belongs to (format 4; 0 before)."""
    made_by: str = ""
    """What built it: ``restored``, ``recovered``, or "" (`dlm node start`)."""


def check_data_dir(config: NodeConfig) -> DataDirMeta | None:
    """Refuses a data dir made for another node or cluster; None when it is new (no meta)."""
    path = config.data_dir / META_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise ConfigError(f"data dir {config.data_dir} is not a directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        meta = json.loads(raw)
        node, cluster = meta["node"], meta["cluster"]
        if not isinstance(node, str) or not isinstance(cluster, str):
            raise TypeError
        raw_peers = meta.get("peers")
        peers = None
        if raw_peers is not None:
            if not isinstance(raw_peers, dict):
                raise TypeError
            peers = {str(k): parse_addr(str(v)) for k, v in raw_peers.items()}
        raw_joined = meta.get("join_members", {})
        if not isinstance(raw_joined, dict):
            raise TypeError
        joined = {str(k): parse_addr(str(v)) for k, v in raw_joined.items()}
        version = int(meta.get("format", 1))
        listen = _recorded_addr(meta.get("listen"))
        advertise = _recorded_addr(meta.get("advertise"))
        incarnation = meta.get("incarnation", 0)
        if type(incarnation) is not int or not 0 <= incarnation < 2**63:
            raise TypeError
        made_by = str(meta.get("made_by", ""))
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{path} is damaged: it should name the node and cluster this data dir belongs to"
        ) from None
    if node != config.node_id or cluster != config.cluster:
        raise ForeignDataDir(
            f"data dir {config.data_dir} belongs to node {node!r} of cluster {cluster!r}, "
            f"not node {config.node_id!r} of cluster {config.cluster!r}: "
            "start with the matching --id/--cluster-id or use another --data"
        )
    return DataDirMeta(
        node, cluster, peers, version, joined, listen, advertise, incarnation, made_by
    )


def _recorded_addr(raw: object) -> tuple[str, int] | None:
    """An address node.json recorded (absent: None); raises TypeError/ValueError if bad."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise TypeError
    return parse_addr(raw)


PARTITIONS_FILE = "partitions.json"
"""In the data directory of a member with more than one partition: the partition count
it was created with, and whose directory it is. Each partition's own data directory
(``p0``, ``p1``, ...) beside it is a complete member data directory. A member of one
partition has none: its directory is laid out as in every earlier release."""


def partition_dir(data_dir: Path, partition: int) -> Path:
    """The data directory of one partition of a member with more than one."""
    return data_dir / f"p{partition}"


def parse_partitions(text: str | None) -> int | None:
    """``--partitions`` as a count (None: not given); ConfigError, one line, if it is bad."""
    if text is None or not text.strip():
        return None
    stripped = text.strip()
    if not stripped.isdigit():
        raise ConfigError(f"--partitions must be a whole number from 1 to 64, not {stripped!r}")
    count = int(stripped)
    problem = check_partitions(count)
    if problem is not None:
        raise ConfigError(f"--partitions: {problem}")
    return count


def recorded_partitions(data_dir: Path) -> int | None:
    """The partition count a data directory was created with (None: a new directory).
    A directory laid out for one partition (node.json at its top) says 1."""
    path = data_dir / PARTITIONS_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return 1 if (data_dir / META_FILE).exists() else None
    except OSError:
        return None  # an unusable data dir: refused, with its reason, when it is opened

    try:
        count = json.loads(raw)["partitions"]
        if type(count) is not int or check_partitions(count) is not None:
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{path} is damaged: it should say how many partitions this data dir has"
        ) from None
    return int(count)


def settle_partitions(given: int | None, recorded: int | None, data_dir: Path) -> int:
    """The partition count to start with: the one ``data_dir`` recorded, which
    ``--partitions`` may repeat but not change; ConfigError (one line) when it tries."""
    if recorded is None:
        return given or 1
    if given is not None and given != recorded:
        raise ConfigError(
            f"this data dir was created with --partitions {recorded}: {data_dir} cannot be "
            f"started with --partitions {given} (start it without --partitions, or with "
            f"--partitions {recorded}); to change the count restore a backup with --partitions"
        )
    return recorded


def write_partitions(config: NodeConfig, partitions: int) -> None:
    """Records the partition count of a new member data directory (atomically)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    body = json.dumps(
        {"format": 1, "partitions": partitions, "node": config.node_id, "cluster": config.cluster}
    )
    _write_atomically(config.data_dir, config.data_dir / PARTITIONS_FILE, body + "\n")


def _write_atomically(directory: Path, path: Path, body: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_meta(config: NodeConfig) -> None:
    """Records the owner of a data dir, the cluster's first members and where this member
    listens (atomically: temp file, fsync, rename, fsync of the directory)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    path = config.data_dir / META_FILE
    meta: dict[str, object] = {
        "format": META_FORMAT,
        "node": config.node_id,
        "cluster": config.cluster,
        "peers": {k: format_addr(*v) for k, v in sorted(config.peers.items())},
        "listen": format_addr(*config.listen),
        "incarnation": config.incarnation,
    }
    if config.made_by:
        meta["made_by"] = config.made_by
    if config.advertise is not None:
        meta["advertise"] = format_addr(*config.advertise)
    if config.join_members:
        meta["join_members"] = {k: format_addr(*v) for k, v in sorted(config.join_members.items())}
    _write_atomically(config.data_dir, path, json.dumps(meta) + "\n")
