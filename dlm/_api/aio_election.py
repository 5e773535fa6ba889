"""``client.election(name)`` for async code (anyio): ``dlm.AsyncElection``,
``dlm.AsyncLeadership``.

Private (import the names from ``dlm``). As dlm/_api/election.py, on ``dlm.AsyncLock``:
a campaign is an acquire of the election's key with the value in its metadata, so an
``AsyncLeadership`` renews, cancels the body of ``async with election.campaign():``
when leadership is lost, and raises ``dlm.LockLost`` at its end, exactly as a lock
does.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from dlm._api import options as _options
from dlm._api.aio import AsyncLock
from dlm._api.election import (
    Leader,
    campaign_meta,
    campaign_wait,
    leader_from_state,
    leader_from_watch,
    not_leading,
)
from dlm._api.options import Duration

if TYPE_CHECKING:
    from dlm._api.aio import AsyncClient


class AsyncLeadership(AsyncLock):
    """This task leading an election (``AsyncElection.campaign``): a ``dlm.AsyncLock`` on
    the election's key, plus ``value``, ``proclaim(value)`` and ``resign()``."""

    def __init__(self, election: AsyncElection, value: str, **terms: Any) -> None:
        super().__init__(election._client, election.name, meta=campaign_meta(value), **terms)
        self._election = election
        self._value = value

    @property
    def name(self) -> str:
        """The election's name (its lock key)."""
        return self.key

    @property
    def value(self) -> str:
        """What this leader proclaims (the campaign's value, then each ``proclaim``'s)."""
        return self._value

    async def proclaim(self, value: str) -> None:
        """As ``dlm.Leadership.proclaim``: ``dlm.NotHolder`` unless this still leads."""
        meta = campaign_meta(value)
        self._owner.check("this dlm.AsyncLeadership")
        if not self._holding or self._lost.is_set():
            raise not_leading(self.name)
        inner = self._client._borrow()
        try:
            await inner.proclaim(self.lease, self.name, value)
        finally:
            await self._client._give_back(inner)
        self._value = value
        self._meta = {**self._meta, **meta}

    async def resign(self) -> None:
        """Gives up leading (the next candidate is elected at once); quiet if this no
        longer leads."""
        self._owner.check("this dlm.AsyncLeadership")
        if self._holding:
            await self.release()

    def _describe(self) -> str:
        return f"leadership of {self.key!r}"


class Campaign:
    """What ``AsyncElection.campaign`` returns: ``await`` it (inside ``async with
    client:``, whose task group renews) for an ``AsyncLeadership``, or ``async with``
    it to lead for the block's length: the block is cancelled if leadership is lost,
    and resigns at its end."""

    def __init__(self, election: AsyncElection, leading: AsyncLeadership) -> None:
        self._election = election
        self._leading = leading

    def __await__(self) -> Generator[Any, None, AsyncLeadership]:
        return self._elected().__await__()

    async def _elected(self) -> AsyncLeadership:
        self._election._starting(self._leading)
        if not await self._leading.acquire():
            raise AssertionError("a blocking acquire returned without the key")
        return self._leading

    async def __aenter__(self) -> AsyncLeadership:
        self._election._starting(self._leading)
        await self._leading.__aenter__()
        return self._leading

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._leading.__aexit__(exc_type, exc, tb)


class AsyncElection:
    """An election, made by ``AsyncClient.election(name)``: as ``dlm.Election``, with
    ``campaign`` awaited or used as ``async with``, and ``observe()`` an async
    iterator."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        (self._name,) = _options.keys(name)
        self._client = client
        self._leading: AsyncLeadership | None = None

    @property
    def name(self) -> str:
        """The election's name: the lock key it is held on."""
        return self._name

    def campaign(
        self,
        value: str = "",
        *,
        ttl: Duration = "30s",
        wait: Duration | None = None,
        lock_delay: Duration | None = None,
        on_lost: Callable[[AsyncLeadership], object] | Callable[[], object] | None = None,
        cancel_margin: Duration | None = None,
    ) -> Campaign:
        """As ``dlm.Election.campaign``: ``leading = await election.campaign(...)`` or
        ``async with election.campaign(...) as leading:`` (whose body is cancelled when
        leadership is lost, ``cancel_margin`` before its deadline at the latest)."""
        leading = AsyncLeadership(
            self,
            value,
            ttl=ttl,
            wait=campaign_wait(wait),
            lock_delay=lock_delay,
            on_lost=on_lost,
            cancel_margin=cancel_margin,
        )
        return Campaign(self, leading)

    def _starting(self, leading: AsyncLeadership) -> None:
        if self._leading is not None and self._leading._holding:
            raise RuntimeError(f"already leading {self._name!r}: resign first")
        self._leading = leading

    async def resign(self) -> None:
        """Gives up leading, if this AsyncElection's last campaign leads (else nothing)."""
        leading = self._leading
        if leading is not None:
            await leading.resign()

    async def proclaim(self, value: str) -> None:
        """As ``dlm.Election.proclaim``."""
        leading = self._leading
        if leading is None:
            raise not_leading(self._name)
        await leading.proclaim(value)

    async def leader(self) -> Leader | None:
        """Who leads now, or None while nobody does."""
        inner = self._client._borrow()
        try:
            return leader_from_state(self._name, await inner.get(self._name))
        finally:
            await self._client._give_back(inner)

    async def observe(self, *, timeout: Duration | None = None) -> AsyncGenerator[Leader | None]:
        """As ``dlm.Election.observe``, as an async iterator (``async for``)."""
        seconds = _options.optional_seconds(timeout, "timeout")
        self._client._owner.check("this dlm.AsyncClient")
        inner = self._client._base.spawn()
        try:
            async for seen in inner.observe(self._name, timeout=seconds):
                yield leader_from_watch(seen)
        finally:
            with anyio.CancelScope(shield=True):
                await inner.aclose()

    def __repr__(self) -> str:
        return f"<dlm.AsyncElection {self._name!r}>"
