"""`dlm snapshot save` and `dlm snapshot inspect`: backup files of the replicated state.

``save`` asks the leader for an image at a committed index (the ``snapshot_save``
request: a header, then the image in chunks), and writes the backup file
atomically (dlm/store/backup.py): a file with the final name is always whole.
``inspect`` reads one back, checks it end to end (checksum, format, the image
itself), and says what it holds; any file that is not an intact backup exits 1
with one line naming the file and what is wrong.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any

from dlm.cli.exits import CANT_CREATE, CHECK_FAILED, USAGE, CliError, from_client_error
from dlm.cli.output import emit_json, say
from dlm.cli.settings import Settings
from dlm.store import format_bytes

IMAGE_TIMEOUT_S = 600.0
"""How long to wait for each part of the image (the first waits for the leader to build it)."""


def _writable_destination(path: str) -> str:
    """The directory ``path`` goes in, checked before the cluster is asked for anything."""
    if not path or path.endswith(os.sep):
        raise CliError("USAGE", f"FILE {path!r} must name a file, not a directory", USAGE)
    if os.path.isdir(path):
        raise CliError("USAGE", f"{path} is a directory; name the backup file to write", USAGE)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CliError("USAGE", f"cannot write {path}: directory {directory} does not exist", USAGE)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise CliError(
            "CANT_CREATE",
            f"cannot write {path}: no permission to write in {directory}",
            CANT_CREATE,
        )
    return directory


def save(settings: Settings, path: str) -> None:
    from dlm.client.errors import DlmError
    from dlm.store.backup import Backup, describe_write_error, write_backup_set

    _writable_destination(path)
    started = time.monotonic()
    taken_at_ms = int(time.time() * 1000)
    client = settings.connect()
    timeout = max(IMAGE_TIMEOUT_S, settings.timeout)
    parts: list[Backup] = []
    try:
        parts.append(_backup_of(*client.save_snapshot(image_timeout=timeout)))
        # A partitioned cluster: every partition's leader, in turn, each at its own
        # committed index (partition 0's greeting told the client the count).
        for partition in range(1, int(getattr(client, "partitions", 1))):
            try:
                taken = client.save_snapshot(image_timeout=timeout, partition=partition)
            except DlmError as exc:
                cli = from_client_error(exc)
                raise CliError(
                    cli.code,
                    f"partition {partition}: {cli.message} (nothing was written: run dlm "
                    "snapshot save again)",
                    cli.exit_code,
                ) from None
            parts.append(_backup_of(*taken))
    except DlmError as exc:
        raise from_client_error(exc) from None
    finally:
        client.close()
    try:
        size = write_backup_set(path, parts, taken_at_ms)
    except ValueError as exc:
        raise CliError("BAD_REPLY", f"the leader's backup cannot be written: {exc}", 70) from None
    except OSError as exc:
        raise CliError("CANT_CREATE", describe_write_error(path, exc), CANT_CREATE) from None
    seconds = time.monotonic() - started
    backup = parts[0]
    if len(parts) > 1:
        _saved_partitions(
            path, parts, size, seconds, taken_at_ms=taken_at_ms, as_json=settings.json
        )
    elif settings.json:
        emit_json(
            {
                "file": path,
                "cluster": backup.cluster,
                "index": backup.index,
                "term": backup.term,
                "taken_at": _iso(backup.taken_at_ms),
                "taken_at_ms": backup.taken_at_ms,
                "leader": backup.leader,
                "bytes": size,
                "seconds": round(seconds, 3),
            }
        )
    else:
        say(
            f"saved a backup of cluster {backup.cluster} at index {backup.index} "
            f"(term {backup.term}, from {backup.leader}) to {path}: "
            f"{format_bytes(size)} in {seconds:.1f}s"
        )


def _backup_of(header: Any, image: bytes) -> Any:
    from dlm.store.backup import Backup

    return Backup(
        cluster=header.cluster,
        index=header.index,
        term=header.term,
        taken_at_ms=header.taken_at_ms,
        voters=tuple(header.voters),
        learners=tuple(header.learners),
        image=image,
        leader=header.leader,
    )


def _saved_partitions(
    path: str, parts: list[Any], size: int, seconds: float, *, taken_at_ms: int, as_json: bool
) -> None:
    cluster = parts[0].cluster
    index = max(part.index for part in parts)
    if as_json:
        emit_json(
            {
                "file": path,
                "cluster": cluster,
                "partitions": len(parts),
                "index": index,
                "term": max(part.term for part in parts),
                "taken_at": _iso(taken_at_ms),
                "taken_at_ms": taken_at_ms,
                "leader": "",
                "bytes": size,
                "seconds": round(seconds, 3),
                "parts": [
                    {
                        "partition": p,
                        "index": part.index,
                        "term": part.term,
                        "taken_at_ms": part.taken_at_ms,
                        "leader": part.leader,
                    }
                    for p, part in enumerate(parts)
                ],
            }
        )
        return
    each = ", ".join(f"{p}: {part.index} from {part.leader}" for p, part in enumerate(parts))
    say(
        f"saved a backup of cluster {cluster}'s {len(parts)} partitions (indexes {each}) "
        f"to {path}: {format_bytes(size)} in {seconds:.1f}s"
    )


def inspect(path: str, as_json: bool) -> None:
    from dlm.node.snapshots import ImageContents, describe_image
    from dlm.store.backup import BackupError, read_backup_set

    try:
        backups = read_backup_set(path)
        contents: list[ImageContents] = []
        for partition, part in enumerate(backups.parts):
            try:
                contents.append(describe_image(part.image, part.index))
            except ValueError as exc:
                where = f"partition {partition}: " if backups.partitions > 1 else ""
                raise BackupError(path, f"{where}corrupt: {exc}") from None
    except BackupError as exc:
        raise CliError(
            "BACKUP_DAMAGED", f"not an intact backup: {exc}", CHECK_FAILED, file=path, intact=False
        ) from None
    size = os.path.getsize(path)
    backup, first = backups.parts[0], contents[0]
    if backups.partitions == 1:
        report = _part_report(backup, first)
        taken_at_ms, leader = backup.taken_at_ms, backup.leader
    else:
        # The whole cluster: each partition's image has its own index; a restore starts
        # every new partition above the highest.
        report = {
            "index": backups.index,
            "term": backups.term,
            "taken_at": _iso(backups.taken_at_ms),
            "taken_at_ms": backups.taken_at_ms,
            "leader": "",
            "leases": sum(c.leases for c in contents),
            "locks": sum(c.locks for c in contents),
            "waiters": sum(c.waiters for c in contents),
            "highest_token": max(c.highest_token for c in contents),
            "longest_ttl_ms": max(c.longest_ttl_ms for c in contents),
        }
        taken_at_ms, leader = backups.taken_at_ms, ""
    longest_source = (
        "recorded" if all(c.longest_ttl_source == "recorded" for c in contents) else "leases"
    )
    summary = report
    report = {
        "file": path,
        "intact": True,
        "format": backups.format,
        "bytes": size,
        "cluster": backup.cluster,
        # A one-partition backup's report is exactly the one of earlier releases.
        **({"partitions": backups.partitions} if backups.partitions > 1 else {}),
        **{k: summary[k] for k in ("index", "term", "taken_at", "taken_at_ms", "leader")},
        "voters": list(backup.voters),
        "learners": list(backup.learners),
        "addresses": first.addresses,
        "cluster_version": min(c.cluster_version for c in contents),
        **{
            k: summary[k] for k in ("leases", "locks", "waiters", "highest_token", "longest_ttl_ms")
        },
        "longest_ttl_source": longest_source,
    }
    if backups.partitions > 1:
        report["parts"] = [
            {"partition": i, **_part_report(part, c)}
            for i, (part, c) in enumerate(zip(backups.parts, contents, strict=True))
        ]
    if as_json:
        emit_json(report)
        return
    members = ", ".join(
        f"{m}{' (' + first.addresses[m] + ')' if m in first.addresses else ''}"
        for m in backup.voters
    )
    learners = ", ".join(
        f"{m}{' (' + first.addresses[m] + ')' if m in first.addresses else ''}"
        for m in backup.learners
    )
    source = (
        "the longest TTL the cluster recorded granting"
        if longest_source == "recorded"
        else "the longest TTL among the leases in the backup; the cluster recorded none"
    )
    index_line = f"{report['index']} (term {report['term']}; committed)"
    if backups.partitions > 1:
        index_line = f"{report['index']} (the highest of {backups.partitions} partitions)"
    lines = [
        f"backup {path}: intact (format {backups.format}, {format_bytes(size)})",
        f"  cluster        {backup.cluster}",
        *([f"  partitions     {backups.partitions}"] if backups.partitions > 1 else []),
        f"  index          {index_line}",
        f"  taken at       {_iso(taken_at_ms)} by {leader or 'unknown'}"
        if backups.partitions == 1
        else f"  taken at       {_iso(taken_at_ms)}",
        f"  voters         {members}",
        f"  learners       {learners or '-'}",
        f"  leases         {report['leases']}",
        f"  locks          {report['locks']} held, {report['waiters']} waiting",
        f"  highest token  {report['highest_token']}",
        f"  longest TTL    {_duration(report['longest_ttl_ms'])} ({source})",
    ]
    if backups.partitions > 1:
        lines.append("  PARTITION  INDEX  TERM  LEADER  LEASES  LOCKS  WAITING  HIGHEST TOKEN")
        lines.extend(
            f"  {row['partition']:>9}  {row['index']}  {row['term']}  {row['leader'] or '-'}  "
            f"{row['leases']}  {row['locks']}  {row['waiters']}  {row['highest_token']}"
            for row in report["parts"]
        )
    say("\n".join(lines))


def _part_report(backup: Any, contents: Any) -> dict[str, Any]:
    """What one partition's image says (for one partition: the whole backup)."""
    return {
        "index": backup.index,
        "term": backup.term,
        "taken_at": _iso(backup.taken_at_ms),
        "taken_at_ms": backup.taken_at_ms,
        "leader": backup.leader,
        "leases": contents.leases,
        "locks": contents.locks,
        "waiters": contents.waiters,
        "highest_token": contents.highest_token,
        "longest_ttl_ms": contents.longest_ttl_ms,
    }


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _duration(ms: int) -> str:
    if ms % 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"
