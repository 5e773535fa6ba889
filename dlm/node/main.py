"""`dlm node start`: turn flags into a running member, or into one clear line on stderr.

``start_node`` is what the CLI calls. It returns the process exit code and
never lets a traceback reach the user: 0 after a clean shutdown (SIGTERM or
Ctrl-C), 2 for flags that make no sense, 74 (EX_IOERR) when the data dir's
disk is full, 1 for everything else the environment refused (busy port,
unusable or corrupt data dir, a data dir that belongs to another member).

``python -m dlm.node.main --id n1 ...`` runs the same thing without the CLI;
the dev cluster and the cluster tests use it.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import anyio
import anyio.abc

from dlm.node.config import ConfigError, NodeConfig, check_data_dir, write_meta
from dlm.node.log import Logger
from dlm.node.raft.types import ConfState
from dlm.node.server import PERSIST_THREAD_MIN_ENTRIES, run
from dlm.store import StoreCorrupted, StoreError, StoreFull
from dlm.store.disk import DiskStorage
from dlm.wire import format_addr

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_IOERR = 74


class StartupError(Exception):
    """The node cannot start; the message is the one line we print."""


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"dlm node: error: {message}\n")
    sys.stderr.flush()
    return code


def start_node(
    *,
    node_id: str | None,
    listen: str | None,
    peers: str | None,
    data: str | None,
    cluster: str | None,
    persist_in_thread: bool | int | None = None,
    on_started: Callable[[Any], None] | None = None,
) -> int:
    """Runs a member in the foreground until SIGTERM/SIGINT; returns the exit code."""
    try:
        config = NodeConfig.from_flags(
            node_id=node_id, listen=listen, peers=peers, data=data, cluster=cluster
        )
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    if persist_in_thread is None:
        persist_in_thread = _thread_setting(os.environ.get("DLM_PERSIST_THREAD", ""))
    if os.environ.get("DLM_NO_FSYNC", "") == "1":
        config = replace(config, fsync=False)
    # Tuning knobs for tests and experiments, not flags a user should need.
    every = os.environ.get("DLM_SNAPSHOT_EVERY", "").strip()
    keep = os.environ.get("DLM_SNAPSHOT_KEEP", "").strip()
    if every.isdigit() and int(every) > 0:
        config = replace(config, snapshot_every=int(every))
    if keep.isdigit():
        config = replace(config, snapshot_keep=int(keep))
    try:
        anyio.run(_main, config, persist_in_thread, on_started, backend="asyncio")
    except StartupError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    except KeyboardInterrupt:
        return EXIT_OK
    except BaseExceptionGroup as group:
        return _fail_after(group)
    except Exception as exc:
        return _fail_after(exc)
    return EXIT_OK


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


def _thread_setting(text: str) -> bool | int:
    """DLM_PERSIST_THREAD: "never", "always", or a minimum batch size (default 2)."""
    text = text.strip().lower()
    if text == "never":
        return False
    if text == "always":
        return True
    return int(text) if text.isdigit() and int(text) > 0 else PERSIST_THREAD_MIN_ENTRIES


async def _main(
    config: NodeConfig, persist_in_thread: bool | int, on_started: Callable[[Any], None] | None
) -> None:
    log = Logger(config.node_id)
    fresh = check_data_dir(config)
    listener = await _listen(config)
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
        try:
            if fresh:
                try:
                    write_meta(config)
                except OSError as exc:
                    raise StartupError(
                        f"cannot write to data dir {config.data_dir}: {exc.strerror or exc}"
                    ) from None
            try:
                await run(
                    config,
                    storage,
                    listener,
                    log=log,
                    on_started=on_started,
                    persist_in_thread=persist_in_thread,
                )
            except Exception:
                log.error("node_crashed", traceback=traceback.format_exc())
                raise
        finally:
            storage.close()
            log.info("node_stopped")
    finally:
        await listener.aclose()


async def _listen(config: NodeConfig) -> anyio.abc.Listener[Any]:
    host, port = config.listen
    addr = format_addr(host, port)
    try:
        return await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE or "address already in use" in str(exc).lower():
            raise StartupError(
                f"{addr} is already in use: stop the other process or choose --listen"
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise StartupError(f"cannot listen on {addr}: no such local address") from None
        if exc.errno == errno.EACCES:
            raise StartupError(f"cannot listen on {addr}: permission denied") from None
        raise StartupError(f"cannot listen on {addr}: {exc.strerror or exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlm.node.main", description="Run one dlm cluster member."
    )
    parser.add_argument("--id", dest="node_id")
    parser.add_argument("--listen")
    parser.add_argument("--peers")
    parser.add_argument("--data")
    parser.add_argument("--cluster-id", dest="cluster")
    args = parser.parse_args(argv)
    return start_node(
        node_id=args.node_id,
        listen=args.listen,
        peers=args.peers,
        data=args.data,
        cluster=args.cluster,
    )


if __name__ == "__main__":
    sys.exit(main())
