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

from dlm import cbor_codec, limits
from dlm.compiled import mypyc_attr

# typing (like dataclasses) is left off the client's import path: `dlm acquire` would pay
# milliseconds for names only the type checker reads. mypy takes any TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, ClassVar, Self, TypeAlias

    from dlm.frame_protocols import FrameOpenerLike, FrameSealerLike

    Check: TypeAlias = Callable[[dict[Any, Any], str], Any]
    """How a request field is decoded: the frame and the field's name in, the value out."""


PROTOCOL_VERSION = 5
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
    PERMISSION_DENIED = "PERMISSION_DENIED"
    COMPACTED = "COMPACTED"
    """A watch asked to resume from an index whose changes this member no longer keeps."""
    WRONG_PARTITION = "WRONG_PARTITION"
    """The request names a key another partition holds (dlm/partitioning.py); the error
    carries ``partitions``, the cluster's count, so the client can route it again."""


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
    body = cbor_codec.dumps(obj)
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
        return cbor_codec.loads(body, tag_hook=_reject_tag)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("frame is nested too deeply") from None
    except Exception as err:  # invalid UTF-8 in a text string, mostly
        # Its own name: compiled (mypyc), ``exc`` keeps the type of the first handler's.
        raise ProtocolError(f"frame is not valid CBOR: {err}") from None


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
                    except ValueError as err:  # dlm.auth.AuthError, which wire does not import
                        self._failed = str(err)
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


# An ordinary Python class when compiled: the records here are built by a metaclass, and
# the client's own records (interpreted) derive from it.
@mypyc_attr(native_class=False)
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
        # Same class, so a Record; no isinstance here: compiled (mypyc), an isinstance of a
        # class that is no native one misses the subclasses it did not compile.
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


@mypyc_attr(native_class=False)
class Hello(Record):
    """The first frame of a connection.

    ``version`` is the lowest protocol version the sender speaks and
    ``max_version`` the highest; the connection speaks the lower of the two
    sides' maxima. A member of the previous release checks only that
    ``version`` is 1, so our clients and members send 1 there.
    """

    __slots__ = (
        "addr",
        "cluster",
        "incarnation",
        "max_version",
        "node",
        "partitions",
        "role",
        "trace",
        "version",
    )
    FIELDS = (
        "role",
        "version",
        "cluster",
        "node",
        "max_version",
        "addr",
        "incarnation",
        "partitions",
        "trace",
    )
    __match_args__ = (
        "role",
        "version",
        "cluster",
        "node",
        "max_version",
        "addr",
        "incarnation",
        "partitions",
        "trace",
    )
    role: HelloRole
    version: int
    cluster: str
    node: str
    max_version: int
    addr: str
    """A peer's own address (HOST:PORT, its --advertise), so that a member whose log does
    not name it yet can still answer it; empty from clients and older members."""
    incarnation: int
    """A peer's cluster incarnation (0, and left out, for a cluster never restored or
    recovered; else the index its new log started after). Peers of different
    incarnations refuse each other."""
    partitions: int
    """A peer's partition count (1, and left out, for a cluster of one partition).
    Members with different counts refuse each other."""
    trace: str | None
    """A traced client's trace context (a W3C traceparent, issue 30), or None (left out).
    Members ignore it (a member of the previous release ignores any field it does not
    know); a gateway reads it to make its routing span the child of the client's."""

    def __init__(
        self,
        role: HelloRole,
        version: int = 1,
        cluster: str = "",
        node: str = "",
        max_version: int = PROTOCOL_VERSION,
        *,
        addr: str = "",
        incarnation: int = 0,
        partitions: int = 1,
        trace: str | None = None,
    ) -> None:
        _set(self, "role", role)
        _set(self, "version", version)
        _set(self, "cluster", cluster)
        _set(self, "node", node)
        _set(self, "max_version", max_version)
        _set(self, "addr", addr)
        _set(self, "incarnation", incarnation)
        _set(self, "partitions", partitions)
        _set(self, "trace", trace)

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
        if self.incarnation:
            frame["incarnation"] = self.incarnation
        if self.partitions != 1:
            frame["partitions"] = self.partitions
        if self.trace is not None:
            frame["trace"] = self.trace
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
            incarnation=_opt_bounded(msg, "incarnation", 0, limits.INT_MAX, 0),
            partitions=_opt_bounded(msg, "partitions", 1, _MAX_PARTITIONS, 1),
            trace=_trace(msg, "trace"),
        )


_MAX_PARTITIONS = 64
"""dlm.partitioning.MAX_PARTITIONS, not imported: that module loads hashlib, which a
client's plain start does not need (tests/unit/test_wire.py keeps the two equal)."""


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


def welcome(
    node: str,
    cluster: str,
    version: int = PROTOCOL_VERSION,
    incarnation: int = 0,
    *,
    partitions: int = 1,
    partition: int = 0,
) -> dict[str, Any]:
    """The answer to a hello. ``partitions`` (left out when 1) tells a client how many
    partitions the cluster has, so that it can route; ``partition`` (left out when 0)
    which one this connection reached."""
    frame: dict[str, Any] = {"t": "welcome", "version": version, "node": node, "cluster": cluster}
    if incarnation:
        frame["incarnation"] = incarnation
    if partitions != 1:
        frame["partitions"] = partitions
    if partition:
        frame["partition"] = partition
    return frame


def partitions_mismatch(local: str, mine: int, peer: str, theirs: int) -> str:
    """The one line that refuses a peer created with another partition count."""
    return (
        f"partition count mismatch: member {local} has --partitions {mine}, member {peer} "
        f"--partitions {theirs}; every member of a cluster must have the same count"
    )


OTHER_INCARNATION = "cluster incarnation mismatch"


def incarnation_mismatch(local: str, mine: int, peer: str, theirs: int) -> str:
    """The one line both members of different cluster incarnations log (on the
    accepting side it is also the refusal's message)."""

    def name(incarnation: int) -> str:
        return f"incarnation {incarnation}" if incarnation else "the original incarnation (0)"

    old = peer if theirs < mine else local
    return (
        f"{OTHER_INCARNATION}: member {local} is in {name(mine)}, member {peer} in "
        f"{name(theirs)}; the cluster was restored or recovered, so {old} belongs to the "
        f"old cluster: stop it (to bring {old} back, remove its data directory and start it "
        "with --join)"
    )


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


# The checks a request's fields are decoded with: each takes the frame and the field's
# name and returns the value, or raises ProtocolError with the sentence a client sees.


def _id(msg: dict[Any, Any], name: str) -> int:
    return _bounded(msg, name, 0, limits.INT_MAX)


def _lease(msg: dict[Any, Any], name: str = "lease") -> str:
    lease: str = _field(msg, name, str)
    _checked(limits.check_lease_id(lease))
    return lease


def _key(msg: dict[Any, Any], name: str = "key") -> str:
    key: str = _field(msg, name, str)
    _checked(limits.check_key(key))
    return key


def _client(msg: dict[Any, Any], name: str) -> str:
    """A client id, or "" for a version-1 request that names none."""
    client = _field(msg, name, str, optional=True) or ""
    if client:
        _checked(limits.check_client_id(client))
    return client


def _count(msg: dict[Any, Any], name: str) -> int:
    return _bounded(msg, name, 0, limits.INT_MAX)


def _opt_count(msg: dict[Any, Any], name: str) -> int:
    return _opt_bounded(msg, name, 0, limits.INT_MAX, 0)


def _flag(msg: dict[Any, Any], name: str) -> bool:
    return bool(_field(msg, name, bool, optional=True))


def _opt_flag(msg: dict[Any, Any], name: str) -> bool | None:
    """A flag that newer requests carry only when set (None: absent, left out of the frame)."""
    return _field(msg, name, bool, optional=True) or None


def _lock_delay(msg: dict[Any, Any], name: str) -> int | None:
    """A lease's lock-delay in ms (0 to a minute); None when the frame names none."""
    if msg.get(name) is None:
        return None
    value: int = _bounded(msg, name, 0, limits.INT_MAX)
    _checked(limits.check_lock_delay_ms(value))
    return value


def _election_value(msg: dict[Any, Any], name: str) -> str:
    value: str = _field(msg, name, str)
    _checked(limits.check_meta({"value": value}))
    return value


def _meta(msg: dict[Any, Any], name: str) -> dict[str, str]:
    meta = _str_map(msg, name)
    _checked(limits.check_meta(meta))
    return meta


def _ttl(msg: dict[Any, Any], name: str) -> int:
    return _bounded(msg, name, 0, limits.INT_MAX)


def _opt_ttl(msg: dict[Any, Any], name: str) -> int | None:
    """A TTL, or None when the frame names none (the member's default then applies)."""
    return None if msg.get(name) is None else _ttl(msg, name)


def _limit(msg: dict[Any, Any], name: str) -> int:
    return _opt_bounded(msg, name, 1, limits.LIMIT_MAX, 1)


def _token(msg: dict[Any, Any], name: str) -> int | None:
    return None if msg.get(name) is None else _bounded(msg, name, 1, limits.INT_MAX)


def _prefix(msg: dict[Any, Any], name: str) -> str:
    prefix: str = _field(msg, name, str, optional=True) or ""
    if len(prefix.encode("utf-8", "surrogatepass")) > limits.KEY_MAX_BYTES:
        raise ProtocolError(f"a prefix is at most {limits.KEY_MAX_BYTES} bytes")
    return prefix


def _opt_key(msg: dict[Any, Any], name: str) -> str | None:
    if msg.get(name) is None:
        return None
    return _key(msg, name)


def _opt_prefix(msg: dict[Any, Any], name: str) -> str | None:
    if msg.get(name) is None:
        return None
    return _prefix(msg, name)


def _opt_index(msg: dict[Any, Any], name: str) -> int | None:
    return None if msg.get(name) is None else _bounded(msg, name, 0, limits.INT_MAX)


def _after(msg: dict[Any, Any], name: str) -> str | None:
    after: str | None = _field(msg, name, str, optional=True)
    return after


TRACEPARENT_LENGTH = 55
"""A W3C traceparent of version 00: ``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``."""
_LOWER_HEX = frozenset("0123456789abcdef")


def traceparent_problem(value: object) -> str | None:
    """Why ``value`` is no W3C traceparent this protocol carries, or None when it is one.

    Strict on purpose: version 00 only, lowercase hex, neither id all zeros, exactly
    TRACEPARENT_LENGTH characters. A context a tracer would ignore is refused rather
    than passed on to a trace backend that would show it as a broken trace."""
    if not isinstance(value, str):
        return "a traceparent must be a string"
    if len(value) != TRACEPARENT_LENGTH:
        return f"a traceparent is {TRACEPARENT_LENGTH} characters (00-TRACEID-SPANID-FLAGS)"
    parts = value.split("-")
    if len(parts) != 4 or [len(p) for p in parts] != [2, 32, 16, 2]:
        return "a traceparent is 00-TRACEID-SPANID-FLAGS (2, 32, 16 and 2 hex digits)"
    if not all(set(p) <= _LOWER_HEX for p in parts):
        return "a traceparent holds lowercase hex digits only"
    if parts[0] != "00":
        return f"traceparent version {parts[0]} is not supported (only 00)"
    if parts[1] == "0" * 32:
        return "a traceparent's trace id must not be all zeros"
    if parts[2] == "0" * 16:
        return "a traceparent's span id must not be all zeros"
    return None


def _trace(msg: dict[Any, Any], name: str) -> str | None:
    """The request's trace context (a W3C traceparent), or None when it carries none."""
    value = msg.get(name)
    if value is None:
        return None
    problem = traceparent_problem(value)
    if problem is not None:
        raise ProtocolError(f"field {name!r}: {problem}")
    trace: str = value
    return trace


PAGE_MAX = 1000
"""Most items one ``list`` or ``lease_list`` reply carries."""
RUNS_PAGE_MAX = 100
"""Most runs one ``runs`` reply carries (a run is up to ~1 KiB: host, user, command)."""
RUN_OUTCOMES = ("finished", "killed", "lock_lost")
"""What a client may report of a run (dlm/node/locks/ledger.py's REPORTED)."""


def _run_outcome(msg: dict[Any, Any], name: str) -> str | None:
    value: str | None = _field(msg, name, str, optional=True)
    if value is not None and value not in RUN_OUTCOMES:
        raise ProtocolError(f"a run's outcome is one of {', '.join(RUN_OUTCOMES)}")
    return value


def _run_exit_code(msg: dict[Any, Any], name: str) -> int | None:
    return None if msg.get(name) is None else _bounded(msg, name, 0, 255)


def _run_signal(msg: dict[Any, Any], name: str) -> int | None:
    return None if msg.get(name) is None else _bounded(msg, name, 1, 128)


def _runs_page_size(msg: dict[Any, Any], name: str) -> int:
    return _opt_bounded(msg, name, 1, RUNS_PAGE_MAX, RUNS_PAGE_MAX)


def _page_size(msg: dict[Any, Any], name: str) -> int:
    return _opt_bounded(msg, name, 1, PAGE_MAX, PAGE_MAX)


def _member_id(msg: dict[Any, Any], name: str) -> str:
    member: str = _field(msg, name, str)
    if not 1 <= len(member) <= 63 or member.strip(limits.LEASE_ID_ALPHABET + "."):
        raise ProtocolError("a member id is 1-63 letters, digits, '_', '-' or '.'")
    return member


def _address(msg: dict[Any, Any], name: str) -> str:
    address: str = _field(msg, name, str)
    try:
        parse_addr(address)
    except ValueError as exc:
        raise ProtocolError(f"bad member address: {exc}") from None
    return address


def _identity_name(msg: dict[Any, Any], name: str) -> str:
    value: str = _field(msg, name, str)
    _checked(limits.check_identity_name(value))
    return value


SETTING_NAME_MAX = 32
"""The longest name of a cluster setting a request may carry (`dlm config set`)."""


def _setting(msg: dict[Any, Any], name: str) -> str:
    value: str = _field(msg, name, str)
    if not value or len(value) > SETTING_NAME_MAX or limits.has_control(value):
        raise ProtocolError(f"field {name!r} must name a setting (1 to {SETTING_NAME_MAX} chars)")
    return value


def _opt_setting(msg: dict[Any, Any], name: str) -> str | None:
    return None if msg.get(name) is None else _setting(msg, name)


def _role(msg: dict[Any, Any], name: str) -> str:
    value: str = _field(msg, name, str)
    if value not in ("admin", "client"):
        raise ProtocolError("a role is admin or client")
    return value


def _prefixes(msg: dict[Any, Any], name: str) -> list[str]:
    value = msg.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ProtocolError(f"field {name!r} must be a list of text")
    _checked(limits.check_identity_prefixes(value))
    return list(value)


def _request_id(msg: dict[Any, Any], name: str) -> bytes:
    value = msg.get(name)
    if value is None:
        return b""
    if not isinstance(value, bytes) or len(value) > limits.REQUEST_ID_MAX_BYTES:
        raise ProtocolError(f"field {name!r} must be at most {limits.REQUEST_ID_MAX_BYTES} bytes")
    return value


def _limit_change(msg: dict[Any, Any], name: str) -> int:
    return _opt_bounded(msg, name, -1, limits.IDENTITY_LIMIT_MAX, -1)


def _key_bytes(size: int) -> Check:
    def checked(msg: dict[Any, Any], name: str) -> bytes:
        value = msg.get(name)
        if not isinstance(value, bytes) or len(value) != size:
            raise ProtocolError(f"field {name!r} must be {size} bytes")
        return value

    return checked


def _if_seq(check: Check, absent: object) -> Check:
    """``check``, on a request whose origin is all or nothing: without ``seq`` (a
    version-1 ``open_lease``) the field is ``absent`` whatever the frame says."""

    def checked(msg: dict[Any, Any], name: str) -> Any:
        return check(msg, name) if "seq" in msg else absent

    return checked


# ---------------------------------------------------------------------------
# The request table: one class per request, one line per field
# ---------------------------------------------------------------------------

_MISSING: Any = object()


class Field:
    """One line of the request table: how a field is checked when decoded, its default
    (none: the field is required), and where it stands in the frame.

    ``origin`` fields (client, seq, acked) are decoded first and encoded last; ``early``
    ones are decoded before the remaining fields. Those two orders are the protocol's:
    they decide which of two bad fields an error names, and the bytes of every frame.
    An ``envelope`` field is read before the record's kind is known (a request's ``id``);
    an ``omit`` field is left out of the frame while None (or while the field it names is).
    """

    __slots__ = ("check", "default", "early", "envelope", "factory", "omit", "origin")

    def __init__(
        self,
        check: Check,
        *,
        default: Any,
        factory: Callable[[], Any] | None,
        origin: bool,
        early: bool,
        omit: bool | str,
        envelope: bool,
    ) -> None:
        self.check = check
        self.default = default
        self.factory = factory
        self.origin = origin
        self.early = early
        self.omit = omit
        self.envelope = envelope


def field(
    check: Check,
    *,
    default: Any = _MISSING,
    default_factory: Callable[[], Any] | None = None,
    origin: bool = False,
    early: bool = False,
    omit: bool | str = False,
    envelope: bool = False,
) -> Any:
    """A record field (see Field); typed Any so that it stands for any field's value."""
    return Field(
        check,
        default=default,
        factory=default_factory,
        origin=origin,
        early=early,
        omit=omit,
        envelope=envelope,
    )


def _dataclass_transform(**_: object) -> Callable[[type], type]:
    return lambda cls: cls


# mypy reads typing's decorator; at run time a no-op stands in, put in place through
# globals() because mypy, and so mypyc, takes an ``else`` of TYPE_CHECKING for dead code.
if TYPE_CHECKING:
    from typing import dataclass_transform
globals().setdefault("dataclass_transform", _dataclass_transform)


def _build(record: Any, values: dict[str, Any]) -> None:
    """A record's constructor: each field from ``values``, else its default."""
    for name, default, factory in record._INIT:
        if name in values:
            value = values.pop(name)
        elif factory is not None:
            value = factory()
        elif default is _MISSING:
            raise TypeError(f"{type(record).__name__}() needs the keyword argument {name!r}")
        else:
            value = default
        _set(record, name, value)
    if values:
        raise TypeError(f"{type(record).__name__}() has no field {sorted(values)[0]!r}")


@dataclass_transform(kw_only_default=True, field_specifiers=(field,))
class RecordSpec(type):
    """Makes a request or reply class from its table: slots, ``FIELDS`` (the frame's
    order), the decoding steps and the constructor's defaults follow from the ``field`` lines.
    mypy reads the same lines as a keyword-only dataclass (dataclass_transform)."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> RecordSpec:
        own = {k: v for k, v in namespace.items() if isinstance(v, Field)}
        table: dict[str, Field] = {}
        for base in reversed(bases):
            table.update(getattr(base, "_TABLE", {}))
        namespace = {k: v for k, v in namespace.items() if k not in own}
        # Slots a class names itself (no field's) come first.
        namespace["__slots__"] = (
            *namespace.get("__slots__", ()),
            *(k for k in own if k not in table),
        )
        table.update(own)
        namespace["_TABLE"] = table
        plain = [k for k, f in table.items() if not f.origin]
        origin = [k for k, f in table.items() if f.origin]
        namespace["FIELDS"] = tuple(plain + origin)
        namespace["_INIT"] = tuple((k, table[k].default, table[k].factory) for k in plain + origin)
        # Fields read before the kind is known (a request's ``id``) are no step of their own.
        plain = [k for k in plain if not table[k].envelope]
        steps = (
            origin + [k for k in plain if table[k].early] + [k for k in plain if not table[k].early]
        )
        namespace["_DECODE"] = tuple((k, table[k].check) for k in steps)
        # type.__new__ by name: mypyc compiles no super() call in a metaclass.
        return type.__new__(mcls, name, bases, namespace)


class Request(Record, metaclass=RecordSpec):
    """Base of every client request; ``id`` pairs a reply with its request.

    Fields are keyword-only, and ``to_wire`` gives the frame: ``t`` and the fields.
    ``ROUTE`` says how a member serves it: ``local`` (answered at once), ``propose``
    (a lock or lease change, through the log), ``member`` (a membership change),
    ``confirm`` (the leader confirms it leads before answering), ``read`` (a read,
    served locally when ``stale``, else after a read round), ``identity`` (a change to
    the identity table, through the log; it names no seq: a re-sent one names the same
    key, which the table takes as done) or ``watch`` (served by the member it reaches,
    whatever its role, from its applied log: dlm/node/watches.py).

    ``PERMISSION`` says what the connection's identity needs (docs/PROTOCOL.md,
    "Authentication"; dlm/node/locks/identities.py decides): ``any``; ``read`` (answered,
    filtered to the keys under its prefixes and its own leases); ``key`` (the key under one
    of its prefixes); ``lock`` (that, and the lease its own); ``lease`` (the lease's
    opener, or an admin); ``admin`` (the admin role). A request kind added later names
    one of these and is enforced by it.
    """

    TYPE: ClassVar[str] = ""
    ROUTE: ClassVar[str] = ""
    PERMISSION: ClassVar[str] = "admin"
    _TABLE: ClassVar[dict[str, Field]]
    _INIT: ClassVar[tuple[tuple[str, Any, Callable[[], Any] | None], ...]]
    _DECODE: ClassVar[tuple[tuple[str, Check], ...]]
    id: int = field(_id, envelope=True)

    def __init__(self, **values: Any) -> None:
        _build(self, values)

    def __repr__(self) -> str:
        # An absent trace context is left out, so that an untraced request reads (and
        # the golden files record it) as it did before the field existed.
        inner = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in self.FIELDS
            if name != "trace" or getattr(self, name) is not None
        )
        return f"{type(self).__name__}({inner})"

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.TYPE}
        table = self._TABLE
        for name in self.FIELDS:
            value = getattr(self, name)
            # A field added later is left out while unset, so that older members (and
            # the golden frames) see the frames they know.
            if value is None and table[name].omit:
                continue
            out[name] = value
        return out


class Change(Request):
    """A request that changes replicated state: it names its client and seq (PROTOCOL.md)."""

    client: str = field(_client, default="", origin=True)
    seq: int = field(_count, origin=True)
    acked: int = field(_opt_count, default=0, origin=True)


class OpenLease(Change):
    TYPE = "open_lease"
    ROUTE = "propose"
    PERMISSION = "lease"
    lease: str = field(_lease)
    ttl_ms: int | None = field(_opt_ttl)
    """None (protocol version 5; left out of the frame): the cluster's default-ttl."""
    ephemeral: bool = field(_flag, default=False)
    meta: dict[str, str] = field(_meta, default_factory=dict, early=True)
    lock_delay_ms: int | None = field(_lock_delay, default=None, omit=True)
    """How long a key this lease holds is granted to nobody after the lease expires or is
    revoked (cluster version 4; None or 0: no delay)."""
    # A version-1 open_lease names no origin at all.
    client: str = field(_if_seq(_client, ""), default="", origin=True)
    seq: int = field(_if_seq(_count, 0), default=0, origin=True)
    acked: int = field(_if_seq(_opt_count, 0), default=0, origin=True)
    trace: str | None = field(_trace, default=None, omit=True)
    """Trace context (W3C traceparent) of the span this request belongs to; None: untraced."""


class Renew(Request):
    """A keep-alive. Answered only after the leader has confirmed it still leads.

    ``incarnation`` (0: any) names the lease the client opened, so a late copy
    cannot renew another lease that reuses the id.
    """

    TYPE = "keepalive"
    ROUTE = "confirm"
    PERMISSION = "lease"
    lease: str = field(_lease)
    incarnation: int = field(_opt_count, default=0, early=True)
    client: str = field(_client, default="", origin=True)
    seq: int = field(_opt_count, default=0, origin=True)
    trace: str | None = field(_trace, default=None, omit=True)
    """Trace context (W3C traceparent) of the span this request belongs to; None: untraced."""


class CloseLease(Change):
    """Ends a lease; ``outcome`` (with ``exit_code`` or ``signal``): how the run of the
    lease's grant ended, for the run ledger (`dlm exec`; protocol version 4)."""

    TYPE = "close_lease"
    ROUTE = "propose"
    PERMISSION = "lease"
    lease: str = field(_lease)
    outcome: str | None = field(_run_outcome, default=None, omit=True)
    exit_code: int | None = field(_run_exit_code, default=None, omit=True)
    signal: int | None = field(_run_signal, default=None, omit=True)
    revoke: bool | None = field(_opt_flag, default=None, omit=True)
    """Sent by ``dlm lease revoke``: the lease's lock-delay applies (a plain close, by the
    lease's own process, is a release). None: not a revocation."""
    trace: str | None = field(_trace, default=None, omit=True)
    """Trace context (W3C traceparent) of the span this request belongs to; None: untraced."""


class UpdateLease(Change):
    """Sets a lease's TTL (its clock restarts); ``finished``: the guarded command ended."""

    TYPE = "lease_update"
    ROUTE = "propose"
    PERMISSION = "lease"
    lease: str = field(_lease)
    ttl_ms: int = field(_ttl)
    finished: bool = field(_flag, default=False)
    outcome: str | None = field(_run_outcome, default=None, omit=True)
    exit_code: int | None = field(_run_exit_code, default=None, omit=True)
    signal: int | None = field(_run_signal, default=None, omit=True)
    trace: str | None = field(_trace, default=None, omit=True)
    """Trace context (W3C traceparent) of the span this request belongs to; None: untraced."""


class Acquire(Change):
    TYPE = "acquire"
    ROUTE = "propose"
    PERMISSION = "lock"
    lease: str = field(_lease)
    key: str = field(_key)
    wait: bool = field(_flag, default=False)
    limit: int = field(_limit, default=1)
    meta: dict[str, str] = field(_meta, default_factory=dict, early=True)
    trace: str | None = field(_trace, default=None, omit=True)
    """Trace context (W3C traceparent) of the span this request belongs to; None: untraced."""


class Release(Change):
    """Releases a held lock (only the grant ``token`` names, if given), or leaves the queue."""

    TYPE = "release"
    ROUTE = "propose"
    PERMISSION = "lease"
    lease: str = field(_lease)
    key: str = field(_key)
    token: int | None = field(_token, default=None, early=True)
    keep_lease: bool = field(_flag, default=False)
    trace: str | None = field(_trace, default=None, omit=True)
    """Trace context (W3C traceparent) of the span this request belongs to; None: untraced."""


class Proclaim(Change):
    """Replaces the election value of ``key`` (the grant's ``value`` metadata entry), only for
    the lease that holds it; no new grant, the token stays (cluster version 4)."""

    TYPE = "proclaim"
    ROUTE = "propose"
    PERMISSION = "lease"
    lease: str = field(_lease)
    key: str = field(_key)
    value: str = field(_election_value)


class Get(Request):
    TYPE = "get"
    ROUTE = "read"
    PERMISSION = "key"
    key: str = field(_key)
    stale: bool = field(_flag, default=False)


class ListLocks(Request):
    TYPE = "list"
    ROUTE = "read"
    PERMISSION = "read"
    prefix: str = field(_prefix, default="")
    stale: bool = field(_flag, default=False)
    after: str | None = field(_after, default=None, early=True)
    max: int = field(_page_size, default=PAGE_MAX, early=True)


class Runs(Request):
    """The run ledger (protocol version 4): the runs of ``key``, newest first; without a
    key, the newest run of each key under ``prefix``, by key, a page of ``max`` after
    ``after``. Answered ``runs`` (and ``next``, the next page's cursor)."""

    TYPE = "runs"
    ROUTE = "read"
    PERMISSION = "read"
    key: str | None = field(_opt_key, default=None, omit=True)
    prefix: str = field(_prefix, default="")
    stale: bool = field(_flag, default=False)
    after: str | None = field(_after, default=None, early=True)
    max: int = field(_runs_page_size, default=RUNS_PAGE_MAX, early=True)


class LeaseInfo(Request):
    TYPE = "lease_info"
    ROUTE = "confirm"
    PERMISSION = "lease"
    lease: str = field(_lease)


class ListLeases(Request):
    TYPE = "lease_list"
    ROUTE = "read"
    PERMISSION = "read"
    stale: bool = field(_flag, default=False)
    after: str | None = field(_after, default=None, early=True)
    max: int = field(_page_size, default=PAGE_MAX, early=True)


class Status(Request):
    """This member's view: role, term, indexes, and the leader's view of its peers."""

    TYPE = "status"
    ROUTE = "read"
    PERMISSION = "any"
    stale: bool = field(_flag, default=False)


class Ping(Request):
    """Keeps an idle connection open (a member closes one silent for 2 minutes)."""

    TYPE = "ping"
    ROUTE = "local"
    PERMISSION = "any"


class Members(Request):
    TYPE = "members"
    ROUTE = "confirm"
    PERMISSION = "any"


class SnapshotSave(Request):
    """An image of the replicated state at a committed index, for a backup file
    (``dlm snapshot save``). The leader answers once a read round confirmed it leads, so
    the image holds every change acknowledged before the request: a ``SnapshotHeader``
    reply, then the image in ``SnapshotChunk`` frames of at most ``BACKUP_CHUNK_BYTES``
    with the same ``id``. Busy (UNAVAILABLE) while another backup is being taken."""

    TYPE = "snapshot_save"
    ROUTE = "confirm"
    PERMISSION = "admin"
    """Backups are admin-only once identities exist (issue 23); until then any client
    the member admits."""


class MemberAdd(Change):
    TYPE = "member_add"
    ROUTE = "member"
    PERMISSION = "admin"
    member: str = field(_member_id)
    address: str = field(_address)


class MemberRemove(Change):
    TYPE = "member_remove"
    ROUTE = "member"
    PERMISSION = "admin"
    member: str = field(_member_id)
    force: bool = field(_flag, default=False)


class MemberPromote(Change):
    TYPE = "member_promote"
    ROUTE = "member"
    PERMISSION = "admin"
    member: str = field(_member_id)


class AuthAdd(Request):
    """Adds an identity (admin only). The client made the secret and sends only its verifier
    (dlm/auth.py): the secret never reaches a member."""

    TYPE = "auth_add"
    ROUTE = "identity"
    PERMISSION = "admin"
    name: str = field(_identity_name)
    role: str = field(_role)
    prefixes: list[str] = field(_prefixes, default_factory=list)
    key_id: bytes = field(_key_bytes(8))
    stored_key: bytes = field(_key_bytes(32))
    server_key: bytes = field(_key_bytes(32))


class AuthRemove(Request):
    """Removes an identity: its connections close, its leases run out at their TTL.

    ``request`` (up to 16 bytes, cluster version 4; ignored before): an id the client
    draws once per removal and sends again on every re-send of it, so that a re-send
    after a lost answer is answered done rather than "no identity"."""

    TYPE = "auth_remove"
    ROUTE = "identity"
    PERMISSION = "admin"
    name: str = field(_identity_name)
    request: bytes = field(_request_id, default=b"")


class AuthSet(Request):
    """Sets an identity's own quotas (cluster version 4): each ``max_*`` a value from 1
    to IDENTITY_LIMIT_MAX, 0 (back to the members' ``--identity-max-*`` default) or -1
    (unchanged, the default)."""

    TYPE = "auth_set"
    ROUTE = "identity"
    PERMISSION = "admin"
    name: str = field(_identity_name)
    max_leases: int = field(_limit_change, default=-1)
    max_locks: int = field(_limit_change, default=-1)
    max_connections: int = field(_limit_change, default=-1)
    max_inflight: int = field(_limit_change, default=-1)


class AuthRotate(Request):
    """Gives an identity a new key; the old one stays valid until ``auth_finish`` or 24 h."""

    TYPE = "auth_rotate"
    ROUTE = "identity"
    PERMISSION = "admin"
    name: str = field(_identity_name)
    key_id: bytes = field(_key_bytes(8))
    stored_key: bytes = field(_key_bytes(32))
    server_key: bytes = field(_key_bytes(32))


class AuthFinish(Request):
    """Ends an identity's rotation: only its new key is valid from now on."""

    TYPE = "auth_finish"
    ROUTE = "identity"
    PERMISSION = "admin"
    name: str = field(_identity_name)


class AuthList(Request):
    """The identities (names, roles, prefixes, key ids: never a key)."""

    TYPE = "auth_list"
    ROUTE = "read"
    PERMISSION = "admin"


class ConfigSet(Request):
    """Sets a cluster-wide setting (cluster version 5; admin only): ``setting`` one of
    default-ttl, max-ttl, lock-delay, ``value_ms`` its value in ms (0: unset). Through the
    log; setting a value twice is no different from once, so it names no seq. In a
    partitioned cluster each partition keeps its own copy (`dlm config set` sets each)."""

    TYPE = "config_set"
    ROUTE = "identity"
    PERMISSION = "admin"
    setting: str = field(_setting)
    value_ms: int = field(_opt_count, default=0)


class ConfigGet(Request):
    """The cluster-wide settings (cluster version 5; admin only): ``setting`` names one
    (None: all). Answered ``settings``: each setting's value in ms, null when not set."""

    TYPE = "config_get"
    ROUTE = "read"
    PERMISSION = "admin"
    setting: str | None = field(_opt_setting, default=None, omit=True)


class Watch(Request):
    """Push every change of ``key`` (or of every key under ``prefix``: exactly one of
    the two) from the log index ``after`` on (None: from now). Served by the member it is
    sent to, from its applied log, followers too (dlm/node/watches.py): the ok answer
    names the index it starts after, then ``watch`` frames carry the changes and a
    ``watch_end`` frame ends it (docs/PROTOCOL.md, "Watches")."""

    TYPE = "watch"
    ROUTE = "watch"
    PERMISSION = "key"
    key: str | None = field(_opt_key, default=None, omit=True)
    prefix: str | None = field(_opt_prefix, default=None, omit=True)
    after: int | None = field(_opt_index, default=None, omit=True)


AuthChange = AuthAdd | AuthRemove | AuthRotate | AuthFinish | AuthSet | ConfigSet

ClientRequest = (
    OpenLease
    | Renew
    | CloseLease
    | UpdateLease
    | Acquire
    | Release
    | Proclaim
    | Get
    | ListLocks
    | LeaseInfo
    | ListLeases
    | Status
    | Ping
    | Members
    | SnapshotSave
    | MemberAdd
    | MemberRemove
    | MemberPromote
    | AuthAdd
    | AuthRemove
    | AuthRotate
    | AuthFinish
    | AuthSet
    | AuthList
    | Runs
    | Watch
    | ConfigSet
    | ConfigGet
)
LockChange = OpenLease | CloseLease | UpdateLease | Acquire | Release | Proclaim

TRACED_REQUESTS = frozenset(
    cls.TYPE for cls in (OpenLease, Renew, CloseLease, UpdateLease, Acquire, Release)
)
"""The request types that may carry a ``trace`` field (a client adds it to no other)."""
MemberChange = MemberAdd | MemberRemove | MemberPromote

REQUESTS: dict[str, type[ClientRequest]] = {
    cls.TYPE: cls
    for cls in (
        OpenLease,
        Renew,
        CloseLease,
        UpdateLease,
        Acquire,
        Release,
        Proclaim,
        Get,
        ListLocks,
        LeaseInfo,
        ListLeases,
        Status,
        Ping,
        Members,
        SnapshotSave,
        MemberAdd,
        MemberRemove,
        MemberPromote,
        AuthAdd,
        AuthRemove,
        AuthRotate,
        AuthFinish,
        AuthSet,
        AuthList,
        Runs,
        Watch,
        ConfigSet,
        ConfigGet,
    )
}
"""Each request class by its wire type ``t``."""


def decode_request(obj: Any) -> ClientRequest:
    """Validates one client frame; raises ProtocolError naming what is wrong."""
    msg = as_map(obj)
    kind = msg.get("t")
    rid = _id(msg, "id")
    cls = REQUESTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown request type {str(kind)[:40]!r}")
    request = cls.__new__(cls)
    _set(request, "id", rid)
    for name, check in cls._DECODE:
        _set(request, name, check(msg, name))
    return request


# ---------------------------------------------------------------------------
# Replies: the ok bodies, as records
# ---------------------------------------------------------------------------
# A member builds these and sends ``frame(rid)``; a client reads the ones it acts on with
# ``from_wire``, whose checks are the client's: they refuse what the client cannot act on
# (BAD_REPLY there) and pass over what it ignores. Field order is the reply's byte order.


def _reply_int(msg: dict[Any, Any], name: str) -> int:
    value = msg.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"reply field {name!r} is missing or not an integer")
    return value


def _reply_opt_int(msg: dict[Any, Any], name: str) -> int | None:
    value = msg.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reply_count(msg: dict[Any, Any], name: str) -> int:
    """An integer a member of an earlier release may leave out (0 then)."""
    return _reply_opt_int(msg, name) or 0


def _reply_text(msg: dict[Any, Any], name: str) -> str:
    value = msg.get(name)
    return value if isinstance(value, str) else ""


def _reply_opt_text(msg: dict[Any, Any], name: str) -> str | None:
    value = msg.get(name)
    return value if isinstance(value, str) else None


def _reply_texts(msg: dict[Any, Any], name: str) -> list[str]:
    value = msg.get(name)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _reply_true(msg: dict[Any, Any], name: str) -> bool:
    return msg.get(name) is True


def _released_what(msg: dict[Any, Any], name: str) -> str:
    # A member of an early release said nothing: it released a lock.
    value = msg.get(name, "lock")
    return value if isinstance(value, str) else ""


def _wire_value(value: Any) -> Any:
    # Through a tuple: compiled (mypyc), isinstance(value, Reply) itself would miss the
    # replies of dlm.views, which derive from Reply but are not compiled.
    if isinstance(value, _REPLY_CLASSES):
        return value.to_wire()  # type: ignore[attr-defined]
    if isinstance(value, list):
        return [_wire_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire_value(v) for k, v in value.items()}
    return value


class Reply(Record, metaclass=RecordSpec):
    """Base of the reply records: an ok reply's body, or a part of one.

    ``omit`` fields are left out of the frame while None, or while the field ``omit``
    names is None (a member that does not lead knows no lease clocks, so it says nothing
    of them).
    """

    _TABLE: ClassVar[dict[str, Field]]
    _INIT: ClassVar[tuple[tuple[str, Any, Callable[[], Any] | None], ...]]
    _DECODE: ClassVar[tuple[tuple[str, Check], ...]]

    def __init__(self, **values: Any) -> None:
        _build(self, values)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        table = self._TABLE
        for name in self.FIELDS:
            value = getattr(self, name)
            omit = table[name].omit
            if omit and getattr(self, name if omit is True else omit) is None:
                continue
            out[name] = _wire_value(value)
        return out

    def frame(self, rid: int) -> dict[str, Any]:
        """The ok reply to request ``rid`` carrying this body."""
        return ok(rid, **self.to_wire())

    @classmethod
    def from_wire(cls, obj: Any) -> Self:
        """The record a reply describes; ProtocolError naming a field the client needs
        and cannot read."""
        msg = as_map(obj)
        record = cls.__new__(cls)
        for name, check in cls._DECODE:
            _set(record, name, check(msg, name))
        return record


_REPLY_CLASSES: tuple[type, ...] = (Reply,)


class LeaseOpened(Reply):
    """The answer to ``open_lease``."""

    lease: str = field(_reply_text)
    ttl_ms: int = field(_reply_int)
    incarnation: int = field(_reply_count, default=0)


class LeaseTerms(Reply):
    """The answer to ``keepalive`` and ``lease_update``: the TTL now counting."""

    lease: str = field(_reply_text)
    ttl_ms: int = field(_reply_int)


class LeaseEnded(Reply):
    """The answer to ``close_lease``: the keys the lease held."""

    lease: str = field(_reply_text)
    released: list[str] = field(_reply_texts, default_factory=list)


class LockGranted(Reply):
    """An ``acquire`` answered at once: the lock is held, under ``token``."""

    result: str = field(_reply_text, default="granted")
    key: str = field(_reply_text)
    token: int = field(_reply_int)
    lease: str = field(_reply_text)
    ttl_ms: int = field(_reply_int)


class LockQueued(Reply):
    """An ``acquire`` with ``wait`` put in the queue; a ``grant`` push follows."""

    result: str = field(_reply_text, default="queued")
    key: str = field(_reply_text)
    lease: str = field(_reply_text)
    position: int | None = field(_reply_opt_int)


class LockReleased(Reply):
    """The answer to ``release``: a lock (``released="lock"``) or a queue place left."""

    key: str = field(_reply_text)
    released: str = field(_released_what)
    token: int | None = field(_reply_opt_int)
    lease_ended: bool = field(_reply_true)


BACKUP_CHUNK_BYTES = 256 * 1024
"""The most image bytes in one ``snapshot_save`` chunk frame: well inside the 4 MiB a
client reads in one frame, and small enough that a member writes the next one only
once the client has taken most of the last (the member's buffer per client is 1 MiB)."""
BACKUP_MAX_BYTES = 1 << 40
"""The largest image a client accepts (more is a bad reply)."""


def _reply_names(msg: dict[Any, Any], name: str) -> list[str]:
    value = msg.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"reply field {name!r} is missing or not a list of names")
    return value


def _reply_index(msg: dict[Any, Any], name: str) -> int:
    value = _reply_int(msg, name)
    if not 0 <= value < INT_LIMIT:
        raise ProtocolError(f"reply field {name!r} is {value}, outside [0, 2**63)")
    return value


def _reply_offset(msg: dict[Any, Any], name: str) -> int:
    value = _reply_int(msg, name)
    if not 0 <= value <= BACKUP_MAX_BYTES:
        raise ProtocolError(f"reply field {name!r} is {value}, outside [0, {BACKUP_MAX_BYTES}]")
    return value


def _reply_chunk(msg: dict[Any, Any], name: str) -> bytes:
    value = msg.get(name)
    if not isinstance(value, bytes) or len(value) > BACKUP_CHUNK_BYTES:
        raise ProtocolError(
            f"reply field {name!r} is missing, not bytes or over {BACKUP_CHUNK_BYTES} bytes"
        )
    return value


class SnapshotHeader(Reply):
    """The first answer to ``snapshot_save``, sent as soon as the image is started: where
    it stands (a committed index and the term of its entry), the configuration in force
    there, the member serving it and its wall clock then. Chunks follow."""

    cluster: str = field(_reply_text)
    index: int = field(_reply_index)
    term: int = field(_reply_index)
    voters: list[str] = field(_reply_names)
    learners: list[str] = field(_reply_names)
    leader: str = field(_reply_text)
    taken_at_ms: int = field(_reply_index)


class SnapshotChunk(Reply):
    """One piece of the image, in order (``t`` is ``chunk``): ``offset`` is where its bytes
    start, and ``last`` marks the end of the image."""

    offset: int = field(_reply_offset)
    data: bytes = field(_reply_chunk)
    last: bool = field(_reply_true, default=False)


def backup_chunk_frames(rid: int, image: bytes) -> Iterator[dict[str, Any]]:
    """The frames that carry ``image`` after the header of ``snapshot_save`` ``rid``
    (a runtime sends them as its client takes them; the simulator all at once)."""
    view = memoryview(image)
    offset = 0
    while True:
        chunk = bytes(view[offset : offset + BACKUP_CHUNK_BYTES])
        last = offset + len(chunk) >= len(image)
        body = SnapshotChunk(offset=offset, data=chunk, last=last).to_wire()
        yield {"t": "chunk", **body, "id": rid}
        if last:
            return
        offset += len(chunk)


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


def watch_push(rid: int, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Changes pushed to the watch that request ``rid`` started, in log order."""
    # Named by "watch", not "id": a push is no reply, and a client's request loop must
    # not take it for the answer to a request that happens to share its number.
    return {"t": "watch", "watch": rid, "events": events}


def watch_end(rid: int, code: ErrorCode, message: str) -> dict[str, Any]:
    """The end of the watch that request ``rid`` started, and why (the client may start
    it again: from the last index it saw, or, after COMPACTED, from a fresh read)."""
    return {"t": "watch_end", "watch": rid, "code": code.value, "message": message}


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
