"""The commands that change the lock table, and their bytes in the Raft log.

A command is a frozen dataclass. ``encode_command`` turns it into a CBOR array
whose first item names the command, encoded canonically so equal commands
give equal bytes. ``decode_command`` is strict: it accepts exactly the shapes
``encode_command`` produces and raises ``CommandError`` for anything else, so a
bad payload in the log becomes an ``Invalid`` result instead of an exception
inside apply.

Two generations of encodings live in the log. The previous release wrote
version-1 commands (``"open"``, ``"close"``, ``"acquire"``, ``"release"``,
``"expire"``), whose only request identity is a random ``seq`` per lease;
they decode to the same classes with ``Origin.client == ""`` (a "legacy"
origin) and are applied with that release's rules. A cluster at version 2
writes the ``*2`` encodings, which carry the whole ``Origin`` (client id,
rising seq, acknowledged floor), the lease incarnation on ``expire2``, the
grant's token on ``release2``, and the commands version 1 lacks
(``update2``, ``version``). A cluster at version 3 writes ``open3``, an
``open2`` with the identity that opened the lease (its owner) and that
identity's lease quota, and ``acquire3``, an ``acquire2`` with the asking
identity and the owner's lock quota; an open or acquire with neither keeps its
version-2 form. A cluster at version 4 writes ``open4`` (an ``open3`` with the
lease's lock-delay) for a lease that asks for one, and ``revoke4`` (a close by
``dlm lease revoke``, which starts the lock-delay of the keys the lease held); the
end of a key's lock-delay is an ``expire2`` of the pseudo-lease ``~delay:KEY``.
A version-1 command is encoded exactly as the
previous release did, so members of both releases apply the same bytes while
a cluster is being upgraded (docs/PROTOCOL.md, "Mixed versions").

Decoding checks types only; ``validate_command`` checks ranges with the rules
of dlm/limits.py. The state machine runs both; the node machine runs
``validate_command`` before proposing, to spare the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import cbor2

from dlm.limits import (
    INT_MAX,
    REQUEST_ID_MAX_BYTES,
    check_client_id,
    check_hold_ms,
    check_identity,
    check_identity_limit,
    check_key,
    check_lease_id,
    check_limit,
    check_lock_delay_ms,
    check_meta,
    check_seq,
    check_ttl_ms,
)
from dlm.node.locks import identities
from dlm.node.locks.ledger import RunReport, report_from_item
from dlm.node.locks.settings import setting_problem

CLUSTER_VERSION_MAX = 5
"""The highest cluster version a ``version`` entry may name (machine_config.PROTOCOL_SPOKEN
is the one this release runs; 5 adds the cluster settings: settings.py)."""

COMMAND_MAX_BYTES = 64 * 1024
"""Larger payloads are refused before CBOR decoding even starts."""
LEGACY_CLIENT = ""
"""The client id of a version-1 request: it has a random seq and no client."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Who asked for a command, for at-most-once execution (docs/PROTOCOL.md).

    ``client`` is the requesting process's id, ``seq`` rises with each of its
    requests, and every request of that client at or below ``acked`` has been
    answered and will not be re-sent. A legacy origin (``client == ""``) has
    a random ``seq`` and no floor.
    """

    client: str
    seq: int
    acked: int = 0

    @property
    def legacy(self) -> bool:
        return self.client == LEGACY_CLIENT


@dataclass(frozen=True, slots=True)
class OpenLeaseCommand:
    """Start a lease (session) with the client-chosen id.

    ``ephemeral``: opened by ``dlm acquire`` for one lock, so a release that
    leaves it idle ends it. ``meta``: who opened it, for ``dlm lease list``.
    ``owner``: the identity the opening connection authenticated as ("" before
    cluster version 3, or when nothing named one); only its opener (or an admin)
    may end the lease, and the identity's quotas count it. ``quota``: the most leases
    that owner may have (the leader looks it up when it proposes, so every replica
    decides alike from the log); 0: no such limit. ``lock_delay_ms``: when the lease
    expires or is revoked while holding a key, the key is granted to nobody for this
    long (0: no delay; cluster version 4).
    """

    lease: str
    ttl_ms: int
    origin: Origin
    at_ms: int
    ephemeral: bool = False
    meta: Mapping[str, str] = field(default_factory=dict, hash=False)
    owner: str = ""
    quota: int = 0
    lock_delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class CloseLeaseCommand:
    """End a lease: release its locks, leave its queues, grant the next waiters."""

    lease: str
    origin: Origin
    at_ms: int
    by: str = ""
    """The identity that asked (cluster version 3; "" before): see identities.py."""
    report: RunReport | None = None
    """How the run of the lease's grant ended (`dlm exec`; cluster version 4): ledger.py."""
    revoke: bool = False
    """Asked by ``dlm lease revoke`` (cluster version 4): the lease's lock-delay applies to
    the keys it held, as on an expiry. A close by the lease's own process is a release."""


@dataclass(frozen=True, slots=True)
class AcquireCommand:
    """Take ``key`` (exclusive when ``limit`` is 1, else a semaphore of ``limit`` slots).

    ``wait`` asks for a place in the key's FIFO queue when no slot is free. ``quota``:
    the most held slots plus places in queues the lease's owner may have (0: no such
    limit; version 3, as for ``OpenLeaseCommand.quota``).
    """

    lease: str
    key: str
    wait: bool
    limit: int
    meta: Mapping[str, str] = field(hash=False)
    origin: Origin
    at_ms: int
    by: str = ""
    quota: int = 0


@dataclass(frozen=True, slots=True)
class ReleaseCommand:
    """Give up a held slot of ``key``, or the lease's place in its queue.

    ``token``: act only on the grant with this fencing token (None: on the
    lease's current grant). ``keep_lease``: do not end an ephemeral lease that
    this release leaves idle.
    """

    lease: str
    key: str
    token: int | None
    keep_lease: bool
    origin: Origin
    at_ms: int
    by: str = ""


@dataclass(frozen=True, slots=True)
class UpdateLeaseCommand:
    """Give a lease a new TTL (its clock restarts with it); ``finished`` marks a minimum hold."""

    lease: str
    ttl_ms: int
    finished: bool
    origin: Origin
    at_ms: int
    by: str = ""
    report: RunReport | None = None
    """With ``finished``: how the run ended (cluster version 4), as on a close."""


@dataclass(frozen=True, slots=True)
class ProclaimCommand:
    """Replace the election value (the grant's ``value`` metadata entry) of the key the lease
    holds, without a new grant (`dlm proclaim`; cluster version 4)."""

    lease: str
    key: str
    value: str
    origin: Origin
    at_ms: int
    by: str = ""


ELECTION_VALUE = "value"
"""The metadata entry of a grant that holds an election's value."""


@dataclass(frozen=True, slots=True)
class ExpireCommand:
    """Proposed by the leader alone when a lease's deadline passed; ends that incarnation.

    ``incarnation`` 0 (a version-1 expire) ends a lease opened at version 1, whose
    incarnation is 0; like any other, it does nothing to another incarnation.
    """

    lease: str
    incarnation: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class IdentityCommand:
    """A change to the identity table (cluster version 3), asked by identity ``by``.

    ``op``: ``add`` (name, role, prefixes and the new key's verifier), ``remove``,
    ``rotate`` (the new key's verifier) or ``finish`` (the rotation's old key ends).
    Only verifiers are logged, never a secret (identities.py).

    Cluster version 4 adds ``limits`` (the identity's own quotas: per
    identities.QUOTA_KINDS a value, 0 for the members' default or -1 for unchanged) and
    ``request`` (a removal's request id, so that a re-sent removal is answered done):
    both in the ``identity4`` form, which only a version-4 log applies.
    """

    op: str
    name: str
    role: str
    prefixes: tuple[str, ...]
    key_id: bytes
    stored_key: bytes
    server_key: bytes
    by: str
    at_ms: int
    request: bytes = b""
    limits: tuple[int, ...] = ()

    @property
    def needs_version_4(self) -> bool:
        return self.op == "limits" or bool(self.request)


IDENTITY_OPS = ("add", "remove", "rotate", "finish", "limits")


@dataclass(frozen=True, slots=True)
class SettingsCommand:
    """Sets a cluster-wide setting (`dlm config set`, cluster version 5), asked by identity
    ``by`` (an admin, checked again at apply): ``setting`` is one of settings.KEYS and
    ``value_ms`` its value (0: unset). Only a version-5 log applies it."""

    setting: str
    value_ms: int
    by: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class ClusterVersionCommand:
    """From this entry on, the log holds commands of ``version`` (proposed by the leader)."""

    version: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class QuarantineCommand:
    """Proposed by a leader of a quarantined (restored or recovered) cluster when it takes
    office: the quarantine ends, by its clock, at ``until_ms`` (wall clock, for display
    only: the end itself is an Expire of ``QUARANTINE_LEASE``). Cluster version 3."""

    until_ms: int
    at_ms: int


QUARANTINE_LEASE = "~quarantine"
"""The lease id under which a quarantine is tracked by the leader's lease deadlines; no
client can name it (``~`` is not in a lease id's alphabet), so only an Expire ends it."""
DELAY_LEASE_PREFIX = "~delay:"
"""A key's lock-delay is tracked by the leader's lease deadlines as the pseudo-lease
``~delay:KEY`` (as the quarantine is), so a new leader counts it afresh from its own
election; only an Expire of it ends the delay."""


def delay_lease(key: str) -> str:
    """The pseudo-lease that tracks ``key``'s lock-delay."""
    return DELAY_LEASE_PREFIX + key


def delayed_key(lease: str) -> str | None:
    """The key whose lock-delay ``lease`` tracks, or None for any other lease id."""
    if lease.startswith(DELAY_LEASE_PREFIX):
        return lease[len(DELAY_LEASE_PREFIX) :]
    return None


LeaseCommand = (
    OpenLeaseCommand
    | CloseLeaseCommand
    | AcquireCommand
    | ReleaseCommand
    | UpdateLeaseCommand
    | ProclaimCommand
    | ExpireCommand
)
Command = (
    LeaseCommand | ClusterVersionCommand | QuarantineCommand | IdentityCommand | SettingsCommand
)
ClientCommand = (
    OpenLeaseCommand
    | CloseLeaseCommand
    | AcquireCommand
    | ReleaseCommand
    | UpdateLeaseCommand
    | ProclaimCommand
)


class CommandError(ValueError):
    """A payload that is not a well-formed command."""


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------


def is_legacy(cmd: Command) -> bool:
    """Whether ``cmd`` has a version-1 encoding (what a cluster at version 1 must write)."""
    match cmd:
        case OpenLeaseCommand():
            return (
                cmd.origin.legacy
                and not cmd.ephemeral
                and not cmd.meta
                and not cmd.owner
                and not cmd.quota
                and not cmd.lock_delay_ms
            )
        case AcquireCommand():
            return cmd.origin.legacy and not cmd.quota
        case CloseLeaseCommand():
            return cmd.origin.legacy and not cmd.revoke
        case ReleaseCommand():
            return cmd.origin.legacy and cmd.token is None and cmd.keep_lease
        case ExpireCommand():
            return cmd.incarnation == 0
    return False


def encode_command(cmd: Command) -> bytes:
    """The canonical bytes of ``cmd`` for a Raft entry (version 1 where it has such a form)."""
    return bytes(cbor2.dumps(_to_item(cmd), canonical=True))


def _origin(o: Origin) -> list[Any]:
    return [o.client, o.seq, o.acked]


def _to_item(cmd: Command) -> list[Any]:
    legacy = is_legacy(cmd)
    match cmd:
        case OpenLeaseCommand():
            if legacy:
                return ["open", cmd.lease, cmd.ttl_ms, cmd.at_ms]
            fields = [
                cmd.lease,
                cmd.ttl_ms,
                cmd.ephemeral,
                dict(cmd.meta),
                *_origin(cmd.origin),
                cmd.at_ms,
            ]
            if cmd.lock_delay_ms:
                return ["open4", *fields, cmd.owner, cmd.quota, cmd.lock_delay_ms]
            if cmd.owner or cmd.quota:
                return ["open3", *fields, cmd.owner, cmd.quota]
            return ["open2", *fields]
        case CloseLeaseCommand():
            if legacy:
                return ["close", cmd.lease, cmd.origin.seq, cmd.at_ms]
            if cmd.revoke:
                # An operator's revocation carries no run report: the run it ends ends
                # as supervisor_gone, as on an expiry.
                return ["revoke4", cmd.lease, *_origin(cmd.origin), cmd.at_ms, cmd.by]
            return _by(cmd.by, ["close2", cmd.lease, *_origin(cmd.origin), cmd.at_ms], cmd.report)
        case AcquireCommand():
            if legacy:
                return [
                    "acquire",
                    cmd.lease,
                    cmd.origin.seq,
                    cmd.key,
                    cmd.wait,
                    cmd.limit,
                    dict(cmd.meta),
                    cmd.at_ms,
                ]
            fields = [
                cmd.lease,
                cmd.key,
                cmd.wait,
                cmd.limit,
                dict(cmd.meta),
                *_origin(cmd.origin),
                cmd.at_ms,
            ]
            if cmd.by or cmd.quota:
                # The asking identity, then the owner's lock quota (0: none).
                return ["acquire3", *fields, cmd.by, cmd.quota]
            return ["acquire2", *fields]
        case ReleaseCommand():
            if legacy:
                return ["release", cmd.lease, cmd.origin.seq, cmd.key, cmd.at_ms]
            return _by(
                cmd.by,
                [
                    "release2",
                    cmd.lease,
                    cmd.key,
                    cmd.token,
                    cmd.keep_lease,
                    *_origin(cmd.origin),
                    cmd.at_ms,
                ],
            )
        case UpdateLeaseCommand():
            return _by(
                cmd.by,
                ["update2", cmd.lease, cmd.ttl_ms, cmd.finished, *_origin(cmd.origin), cmd.at_ms],
                cmd.report,
            )
        case ProclaimCommand():
            return [
                "proclaim4",
                cmd.lease,
                cmd.key,
                cmd.value,
                *_origin(cmd.origin),
                cmd.at_ms,
                cmd.by,
            ]
        case ExpireCommand():
            if legacy:
                return ["expire", cmd.lease, cmd.at_ms]
            return ["expire2", cmd.lease, cmd.incarnation, cmd.at_ms]
        case ClusterVersionCommand():
            return ["version", cmd.version, cmd.at_ms]
        case QuarantineCommand():
            return ["quarantine3", cmd.until_ms, cmd.at_ms]
        case SettingsCommand():
            return ["settings5", cmd.setting, cmd.value_ms, cmd.by, cmd.at_ms]
        case IdentityCommand():
            fields = [
                cmd.op,
                cmd.name,
                cmd.role,
                list(cmd.prefixes),
                cmd.key_id,
                cmd.stored_key,
                cmd.server_key,
                cmd.by,
                cmd.at_ms,
            ]
            if cmd.needs_version_4:
                # The version-3 form, then the request id and the limits.
                return ["identity4", *fields, cmd.request, list(cmd.limits)]
            return ["identity", *fields]


def _by(by: str, item: list[Any], report: RunReport | None = None) -> list[Any]:
    """A version-2 form, or (with the asking identity) its version-3 form: name + "3"
    (``close3``, ...), the identity last; with a run's report its version-4 form
    (``close4``, ``update4``): the identity ("" for none), then the report."""
    if report is not None:
        return [item[0][:-1] + "4", *item[1:], by, report.item()]
    if not by:
        return item
    return [item[0][:-1] + "3", *item[1:], by]


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

_ARITY = {
    "open": 3,
    "close": 3,
    "acquire": 7,
    "release": 4,
    "expire": 2,
    "open2": 8,
    "open3": 10,
    "open4": 11,
    "revoke4": 6,
    "proclaim4": 8,
    "close2": 5,
    "acquire2": 9,
    "release2": 8,
    "update2": 7,
    "expire2": 3,
    "version": 2,
    "quarantine3": 2,
    "close3": 5 + 1,
    "acquire3": 9 + 2,
    "release3": 8 + 1,
    "update3": 7 + 1,
    "identity": 9,
    "close4": 5 + 2,
    "update4": 7 + 2,
    "identity4": 9 + 2,
    "settings5": 4,
}


def decode_command(data: bytes) -> Command:
    """Parse bytes made by ``encode_command``; raise ``CommandError`` for anything else."""
    if len(data) > COMMAND_MAX_BYTES:
        raise CommandError(f"command is {len(data)} bytes; the limit is {COMMAND_MAX_BYTES}")
    try:
        item = cbor2.loads(data)
    except Exception as exc:  # cbor2 raises several types on garbage; all mean the same here
        raise CommandError(f"command is not valid CBOR ({type(exc).__name__})") from None
    if not isinstance(item, list) or not item or not isinstance(item[0], str):
        raise CommandError("command must be a CBOR array that starts with its name")
    name, f = item[0], item[1:]
    arity = _ARITY.get(name)
    if arity is None:
        raise CommandError(f"unknown command {name[:32]!r}")
    if len(f) != arity:
        raise CommandError(f"{name} takes {arity} fields, got {len(f)}")
    return _from_fields(name, f)


def _from_fields(name: str, f: list[Any]) -> Command:
    """The command named ``name`` from its fields (their count already checked). A later
    version's form reads its earlier form from the leading fields, then its own: from the
    decoded fields themselves (a log replay reads a hundred thousand of them, and encoding
    the earlier form again to decode it would double the work)."""
    if name == "open3":
        # Its version-2 form, then the owner and the owner's lease quota.
        opening = _from_fields("open2", f[:-2])
        assert isinstance(opening, OpenLeaseCommand)
        return replace(opening, owner=_str(f[-2], "owner"), quota=_int(f[-1], "quota"))
    if name == "open4":
        # Its version-3 form, then the lease's lock-delay.
        opening = _from_fields("open3", f[:-1])
        assert isinstance(opening, OpenLeaseCommand)
        return replace(opening, lock_delay_ms=_int(f[-1], "lock_delay_ms"))
    if name == "proclaim4":
        return ProclaimCommand(
            lease=_str(f[0], "lease"),
            key=_str(f[1], "key"),
            value=_str(f[2], "value"),
            origin=_read_origin(f[3:6]),
            at_ms=_int(f[6], "at_ms"),
            by=_str(f[7], "by"),
        )
    if name == "revoke4":
        # A close2's fields, then the asking identity ("" when nothing names one).
        closing = _from_fields("close2", f[:-1])
        assert isinstance(closing, CloseLeaseCommand)
        return replace(closing, by=_str(f[-1], "by"), revoke=True)
    if name == "acquire3":
        # Its version-2 form, then the asking identity and the owner's lock quota (built
        # at once: the most common entry of a busy log).
        return _acquire2(f, by=_str(f[-2], "by"), quota=_int(f[-1], "quota"))
    if name in ("close4", "update4"):
        # A version-4 form: its version-2 form, the asking identity ("" for none), the report.
        cmd = _from_fields(name[:-1] + "2", f[:-2])
        assert isinstance(cmd, CloseLeaseCommand | UpdateLeaseCommand)
        try:
            report = report_from_item(f[-1])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if report is None:
            raise CommandError(f"{name} carries no run report")
        return replace(cmd, by=_str(f[-2], "by"), report=report)
    if name in _WITH_BY:
        # A version-3 form: its version-2 form with the asking identity last.
        cmd = _from_fields(name[:-1] + "2", f[:-1])
        by = _str(f[-1], "by")
        if not by:
            raise CommandError(f"{name} names no identity")
        assert isinstance(
            cmd, CloseLeaseCommand | AcquireCommand | ReleaseCommand | UpdateLeaseCommand
        )
        return replace(cmd, by=by)
    if name == "identity":
        return _identity(f)
    if name == "identity4":
        change = _identity(f[:-2])
        own = f[-1]
        if type(own) is not list:
            raise CommandError("limits must be a list")
        return replace(
            change,
            request=_bytes(f[-2], "request"),
            limits=tuple(_int(v, "limit") for v in own),
        )
    match name:
        case "open":
            return OpenLeaseCommand(
                _str(f[0], "lease"), _int(f[1], "ttl_ms"), _legacy(), _int(f[2], "at_ms")
            )
        case "close":
            return CloseLeaseCommand(
                _str(f[0], "lease"), _legacy(_int(f[1], "seq")), _int(f[2], "at_ms")
            )
        case "acquire":
            return AcquireCommand(
                lease=_str(f[0], "lease"),
                key=_str(f[2], "key"),
                wait=_bool(f[3], "wait"),
                limit=_int(f[4], "limit"),
                meta=_meta(f[5]),
                origin=_legacy(_int(f[1], "seq")),
                at_ms=_int(f[6], "at_ms"),
            )
        case "release":
            return ReleaseCommand(
                lease=_str(f[0], "lease"),
                key=_str(f[2], "key"),
                token=None,
                keep_lease=True,
                origin=_legacy(_int(f[1], "seq")),
                at_ms=_int(f[3], "at_ms"),
            )
        case "expire":
            return ExpireCommand(_str(f[0], "lease"), 0, _int(f[1], "at_ms"))
        case "open2":
            return OpenLeaseCommand(
                lease=_str(f[0], "lease"),
                ttl_ms=_int(f[1], "ttl_ms"),
                ephemeral=_bool(f[2], "ephemeral"),
                meta=_meta(f[3]),
                origin=_read_origin(f[4:7]),
                at_ms=_int(f[7], "at_ms"),
            )
        case "close2":
            return CloseLeaseCommand(_str(f[0], "lease"), _read_origin(f[1:4]), _int(f[4], "at_ms"))
        case "acquire2":
            return _acquire2(f)
        case "release2":
            token = f[2]
            return ReleaseCommand(
                lease=_str(f[0], "lease"),
                key=_str(f[1], "key"),
                token=None if token is None else _int(token, "token"),
                keep_lease=_bool(f[3], "keep_lease"),
                origin=_read_origin(f[4:7]),
                at_ms=_int(f[7], "at_ms"),
            )
        case "update2":
            return UpdateLeaseCommand(
                lease=_str(f[0], "lease"),
                ttl_ms=_int(f[1], "ttl_ms"),
                finished=_bool(f[2], "finished"),
                origin=_read_origin(f[3:6]),
                at_ms=_int(f[6], "at_ms"),
            )
        case "expire2":
            return ExpireCommand(
                _str(f[0], "lease"), _int(f[1], "incarnation"), _int(f[2], "at_ms")
            )
        case "quarantine3":
            return QuarantineCommand(_int(f[0], "until_ms"), _int(f[1], "at_ms"))
        case "settings5":
            return SettingsCommand(
                _str(f[0], "setting"), _int(f[1], "value_ms"), _str(f[2], "by"), _int(f[3], "at_ms")
            )
        case _:  # "version"
            return ClusterVersionCommand(_int(f[0], "version"), _int(f[1], "at_ms"))


_WITH_BY = ("close3", "release3", "update3")


def _acquire2(f: list[Any], *, by: str = "", quota: int = 0) -> AcquireCommand:
    """An acquire from the fields of its version-2 form (``f[:9]``), with the asking
    identity and the owner's lock quota of its version-3 form."""
    return AcquireCommand(
        lease=_str(f[0], "lease"),
        key=_str(f[1], "key"),
        wait=_bool(f[2], "wait"),
        limit=_int(f[3], "limit"),
        meta=_meta(f[4]),
        origin=_read_origin(f[5:8]),
        at_ms=_int(f[8], "at_ms"),
        by=by,
        quota=quota,
    )


def _identity(f: list[Any]) -> IdentityCommand:
    prefixes = f[3]
    if type(prefixes) is not list:
        raise CommandError("prefixes must be a list")
    return IdentityCommand(
        op=_str(f[0], "op"),
        name=_str(f[1], "name"),
        role=_str(f[2], "role"),
        prefixes=tuple(_str(p, "prefix") for p in prefixes),
        key_id=_bytes(f[4], "key_id"),
        stored_key=_bytes(f[5], "stored_key"),
        server_key=_bytes(f[6], "server_key"),
        by=_str(f[7], "by"),
        at_ms=_int(f[8], "at_ms"),
    )


def _bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise CommandError(f"{what} must be a byte string, got {type(value).__name__}")
    return value


def _legacy(seq: int = 0) -> Origin:
    return Origin(LEGACY_CLIENT, seq)


def _read_origin(f: list[Any]) -> Origin:
    # Client "" is a version-1 request in a version-2 form (a release without
    # keep_lease from a previous-release client, say): ``encode_command`` writes it,
    # so it must read back, or the leader (applying its own command) and the
    # followers (applying these bytes) would part ways.
    return Origin(_str(f[0], "client"), _int(f[1], "seq"), _int(f[2], "acked"))


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def validate_command(cmd: Command) -> str | None:
    """Why ``cmd`` is out of range (a message for the user), or None when it is fine."""
    if not 0 <= cmd.at_ms <= INT_MAX:
        return "at_ms must be a non-negative wall-clock time in milliseconds"
    if isinstance(cmd, ClusterVersionCommand):
        return (
            None
            if 1 <= cmd.version <= CLUSTER_VERSION_MAX
            else f"unknown cluster version {cmd.version}"
        )
    if isinstance(cmd, QuarantineCommand):
        return None if 0 <= cmd.until_ms <= INT_MAX else "until_ms out of range"
    if isinstance(cmd, ExpireCommand) and cmd.lease == QUARANTINE_LEASE:
        return None if 0 <= cmd.incarnation <= INT_MAX else "incarnation out of range"
    if isinstance(cmd, ExpireCommand) and (key := delayed_key(cmd.lease)) is not None:
        if not 0 <= cmd.incarnation <= INT_MAX:
            return "incarnation out of range"
        return check_key(key)
    if isinstance(cmd, IdentityCommand):
        return _identity_problem(cmd)
    if isinstance(cmd, SettingsCommand):
        return setting_problem(cmd.setting, cmd.value_ms) or check_identity(cmd.by)
    problem = check_lease_id(cmd.lease)
    if problem is not None:
        return problem
    if isinstance(cmd, ExpireCommand):
        return None if 0 <= cmd.incarnation <= INT_MAX else "incarnation out of range"
    origin = cmd.origin
    problem = check_seq(origin.seq) or check_seq(origin.acked)
    if problem is None and not origin.legacy:
        problem = check_client_id(origin.client)
    by = getattr(cmd, "by", "")
    if problem is None and by:
        problem = identities.check_name(by)
    if problem is not None:
        return problem
    match cmd:
        case OpenLeaseCommand():
            return (
                check_ttl_ms(cmd.ttl_ms)
                or check_meta(cmd.meta)
                or check_identity(cmd.owner)
                or _check_quota(cmd.quota)
                or check_lock_delay_ms(cmd.lock_delay_ms)
            )
        case AcquireCommand():
            return (
                check_key(cmd.key)
                or check_limit(cmd.limit)
                or check_meta(cmd.meta)
                or _check_quota(cmd.quota)
            )
        case ReleaseCommand():
            if cmd.token is not None and not 0 < cmd.token <= INT_MAX:
                return "a fencing token is a positive log index"
            return check_key(cmd.key)
        case UpdateLeaseCommand():
            return check_hold_ms(cmd.ttl_ms) or _report_problem(cmd.report)
        case ProclaimCommand():
            return check_key(cmd.key) or check_meta({ELECTION_VALUE: cmd.value})
    return _report_problem(getattr(cmd, "report", None))


def _report_problem(report: RunReport | None) -> str | None:
    return None if report is None else report.problem()


def _identity_problem(cmd: IdentityCommand) -> str | None:
    if cmd.op not in IDENTITY_OPS:
        return f"unknown identity change {cmd.op[:32]!r}"
    problem = identities.check_name(cmd.name) or identities.check_name(cmd.by)
    if problem is not None:
        return problem
    if cmd.op == "add":
        if cmd.role not in identities.ROLES:
            return f"a role is {' or '.join(identities.ROLES)}"
        problem = identities.check_prefixes(cmd.prefixes)
        if problem is not None:
            return problem
    if len(cmd.request) > REQUEST_ID_MAX_BYTES:
        return f"a request id is at most {REQUEST_ID_MAX_BYTES} bytes"
    if cmd.op == "limits":
        if len(cmd.limits) != len(identities.QUOTA_KINDS):
            return f"a change of limits names {len(identities.QUOTA_KINDS)} of them"
        for value in cmd.limits:
            problem = check_identity_limit(value)
            if problem is not None:
                return problem
    elif cmd.limits:
        return f"an identity {cmd.op[:32]} changes no limits"
    if cmd.op in ("add", "rotate"):
        return identities.Verifier(cmd.key_id, cmd.stored_key, cmd.server_key).check()
    return None


def _str(value: object, what: str) -> str:
    if type(value) is not str:
        raise CommandError(f"{what} must be a text string, got {type(value).__name__}")
    return value


def _int(value: object, what: str) -> int:
    # bool is an int subclass in Python; a CBOR `true` is not a number here.
    if type(value) is not int:
        raise CommandError(f"{what} must be an integer, got {type(value).__name__}")
    if not -INT_MAX <= value <= INT_MAX:
        raise CommandError(f"{what} is out of the 64-bit range")
    return value


def _bool(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise CommandError(f"{what} must be true or false, got {type(value).__name__}")
    return value


def _meta(value: object) -> dict[str, str]:
    if type(value) is not dict:
        raise CommandError(f"meta must be a map of text to text, got {type(value).__name__}")
    for name, text in value.items():
        if type(name) is not str or type(text) is not str:
            raise CommandError("meta must be a map of text to text")
    return dict(value)


def _check_quota(quota: int) -> str | None:
    return None if 0 <= quota <= INT_MAX else "a quota is a non-negative count"
