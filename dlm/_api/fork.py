"""Which process a client or lock object belongs to: inert in a forked child.

Private. A forked child inherits its parent's sockets and a copy of every object,
but none of its threads: a ``Lock`` the child released (or a ``with`` block it left,
or a finalizer that ran at its exit) would release the *parent's* lock, and a
renewal written on an inherited socket would interleave with the parent's frames.
So ``os.register_at_fork`` counts the forks this process has been through, and an
object made in one generation refuses to act in another: its calls raise
``dlm.InertAfterFork``, and its ``__exit__``, ``close`` and finalizers do nothing.
"""

from __future__ import annotations

import os

from dlm.client.errors import InertAfterFork

_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


class Owner:
    """The process generation an object was made in."""

    __slots__ = ("_made_in",)

    def __init__(self) -> None:
        self._made_in = _generation

    @property
    def inert(self) -> bool:
        """True in a process forked after the object was made."""
        return self._made_in != _generation

    def check(self, what: str) -> None:
        """InertAfterFork when called in a forked child."""
        if self._made_in != _generation:
            raise InertAfterFork(
                f"{what} was made by the parent of this forked process and is inert here "
                "(it would release or renew the parent's locks): make a new dlm.Client "
                "in the child"
            )
