"""The small CBOR codec of the blocking client: the few types dlm's frames carry.

Why not cbor2: importing it (its pure-Python modules, then typing and
datetime, before its C extension takes over) costs ~6 ms, a tenth of a
`dlm acquire`, to encode three requests and decode three replies. This module
costs ~0.2 ms, and a frame of a few dozen bytes is encoded or decoded in
microseconds either way. The node keeps cbor2 (dlm/wire.py), which is faster
per frame.

What it speaks (RFC 8949): unsigned and negative integers up to 64 bits,
byte and text strings, arrays, maps, false, true, null, and half, single and
double floats, all of definite length. Decoding refuses everything else
(tags, undefined, other simple values, indefinite lengths), nesting deeper
than MAX_DEPTH, unhashable map keys, truncated input and trailing bytes, with
ValueError; the frame layer turns that into ProtocolError.
"""

from __future__ import annotations

import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_DEPTH = 16

_FLOAT_FORMATS = {25: ">e", 26: ">f", 27: ">d"}
_SIMPLE = {20: False, 21: True, 22: None}
_DOUBLE = struct.Struct(">Bd")


def dumps(obj: object) -> bytes:
    out = bytearray()
    _encode(obj, out, 0)
    return bytes(out)


def _head(major: int, n: int, out: bytearray) -> None:
    """The initial byte of an item of ``major`` type with argument ``n``, then the argument."""
    top = major << 5
    if n < 24:
        out.append(top | n)
    elif n < 0x100:
        out.append(top | 24)
        out.append(n)
    elif n < 0x1_0000:
        out.append(top | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x1_0000_0000:
        out.append(top | 26)
        out += n.to_bytes(4, "big")
    elif n < 0x1_0000_0000_0000_0000:
        out.append(top | 27)
        out += n.to_bytes(8, "big")
    else:
        raise ValueError("integer out of CBOR's 64-bit range")


def _encode(obj: object, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"value is nested deeper than {MAX_DEPTH}")
    if obj is None:
        out.append(0xF6)
    elif obj is True:
        out.append(0xF5)
    elif obj is False:
        out.append(0xF4)
    elif isinstance(obj, int):
        if obj >= 0:
            _head(0, obj, out)
        else:
            _head(1, -1 - obj, out)
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        _head(3, len(data), out)
        out += data
    elif isinstance(obj, bytes | bytearray):
        _head(2, len(obj), out)
        out += obj
    elif isinstance(obj, float):
        out += _DOUBLE.pack(0xFB, obj)
    elif isinstance(obj, list | tuple):
        _head(4, len(obj), out)
        for item in obj:
            _encode(item, out, depth + 1)
    elif isinstance(obj, dict):
        _head(5, len(obj), out)
        for key, value in obj.items():
            _encode(key, out, depth + 1)
            _encode(value, out, depth + 1)
    else:
        raise TypeError(f"cannot encode a {type(obj).__name__} as CBOR")


def loads(data: bytes) -> Any:
    value, end = _decode(data, 0, 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} bytes after the CBOR value")
    return value


def _decode(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    """The item that starts at ``pos``, and where the next one starts."""
    if depth > MAX_DEPTH:
        raise ValueError(f"value is nested deeper than {MAX_DEPTH}")
    if pos >= len(data):
        raise ValueError("truncated CBOR value")
    initial = data[pos]
    pos += 1
    major, info = initial >> 5, initial & 0x1F
    if major == 7:
        if info in _SIMPLE:
            return _SIMPLE[info], pos
        fmt = _FLOAT_FORMATS.get(info)
        if fmt is None:
            raise ValueError(f"simple value {info} is not accepted")
        end = pos + struct.calcsize(fmt)
        if end > len(data):
            raise ValueError("truncated float")
        return struct.unpack(fmt, data[pos:end])[0], end
    if info < 24:
        n = info
    elif info < 28:
        end = pos + (1 << (info - 24))
        if end > len(data):
            raise ValueError("truncated CBOR head")
        n = int.from_bytes(data[pos:end], "big")
        pos = end
    else:
        raise ValueError("indefinite lengths and reserved values are not accepted")
    if major == 0:
        return n, pos
    if major == 1:
        return -1 - n, pos
    if major in (2, 3):
        end = pos + n
        if end > len(data):
            raise ValueError("truncated string")
        chunk = data[pos:end]
        return (bytes(chunk) if major == 2 else chunk.decode("utf-8")), end
    if major == 4:
        if n > len(data) - pos:  # every item takes at least a byte
            raise ValueError("truncated array")
        items = []
        for _ in range(n):
            item, pos = _decode(data, pos, depth + 1)
            items.append(item)
        return items, pos
    if major == 5:
        if 2 * n > len(data) - pos:
            raise ValueError("truncated map")
        out: dict[Any, Any] = {}
        for _ in range(n):
            key, pos = _decode(data, pos, depth + 1)
            if isinstance(key, list | dict):
                raise ValueError("a map key must be a number, string or simple value")
            value, pos = _decode(data, pos, depth + 1)
            out[key] = value
        return out, pos
    raise ValueError("CBOR tags are not allowed")
