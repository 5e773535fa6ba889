"""The leader's half of the Raft core: its step and tick, replication, snapshots sent, reads.

Functions over the ``RaftMember`` they are given (its own room, split out by role
as etcd-io/raft keeps ``stepLeader``): ``step_leader`` is what a message does to
a leader, ``tick_leader`` what a tick does. Sends are coalesced: handlers only
mark followers dirty, and ``flush`` (called from ``has_ready``/``ready``) turns
the marks into messages. The core's test seam ``_maybe_commit`` (which asks
``_quorum_match_index``) is always called through the node, so that the
simulator's mutants that override either are heard. Pure: no IO, no clock.
"""

from __future__ import annotations

from dlm.node.raft.follower import narrow_back_off, on_vote_request
from dlm.node.raft.member import RaftMember
from dlm.node.raft.progress import Progress, ProgressState
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    ReadState,
    Role,
    TimeoutNow,
    VoteRequest,
)
from dlm.records import Entry, EntryKind, LogCompacted, LogUnavailable, NodeId

STALL_ROUNDS = 3
"""Heartbeat answers without progress after which the leader assumes its appends were lost."""


def step_leader(node: RaftMember, m: Message) -> None:
    """A message at our term (or one we adopted) reaches a leader."""
    if isinstance(m, AppendEntriesResponse):
        _on_append_response(node, m)
    elif isinstance(m, HeartbeatResponse):
        _on_heartbeat_response(node, m)
    elif isinstance(m, InstallSnapshotResponse):
        _on_install_snapshot_response(node, m)
    elif isinstance(m, VoteRequest):
        on_vote_request(node, m, holds_campaign=False)
    elif isinstance(m, ReadIndexRequest):
        leader_read(node, m.ctx, m.src)
    # Leader messages of our own term cannot come from another leader (drop them);
    # vote answers, TimeoutNow and read answers are for members that are not leading.


def tick_leader(node: RaftMember) -> None:
    node._election_elapsed += 1
    node._heartbeat_elapsed += 1
    cfg = node._cfg
    narrow_back_off(node, leading=True)
    # Give followers as long to answer as they give us: the same widened timeout.
    if node._election_elapsed >= cfg.election_ticks << node._failed_rounds:
        node._election_elapsed = 0
        if cfg.check_quorum:
            if not node._tracker.quorum_active(node._id):
                node._become_follower(node._term, None)
                return
            for _, pr in node._tracker.others(node._id):
                pr.recent_active = False
        node._lead_transferee = None  # a transfer that has not happened by now is abandoned
    if node._heartbeat_elapsed >= cfg.heartbeat_ticks:
        node._heartbeat_elapsed = 0
        node._heartbeat_due = True


def become_leader(node: RaftMember) -> None:
    node._in_round = False
    node._reset(node._term)
    node._role = Role.LEADER
    node._leader = node._id
    node._committed_in_term = False
    log = node._log
    tracker = node._tracker
    tracker.start_leading(log.last_index() + 1, node._cfg.max_inflight)
    me = tracker.progress[node._id]  # only a voter campaigns
    # Only what is already on our disk counts; the rest counts as advance() reports it.
    me.match = log.durable_index()
    me.recent_active = True
    # Raft 8: a no-op of our own term lets us commit (and learn) what earlier terms left.
    append_entry(node, b"")


def append_entry(node: RaftMember, data: bytes, kind: EntryKind = EntryKind.NORMAL) -> int:
    """Append to the leader's log; its own copy counts once advance() says it is durable."""
    log = node._log
    index = log.last_index() + 1
    log.append(Entry(index, node._term, data, kind))
    node._append_all = True
    return index


def on_commit_advanced(node: RaftMember) -> None:
    node._commit_bcast = True
    log = node._log
    if not node._committed_in_term and log.term_or_none(log.committed) == node._term:
        node._committed_in_term = True
        waiting = node._reads_waiting_commit
        node._reads_waiting_commit = []
        for ctx, requester in waiting:
            leader_read(node, ctx, requester)


def send_timeout_now(node: RaftMember, to: NodeId) -> None:
    node._send(TimeoutNow(group=node._group, term=node._term, src=node._id, dst=to))


# -- answers from followers ---------------------------------------------------


def _follower(node: RaftMember, peer: NodeId) -> Progress | None:
    if peer == node._id:
        return None
    return node._tracker.progress.get(peer)


def _on_append_response(node: RaftMember, m: AppendEntriesResponse) -> None:
    pr = _follower(node, m.src)
    if pr is None:
        return
    pr.recent_active = True
    log = node._log
    if m.reject:
        if not _accept_rejection(node, pr, m):
            return
        node._pending_append.add(m.src)
        return
    if m.index > log.last_index():
        return  # acknowledges entries we never had: not from our term
    if not pr.maybe_update(m.index):
        if pr.state is ProgressState.PROBE and m.index == pr.next - 1 == pr.match:
            # An empty probe confirmed where the follower's log ends: start streaming.
            pr.become_replicate()
            node._pending_append.add(m.src)
        return
    state = pr.state
    if state is ProgressState.PROBE:
        pr.become_replicate()
    elif state is ProgressState.SNAPSHOT:
        if pr.match >= pr.pending_snapshot:
            pr.become_replicate()
    else:
        pr.free_to(m.index)
    if node._maybe_commit():
        on_commit_advanced(node)
    node._pending_append.add(m.src)
    if m.src == node._lead_transferee and pr.match == log.last_index():
        send_timeout_now(node, m.src)


def _accept_rejection(node: RaftMember, pr: Progress, m: AppendEntriesResponse) -> bool:
    """Move ``next`` back after a rejection, skipping a whole conflicting term at once."""
    rejected = m.index
    if pr.state is ProgressState.REPLICATE:
        if rejected <= pr.match:
            return False  # stale: we know it matches there
    elif pr.state is ProgressState.PROBE:
        if rejected != pr.next - 1:
            return False  # an answer to an older probe
    else:
        return False
    if m.hint_term > 0:
        probe, _ = node._log.find_conflict_by_term(m.hint_index, m.hint_term)
    else:
        probe = m.hint_index
    new_next = max(min(rejected, probe + 1), pr.match + 1)
    pr.become_probe()
    pr.next = new_next
    return True


def _on_heartbeat_response(node: RaftMember, m: HeartbeatResponse) -> None:
    pr = _follower(node, m.src)
    if pr is None:
        return
    pr.recent_active = True
    pr.probe_sent = False
    if pr.match < node._log.last_index():
        if pr.match == pr.hb_match:
            pr.stall += 1
        else:
            pr.hb_match = pr.match
            pr.stall = 0
        if pr.stall >= STALL_ROUNDS:
            # Nothing we sent has been acknowledged for several round trips: assume
            # it was lost and start again from what the follower surely has.
            pr.stall = 0
            if pr.state is ProgressState.REPLICATE:
                pr.become_probe()
            elif pr.state is ProgressState.SNAPSHOT:
                pr.snap_need_send = True
        node._pending_append.add(m.src)
    else:
        pr.stall = 0
        if m.src == node._lead_transferee:
            send_timeout_now(node, m.src)  # the first one may have been lost
    tracker = node._tracker
    if m.ctx and tracker.is_voter(m.src):
        acks = node._read_only.ack(m.ctx, m.src)
        # Only voters of the configuration in force count, the leader too if it is one.
        if tracker.acks_reach_quorum(acks, node._id):
            for req in node._read_only.confirm(m.ctx):
                deliver_read(node, req.ctx, req.index, req.requester)


def _on_install_snapshot_response(node: RaftMember, m: InstallSnapshotResponse) -> None:
    pr = _follower(node, m.src)
    if pr is None:
        return
    pr.recent_active = True
    snap = pr.snapshot
    if pr.state is not ProgressState.SNAPSHOT or snap is None:
        return
    if m.reject:
        pr.snap_offset = 0
        pr.snap_need_send = True
    elif m.index >= snap.meta.index and (
        m.next_offset >= len(snap.data) or m.index > snap.meta.index
    ):
        # Installed, or the follower's commit already covers the snapshot.
        if m.index <= node._log.last_index():
            pr.maybe_update(m.index)
        pr.become_probe()
    elif m.index == snap.meta.index and m.next_offset > pr.snap_offset:
        pr.snap_offset = m.next_offset
        pr.snap_need_send = True
        pr.stall = 0
    else:
        return
    node._pending_append.add(m.src)


# -- reads -------------------------------------------------------------------------


def leader_read(node: RaftMember, ctx: bytes, requester: NodeId) -> None:
    commit = node._log.committed
    if not node._committed_in_term:
        # Until an entry of our term commits, our commit index may lag the cluster's
        # (even a lone voter's: it commits only what its disk confirmed).
        node._reads_waiting_commit.append((ctx, requester))
    elif node._tracker.quorum == 1 and node._tracker.is_voter(node._id):
        deliver_read(node, ctx, commit, requester)
    elif node._read_only.add(ctx, commit, requester):
        node._heartbeat_due = True


def deliver_read(node: RaftMember, ctx: bytes, index: int, requester: NodeId) -> None:
    if requester == node._id:
        node._read_states.append(ReadState(ctx, index))
    else:
        node._send(
            ReadIndexResponse(
                group=node._group,
                term=node._term,
                src=node._id,
                dst=requester,
                ctx=ctx,
                index=index,
            )
        )


# -- membership, as the leader sees it ---------------------------------------------


def after_committed_conf(node: RaftMember) -> None:
    """The configuration in force is committed: step down if it removed us, else let go of
    the members it removed."""
    me = node._id
    tracker = node._tracker
    if not tracker.is_voter(me):
        _step_down_removed(node)
        return
    for peer in tracker.departed(me):
        _send_farewell(node, peer, tracker.progress.pop(peer))


def _send_farewell(node: RaftMember, peer: NodeId, pr: Progress) -> None:
    """A member's removal committed: send it the log from its match on, with the commit.

    Best effort (it may be lost, or the entries compacted): it lets the member
    see its own removal committed, and so stop campaigning and report ``removed``.
    """
    log = node._log
    try:
        prev_term = log.term(pr.match)
        entries = log.entries(pr.match + 1, log.last_index() + 1, node._cfg.max_entries_bytes)
    except (LogCompacted, LogUnavailable):
        return
    node._send(
        AppendEntries(
            group=node._group,
            term=node._term,
            src=node._id,
            dst=peer,
            prev_index=pr.match,
            prev_term=prev_term,
            entries=tuple(entries),
            commit=log.committed,
        )
    )


def _step_down_removed(node: RaftMember) -> None:
    """Our own removal committed: hand over to the most caught-up voter and step down."""
    last = node._log.last_index()
    best = node._tracker.most_caught_up_voter()
    if best is not None and node._tracker.progress[best].match == last:
        send_timeout_now(node, best)
    flush(node)  # the commit news, so that the others learn the removal took effect
    node._become_follower(node._term, None)


# -- sending -------------------------------------------------------------------------


def flush(node: RaftMember) -> None:
    """Turn the pending sends of a leader into messages (coalescing proposals)."""
    if node._heartbeat_due:
        node._heartbeat_due = False
        _broadcast_heartbeat(node)
    append_all = node._append_all
    commit = node._commit_bcast
    pending = node._pending_append
    if not (append_all or commit or pending):
        return
    everyone = append_all or commit
    for peer, pr in node._tracker.others(node._id):
        if everyone or peer in pending:
            _send_appends(node, peer, pr, send_empty=commit)
    node._append_all = node._commit_bcast = False
    pending.clear()


def _broadcast_heartbeat(node: RaftMember) -> None:
    ctx = node._read_only.last_ctx()
    commit = node._log.committed
    for peer, pr in node._tracker.others(node._id):
        node._send(
            Heartbeat(
                group=node._group,
                term=node._term,
                src=node._id,
                dst=peer,
                commit=min(commit, pr.match),
                ctx=ctx,
            )
        )


def _send_appends(node: RaftMember, peer: NodeId, pr: Progress, send_empty: bool) -> None:
    if pr.state is ProgressState.SNAPSHOT:
        if pr.snap_need_send:
            _send_snapshot_chunk(node, peer, pr)
        return
    if not _send_append(node, peer, pr, send_empty):
        return
    last = node._log.last_index()
    # Pipeline the rest of a long backlog, up to the in-flight window.
    while pr.state is ProgressState.REPLICATE and pr.next <= last and not pr.is_paused():
        if not _send_append(node, peer, pr, False):
            break


def _send_append(node: RaftMember, peer: NodeId, pr: Progress, send_empty: bool) -> bool:
    if pr.is_paused():
        return False
    log = node._log
    last = log.last_index()
    if pr.next > last and pr.state is ProgressState.REPLICATE:
        if not send_empty:
            return False
        # Commit news only. Anchor it at match, which the follower surely holds, so
        # that it cannot be refused while our earlier appends are still in flight.
        anchor_term = log.term_or_none(pr.match)
        if anchor_term is None:
            return False  # compacted: the next heartbeat carries the commit instead
        node._send(
            AppendEntries(
                group=node._group,
                term=node._term,
                src=node._id,
                dst=peer,
                prev_index=pr.match,
                prev_term=anchor_term,
                entries=(),
                commit=log.committed,
            )
        )
        return True
    prev_index = pr.next - 1
    try:
        prev_term = log.term(prev_index)
        entries = (
            log.entries(pr.next, last + 1, node._cfg.max_entries_bytes) if pr.next <= last else []
        )
    except LogCompacted:
        return _start_snapshot(node, peer, pr)
    except LogUnavailable:
        pr.next = last + 1  # beyond our log: only a confused ack leads here
        return False
    node._send(
        AppendEntries(
            group=node._group,
            term=node._term,
            src=node._id,
            dst=peer,
            prev_index=prev_index,
            prev_term=prev_term,
            entries=tuple(entries),
            commit=log.committed,
        )
    )
    if entries:
        pr.sent_entries(entries[-1].index)
    elif pr.state is ProgressState.PROBE:
        pr.probe_sent = True
    return True


def _start_snapshot(node: RaftMember, peer: NodeId, pr: Progress) -> bool:
    snap = node._log.snapshot()
    if snap is None:
        return False
    pr.become_snapshot(snap)
    _send_snapshot_chunk(node, peer, pr)
    return True


def _send_snapshot_chunk(node: RaftMember, peer: NodeId, pr: Progress) -> None:
    snap = pr.snapshot
    if snap is None:
        return
    data = snap.data
    offset = min(pr.snap_offset, len(data))
    end = min(offset + node._cfg.snapshot_chunk_bytes, len(data))
    pr.snap_need_send = False
    node._send(
        InstallSnapshot(
            group=node._group,
            term=node._term,
            src=node._id,
            dst=peer,
            meta=snap.meta,
            offset=offset,
            data=data[offset:end],
            done=end >= len(data),
        )
    )
