"""A chaos workload process: a library client taking locks, or the availability prober.

``python -m tests.chaos.worker CONFIG.json`` (a process of its own, so the
harness can SIGSTOP or SIGKILL it like any client host). Every operation is
recorded (record.py) with its invocation, completion and outcome; SIGTERM
ends the loop after the current iteration.

``lock`` mode, one iteration: open a lease (TTL from the config), renew it
from a KeepAlive (each renewal that counted is recorded: the checker derives
the client-side deadline from them), take a random key (at once, or queueing
for a while), and if the grant came in time do a read-modify-write on the
fenced store under its token, with some work in between; then release by
token and close the lease. Sometimes a linearizable ``get`` of a key instead.
A *careless* worker does not look at its deadline between the read and the
write (as a process paused by a GC between the check and the write would not):
when the harness pauses it longer than its TTL, its write is a zombie's, which
the store must refuse once a later holder has been there. While inside a
section a worker keeps ``STATUS`` (a file) at ``1``, so the harness can pause it
there.

``probe`` mode: one long lease, and every ``interval`` an acquire then a release
of a key of its own, with a short timeout: the availability timeline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dlm.client import ClusterUnavailable, DlmError, KeepAlive, LeaseLost, LockHeld, NotHolder
from dlm.client.clock import lease_clock
from dlm.client.core import new_lease_id
from dlm.client.sync import Client
from tests.chaos.record import Recorder
from tests.chaos.routed import install_routes
from tests.chaos.store import StoreClient, StoreRefused

_stopping = False


def _stop(_signum: int, _frame: Any) -> None:
    global _stopping
    _stopping = True


def _error_outcome(exc: BaseException) -> tuple[str, str]:
    """(outcome, detail) of a failed lock operation."""
    if isinstance(exc, LockHeld):
        return "fail", "held"
    if isinstance(exc, NotHolder):
        return "fail", "not_holder"
    if isinstance(exc, LeaseLost):
        return "fail", "lost"
    return "unknown", str(exc)[:200]


class LockWorker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name: str = config["name"]
        self.rng = random.Random(config["seed"])
        self.keys: list[str] = config["keys"]
        self.ttl_ms: int = config["ttl_ms"]
        self.careless: bool = config.get("careless", False)
        low, high = config.get("work", (0.05, 0.4))
        self.work = (float(low), float(high))
        self.rec = Recorder(config["history"], self.name)
        self.client = Client(config["cluster"], timeout=config.get("timeout", 5.0), rng=self.rng)
        self.store = StoreClient(config["store"])
        self.status = Path(config["status"]) if config.get("status") else None

    def _status(self, inside: bool) -> None:
        if self.status is not None:
            tmp = self.status.with_suffix(".tmp")
            tmp.write_text("1" if inside else "0")
            os.replace(tmp, self.status)

    def run(self) -> None:
        while not _stopping:
            if self.rng.random() < 0.15:
                self.get(self.rng.choice(self.keys))
            else:
                self.iteration()
            time.sleep(self.rng.uniform(0.02, 0.25))

    def get(self, key: str) -> None:
        op = self.rec.call("get", key=key)
        try:
            view = self.client.get(key)
        except DlmError as exc:
            self.rec.ret(op, "unknown", detail=str(exc)[:200])
            return
        holders = [(h.lease, h.token) for h in view.holders]
        self.rec.ret(op, "ok", holder=list(holders[0]) if holders else None)

    def _close(self, lease: str) -> None:
        op = self.rec.call("close", lease=lease)
        try:
            self.client.close_lease(lease)
        except DlmError as exc:
            self.rec.ret(op, "unknown", detail=str(exc)[:200])
            return
        self.rec.ret(op, "ok")

    def iteration(self) -> None:
        lease_id = new_lease_id()
        op = self.rec.call("open", lease=lease_id)
        try:
            lease = self.client.open_lease(self.ttl_ms, lease_id)
        except DlmError as exc:
            self.rec.ret(op, "unknown", detail=str(exc)[:200])
            self._close(lease_id)
            return
        self.rec.ret(op, "ok")
        self.rec.renew(lease.id, lease.confirmed_at, lease.ttl_ms)
        keeper = KeepAlive(
            self.client,
            lease,
            on_renewed=lambda sent, ttl: self.rec.renew(lease.id, sent, ttl),
        ).start()
        try:
            self._hold(lease.id, keeper)
        finally:
            keeper.stop()
            self._close(lease.id)

    def _hold(self, lease: str, keeper: KeepAlive) -> None:
        key = self.rng.choice(self.keys)
        wait = self.rng.choice((None, None, 1.0, 3.0))
        op = self.rec.call("acquire", key=key, lease=lease, wait=wait is not None)
        try:
            grant = self.client.acquire(lease, key, wait=wait, meta={"worker": self.name})
        except DlmError as exc:
            outcome, detail = _error_outcome(exc)
            self.rec.ret(op, outcome, detail=detail)
            return
        self.rec.ret(op, "ok", token=grant.token)
        if keeper.lost.is_set() or lease_clock() >= keeper.deadline:
            return  # the grant came too late to count on: close the lease, unused
        self._status(True)
        try:
            value = self._store("read", key, lease, grant.token, None)
            if value is not None:
                time.sleep(self.rng.uniform(*self.work))
                # A careful client looks at its deadline right before the write; the
                # careless one writes anyway (a pause between the two makes it a zombie).
                if self.careless or (not keeper.lost.is_set() and lease_clock() < keeper.deadline):
                    self._store("write", key, lease, grant.token, value)
        finally:
            self._status(False)
        op = self.rec.call("release", key=key, lease=lease, token=grant.token)
        try:
            released = self.client.release(lease, key, token=grant.token)
        except DlmError as exc:
            outcome, detail = _error_outcome(exc)
            self.rec.ret(op, outcome, detail=detail)
            return
        self.rec.ret(op, "ok", detail="" if released.held else "queue")

    def _store(self, f: str, key: str, lease: str, token: int, expected: int | None) -> int | None:
        op = self.rec.call(f, key=key, lease=lease, token=token)
        try:
            if f == "read":
                value = self.store.read(key, token, op)
            else:
                assert expected is not None
                value = self.store.write(key, token, expected, op)
        except StoreRefused:
            self.rec.ret(op, "fail", detail="refused")
            return None
        except OSError as exc:
            self.rec.ret(op, "unknown", detail=str(exc)[:200])
            return None
        self.rec.ret(op, "ok", value=value)
        return value


class Prober:
    """Acquire and release of a key of its own, every ``interval``: is the cluster serving?"""

    def __init__(self, config: dict[str, Any]) -> None:
        self.name: str = config["name"]
        self.key: str = config["key"]
        self.interval: float = config.get("interval", 0.1)
        self.rec = Recorder(config["history"], self.name)
        self.client = Client(
            config["cluster"],
            timeout=config.get("timeout", 1.0),
            attempt_timeout=config.get("attempt_timeout", 0.3),
            rng=random.Random(config["seed"]),
        )
        self.ttl_ms: int = config.get("ttl_ms", 5000)

    def run(self) -> None:
        lease: str | None = None
        keeper: KeepAlive | None = None
        while not _stopping:
            started = time.monotonic()
            if lease is None or (keeper is not None and keeper.lost.is_set()):
                if keeper is not None:
                    keeper.stop()
                lease, keeper = self._open()
            if lease is not None:
                self._probe(lease)
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        if keeper is not None:
            keeper.stop()

    def _open(self) -> tuple[str | None, KeepAlive | None]:
        lease_id = new_lease_id()
        op = self.rec.call("open", lease=lease_id)
        try:
            lease = self.client.open_lease(self.ttl_ms, lease_id)
        except DlmError as exc:
            self.rec.ret(op, "unknown", detail=str(exc)[:200])
            return None, None
        self.rec.ret(op, "ok")
        self.rec.renew(lease.id, lease.confirmed_at, lease.ttl_ms)
        keeper = KeepAlive(
            self.client, lease, on_renewed=lambda sent, ttl: self.rec.renew(lease.id, sent, ttl)
        ).start()
        return lease.id, keeper

    def _probe(self, lease: str) -> None:
        op = self.rec.call("acquire", key=self.key, lease=lease, wait=False, probe=True)
        try:
            grant = self.client.acquire(lease, self.key)
        except DlmError as exc:
            outcome, detail = _error_outcome(exc)
            self.rec.ret(op, outcome, detail=detail)
            return
        self.rec.ret(op, "ok", token=grant.token)
        op = self.rec.call("release", key=self.key, lease=lease, token=grant.token)
        try:
            released = self.client.release(lease, self.key, token=grant.token)
        except (ClusterUnavailable, DlmError) as exc:
            outcome, detail = _error_outcome(exc)
            self.rec.ret(op, outcome, detail=detail)
            return
        self.rec.ret(op, "ok", detail="" if released.held else "queue")


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    signal.signal(signal.SIGTERM, _stop)
    install_routes(config.get("routes", {}))
    if config.get("mode") == "probe":
        Prober(config).run()
    else:
        LockWorker(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
