"""What the hot rooms tell mypyc when `make compiled` builds them to C extensions.

``mypyc_attr`` comes from mypy_extensions, which only the build has (it ships with
mypy); an interpreted run, the zipapp's included, gets a decorator that does nothing,
so the runtime dependencies stay as they are. mypyc reads the decorator while it
compiles and never calls it, so a compiled module does not import it either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

_T = TypeVar("_T")

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:

    def mypyc_attr(*_: object, **__: object) -> Callable[[_T], _T]:
        return lambda cls: cls


__all__ = ["mypyc_attr"]
