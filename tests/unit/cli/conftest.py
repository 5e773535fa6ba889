"""Doubles for the cluster: a scripted client and a KeepAlive the test decides for.

The CLI is tested in-process through dlm.cli.main.run (which returns the exit
code), with Settings.connect patched to hand out FakeClient, so no socket is
opened. Tests against real nodes live in tests/cluster/test_cli_*.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from dlm.cli.settings import Settings
from dlm.client.clock import lease_clock
from dlm.client.core import Grant, Lease, ReleaseOutcome
from dlm.views import LeaseSummary, LockState, StatusView


class FakeClient:
    """Answers like a one-member cluster; ``fail`` maps a method name to the error to raise."""

    instances: list[FakeClient] = []

    def __init__(self, members: list[str], timeout: float, dial_timeout: float = 2.0) -> None:
        self.members = members
        self.timeout = timeout
        self.dial_timeout = dial_timeout
        self.calls: list[tuple[str, Any]] = []
        self.options: dict[str, dict[str, Any]] = {}  # method -> keyword arguments of its last call
        self.fail: dict[str, Exception] = {}
        self.leases: list[dict[str, Any]] = []
        self.closed = False
        self.traced_as: str | None = None
        self.run_reports: list[Any] = []
        self.run_rows: list[dict[str, Any]] = []
        """What ``runs`` answers (the cluster's run ledger rows)."""
        """The run ledger report of each close_lease / update_lease, in order."""
        FakeClient.instances.append(self)

    def _call(self, name: str, *args: Any, **options: Any) -> None:
        self.calls.append((name, args))
        self.options[name] = options
        error = self.fail.get(name)
        if error is not None:
            raise error

    default_ttl_ms = 30_000
    """The fake cluster's default-ttl: the TTL of a lease opened without one."""

    def open_lease(
        self,
        ttl_ms: int | None,
        lease: str | None = None,
        *,
        ephemeral: bool = False,
        meta: dict[str, str] | None = None,
        lock_delay_ms: int = 0,
        near: Sequence[str] = (),
    ) -> Lease:
        # ``near`` (where to open it in a cluster of several partitions) is not recorded:
        # the calls a test expects are the one-partition cluster's.
        delay = {"lock_delay_ms": lock_delay_ms} if lock_delay_ms else {}
        self._call("open_lease", ttl_ms, ephemeral=ephemeral, meta=meta, **delay)
        got = self.default_ttl_ms if ttl_ms is None else ttl_ms
        return Lease(id=lease or "fakelease0000001", ttl_ms=got, confirmed_at=lease_clock())

    def acquire(
        self, lease: Any, key: str, *, wait: float | None, limit: int, meta: dict[str, str]
    ) -> Grant:
        self._call("acquire", lease, key, wait, limit, meta)
        lid = lease.id if isinstance(lease, Lease) else lease
        ttl = lease.ttl_ms if isinstance(lease, Lease) else 30000
        return Grant(key=key, token=4242, lease=lid, ttl_ms=ttl)

    def keepalive(self, lease: Any, *, timeout: float | None = None) -> int:
        self._call("keepalive", lease)
        return lease.ttl_ms if isinstance(lease, Lease) else 30000

    def release(
        self, lease: str, key: str, *, token: int | None = None, keep_lease: bool = True
    ) -> ReleaseOutcome:
        self._call("release", lease, key, token=token, keep_lease=keep_lease)
        return ReleaseOutcome(key, True, 4242 if token is None else token, not keep_lease)

    def close_lease(
        self, lease: Any, *, must_exist: bool = False, run: Any = None, revoke: bool = False
    ) -> list[str]:
        self._call("close_lease", lease, must_exist=must_exist, revoke=revoke)
        self.run_reports.append(run)
        return []

    def update_lease(
        self,
        lease: Any,
        ttl_ms: int,
        *,
        finished: bool = False,
        timeout: float | None = None,
        run: Any = None,
    ) -> int:
        self._call("update_lease", lease, ttl_ms, finished=finished, timeout=timeout)
        self.run_reports.append(run)
        return ttl_ms

    def runs(self, key: str | None = None) -> list[dict[str, Any]]:
        self._call("runs", key)
        if key is None:
            return list(self.run_rows)
        return [row for row in self.run_rows if row.get("key") == key]

    def list_leases(self) -> list[LeaseSummary]:
        self._call("list_leases")
        return [LeaseSummary.from_wire(lease) for lease in self.leases]

    def get(self, key: str) -> LockState:
        self._call("get", key)
        return LockState.from_wire({"key": key, "limit": 1, "holders": [], "waiters": []})

    def list_locks(self, prefix: str = "") -> list[LockState]:
        self._call("list_locks", prefix)
        return []

    partitions = 1
    """The cluster's partition count, as a greeting told the client."""

    def spawn(self) -> FakeClient:
        return FakeClient(self.members, self.timeout, self.dial_timeout)

    def status(self, *, partition: int = 0) -> StatusView:
        self._call("status", partition=partition)
        return StatusView.from_wire(
            {
                "node": "n1",
                "address": "127.0.0.1:7700",
                "cluster": "dlm",
                "role": "leader",
                "term": 3,
                "leader": "n1",
                "leader_address": "127.0.0.1:7700",
                "commit": 10,
                "applied": 10,
                "members": [
                    {"id": "n1", "address": "127.0.0.1:7700"},
                    {"id": "n2", "address": "127.0.0.1:7701"},
                ],
                "sessions": 2,
                "locks": 1,
                "waiters": 0,
            }
        )

    def member_status(self, addr: str, timeout: float = 2.0) -> StatusView | None:
        if addr.endswith(":7701"):
            return None
        return StatusView.from_wire(
            {"node": "n1", "role": "leader", "term": 3, "commit": 10, "applied": 9}
        )

    def auth_change(self, request: Any) -> dict[str, Any]:
        self._call("auth_change", request)
        return {"op": request.TYPE.removeprefix("auth_"), "name": request.name}

    def identities(self) -> list[dict[str, Any]]:
        self._call("identities")
        return [dict(row) for row in IDENTITY_ROWS]

    def close(self) -> None:
        self.closed = True


IDENTITY_ROWS = [
    {
        "name": "ci",
        "role": "client",
        "prefixes": ["ci/"],
        "key_id": "00112233aabbccdd",
        "rotating": False,
        "old_key_until_ms": None,
        "max_leases": 2,
        "max_locks": None,
        "max_connections": None,
        "max_inflight": 64,
    },
    {
        "name": "ops",
        "role": "admin",
        "prefixes": [],
        "key_id": "ffeeddccbbaa9988",
        "rotating": False,
        "old_key_until_ms": None,
        "max_leases": None,
        "max_locks": None,
        "max_connections": None,
        "max_inflight": None,
    },
]
"""What the fake cluster's `dlm auth list` answers."""


class FakeKeepAlive:
    """Stands in for dlm.client.sync.KeepAlive; ``lose()`` plays a lease loss."""

    instances: list[FakeKeepAlive] = []

    def __init__(
        self,
        client: Any,
        lease: Any,
        *,
        confirmed_at: float | None = None,
        ttl_ms: int | None = None,
        on_lost: Callable[[str], None] | None = None,
        deadline_of: Callable[[float, int], float] | None = None,
        on_renewed: Callable[[float, int], None] | None = None,
    ) -> None:
        self.lease = lease.id if isinstance(lease, Lease) else lease
        self.ttl_ms = ttl_ms or (lease.ttl_ms if isinstance(lease, Lease) else 30000)
        if confirmed_at is None:
            confirmed_at = lease.confirmed_at if isinstance(lease, Lease) else lease_clock()
        self.confirmed_at = confirmed_at
        self.on_lost = on_lost
        self.on_renewed = on_renewed
        self.lost = threading.Event()
        self.reason: str | None = None
        self.renewals = 0
        self.started = threading.Event()
        self.halted = False
        """Renewals stopped (``halt``), the threads perhaps not joined yet."""
        self.stopped = False
        FakeKeepAlive.instances.append(self)

    @property
    def running(self) -> bool:
        return self.started.is_set() and not self.halted

    def start(self) -> FakeKeepAlive:
        self.started.set()
        return self

    def halt(self) -> None:
        self.halted = True

    def stop(self, timeout: float = 2.0) -> None:
        self.halted = True
        self.stopped = True

    def confirmed(self, sent: float, ttl_ms: int) -> bool:
        """A renewal the caller made: counts (as the real one's does before its deadline)."""
        self.confirmed_at = max(self.confirmed_at, sent)
        self.ttl_ms = ttl_ms
        self.renewals += 1
        if self.on_renewed is not None:
            self.on_renewed(sent, ttl_ms)
        return not self.lost.is_set()

    def lose(self, reason: str = "planted loss") -> None:
        self.reason = reason
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost(reason)


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeClient]]:
    FakeClient.instances.clear()
    FakeKeepAlive.instances.clear()

    def connect(self: Settings, traced_as: str | None = None) -> FakeClient:
        client = FakeClient(list(self.members), self.timeout, self.dial_timeout)
        client.traced_as = traced_as  # the command's span name (dlm/tracing.py)
        return client

    monkeypatch.setattr(Settings, "connect", connect)
    monkeypatch.setattr("dlm.client.sync.KeepAlive", FakeKeepAlive)
    monkeypatch.delenv("DLM_CLUSTER", raising=False)
    yield FakeClient
