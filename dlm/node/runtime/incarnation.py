"""Building the data directories of a new cluster incarnation (the disk side).

``restore_member`` (``dlm node restore FILE``) builds one member's data directory
from a backup file; ``recover_member`` (``dlm node recover --force``) rebuilds a
survivor's directory as the only voter of a new incarnation, from everything its log
holds. What the new state is, and why it is safe, is decided by the pure
dlm/node/incarnation.py; here it is read and written.

``restore_partitioned`` builds a member of a partitioned cluster (or restores a
partitioned backup, or changes the partition count): the old partitions' states are
merged and split by the new count (the pure dlm/node/repartition.py), and every new
partition's directory ``DIR/p<i>`` is built as a member's, all starting above the
highest index of any old partition plus the jump; ``DIR/partitions.json`` records
the count (the layout `dlm node start --partitions` uses).

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
from dlm.store.backup import read_backup, read_backup_set
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
    partitions: int = 1
    """How many partitions the restored member has (its directory's layout)."""
    from_partitions: int = 1
    """How many partitions the backup had."""
    differing: tuple[int, ...] = ()
    """Old partitions whose identity table differed from partition 0's (which was copied)."""


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


def restore_partitioned(
    backup_path: str,
    config: NodeConfig,
    *,
    partitions: int,
    bump: int,
    quarantine_ms: int | None,
) -> Built:
    """Build ``config.data_dir`` for member ``config.node_id`` of a new incarnation with
    ``partitions`` partitions, from a backup of any partition count (re-hashing every
    key when the count changes). For ``partitions`` 1 the directory has the layout of
    one partition; else one directory per partition under it. Raises as
    ``restore_member``."""
    from dlm.node.repartition import RepartitionError, identities_differ, split

    started = time.monotonic()
    backups = read_backup_set(backup_path)
    target = os.fspath(config.data_dir)
    _check_free(target)
    olds = [lock_machine_of(part.image) for part in backups.parts]
    try:
        news = split(olds, partitions)
    except RepartitionError as exc:
        raise IncarnationError(f"{backup_path}: {exc}") from None
    members = {m: format_addr(*addr) for m, addr in config.peers.items()}
    # Every new partition starts above the highest index of EVERY old partition plus the
    # jump: a key that moved keeps rising tokens, whichever partition it came from.
    made = [
        new_incarnation(
            machine,
            last_index=backups.index,
            bump=bump,
            members=members,
            quarantine_ms=quarantine_ms,
        )
        for machine in news
    ]
    conf = ConfState(voters=tuple(sorted(config.peers)))
    first = made[0]
    base = replace(config, incarnation=first.index, made_by="restored")
    if partitions == 1:
        _build(target, base, first, backups.term, conf)
    else:
        _build_partitions(target, base, made, backups.term, conf)
    counts = locks.Counts(
        sessions=sum(n.counts.sessions for n in made),
        locks=sum(n.counts.locks for n in made),
        waiters=sum(n.counts.waiters for n in made),
    )
    summary = replace(
        first,
        counts=counts,
        quarantine_ms=max(n.quarantine_ms for n in made),
        longest_ttl_ms=max(n.longest_ttl_ms for n in made),
        warning=next((n.warning for n in made if n.warning), None),
    )
    return Built(
        target,
        config.node_id,
        config.cluster,
        summary,
        backups.index,
        backups.term,
        conf.voters,
        time.monotonic() - started,
        partitions=partitions,
        from_partitions=backups.partitions,
        differing=tuple(identities_differ(olds)),
    )


def _build_partitions(
    target: str, config: NodeConfig, made: list[NewIncarnation], term: int, conf: ConfState
) -> None:
    """Write DIR/p<i> for each new partition and DIR/partitions.json, beside ``target``
    first, then moved into place in one rename."""
    from dlm.node.runtime.config.node_config import partition_dir, write_partitions

    building = Path(target.rstrip("/") + BUILDING_SUFFIX)
    if building.exists():
        shutil.rmtree(building)  # an interrupted earlier run of ours
    try:
        building.mkdir(parents=True)
        for partition, new in enumerate(made):
            part = replace(
                config,
                data_dir=partition_dir(building, partition),
                partition=partition,
                partitions=len(made),
            )
            _build(os.fspath(part.data_dir), part, new, term, conf, rename=False, suffix="")
        write_partitions(replace(config, data_dir=building), len(made))
    except OSError as exc:
        raise IncarnationError(f"cannot write {building}: {exc}") from None
    if os.path.isdir(target):
        os.rmdir(target)  # empty: checked before
    os.rename(building, target)
    _fsync_dir(os.path.dirname(os.path.abspath(target)))


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
    suffix: str = BUILDING_SUFFIX,
) -> str:
    """Write the new data directory at ``target + suffix`` and (``rename``) move it
    to ``target``; returns where it is."""
    building = target.rstrip("/") + suffix
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
