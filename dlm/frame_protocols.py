"""The shapes of the frame sealer and opener that dlm.wire takes, named structurally.

wire never imports dlm.auth (nor typing, at run time); it imports this module only while
type checking. The classes live here rather than inside wire's TYPE_CHECKING block
because mypyc, which compiles wire (`make compiled`), refuses class definitions nested
in a block.
"""

from __future__ import annotations

from typing import Protocol


class FrameOpenerLike(Protocol):
    """dlm.auth.FrameOpener, named structurally: wire never imports dlm.auth."""

    overhead: int

    def open(self, payload: bytes) -> bytes: ...


class FrameSealerLike(Protocol):
    def seal(self, body: bytes) -> bytes: ...
