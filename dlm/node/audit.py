"""The audit trail of applied entries: what each one did to leases and locks, said once.

Every member applies the same entries, and each says what they did as log events
(lease_opened, lock_granted, lock_released, lease_closed, lease_expired...) and
counts it (grants, releases by how, expiries, how long locks were held and waited
for). A re-sent request answered from memory repeats the result of the first one:
its events are counted and logged when they happen, not when they are recalled.
Pure: part of the node machine (machine.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from dlm.node import locks
from dlm.node.outbox import Instant, Outbox


class Audit:
    """Says what applied entries did, and times holds and waits from their start."""

    def __init__(self, out: Outbox) -> None:
        self._out = out
        self._stats = out.stats
        self.granted_at: dict[tuple[str, str], float] = {}
        """When each (lease, key) hold began (monotonic)."""
        self.queued_at: dict[tuple[str, str], float] = {}
        """When each (lease, key) wait began (monotonic)."""

    def applied(
        self,
        outcome: locks.ApplyOutcome,
        dropped: int,
        machine: locks.LockStateMachine,
        now: Instant,
    ) -> None:
        """Says what the entry of ``outcome`` did; ``dropped``: the holds it ended (0 for a
        re-sent request answered from memory). Queued grants are said by ``granted``."""
        cmd = outcome.command
        result = outcome.result
        stats, log = self._stats, self._out.log
        if outcome.quarantine_ended:
            stats.quarantines_ended += 1
            log(
                "info",
                "quarantine_ended",
                index=outcome.index,
                granted=len(outcome.promotions),
            )
        elif isinstance(cmd, locks.ExpireCommand) and locks.delayed_key(cmd.lease) is not None:
            if isinstance(result, locks.LeaseClosed):
                stats.lock_delays_ended += 1
                log(
                    "info",
                    "lock_delay_ended",
                    key=locks.delayed_key(cmd.lease),
                    index=outcome.index,
                    granted=len(outcome.promotions),
                )
        elif isinstance(cmd, locks.QuarantineCommand):
            log("info", "quarantine_until", until_ms=cmd.until_ms, index=outcome.index)
        elif isinstance(cmd, locks.ExpireCommand) and isinstance(result, locks.LeaseClosed):
            stats.expiries += 1
            stats.locks_lost += len(result.released)
            log(
                "info",
                "lease_expired",
                lease=cmd.lease,
                index=outcome.index,
                released=list(result.released),
            )
            self.released(result.released, cmd.lease, "expired", outcome.index, now)
        elif isinstance(cmd, locks.ClusterVersionCommand):
            log("info", "cluster_version", version=machine.version, index=outcome.index)
        elif isinstance(cmd, locks.SettingsCommand):
            if isinstance(result, locks.SettingChanged):
                # An admin action: who set which cluster setting to what (0: unset).
                log(
                    "info",
                    "admin_action",
                    identity=cmd.by,
                    action="config_set",
                    target=cmd.setting,
                    value_ms=cmd.value_ms,
                    index=outcome.index,
                )
        elif isinstance(cmd, locks.IdentityCommand):
            if isinstance(result, locks.IdentityChanged):
                # An admin action: who did what to whom (never a key).
                said: dict[str, object] = {"role": cmd.role} if cmd.role else {}
                if cmd.prefixes:
                    said["prefixes"] = list(cmd.prefixes)
                if cmd.op == "limits":
                    # What the admin set (0: back to the default; -1, unchanged, not said).
                    kinds = ("leases", "locks", "connections", "inflight")
                    for kind, value in zip(kinds, cmd.limits, strict=True):
                        if value >= 0:
                            said[f"max_{kind}"] = value
                log(
                    "info",
                    "admin_action",
                    identity=cmd.by,
                    action="auth_set" if cmd.op == "limits" else f"auth_{cmd.op}",
                    target=cmd.name,
                    index=outcome.index,
                    **said,
                )
        elif isinstance(result, locks.Granted) and result.token == outcome.index:
            stats.grants += 1
            self.granted(result.lease, result.key, result.token, machine, now, queued=False)
        elif isinstance(result, locks.Released) and result.held and dropped > 0:
            lease = cmd.lease if isinstance(cmd, locks.ReleaseCommand) else ""
            self.released((result.key,), lease, "released", outcome.index, now)
        elif (
            isinstance(result, locks.LeaseClosed)
            and isinstance(cmd, locks.CloseLeaseCommand)
            and cmd.lease in outcome.ended
        ):
            log(
                "info",
                "lease_closed",
                lease=cmd.lease,
                index=outcome.index,
                released=list(result.released),
            )
            self.released(result.released, cmd.lease, "closed", outcome.index, now)
        elif isinstance(result, locks.LeaseOpened) and not result.joined and outcome.armed:
            log(
                "info",
                "lease_opened",
                lease=result.lease,
                ttl_ms=result.ttl_ms,
                index=outcome.index,
            )
        if outcome.delayed:
            stats.lock_delays_started += len(outcome.delayed)
            lease = getattr(cmd, "lease", "")
            for key in outcome.delayed:
                delay = machine.delays.get(key)
                log(
                    "info",
                    "lock_delay_started",
                    key=key,
                    lease=lease,
                    delay_ms=0 if delay is None else delay.ms,
                    index=outcome.index,
                )

    def granted(
        self,
        lease: str,
        key: str,
        token: int,
        machine: locks.LockStateMachine,
        now: Instant,
        *,
        queued: bool,
    ) -> None:
        meta = locks.holder_meta(machine, lease, key)
        self.granted_at[(lease, key)] = now.mono
        queued_at = self.queued_at.pop((lease, key), None)
        if queued_at is not None:
            self._stats.acquire_wait.observe(now.mono - queued_at)
        self._out.log("info", "lock_granted", key=key, token=token, lease=lease, owner=meta)

    def released(self, keys: Iterable[str], lease: str, how: str, index: int, now: Instant) -> None:
        for key in keys:
            self._stats.released(how)
            granted = self.granted_at.pop((lease, key), None)
            if granted is not None:
                self._stats.hold_time.observe(now.mono - granted)
            self._out.log("info", "lock_released", key=key, lease=lease, how=how, index=index)

    def forget_lease(self, lease: str) -> None:
        """A lease ended: its waits will not be granted."""
        for pair in [p for p in self.queued_at if p[0] == lease]:
            del self.queued_at[pair]

    def after_snapshot(self, machine: locks.LockStateMachine) -> None:
        """Holds and waits that ended inside an installed snapshot never pass through apply:
        forget when they began, or these maps would keep them for good."""
        for pair in [p for p in self.granted_at if not machine.holds(*p)]:
            del self.granted_at[pair]
        for pair in [p for p in self.queued_at if not machine.waits(*p)]:
            del self.queued_at[pair]
