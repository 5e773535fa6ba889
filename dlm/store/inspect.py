"""A read-only report on a data directory, for operators (``dlm store inspect DIR``).

It never repairs, removes or locks anything, so it is safe on the directory of
a running node (the report may then be a moment stale) and on a copy taken
from a broken one. It says where every problem is: file and byte offset. It
also warns, without calling the store damaged, about terms and indexes above
2**62: they are valid, but only a runaway term (or a forged message before the
wire was bounded) gets there, and 2**63 is where the store stops.
"""

from __future__ import annotations

import os
from typing import Any

from dlm.store import NEAR_LIMIT, StoreCorrupted
from dlm.store.disk import SNAP_DIR, WAL_DIR
from dlm.store.fs import FileSystem, RealFS
from dlm.store.snapshot import decode_snapshot, list_snapshots
from dlm.store.state import load_state
from dlm.store.wal import replay, scan_dir


def inspect_store_json(
    path: str | os.PathLike[str], fs: FileSystem | None = None
) -> dict[str, Any]:
    """Everything known about the store at ``path`` as plain JSON-able data.

    Keys: ``path``, ``ok`` (no corruption found), ``problems`` (messages),
    ``warnings`` (messages that do not make it not ok), ``hard_state``,
    ``snapshots``, ``segments``, ``index_range`` and ``torn_tail`` (what
    recovery would cut off, or None).
    """
    fs = fs or RealFS()
    root = os.fspath(path)
    report: dict[str, Any] = {
        "path": root,
        "ok": True,
        "problems": [],
        "warnings": [],
        "hard_state": None,
        "snapshots": [],
        "segments": [],
        "index_range": None,
        "torn_tail": None,
    }
    problems: list[str] = report["problems"]
    warnings: list[str] = report["warnings"]

    def check_near_limit(where: str, **values: int) -> None:
        for name, value in values.items():
            if value > NEAR_LIMIT:
                warnings.append(
                    f"{where}: {name} {value} is above 2**62 (the store stops at 2**63); "
                    "find out what drives it up"
                )

    if not fs.isdir(root):
        problems.append(f"{root} is not a directory")
        report["ok"] = False
        return report

    try:
        stored = load_state(fs, root)
        if stored is not None:
            hs = stored.hard_state
            check_near_limit("hard state", term=hs.term, commit=hs.commit)
            report["hard_state"] = {
                "term": hs.term,
                "vote": hs.vote,
                "commit": hs.commit,
                "bootstrap_conf": None
                if stored.conf is None
                else {"voters": list(stored.conf.voters), "learners": list(stored.conf.learners)},
            }
    except StoreCorrupted as exc:
        problems.append(str(exc))
    except OSError as exc:
        problems.append(f"cannot read hard state: {exc}")

    snap_index, snap_term = 0, 0
    snap_dir = os.path.join(root, SNAP_DIR)
    if fs.isdir(snap_dir):
        for info in list_snapshots(fs, snap_dir):
            item: dict[str, Any] = {
                "name": info.name,
                "index": info.index,
                "term": info.term,
                "size": info.size,
                "ok": True,
            }
            try:
                snap = decode_snapshot(fs.read(os.path.join(snap_dir, info.name)), info.name)
                check_near_limit(f"snapshot {info.name}", index=info.index, term=info.term)
                item["voters"] = list(snap.meta.conf.voters)
                item["learners"] = list(snap.meta.conf.learners)
                snap_index, snap_term = snap.meta.index, snap.meta.term
            except StoreCorrupted as exc:
                item["ok"] = False
                item["problem"] = {"offset": exc.offset, "reason": exc.reason}
                problems.append(str(exc))
            report["snapshots"].append(item)

    wal_dir = os.path.join(root, WAL_DIR)
    if fs.isdir(wal_dir):
        scans = scan_dir(fs, wal_dir)
        for scan in scans:
            if scan.entries:
                check_near_limit(
                    f"wal segment {scan.name}",
                    index=max(e.index for e in scan.entries),
                    term=max(e.term for e in scan.entries),
                )
            seg: dict[str, Any] = {
                "name": scan.name,
                "size": scan.size,
                "version": scan.header.version if scan.header else None,
                "records": scan.records,
                "first_index": scan.entries[0].index if scan.entries else None,
                "last_index": scan.entries[-1].index if scan.entries else None,
                "prev_index": scan.header.prev_index if scan.header else None,
                "reset": scan.header.reset if scan.header else False,
                "status": "ok",
            }
            if scan.damaged_copy is not None:
                seg["status"] = "damaged copy of the last head"
                seg["problem"] = {
                    "offset": scan.damaged_copy[0],
                    "reason": "a crash interrupted its last write; the next start rewrites it",
                }
            if scan.problem is not None:
                seg["status"] = "torn tail" if scan.problem.torn else "corrupt"
                seg["problem"] = {"offset": scan.problem.offset, "reason": scan.problem.reason}
                if scan.problem.torn:
                    report["torn_tail"] = {
                        "segment": scan.name,
                        "offset": scan.problem.offset,
                        "bytes": scan.size - scan.problem.offset,
                        "reason": scan.problem.reason,
                    }
            report["segments"].append(seg)
        try:
            log = replay(scans, snap_index, snap_term)
            last = log.base_index + len(log.entries)
            report["index_range"] = {
                "first": log.base_index + 1,
                "last": last,
                "snapshot_index": snap_index,
                "entries": len(log.entries),
            }
        except StoreCorrupted as exc:
            problems.append(str(exc))
    report["ok"] = not problems
    return report


def inspect_store(path: str | os.PathLike[str], fs: FileSystem | None = None) -> str:
    """The same report as human-readable text."""
    r = inspect_store_json(path, fs)
    if r["problems"] == [f"{r['path']} is not a directory"]:
        return f"store {r['path']}: not a directory (no data dir there)"
    lines = [f"store {r['path']}: {'OK' if r['ok'] else 'CORRUPT'}"]
    hs = r["hard_state"]
    if hs is None:
        lines.append("hard state: none written")
    else:
        lines.append(f"hard state: term {hs['term']}, vote {hs['vote']}, commit {hs['commit']}")
        if hs["bootstrap_conf"] is not None:
            lines.append(f"  bootstrap voters: {', '.join(hs['bootstrap_conf']['voters'])}")
    lines.append(f"snapshots: {len(r['snapshots'])}")
    for s in r["snapshots"]:
        status = "ok" if s["ok"] else f"CORRUPT at byte {s['problem']['offset']}"
        lines.append(
            f"  {s['name']}  index {s['index']} term {s['term']}  {s['size']} bytes  {status}"
        )
    lines.append(f"wal segments: {len(r['segments'])}")
    for seg in r["segments"]:
        first, last = seg["first_index"], seg["last_index"]
        if first is None:
            span = "no entries"
        elif last >= first:
            span = f"entries {first}..{last}"
        else:
            span = f"entries from {first}, rewound to {last} (a conflicting suffix was replaced)"

        extra = ""
        if seg["reset"] and seg["prev_index"]:
            extra = f" (log restarts after snapshot index {seg['prev_index']})"
        if seg["version"] == 1:
            extra += " (format 1, from dlm 0.1: read, never appended to)"
        status = seg["status"]
        if "problem" in seg:
            status += f" at byte {seg['problem']['offset']}: {seg['problem']['reason']}"
        lines.append(f"  {seg['name']}  {seg['size']} bytes  {span}{extra}  {status}")
    rng = r["index_range"]
    if rng is not None:
        lines.append(
            f"log: indexes {rng['first']}..{rng['last']} ({rng['entries']} entries), "
            f"snapshot at {rng['snapshot_index']}"
        )
    if r["torn_tail"] is not None:
        t = r["torn_tail"]
        lines.append(
            f"torn tail: {t['bytes']} bytes at byte {t['offset']} of {t['segment']} "
            "(an interrupted write; the next start cuts it off)"
        )
    for problem in r["problems"]:
        lines.append(f"PROBLEM: {problem}")
    for warning in r["warnings"]:
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)
