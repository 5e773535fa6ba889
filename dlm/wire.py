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

from dlm import limits

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


PROTOCOL_VERSION = 2
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
    STALE_REQUEST = "STALE_REQUEST"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    CONFLICT = "CONFLICT"
    UNSAFE = "UNSAFE"
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
    try:
        check_cbor(body)
    except ProtocolError as exc:
        raise ProtocolError(f"frame refused: not the CBOR dlm speaks: {exc}", exc.code) from None
    try:
        return cbor2.loads(body, tag_hook=_reject_tag)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("frame is nested too deeply") from None
    except Exception as exc:  # invalid UTF-8 in a text string, mostly
        raise ProtocolError(f"frame is not valid CBOR: {exc}") from None


class BadFrame:
    """A whole frame whose body is not the CBOR dlm speaks. The length prefix kept the
    stream in step, so the connection can go on: the member answers it BAD_REQUEST."""

    __slots__ = ("code", "message")

    def __init__(self, message: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> None:
        self.message = message
        self.code = code


class FrameDecoder:
    """Splits a byte stream into decoded frames; feed bytes in, take objects out.

    With ``tolerate_bad_bodies`` a body that does not decode comes out as a
    ``BadFrame`` instead of raising (a client's malformed request is its own
    problem, not the stream's); an oversized length still raises, since the
    stream can no longer be trusted to be in step.

    With an ``opener`` (a dlm.auth.FrameOpener, once a connection is authenticated)
    every frame must carry its authentication tag after the body: the tag is
    checked and stripped before the body is decoded, and a frame that fails it
    raises ProtocolError(AUTH_FAILED) now and on every later call (the connection
    must be closed). ``limit`` bounds the body; the tag comes on top.
    """

    def __init__(
        self,
        limit: int,
        opener: FrameOpenerLike | None = None,
        *,
        tolerate_bad_bodies: bool = False,
    ) -> None:
        self._limit = limit
        self._tolerate_bad_bodies = tolerate_bad_bodies
        self._opener = opener
        self._payload_limit = limit + (opener.overhead if opener is not None else 0)
        self._buf = bytearray()
        self._failed: str | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending(self) -> bool:
        """Whether part of a frame is buffered (a connection that stops here is stalled)."""
        return bool(self._buf)

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
                try:
                    value = decode_body(body)
                except ProtocolError as exc:
                    if not self._tolerate_bad_bodies:
                        raise
                    value = BadFrame(str(exc), exc.code)
                yield value
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


class HelloRole(enum.StrEnum):
    CLIENT = "client"
    PEER = "peer"


class Hello(Record):
    """The first frame of a connection.

    ``version`` is the lowest protocol version the sender speaks and
    ``max_version`` the highest; the connection speaks the lower of the two
    sides' maxima. A member of the previous release checks only that
    ``version`` is 1, so our clients and members send 1 there.
    """

    __slots__ = ("addr", "cluster", "max_version", "node", "role", "version")
    FIELDS = ("role", "version", "cluster", "node", "max_version", "addr")
    __match_args__ = ("role", "version", "cluster", "node", "max_version", "addr")
    role: HelloRole
    version: int
    cluster: str
    node: str
    max_version: int
    addr: str
    """A peer's own address (HOST:PORT, its --advertise), so that a member whose log does
    not name it yet can still answer it; empty from clients and older members."""

    def __init__(
        self,
        role: HelloRole,
        version: int = 1,
        cluster: str = "",
        node: str = "",
        max_version: int = PROTOCOL_VERSION,
        *,
        addr: str = "",
    ) -> None:
        _set(self, "role", role)
        _set(self, "version", version)
        _set(self, "cluster", cluster)
        _set(self, "node", node)
        _set(self, "max_version", max_version)
        _set(self, "addr", addr)

    @property
    def speaks(self) -> int:
        """The highest protocol version the sender speaks."""
        return max(self.version, self.max_version)

    def to_wire(self) -> dict[str, Any]:
        frame = {
            "t": "hello",
            "role": self.role.value,
            "version": self.version,
            "max_version": self.max_version,
            "cluster": self.cluster,
            "node": self.node,
        }
        if self.addr:
            frame["addr"] = self.addr
        return frame

    @classmethod
    def from_wire(cls, obj: Any) -> Hello:
        msg = as_map(obj)
        if msg.get("t") != "hello":
            raise ProtocolError("a connection must open with a hello frame")
        role = _field(msg, "role", str)
        if role not in (HelloRole.CLIENT.value, HelloRole.PEER.value):
            raise ProtocolError(f"unknown role {role!r}")
        version = _bounded(msg, "version", 1, 1 << 16)
        max_version = _field(msg, "max_version", int, optional=True)
        return cls(
            role=HelloRole(role),
            version=version,
            cluster=_field(msg, "cluster", str, optional=True) or "",
            node=_field(msg, "node", str, optional=True) or "",
            max_version=version if max_version is None else min(max(max_version, 1), 1 << 16),
            addr=_hello_addr(msg),
        )


def _hello_addr(msg: dict[Any, Any]) -> str:
    """The hello's ``addr`` as HOST:PORT, or "" when absent; ProtocolError if malformed."""
    addr = _field(msg, "addr", str, optional=True)
    if not addr:
        return ""
    if len(addr) > 300:
        raise ProtocolError("field 'addr' is too long")
    try:
        return format_addr(*parse_addr(addr))
    except ValueError:
        raise ProtocolError("field 'addr' must be HOST:PORT") from None


def welcome(node: str, cluster: str, version: int = PROTOCOL_VERSION) -> dict[str, Any]:
    return {"t": "welcome", "version": version, "node": node, "cluster": cluster}


# ---------------------------------------------------------------------------
# Client requests
# ---------------------------------------------------------------------------


def _bounded(msg: dict[Any, Any], name: str, low: int, high: int) -> int:
    value: int = _field(msg, name, int)
    if not low <= value <= high:
        raise ProtocolError(f"field {name!r} must be between {low} and {high}")
    return value


def _opt_bounded(msg: dict[Any, Any], name: str, low: int, high: int, default: int) -> int:
    if msg.get(name) is None:
        return default
    return _bounded(msg, name, low, high)


def _checked(problem: str | None) -> None:
    if problem is not None:
        raise ProtocolError(problem)


def _lease(msg: dict[Any, Any]) -> str:
    lease: str = _field(msg, "lease", str)
    _checked(limits.check_lease_id(lease))
    return lease


def _key(msg: dict[Any, Any]) -> str:
    key: str = _field(msg, "key", str)
    _checked(limits.check_key(key))
    return key


def _origin(msg: dict[Any, Any]) -> tuple[str, int, int]:
    """(client, seq, acked) of a state-changing request; client "" for a version-1 one."""
    client = _field(msg, "client", str, optional=True) or ""
    if client:
        _checked(limits.check_client_id(client))
    seq = _bounded(msg, "seq", 0, limits.INT_MAX)
    acked = _opt_bounded(msg, "acked", 0, limits.INT_MAX, 0)
    return client, seq, acked


def _flag(msg: dict[Any, Any], name: str) -> bool:
    return bool(_field(msg, name, bool, optional=True))


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


class Change(Request):
    """A request that changes replicated state: it names its client and seq (PROTOCOL.md)."""

    __slots__ = ("acked", "client", "seq")
    client: str
    seq: int
    acked: int

    def _origin(self, client: str, seq: int, acked: int) -> None:
        _set(self, "client", client)
        _set(self, "seq", seq)
        _set(self, "acked", acked)


class OpenLease(Change):
    __slots__ = ("ephemeral", "lease", "meta", "ttl_ms")
    TYPE = "open_lease"
    FIELDS = ("id", "lease", "ttl_ms", "ephemeral", "meta", "client", "seq", "acked")
    lease: str
    ttl_ms: int
    ephemeral: bool
    meta: dict[str, str]

    def __init__(
        self,
        *,
        id: int,
        lease: str,
        ttl_ms: int,
        client: str = "",
        seq: int = 0,
        acked: int = 0,
        ephemeral: bool = False,
        meta: dict[str, str] | None = None,
    ) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "ttl_ms", ttl_ms)
        _set(self, "ephemeral", ephemeral)
        _set(self, "meta", {} if meta is None else meta)
        self._origin(client, seq, acked)


class Renew(Request):
    """A keep-alive. Answered only after the leader has confirmed it still leads.

    ``incarnation`` (0: any) names the lease the client opened, so a late copy
    cannot renew another lease that reuses the id.
    """

    __slots__ = ("client", "incarnation", "lease", "seq")
    TYPE = "keepalive"
    FIELDS = ("id", "lease", "incarnation", "client", "seq")
    lease: str
    incarnation: int
    client: str
    seq: int

    def __init__(
        self, *, id: int, lease: str, incarnation: int = 0, client: str = "", seq: int = 0
    ) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "incarnation", incarnation)
        _set(self, "client", client)
        _set(self, "seq", seq)


class CloseLease(Change):
    __slots__ = ("lease",)
    TYPE = "close_lease"
    FIELDS = ("id", "lease", "client", "seq", "acked")
    lease: str

    def __init__(self, *, id: int, lease: str, seq: int, client: str = "", acked: int = 0) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        self._origin(client, seq, acked)


class UpdateLease(Change):
    """Sets a lease's TTL (its clock restarts); ``finished``: the guarded command ended."""

    __slots__ = ("finished", "lease", "ttl_ms")
    TYPE = "lease_update"
    FIELDS = ("id", "lease", "ttl_ms", "finished", "client", "seq", "acked")
    lease: str
    ttl_ms: int
    finished: bool

    def __init__(
        self,
        *,
        id: int,
        lease: str,
        ttl_ms: int,
        seq: int,
        finished: bool = False,
        client: str = "",
        acked: int = 0,
    ) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "ttl_ms", ttl_ms)
        _set(self, "finished", finished)
        self._origin(client, seq, acked)


class Acquire(Change):
    __slots__ = ("key", "lease", "limit", "meta", "wait")
    TYPE = "acquire"
    FIELDS = ("id", "lease", "key", "wait", "limit", "meta", "client", "seq", "acked")
    lease: str
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
        client: str = "",
        acked: int = 0,
    ) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "key", key)
        _set(self, "wait", wait)
        _set(self, "limit", limit)
        _set(self, "meta", {} if meta is None else meta)
        self._origin(client, seq, acked)


class Release(Change):
    """Releases a held lock (only the grant ``token`` names, if given), or leaves the queue."""

    __slots__ = ("keep_lease", "key", "lease", "token")
    TYPE = "release"
    FIELDS = ("id", "lease", "key", "token", "keep_lease", "client", "seq", "acked")
    lease: str
    key: str
    token: int | None
    keep_lease: bool

    def __init__(
        self,
        *,
        id: int,
        lease: str,
        seq: int,
        key: str,
        token: int | None = None,
        keep_lease: bool = False,
        client: str = "",
        acked: int = 0,
    ) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)
        _set(self, "key", key)
        _set(self, "token", token)
        _set(self, "keep_lease", keep_lease)
        self._origin(client, seq, acked)


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


PAGE_MAX = 1000
"""Most items one ``list`` or ``lease_list`` reply carries."""


class ListLocks(Request):
    __slots__ = ("after", "max", "prefix", "stale")
    TYPE = "list"
    FIELDS = ("id", "prefix", "stale", "after", "max")
    prefix: str
    stale: bool
    after: str | None
    max: int

    def __init__(
        self,
        *,
        id: int,
        prefix: str = "",
        stale: bool = False,
        after: str | None = None,
        max: int = PAGE_MAX,
    ) -> None:
        _set(self, "id", id)
        _set(self, "prefix", prefix)
        _set(self, "stale", stale)
        _set(self, "after", after)
        _set(self, "max", max)


class LeaseInfo(Request):
    __slots__ = ("lease",)
    TYPE = "lease_info"
    FIELDS = ("id", "lease")
    lease: str

    def __init__(self, *, id: int, lease: str) -> None:
        _set(self, "id", id)
        _set(self, "lease", lease)


class ListLeases(Request):
    __slots__ = ("after", "max", "stale")
    TYPE = "lease_list"
    FIELDS = ("id", "stale", "after", "max")
    stale: bool
    after: str | None
    max: int

    def __init__(
        self, *, id: int, stale: bool = False, after: str | None = None, max: int = PAGE_MAX
    ) -> None:
        _set(self, "id", id)
        _set(self, "stale", stale)
        _set(self, "after", after)
        _set(self, "max", max)


class Status(Request):
    """This member's view: role, term, indexes, and the leader's view of its peers."""

    __slots__ = ("stale",)
    TYPE = "status"
    FIELDS = ("id", "stale")
    stale: bool

    def __init__(self, *, id: int, stale: bool = False) -> None:
        _set(self, "id", id)
        _set(self, "stale", stale)


class Ping(Request):
    """Keeps an idle connection open (a member closes one silent for 2 minutes)."""

    __slots__ = ()
    TYPE = "ping"
    FIELDS = ("id",)


class Members(Request):
    __slots__ = ()
    TYPE = "members"
    FIELDS = ("id",)


class MemberAdd(Change):
    __slots__ = ("address", "member")
    TYPE = "member_add"
    FIELDS = ("id", "member", "address", "client", "seq", "acked")
    member: str
    address: str

    def __init__(
        self, *, id: int, member: str, address: str, seq: int, client: str = "", acked: int = 0
    ) -> None:
        _set(self, "id", id)
        _set(self, "member", member)
        _set(self, "address", address)
        self._origin(client, seq, acked)


class MemberRemove(Change):
    __slots__ = ("force", "member")
    TYPE = "member_remove"
    FIELDS = ("id", "member", "force", "client", "seq", "acked")
    member: str
    force: bool

    def __init__(
        self,
        *,
        id: int,
        member: str,
        seq: int,
        force: bool = False,
        client: str = "",
        acked: int = 0,
    ) -> None:
        _set(self, "id", id)
        _set(self, "member", member)
        _set(self, "force", force)
        self._origin(client, seq, acked)


class MemberPromote(Change):
    __slots__ = ("member",)
    TYPE = "member_promote"
    FIELDS = ("id", "member", "client", "seq", "acked")
    member: str

    def __init__(self, *, id: int, member: str, seq: int, client: str = "", acked: int = 0) -> None:
        _set(self, "id", id)
        _set(self, "member", member)
        self._origin(client, seq, acked)


ClientRequest = (
    OpenLease
    | Renew
    | CloseLease
    | UpdateLease
    | Acquire
    | Release
    | Get
    | ListLocks
    | LeaseInfo
    | ListLeases
    | Status
    | Ping
    | Members
    | MemberAdd
    | MemberRemove
    | MemberPromote
)
LockChange = OpenLease | CloseLease | UpdateLease | Acquire | Release
MemberChange = MemberAdd | MemberRemove | MemberPromote


def _member_id(msg: dict[Any, Any]) -> str:
    member: str = _field(msg, "member", str)
    if not 1 <= len(member) <= 63 or member.strip(limits.LEASE_ID_ALPHABET + "."):
        raise ProtocolError("a member id is 1-63 letters, digits, '_', '-' or '.'")
    return member


def _page(msg: dict[Any, Any]) -> tuple[str | None, int]:
    after = _field(msg, "after", str, optional=True)
    return after, _opt_bounded(msg, "max", 1, PAGE_MAX, PAGE_MAX)


def decode_request(obj: Any) -> ClientRequest:
    """Validates one client frame; raises ProtocolError naming what is wrong."""
    msg = as_map(obj)
    kind = msg.get("t")
    rid = _bounded(msg, "id", 0, limits.INT_MAX)
    if kind == "acquire":
        client, seq, acked = _origin(msg)
        meta = _str_map(msg, "meta")
        _checked(limits.check_meta(meta))
        return Acquire(
            id=rid,
            lease=_lease(msg),
            key=_key(msg),
            wait=_flag(msg, "wait"),
            limit=_opt_bounded(msg, "limit", 1, limits.LIMIT_MAX, 1),
            meta=meta,
            client=client,
            seq=seq,
            acked=acked,
        )
    if kind == "release":
        client, seq, acked = _origin(msg)
        token = None if msg.get("token") is None else _bounded(msg, "token", 1, limits.INT_MAX)
        return Release(
            id=rid,
            lease=_lease(msg),
            key=_key(msg),
            token=token,
            keep_lease=_flag(msg, "keep_lease"),
            client=client,
            seq=seq,
            acked=acked,
        )
    if kind == "keepalive":
        client = _field(msg, "client", str, optional=True) or ""
        if client:
            _checked(limits.check_client_id(client))
        seq = _opt_bounded(msg, "seq", 0, limits.INT_MAX, 0)
        incarnation = _opt_bounded(msg, "incarnation", 0, limits.INT_MAX, 0)
        return Renew(id=rid, lease=_lease(msg), incarnation=incarnation, client=client, seq=seq)
    if kind == "open_lease":
        client, seq, acked = _origin(msg) if "seq" in msg else ("", 0, 0)
        meta = _str_map(msg, "meta")
        _checked(limits.check_meta(meta))
        return OpenLease(
            id=rid,
            lease=_lease(msg),
            ttl_ms=_bounded(msg, "ttl_ms", 0, limits.INT_MAX),
            ephemeral=_flag(msg, "ephemeral"),
            meta=meta,
            client=client,
            seq=seq,
            acked=acked,
        )
    if kind == "close_lease":
        client, seq, acked = _origin(msg)
        return CloseLease(id=rid, lease=_lease(msg), client=client, seq=seq, acked=acked)
    if kind == "lease_update":
        client, seq, acked = _origin(msg)
        return UpdateLease(
            id=rid,
            lease=_lease(msg),
            ttl_ms=_bounded(msg, "ttl_ms", 0, limits.INT_MAX),
            finished=_flag(msg, "finished"),
            client=client,
            seq=seq,
            acked=acked,
        )
    if kind == "get":
        return Get(id=rid, key=_key(msg), stale=_flag(msg, "stale"))
    if kind == "list":
        after, page = _page(msg)
        prefix = _field(msg, "prefix", str, optional=True) or ""
        if len(prefix.encode("utf-8", "surrogatepass")) > limits.KEY_MAX_BYTES:
            raise ProtocolError(f"a prefix is at most {limits.KEY_MAX_BYTES} bytes")
        return ListLocks(id=rid, prefix=prefix, stale=_flag(msg, "stale"), after=after, max=page)
    if kind == "lease_info":
        return LeaseInfo(id=rid, lease=_lease(msg))
    if kind == "lease_list":
        after, page = _page(msg)
        return ListLeases(id=rid, stale=_flag(msg, "stale"), after=after, max=page)
    if kind == "status":
        return Status(id=rid, stale=_flag(msg, "stale"))
    if kind == "ping":
        return Ping(id=rid)
    if kind == "members":
        return Members(id=rid)
    if kind in ("member_add", "member_remove", "member_promote"):
        client, seq, acked = _origin(msg)
        member = _member_id(msg)
        if kind == "member_add":
            address: str = _field(msg, "address", str)
            try:
                parse_addr(address)
            except ValueError as exc:
                raise ProtocolError(f"bad member address: {exc}") from None
            return MemberAdd(
                id=rid, member=member, address=address, client=client, seq=seq, acked=acked
            )
        if kind == "member_remove":
            return MemberRemove(
                id=rid,
                member=member,
                force=_flag(msg, "force"),
                client=client,
                seq=seq,
                acked=acked,
            )
        return MemberPromote(id=rid, member=member, client=client, seq=seq, acked=acked)
    raise ProtocolError(f"unknown request type {str(kind)[:40]!r}")


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
