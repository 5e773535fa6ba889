"""Who may do what: the replicated table of client identities, and the permission rule.

Each identity has a name, a role (``admin`` or ``client``), for a client the key
prefixes it may lock, and one or two verifiers of its secret. A verifier is
what dlm/auth.py derives from the secret (a key id, StoredKey and ServerKey, in
the manner of SCRAM, RFC 5802): it lets a member check a client's proof, but it
cannot be used to make one, so a stolen snapshot or backup logs nobody in. The
secret itself never reaches a member.

Rotation keeps the old verifier valid until ``finish`` or until 24 hours after
the rotation (``old_until_ms``, the leader's wall clock in the rotate entry);
a member compares that with its own clock only when a client authenticates,
so applying stays clock-free.

Each identity may also have its own quotas (``dlm auth set``, cluster version 4):
``limits`` in the order of ``QUOTA_KINDS``, 0 for "the members' default" (their
``--identity-max-*`` flags); dlm/node/quotas.py lays them over the defaults.

A removal names the request that asked it (a client's ``request`` id, the same on
every re-send of one ``dlm auth remove``): the table remembers the last removals
(``REMOVALS_KEPT``), so a re-sent removal of an identity that this very request removed
is answered done, while a removal of an identity someone else removed, or that never
existed, is still refused.

The built-in identity ``admin`` is not in the table: it is whoever proves the
cluster's client secret (the one secret of earlier releases), or every client
of a cluster with no client secret at all. It cannot be added, removed or rotated.

``refusal`` is the permission rule, one function that the member receiving a
request and the state machine applying its entry both run, so an identity
removed between the two is refused at apply. Pure: no clock, no IO.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from dlm import limits

ADMIN = "admin"
"""The built-in admin identity (the cluster's client secret, or no secret at all)."""
ROLE_ADMIN = "admin"
ROLE_CLIENT = "client"
ROLES = (ROLE_ADMIN, ROLE_CLIENT)
ROTATION_GRACE_MS = 24 * 3600 * 1000
"""How long the old key stays valid after ``dlm auth rotate`` (unless ``--finish``)."""
MAX_IDENTITIES = 10_000
KEY_ID_BYTES = 8
KEY_BYTES = 32
QUOTA_KINDS = ("leases", "locks", "connections", "inflight")
"""The per-identity quotas an admin may set, in the order ``Identity.limits`` keeps them."""
NO_LIMITS = (0, 0, 0, 0)
"""An identity without settings of its own: the members' defaults."""
KEEP = -1
"""In a change of limits: this one stays as it is."""
REMOVALS_KEPT = 1024
"""How many recent removals the table remembers (to answer a re-sent removal)."""

# The permission each request kind needs (wire.py's table names one per kind):
ANY = "any"  # ping, status, members: every identity that exists
READ = "read"  # listings: answered, but filtered to what the identity may see
KEY = "key"  # a read of one key: the key must be under one of the identity's prefixes
LOCK = "lock"  # an acquire: the key under a prefix, and the lease the identity's own
LEASE = "lease"  # renew, update, release or close: the lease's opener, or an admin
ADMIN_ONLY = "admin"  # membership, identities, backups and restores
PERMISSIONS = (ANY, READ, KEY, LOCK, LEASE, ADMIN_ONLY)


check_name = limits.check_identity_name
check_prefixes = limits.check_identity_prefixes


@dataclass(frozen=True, slots=True)
class Verifier:
    """What a member keeps of one secret: enough to check a proof, not to make one."""

    key_id: bytes
    stored_key: bytes
    server_key: bytes
    until_ms: int | None = None
    """The old key of a rotation: valid until this wall-clock time (None: no end)."""

    def check(self) -> str | None:
        if len(self.key_id) != KEY_ID_BYTES:
            return f"a key id is {KEY_ID_BYTES} bytes"
        if len(self.stored_key) != KEY_BYTES or len(self.server_key) != KEY_BYTES:
            return f"a stored key and a server key are {KEY_BYTES} bytes each"
        return None


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    role: str
    prefixes: tuple[str, ...]
    keys: tuple[Verifier, ...]
    """The current key first; a second one while a rotation is unfinished."""
    limits: tuple[int, ...] = NO_LIMITS
    """Its own quotas, per ``QUOTA_KINDS`` (0: the members' default)."""

    @property
    def admin(self) -> bool:
        return self.role == ROLE_ADMIN

    def may_use_key(self, key: str) -> bool:
        return self.admin or key.startswith(self.prefixes)  # a tuple: any of them

    def row(self, now_ms: int | None = None) -> dict[str, Any]:
        """What ``dlm auth list`` and ``dlm store inspect`` show: never a key."""
        old = self.keys[1] if len(self.keys) > 1 else None
        rotating = old is not None and (
            now_ms is None or old.until_ms is None or old.until_ms > now_ms
        )
        return {
            "name": self.name,
            "role": self.role,
            "prefixes": list(self.prefixes),
            "key_id": self.keys[0].key_id.hex() if self.keys else "",
            "rotating": rotating,
            "old_key_until_ms": old.until_ms if old is not None else None,
            **{
                f"max_{kind}": value or None
                for kind, value in zip(QUOTA_KINDS, self.limits, strict=True)
            },
        }


class IdentityTable:
    """The identities, by name. Changed only by applied entries (see commands.py)."""

    __slots__ = ("_by_name", "_removed")

    def __init__(self) -> None:
        self._by_name: dict[str, Identity] = {}
        self._removed: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        """The last removals, oldest first: name -> (the request id that removed it, by whom)."""

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Identity | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def role_of(self, name: str) -> str | None:
        """``name``'s role, or None for an identity that does not exist (any more)."""
        if name == ADMIN:
            return ROLE_ADMIN
        identity = self._by_name.get(name)
        return None if identity is None else identity.role

    def limits_of(self, name: str) -> tuple[int, ...]:
        """``name``'s own quotas per ``QUOTA_KINDS`` (0: the default; all 0 for an identity
        that has none or does not exist)."""
        identity = self._by_name.get(name)
        return NO_LIMITS if identity is None else identity.limits

    def verifier(self, name: str, key_id: bytes, now_ms: int) -> Verifier | None:
        """The verifier a client proving ``name`` with key ``key_id`` is checked against at
        wall-clock ``now_ms`` (None: no such identity, key, or the old key ran out)."""
        identity = self._by_name.get(name)
        if identity is None:
            return None
        for verifier in identity.keys:
            if verifier.key_id == key_id and (
                verifier.until_ms is None or now_ms < verifier.until_ms
            ):
                return verifier
        return None

    # -- changes (from applied entries only) -----------------------------------

    def add(self, name: str, role: str, prefixes: tuple[str, ...], key: Verifier) -> str | None:
        """Adds ``name``; why not (None: added, or re-sent with the same key)."""
        old = self._by_name.get(name)
        if old is not None:
            if old.keys and old.keys[0].key_id == key.key_id:
                return None  # a re-sent add
            return f"identity {name!r} exists: remove it first, or rotate its key"
        if name == ADMIN:
            return f"{ADMIN!r} is the built-in admin (the cluster's client secret)"
        if len(self._by_name) >= MAX_IDENTITIES:
            return f"this cluster has {MAX_IDENTITIES} identities, the most it keeps"
        self._by_name[name] = Identity(name, role, prefixes if role == ROLE_CLIENT else (), (key,))
        self._removed.pop(name, None)
        return None

    def remove(self, name: str, request: bytes = b"", by: str = "") -> str | None:
        """Removes ``name``. ``request``: the asking request's id; a removal re-sent with
        the id of the one that removed ``name`` is done already (None), not refused."""
        if self._by_name.pop(name, None) is None:
            earlier = self._removed.get(name)
            if request and earlier is not None and earlier[0] == request:
                return None  # a re-sent removal whose first attempt's answer was lost
            if earlier is not None:
                return f"no identity {name!r} (identity {earlier[1]!r} removed it earlier)"
            return f"no identity {name!r}"
        self._removed.pop(name, None)
        self._removed[name] = (request, by)
        while len(self._removed) > REMOVALS_KEPT:
            self._removed.popitem(last=False)
        return None

    def set_limits(self, name: str, change: tuple[int, ...]) -> str | None:
        """Sets ``name``'s own quotas: per ``QUOTA_KINDS`` a value, 0 (back to the members'
        default) or KEEP."""
        identity = self._by_name.get(name)
        if identity is None:
            return f"no identity {name!r}"
        own = tuple(
            old if new == KEEP else new for old, new in zip(identity.limits, change, strict=True)
        )
        self._by_name[name] = replace(identity, limits=own)
        return None

    def rotate(self, name: str, key: Verifier, at_ms: int) -> str | None:
        """``key`` becomes current; the old one stays valid for ROTATION_GRACE_MS."""
        identity = self._by_name.get(name)
        if identity is None:
            return f"no identity {name!r}"
        current = identity.keys[0]
        if current.key_id == key.key_id:
            return None  # a re-sent rotate
        old = Verifier(
            current.key_id, current.stored_key, current.server_key, at_ms + ROTATION_GRACE_MS
        )
        self._by_name[name] = replace(identity, keys=(key, old))
        return None

    def finish(self, name: str) -> str | None:
        """Ends a rotation: only the new key is valid from now on."""
        identity = self._by_name.get(name)
        if identity is None:
            return f"no identity {name!r}"
        self._by_name[name] = replace(identity, keys=identity.keys[:1])
        return None

    # -- images ------------------------------------------------------------------

    def image(self, with_limits: bool = True) -> list[Any]:
        """Plain CBOR-able rows, sorted by name (equal tables give equal bytes). Each row
        ends with the identity's limits (node image format 4), unless ``with_limits`` is
        False (format 3, read by members of the previous release)."""
        return [
            [
                i.name,
                i.role,
                list(i.prefixes),
                [[k.key_id, k.stored_key, k.server_key, k.until_ms] for k in i.keys],
                *([list(i.limits)] if with_limits else []),
            ]
            for _, i in sorted(self._by_name.items())
        ]

    def removals_image(self) -> list[Any]:
        """The remembered removals, oldest first (node image format 4)."""
        return [[name, request, by] for name, (request, by) in self._removed.items()]

    @classmethod
    def restore(
        cls, rows: object, removals: object = None, *, with_limits: bool = True
    ) -> IdentityTable:
        """The table of ``image(with_limits)`` and ``removals_image()`` (None: none kept);
        ValueError for anything else."""
        table = cls()
        if type(rows) is not list:
            raise ValueError("identity table: expected a list")
        for row in rows:
            if type(row) is not list or len(row) != (5 if with_limits else 4):
                raise ValueError("identity table: a row has an unknown layout")
            name, role, prefixes, keys = row[:4]
            own = _limits(row[4]) if with_limits else NO_LIMITS
            if type(name) is not str or check_name(name) or role not in ROLES:
                raise ValueError("identity table: a bad name or role")
            if type(prefixes) is not list or not all(type(p) is str for p in prefixes):
                raise ValueError("identity table: bad prefixes")
            if type(keys) is not list or not 1 <= len(keys) <= 2:
                raise ValueError("identity table: bad keys")
            verifiers = []
            for key in keys:
                if type(key) is not list or len(key) != 4:
                    raise ValueError("identity table: a key has an unknown layout")
                key_id, stored, server, until = key
                if not all(type(b) is bytes for b in (key_id, stored, server)):
                    raise ValueError("identity table: a key is not bytes")
                if until is not None and type(until) is not int:
                    raise ValueError("identity table: a key's end is not an integer")
                verifier = Verifier(key_id, stored, server, until)
                if verifier.check() is not None:
                    raise ValueError("identity table: a key has the wrong size")
                verifiers.append(verifier)
            table._by_name[name] = Identity(name, role, tuple(prefixes), tuple(verifiers), own)
        for removal in [] if removals is None else _list(removals):
            if type(removal) is not list or len(removal) != 3:
                raise ValueError("identity table: a removal has an unknown layout")
            name, request, by = removal
            if type(name) is not str or type(request) is not bytes or type(by) is not str:
                raise ValueError("identity table: a removal is not a name, an id and a name")
            table._removed[name] = (request, by)
        return table

    def rows(self, now_ms: int | None = None) -> list[dict[str, Any]]:
        return [self._by_name[n].row(now_ms) for n in sorted(self._by_name)]


def _limits(value: object) -> tuple[int, ...]:
    if type(value) is not list or len(value) != len(QUOTA_KINDS):
        raise ValueError("identity table: bad limits")
    if not all(type(v) is int and 0 <= v <= limits.IDENTITY_LIMIT_MAX for v in value):
        raise ValueError("identity table: a limit is out of range")
    return tuple(value)


def _list(value: object) -> list[Any]:
    if type(value) is not list:
        raise ValueError("identity table: expected a list of removals")
    return value


# ---------------------------------------------------------------------------
# The permission rule
# ---------------------------------------------------------------------------


def refusal(
    table: IdentityTable,
    identity: str,
    action: str,
    permission: str,
    *,
    key: str | None = None,
    owner: str | None = None,
) -> str | None:
    """Why ``identity`` may not do ``action`` (a request kind) that needs ``permission``:
    one line naming the identity, the action and what it lacks; None when it may.

    ``key``: the key the request names. ``owner``: the identity that opened the lease it
    names ("" for a lease opened before identities, which only an admin may act on; None
    when there is no such lease, which the request's own rules answer).
    """
    role = table.role_of(identity)
    if role is None:
        return f"identity {identity!r} may not {action}: it no longer exists"
    if role == ROLE_ADMIN or permission == ANY:
        return None
    if permission == ADMIN_ONLY:
        return f"identity {identity!r} may not {action}: it lacks the admin role"
    if permission in (LOCK, LEASE) and owner is not None and owner != identity:
        whose = f"identity {owner!r}" if owner else "no identity (an older lease)"
        return (
            f"identity {identity!r} may not {action} on a lease opened by {whose}: "
            "it lacks the admin role"
        )
    if permission in (LOCK, KEY) and key is not None:
        held = table.get(identity)
        if held is None or not held.may_use_key(key):
            prefixes = ", ".join(repr(p) for p in held.prefixes) if held else ""
            return (
                f"identity {identity!r} may not {action} {key!r}: it lacks a prefix for it "
                f"(its prefixes: {prefixes or 'none'})"
            )
    return None


def may_see(table: IdentityTable, identity: str, key: str) -> bool:
    """Whether ``identity`` sees ``key`` in listings (an admin sees everything)."""
    return refusal(table, identity, "read", KEY, key=key) is None
