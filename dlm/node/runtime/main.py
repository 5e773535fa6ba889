"""`dlm node start`: turn settings into a running member, or into one clear line on stderr.

``start_from_options`` is what the CLI calls with the flags it was given: it
merges them with the ``DLM_NODE_*`` environment and the ``--config`` file
(dlm.node.runtime.config.options) and hands them to ``start_node``, which returns the
process exit code and never lets a traceback reach the user: 0 after a clean
shutdown (SIGTERM or Ctrl-C) or once this member knows it was removed from the
cluster, 2 for settings that make no sense, 74 (EX_IOERR) when the data dir's
disk is full, 78 (EX_CONFIG) for authentication or TLS settings that cannot be
used (among them a reachable --listen with no peer authentication and no
--insecure), 65 (EX_DATAERR) for a data dir that belongs to another member or
cluster, 1 for everything else the environment refused (busy port, unusable
or corrupt data dir) and for crashes. A service manager restarts on 1 only:
2, 65 and 78 are mistakes a restart cannot fix (docs/dlm.service).

``python -m dlm.node.runtime.main --id n1 ...`` runs the same thing without the CLI.
"""

from __future__ import annotations

import argparse
import errno
import functools
import gc
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import anyio
import anyio.abc

from dlm.event_loop import EventLoopChoiceError, chosen_loop, loop_factory
from dlm.event_loop import run as run_loop
from dlm.node.runtime.config.node_config import (
    META_FORMAT,
    PARTITIONS_FILE,
    ConfigError,
    DataDirMeta,
    ForeignDataDir,
    NodeConfig,
    check_data_dir,
    parse_partitions,
    partition_dir,
    recorded_partitions,
    settle_partitions,
    write_meta,
    write_partitions,
)
from dlm.node.runtime.config.options import ALL_OPTIONS, OptionError, Resolved, resolve
from dlm.node.runtime.log import Logger, default_format, level_named
from dlm.node.runtime.reload import RELOAD_FLAGS_ENV, Reloading, Reread, partition_settings
from dlm.node.runtime.seat import Seat
from dlm.node.runtime.security import NodeSecurity, SecurityError
from dlm.node.runtime.security import load as load_security
from dlm.node.runtime.server import RemovedMember, run
from dlm.records import ConfState
from dlm.store import StoreCorrupted, StoreError, StoreFull
from dlm.store.disk import DiskStorage
from dlm.wire import format_addr

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_FOREIGN_DATA = 65  # EX_DATAERR: the data dir belongs to another member or cluster
EXIT_IOERR = 74
EXIT_CONFIG = 78  # EX_CONFIG: the authentication or TLS settings cannot be used
GC_THRESHOLD = 35_000
"""New containers between two passes of the cyclic collector (Python's default: 700)."""


class StartupError(Exception):
    """The node cannot start; the message is the one line we print."""


Joiner = Callable[[NodeConfig, NodeSecurity | None], NodeConfig]
"""Asks the running cluster (``--join``) to add this member; returns the config to boot
with, or raises StartupError. It asks as a client, so the room above both the node and
the client supplies it (dlm.cli.node_join): the runtime does not import the client."""


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"dlm node: error: {message}\n")
    sys.stderr.flush()
    return code


def start_from_options(
    flags: Mapping[str, str | None],
    environ: Mapping[str, str] | None = None,
    *,
    join: Joiner | None = None,
    child_module: str = __name__,
) -> int:
    """Runs a member from its flags (None: not given), the DLM_NODE_* variables and the
    --config file, in that order of precedence; returns the exit code."""
    try:
        resolved = resolve(flags, os.environ if environ is None else environ)
    except OptionError as exc:
        return _fail(str(exc), EXIT_USAGE)
    return start_node(
        resolved.values,
        resolved=resolved,
        join=join,
        child_module=child_module,
        flags=flags,
        environ=os.environ if environ is None else environ,
    )


def start_node(
    settings: Mapping[str, str | None],
    *,
    on_started: Callable[[Any], None] | None = None,
    resolved: Resolved | None = None,
    join: Joiner | None = None,
    seat: Seat | None = None,
    child_module: str = __name__,
    flags: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Runs a member in the foreground until SIGTERM/SIGINT; returns the exit code.

    ``settings`` are the values of dlm.node.runtime.config.options.NODE_OPTIONS by parameter
    name (missing or None: not set). ``resolved`` says where each came from, so an
    error about one names the variable or file that set it. ``seat``: this process is
    one partition of a member whose supervisor accepts its connections. A member of
    more than one partition (``--partitions``, or its data directory's record) runs
    the supervisor instead (supervisor.py), whose children run ``child_module``'s
    ``child_main``. ``flags`` and ``environ``: what the settings were resolved from, read
    again (with the --config file) at each SIGHUP (reload.py; None: a reload changes
    nothing)."""
    _ignore_hangups_until_ready()
    partitions, recorded = 1, None
    try:
        config = NodeConfig.from_settings(settings)
        given = parse_partitions(settings.get("partitions"))
    except ConfigError as exc:
        return _fail(resolved.explain(str(exc)) if resolved else str(exc), EXIT_USAGE)
    if seat is None:
        try:
            recorded = recorded_partitions(config.data_dir)
        except ConfigError as exc:
            return _fail(str(exc), EXIT_FAILURE)
        try:
            partitions = settle_partitions(given, recorded, config.data_dir)
        except ConfigError as exc:
            return _fail(str(exc), EXIT_USAGE)
    else:
        config = replace(config, partition=seat.partition, partitions=seat.partitions)
        if config.metrics_listen is not None:
            # Its supervisor serves --metrics-listen, and fetches this partition's
            # metrics from loopback (partition_metrics.py).
            config = replace(config, metrics_listen=("127.0.0.1", 0))
    if partitions > 1:
        # Where it listens, and what it recorded: partition 0's data directory says.
        config = replace(config, partitions=partitions)
        config = replace(config, listen=_listen_address(_partition_config(config, 0)))
    try:
        loop_name = chosen_loop()
    except EventLoopChoiceError as exc:
        return _fail(str(exc), EXIT_USAGE)
    log_level, log_format = settings.get("log_level"), settings.get("log_format")
    try:
        log = Logger(
            config.node_id,
            level=level_named(log_level),
            format=log_format or default_format(),
            partition=None if seat is None else seat.partition,
        )
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    if config.metrics_listen is not None and importlib.util.find_spec("prometheus_client") is None:
        # An optional dependency (pyproject's "metrics" extra): `make run` and the zipapp
        # leave it out. Better this line now than a failure once the member serves.
        return _fail(
            "--metrics-listen needs the prometheus-client package, which is not installed: "
            "pip install prometheus-client (or install dlm with its [metrics] extra)",
            EXIT_FAILURE,
        )
    try:
        # Checked against where the member will listen, which a restart without --listen
        # takes from its data directory: a recorded 0.0.0.0 needs authentication as much
        # as one given on the command line.
        security = load_security(settings, _listen_address(config), config.metrics_listen)
    except SecurityError as exc:
        return _fail(resolved.explain(str(exc)) if resolved else str(exc), EXIT_CONFIG)
    if seat is not None:
        # Its supervisor scrapes it on 127.0.0.1 with the token it drew for it.
        from dlm.node.runtime.partition_metrics import TOKEN_ENV

        token = os.environ.pop(TOKEN_ENV, "")
        if token and security is not None:
            security = replace(security, metrics_token=token.encode("ascii"))
    if os.environ.get("DLM_NO_FSYNC", "") == "1":
        config = replace(config, fsync=False)
    # Tuning knobs for tests and experiments, not flags a user should need.
    every = os.environ.get("DLM_SNAPSHOT_EVERY", "").strip()
    keep = os.environ.get("DLM_SNAPSHOT_KEEP", "").strip()
    if every.isdigit() and int(every) > 0:
        config = replace(config, snapshot_every=int(every))
    if keep.isdigit():
        config = replace(config, snapshot_keep=int(keep))
    # A member's heap is mostly its lock table, which makes no reference cycles, while the
    # collector's default pace (a pass every 700 new containers, a full one every hundred
    # passes while the heap grows) walks that table again and again: applying 100,000
    # grants took half again as long. Reference counting frees the rest as before.
    gc.set_threshold(GC_THRESHOLD, 10, 10)
    reloading = Reloading(
        dict(settings),
        _rereader(settings, flags, environ, seat),
        _listen_address(config),
        metrics_listen_override=("127.0.0.1", 0) if seat is not None else None,
    )
    if partitions > 1:
        return _supervise(
            config,
            settings=settings,
            partitions=partitions,
            log=log,
            security=security,
            child_module=child_module,
            reloading=reloading,
            flags=flags,
            loop_name=loop_name,
        )
    try:
        main = functools.partial(_main, seat=seat, reloading=reloading)
        return anyio.run(
            main,
            config,
            log,
            on_started,
            security,
            join,
            backend="asyncio",
            backend_options={"loop_factory": loop_factory(loop_name)},
        )
    except EventLoopChoiceError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except StartupError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    except ForeignDataDir as exc:
        return _fail(str(exc), EXIT_FOREIGN_DATA)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    except KeyboardInterrupt:
        return EXIT_OK
    except BaseExceptionGroup as group:
        return _fail_after(group)
    except Exception as exc:
        return _fail_after(exc)


def _ignore_hangups_until_ready() -> None:
    """SIGHUP means reload (reload.py) once the member watches for it; until then its
    default action would kill a member still starting (or a partition child its
    supervisor just forwarded one to)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _fail_after(exc: BaseException) -> int:
    full = _store_full(exc)
    if full is not None:
        return _fail(str(full), EXIT_IOERR)
    return _fail(_describe(exc), EXIT_FAILURE)


def _store_full(exc: BaseException | None) -> StoreFull | None:
    """The StoreFull that stopped the node, however the runtime wrapped it."""
    while exc is not None:
        if isinstance(exc, StoreFull):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                found = _store_full(inner)
                if found is not None:
                    return found
        exc = exc.__cause__
    return None


def _describe(exc: BaseException) -> str:
    """One line for an unexpected failure (the JSON log has the details)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, StartupError | ConfigError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"stopped after an I/O error: {exc}"
    return f"stopped after an unexpected error: {exc!r}"


async def _main(
    config: NodeConfig,
    log: Logger,
    on_started: Callable[[Any], None] | None,
    security: NodeSecurity | None = None,
    join: Joiner | None = None,
    *,
    seat: Seat | None = None,
    reloading: Reloading | None = None,
) -> int:
    meta = check_data_dir(config)
    if meta is None and config.join:
        if join is None:
            raise StartupError("--join needs `dlm node start`, which can ask the cluster")
        config = await anyio.to_thread.run_sync(join, config, security)
        log.info("joined", cluster=config.cluster, first_members=sorted(config.peers))
    elif meta is not None:
        config = _settled(config, meta, log)
    # A partition child listens nowhere: its supervisor hands it its connections.
    listener = await _listen(config) if seat is None else None
    try:
        try:
            storage = DiskStorage.open(
                config.data_dir,
                fsync=config.fsync,
                bootstrap_conf=ConfState(voters=config.voters),
            )
        except StoreFull:
            raise
        except StoreCorrupted as exc:
            raise StartupError(str(exc)) from None
        except StoreError as exc:
            raise StartupError(str(exc)) from None
        except OSError as exc:
            raise StartupError(f"cannot use data dir {config.data_dir}: {exc}") from None
        if meta is not None and meta.made_by and storage.last_index() == meta.incarnation:
            # The first start of a restored or recovered member (nothing written since).
            log.info(
                meta.made_by,
                incarnation=meta.incarnation,
                first_index=meta.incarnation + 1,
                voters=list(storage.initial_state()[1].voters),
            )
        try:
            if meta is None or _meta_outdated(config, meta):
                # A new directory, one of an earlier release, or a new --listen: record the
                # first members and where this member listens.
                try:
                    write_meta(config)
                except OSError as exc:
                    raise StartupError(
                        f"cannot write to data dir {config.data_dir}: {exc.strerror or exc}"
                    ) from None
            try:
                return await run(
                    config,
                    storage,
                    listener,
                    log=log,
                    on_started=on_started,
                    security=security,
                    seat=seat,
                    reloading=reloading,
                )
            except RemovedMember as exc:
                # Not a failure: the member is simply no longer one, and a service manager
                # that restarts failed units must leave it stopped (as a member told of its
                # removal while running exits 0).
                log.warning("removed", reason=str(exc))
                sys.stderr.write(f"dlm node: {exc}\n")
                sys.stderr.flush()
                return EXIT_OK
            except Exception:
                log.error("node_crashed", traceback=traceback.format_exc())
                raise
        finally:
            storage.close()
            log.info("node_stopped")
    finally:
        if listener is not None:
            await listener.aclose()


def _settled(config: NodeConfig, meta: DataDirMeta, log: Logger) -> NodeConfig:
    """A data directory that was started before: its first members are the ones it recorded
    (--peers and --join only matter at the first start)."""
    if config.join:
        log.warning(
            "join_ignored",
            message=f"--join is ignored: {config.data_dir} already holds member "
            f"{config.node_id}'s data; it rejoins on its own",
        )
    if meta.join_members:
        config = replace(config, join_members=meta.join_members)
    config = replace(config, incarnation=meta.incarnation, made_by=meta.made_by)
    if meta.peers is not None:
        # (None: a directory of format 1 recorded none, and --peers says them, as it did.)
        if config.peers_given and meta.peers != config.peers:
            log.warning(
                "peers_ignored",
                message="--peers differs from the members this data directory started with, "
                "and is ignored: the membership comes from the log (dlm members list)",
            )
        config = replace(config, peers=meta.peers)
    return _where_it_lived(config, meta, log)


def _recorded_listen(config: NodeConfig, meta: DataDirMeta) -> tuple[str, int] | None:
    """Where the data directory says this member listened (a directory of the previous
    release: its own entry among the first members, if it has one)."""
    if meta.listen is not None:
        return meta.listen
    return meta.peers.get(config.node_id) if meta.peers is not None else None


def _listen_address(config: NodeConfig) -> tuple[str, int]:
    """Where the member will listen: --listen, else where its data directory says."""
    if config.listen_given:
        return config.listen
    try:
        meta = check_data_dir(config)
    except ConfigError:
        return config.listen  # refused, with its reason, when the member starts
    recorded = _recorded_listen(config, meta) if meta is not None else None
    return recorded or config.listen


def _where_it_lived(config: NodeConfig, meta: DataDirMeta, log: Logger) -> NodeConfig:
    """Where a restarted member listens: where it did before, unless --listen says otherwise.

    Without this, a member restarted with its --id and --data alone (the others
    know it at its old address) would listen on the default port, and the leader
    would see it come and go. A directory of the previous release recorded no
    address: the member's own entry among the first members stands in for it."""
    recorded = _recorded_listen(config, meta)
    if config.advertise is None and meta.advertise is not None:
        config = replace(config, advertise=meta.advertise)
    if recorded is None or recorded == config.listen:
        return config
    if not config.listen_given:
        return replace(config, listen=recorded)
    log.warning(
        "listen_changed",
        message=f"listening on {format_addr(*config.listen)} as --listen says, not on "
        f"{format_addr(*recorded)} where this member listened before; the other members "
        "reach it at the address the membership names (dlm members list)",
        listen=format_addr(*config.listen),
        previous=format_addr(*recorded),
    )
    return config


def _meta_outdated(config: NodeConfig, meta: DataDirMeta) -> bool:
    """Whether node.json should be written again: an older format, or another address."""
    return (
        meta.peers is None
        or meta.format < META_FORMAT
        or meta.listen != config.listen
        or meta.advertise != config.advertise
    )


async def _listen(config: NodeConfig) -> anyio.abc.Listener[Any]:
    host, port = config.listen
    try:
        return await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as exc:
        raise _listen_failed(config, exc) from None


def _listen_failed(config: NodeConfig, exc: OSError) -> StartupError:
    """The one line for an address this member cannot listen on."""
    addr = format_addr(*config.listen)
    if exc.errno == errno.EADDRINUSE or "address already in use" in str(exc).lower():
        return StartupError(f"{addr} is already in use: stop the other process or choose --listen")
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError(f"cannot listen on {addr}: no such local address")
    if exc.errno == errno.EACCES:
        return StartupError(f"cannot listen on {addr}: permission denied")
    return StartupError(f"cannot listen on {addr}: {exc.strerror or exc}")


def _rereader(
    settings: Mapping[str, str | None],
    flags: Mapping[str, str | None] | None,
    environ: Mapping[str, str] | None,
    seat: Seat | None,
) -> Reread:
    """How a SIGHUP reads this process's settings again: its flags, its environment and
    its --config file, as at start. A partition child reads its member's flags from the
    variable its supervisor set, and sees them as its supervisor gave them to it."""
    if seat is not None:
        given = os.environ.get(RELOAD_FLAGS_ENV)
        if not given:
            return lambda: dict(settings)
        child_flags = json.loads(given)
        data = settings.get("data")
        return lambda: partition_settings(resolve(child_flags, os.environ).values, data)
    if flags is None:
        return lambda: dict(settings)
    frozen_flags = dict(flags)
    frozen_environ = dict(os.environ if environ is None else environ)
    return lambda: resolve(frozen_flags, frozen_environ).values


def _partition_config(config: NodeConfig, partition: int) -> NodeConfig:
    """The config of one partition's process: its own data directory under the member's."""
    return replace(
        config,
        data_dir=partition_dir(config.data_dir, partition),
        partition=partition,
    )


def _supervise(
    config: NodeConfig,
    *,
    settings: Mapping[str, str | None],
    partitions: int,
    log: Logger,
    security: NodeSecurity | None,
    child_module: str,
    reloading: Reloading,
    flags: Mapping[str, str | None] | None,
    loop_name: str,
) -> int:
    """Runs the supervisor of a member of ``partitions`` partitions (supervisor.py), on
    the same loop its children run on (``DLM_EVENT_LOOP``, which they inherit)."""
    import socket

    from dlm.node.runtime.supervisor import Supervisor

    try:
        check_data_dir(config)  # a member's directory of one partition: refused by name
        for partition in range(partitions):
            check_data_dir(_partition_config(config, partition))
    except ForeignDataDir as exc:
        return _fail(str(exc), EXIT_FOREIGN_DATA)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    try:
        listener = socket.create_server(config.listen, family=_family(config.listen[0]))
    except OSError as exc:
        return _fail(str(_listen_failed(config, exc)), EXIT_FAILURE)
    try:
        try:
            if not (config.data_dir / PARTITIONS_FILE).exists():
                write_partitions(config, partitions)  # a new directory: its count, for good
        except OSError as exc:
            return _fail(
                f"cannot write to data dir {config.data_dir}: {exc.strerror or exc}", EXIT_FAILURE
            )
        supervisor = Supervisor(
            config,
            settings,
            partitions,
            log,
            child_module=child_module,
            security=security,
            reloading=reloading,
            flags=flags,
        )
        try:
            return run_loop(loop_name, lambda: supervisor.run(listener))
        except EventLoopChoiceError as exc:
            return _fail(str(exc), EXIT_USAGE)
        except KeyboardInterrupt:
            return EXIT_OK
        except Exception as exc:
            return _fail(_describe(exc), EXIT_FAILURE)
    finally:
        listener.close()


def _family(host: str) -> int:
    import socket

    return socket.AF_INET6 if ":" in host else socket.AF_INET


def child_main(argv: Sequence[str], join: Joiner | None = None) -> int:
    """A partition child's entry (supervisor.py starts it): SETTINGS-JSON CHANNEL-FD
    PARTITION PARTITIONS."""
    import json

    settings_json, fd, partition, partitions = argv
    seat = Seat.from_fd(int(fd), int(partition), int(partitions))
    settings = json.loads(settings_json)
    return start_node(settings, seat=seat, join=join)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlm.node.runtime.main", description="Run one dlm cluster member."
    )
    for option in ALL_OPTIONS:
        if option.is_flag:
            parser.add_argument(
                option.flag,
                dest=option.param,
                action="store_const",
                const="true",
                help=f"{option.help} [env: {option.env}]",
            )
            continue
        parser.add_argument(
            option.flag,
            dest=option.param,
            metavar=option.metavar,
            help=f"{option.help} [env: {option.env}]",
        )
    args = parser.parse_args(argv)
    return start_from_options(vars(args))


if __name__ == "__main__":
    sys.exit(main())
