"""What a reload (SIGHUP) may change in a running member, and what it must refuse.

A member's settings are the values of `dlm node start`'s options by parameter
(dlm/node/runtime/config/options.py: flag over variable over config file).
``diff_settings(old, new)`` compares the settings a member runs with to the ones
it would run with after re-reading its file, and returns what changed, split
into what the running member can take on (``changes``) and what only a restart
can change (``refusals``). A reload with any refusal applies nothing at all: a
half-applied file is worse than an old one, because the operator reading it
can no longer tell what the member runs with.

Pure: no IO, the runtime reads the file and applies the changes
(dlm/node/runtime/reload.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LIVE = (
    "log_level",
    "metrics_listen",
    "metrics_token_file",
    "job_metrics",
    "max_leases",
    "max_locks",
    "max_meta_bytes",
    "max_connections",
    "identity_max_leases",
    "identity_max_locks",
    "identity_max_connections",
    "identity_max_inflight",
    "peer_secret_file",
    "client_secret_file",
    "tls_cert",
    "tls_key",
    "tls_ca",
)
"""Settings a running member takes on at a reload (by parameter name)."""

RESTART_ONLY = (
    "node_id",
    "listen",
    "peers",
    "data",
    "cluster",
    "partitions",
    "advertise",
    "join",
    "auto_promote",
    "election_timeout",
    "log_format",
    "insecure",
)
"""Settings only a restart changes: who the member is, where it listens and keeps its
data, how the cluster is laid out, its Raft timing, and --insecure (which decides what
the member checks when it binds)."""

QUOTAS = (
    "max_leases",
    "max_locks",
    "max_meta_bytes",
    "max_connections",
    "identity_max_leases",
    "identity_max_locks",
    "identity_max_connections",
    "identity_max_inflight",
)
SECURITY = ("peer_secret_file", "client_secret_file", "tls_cert", "tls_key", "tls_ca")
METRICS = ("metrics_listen", "metrics_token_file")


def flag_of(param: str) -> str:
    """The flag a parameter is given with (``node_id`` is ``--id``, ``cluster`` is
    ``--cluster-id``, ``data`` is ``--data``)."""
    special = {"node_id": "--id", "cluster": "--cluster-id"}
    return special.get(param, "--" + param.replace("_", "-"))


@dataclass(frozen=True, slots=True)
class SettingsDiff:
    """The settings whose value differs, by parameter, split by whether they change live."""

    changes: tuple[str, ...] = ()
    """Parameters a running member takes on (in LIVE order)."""
    refusals: tuple[str, ...] = ()
    """Parameters only a restart changes (in RESTART_ONLY order, then unknown ones)."""

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def touches(self, params: tuple[str, ...]) -> bool:
        return any(param in self.changes for param in params)

    def refusal_line(self) -> str:
        """One line naming every setting that needs a restart."""
        flags = ", ".join(flag_of(param) for param in self.refusals)
        noun = "setting" if len(self.refusals) == 1 else "settings"
        return (
            f"{flags} cannot change while the member runs ({noun} kept as they were, and "
            f"nothing else applied): restart the member for {'it' if noun == 'setting' else 'them'}"
            ", or put the old value back and reload again"
        )


def _norm(value: str | None) -> str | None:
    """An empty value is an unset one (as the environment's FOO= is)."""
    if value is None:
        return None
    text = value.strip()
    return text or None


def diff_settings(old: Mapping[str, str | None], new: Mapping[str, str | None]) -> SettingsDiff:
    """What differs between the settings a member runs with and the re-read ones.

    A parameter in neither LIVE nor RESTART_ONLY (one a later release added and this
    one does not know how to change) is refused: a change nobody decided is live is not.
    """
    changed = [
        param
        for param in sorted(set(old) | set(new))
        if _norm(old.get(param)) != _norm(new.get(param))
    ]
    changes = tuple(param for param in LIVE if param in changed)
    refusals = tuple(param for param in RESTART_ONLY if param in changed) + tuple(
        param for param in changed if param not in LIVE and param not in RESTART_ONLY
    )
    return SettingsDiff(changes, refusals)
