"""`dlm node restore` and `dlm node recover`: a new cluster incarnation, from a backup or
from the survivor of a lost majority.

Both run with every member of the old cluster stopped (the runbook in README.md says
why) and build data directories only; the members are then started with `dlm node
start` as usual. The rules (token jump, quarantine, incarnation) are
dlm/node/incarnation.py's; the disk work is dlm/node/runtime/incarnation.py's.

Exit codes: 0 built; 1 the backup file is not an intact backup (or the survivor's data
directory is damaged); 2 anything the operator must change first (flags, a --data that is
not empty, `recover` without --force, a member still running on the directory).
"""

from __future__ import annotations

import sys
from typing import Any

from dlm.cli.exits import CHECK_FAILED, USAGE, CliError, usage_error
from dlm.cli.output import emit_json

RECOVER_WITHOUT_FORCE = (
    "dlm node recover rebuilds this survivor's data directory as the only voter of a new "
    "cluster incarnation, from everything its log holds (entries it never received are "
    "lost; its old directory is kept beside it as DIR.before-recover): stop every member "
    "of the old cluster first, then run it again with --force"
)


def _quarantine_ms(text: str | None) -> int | None:
    if text is None or not text.strip():
        return None
    from dlm.durations import DurationError, parse_duration_ms

    try:
        return parse_duration_ms(text)
    except DurationError as exc:
        raise usage_error(f"--quarantine: {exc}") from None


def _bump(text: str | None) -> int:
    from dlm.node.incarnation import IncarnationError, parse_bump

    try:
        return parse_bump(text)
    except IncarnationError as exc:
        raise usage_error(str(exc)) from None


def _partitions(text: str | None) -> int | None:
    """``--partitions P`` (None: the backup's count)."""
    if text is None or not text.strip():
        return None
    from dlm.partitioning import MAX_PARTITIONS, check_partitions

    raw = text.strip()
    problem = (
        check_partitions(int(raw))
        if raw.isdigit()
        else f"the partition count must be a whole number from 1 to {MAX_PARTITIONS}"
    )
    if problem is not None and raw.isdigit():
        problem = f"the partition count must be 1 to {MAX_PARTITIONS}"
    if problem is not None:
        raise usage_error(f"--partitions: {problem}, not {raw!r}")
    return int(raw)


def restore(
    backup_file: str,
    *,
    data: str,
    node_id: str,
    peers: str,
    cluster: str | None,
    bump: str | None,
    quarantine: str | None,
    as_json: bool,
    partitions: str | None = None,
) -> None:
    """Builds one member's data directory of the restored cluster (with ``partitions``
    partitions: the backup's count unless given, which is how the count changes)."""
    from dlm.node.incarnation import IncarnationError
    from dlm.node.runtime.config.node_config import ConfigError, NodeConfig
    from dlm.node.runtime.incarnation import restore_member, restore_partitioned
    from dlm.store import StoreError
    from dlm.store.backup import BackupError, read_backup_set

    bump_by, quarantine_ms = _bump(bump), _quarantine_ms(quarantine)
    wanted = _partitions(partitions)
    try:
        backups = read_backup_set(backup_file)
        config = NodeConfig.from_flags(
            node_id=node_id,
            listen=None,
            peers=peers,
            data=data,
            cluster=cluster if cluster is not None else backups.cluster,
        )
        count = backups.partitions if wanted is None else wanted
        if count == 1 and backups.partitions == 1:
            built = restore_member(backup_file, config, bump=bump_by, quarantine_ms=quarantine_ms)
        else:
            built = restore_partitioned(
                backup_file,
                config,
                partitions=count,
                bump=bump_by,
                quarantine_ms=quarantine_ms,
            )
    except BackupError as exc:
        raise CliError("NOT_A_BACKUP", str(exc), CHECK_FAILED) from None
    except (ConfigError, IncarnationError, StoreError, OSError) as exc:
        raise CliError("USAGE", str(exc), USAGE) from None
    _report("restored", built, backup_file, as_json)


def recover(
    *, data: str, force: bool, bump: str | None, quarantine: str | None, as_json: bool
) -> None:
    """Rebuilds a survivor's data directory as a one-voter cluster of a new incarnation."""
    if not force:
        raise usage_error(RECOVER_WITHOUT_FORCE)
    from dlm.node.incarnation import IncarnationError
    from dlm.node.runtime.config.node_config import ConfigError
    from dlm.node.runtime.incarnation import recover_member
    from dlm.store import StoreCorrupted, StoreError

    bump_by, quarantine_ms = _bump(bump), _quarantine_ms(quarantine)
    try:
        built = recover_member(data, bump=bump_by, quarantine_ms=quarantine_ms)
    except StoreCorrupted as exc:
        raise CliError("STORE_CORRUPTED", str(exc), CHECK_FAILED) from None
    except (ConfigError, IncarnationError, StoreError, OSError) as exc:
        raise CliError("USAGE", str(exc), USAGE) from None
    _report("recovered", built, None, as_json)


def _report(event: str, built: Any, backup_file: str | None, as_json: bool) -> None:
    new = built.incarnation
    if new.warning:
        sys.stderr.write(f"dlm: warning: {new.warning}\n")
    counts = new.counts
    report = {
        event: {
            "data_dir": built.data_dir,
            "node": built.node_id,
            "cluster": built.cluster,
            "incarnation": new.index,
            "from_index": built.old_index,
            "term": built.term,
            "first_index": new.index + 1,
            "members": list(built.members),
            "quarantine_ms": new.quarantine_ms,
            "longest_ttl_ms": new.longest_ttl_ms,
            "sessions": counts.sessions,
            "locks": counts.locks,
            "waiters": counts.waiters,
            "seconds": round(built.seconds, 3),
            "kept": built.kept,
            "backup": backup_file,
        }
    }
    partitions, before = built.partitions, built.from_partitions
    if partitions > 1 or before > 1:
        # A partitioned restore says how many partitions it made, from how many.
        report[event]["partitions"] = partitions
        report[event]["from_partitions"] = before
    differing = built.differing
    if differing:
        sys.stderr.write(
            "dlm: warning: the identities of partition(s) "
            f"{', '.join(str(p) for p in differing)} differed from partition 0's (an admin "
            "change some partitions did not take): every partition now has partition 0's\n"
        )
    if as_json:
        emit_json(report)
        return
    source = f"backup index {built.old_index}" if backup_file else f"last index {built.old_index}"
    out = sys.stdout
    out.write(
        f"{event} member {built.node_id} of cluster {built.cluster} into {built.data_dir}: "
        f"incarnation {new.index} ({source}, term {built.term}); every new fencing token is "
        f"above {new.index}\n"
    )
    if new.quarantine_ms:
        out.write(
            f"quarantine {new.quarantine_ms / 1000:g}s from when its first leader takes office "
            f"(longest lease TTL recorded: {new.longest_ttl_ms / 1000:g}s)\n"
        )
    else:
        out.write("no quarantine: locks are granted as soon as a leader serves\n")
    out.write(
        f"{counts.sessions} leases, {counts.locks} locks, {counts.waiters} waiters kept; "
        f"members {', '.join(built.members)}\n"
    )
    if partitions > 1 or before > 1:
        out.write(
            f"{partitions} partition(s) from the backup's {before}: every key re-hashed to its "
            f"partition, every partition's log above {new.index}\n"
        )
    if built.kept:
        out.write(f"the previous data directory is kept as {built.kept}\n")
    cluster = "" if built.cluster == "dlm" else f" --cluster-id {built.cluster}"
    out.write(
        f"next: dlm node start --id {built.node_id} --data {built.data_dir}{cluster}"
        + (" (once every member is restored)\n" if event == "restored" else "\n")
    )
