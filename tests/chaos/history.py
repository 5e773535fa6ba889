"""Reads what a chaos run recorded into the checker's ``History``.

Sources, all under the run's directory: ``hist/*.jsonl`` (the workers, the
prober, the recovery clients, the runner's own events), ``hist/x*/runs.jsonl``
(each `dlm exec` run as its lane saw it: start, pid, exit code) with
``hist/x*/RUN.jsonl`` (what its CMD recorded), ``hist/store.jsonl`` (the store)
and ``cluster/n*.log`` (the members' JSON logs, for the ``lock_granted`` audit
events).

An operation whose completion was never recorded (its process was killed), or
whose outcome was unknown (a timeout), may take effect at any time after its
invocation: its completion is ``inf``. A `dlm exec` run becomes an acquire that
completes when its CMD starts (that is when it is known to hold the lock, with
the token CMD was given); one that never started CMD is a conflict (exit 75 of
a run that did not queue) or an unknown outcome, under the lease the audit log
shows was granted to that `dlm exec` process, if any.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.chaos.checker import (
    ACQUIRE,
    FAIL,
    HELD,
    INF,
    OK,
    UNKNOWN,
    AuditGrant,
    History,
    LeaseFacts,
    Op,
    Recovery,
    Renewal,
    StoreEvent,
)
from tests.chaos.record import read_records

LOCK_OPS = ("acquire", "release", "close", "get", "read", "write")
CONFLICT = 75


def _op(call: dict[str, Any], ret: dict[str, Any] | None) -> Op:
    outcome = UNKNOWN if ret is None else str(ret.get("outcome", UNKNOWN))
    holder = ret.get("holder") if ret is not None else None
    return Op(
        id=call["op"],
        client=call["client"],
        f=call["f"],
        key=call.get("key"),
        lease=call.get("lease"),
        call=float(call["t"]),
        ret=INF if ret is None or outcome == UNKNOWN else float(ret["t"]),
        outcome=outcome,
        token=(ret or {}).get("token", call.get("token")),
        detail=str((ret or {}).get("detail", "")),
        holder=(str(holder[0]), int(holder[1])) if isinstance(holder, list) else None,
        wait=bool(call.get("wait", False)),
    )


def read_audit(cluster_dir: Path) -> tuple[list[AuditGrant], dict[int, str]]:
    """Every ``lock_granted`` in the members' logs, and the lease granted to each `dlm exec`
    process (by the pid in its owner metadata)."""
    grants: list[AuditGrant] = []
    by_pid: dict[int, str] = {}
    for log in sorted(cluster_dir.glob("n*.log")):
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if '"lock_granted"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                grants.append(
                    AuditGrant(event["node"], event["key"], int(event["token"]), event["lease"])
                )
                owner = event.get("owner") or {}
                if "cmd" in owner and str(owner.get("pid", "")).isdigit():
                    by_pid[int(owner["pid"])] = event["lease"]
    return grants, by_pid


def load(workdir: Path) -> History:
    hist_dir = workdir / "hist"
    records: list[dict[str, Any]] = []
    for path in sorted(hist_dir.glob("*.jsonl")):
        if path.name != "store.jsonl":
            records.extend(read_records(path))
    audit, exec_leases = read_audit(workdir / "cluster")
    history = History(audit=audit)

    calls: dict[str, dict[str, Any]] = {}
    rets: dict[str, dict[str, Any]] = {}
    renewals: dict[str, list[Renewal]] = defaultdict(list)
    owner_of: dict[str, str] = {}
    killed: dict[str, float] = {}
    for r in records:
        kind = r.get("k")
        if kind == "call":
            calls[r["op"]] = r
            if r.get("lease"):
                owner_of.setdefault(r["lease"], r["client"])
        elif kind == "ret":
            rets[r["op"]] = r
        elif kind == "renew":
            renewals[r["lease"]].append(Renewal(float(r["sent"]), int(r["ttl_ms"]), float(r["t"])))
            owner_of.setdefault(r["lease"], r["client"])
        elif kind == "killed":
            killed[r["victim"]] = float(r["t"])
        elif kind == "recovery":
            available = r.get("available")
            history.recoveries.append(
                Recovery(
                    r["key"],
                    float(r["died"]),
                    float(r["healed"]),
                    None if available is None else float(available),
                    float(r["bound"]),
                )
            )
    for op_id, call in calls.items():
        if call["f"] in LOCK_OPS:
            history.ops.append(_op(call, rets.get(op_id)))
    for lease, items in renewals.items():
        client = owner_of.get(lease, "?")
        history.leases[lease] = LeaseFacts(client, renewals=items, killed_at=killed.get(client))

    frozen = {r["run"]: float(r["t"]) for r in records if r.get("k") == "frozen"}
    for lane_dir in sorted(p for p in hist_dir.iterdir() if p.is_dir()):
        _load_lane(lane_dir, history, frozen, exec_leases)

    history.store = [
        StoreEvent(
            r["op"],
            r["client_op"],
            r["key"],
            int(r["token"]),
            bool(r["accepted"]),
            int(r["highest_before"]),
            int(r["value_before"]),
            int(r["value_after"]),
            r.get("expected"),
            float(r["t"]),
        )
        for r in read_records(hist_dir / "store.jsonl")
    ]
    return history


def _load_lane(
    lane_dir: Path, history: History, frozen: dict[str, float], exec_leases: dict[int, str]
) -> None:
    runs: dict[str, dict[str, Any]] = {}
    for r in read_records(lane_dir / "runs.jsonl"):
        run = runs.setdefault(r["run"], {})
        run[r["k"]] = r
    for run_id, run in runs.items():
        start = run.get("exec_start")
        if start is None:
            continue
        end = run.get("exec_end")
        cmd = read_records(lane_dir / f"{run_id}.jsonl")
        calls = {r["op"]: r for r in cmd if r.get("k") == "call"}
        rets = {r["op"]: r for r in cmd if r.get("k") == "ret"}
        cmd_start = next((r for r in cmd if r.get("k") == "cmd_start"), None)
        freeze = frozen.get(run_id)
        invoked = float(start.get("started", start["t"]))
        if cmd_start is not None:
            lease = str(cmd_start["lease"])
            alive = [float(r["t"]) for r in cmd if "t" in r]
            before_freeze = [t for t in alive if freeze is None or t < freeze]
            history.leases[lease] = LeaseFacts(
                run_id,
                kind="exec",
                cmd_start=float(cmd_start["t"]),
                last_sign=max(before_freeze) if before_freeze else float(cmd_start["t"]),
                frozen_at=freeze,
            )
            history.ops.append(
                Op(f"{run_id}:acquire", run_id, ACQUIRE, str(cmd_start["key"]), lease, invoked,
                   float(cmd_start["t"]), OK, token=int(cmd_start["token"]))
            )  # fmt: skip
            for op_id, call in calls.items():
                history.ops.append(_op(call, rets.get(op_id)))
            continue
        code = end.get("code") if end is not None else None
        lease = exec_leases.get(int(start["pid"]), f"{run_id}:never-granted")
        history.leases[lease] = LeaseFacts(run_id, kind="exec")
        if code == CONFLICT:
            outcome, ret = FAIL, float(end["t"]) if end is not None else INF
        else:
            outcome, ret = UNKNOWN, INF
        history.ops.append(
            Op(f"{run_id}:acquire", run_id, ACQUIRE, str(start["key"]), lease, invoked, ret,
               outcome, detail=HELD if outcome == FAIL else f"exit {code}",
               wait=bool(start.get("wait")))
        )  # fmt: skip
