"""What a lock object knows of what it holds, shared by ``dlm.Lock`` and ``dlm.AsyncLock``.

Private. The terms a lock was asked with (keys, TTL, wait, limit, metadata,
minimum hold), and of its current (or last) acquisition: the lease, the fencing
tokens, the keeper whose deadline says until when the lock is certainly this
process's, and whether and why it was lost. No IO here: the two lock classes
take and give back; this only reads what they recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dlm.client.clock import lease_clock
from dlm.client.errors import LockLost


def _takes_no_argument(callback: Callable[..., object]) -> bool:
    import inspect

    try:
        parameters = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: give it the lock
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return not any(
        p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters
    )


class _Keeper(Protocol):
    @property
    def deadline(self) -> float: ...


class HeldState:
    """The terms and the current acquisition of one lock object."""

    _keeper: _Keeper | None
    _lost: Any  # threading.Event or anyio.Event: each lock class makes its own

    def __init__(
        self,
        keys: tuple[str, ...],
        *,
        ttl_ms: int | None,
        wait_s: float | None,
        limit: int,
        meta: dict[str, str],
        min_hold_s: float | None,
        on_lost: Callable[..., object] | None,
        lock_delay_ms: int = 0,
        traceparent: str | None = None,
    ) -> None:
        self._keys = keys
        self._traceparent = traceparent
        """The trace context the lock was made with (issue 30; None: TRACEPARENT, if set)."""
        self._ttl_ms = ttl_ms
        self._wait_s = wait_s
        self._limit = limit
        self._meta = meta
        self._min_hold_s = min_hold_s
        self._on_lost = on_lost
        self._lock_delay_ms = lock_delay_ms
        self._lease: str | None = None
        self._tokens: dict[str, int] = {}
        self._keeper = None
        self._holding = False
        self._granted_at = 0.0
        self._lost_reason: str | None = None

    def _trace_span(self, traceparent: str | None) -> Any:
        """The span of one acquisition (dlm/tracing.py): child of ``traceparent``, else of
        the lock's, else of TRACEPARENT; its ``traceparent`` is what the requests carry."""
        from dlm import tracing

        parent = traceparent or self._traceparent
        if tracing.configured():
            # A program goes on after its lock: its spans leave in batches, off its thread.
            tracing.enabled("dlm", batch=True)
        return tracing.CommandSpan("dlm.acquire", parent, from_env=parent is None, flush=False)

    # -- what was asked ----------------------------------------------------------

    @property
    def key(self) -> str:
        """The lock's key (the first one, for a lock on several keys)."""
        return self._keys[0]

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key this lock takes, under one lease, in the order given."""
        return self._keys

    @property
    def limit(self) -> int:
        """How many may hold each key at once: 1 for a lock, N for a semaphore."""
        return self._limit

    @property
    def meta(self) -> Mapping[str, str]:
        """What the holder records with each grant (`dlm status KEY` shows it): host,
        user, pid, and the ``meta`` given."""
        return dict(self._meta)

    # -- what was granted ----------------------------------------------------------

    @property
    def token(self) -> int:
        """The fencing token of ``key`` in the current (or last) acquisition: it rises
        with every grant of the key. Hand it to the store you write to, and have the
        store refuse a token lower than the highest it has seen."""
        if not self._tokens:
            raise RuntimeError("no token yet: the lock was never acquired")
        return self._tokens[self._keys[0]]

    @property
    def tokens(self) -> Mapping[str, int]:
        """The fencing token of each key, for a lock on several keys."""
        return dict(self._tokens)

    @property
    def lease(self) -> str:
        """The id of the lease that holds the keys (`dlm lease revoke` takes it)."""
        if self._lease is None:
            raise RuntimeError("no lease yet: the lock was never acquired")
        return self._lease

    @property
    def deadline(self) -> float:
        """Until when (on ``dlm.now()``'s clock) the lock is certainly this process's: the
        cluster gives it to no one else before. Moves later with each renewal that counts,
        earlier when ``extend(ttl=...)`` shortens the TTL. 0.0 if never acquired."""
        keeper = self._keeper
        return keeper.deadline if keeper is not None else 0.0

    @property
    def lost_reason(self) -> str | None:
        """Why the lock was lost (None while it was not)."""
        return self._lost_reason

    def time_left(self) -> float:
        """Seconds until ``deadline`` (0.0 when the lock is not owned)."""
        if not self.owned():
            return 0.0
        return max(0.0, self.deadline - lease_clock())

    def owned(self) -> bool:
        """Whether this object holds the lock now: acquired, not released, not lost, and
        its deadline not passed."""
        return self._holding and not self._lost.is_set() and lease_clock() < self.deadline

    def check(self) -> None:
        """Raises ``dlm.LockLost`` unless the lock is owned now (call it before each step
        that relies on the lock)."""
        if self.owned():
            return
        if not self._holding and self._lost_reason is None:
            raise LockLost(f"{self._describe()} is not held (never acquired, or released)")
        raise LockLost(self._lost_message())

    def _call_on_lost(self) -> None:
        """Calls ``on_lost`` with this lock, or with nothing if it takes no argument."""
        callback = self._on_lost
        if callback is None:
            return
        if _takes_no_argument(callback):
            callback()
        else:
            callback(self)

    def _lost_message(self) -> str:
        reason = self._lost_reason or "its deadline passed before a renewal was confirmed"
        return f"{self._describe()} was lost: {reason}"

    def _describe(self) -> str:
        what = "semaphore" if self._limit > 1 else "lock"
        if len(self._keys) == 1:
            return f"{what} {self._keys[0]!r}"
        return f"{what} on {', '.join(repr(k) for k in self._keys)}"

    def __repr__(self) -> str:
        state = "owned" if self.owned() else ("lost" if self._lost_reason else "not held")
        token = f", token={self._tokens[self._keys[0]]}" if self._tokens else ""
        return f"<{type(self).__name__} {self._describe()} {state}{token}>"
