"""What applying a command answers, and the read-only views of the lock table.

Results form a small closed set (``Result``). Each has ``code``: "OK" or the
wire error code the server should reply with, and ``to_dict()``: a plain
dict of str/int/bool/list/dict with a ``"type"`` entry, so the server can put
any result on the wire without knowing its class. ``result_from_dict`` is the
inverse; the state machine uses it to restore the cached last result of each
lease from a snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


def _plain(value: object) -> object:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


class _Plain:
    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Holder(_Plain):
    """One holder of a key: ``token`` is the log index of the entry that granted it."""

    lease: str
    token: int
    granted_at_ms: int
    meta: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Waiter(_Plain):
    """One lease in a key's FIFO queue, waiting since the leader's clock read ``since_ms``."""

    lease: str
    since_ms: int
    meta: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Promotion(_Plain):
    """A waiter that the apply step just made a holder; its member pushes the grant to it."""

    lease: str
    key: str
    token: int
    granted_at_ms: int


class _Result(_Plain):
    __slots__ = ()
    kind: ClassVar[str]
    code: ClassVar[str] = "OK"

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, **_Plain.to_dict(self)}


@dataclass(frozen=True, slots=True)
class Granted(_Result):
    kind = "granted"
    key: str
    token: int
    lease: str


@dataclass(frozen=True, slots=True)
class Queued(_Result):
    """The lease waits for ``key``; ``position`` 1 means it is next in line."""

    kind = "queued"
    key: str
    position: int


@dataclass(frozen=True, slots=True)
class Locked(_Result):
    """No slot free and the request did not ask to wait."""

    kind = "locked"
    code = "LOCKED"
    key: str
    holders: tuple[Holder, ...]
    retry_after_ms: int
    quarantined_until_ms: int | None = None
    """Set while the cluster is quarantined (restored or recovered, cluster version 3): no
    key is granted until then (wall clock; 0 when no leader has said when yet)."""

    def to_dict(self) -> dict[str, Any]:
        out = _Result.to_dict(self)
        if self.quarantined_until_ms is None:
            # As before version 3, so images of version-2 clusters keep their bytes.
            del out["quarantined_until_ms"]
        return out


@dataclass(frozen=True, slots=True)
class Released(_Result):
    """``held``: a held slot was given up (with fencing ``token``), else a queue place was.

    ``lease_ended``: the release left an ephemeral lease idle, which ended it.
    """

    kind = "released"
    key: str
    held: bool = True
    token: int | None = None
    lease_ended: bool = False


@dataclass(frozen=True, slots=True)
class NotHeld(_Result):
    """The lease neither holds nor waits for ``key`` (or holds it under another token)."""

    kind = "not_holder"
    code = "NOT_HOLDER"
    key: str
    holders: tuple[Holder, ...]


LEASE_EXPIRED, LEASE_CLOSED, LEASE_UNKNOWN = "expired", "closed", "unknown"
"""How a lease that does not exist ended, as a tombstone tells: ``expired`` (its TTL ran
out), ``closed`` (released or revoked), or ``unknown`` (no tombstone: never opened, or
ended longer ago than tombstones are kept). "" when the machine keeps no tombstones
(version 1) and cannot tell."""


@dataclass(frozen=True, slots=True)
class LeaseGone(_Result):
    """The lease does not exist: it expired, was closed, or was never opened (``ended``).

    ``ended`` is what the reply tells the client, not part of the state: results are
    compared, cached and imaged without it, as the previous release did.
    """

    kind = "session_expired"
    code = "SESSION_EXPIRED"
    lease: str
    ended: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "lease": self.lease}


@dataclass(frozen=True, slots=True)
class LeaseOpened(_Result):
    """``incarnation``: the index of the entry that created the lease (0 for version 1).

    ``joined``: the lease was live already and this request created nothing.
    """

    kind = "lease_opened"
    lease: str
    ttl_ms: int
    incarnation: int = 0
    joined: bool = False


@dataclass(frozen=True, slots=True)
class LeaseClosed(_Result):
    """The lease ended; ``released`` are the keys it held, sorted."""

    kind = "lease_closed"
    lease: str
    released: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LeaseUpdated(_Result):
    kind = "lease_updated"
    lease: str
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class StaleRequest(_Result):
    """A request at or below its client's acknowledged floor: answered before, not run again."""

    kind = "stale_request"
    code = "STALE_REQUEST"
    seq: int


@dataclass(frozen=True, slots=True)
class QuotaExceeded(_Result):
    """The lease's owner (``identity``) already has ``limit`` of what ``what`` counts
    ("leases", or "locks": held slots plus places in queues); nothing was done."""

    kind = "quota_exceeded"
    code = "QUOTA_EXCEEDED"
    identity: str
    what: str
    limit: int


@dataclass(frozen=True, slots=True)
class Invalid(_Result):
    kind = "bad_request"
    code = "BAD_REQUEST"
    message: str


@dataclass(frozen=True, slots=True)
class Denied(_Result):
    """The asking identity lacks the permission (identities.py); nothing changed."""

    kind = "permission_denied"
    code = "PERMISSION_DENIED"
    message: str
    identity: str = ""
    action: str = ""


@dataclass(frozen=True, slots=True)
class IdentityChanged(_Result):
    """An identity change was applied (``op``: add, remove, rotate or finish)."""

    kind = "identity_changed"
    op: str
    name: str


@dataclass(frozen=True, slots=True)
class SettingChanged(_Result):
    """A cluster-wide setting was set (``value_ms`` 0: unset; settings.py)."""

    kind = "setting_changed"
    setting: str
    value_ms: int


Result = (
    Granted
    | Queued
    | Locked
    | Released
    | NotHeld
    | LeaseGone
    | LeaseOpened
    | LeaseClosed
    | LeaseUpdated
    | StaleRequest
    | QuotaExceeded
    | Invalid
    | Denied
    | IdentityChanged
    | SettingChanged
)


def result_from_dict(d: Mapping[str, Any]) -> Result:
    """Rebuild a result from its ``to_dict()`` form; ValueError when it is not one."""
    try:
        match d["type"]:
            case "granted":
                return Granted(_s(d["key"]), _i(d["token"]), _s(d["lease"]))
            case "queued":
                return Queued(_s(d["key"]), _i(d["position"]))
            case "locked":
                until = d.get("quarantined_until_ms")
                return Locked(
                    _s(d["key"]),
                    _holders(d["holders"]),
                    _i(d["retry_after_ms"]),
                    None if until is None else _i(until),
                )
            case "released":
                token = d.get("token")
                return Released(
                    _s(d["key"]),
                    _b(d["held"]),
                    None if token is None else _i(token),
                    _b(d.get("lease_ended", False)),
                )
            case "not_holder":
                return NotHeld(_s(d["key"]), _holders(d["holders"]))
            case "session_expired":
                return LeaseGone(_s(d["lease"]))
            case "lease_opened":
                return LeaseOpened(
                    _s(d["lease"]),
                    _i(d["ttl_ms"]),
                    _i(d.get("incarnation", 0)),
                    _b(d.get("joined", False)),
                )
            case "lease_closed":
                released = d.get("released", [])
                if type(released) is not list:
                    raise ValueError("released must be a list")
                return LeaseClosed(_s(d["lease"]), tuple(_s(k) for k in released))
            case "lease_updated":
                return LeaseUpdated(_s(d["lease"]), _i(d["ttl_ms"]))
            case "stale_request":
                return StaleRequest(_i(d["seq"]))
            case "bad_request":
                return Invalid(_s(d["message"]))
            case "permission_denied":
                return Denied(_s(d["message"]), _s(d["identity"]), _s(d["action"]))
            case "identity_changed":
                return IdentityChanged(_s(d["op"]), _s(d["name"]))
            case "setting_changed":
                return SettingChanged(_s(d["setting"]), _i(d["value_ms"]))
            case "quota_exceeded":
                return QuotaExceeded(_s(d["identity"]), _s(d["what"]), _i(d["limit"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed result: {exc!r}") from None
    raise ValueError(f"unknown result type {d.get('type')!r}")


def holder_from_dict(d: Mapping[str, Any]) -> Holder:
    return Holder(_s(d["lease"]), _i(d["token"]), _i(d["granted_at_ms"]), str_map(d["meta"]))


def str_map(value: object) -> dict[str, str]:
    if type(value) is not dict or not all(
        type(k) is str and type(v) is str for k, v in value.items()
    ):
        raise ValueError("expected a map of text to text")
    return dict(value)


def _holders(value: object) -> tuple[Holder, ...]:
    if type(value) is not list:
        raise ValueError("holders must be a list")
    return tuple(holder_from_dict(h) for h in value)


def _s(value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"expected text, got {type(value).__name__}")
    return value


def _b(value: object) -> bool:
    if type(value) is not bool:
        raise ValueError(f"expected true or false, got {type(value).__name__}")
    return value


def _i(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    return value
