"""SIGHUP: a running member re-reads its settings and takes on what can change live.

``prepare`` re-reads the settings the way the member read them at start (its
flags, its environment, its --config file, read again now), checks every one of
them as a start would (parse, secrets and TLS files loaded), and compares them
with the ones the member runs with (dlm/node/settings_diff.py). It returns a
``Plan`` or one line saying why nothing changes. Only then does ``apply_plan``
touch the member: the metrics listener first (the one step that can fail,
binding a port), then the log level, the quotas and limits, the secrets and
TLS. A reload refused, for a bad file or a setting that needs a restart, leaves
the member exactly as it was and says so in a ``reload_refused`` event; one
applied lists what changed in ``config_reloaded``.

Secrets and TLS rotate with an overlap (security.py, ``NodeSecurity.rotated``):
after a reload that changed a secret file, the member accepts the old secret and
the new one, and it drops the old at its next reload. So an operator writes the
new secret on every member and reloads each, then reloads each again.
"""

from __future__ import annotations

import importlib.util
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import anyio

from dlm.node.runtime.accepting import Budget
from dlm.node.runtime.config.node_config import ConfigError, NodeConfig
from dlm.node.runtime.config.options import OptionError
from dlm.node.runtime.log import INFO, Logger, level_named
from dlm.node.runtime.security import NodeSecurity, SecurityError
from dlm.node.runtime.security import load as load_security
from dlm.node.settings_diff import (
    METRICS,
    QUOTAS,
    SECURITY,
    SettingsDiff,
    diff_settings,
    flag_of,
)
from dlm.wire import format_addr

RELOAD_FLAGS_ENV = "DLM_PARTITION_FLAGS"
"""A partition child's environment: its member's flags (JSON), which it reads its settings
from again at a SIGHUP its supervisor forwards."""

Settings = Mapping[str, str | None]


class Reloadable(Protocol):
    """A member's server (server.py), or the supervisor of a partitioned member's
    children (supervisor.py): what a reload changes in either."""

    log: Logger
    config: NodeConfig
    security: Any
    metrics: Any

    async def _start_metrics(self, host: str, port: int) -> None: ...


Reread = Callable[[], Settings]
"""Reads the member's settings again, as at its start (raises OptionError)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A checked reload: the new settings, and everything built from them."""

    settings: dict[str, str | None]
    config: NodeConfig
    level: int
    security: NodeSecurity
    diff: SettingsDiff


def prepare(
    current: Settings,
    reread: Reread,
    listen: tuple[str, int],
    *,
    metrics_listen_override: tuple[str, int] | None = None,
) -> Plan | str:
    """The plan for a reload, or the one line that refuses it (nothing read is kept).

    ``listen``: where the member listens (secrets are checked against it, as at start).
    ``metrics_listen_override``: a partition child serves its metrics where its
    supervisor scrapes them, whatever the file says (main.py)."""
    try:
        new = dict(reread())
    except OptionError as exc:
        return str(exc)
    diff = diff_settings(current, new)
    if diff.refused:
        return diff.refusal_line()
    if _tls_on(current) != _tls_on(new):
        # A listener serves TLS or plain TCP from its start: only a restart switches.
        return (
            "turning TLS on or off (--tls-cert, --tls-key, --tls-ca) cannot happen while the "
            "member runs (nothing applied): restart the member for it; a reload replaces "
            "certificates, keys and the CA of a member that has TLS"
        )
    if bool(current.get("peer_secret_file")) != bool(new.get("peer_secret_file")):
        # Whether peers prove a secret is part of what the member decided at start
        # (which learners it trusts to promote): a secret replaced is fine, none added.
        return (
            "turning the peer secret on or off (--peer-secret-file) cannot happen while the "
            "member runs (nothing applied): restart the member for it; a reload replaces "
            "the secret of a member that has one"
        )
    try:
        config = NodeConfig.from_settings(new)
        level = level_named(new.get("log_level"))
    except (ConfigError, ValueError) as exc:
        return str(exc)
    if metrics_listen_override is not None and config.metrics_listen is not None:
        config = replace(config, metrics_listen=metrics_listen_override)
    if config.metrics_listen is not None and importlib.util.find_spec("prometheus_client") is None:
        return (
            "--metrics-listen needs the prometheus-client package, which is not installed: "
            "pip install prometheus-client"
        )
    try:
        security = load_security(new, listen, config.metrics_listen)
    except SecurityError as exc:
        return str(exc)
    return Plan(new, config, level, security, diff)


def _tls_on(settings: Settings) -> bool:
    return all(settings.get(name) for name in ("tls_cert", "tls_key", "tls_ca"))


def carry_tls(old: NodeSecurity, new: NodeSecurity, settings: Settings) -> NodeSecurity:
    """TLS files replaced by a reload. The listener's context is the one it was started
    with (a listener cannot change it), so the new certificate, key and CA are loaded into
    it: new handshakes present the new certificate and trust both CAs (the old one until
    the member restarts). Peer links dial with a context that trusts the new CA and the old
    one, so members whose certificates the old CA signed are still reached while the
    rotation goes round."""
    if old.server_tls is None or new.server_tls is None:
        return new
    cert, key, ca = (str(settings.get(name)) for name in ("tls_cert", "tls_key", "tls_ca"))
    old.server_tls.load_cert_chain(cert, key)
    old.server_tls.load_verify_locations(cafile=ca)
    if old.peer_tls is not None and new.peer_tls is not None:
        for der in old.peer_tls.get_ca_certs(binary_form=True):
            new.peer_tls.load_verify_locations(cadata=der)
    return replace(new, server_tls=old.server_tls)


def security_after(old: NodeSecurity | None, new: NodeSecurity) -> NodeSecurity:
    """The security a reload leaves: the new one, still accepting the secrets the old one
    did if they changed (the overlap a rotation needs); the ones of the reload before are
    dropped now."""
    if old is None:
        return new
    return replace(
        new,
        previous_peer_secret=old.peer_secret if old.peer_secret != new.peer_secret else None,
        previous_client_secret=(
            old.client_secret if old.client_secret != new.client_secret else None
        ),
    )


async def supervisor_reload(supervisor: Any) -> bool:
    """A SIGHUP to the supervisor of a partitioned member: the settings are read and
    checked once, here; if they pass, the supervisor takes on its own part (log level,
    the member's metrics listener) and forwards the SIGHUP to every partition child,
    which reads the same file and applies the rest. Refused, nothing is forwarded."""
    reloading = supervisor.reloading
    log = supervisor.log
    if reloading is None:
        log.warning("reload_refused", reason="this member cannot read its settings again")
        return False
    plan = prepare(reloading.settings, reloading.reread, reloading.listen)
    if isinstance(plan, Plan):
        problem = await apply_plan(supervisor, plan, level_before=log.level)
    else:
        problem = plan
    if problem is not None:
        log.warning("reload_refused", reason=problem)
        return False
    assert isinstance(plan, Plan)
    reloading.settings = plan.settings
    reloading.reloads += 1
    # A child started from now on starts with them.
    supervisor.settings = dict(plan.settings)
    supervisor.signal_children(signal.SIGHUP)
    return True


async def apply_plan(server: Reloadable, plan: Plan, *, level_before: int) -> str | None:
    """Applies a checked plan to a running member; returns None, or why nothing changed
    (a metrics address it cannot bind). Says ``config_reloaded`` whatever the log level."""
    diff = plan.diff
    old_security = server.security
    security = security_after(old_security, plan.security)
    if old_security is not None:
        # The files are read again whether or not their paths changed (a rotation
        # usually writes new contents where the old ones were).
        security = carry_tls(old_security, security, plan.settings)
    metrics_changed = diff.touches(METRICS) or (
        server.config.metrics_listen is not None
        and (
            old_security is None
            or old_security.metrics_token != security.metrics_token
            or diff.touches(SECURITY)
        )
    )
    if metrics_changed:
        problem = await _move_metrics(server, plan.config.metrics_listen, security)
        if problem is not None:
            return problem
    # An operator asked for it: said even when the log is quieter than info.
    server.log.level = min(level_before, plan.level, INFO)
    server.log.info(
        "config_reloaded",
        changed=[flag_of(param) for param in diff.changes],
        rotated=_rotated(old_security, security),
        previous_secrets_dropped=_dropped(old_security),
    )
    server.log.level = plan.level
    server.config = replace(
        server.config,
        metrics_listen=plan.config.metrics_listen,
        job_metrics=plan.config.job_metrics,
        quotas=plan.config.quotas,
        max_connections=plan.config.max_connections,
    )
    server.security = security
    member: Any = server
    machine = getattr(member, "machine", None)
    if machine is None:
        return None  # a supervisor: its children take on the rest
    for link in getattr(member, "_links", {}).values():
        link.use_credentials(security.peer_secret, security.previous_peer_secret, security.peer_tls)
    if diff.touches(QUOTAS):
        member.limits = replace(member.limits, max_connections=plan.config.max_connections)
        member.budget = Budget.for_process(len(member.config.peers), plan.config.max_connections)
        machine.member_connections(member.budget.clients, plan.config.quotas)
    return None


async def _move_metrics(
    server: Reloadable, where: tuple[str, int] | None, security: NodeSecurity | None
) -> str | None:
    """Starts /metrics where the new settings say (before closing the old listener, so a
    move to a port it cannot bind changes nothing), then closes the old one."""
    old: Any = server.metrics
    if where is None:
        server.metrics = None
        if old is not None:
            old.close()
            server.log.info("metrics_stopped")
        return None
    previous_security = server.security
    server.security = security
    if old is not None and server.config.metrics_listen == where:
        # The same address (a new token or certificate): the old listener must let go of it.
        old.close()
        old = None
    try:
        await server._start_metrics(*where)
    except OSError as exc:
        server.security = previous_security
        server.metrics = old
        return f"cannot serve metrics on {format_addr(*where)}: {exc.strerror or exc}"
    finally:
        server.security = previous_security
    if old is not None:
        old.close()
    return None


@dataclass(slots=True)
class Reloading:
    """How a running member reloads: the settings it runs with, and how to read them again."""

    settings: dict[str, str | None]
    reread: Reread
    listen: tuple[str, int]
    metrics_listen_override: tuple[str, int] | None = None
    reloads: int = 0
    """Reloads applied so far (a test waits for it)."""


async def reload_once(server: Reloadable, reloading: Reloading) -> bool:
    """One SIGHUP: re-read, check, apply all or nothing; says which in the log."""
    log = server.log
    plan = prepare(
        reloading.settings,
        reloading.reread,
        reloading.listen,
        metrics_listen_override=reloading.metrics_listen_override,
    )
    if isinstance(plan, Plan):
        if reloading.metrics_listen_override is not None:
            # A partition child's scrape token is its supervisor's, drawn at its start.
            security = replace(plan.security, metrics_token=server.security.metrics_token)
            plan = replace(plan, security=security)
        problem = await apply_plan(server, plan, level_before=log.level)
    else:
        problem = plan
    if problem is not None:
        log.warning("reload_refused", reason=problem)
        return False
    assert isinstance(plan, Plan)
    reloading.settings = plan.settings
    reloading.reloads += 1
    return True


async def watch_reloads(server: Reloadable, reloading: Reloading) -> None:
    """Reloads at each SIGHUP, one at a time, until the member stops."""
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            server.log.info("signal", signal="SIGHUP")
            await reload_once(server, reloading)


def _rotated(old: NodeSecurity | None, new: NodeSecurity) -> list[str]:
    """The secrets this reload replaced (the old ones accepted until the next reload)."""
    if old is None:
        return []
    rotated = []
    if new.previous_peer_secret is not None:
        rotated.append("--peer-secret-file")
    if new.previous_client_secret is not None:
        rotated.append("--client-secret-file")
    return rotated


def _dropped(old: NodeSecurity | None) -> list[str]:
    """The secrets of the reload before this one that stop being accepted now."""
    dropped: list[str] = []
    if old is None:
        return dropped
    if old.previous_peer_secret is not None:
        dropped.append("--peer-secret-file")
    if old.previous_client_secret is not None:
        dropped.append("--client-secret-file")
    return dropped


def partition_settings(settings: Settings, data: str | None) -> dict[str, str | None]:
    """A member's settings as one of its partition children runs with them: its own data
    directory, no partition count (it serves one), and its metrics served to its
    supervisor alone (with the token the supervisor draws for it: main.py)."""
    return {**settings, "data": data, "partitions": None, "metrics_token_file": None}
