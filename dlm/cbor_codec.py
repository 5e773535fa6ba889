"""cbor2's C codec without the cost of importing the cbor2 package.

Why: every `dlm acquire` and `dlm exec` encodes and decodes a few frames, and
importing the cbor2 package to do so pulls in ``typing``, ``re`` and the
package's pure-Python codec, about a third of the command's start-up. cbor2's
C extension ``_cbor2`` alone costs a fraction of that, and it is what the
package itself hands out when it is installed.

What the package does for its C module, and what is done here instead: it
fills in the C encoder's tables of encoders by type (which the C encoder
consults only for types it does not know natively, such as a ``StrEnum``
member, or ``bool``/``int`` subclasses), and the C decoder looks up
``cbor2._types.FrozenDict`` the first time a decoder is made (it needs it only
for a map used as a map key, which dlm never sends and check_cbor refuses).
Here the tables name just the plain types dlm's frames hold, and the decoder
is given a factory that imports the real FrozenDict on first use, so a
process that also uses the cbor2 package gets exactly what the package
would have given it.

Where ``_cbor2`` is missing (the zipapp, or a platform without a wheel), the
package's own ``dumps``/``loads`` are used: its pure-Python codec. ``C_CODEC``
says which one this process runs.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def _frozen_dict(mapping: Any) -> Any:
    """What the C decoder calls for a map used as a map key: the package's FrozenDict."""
    from cbor2 import FrozenDict

    return FrozenDict(mapping)


def _prepare_c_codec(c_module: Any) -> None:
    """Gives ``_cbor2`` what the cbor2 package would, unless the package already did."""
    if "cbor2" in sys.modules or hasattr(c_module, "default_encoders"):
        return  # the package is (being) imported: its own set-up stands
    encoder = c_module.CBOREncoder
    plain = {
        bytes: encoder.encode_bytestring,
        bytearray: encoder.encode_bytearray,
        str: encoder.encode_string,
        bool: encoder.encode_boolean,  # before int: bool is an int subclass
        int: encoder.encode_int,
        type(None): encoder.encode_none,
        tuple: encoder.encode_array,
        list: encoder.encode_array,
        dict: encoder.encode_map,
    }
    c_module.default_encoders = plain
    c_module.canonical_encoders = {**plain, dict: encoder.encode_canonical_map}
    # The C decoder imports cbor2._types (and so the whole package) once, for FrozenDict,
    # when its first decoder is made. Make that first decoder now, with stand-ins for the
    # package and that module in place (the import returns the top package, so both), and
    # take them out again: the C module keeps _frozen_dict, and a later `import cbor2`
    # loads the real package as if nothing had happened.
    stand_ins = {name: type(sys)(name) for name in ("cbor2", "cbor2._types")}
    stand_ins["cbor2._types"].FrozenDict = _frozen_dict  # type: ignore[attr-defined]
    sys.modules.update(stand_ins)
    try:
        c_module.loads(b"\xa0")
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


def _load() -> tuple[Callable[..., bytes], Callable[..., Any], bool]:
    try:
        import _cbor2  # type: ignore[import-not-found]
    except ImportError:
        import cbor2  # its pure-Python codec, the same contract

        return cbor2.dumps, cbor2.loads, False
    _prepare_c_codec(_cbor2)
    return _cbor2.dumps, _cbor2.loads, True


dumps, loads, C_CODEC = _load()
"""``dumps(obj)`` and ``loads(body, tag_hook=...)``, as cbor2's own; ``C_CODEC``: which."""
