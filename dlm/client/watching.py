"""A watch as the client follows it, across connections and members: every decision,
no IO (sync.py and aio.py drive it, as they drive core.py's flows).

A watch names a key or a prefix. The first member reached starts it "from now" (or
from the index the caller gives) and answers the index it starts after; each pushed
frame carries the changes of whole log entries in log order, so after a broken
connection, a cut-off or a member that stopped, ``WatchStream`` asks the next member
to resume after the last index it handed out: no change is lost or repeated while
the members still keep it (docs/PROTOCOL.md, "Watches"). Beyond that window the
member answers COMPACTED, which ends the iteration with ``WatchCompacted``: re-read,
then watch from now. Only a cluster that stays unreachable for the whole timeout
ends it with ``ClusterUnavailable`` (exit 69).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlm.client.errors import (
    BadRequest,
    ClusterUnavailable,
    DlmError,
    PermissionDenied,
)

if TYPE_CHECKING:
    from dlm.views import LockState

RETRY_PAUSE_S = (0.05, 0.2, 0.5, 1.0)
"""Pauses after each failed round over the members (the last one repeats)."""
EVENTS = ("granted", "released", "expired", "queued", "left_queue", "proclaimed")


class WatchCompacted(DlmError):
    """The members no longer keep the changes after the index a watch asked to resume
    from: read the key again, then watch from now."""

    exit_code = 69

    def __init__(self, message: str, floor: int | None = None) -> None:
        super().__init__("COMPACTED", message)
        self.floor = floor


class WatchBroken(Exception):
    """This connection's watch ended (cut off, member stopping): resume elsewhere."""


@dataclass(frozen=True, slots=True)
class Granted:
    lease: str
    token: int
    value: dict[str, str]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One key's change at one log index (dlm/node/watches.py says which kinds there are).
    ``token``: the grant the event is about (None for queued, left_queue); ``value``: the
    holder's metadata for granted and proclaimed; ``granted``: the grants the same entry
    made after a release or an expiry (the next waiter)."""

    key: str
    event: str
    index: int
    lease: str
    token: int | None
    value: dict[str, str] | None = None
    granted: tuple[Granted, ...] = ()
    at_ms: int = 0
    """When it happened: the stamp of its log entry (the leader's wall clock, ms)."""

    def to_json(self) -> dict[str, Any]:
        """`dlm watch --json`'s line: key, event, index, lease, token, and the new grant."""
        out: dict[str, Any] = {
            "key": self.key,
            "event": self.event,
            "index": self.index,
            "lease": self.lease,
            "token": self.token,
        }
        if self.granted:
            first = self.granted[0]
            out["granted"] = {"lease": first.lease, "token": first.token}
        return out


def _text(item: dict[Any, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise WatchBroken(f"a pushed change without a text {name!r}")
    return value


def _index(item: dict[Any, Any], name: str, *, optional: bool = False) -> int | None:
    value = item.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise WatchBroken(f"a pushed change without a valid {name!r}")
    return value


def _meta(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    return {str(k): str(v) for k, v in value.items()}


def parse_event(item: Any) -> WatchEvent:
    """One pushed change, checked (a member's bytes are untrusted too)."""
    if not isinstance(item, dict):
        raise WatchBroken("a pushed change is not a map")
    index = _index(item, "index")
    assert index is not None
    granted: list[Granted] = []
    for grant in item.get("granted") or ():
        if isinstance(grant, dict):
            token = _index(grant, "token")
            assert token is not None
            granted.append(Granted(_text(grant, "lease"), token, _meta(grant.get("value")) or {}))
    return WatchEvent(
        key=_text(item, "key"),
        event=_text(item, "event"),
        index=index,
        lease=_text(item, "lease"),
        token=_index(item, "token", optional=True),
        value=_meta(item.get("value")),
        granted=tuple(granted),
        at_ms=_index(item, "at_ms", optional=True) or 0,
    )


class WatchStream:
    """One watch's state across connections: what to ask a member, what its frames mean,
    and when to give up."""

    def __init__(
        self, key: str | None, prefix: str | None, after: int | None, timeout: float
    ) -> None:
        if (key is None) == (prefix is None):
            raise ValueError("watch a key or a prefix (exactly one of the two)")
        self.key = key
        self.prefix = prefix
        self.last = after
        """The last index handed out (or the one the watch started after)."""
        self.timeout = timeout
        self._down_since: float | None = None
        self._rounds = 0
        self._failures = 0
        self.member = ""
        """The member serving the watch now."""

    def request(self) -> dict[str, Any]:
        """The watch request for the next member (its id is the connection's to add)."""
        return {"t": "watch", "key": self.key, "prefix": self.prefix, "after": self.last}

    def started(self, reply: dict[Any, Any] | None, member: str) -> bool:
        """The member's answer to the watch request: True once it serves the watch; False
        to try another member; raises for what another member will not change."""
        if reply is None:
            return False
        if reply.get("t") == "ok":
            index = reply.get("index")
            if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
                if self.last is None:
                    self.last = index
                self.member = member
                self._down_since = None
                self._failures = 0
                return True
            return False
        code = str(reply.get("code", ""))
        message = str(reply.get("message", ""))
        if code == "COMPACTED":
            floor = reply.get("floor")
            raise WatchCompacted(message, floor if isinstance(floor, int) else None)
        if code == "PERMISSION_DENIED":
            raise PermissionDenied(message)
        if code == "BAD_REQUEST" and "unknown request type" in message:
            raise BadRequest(
                f"member {member} does not serve watches (it runs a dlm older than this "
                "client): upgrade it, or name a member that does with --members"
            )
        if code == "BAD_REQUEST":
            raise BadRequest(message)
        return False  # UNAVAILABLE, SHUTTING_DOWN, a cap: another member may serve it

    def take(self, frame: dict[Any, Any], watch_id: int) -> list[WatchEvent]:
        """The changes in a frame of this watch, never one at or below the last index
        handed out; WatchBroken when the member ended the watch (resume elsewhere)."""
        if frame.get("watch") != watch_id:
            return []
        kind = frame.get("t")
        if kind == "watch_end":
            code = str(frame.get("code", ""))
            message = str(frame.get("message", ""))
            if code == "COMPACTED":
                raise WatchCompacted(message)
            raise WatchBroken(message or "the member ended the watch")
        if kind != "watch":
            return []
        items = frame.get("events")
        if not isinstance(items, list):
            raise WatchBroken("a pushed frame without its changes")
        fresh: list[WatchEvent] = []
        for item in items:
            event = parse_event(item)
            if self.last is None or event.index > self.last:
                fresh.append(event)
        if fresh:
            # A frame holds whole log entries (the member never splits one), so resuming
            # after the last index of a frame loses nothing.
            self.last = max(self.last or 0, fresh[-1].index)
        return fresh

    def failed(self, now: float, members: int) -> float:
        """A member could not be reached or stopped serving the watch; returns how long to
        pause before the next try, or raises ClusterUnavailable once the cluster has
        been unreachable for ``timeout`` seconds."""
        if self._down_since is None:
            self._down_since = now
        down = now - self._down_since
        if down >= self.timeout:
            raise ClusterUnavailable(
                f"no member served the watch for {down:.1f}s (--timeout {self.timeout:g}s)"
                + (f"; the last index seen is {self.last}" if self.last is not None else "")
            )
        self._failures += 1
        if self._failures % max(1, members):
            return 0.0  # the next member at once; pause after a whole round
        self._rounds += 1
        pause = RETRY_PAUSE_S[min(self._rounds, len(RETRY_PAUSE_S)) - 1]
        return min(pause, max(0.0, self.timeout - down))


ELECTION_VALUE = "value"
"""The metadata entry that holds an election's value (the elected candidate's, `dlm elect
--value`); a holder without one leads with the value ""."""


def iso_ms(ms: int | None) -> str | None:
    """Milliseconds since the epoch as an RFC 3339 UTC time (None stays None)."""
    if ms is None:
        return None
    import datetime

    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Leadership:
    """Who leads election ``name`` (the holder of lock key ``name``) as of log ``index``:
    its lease, value and token (the leadership epoch), and since when (ms since the
    epoch); all None while nobody leads."""

    name: str
    lease: str | None
    value: str | None
    token: int | None
    since_ms: int | None
    index: int

    def to_json(self) -> dict[str, Any]:
        """`dlm observe --json`'s line."""
        return {
            "name": self.name,
            "value": self.value,
            "token": self.token,
            "since": iso_ms(self.since_ms),
            "index": self.index,
        }


class Observer:
    """An election's leader followed through the watch of its key: ``start`` from a read,
    then ``change`` for each pushed change, which says a new Leadership when the leader,
    its token or its value changed (None otherwise: a queued candidate, say)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.now: Leadership | None = None

    def start(
        self,
        lease: str | None,
        token: int | None,
        meta: dict[str, str],
        since_ms: int | None,
        index: int,
    ) -> Leadership:
        value = meta.get(ELECTION_VALUE, "") if lease is not None else None
        self.now = Leadership(self.name, lease, value, token, since_ms, index)
        return self.now

    def change(self, event: WatchEvent) -> Leadership | None:
        now = self.now
        if now is not None and now.token is not None and event.index <= now.token:
            return None  # the read that started us already showed it
        if event.event in ("granted", "proclaimed"):
            lease, token, meta, since = event.lease, event.token, event.value or {}, event.at_ms
            if event.event == "proclaimed" and now is not None and now.token == token:
                since = now.since_ms or event.at_ms
        elif event.event in ("released", "expired"):
            if now is not None and now.token is not None and event.token != now.token:
                return None  # another holder of a semaphore key: not the leader
            if event.granted:
                grant = event.granted[0]
                lease, token, meta, since = grant.lease, grant.token, grant.value, event.at_ms
            else:
                lease, token, meta, since = None, None, {}, None
        else:
            return None
        if event.event == "granted" and now is not None and now.lease is not None:
            return None  # a second holder of a semaphore key: the first still leads
        value = meta.get(ELECTION_VALUE, "") if lease is not None else None
        if now is not None and (now.lease, now.token, now.value) == (lease, token, value):
            return None
        self.now = Leadership(self.name, lease, value, token, since, event.index)
        return self.now


def leader_of(state: LockState) -> tuple[str | None, int | None, dict[str, str], int | None]:
    """(lease, token, metadata, granted at) of a lock's first holder; Nones if none."""
    if not state.holders:
        return None, None, {}, None
    holder = state.holders[0]
    return holder.lease, holder.token, dict(holder.meta), holder.granted_at_ms
