"""The lease and lock subcommands: acquire, renew, release, lease revoke, and store inspect.

Each is one or two calls into the blocking client (dlm.client.sync) plus the
printing; the client already words its errors, so they pass through with
their exit codes (exits.from_client_error, applied in main).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from dlm import limits
from dlm.cli.exits import CHECK_FAILED, LOST, CliError, Interrupted, from_client_error, usage_error
from dlm.cli.output import emit_json, escape, say
from dlm.cli.settings import Settings
from dlm.durations import DurationError, format_ms, parse_duration, parse_duration_ms

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType
    from typing import Any

    from dlm.client.errors import LockHeld, NotHolder
    from dlm.client.sync import Client

FORMATS = ("text", "env", "json")
MAX_META_VALUE = limits.META_VALUE_MAX_CHARS
MAX_SHOWN_CMD = 60
MAX_SHOWN_HOLDERS = 3


# ---------------------------------------------------------------------------
# Argument helpers shared with exec
# ---------------------------------------------------------------------------


def duration_option(option: str, text: str, *, allow_zero: bool = True) -> float:
    """Seconds, or a usage error naming the option."""
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise usage_error(f"bad {option}: {exc}") from None
    if not allow_zero and seconds <= 0:
        raise usage_error(f"{option} must be more than 0")
    return seconds


def _check(option: str, problem: str | None) -> None:
    """A value the cluster would refuse is refused here, before connecting, naming the option."""
    if problem is not None:
        raise usage_error(f"bad {option}: {problem}")


def ttl_option(text: str | None) -> int | None:
    """``--ttl`` as milliseconds; None when not given: the lease then gets the cluster's
    default-ttl, and the TTL is known once the lease is open (LeaseOpened names it)."""
    if text is None:
        return None
    try:
        ttl_ms = parse_duration_ms(text)
    except DurationError as exc:
        raise usage_error(f"bad --ttl: {exc}") from None
    _check("--ttl", limits.check_ttl_ms(ttl_ms, text))
    return ttl_ms


def lock_delay_option(text: str | None) -> int:
    """``--lock-delay``: 0 (the default) up to 60 s, as milliseconds."""
    if text is None:
        return 0
    try:
        delay_ms = parse_duration_ms(text)
    except DurationError as exc:
        raise usage_error(f"bad --lock-delay: {exc}") from None
    _check("--lock-delay", limits.check_lock_delay_ms(delay_ms, text))
    return delay_ms


def check_key(key: str, option: str = "KEY") -> None:
    _check(option, limits.check_key(key))


def check_lease(lease: str | None, option: str = "--lease") -> None:
    if lease is not None:
        _check(option, limits.check_lease_id(lease))


def check_limit(limit: int) -> None:
    _check("--limit", limits.check_limit(limit))


def check_lock_options(key: str, limit: int, key_option: str = "KEY") -> None:
    """What acquire and exec ask the cluster for, checked before they connect."""
    check_key(key, key_option)
    check_limit(limit)


def wait_option(text: str | None) -> float | None:
    return None if text is None else duration_option("--wait", text)


def parse_meta(pairs: Sequence[str]) -> dict[str, str]:
    meta: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise usage_error(f"bad --meta '{escape(pair)}': write it as KEY=VALUE")
        meta[name.strip()] = value
    return meta


def _user() -> str:
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


HOST_ENV = "DLM_HOST"
"""The host name `dlm acquire` and `dlm exec` record (default: the machine's node name)."""


def owner_meta(*, pid: int, command: Sequence[str] | None = None) -> dict[str, str]:
    """Who took the lock, for `dlm status KEY`: host, user, pid and (for exec) the command."""
    # uname's node name is what gethostname() returns, without importing socket (~2 ms).
    # DLM_HOST names the host instead (a container's random hostname, a test's fake hosts).
    host = os.environ.get(HOST_ENV) or os.uname().nodename
    meta = {"host": host[:MAX_META_VALUE], "user": _user(), "pid": str(pid)}
    if command:
        meta["cmd"] = " ".join(command)[:MAX_META_VALUE]
    return meta


class signals_interrupt:
    """Turns these signals into Interrupted while in effect (``with``), so cleanup runs
    as it does for Ctrl-C. A class, not @contextmanager: contextlib costs ~0.5 ms a run."""

    def __init__(self, signums: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> None:
        self._signums = signums
        self._previous: dict[int, Any] = {}

    @staticmethod
    def _handler(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    def __enter__(self) -> None:
        for s in self._signums:
            if signal.getsignal(s) != signal.SIG_IGN:
                self._previous[s] = signal.signal(s, self._handler)

    def __exit__(self, *_exc: object) -> None:
        for s, old in self._previous.items():
            signal.signal(s, old)
        self._previous.clear()


# ---------------------------------------------------------------------------
# Who holds a lock, as a person would say it
# ---------------------------------------------------------------------------


def _printable(text: object, limit: int = MAX_META_VALUE) -> str:
    """Owner metadata is whatever a client sent: no control characters reach a terminal."""
    shown = "".join(c if c.isprintable() else "?" for c in str(text))
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def describe_holder(holder: dict[str, Any]) -> str:
    """``deploy@web-3 (pid 4121, backup.sh --full) for 2m13s``, from a holder's ``meta`` and
    ``held_ms``; ``lease ID (token N)`` when it recorded no owner."""
    raw_meta = holder.get("meta")
    meta = raw_meta if isinstance(raw_meta, dict) else {}
    user, host = meta.get("user"), meta.get("host")
    if user and host:
        who = f"{_printable(user)}@{_printable(host)}"
    elif user or host:
        who = _printable(user or host)
    else:
        who = f"lease {_printable(holder.get('lease', '?'))} (token {holder.get('token', '?')})"
    finished = _int_field(holder, "finished_at_ms") is not None
    details = []
    # The pid of a command that has finished names a process that is gone (or another one).
    if meta.get("pid") and not finished:
        details.append(f"pid {_printable(meta['pid'])}")
    if meta.get("cmd"):
        details.append(_printable(meta["cmd"], MAX_SHOWN_CMD))
    if details and (user or host):
        who += f" ({', '.join(details)})"
    if finished:
        # A `dlm exec --min-hold` whose command ended: the lease keeps the lock to the end.
        until = _int_field(holder, "hold_until_ms")
        if until is None:
            return f"{who}: the command finished; held until its lease expires"
        from dlm.cli.output import iso_local

        return f"{who}: the command finished; held until {iso_local(until)}"
    held = _int_field(holder, "held_ms")
    if held is not None:
        who += f" for {format_ms(held)}"
    return who


def _int_field(holder: dict[str, Any], name: str) -> int | None:
    value = holder.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def people_holders(holders: Sequence[dict[str, Any]]) -> str:
    """``held by A``, ``held by A, B and 2 more``, or ``held by someone else``."""
    if not holders:
        return "held by someone else"
    shown = ", ".join(describe_holder(h) for h in holders[:MAX_SHOWN_HOLDERS])
    more = len(holders) - MAX_SHOWN_HOLDERS
    return f"held by {shown}" + (f" and {more} more" if more > 0 else "")


def conflict_error(
    exc: LockHeld,
    key: str,
    *,
    waited: float | None,
    client: Client | None,
    next_step: str,
) -> CliError:
    """The one line (and JSON error) for a lock someone else holds.

    ``waited``: the --wait that ran out, if any; that error names no holder, so
    ``client`` (when given) asks who holds it now. ``next_step`` ends the line.
    """
    holders = exc.holders
    until = exc.quarantined_until_ms
    if until is not None and not waited:
        from dlm.client.core import quarantined_until

        error = from_client_error(exc)
        error.details["quarantined_until_ms"] = until
        error.message = (
            f"{key!r} is {quarantined_until(until)}: the cluster was restored or recovered and "
            f"grants no lock before then{next_step}"
        )
        return error
    if not holders and client is not None:
        holders = _holders_now(client, key)
    error = from_client_error(exc)
    if holders:
        error.details["holders"] = holders
    if waited:
        error.message = (
            f"{key!r} is still {people_holders(holders)} after waiting "
            f"{format_ms(waited * 1000)}{next_step}"
        )
    else:
        error.message = f"{key!r} is {people_holders(holders)}{next_step}"
    return error


def _close_quietly(client: Client, lease: str) -> None:
    """Best effort: the lease would expire on its own anyway."""
    try:
        client.close_lease(lease)
    except Exception:
        pass


# ---------------------------------------------------------------------------
# acquire
# ---------------------------------------------------------------------------


def acquire(
    settings: Settings,
    *,
    key: str,
    ttl: str | None,
    wait: str | None,
    lease: str | None,
    limit: int,
    meta_pairs: Sequence[str],
    output_format: str,
    lock_delay: str | None = None,
    also: Sequence[str] = (),
) -> None:
    """``also``: more keys to take with ``key`` under the same lease (all or none, in
    the one global order); the output then gives every key's token."""
    if output_format not in FORMATS:
        raise usage_error(f"bad --format '{escape(output_format)}': use text, env or json")
    keys = list(dict.fromkeys([key, *also]))
    for each in keys:
        check_lock_options(each, limit)
    check_lease(lease)
    ttl_ms = ttl_option(ttl)
    delay_ms = lock_delay_option(lock_delay)
    if delay_ms and lease is not None:
        raise usage_error(
            "--lock-delay is set on the lease dlm acquire opens; with --lease, open that "
            "lease with it instead"
        )
    wait_s = wait_option(wait)
    meta = owner_meta(pid=os.getppid())
    meta.update(parse_meta(meta_pairs))
    _check("--meta", limits.check_meta(meta))

    from dlm.client.errors import LockHeld

    client = settings.connect(traced_as="dlm.acquire")
    try:
        try:
            grants = _take(
                client,
                keys,
                ttl_ms=ttl_ms,
                wait_s=wait_s,
                lease=lease,
                limit=limit,
                meta=meta,
                lock_delay_ms=delay_ms,
            )
        except LockHeld as exc:
            next_step = (
                ": try again later, or wait longer (--wait)"
                if wait_s
                else ": try again later, or wait for it (--wait)"
            )
            raise conflict_error(
                exc, exc.key or key, waited=wait_s, client=client, next_step=next_step
            ) from None
    finally:
        client.close()

    grant = grants[0]
    result: dict[str, Any] = {
        "key": grant.key,
        "token": grant.token,
        "lease": grant.lease,
        "ttl_ms": grant.ttl_ms,
    }
    if len(grants) > 1:
        result["tokens"] = {g.key: g.token for g in grants}
    if settings.json or output_format == "json":
        emit_json(result)
    elif output_format == "env":
        say(format_env(result))
    else:
        for each in grants:
            say(
                f"acquired {escape(each.key)}: token {each.token}, lease {escape(each.lease)}, "
                f"ttl {format_ms(each.ttl_ms)}"
            )


def _take(
    client: Client,
    keys: Sequence[str],
    *,
    ttl_ms: int | None,
    wait_s: float | None,
    lease: str | None,
    limit: int,
    meta: dict[str, str],
    lock_delay_ms: int = 0,
) -> Any:
    """Opens a lease unless one is named, and takes the locks under it (several: all or
    none, in the one global order); the Grants, in the order of ``keys``."""
    key = keys[0]
    from dlm.client.errors import ClusterUnavailable
    from dlm.client.sync import KeepAlive

    with signals_interrupt():
        created = None
        ref: Any = lease
        if lease is None:
            # Ephemeral: the release of its one lock ends it, so a finished job leaves no
            # lease behind for a stray keep-alive to hold on to. Its owner shows in
            # `dlm lease list`.
            created = client.open_lease(
                ttl_ms, ephemeral=True, meta=meta, lock_delay_ms=lock_delay_ms, near=keys
            )
            ref = created
        # Queued longer than a TTL, the lease must be renewed meanwhile.
        # A lease lost while queued closes the client, which ends the wait at once.
        keeper = (
            KeepAlive(client, created, on_lost=lambda _reason: client.close())
            if created is not None and wait_s
            else None
        )
        try:
            if keeper is not None:
                keeper.start()
            if len(keys) == 1:
                grants = [client.acquire(ref, key, wait=wait_s, limit=limit, meta=meta)]
            else:
                taken = client.acquire_all(ref, keys, wait=wait_s, limit=limit, meta=meta)
                by_key = {g.key: g for g in taken}
                grants = [by_key[k] for k in keys]
        except ClusterUnavailable as exc:
            if exc.code == "CLOSED" and keeper is not None and keeper.lost.wait(2.0):
                raise CliError(
                    "SESSION_EXPIRED",
                    f"lease lost while waiting for '{escape(key)}': {keeper.reason}; "
                    "check the cluster with `dlm status`, then try again",
                    LOST,
                ) from None
            raise  # closing would wait out --timeout a second time
        except BaseException:
            if created is not None:
                _close_quietly(client, created.id)
            raise
        finally:
            if keeper is not None:
                keeper.stop()
    return grants


def format_env(result: dict[str, Any]) -> str:
    """NAME=value lines, quoted for the shell, for `eval "$(dlm acquire ... --format env)"`
    (several keys: DLM_FENCING_TOKENS too, every key's token as a JSON object)."""
    import shlex

    lines = [
        f"DLM_LOCK_KEY={shlex.quote(str(result['key']))}",
        f"DLM_FENCING_TOKEN={int(result['token'])}",
        f"DLM_LEASE_ID={shlex.quote(str(result['lease']))}",
    ]
    if "tokens" in result:
        import json

        tokens = json.dumps(result["tokens"], separators=(",", ":"))
        lines.append(f"DLM_FENCING_TOKENS={shlex.quote(tokens)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# renew
# ---------------------------------------------------------------------------


def renew(settings: Settings, lease: str, keep_alive: bool) -> None:
    check_lease(lease, "LEASE")
    client = settings.connect(traced_as="dlm.renew")
    try:
        if keep_alive:
            renewals, ttl_ms = _keep_alive(client, lease, announce=not settings.json)
            if settings.json:
                emit_json({"lease": lease, "ttl_ms": ttl_ms, "renewals": renewals})
            return
        ttl_ms = client.keepalive(lease)
    finally:
        client.close()
    if settings.json:
        emit_json({"lease": lease, "ttl_ms": ttl_ms})
    else:
        say(f"renewed lease {lease}: ttl {format_ms(ttl_ms)}")


def _keep_alive(client: Client, lease: str, *, announce: bool) -> tuple[int, int]:
    """Renews until a terminating signal (returns) or until the lease is lost (raises, 77).

    ``announce`` prints one line once the first renewal is confirmed, so a script
    (or a test) can tell the keep-alive is really running.
    """
    from dlm.client.clock import lease_clock
    from dlm.client.sync import KeepAlive

    sent = lease_clock()
    ttl_ms = client.keepalive(lease)
    if announce:
        say(
            f"renewed lease {lease}: ttl {format_ms(ttl_ms)}; renewing every "
            f"{format_ms(ttl_ms // 3)} until stopped"
        )
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    keeper = KeepAlive(
        client, lease, confirmed_at=sent, ttl_ms=ttl_ms, on_lost=lambda _: stop.set()
    )
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {
        s: signal.signal(s, on_signal) for s in watched if signal.getsignal(s) != signal.SIG_IGN
    }
    try:
        keeper.start()
        # Event.wait is interruptible by signals in the main thread; the timeout bounds
        # each wait so a lost wake-up could never hang us.
        while not stop.wait(1.0):
            pass
    finally:
        keeper.stop()
        for s, old in previous.items():
            signal.signal(s, old)
    if keeper.lost.is_set():
        raise CliError(
            "SESSION_EXPIRED",
            f"lease lost: {keeper.reason}; its locks are gone: take them again (dlm acquire)",
            LOST,
            lease=lease,
        )
    return keeper.renewals + 1, keeper.ttl_ms


# ---------------------------------------------------------------------------
# release
# ---------------------------------------------------------------------------


def release(
    settings: Settings,
    key: str,
    lease: str,
    *,
    token: int | None = None,
    keep_lease: bool = False,
) -> None:
    """Gives KEY back (only the grant ``token`` names, if given). A lease opened by
    `dlm acquire` ends with it when it is left holding and waiting for nothing, unless
    ``keep_lease``."""
    from dlm.client.errors import LeaseLost, NotHolder

    check_key(key)
    check_lease(lease)
    if token is not None and token > limits.INT_MAX:
        raise usage_error(f"bad --token: a fencing token is at most {limits.INT_MAX}")
    client = settings.connect(traced_as="dlm.release")
    try:
        try:
            released = client.release(lease, key, token=token, keep_lease=keep_lease)
        except LeaseLost as exc:
            holders = _holders_now(client, key)
            raise CliError(
                "SESSION_EXPIRED",
                f"{exc.message}; '{escape(key)}' is {describe_holders(holders)}",
                LOST,
                holders=holders,
            ) from None
        except NotHolder as exc:
            raise _not_holder(exc, key, lease, token) from None
    finally:
        client.close()
    if settings.json:
        emit_json(
            {
                "key": key,
                "lease": lease,
                "released": True,
                "token": released.token,
                "lease_ended": released.lease_ended,
            }
        )
        return
    if released.held:
        line = f"released {escape(key)} (lease {lease}, token {released.token})"
    else:
        line = f"left the queue for {escape(key)} (lease {lease})"
    if released.lease_ended:
        line += f"; lease {lease} ended with it, as it held nothing else"
    say(line)


def _not_holder(exc: NotHolder, key: str, lease: str, token: int | None) -> CliError:
    """The refusal, worded for the case --token exists for: a newer grant under the lease."""
    error = from_client_error(exc)
    ours = [h for h in exc.holders if h.get("lease") == lease]
    if token is not None and ours:
        error.message = (
            f"lease {lease} now holds '{escape(key)}' under another grant (token "
            f"{escape(ours[0].get('token', '?'))}), not token {token}: nothing was released"
        )
    return error


def _how_it_ended(ended: str | None) -> str:
    """Why a lease to revoke is not there, as far as the cluster's tombstones tell."""
    if ended == "expired":
        return "it has expired"
    if ended == "closed":
        return "it was closed already: released or revoked"
    if ended == "unknown":
        return "no such lease: never opened, or ended more than 5 minutes ago"
    return "it ended, or was never opened"


def revoke(settings: Settings, lease: str) -> None:
    """Ends a lease by id: its locks go to their next waiters, its queue places are left."""
    from dlm.client.errors import LeaseLost

    check_lease(lease, "ID")
    client = settings.connect()
    try:
        try:
            keys = client.close_lease(lease, must_exist=True, revoke=True)
        except LeaseLost as exc:
            raise CliError(
                "SESSION_EXPIRED",
                f"there is no lease {lease} ({_how_it_ended(exc.ended)}): nothing to revoke; "
                "`dlm lease list` shows the live ones",
                LOST,
                lease=lease,
            ) from None
    finally:
        client.close()
    if settings.json:
        emit_json({"lease": lease, "revoked": True, "released": keys})
    elif keys:
        say(f"revoked lease {lease}; released {', '.join(escape(k) for k in keys)}")
    else:
        say(f"revoked lease {lease}; it held no lock")


def _holders_now(client: Client, key: str) -> list[dict[str, Any]]:
    """Who holds ``key`` now, as the cluster says it (an error's JSON details carry them)."""
    try:
        return [h.to_wire() for h in client.get(key).holders]
    except Exception:
        return []


def describe_holders(holders: Sequence[dict[str, Any]]) -> str:
    if not holders:
        return "held by nobody now"
    names = [
        f"lease {escape(h.get('lease', '?'))} (token {escape(h.get('token', '?'))})"
        for h in holders
    ]
    return "held by " + ", ".join(names)


# ---------------------------------------------------------------------------
# store inspect
# ---------------------------------------------------------------------------


def store_inspect(directory: str, as_json: bool) -> None:
    """Prints the report; exits 1 (CHECK_FAILED) when the directory has problems (corrupt,
    missing, not a data directory)."""
    from dlm.store import StoreCorrupted, StoreError
    from dlm.store.inspect import inspect_store, inspect_store_json

    try:
        report = inspect_store_json(directory)
        if as_json:
            emit_json(report)
        elif not report.get("data_dir") and report.get("problems"):
            # Nothing to report but that: one line, as for any other error.
            raise CliError("NOT_A_DATA_DIR", str(report["problems"][0]), CHECK_FAILED)
        else:
            sys.stdout.write(inspect_store(directory).rstrip("\n") + "\n")
    except StoreError as exc:
        code = "STORE_CORRUPTED" if isinstance(exc, StoreCorrupted) else "STORE_ERROR"
        raise CliError(code, str(exc), CHECK_FAILED) from None
    except OSError as exc:
        raise CliError(
            "STORE_UNREADABLE", f"cannot read {directory}: {exc}", CHECK_FAILED
        ) from None
    if not report.get("ok", False):
        error = CliError(
            "STORE_PROBLEMS",
            f"{directory} has problems (listed above); do not start a member on it as it is",
            CHECK_FAILED,
        )
        error.reported = as_json  # the JSON report already says ok: false
        raise error
