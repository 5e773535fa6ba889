"""dlm.cbor_codec: cbor2's C module used directly, and the package's pure-Python codec
where the C module is missing; both give the same bytes and the same values."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlm import cbor_codec, wire

ROOT = Path(__file__).resolve().parents[2]

try:
    import _cbor2  # type: ignore[import-not-found]  # noqa: F401

    HAVE_C = True
except ImportError:
    HAVE_C = False

needs_c = pytest.mark.skipif(not HAVE_C, reason="cbor2's C extension is not installed")

NO_C_MODULE = "import sys; sys.modules['_cbor2'] = None\n"
"""Run first in a child process, this makes `import _cbor2` fail as on a platform without it."""


def run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


class Colour(enum.StrEnum):
    RED = "RED"


SAMPLES: list[object] = [
    {"t": "acquire", "id": 7, "lease": "L", "key": "k", "wait": False, "limit": 1},
    {"meta": {"host": "é"}, "list": [1, -1, 2**63 - 1, -(2**63) + 1, b"\x00\xff", None, True]},
    {"code": wire.ErrorCode.NOT_LEADER, "role": wire.HelloRole.CLIENT, "c": Colour.RED},
    (1, 2, bytearray(b"ab")),
    [],
    {},
]


def test_the_module_says_which_codec_it_runs() -> None:
    assert cbor_codec.C_CODEC is HAVE_C


@pytest.mark.parametrize("value", SAMPLES)
def test_this_process_codec_encodes_as_the_pure_codec_does(value: object) -> None:
    from cbor2 import _decoder, _encoder

    body = cbor_codec.dumps(value)
    assert body == _encoder.dumps(value)
    assert cbor_codec.loads(body) == _decoder.loads(body)


def test_the_fallback_is_the_pure_codec_and_speaks_the_same_bytes() -> None:
    probe = NO_C_MODULE + (
        "import json\n"
        "from dlm import cbor_codec, wire\n"
        "from tests.unit.test_cbor_codec import SAMPLES\n"
        "frames = [wire.encode_frame(v).hex() for v in SAMPLES]\n"
        "values = [repr(wire.decode_body(bytes.fromhex(f)[4:])) for f in frames]\n"
        "print(json.dumps([cbor_codec.C_CODEC, cbor_codec.dumps.__module__, frames, values]))\n"
    )
    c_codec, module, frames, values = json.loads(run_python(probe).splitlines()[-1])
    assert c_codec is False and module.startswith("cbor2")
    assert frames == [wire.encode_frame(v).hex() for v in SAMPLES]
    assert values == [repr(wire.decode_body(bytes.fromhex(f)[4:])) for f in frames]


def test_the_fallback_passes_the_protocols_golden_tests() -> None:
    # Every request kind's bytes and every damaged request's verdict, pinned in the
    # golden file, through the pure-Python codec.
    run_python(
        NO_C_MODULE + "import dlm.cbor_codec\n"
        "assert not dlm.cbor_codec.C_CODEC\n"
        "import pytest\n"
        "sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', '-p', 'no:xdist',"
        " 'tests/unit/test_wire_golden.py']))\n"
    )


@needs_c
def test_the_c_codec_loads_neither_the_cbor2_package_nor_typing() -> None:
    probe = (
        "import sys\n"
        "import dlm.wire as wire\n"
        "body = wire.encode_frame({'t': 'ping', 'id': 1, 'x': [b'', None]})[4:]\n"
        "assert wire.decode_body(body) == {'t': 'ping', 'id': 1, 'x': [b'', None]}\n"
        "loaded = sorted(sys.modules)\n"
        "import json  # json itself loads re\n"
        "print(json.dumps(loaded))\n"
    )
    loaded = set(json.loads(run_python(probe).splitlines()[-1]))
    heavy = {"cbor2", "typing", "re"}
    assert "_cbor2" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in heavy) == []


@needs_c
def test_the_cbor2_package_works_as_usual_after_the_c_codec_was_set_up() -> None:
    # The set-up gave the C module small tables and a FrozenDict factory before the
    # package existed in the process: the package, imported later, must be whole.
    probe = (
        "import enum, json\n"
        "from dlm import cbor_codec\n"
        "key_map = bytes.fromhex('a1a1616101' + '02')\n"
        "early = cbor_codec.loads(key_map)\n"
        "import cbor2, datetime\n"
        "class E(enum.StrEnum):\n"
        "    A = 'A'\n"
        "print(json.dumps([\n"
        "    type(next(iter(early))).__qualname__,\n"
        "    type(next(iter(cbor2.loads(key_map)))).__qualname__,\n"
        "    cbor2.loads is cbor_codec.loads,\n"
        "    cbor2.dumps(E.A).hex(),\n"
        "    cbor2.dumps({'b': 1, 'a': 2}, canonical=True).hex(),\n"
        "    cbor2.dumps(datetime.date(2020, 1, 2)).hex() != '',\n"
        "]))\n"
    )
    early, late, same, strenum, canonical, date_ok = json.loads(run_python(probe).splitlines()[-1])
    assert early == late == "FrozenDict"
    assert same is True
    assert strenum == "6141"  # text "A"
    assert canonical == "a2616102616201"
    assert date_ok is True
