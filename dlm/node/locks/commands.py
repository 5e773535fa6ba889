"""The commands that change the lock table, and their bytes in the Raft log.

A command is a frozen dataclass. ``encode_command`` turns it into a CBOR array
whose first item names the command (``["acquire", lease, seq, ...]``), encoded
canonically so equal commands give equal bytes. ``decode_command`` is strict:
it accepts exactly the shapes ``encode_command`` produces and raises
``CommandError`` for anything else, so a bad payload in the log becomes a
BAD_REQUEST reply instead of an exception inside apply.

Decoding checks types only; ``validate_command`` checks ranges (lease id
alphabet, key length, TTL bounds, ...). The state machine runs both, and the
server may call ``validate_command`` before proposing, to spare the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cbor2

LEASE_ID_MAX_CHARS = 64
KEY_MAX_CHARS = 512
META_MAX_ENTRIES = 16
META_KEY_MAX_CHARS = 64
META_VALUE_MAX_CHARS = 256
LIMIT_MAX = 1024
TTL_MIN_MS = 1_000
TTL_MAX_MS = 86_400_000
COMMAND_MAX_BYTES = 64 * 1024
"""Larger payloads are refused before CBOR decoding even starts."""
INT_MAX = 2**63 - 1
"""Integers above this are refused: they would not survive a round trip through most stores."""

_LEASE_ID_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


@dataclass(frozen=True, slots=True)
class OpenLease:
    """Start a lease (session) with the client-chosen id; idempotent while it lives."""

    lease: str
    ttl_ms: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class CloseLease:
    """End a lease: release its locks, leave its queues, grant the next waiters."""

    lease: str
    seq: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Acquire:
    """Take ``key`` (exclusive when ``limit`` is 1, else a semaphore of ``limit`` slots).

    ``wait`` asks for a place in the key's FIFO queue when no slot is free.
    """

    lease: str
    seq: int
    key: str
    wait: bool
    limit: int
    meta: Mapping[str, str] = field(hash=False)
    at_ms: int


@dataclass(frozen=True, slots=True)
class Release:
    """Give up a held slot of ``key``, or the lease's place in its queue."""

    lease: str
    seq: int
    key: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Expire:
    """Proposed by the leader alone when a lease's deadline passed; acts like CloseLease."""

    lease: str
    at_ms: int


Command = OpenLease | CloseLease | Acquire | Release | Expire


class CommandError(ValueError):
    """A payload that is not a well-formed command."""


def encode_command(cmd: Command) -> bytes:
    """The canonical bytes of ``cmd`` for a Raft entry."""
    item: list[Any]
    match cmd:
        case OpenLease():
            item = ["open", cmd.lease, cmd.ttl_ms, cmd.at_ms]
        case CloseLease():
            item = ["close", cmd.lease, cmd.seq, cmd.at_ms]
        case Acquire():
            item = [
                "acquire",
                cmd.lease,
                cmd.seq,
                cmd.key,
                cmd.wait,
                cmd.limit,
                dict(cmd.meta),
                cmd.at_ms,
            ]
        case Release():
            item = ["release", cmd.lease, cmd.seq, cmd.key, cmd.at_ms]
        case Expire():
            item = ["expire", cmd.lease, cmd.at_ms]
    return bytes(cbor2.dumps(item, canonical=True))


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
    name, fields = item[0], item[1:]
    match name:
        case "open":
            _arity(name, fields, 3)
            return OpenLease(
                _str(fields[0], "lease"), _int(fields[1], "ttl_ms"), _int(fields[2], "at_ms")
            )
        case "close":
            _arity(name, fields, 3)
            return CloseLease(
                _str(fields[0], "lease"), _int(fields[1], "seq"), _int(fields[2], "at_ms")
            )
        case "acquire":
            _arity(name, fields, 7)
            return Acquire(
                lease=_str(fields[0], "lease"),
                seq=_int(fields[1], "seq"),
                key=_str(fields[2], "key"),
                wait=_bool(fields[3], "wait"),
                limit=_int(fields[4], "limit"),
                meta=_meta(fields[5]),
                at_ms=_int(fields[6], "at_ms"),
            )
        case "release":
            _arity(name, fields, 4)
            return Release(
                _str(fields[0], "lease"),
                _int(fields[1], "seq"),
                _str(fields[2], "key"),
                _int(fields[3], "at_ms"),
            )
        case "expire":
            _arity(name, fields, 2)
            return Expire(_str(fields[0], "lease"), _int(fields[1], "at_ms"))
    raise CommandError(f"unknown command {name[:32]!r}")


def validate_command(cmd: Command) -> str | None:
    """Why ``cmd`` is out of range (a message for the user), or None when it is fine."""
    problem = check_lease_id(cmd.lease)
    if problem is None and not 0 <= cmd.at_ms <= INT_MAX:
        problem = "at_ms must be a non-negative wall-clock time in milliseconds"
    if problem is None and isinstance(cmd, CloseLease | Acquire | Release):
        problem = _check_seq(cmd.seq)
    if problem is not None:
        return problem
    match cmd:
        case OpenLease():
            if not TTL_MIN_MS <= cmd.ttl_ms <= TTL_MAX_MS:
                return (
                    f"ttl_ms must be between {TTL_MIN_MS} and {TTL_MAX_MS} (1 s to 24 h); "
                    f"got {cmd.ttl_ms}: pick a TTL in that range"
                )
        case Acquire():
            return check_key(cmd.key) or _check_limit(cmd.limit) or check_meta(cmd.meta)
        case Release():
            return check_key(cmd.key)
    return None


def check_lease_id(lease: str) -> str | None:
    if 1 <= len(lease) <= LEASE_ID_MAX_CHARS and _LEASE_ID_ALPHABET.issuperset(lease):
        return None
    return (
        f"lease id must be 1 to {LEASE_ID_MAX_CHARS} characters of A-Z, a-z, 0-9, '_' or '-'; "
        f"got {lease[:80]!r}"
    )


def check_key(key: str) -> str | None:
    if not 1 <= len(key) <= KEY_MAX_CHARS:
        return (
            f"key must be 1 to {KEY_MAX_CHARS} characters long; got {len(key)}: use a shorter key"
        )
    if any(_is_control(ch) for ch in key):
        return f"key {key[:80]!r} contains a control character; keys must be printable text"
    return None


def check_meta(meta: Mapping[str, str]) -> str | None:
    if len(meta) > META_MAX_ENTRIES:
        return f"metadata has {len(meta)} entries; at most {META_MAX_ENTRIES} are kept: drop some"
    for name, value in meta.items():
        if not 1 <= len(name) <= META_KEY_MAX_CHARS or any(_is_control(ch) for ch in name):
            return (
                f"metadata name {name[:80]!r} must be 1 to {META_KEY_MAX_CHARS} printable "
                "characters"
            )
        if len(value) > META_VALUE_MAX_CHARS or any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
            return (
                f"metadata value of {name!r} must be at most {META_VALUE_MAX_CHARS} characters "
                "of text: shorten it"
            )
    return None


def _check_limit(limit: int) -> str | None:
    if 1 <= limit <= LIMIT_MAX:
        return None
    return (
        f"limit must be between 1 (exclusive lock) and {LIMIT_MAX} (semaphore slots); got {limit}"
    )


def _check_seq(seq: int) -> str | None:
    if 0 <= seq <= INT_MAX:
        return None
    return f"seq must be a request id between 0 and 2**63-1; got {seq}"


def _is_control(ch: str) -> bool:
    code = ord(ch)
    # C0, DEL, C1, and lone surrogates (which have no UTF-8 form).
    return code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF


def _arity(name: str, fields: list[Any], expected: int) -> None:
    if len(fields) != expected:
        raise CommandError(f"{name} takes {expected} fields, got {len(fields)}")


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
