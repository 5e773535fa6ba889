"""The protocol both sides of a dlm connection speak.

A connection carries frames: a 4-byte big-endian length, then one CBOR map.
The connecting side opens with a ``hello`` naming its role (``client`` or
``peer``), the protocol version and, for peers, the cluster id and its node
id; the accepting side answers ``welcome`` or an ``error`` and closes.

Client requests are maps with a type ``t`` and a request ``id`` chosen by the
client; every reply echoes the ``id``. A reply is ``ok`` (with fields that
depend on the request) or ``error`` (``code``, ``message`` and, depending on
the code, ``leader``, ``retry_after_ms``, ``holders``). A node may also push
frames with no ``id``: ``grant`` when a queued acquire is granted.

Peer frames carry Raft messages as compact positional arrays, several per
frame; their codec lives in dlm/node/peer_codec.py, so a client never pays
for importing it. Nothing here trusts its input: decoding accepts only the types it
expects and raises ``ProtocolError`` (never anything else) on the rest, so a
bad byte costs the sender its connection and nobody else anything.

This module does no IO and imports no event loop, so the blocking client and
the anyio runtime share it.
"""

from __future__ import annotations

import enum
import struct

import cbor2

# typing (like dataclasses) is left off the client's import path: `dlm acquire` would pay
# milliseconds for names only the type checker reads. mypy takes any TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, ClassVar, Protocol

    class FrameOpenerLike(Protocol):
        """dlm.auth.FrameOpener, named structurally: wire never imports dlm.auth."""

        overhead: int

        def open(self, payload: bytes) -> bytes: ...

    class FrameSealerLike(Protocol):
        def seal(self, body: bytes) -> bytes: ...


PROTOCOL_VERSION = 1
CLIENT_FRAME_LIMIT = 64 * 1024
PEER_FRAME_LIMIT = 4 * 1024 * 1024
DEFAULT_PORT = 7700

_LENGTH = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow. ``code`` is an ErrorCode."""

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code if code is not None else ErrorCode.BAD_REQUEST


class ErrorCode(enum.StrEnum):
    NOT_LEADER = "NOT_LEADER"
    LOCKED = "LOCKED"
    NOT_HOLDER = "NOT_HOLDER"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    NO_QUORUM = "NO_QUORUM"
    TIMEOUT = "TIMEOUT"
    BAD_REQUEST = "BAD_REQUEST"
    TOO_LARGE = "TOO_LARGE"
    UNAVAILABLE = "UNAVAILABLE"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    AUTH_FAILED = "AUTH_FAILED"


# ---------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------


def _reject_tag(*_: object) -> object:
    # Never reached: check_cbor refuses every tag first. Kept so that cbor2 on its own
    # (were the check ever bypassed) still refuses the tags it does not know.
    raise ProtocolError("CBOR tags are not allowed")


MAX_DEPTH = 16
"""Containers nested deeper than this are refused (dlm's own frames nest at most 5 deep)."""
INT_LIMIT = 1 << 63
"""Every integer on the wire has ``-INT_LIMIT < n < INT_LIMIT``: a signed 64-bit field holds it."""

# check_cbor looks at each item's first byte through one table. A positive entry is the
# whole size of an item that needs no more looking at (an integer of up to 4 bytes, true,
# false, null, or a string whose length fits in the first byte); the negative codes below
# name the items that need a second look; 0 means the byte is refused (see _REFUSAL).
_STRING_LEN1, _STRING_LEN2, _STRING_LEN4, _STRING_LEN8 = -1, -2, -3, -4
_ARRAY, _MAP = -5, -6
_UINT64, _NINT64 = -7, -8
_STEP = [0] * 256
_REFUSAL = [""] * 256


def _build_tables() -> None:
    for ib in range(256):
        major, info = ib >> 5, ib & 31
        refusal = ""
        if major <= 1:
            if info < 24:
                _STEP[ib] = 1
            elif info < 27:
                _STEP[ib] = 1 + (1 << (info - 24))
            elif info == 27:
                _STEP[ib] = _UINT64 if major == 0 else _NINT64
            else:
                refusal = f"malformed integer (initial byte 0x{ib:02x})"
        elif major <= 3:
            if info < 24:
                _STEP[ib] = 1 + info
            elif info < 28:
                _STEP[ib] = (_STRING_LEN1, _STRING_LEN2, _STRING_LEN4, _STRING_LEN8)[info - 24]
            elif info == 31:
                refusal = "indefinite-length strings are not allowed"
            else:
                refusal = f"malformed string (initial byte 0x{ib:02x})"
        elif major <= 5:
            if info < 28:
                _STEP[ib] = _ARRAY if major == 4 else _MAP
            elif info == 31:
                refusal = "indefinite-length arrays and maps are not allowed"
            else:
                refusal = f"malformed container (initial byte 0x{ib:02x})"
        elif major == 6:
            refusal = "CBOR tags are not allowed"
        elif info in (20, 21, 22):  # false, true, null
            _STEP[ib] = 1
        elif info in (25, 26, 27):
            refusal = "floating-point numbers are not allowed"
        elif info == 31:
            refusal = "unexpected CBOR break"
        else:
            refusal = f"CBOR simple value {info} is not allowed"
        _REFUSAL[ib] = refusal


_build_tables()


def check_cbor(body: bytes, max_depth: int = MAX_DEPTH) -> int:
    """Refuses (ProtocolError) any CBOR item dlm never sends; returns the number of items.

    ``body`` must hold exactly one item, built only of definite-length maps with text
    keys, definite-length arrays, integers with ``|n| < INT_LIMIT``, byte and text
    strings, true, false and null, nested at most ``max_depth`` containers deep. Tags,
    floats, other simple values and indefinite-length items are refused at their first
    byte, before any decoder builds a value from them.

    This is the whole defence against hostile CBOR: cbor2 5.x decodes its built-in tags
    (bignums, decimals, shared references, ...) before any hook sees them, and has no
    option to refuse them. The walk reads only item heads and skips string payloads by
    their length, so its cost is per item (at most one per byte), never per byte.
    """
    step_of = _STEP
    n = len(body)
    pos = 0
    items = 1
    left = 1  # items still to read in the innermost open container (the top level: 1)
    in_map = False
    stack: list[tuple[int, bool]] = []  # (left, in_map) of each enclosing container
    try:
        while True:
            while not left:
                if not stack:
                    if pos != n:
                        raise ProtocolError(
                            "frame ends inside a CBOR item"
                            if pos > n
                            else f"{n - pos} bytes after the end of the CBOR item"
                        )
                    return items
                left, in_map = stack.pop()
            ib = body[pos]
            # In a map, ``left`` counts keys and values down from 2 * pairs: even = a key.
            if in_map and not left & 1 and not 0x60 <= ib <= 0x7B:
                raise ProtocolError("map keys must be text strings")
            left -= 1
            step = step_of[ib]
            if step > 0:
                pos += step
            elif not step:
                raise ProtocolError(f"{_REFUSAL[ib]} (at byte {pos})")
            elif step >= _STRING_LEN8:
                if step == _STRING_LEN1:
                    pos += 2 + body[pos + 1]
                elif step == _STRING_LEN2:
                    pos += 3 + (body[pos + 1] << 8 | body[pos + 2])
                else:
                    size = 4 if step == _STRING_LEN4 else 8
                    pos += 1 + size + int.from_bytes(body[pos + 1 : pos + 1 + size], "big")
            elif step >= _MAP:
                info = ib & 31
                if info < 24:
                    count = info
                    pos += 1
                else:
                    size = 1 << (info - 24)
                    count = int.from_bytes(body[pos + 1 : pos + 1 + size], "big")
                    pos += 1 + size
                if len(stack) >= max_depth:
                    raise ProtocolError(f"frame nests containers more than {max_depth} deep")
                if count > n - pos:  # each item takes at least a byte
                    raise ProtocolError("frame ends inside a CBOR item")
                stack.append((left, in_map))
                in_map = step == _MAP
                left = 2 * count if in_map else count
                items += left
            elif step >= _NINT64:
                value = int.from_bytes(body[pos + 1 : pos + 9], "big")
                # A negative integer is encoded as -1 - value.
                if value >= (INT_LIMIT if step == _UINT64 else INT_LIMIT - 1):
                    raise ProtocolError(
                        f"integer out of range: |n| must be below 2**63 (at byte {pos})"
                    )
                pos += 9
    except IndexError:
        raise ProtocolError("frame ends inside a CBOR item") from None


def encode_frame(obj: object, sealer: FrameSealerLike | None = None) -> bytes:
    """The frame for ``obj``; sealed (with its authentication tag) by ``sealer`` if given."""
    body = cbor2.dumps(obj)
    if sealer is not None:
        return sealer.seal(body)
    return _LENGTH.pack(len(body)) + body


def decode_body(body: bytes) -> Any:
    """One frame's body as a value; ProtocolError (never anything else) if check_cbor or
    cbor2 refuses it. The value holds only dict, list, str, bytes, int, bool and None."""
    check_cbor(body)
    try:
        return cbor2.loads(body, tag_hook=_reject_tag)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("frame is nested too deeply") from None
    except Exception as exc:  # invalid UTF-8 in a text string, mostly
        raise ProtocolError(f"frame is not valid CBOR: {exc}") from None


class FrameDecoder:
    """Splits a byte stream into decoded frames; feed bytes in, take objects out.

    With an ``opener`` (a dlm.auth.FrameOpener, once a connection is authenticated)
    every frame must carry its authentication tag after the body: the tag is
    checked and stripped before the body is decoded, and a frame that fails it
    raises ProtocolError(AUTH_FAILED) now and on every later call (the connection
    must be closed). ``limit`` bounds the body; the tag comes on top.
    """

    def __init__(self, limit: int, opener: FrameOpenerLike | None = None) -> None:
        self._limit = limit
        self._opener = opener
        self._payload_limit = limit + (opener.overhead if opener is not None else 0)
        self._buf = bytearray()
        self._failed: str | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[Any]:
        if self._failed is not None:
            raise ProtocolError(self._failed, ErrorCode.AUTH_FAILED)
        buf = self._buf
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (length,) = _LENGTH.unpack_from(buf, pos)
                if length > self._payload_limit:
                    raise ProtocolError(
                        f"frame of {length} bytes exceeds the limit of {self._payload_limit}",
                        ErrorCode.TOO_LARGE,
                    )
                if len(buf) - pos - 4 < length:
                    break
                body = bytes(buf[pos + 4 : pos + 4 + length])
                pos += 4 + length
                if self._opener is not None:
                    try:
                        body = self._opener.open(body)
                    except ValueError as exc:  # dlm.auth.AuthError, which wire does not import
                        self._failed = str(exc)
                        raise ProtocolError(self._failed, ErrorCode.AUTH_FAILED) from None
                yield decode_body(body)
        finally:
            del buf[:pos]


# ---------------------------------------------------------------------------
# Field validation
# ---------------------------------------------------------------------------


def _field(msg: dict[Any, Any], name: str, kind: type, *, optional: bool = False) -> Any:
    if name not in msg:
        if optional:
            return None
        raise ProtocolError(f"missing field {name!r}")
    value = msg[name]
    if value is None and optional:
        return None
    # bool is an int subclass; an int field must not accept True.
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ProtocolError(f"field {name!r} must be an integer")
    if not isinstance(value, kind):
        raise ProtocolError(f"field {name!r} must be {kind.__name__}")
    return value


def _str_map(msg: dict[Any, Any], name: str) -> dict[str, str]:
    value = msg.get(name, {})
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ProtocolError(f"field {name!r} must be a map of strings to strings")
    return dict(value)


def as_map(obj: Any) -> dict[Any, Any]:
    if not isinstance(obj, dict):
        raise ProtocolError("frame must be a CBOR map")
    return obj


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------

_set = object.__setattr__


class Record:
    """Base of the small immutable value types here and in the client.

    They behave as frozen dataclasses do (equality and hash from the fields, a
    repr naming them, no assignment), but are written out by hand: importing
    dataclasses and generating the methods of each class cost ~15 ms of every
    `dlm` start-up. Each class lists its fields in ``FIELDS``, in order.
    """

    __slots__ = ()
    FIELDS: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.FIELDS])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({inner})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is immutable")


# ---------------------------------------------------------------------------
# Hello
# ---------------------------------------------------------------------------


class Role(enum.StrEnum):
    CLIENT = "client"
    PEER = "peer"


class Hello(Record):
    __slots__ = ("cluster", "node", "role", "version")
    FIELDS = ("role", "version", "cluster", "node")
    __match_args__ = ("role", "version", "cluster", "node")
    role: Role
    version: int
    cluster: str
    node: str

    def __init__(
        self, role: Role, version: int = PROTOCOL_VERSION, cluster: str = "", node: str = ""
    ) -> None:
        _set(self, "role", role)
        _set(self, "version", version)
        _set(self, "cluster", cluster)
        _set(self, "node", node)

    def to_wire(self) -> dict[str, Any]:
        return {
            "t": "hello",
            "role": self.role.value,
            "version": self.version,
            "cluster": self.cluster,
            "node": self.node,
        }

    @classmethod
    def from_wire(cls, obj: Any) -> Hello:
        msg = as_map(obj)
        if msg.get("t") != "hello":
            raise ProtocolError("a connection must open with a hello frame")
        role = _field(msg, "role", str)
        if role not in (Role.CLIENT.value, Role.PEER.value):
            raise ProtocolError(f"unknown role {role!r}")
        return cls(
            role=Role(role),
            version=_field(msg, "version", int),
            cluster=_field(msg, "cluster", str, optional=True) or "",
            node=_field(msg, "node", str, optional=True) or "",
        )


def welcome(node: str, cluster: str) -> dict[str, Any]:
    return {"t": "welcome", "version": PROTOCOL_VERSION, "node": node, "cluster": cluster}


# ---------------------------------------------------------------------------
# Client requests
# ---------------------------------------------------------------------------

_LEASE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


def _lease(msg: dict[Any, Any]) -> str:
    lease: str = _field(msg, "lease", str)
    # Stripping every allowed character leaves nothing iff there is no other one:
    # as quick as a regex, and the client need not import re (~2 ms).
    if not 0 < len(lease) <= 64 or lease.strip(_LEASE_CHARS):
        raise ProtocolError("lease id must be 1-64 characters of A-Z, a-z, 0-9, '_' or '-'")
    return lease


class Request(Record):
    """Base of every client request; ``id`` pairs a reply with its request.

    Fields are keyword-only, and ``to_wire`` gives the frame: ``t`` and the fields.
    """

    __slots__ = ("id",)
    TYPE: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[str, ...]] = ("id",)
    id: int

    def __init__(self, *, id: int) -> None:
        _set(self, "id", id)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.TYPE}
        for name in self.FIELDS:
            out[name] = getattr(self, name)
        return out


class OpenLease(Request):
    __slots__ = ("lease", "ttl_ms")
    TYPE = "open_lease"
    FIELDS = ("id", "lease", "ttl_ms")
    lease: str
    ttl_ms: int

    def __init__(self, *, id: int, lease: str, ttl_ms: int) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "ttl_ms", ttl_ms)


class KeepAlive(Request):
    """Renews a lease. Answered only after the leader has confirmed it still leads."""

    __slots__ = ("lease",)
    TYPE = "keepalive"
    FIELDS = ("id", "lease")
    lease: str

    def __init__(self, *, id: int, lease: str) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)


class CloseLease(Request):
    __slots__ = ("lease", "seq")
    TYPE = "close_lease"
    FIELDS = ("id", "lease", "seq")
    lease: str
    seq: int

    def __init__(self, *, id: int, lease: str, seq: int) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "seq", seq)


class Acquire(Request):
    __slots__ = ("key", "lease", "limit", "meta", "seq", "wait")
    TYPE = "acquire"
    FIELDS = ("id", "lease", "seq", "key", "wait", "limit", "meta")
    lease: str
    seq: int
    key: str
    wait: bool
    limit: int
    meta: dict[str, str]

    def __init__(
        self,
        *,
        id: int,
        lease: str,
        seq: int,
        key: str,
        wait: bool = False,
        limit: int = 1,
        meta: dict[str, str] | None = None,
    ) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "seq", seq)
        _set(self, "key", key)
        _set(self, "wait", wait)
        _set(self, "limit", limit)
        _set(self, "meta", {} if meta is None else meta)


class Release(Request):
    """Releases a held lock, or leaves the key's queue if only waiting."""

    __slots__ = ("key", "lease", "seq")
    TYPE = "release"
    FIELDS = ("id", "lease", "seq", "key")
    lease: str
    seq: int
    key: str

    def __init__(self, *, id: int, lease: str, seq: int, key: str) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "seq", seq)
        _set(self, "key", key)


class Get(Request):
    __slots__ = ("key", "stale")
    TYPE = "get"
    FIELDS = ("id", "key", "stale")
    key: str
    stale: bool

    def __init__(self, *, id: int, key: str, stale: bool = False) -> None:
        _set(self, "id", id)
        _set(self, "key", key)
        _set(self, "stale", stale)


class ListLocks(Request):
    __slots__ = ("prefix", "stale")
    TYPE = "list"
    FIELDS = ("id", "prefix", "stale")
    prefix: str
    stale: bool

    def __init__(self, *, id: int, prefix: str = "", stale: bool = False) -> None:
        _set(self, "id", id)
        _set(self, "prefix", prefix)
        _set(self, "stale", stale)


class LeaseInfo(Request):
    __slots__ = ("lease",)
    TYPE = "lease_info"
    FIELDS = ("id", "lease")
    lease: str

    def __init__(self, *, id: int, lease: str) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)


class Status(Request):
    """This member's view: role, term, indexes, and the leader's view of its peers."""

    __slots__ = ("stale",)
    TYPE = "status"
    FIELDS = ("id", "stale")
    stale: bool

    def __init__(self, *, id: int, stale: bool = False) -> None:
        _set(self, "id", id)
        _set(self, "stale", stale)


ClientRequest = (
    OpenLease | KeepAlive | CloseLease | Acquire | Release | Get | ListLocks | LeaseInfo | Status
)

MAX_KEY_BYTES = 512


def _key(msg: dict[Any, Any]) -> str:
    key: str = _field(msg, "key", str)
    if not key or len(key.encode()) > MAX_KEY_BYTES:
        raise ProtocolError(f"key must be 1-{MAX_KEY_BYTES} bytes")
    return key


def decode_request(obj: Any) -> ClientRequest:
    """Validates one client frame; raises ProtocolError naming what is wrong."""
    msg = as_map(obj)
    kind = msg.get("t")
    rid = _field(msg, "id", int)
    if kind == "open_lease":
        return OpenLease(id=rid, lease=_lease(msg), ttl_ms=_field(msg, "ttl_ms", int))
    if kind == "keepalive":
        return KeepAlive(id=rid, lease=_lease(msg))
    if kind == "close_lease":
        return CloseLease(id=rid, lease=_lease(msg), seq=_field(msg, "seq", int))
    if kind == "acquire":
        wait = _field(msg, "wait", bool, optional=True)
        limit = _field(msg, "limit", int, optional=True)
        return Acquire(
            id=rid,
            lease=_lease(msg),
            seq=_field(msg, "seq", int),
            key=_key(msg),
            wait=bool(wait),
            limit=1 if limit is None else limit,
            meta=_str_map(msg, "meta"),
        )
    if kind == "release":
        return Release(id=rid, lease=_lease(msg), seq=_field(msg, "seq", int), key=_key(msg))
    if kind == "get":
        return Get(id=rid, key=_key(msg), stale=bool(_field(msg, "stale", bool, optional=True)))
    if kind == "list":
        prefix = _field(msg, "prefix", str, optional=True) or ""
        stale = bool(_field(msg, "stale", bool, optional=True))
        return ListLocks(id=rid, prefix=prefix, stale=stale)
    if kind == "lease_info":
        return LeaseInfo(id=rid, lease=_lease(msg))
    if kind == "status":
        return Status(id=rid, stale=bool(_field(msg, "stale", bool, optional=True)))
    raise ProtocolError(f"unknown request type {kind!r}")


def ok(rid: int, **body: Any) -> dict[str, Any]:
    # The request id goes last so that no reply field can shadow it.
    return {"t": "ok", **body, "id": rid}


def error(rid: int | None, code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"t": "error", "code": code.value, "message": message}
    if rid is not None:
        out["id"] = rid
    out.update(extra)
    return out


def grant_push(lease: str, key: str, token: int) -> dict[str, Any]:
    return {"t": "grant", "lease": lease, "key": key, "token": token}


# ---------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------


def parse_addr(text: str) -> tuple[str, int]:
    """Parses HOST:PORT (or [IPv6]:PORT); a bare HOST gets the default port."""
    text = text.strip()
    if not text:
        raise ValueError("empty address")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"bad address {text!r}: missing ']'")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"bad address {text!r}: missing host")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad address {text!r}: port must be 1-65535")
    return host, int(port_text)


def format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
