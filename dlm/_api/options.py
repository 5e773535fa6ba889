"""What ``dlm.Client`` and ``dlm.AsyncClient`` are given, read as the ``dlm`` command reads it.

Private (the public surface is ``dlm.__all__``). The cluster is the ``--cluster``
text (``"h1:7700,h2:7700"``) or a list of ``HOST:PORT``, else ``$DLM_CLUSTER``, else
127.0.0.1:7700; the secret and TLS files come from the arguments, else from the
variables the command reads (``DLM_SECRET_FILE``, ``DLM_TLS_CA``, ``DLM_TLS_CERT``,
``DLM_TLS_KEY``); a duration is seconds (int or float) or the command's text
(``"30s"``, ``"1m30s"``, ``"500ms"``). A value that cannot be used raises ValueError
(TypeError for the wrong type) naming the argument; a secret or TLS file that
cannot be used raises ``dlm.AuthFailed`` (the command's exit 78). The rules
themselves are the command's (dlm.cli.settings, dlm.durations, dlm.limits),
reused, not copied.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dlm import limits
from dlm.client.errors import AuthFailed
from dlm.durations import DurationError, parse_duration

Duration = int | float | str
"""Seconds, or a duration as the ``dlm`` command writes it ("30s", "1m30s", "500ms")."""


def seconds(value: Duration, name: str, *, allow_zero: bool = True) -> float:
    """``value`` in seconds; ValueError naming ``name`` if it is not a duration."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{name} takes seconds (int or float) or a duration like '30s'")
    if isinstance(value, str):
        try:
            result = parse_duration(value)
        except DurationError as exc:
            raise ValueError(f"bad {name}: {exc}") from None
    else:
        result = float(value)
        if not math.isfinite(result) or result > 7 * 24 * 3600.0:
            raise ValueError(f"bad {name}: {value!r} seconds is longer than a week")
    if result < 0 or (result == 0 and not allow_zero):
        raise ValueError(f"bad {name}: {value!r} must be more than 0")
    return result


def milliseconds(value: Duration, name: str) -> int:
    """``value`` in whole milliseconds, rounded up (so "0.5ms" is not 0)."""
    ms_float = seconds(value, name) * 1000
    whole = int(ms_float)
    return whole + (whole < ms_float)


def optional_ttl_ms(value: Duration | None, name: str = "ttl") -> int | None:
    """As ``ttl_ms``; None stays None: the lease gets the cluster's default-ttl."""
    return None if value is None else ttl_ms(value, name)


def ttl_ms(value: Duration, name: str = "ttl") -> int:
    """A lease TTL in milliseconds, within the cluster's bounds."""
    ms = milliseconds(value, name)
    problem = limits.check_ttl_ms(ms, value if isinstance(value, str) else f"{value}s")
    if problem is not None:
        raise ValueError(f"bad {name}: {problem}")
    return ms


def lock_delay_ms(value: Duration | None, name: str = "lock_delay") -> int:
    """A lease's lock-delay in milliseconds (None: none), 0 up to a minute."""
    if value is None:
        return 0
    ms = milliseconds(value, name)
    problem = limits.check_lock_delay_ms(ms, value if isinstance(value, str) else f"{value}s")
    if problem is not None:
        raise ValueError(f"bad {name}: {problem}")
    return ms


def optional_seconds(value: Duration | None, name: str) -> float | None:
    return None if value is None else seconds(value, name)


def keys(key: str | Sequence[str]) -> tuple[str, ...]:
    """One key, or several (in the order given, each once); ValueError if one is bad."""
    given = (key,) if isinstance(key, str) else tuple(key)
    if not given:
        raise ValueError("a lock needs at least one key")
    out: list[str] = []
    for one in given:
        if not isinstance(one, str):
            raise TypeError(f"a key is a str, not {type(one).__name__}")
        problem = limits.check_key(one)
        if problem is not None:
            raise ValueError(f"bad key {one!r}: {problem}")
        if one not in out:
            out.append(one)
    return tuple(out)


def limit(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("limit is an int")
    problem = limits.check_limit(value)
    if problem is not None:
        raise ValueError(f"bad limit: {problem}")
    return value


def meta(extra: Mapping[str, str] | None) -> dict[str, str]:
    """Who takes the lock (host, user, pid: what `dlm status KEY` shows, as for the
    command), with the caller's own entries over it."""
    from dlm.cli.ops import owner_meta

    out = owner_meta(pid=os.getpid())
    for name, value in (extra or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError("meta maps str names to str values")
        out[name] = value
    problem = limits.check_meta(out)
    if problem is not None:
        raise ValueError(f"bad meta: {problem}")
    return out


def cluster(value: str | Sequence[str] | None) -> list[str]:
    """The members to ask: ``value``, else $DLM_CLUSTER, else 127.0.0.1:7700."""
    from dlm.cli.settings import CLUSTER_ENV, DEFAULT_CLUSTER
    from dlm.client.core import parse_members

    source = "cluster"
    if value is None or (isinstance(value, str) and not value.strip()):
        value, source = os.environ.get(CLUSTER_ENV) or DEFAULT_CLUSTER, CLUSTER_ENV
    if isinstance(value, str) and "://" in value:
        raise ValueError(f"{source} takes HOST:PORT[,HOST:PORT...], not a URL (got {value!r})")
    if not isinstance(value, str) and not all(isinstance(v, str) for v in value):
        raise TypeError("cluster is a str 'HOST:PORT,...' or a list of 'HOST:PORT' strs")
    try:
        return parse_members(value)
    except ValueError as exc:
        raise ValueError(f"bad {source} {value!r}: {exc}") from None


def credentials(
    secret_file: str | os.PathLike[str] | None,
    tls_ca: str | os.PathLike[str] | None,
    tls_cert: str | os.PathLike[str] | None,
    tls_key: str | os.PathLike[str] | None,
) -> tuple[bytes | None, Any]:
    """(secret, ssl.SSLContext or None), from the arguments else the environment;
    AuthFailed naming the file that cannot be used."""
    from dlm.cli.exits import CliError
    from dlm.cli.settings import (
        SECRET_ENV,
        TLS_CA_ENV,
        TLS_CERT_ENV,
        TLS_KEY_ENV,
        Credentials,
    )

    def pick(given: str | os.PathLike[str] | None, variable: str) -> str | None:
        return os.fspath(given) if given is not None else (os.environ.get(variable) or None)

    files = Credentials(
        pick(secret_file, SECRET_ENV),
        pick(tls_ca, TLS_CA_ENV),
        pick(tls_cert, TLS_CERT_ENV),
        pick(tls_key, TLS_KEY_ENV),
    )
    if not files:
        return None, None
    try:
        return files.load()
    except CliError as exc:
        raise AuthFailed(exc.message) from None


def traceparent(value: str | None, name: str = "traceparent") -> str | None:
    """A W3C traceparent the lock's requests carry (None: none given); ValueError if
    malformed."""
    if value is None:
        return None
    from dlm.wire import traceparent_problem

    problem = traceparent_problem(value)
    if problem is not None:
        raise ValueError(f"bad {name} {str(value)[:60]!r}: {problem}")
    return value
