"""The client's small CBOR codec agrees with cbor2, and refuses what it does not speak."""

from __future__ import annotations

import math
import struct

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm import wire
from dlm.client import cbor

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text() | st.integers(-1000, 1000), inner, max_size=5)
    ),
    max_leaves=25,
)


@given(values)
def test_what_it_encodes_cbor2_decodes_and_back(value: object) -> None:
    assert cbor2.loads(cbor.dumps(value)) == value
    assert cbor.loads(cbor2.dumps(value)) == value


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_value_error(data: bytes) -> None:
    try:
        cbor.loads(data)
    except ValueError:
        pass


@pytest.mark.parametrize(
    "data",
    [
        b"",  # nothing
        b"\x19\x01",  # truncated head
        b"\x63ab",  # truncated text
        b"\x82\x01",  # truncated array
        b"\xc1\x00",  # tag 1 (a date)
        b"\xf7",  # undefined
        b"\x9f\xff",  # indefinite-length array
        b"\x01\x02",  # trailing bytes
        b"\xa1\x80\x01",  # an array as a map key
        b"\x81" * (cbor.MAX_DEPTH + 2) + b"\x00",  # too deep
        b"\x62\xff\xfe",  # not UTF-8
        b"\x9b" + b"\xff" * 8,  # an array longer than the input
    ],
)
def test_refuses(data: bytes) -> None:
    with pytest.raises(ValueError):
        cbor.loads(data)


def test_decodes_every_float_width() -> None:
    assert cbor.loads(b"\xf9" + struct.pack(">e", 1.5)) == 1.5
    assert cbor.loads(b"\xfa" + struct.pack(">f", 0.25)) == 0.25
    assert math.isinf(cbor.loads(b"\xfb" + struct.pack(">d", math.inf)))


def test_refuses_to_encode_other_types() -> None:
    with pytest.raises(TypeError):
        cbor.dumps({"when": object()})
    with pytest.raises(ValueError):
        cbor.dumps(2**64)


def test_frames_through_the_wire_layer_become_protocol_errors() -> None:
    dec = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT, cbor.loads)
    dec.feed(
        wire.encode_frame({"t": "ok", "id": 1}, cbor.dumps) + struct.pack(">I", 2) + b"\xc1\x00"
    )
    frames = dec.frames()
    assert next(frames) == {"t": "ok", "id": 1}
    with pytest.raises(wire.ProtocolError):
        next(frames)
