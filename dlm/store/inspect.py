"""A read-only report on a data directory, for operators (``dlm store inspect DIR``).

It never repairs, removes or locks anything, so it is safe on the directory of
a running node (the report may then be a moment stale) and on a copy taken
from a broken one. It says where every problem is: file and byte offset. It
names the member and cluster the directory belongs to, and the human report
says what its figures mean. Pointed at a directory that only holds data
directories (``/var/lib/dlm`` when the data is in ``/var/lib/dlm/n1``), it
says so and names them.
It also warns, without calling the store damaged, about terms and indexes above
2**62: they are valid, but only a runaway term (or a forged message before the
wire was bounded) gets there, and 2**63 is where the store stops.
"""

from __future__ import annotations

import json
import os
from typing import Any

from dlm.store import NEAR_LIMIT, StoreCorrupted
from dlm.store.disk import SNAP_DIR, WAL_DIR
from dlm.store.fs import FileSystem, RealFS
from dlm.store.snapshot import decode_snapshot, list_snapshots
from dlm.store.state import STATE_NAME, load_state
from dlm.store.wal import replay, scan_dir

OWNER_FILE = "node.json"
"""Written by write_meta (dlm.node.runtime.config.node_config) when a member first starts on
the directory."""

_MARKERS = (OWNER_FILE, STATE_NAME, WAL_DIR, SNAP_DIR)


def is_data_dir(fs: FileSystem, path: str) -> bool:
    """Whether ``path`` holds anything a member writes into its data directory."""
    return fs.isdir(path) and any(fs.exists(os.path.join(path, name)) for name in _MARKERS)


def data_dirs_inside(fs: FileSystem, path: str) -> list[str]:
    """The data directories directly inside ``path``, sorted."""
    found = []
    for name in sorted(fs.listdir(path)):
        child = os.path.join(path, name)
        if is_data_dir(fs, child):
            found.append(child)
    return found


def read_owner(fs: FileSystem, root: str) -> tuple[dict[str, Any] | None, str | None]:
    """(``{"id", "cluster"}`` from DIR/node.json or None, a problem with it or None)."""
    path = os.path.join(root, OWNER_FILE)
    if not fs.exists(path):
        return None, None
    try:
        meta = json.loads(fs.read(path).decode("utf-8"))
        node, cluster = meta["node"], meta["cluster"]
        if not isinstance(node, str) or not isinstance(cluster, str):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"{path} is damaged: it should name the member and cluster of this directory"
    incarnation = meta.get("incarnation", 0)
    owner: dict[str, Any] = {"id": node, "cluster": cluster}
    if isinstance(incarnation, int) and incarnation:
        owner["incarnation"] = incarnation  # restored or recovered (dlm node restore)
    return owner, None


def inspect_store_json(
    path: str | os.PathLike[str], fs: FileSystem | None = None
) -> dict[str, Any]:
    """Everything known about the store at ``path`` as plain JSON-able data.

    Keys: ``path``, ``ok`` (a data directory, and no corruption found),
    ``problems`` (messages), ``warnings`` (messages that do not make it not ok),
    ``data_dir`` (whether ``path`` is one), ``member``
    (``{"id", "cluster"}`` from node.json, or None), ``data_dirs_inside`` (when
    ``path`` is not a data directory but holds some), ``hard_state``,
    ``snapshots``, ``segments``, ``index_range`` and ``torn_tail`` (what
    recovery would cut off, or None).
    """
    fs = fs or RealFS()
    root = os.fspath(path)
    report: dict[str, Any] = {
        "path": root,
        "ok": True,
        "problems": [],
        "data_dir": False,
        "member": None,
        "data_dirs_inside": [],
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
    if not is_data_dir(fs, root):
        inside = data_dirs_inside(fs, root)
        report["data_dirs_inside"] = inside
        if inside:
            problems.append(
                f"{root} is not a data directory, but it holds "
                f"{'one' if len(inside) == 1 else len(inside)}: {', '.join(inside)}; "
                f"inspect {'it' if len(inside) == 1 else 'each'} with dlm store inspect"
            )
        else:
            problems.append(
                f"{root} is not a data directory (no {', '.join(_MARKERS)} in it, "
                "nor in any directory inside it)"
            )
        report["ok"] = False
        return report

    report["data_dir"] = True
    report["member"], owner_problem = read_owner(fs, root)
    if owner_problem is not None:
        problems.append(owner_problem)

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
                identities = _identities_of(snap.data)
                if identities is not None:
                    item["identities"] = identities
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
                "last_term": log.entries[-1].term if log.entries else log.base_term,
                "snapshot_index": snap_index,
                "entries": len(log.entries),
            }
        except StoreCorrupted as exc:
            problems.append(str(exc))
    report["ok"] = not problems
    return report


def inspect_store(path: str | os.PathLike[str], fs: FileSystem | None = None) -> str:
    """The same report as human-readable text, with what its figures mean."""
    r = inspect_store_json(path, fs)
    if r["problems"] == [f"{r['path']} is not a directory"]:
        return f"store {r['path']}: not a directory (no data dir there)"
    if not r["data_dir"]:
        return f"store {r['path']}: {r['problems'][0]}"
    lines = [f"store {r['path']}: {'OK' if r['ok'] else 'CORRUPT'}"]
    member = r["member"]
    if member is None:
        lines.append("member: unknown (no node.json: written when a member first starts here)")
    else:
        lines.append(f"member: {member['id']} of cluster {member['cluster']}")
    hs = r["hard_state"]
    if hs is None:
        lines.append("hard state: none written")
    else:
        lines.append(f"hard state: term {hs['term']}, vote {hs['vote']}, commit {hs['commit']}")
        lines.append(
            _note(
                "term: the newest election term this member has seen; vote: whom it voted "
                "for in that term"
            )
        )
        lines.append(
            _note(
                "commit: the highest entry known to be committed when the hard state was last "
                "written. It is saved lazily (with a new term or vote, and at a clean stop), so it "
                "may trail the log; 0 after a crash is normal: the member relearns it "
                "from the leader"
            )
        )
        if hs["bootstrap_conf"] is not None:
            lines.append(
                f"  bootstrap voters: {', '.join(hs['bootstrap_conf']['voters'])} "
                "(the member list given at first start; later changes are in the log)"
            )
    lines.append(f"snapshots: {len(r['snapshots'])}")
    for s in r["snapshots"]:
        status = "ok" if s["ok"] else f"CORRUPT at byte {s['problem']['offset']}"
        lines.append(
            f"  {s['name']}  index {s['index']} term {s['term']}  {s['size']} bytes  {status}"
        )
        for ident in s.get("identities", ()):
            prefixes = ", ".join(ident["prefixes"]) or "-"
            rotating = "  (rotating: 2 keys)" if ident["keys"] > 1 else ""
            lines.append(
                f"    identity {ident['name']}  role {ident['role']}  prefixes {prefixes}{rotating}"
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
            f"snapshot at {rng['snapshot_index']}; last entry: index {rng['last']} "
            f"term {rng['last_term']}"
        )
        lines.append(
            _note(
                "the entries this member has persisted, committed or not; those up to the "
                "snapshot index were compacted into the snapshot (a fencing token is the "
                "index of the entry that granted the lock). After losing a majority, recover "
                "the survivor whose last entry has the highest term, then the highest index "
                "(dlm node recover)"
            )
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


def _note(text: str) -> str:
    """An explanation under a figure, indented and wrapped for an 80-column terminal."""
    import textwrap

    return textwrap.fill(text, width=80, initial_indent="  ", subsequent_indent="  ")


def _identities_of(data: bytes) -> list[dict[str, Any]] | None:
    """The identity table a snapshot image holds (node image format 3 or 4), as names,
    roles, prefixes, how many keys and (format 4) the identity's own limits: never a key or
    verifier. None when it holds none."""
    import cbor2

    try:
        item = cbor2.loads(data)
    except Exception:
        return None
    if not isinstance(item, dict) or not isinstance(item.get("identities"), list):
        return None
    rows = []
    for row in item["identities"]:
        if isinstance(row, list) and len(row) in (4, 5) and isinstance(row[2], list):
            name, role, prefixes, keys = row[:4]
            count = len(keys) if isinstance(keys, list) else 0
            shown: dict[str, Any] = {
                "name": str(name),
                "role": str(role),
                "prefixes": [str(p) for p in prefixes],
                "keys": count,
            }
            if len(row) == 5 and isinstance(row[4], list) and len(row[4]) == 4:
                # Format 4: the identity's own quotas (null: the members' default).
                kinds = ("leases", "locks", "connections", "inflight")
                for kind, value in zip(kinds, row[4], strict=True):
                    shown[f"max_{kind}"] = value or None
            rows.append(shown)
    return rows
