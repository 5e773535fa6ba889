"""What the hot rooms tell mypyc when `make compiled` builds them to C extensions.

``mypyc_attr`` comes from mypy_extensions, which only the build has (it ships with
mypy); an interpreted run, the zipapp's included, gets a decorator that does nothing,
so the runtime dependencies stay as they are. mypyc reads the decorator while it
compiles and never calls it, so a compiled module does not import it either.
"""

from __future__ import annotations

# Not `typing.TYPE_CHECKING`: wire.py imports this module on every `dlm` start, which
# keeps typing off its path (tests/unit/cli/test_imports.py). mypy takes any
# TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:

    def mypyc_attr(*_, **__):
        return lambda cls: cls


__all__ = ["mypyc_attr"]
