"""`dlm runs`: the run ledger as people and monitoring scripts read it.

``dlm runs KEY`` lists the key's recent runs, newest first; ``dlm runs --all`` the last
run of every key. ``--check --max-age D [--success]`` is the dead-man's switch: exit 0
when a (successful) run of KEY ended within D, else exit 1 with one line saying what is
missing. Times are the leaders' wall clocks, shown as RFC 3339 UTC strings with
milliseconds (``2026-11-27T03:00:00.123Z``) in every format.
"""

from __future__ import annotations

import time
from typing import Any

from dlm.cli import exits
from dlm.cli.exits import usage_error
from dlm.cli.output import JSON, TSV, emit_json, emit_tsv, escape, print_table, say
from dlm.cli.settings import Settings

FIELDS = (
    "host",
    "user",
    "command",
    "start",
    "end",
    "duration_ms",
    "exit_code",
    "signal",
    "token",
    "outcome",
    "skips",
)
"""A run's fields in `dlm runs --json`, in this order (`--all` puts ``key`` first)."""


def rfc3339(ms: int | None) -> str | None:
    """Epoch milliseconds as an RFC 3339 UTC time with milliseconds (None stays None)."""
    if ms is None:
        return None
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def run_view(row: dict[str, Any], *, with_key: bool) -> dict[str, Any]:
    """One run of the cluster's answer as `dlm runs --json` prints it."""
    start, end = row.get("start_ms"), row.get("end_ms")
    view: dict[str, Any] = {"key": row.get("key")} if with_key else {}
    view.update(
        host=row.get("host"),
        user=row.get("user"),
        command=row.get("command"),
        start=rfc3339(start if isinstance(start, int) else None),
        end=rfc3339(end if isinstance(end, int) else None),
        duration_ms=(end - start) if isinstance(start, int) and isinstance(end, int) else None,
        exit_code=row.get("exit_code"),
        signal=row.get("signal"),
        token=row.get("token"),
        outcome=row.get("outcome"),
        skips=row.get("skips"),
    )
    return view


def check_age(text: str | None) -> float:
    from dlm.cli.ops import duration_option

    if text is None:
        raise usage_error("--check needs --max-age DURATION (e.g. --max-age 25h)")
    age = duration_option("--max-age", text)
    if age <= 0:
        raise usage_error(f"bad --max-age {text!r}: give a duration above zero, e.g. 25h")
    return age


def show(
    settings: Settings,
    key: str | None,
    *,
    every: bool,
    output_format: str,
    check: bool,
    max_age: str | None,
    success: bool,
) -> int:
    if every == (key is not None):
        raise usage_error("give a KEY, or --all for the last run of every key")
    if check and every:
        raise usage_error("--check looks at one KEY: dlm runs KEY --check --max-age 25h")
    if (max_age is not None or success) and not check:
        raise usage_error("--max-age and --success go with --check")
    age_s = check_age(max_age) if check else 0.0
    client = settings.connect()
    try:
        rows = client.runs(key)
    finally:
        client.close()
    views = [run_view(r, with_key=every) for r in rows]
    if check:
        assert key is not None and max_age is not None
        return _check(settings, key, rows=rows, age_s=age_s, max_age=max_age, success=success)
    if output_format == JSON:
        emit_json({"runs": views} if every else {"key": key, "runs": views})
        return exits.OK
    header = (("key",) if every else ()) + FIELDS
    if output_format == TSV:
        emit_tsv(header, ([_cell(v[h]) for h in header] for v in views))
        return exits.OK
    if not views:
        say(f"no runs of {escape(key)!r} recorded" if key else "no runs recorded")
        return exits.OK
    headings = (("KEY",) if every else ()) + (
        "START",
        "END",
        "DURATION",
        "HOST",
        "USER",
        "OUTCOME",
        "EXIT",
        "TOKEN",
        "SKIPS",
        "COMMAND",
    )
    print_table(
        headings,
        (
            ([v["key"]] if every else [])
            + [
                _cell(v["start"]),
                _cell(v["end"]),
                _duration(v["duration_ms"]),
                _cell(v["host"]),
                _cell(v["user"]),
                _cell(v["outcome"]),
                _exit(v),
                _cell(v["token"]),
                _cell(v["skips"]),
                _cell(v["command"]),
            ]
            for v in views
        ),
        squeeze="COMMAND",
        right=("DURATION", "EXIT", "TOKEN", "SKIPS"),
    )
    return exits.OK


def _check(
    settings: Settings,
    key: str,
    *,
    rows: list[dict[str, Any]],
    age_s: float,
    max_age: str,
    success: bool,
) -> int:
    """The dead-man's switch: a (successful) run of KEY ended within the age?"""
    since_ms = int((time.time() - age_s) * 1000)
    ended = [r for r in rows if isinstance(r.get("end_ms"), int)]
    wanted = [r for r in ended if not success or _succeeded(r)]
    recent = [r for r in wanted if r["end_ms"] >= since_ms]
    what = "successful run" if success else "run"
    if recent:
        last = recent[0]
        line = (
            f"ok: the last {what} of {key!r} ended at {rfc3339(last['end_ms'])} "
            f"on {last.get('host') or '?'}"
        )
        code = exits.OK
    else:
        before = (
            f"; the last one ended at {rfc3339(wanted[0]['end_ms'])}"
            if wanted
            else f"; none is recorded ({len(rows)} run(s) kept)"
        )
        line = f"missing: no {what} of {key!r} ended in the last {max_age}{before}"
        code = exits.CHECK_FAILED
    if settings.json:
        emit_json({"key": key, "ok": code == exits.OK, "message": line})
    else:
        say(line)
    return code


def _succeeded(row: dict[str, Any]) -> bool:
    return row.get("outcome") == "finished" and row.get("exit_code") == 0


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _exit(view: dict[str, Any]) -> str:
    if view["signal"] is not None:
        return f"sig {view['signal']}"
    return _cell(view["exit_code"])


def _duration(ms: object) -> str:
    from dlm.durations import format_ms

    return format_ms(ms) if isinstance(ms, int) else "-"
