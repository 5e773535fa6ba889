"""A small driver for the lock state machine tests: one log index per command, fed as bytes.

Commands go through ``encode_command`` and ``apply``, the path every follower
takes, so the tests also pin the log encoding. Each client has its own rising
seq, as the client library draws them; tests pass ``seq`` (and ``acked``) to
re-send a request or to acknowledge answers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import cbor2

from dlm.node.locks import (
    LEGACY_CLIENT,
    AcquireCommand,
    ApplyOutcome,
    CloseLeaseCommand,
    ClusterVersionCommand,
    Command,
    ExpireCommand,
    LockStateMachine,
    OpenLeaseCommand,
    Origin,
    ReleaseCommand,
    UpdateLeaseCommand,
    encode_command,
)

LEGACY = LEGACY_CLIENT
"""The client of a version-1 request (no client id; a random seq; no floor)."""


class Driver:
    """A lock machine at cluster ``version`` (the version entry, if any, is entry 1)."""

    def __init__(self, version: int = 2) -> None:
        self.sm = LockStateMachine()
        self.index = 0
        self.at_ms = 1_000
        self._seqs: dict[str, Iterator[int]] = {}
        if version >= 2:
            self.run(ClusterVersionCommand(version, self.now()))

    def run(self, cmd: Command) -> ApplyOutcome:
        self.index += 1
        return self.sm.apply(self.index, encode_command(cmd))

    def now(self) -> int:
        self.at_ms += 10
        return self.at_ms

    def origin(self, client: str, seq: int | None, acked: int) -> Origin:
        if seq is None:
            seq = next(self._seqs.setdefault(client, itertools.count(1)))
        return Origin(client, seq, acked)

    def open(
        self,
        lease: str,
        ttl_ms: int = 10_000,
        *,
        ephemeral: bool = False,
        meta: Mapping[str, str] | None = None,
        client: str = "c1",
        seq: int | None = None,
        acked: int = 0,
        owner: str = "",
        lock_delay_ms: int = 0,
    ) -> ApplyOutcome:
        origin = self.origin(client, seq, acked)
        return self.run(
            OpenLeaseCommand(
                lease,
                ttl_ms,
                origin,
                self.now(),
                ephemeral,
                dict(meta or {}),
                owner=owner,
                lock_delay_ms=lock_delay_ms,
            )
        )

    def close(
        self,
        lease: str,
        *,
        client: str = "c1",
        seq: int | None = None,
        acked: int = 0,
        revoke: bool = False,
    ) -> ApplyOutcome:
        origin = self.origin(client, seq, acked)
        return self.run(CloseLeaseCommand(lease, origin, self.now(), revoke=revoke))

    def acquire(
        self,
        lease: str,
        key: str,
        *,
        wait: bool = False,
        limit: int = 1,
        meta: Mapping[str, str] | None = None,
        client: str = "c1",
        seq: int | None = None,
        acked: int = 0,
    ) -> ApplyOutcome:
        origin = self.origin(client, seq, acked)
        return self.run(
            AcquireCommand(lease, key, wait, limit, dict(meta or {}), origin, self.now())
        )

    def release(
        self,
        lease: str,
        key: str,
        *,
        token: int | None = None,
        keep_lease: bool | None = None,
        client: str = "c1",
        seq: int | None = None,
        acked: int = 0,
    ) -> ApplyOutcome:
        """``keep_lease`` defaults as the node sets it: True for a version-1 request."""
        if keep_lease is None:
            keep_lease = client == LEGACY
        origin = self.origin(client, seq, acked)
        return self.run(ReleaseCommand(lease, key, token, keep_lease, origin, self.now()))

    def update(
        self,
        lease: str,
        ttl_ms: int,
        *,
        finished: bool = False,
        client: str = "c1",
        seq: int | None = None,
        acked: int = 0,
    ) -> ApplyOutcome:
        origin = self.origin(client, seq, acked)
        return self.run(UpdateLeaseCommand(lease, ttl_ms, finished, origin, self.now()))

    def expire(self, lease: str, incarnation: int | None = None) -> ApplyOutcome:
        """The leader's Expire; by default for the incarnation the lease has now."""
        if incarnation is None:
            view = self.sm.lease(lease)
            incarnation = 0 if view is None else view.incarnation
        return self.run(ExpireCommand(lease, incarnation, self.now()))

    def raise_version(self, version: int = 2) -> ApplyOutcome:
        return self.run(ClusterVersionCommand(version, self.now()))

    def holders(self, key: str) -> list[str]:
        view = self.sm.get(key)
        return [] if view is None else [h.lease for h in view.holders]

    def waiters(self, key: str) -> list[str]:
        view = self.sm.get(key)
        return [] if view is None else [w.lease for w in view.waiters]

    def table(self) -> object:
        """What readers see: leases, keys, holders, waiters and counts (not the remembered
        results): what a refused request must leave as it was."""
        return self.sm.list_leases(), self.sm.list_locks(), self.sm.counts()

    def image(self) -> object:
        """The whole replicated state (the snapshot) but the applied index and the log time,
        which every entry moves: what "changes nothing" compares."""
        item = cbor2.loads(self.sm.snapshot())
        item[1] = None
        if len(item) == 7:
            item[6] = None
        return item
