"""What a member answers: lock results, reads and views turned into reply records.

The node machine decides *when* a client is answered (a proposal applied, a read round
confirmed); this room decides *what* it is told. Everything here is a function of the
lock state, the leader's lease clocks and the time passed in, so it is pure: no IO, no
clock, no randomness. The records themselves (dlm.wire's reply section) are shared with
the client, which reads the same fields back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dlm.node import locks
from dlm.node.leases import LeaseTracker
from dlm.node.locks.identities import ADMIN, ROLE_ADMIN, may_see
from dlm.node.proposals import being_expired
from dlm.node.quotas import limit_name, over_quota
from dlm.node.raft.core import RaftStatus
from dlm.records import NodeId
from dlm.views import (
    HolderView,
    LeasesPage,
    LeaseState,
    LeaseSummary,
    LocksPage,
    LockState,
    MemberEntry,
    MemberHealth,
    MembersView,
    Progress,
    StatusView,
    WaiterView,
)
from dlm.wire import (
    PAGE_MAX,
    ErrorCode,
    Get,
    LeaseEnded,
    LeaseInfo,
    LeaseOpened,
    LeaseTerms,
    ListLeases,
    ListLocks,
    LockGranted,
    LockQueued,
    LockReleased,
    Request,
    Runs,
    error,
    ok,
)

_LEASE_GONE_MESSAGES = {
    locks.LEASE_EXPIRED: "has expired",
    locks.LEASE_CLOSED: "was closed (released or revoked)",
    locks.LEASE_UNKNOWN: "does not exist (never opened, or ended longer ago than ended "
    "leases are remembered)",
}


def lease_gone(rid: int, lease: str, ended: str) -> dict[str, Any]:
    """The SESSION_EXPIRED reply for a lease that is not live, saying how it ended.

    ``ended`` (locks.LEASE_*) goes in a field of its own: a client of the previous
    release ignores it and keeps its own words, a newer client words its message by it,
    and a reply without it (from a member of the previous release) says nothing either way.
    """
    said = _LEASE_GONE_MESSAGES.get(ended)
    if said is None:
        return error(rid, ErrorCode.SESSION_EXPIRED, f"lease {lease!r} is not live")
    return error(rid, ErrorCode.SESSION_EXPIRED, f"lease {lease!r} {said}", ended=ended)


def denied(rid: int, message: str) -> dict[str, Any]:
    """The PERMISSION_DENIED reply: one line naming the identity, the action and what it
    lacks (identities.refusal)."""
    return error(rid, ErrorCode.PERMISSION_DENIED, message)


class Replies:
    """The replies of one member at one instant: ``mono`` for the leader's lease clocks,
    ``wall_ms`` for how long a lock has been held."""

    __slots__ = ("_locks", "_mono", "_tracker", "_viewer", "_wall_ms")

    def __init__(
        self,
        lock_state: locks.LockStateMachine,
        tracker: LeaseTracker,
        mono: float,
        wall_ms: int,
        viewer: str = ADMIN,
    ) -> None:
        self._locks = lock_state
        self._tracker = tracker
        self._mono = mono
        self._wall_ms = wall_ms
        self._viewer = viewer
        """The identity asking: a limited client sees only keys under its prefixes and
        its own leases (identities.py)."""

    def _sees_all(self) -> bool:
        return self._locks.identities.role_of(self._viewer) == ROLE_ADMIN

    # -- results of applied changes -------------------------------------------

    def answer(self, req: Request, result: locks.Result, *, doomed: bool = False) -> dict[str, Any]:
        """The frame answering ``req`` with the result of applying it; ``doomed``: the
        lease it joined or whose TTL it updated is being expired already."""
        rid = req.id
        if isinstance(result, locks.Granted):
            info = self._locks.lease_terms(result.lease)
            return LockGranted(
                key=result.key,
                token=result.token,
                lease=result.lease,
                ttl_ms=info.ttl_ms if info is not None else 0,
            ).frame(rid)
        if isinstance(result, locks.Queued):
            lease = getattr(req, "lease", "")
            return LockQueued(key=result.key, lease=lease, position=result.position).frame(rid)
        if isinstance(result, locks.Released):
            return LockReleased(
                key=result.key,
                released="lock" if result.held else "queue",
                token=result.token,
                lease_ended=result.lease_ended,
            ).frame(rid)
        if doomed and isinstance(result, locks.LeaseOpened | locks.LeaseUpdated):
            # An Expire for the lease is in the log already: a client that counted a fresh
            # TTL from its join, or the new TTL of its update, would outlive the lease.
            return being_expired(result.lease).reply(rid)
        if isinstance(result, locks.LeaseOpened):
            return LeaseOpened(
                lease=result.lease, ttl_ms=result.ttl_ms, incarnation=result.incarnation
            ).frame(rid)
        if isinstance(result, locks.LeaseClosed):
            return LeaseEnded(lease=result.lease, released=list(result.released)).frame(rid)
        if isinstance(result, locks.LeaseUpdated):
            return LeaseTerms(lease=result.lease, ttl_ms=result.ttl_ms).frame(rid)
        if isinstance(result, locks.Locked) and result.quarantined_until_ms is not None:
            return error(
                rid,
                ErrorCode.LOCKED,
                f"{result.key!r} is quarantined: the cluster was restored or recovered",
                key=result.key,
                holders=self._holders_wire(result.holders),
                retry_after_ms=result.retry_after_ms,
                quarantined_until_ms=result.quarantined_until_ms,
            )
        if isinstance(result, locks.Locked):
            return error(
                rid,
                ErrorCode.LOCKED,
                f"{result.key!r} is held",
                key=result.key,
                holders=self._holders_wire(result.holders),
                retry_after_ms=result.retry_after_ms,
            )
        if isinstance(result, locks.NotHeld):
            return error(
                rid,
                ErrorCode.NOT_HOLDER,
                f"this lease does not hold or wait for {result.key!r}",
                key=result.key,
                holders=self._holders_wire(result.holders),
            )
        if isinstance(result, locks.LeaseGone):
            return lease_gone(rid, result.lease, result.ended)
        if isinstance(result, locks.StaleRequest):
            return error(
                rid,
                ErrorCode.STALE_REQUEST,
                f"request {result.seq} was answered before and is not run again",
            )
        if isinstance(result, locks.Denied):
            return denied(rid, result.message)
        if isinstance(result, locks.IdentityChanged):
            return ok(rid, op=result.op, name=result.name)
        if isinstance(result, locks.SettingChanged):
            return ok(rid, setting=result.setting, value_ms=result.value_ms or None)
        if isinstance(result, locks.QuotaExceeded):
            kind = "leases" if result.what == "leases" else "locks"
            return error(
                rid,
                ErrorCode.QUOTA_EXCEEDED,
                over_quota(result.identity, kind, result.limit),
                limit=limit_name(kind),
                identity=result.identity,
            )
        assert isinstance(result, locks.Invalid)
        return error(rid, ErrorCode.BAD_REQUEST, result.message)

    # -- reads ----------------------------------------------------------------------

    def holders(self, holders: Iterable[locks.Holder]) -> list[HolderView]:
        """A lock's holders; the lease terms and clocks only where this member leads."""
        leading = self._tracker.leading
        wall_ms = self._wall_ms
        out = []
        for h in holders:
            ttl_ms = remaining = finished_at = hold_until = None
            if leading:
                info = self._locks.lease_terms(h.lease)
                if info is not None:
                    ttl_ms = info.ttl_ms
                    remaining = self._tracker.remaining_ms(h.lease, self._mono)
                    if info.finished_at_ms is not None:
                        finished_at = info.finished_at_ms
                        if remaining is not None:
                            hold_until = wall_ms + remaining
            out.append(
                HolderView(
                    lease=h.lease,
                    token=h.token,
                    granted_at_ms=h.granted_at_ms,
                    held_ms=max(0, wall_ms - h.granted_at_ms),
                    meta=dict(h.meta),
                    ttl_ms=ttl_ms,
                    remaining_ms=remaining,
                    finished_at_ms=finished_at,
                    hold_until_ms=hold_until,
                )
            )
        return out

    def _holders_wire(self, holders: Iterable[locks.Holder]) -> list[dict[str, Any]]:
        return [h.to_wire() for h in self.holders(holders)]

    @staticmethod
    def waiters(waiters: Iterable[locks.Waiter]) -> list[WaiterView]:
        return [
            WaiterView(lease=w.lease, since_ms=w.since_ms, position=i, meta=dict(w.meta))
            for i, w in enumerate(waiters, start=1)
        ]

    def lock(self, req: Get) -> LockState:
        state = self._locks.get(req.key)
        if state is None:
            return LockState(key=req.key, limit=1, holders=[], waiters=[])
        return self._lock_state(state)

    def _lock_state(self, state: locks.KeyView) -> LockState:
        delay = state.lock_delay
        remaining = None
        if delay is not None and self._tracker.leading:
            remaining = self._tracker.remaining_ms(locks.delay_lease(state.key), self._mono)
        return LockState(
            key=state.key,
            limit=state.limit,
            holders=self.holders(state.holders),
            waiters=self.waiters(state.waiters),
            lock_delay_ms=None if delay is None else delay.ms,
            lock_delay_lease=None if delay is None else delay.lease,
            lock_delay_until_ms=None if delay is None else delay.until_ms,
            lock_delay_remaining_ms=remaining,
        )

    def locks_page(self, req: ListLocks) -> LocksPage:
        views, cursor = self._locks.list_locks(req.prefix, after=req.after, limit=req.max)
        sees_all, table = self._sees_all(), self._locks.identities
        return LocksPage(
            locks=[
                self._lock_state(v)
                for v in views
                if sees_all or may_see(table, self._viewer, v.key)
            ],
            next=cursor,
        )

    def runs(self, req: Runs) -> dict[str, Any]:
        """The ``runs`` answer: a key's runs newest first, or the last run of each key
        under the prefix (a page, by key); only keys the viewer may see."""
        ledger, table = self._locks.ledger, self._locks.identities
        sees_all = self._sees_all()
        if req.key is not None:
            shown = sees_all or may_see(table, self._viewer, req.key)
            runs = ledger.runs_of(req.key) if shown else []
            return ok(req.id, key=req.key, runs=[run_item(r) for r in runs])
        last = [
            r
            for r in ledger.last_runs(req.prefix)
            if (req.after is None or r.key > req.after)
            and (sees_all or may_see(table, self._viewer, r.key))
        ]
        page = last[: req.max]
        cursor = page[-1].key if len(last) > req.max else None
        return ok(req.id, runs=[run_item(r) for r in page], next=cursor)

    def lease_info(self, req: LeaseInfo) -> dict[str, Any]:
        info = self._locks.lease(req.lease)
        if info is None:
            return lease_gone(req.id, req.lease, self._locks.lease_ending(req.lease))
        tracker = self._tracker
        remaining = tracker.remaining_ms(req.lease, self._mono) if tracker.leading else None
        return LeaseState(
            lease=req.lease,
            ttl_ms=info.ttl_ms,
            remaining_ms=remaining,
            keys=list(info.holding),
            waiting=list(info.waiting),
        ).frame(req.id)

    def leases_page(self, req: ListLeases) -> LeasesPage:
        views, cursor = self._locks.list_leases(after=req.after, limit=min(req.max, PAGE_MAX))
        tracker = self._tracker
        leading = tracker.leading
        if not self._sees_all():
            views = [v for v in views if self._locks.lease_owner(v.lease) == self._viewer]
        return LeasesPage(
            leases=[
                LeaseSummary(
                    id=v.lease,
                    ttl_ms=v.ttl_ms,
                    left_ms=tracker.remaining_ms(v.lease, self._mono) if leading else None,
                    holding=list(v.holding),
                    waiting=list(v.waiting),
                    meta=dict(v.meta),
                    owner=v.owner,
                )
                for v in views
            ],
            next=cursor,
        )


# -- views of the member and the cluster ---------------------------------------------

AddressOf = Callable[[NodeId | None], str | None]
LastContact = Callable[[NodeId], int | None]


def status_view(
    st: RaftStatus,
    *,
    learners: Iterable[NodeId],
    counts: locks.Counts,
    applied: int,
    cluster: str,
    version: int,
    cluster_version: int,
    address_of: AddressOf,
    last_contact_ms: LastContact,
    incarnation: int = 0,
    quarantine: locks.Quarantine | None = None,
    partition: int = 0,
    partitions: int = 1,
) -> StatusView:
    """What ``status`` answers: this member's view (``progress`` only from the leader)."""
    learner_set = set(learners)
    return StatusView(
        node=st.id,
        address=address_of(st.id),
        cluster=cluster,
        role=st.role.value,
        term=st.term,
        leader=st.leader,
        leader_address=address_of(st.leader),
        commit=st.commit,
        applied=applied,
        first_index=st.first_index,
        last_index=st.last_index,
        members=[
            MemberEntry(
                id=member,
                address=address_of(member),
                role="learner" if member in learner_set else "voter",
            )
            for member in (*st.voters, *sorted(learner_set))
        ],
        sessions=counts.sessions,
        locks=counts.locks,
        waiters=counts.waiters,
        version=version,
        cluster_version=cluster_version,
        incarnation=incarnation or None,  # left out for a cluster never restored
        quarantine_ms=None if quarantine is None else quarantine.ttl_ms,
        quarantined_until_ms=None if quarantine is None else quarantine.until_ms,
        # Both left out in a cluster of one partition (its reply is as it always was).
        partition=None if partitions == 1 else partition,
        partitions=None if partitions == 1 else partitions,
        progress={
            member: Progress(
                match=p.match,
                next=p.next,
                active=p.recent_active,
                last_contact_ms=last_contact_ms(member),
            )
            for member, p in st.progress.items()
        }
        if st.progress
        else None,
    )


def members_view(
    st: RaftStatus,
    *,
    learners: Iterable[NodeId],
    bootstrap: dict[str, str],
    incarnation: int = 0,
    address_of: AddressOf,
    answers: Callable[[NodeId], bool],
    last_contact_ms: LastContact,
    reason: Callable[[NodeId], str] = lambda member: "",
) -> MembersView:
    """What ``members`` answers: each member's role as this one sees it, its log, and why
    a learner is not a voter yet (``reason``)."""
    learner_set = set(learners)
    last = st.last_index
    members = []
    for member in (*st.voters, *sorted(learner_set)):
        progress = st.progress.get(member)
        if member == st.leader:
            role = "leader"
        elif member in learner_set:
            role = "learner"
        else:
            role = "follower"
        reachable = answers(member)
        if not reachable and role == "follower":
            role = "unknown"
        members.append(
            MemberHealth(
                id=member,
                address=address_of(member),
                role=role,
                match=progress.match if progress is not None else None,
                lag=last - progress.match if progress is not None and reachable else None,
                reachable=reachable,
                last_contact_ms=last_contact_ms(member),
                reason=reason(member),
            )
        )
    return MembersView(
        members=members, leader=st.leader, bootstrap=bootstrap, incarnation=incarnation or None
    )


def run_item(run: locks.Run) -> dict[str, Any]:
    """One run as the ``runs`` answer carries it (times: the leaders' wall clocks, ms)."""
    return {
        "key": run.key,
        "host": run.host,
        "user": run.user,
        "command": run.command,
        "start_ms": run.start_ms,
        "end_ms": run.end_ms,
        "exit_code": run.exit_code,
        "signal": run.signal,
        "token": run.token,
        "outcome": run.outcome,
        "skips": run.skips,
    }
