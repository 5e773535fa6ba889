"""Building the data directories of a new cluster incarnation (the disk side).

``restore_member`` (``dlm node restore FILE``) builds one member's data directory
from a backup file; ``recover_member`` (``dlm node recover --force``) rebuilds a
survivor's directory as the only voter of a new incarnation, from everything its log
holds. What the new state is, and why it is safe, is decided by the pure
dlm/node/incarnation.py; here it is read and written.

A directory is built beside its final place (``DIR.building``) and renamed into it, so
an interrupted run leaves no half-made data directory under the name a member starts
on. A recovered survivor's old directory is kept as ``DIR.before-recover``.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dlm.node import locks
from dlm.node.incarnation import (
    IncarnationError,
    NewIncarnation,
    lock_machine_of,
    new_incarnation,
)
from dlm.node.runtime.config.node_config import (
    ConfigError,
    NodeConfig,
    check_data_dir,
    write_meta,
)
from dlm.records import ConfState, EntryKind, HardState, Snapshot, SnapshotMeta
from dlm.store import StoreError
from dlm.store.backup import read_backup
from dlm.store.disk import DiskStorage
from dlm.store.fs import RealFS
from dlm.store.inspect import is_data_dir
from dlm.wire import format_addr

BUILDING_SUFFIX = ".building"
BEFORE_RECOVER_SUFFIX = ".before-recover"


@dataclass(frozen=True, slots=True)
class Built:
    """What was built: for the operator's report and the audit trail."""

    data_dir: str
    node_id: str
    cluster: str
    incarnation: NewIncarnation
    old_index: int
    """The backup's index (restore) or the survivor's last index (recover)."""
    term: int
    members: tuple[str, ...]
    seconds: float
    kept: str | None = None
    """Where a recovered survivor's previous directory was kept."""


def restore_member(
    backup_path: str,
    config: NodeConfig,
    *,
    bump: int,
    quarantine_ms: int | None,
) -> Built:
    """Build ``config.data_dir`` for member ``config.node_id`` of a new incarnation, with
    ``config.peers`` as its members, from the backup at ``backup_path``. Raises
    IncarnationError (BackupError, ConfigError, StoreError) with one line."""
    started = time.monotonic()
    backup = read_backup(backup_path)
    target = os.fspath(config.data_dir)
    _check_free(target)
    machine = lock_machine_of(backup.image)
    members = {m: format_addr(*addr) for m, addr in config.peers.items()}
    new = new_incarnation(
        machine,
        last_index=backup.index,
        bump=bump,
        members=members,
        quarantine_ms=quarantine_ms,
    )
    cluster = config.cluster
    conf = ConfState(voters=tuple(sorted(config.peers)))
    made = replace(config, incarnation=new.index, made_by="restored")
    _build(target, made, new, backup.term, conf)
    return Built(
        target,
        config.node_id,
        cluster,
        new,
        backup.index,
        backup.term,
        conf.voters,
        time.monotonic() - started,
    )


def recover_member(data_dir: str, *, bump: int, quarantine_ms: int | None) -> Built:
    """Rebuild the survivor's ``data_dir`` as the one voter of a new incarnation, from
    its snapshot and every entry in its log, committed or not."""
    started = time.monotonic()
    target = os.fspath(data_dir)
    if not is_data_dir(RealFS(), target):
        raise IncarnationError(f"{target} is not a data directory: nothing to recover from")
    config = _owner_config(target)
    kept = target.rstrip("/") + BEFORE_RECOVER_SUFFIX
    if os.path.exists(kept):
        raise IncarnationError(
            f"{kept} exists (an earlier recovery's copy): move it away first, then run "
            "dlm node recover again"
        )
    storage = DiskStorage.open(target, fsync=True)
    try:
        hard_state, _ = storage.initial_state()
        snap = storage.snapshot()
        machine = lock_machine_of(snap.data) if snap is not None else locks.LockStateMachine()
        last = storage.last_index()
        first = storage.first_index()
        # Every entry it holds, committed or not: an entry a client was told about is in
        # the log of a majority, and this survivor may be the only one of it left.
        for entry in storage.entries(first, last + 1) if last >= first else []:
            if entry.index <= machine.applied_index:
                continue
            if entry.kind is EntryKind.NORMAL:
                machine.apply(entry.index, entry.data)
            else:
                machine.skip(entry.index)
        term = max(hard_state.term, storage.term(last))
    finally:
        storage.close()
    members = {config.node_id: config.address}
    new = new_incarnation(
        machine, last_index=last, bump=bump, members=members, quarantine_ms=quarantine_ms
    )
    conf = ConfState(voters=(config.node_id,))
    one_voter = replace(
        config,
        peers={config.node_id: _addr_of(config)},
        join_members={},
        incarnation=new.index,
        made_by="recovered",
    )
    building = _build(target, one_voter, new, term, conf, rename=False)
    os.rename(target, kept)
    os.rename(building, target)
    _fsync_dir(os.path.dirname(os.path.abspath(target)))
    return Built(
        target,
        config.node_id,
        config.cluster,
        new,
        last,
        term,
        conf.voters,
        time.monotonic() - started,
        kept,
    )


def _check_free(target: str) -> None:
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise IncarnationError(
            f"{target} is not empty: restore builds a new data directory; give --data a new "
            "or empty directory (the old cluster's data must not be reused)"
        )


def _owner_config(target: str) -> NodeConfig:
    """The config the survivor's node.json records (id, cluster, addresses)."""
    import json

    try:
        meta = json.loads(Path(target, "node.json").read_text(encoding="utf-8"))
        node, cluster = str(meta["node"]), str(meta["cluster"])
    except (OSError, ValueError, KeyError, TypeError):
        raise IncarnationError(
            f"{target}/node.json is missing or damaged: it should name the member"
        ) from None
    base = NodeConfig.from_flags(
        node_id=node, listen=None, peers=None, data=target, cluster=cluster
    )
    try:
        recorded = check_data_dir(base)
    except ConfigError as exc:
        raise IncarnationError(str(exc)) from None
    assert recorded is not None
    listen = recorded.listen or (recorded.peers or {}).get(node) or base.listen
    return replace(
        base,
        listen=listen,
        peers={node: listen},
        advertise=recorded.advertise,
        incarnation=recorded.incarnation,
    )


def _addr_of(config: NodeConfig) -> tuple[str, int]:
    return config.advertise or config.peers.get(config.node_id) or config.listen


def _build(
    target: str,
    config: NodeConfig,
    new: NewIncarnation,
    term: int,
    conf: ConfState,
    *,
    rename: bool = True,
) -> str:
    """Write the new data directory at ``target + .building`` and (``rename``) move it
    to ``target``; returns where it is."""
    building = target.rstrip("/") + BUILDING_SUFFIX
    if os.path.exists(building):
        shutil.rmtree(building)  # an interrupted earlier run of ours
    try:
        with DiskStorage.open(building, fsync=True, bootstrap_conf=conf) as storage:
            storage.apply_snapshot(Snapshot(SnapshotMeta(new.index, term, conf), new.image))
            storage.set_hard_state(HardState(term, None, new.index))
        write_meta(replace(config, data_dir=Path(building)))
    except (StoreError, OSError) as exc:
        raise IncarnationError(f"cannot write {building}: {exc}") from None
    if rename:
        if os.path.isdir(target):
            os.rmdir(target)  # empty: checked before
        os.rename(building, target)
        _fsync_dir(os.path.dirname(os.path.abspath(target)))
        return target
    return building


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
