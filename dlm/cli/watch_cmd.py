"""`dlm watch`, `dlm observe` and `dlm status KEY --watch`: changes pushed by the cluster
(dlm/client/watching.py follows the watch across members), printed as they come.

Each runs until Ctrl-C (exit 0) and exits 69 only when no member served the watch for
--timeout. When the members no longer keep the changes after the last index seen
(COMPACTED), a line on stderr says so and the watch starts again from now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlm.cli.exits import OK, usage_error
from dlm.cli.output import JSON, complain, emit_json, say

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from dlm.cli.settings import Settings
    from dlm.client.sync import Client
    from dlm.client.watching import Leadership, WatchEvent


def _time(ms: int | None) -> str:
    from dlm.client.watching import iso_ms

    return iso_ms(ms) or "-"


def event_line(event: WatchEvent) -> str:
    """A change as people read it: when, key, what, which lease and grant, log index."""
    token = f" token {event.token}" if event.token is not None else ""
    line = f"{_time(event.at_ms)}  {event.key}  {event.event}  lease {event.lease}{token}"
    for grant in event.granted:
        line += f"; granted to lease {grant.lease} token {grant.token}"
    value = (event.value or {}).get("value")
    if event.event in ("granted", "proclaimed") and value is not None:
        line += f" value {value!r}"
    return f"{line}  (index {event.index})"


def leader_line(said: Leadership) -> str:
    if said.lease is None:
        return f"{said.name}: nobody leads  (index {said.index})"
    return (
        f"{said.name}: {said.value!r} leads (lease {said.lease}, token {said.token}, "
        f"since {_time(said.since_ms)})  (index {said.index})"
    )


def _follow(
    settings: Settings, start: Callable[[Client], Iterator[Any]], show: Callable[[Any], None]
) -> int:
    """Runs ``start``'s iterator until Ctrl-C, starting again from now after COMPACTED."""
    from dlm.client.watching import WatchCompacted

    client = settings.connect()
    try:
        while True:
            try:
                for item in start(client):
                    show(item)
            except WatchCompacted as exc:
                complain(f"watch: {exc.message}; some changes were missed, watching from now")
    except KeyboardInterrupt:
        return OK
    finally:
        client.close()


def watch(settings: Settings, key: str | None, prefix: str | None, after: int | None) -> int:
    """`dlm watch KEY | --prefix P [--after INDEX]`."""
    from dlm.cli.ops import check_key

    if (key is None) == (prefix is None):
        raise usage_error("name a KEY or --prefix P (one of the two)")
    if key is not None:
        check_key(key)
    as_json = settings.json
    starts = [after]

    def start(client: Client) -> Iterator[WatchEvent]:
        # The first start is after --after (or now); a start after COMPACTED is from now
        # (the client resumes after the last index by itself otherwise).
        first = starts.pop() if starts else None
        return client.watch(key, prefix=prefix, after=first, timeout=settings.timeout)

    def show(event: WatchEvent) -> None:
        if as_json:
            emit_json(event.to_json())
        else:
            say(event_line(event))

    return _follow(settings, start, show)


def observe(settings: Settings, name: str) -> int:
    """`dlm observe NAME`."""
    from dlm.cli.ops import check_key

    check_key(name, "NAME")
    as_json = settings.json

    def show(said: Leadership) -> None:
        if as_json:
            emit_json(said.to_json())
        else:
            say(leader_line(said))

    return _follow(settings, lambda client: client.observe(name, timeout=settings.timeout), show)


def key_watch(settings: Settings, key: str, output_format: str) -> int:
    """`dlm status KEY --watch`: the lock as `dlm status KEY` shows it once the watch runs
    (so no change falls between the two), then again after each change the cluster
    pushes (no polling)."""
    from dlm.cli import status_view
    from dlm.client.watching import WatchCompacted, WatchStream

    client = settings.connect()
    try:
        while True:
            shown = False
            try:
                for item in client._watch(WatchStream(key, None, None, settings.timeout)):
                    if item is not None and output_format != JSON:
                        say("")
                        say(f"-- {event_line(item)}")
                    if item is not None or not shown:
                        status_view.key_status(settings, key, output_format)
                        shown = True
            except WatchCompacted as exc:
                complain(f"watch: {exc.message}; some changes were missed, watching from now")
    except KeyboardInterrupt:
        return OK
    finally:
        client.close()
