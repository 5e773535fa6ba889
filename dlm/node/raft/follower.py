"""What a member that is not leading does with what it hears: the follower's half of the core.

Functions over the ``RaftMember`` they are given, split out of the core by role
(as etcd-io/raft keeps ``stepFollower``): accepting a leader's appends,
heartbeats and snapshot chunks, answering vote requests (every role answers
them), passing read answers on, and the timer rules a follower lives by (the
check-quorum lease and the narrowing of the election back-off). The core's
test seams (``_log_is_up_to_date``) are called through the node. Pure: no IO.
"""

from __future__ import annotations

from dlm.node.raft.member import RaftMember, SnapshotReceipt
from dlm.node.raft.membership import conf_after_entry
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
    VoteRequest,
    VoteResponse,
)
from dlm.records import Entry, EntryKind, NodeId, Snapshot

NARROW_AFTER = 8
"""Widened election timeouts (their base) that must pass with a leader before the back-off
narrows by one doubling: from the widest back to the configured range takes about 14 s at
dlm's 300 ms (8 x (1.2 + 0.6) s)."""


def on_leader_message(node: RaftMember, m: AppendEntries | Heartbeat | InstallSnapshot) -> None:
    """A leader's message at our term, once we follow its sender (timer reset)."""
    node._election_elapsed = 0
    node._in_round = False
    if node._failed_rounds:
        # A leader found after failed rounds: the timeout drawn while there was none
        # may be short; redraw it from the range a follower keeps (election_timeout_range).
        low, high = node.election_timeout_range()
        if node._randomized_timeout < low:
            node._randomized_timeout = node._rng.randrange(low, high)
    if isinstance(m, AppendEntries):
        _on_append_entries(node, m)
    elif isinstance(m, Heartbeat):
        _on_heartbeat(node, m)
    else:
        _on_install_snapshot(node, m)


def on_vote_request(node: RaftMember, m: VoteRequest, *, holds_campaign: bool) -> None:
    """Answer a (pre-)vote request; ``holds_campaign``: we are a follower, which holds off
    its own campaign after granting a pre-vote."""
    # Whatever our own configuration says, we answer: a candidate counts only the
    # voters of its configuration, and one that lists us may know of a promotion we
    # have not seen yet (refusing could leave the cluster leaderless). Only a member
    # whose removal is committed is sure never to be needed again.
    can_vote = not node._removed and (
        node._vote == m.src
        or (node._vote is None and node._leader is None)
        or (m.pre_vote and m.term > node._term)
    )
    granted = can_vote and node._log_is_up_to_date(m.last_log_index, m.last_log_term)
    if granted:
        node._in_round = True
    if granted and not m.pre_vote:
        node._vote = m.src
        node._election_elapsed = 0
    elif granted and holds_campaign:
        # A follower that would vote for this candidate holds its own campaign for one
        # randomized timeout, long enough for the candidate's real election to end.
        # Otherwise every follower whose timer fires within one pre-vote round trip of
        # another's also wins its pre-vote, they all stand, and with four or more
        # voters the votes can split round after round when latency is a sizeable
        # part of the election timeout. The leader is forgotten too: we judged it
        # gone, and keeping it would make the restarted timer look like its lease.
        node._leader = None
        node._election_elapsed = 0
    node._send(
        VoteResponse(
            group=node._group,
            # A granted pre-vote answers in the term it was asked about.
            term=m.term if granted and m.pre_vote else node._term,
            src=node._id,
            dst=m.src,
            granted=granted,
            pre_vote=m.pre_vote,
        )
    )


def refuse_read_index(node: RaftMember, m: ReadIndexRequest) -> None:
    node._send(
        ReadIndexResponse(
            group=node._group, term=node._term, src=node._id, dst=m.src, ctx=m.ctx, index=0
        )
    )


def on_read_index_response(node: RaftMember, m: ReadIndexResponse) -> None:
    # index 0 is a refusal; reporting it as ReadState(ctx, 0) would invite a stale read.
    if m.index > 0:
        node._read_states.append(ReadState(m.ctx, m.index))


def in_lease(node: RaftMember) -> bool:
    """Whether we heard from a live leader within the election timeout (check-quorum lease)."""
    cfg = node._cfg
    return (
        cfg.check_quorum
        and node._leader is not None
        # As widened as our own timeout: while we would not stand, nor may others.
        and node._election_elapsed < cfg.election_ticks << node._failed_rounds
    )


def narrow_back_off(node: RaftMember, *, leading: bool) -> None:
    """One tick with a leader: after ``NARROW_AFTER`` of its base timeouts in a row,
    the back-off narrows by one doubling. Not at once: on a lossy network the leader
    a round found is heard late now and then, and the configured timeout would give
    it up again, round after round (terms 4 to 16 in 20 s at 30 % packet loss)."""
    if not node._failed_rounds:
        return
    node._steady_ticks += 1
    if node._steady_ticks >= NARROW_AFTER * (node._cfg.election_ticks << node._failed_rounds):
        node._steady_ticks = 0
        node._failed_rounds -= 1
        if not leading:
            low, high = node.election_timeout_range()
            node._randomized_timeout = node._rng.randrange(low, high)


# -- the leader's messages --------------------------------------------------------


def _on_append_entries(node: RaftMember, m: AppendEntries) -> None:
    log = node._log
    if m.prev_index < log.committed:
        # Everything up to our commit matches the leader already (and may be compacted).
        send_append_response(node, m.src, reject=False, index=log.committed)
        return
    appended = log.maybe_append(m.prev_index, m.prev_term, m.commit, m.entries)
    if appended is not None:
        last_new, written_from = appended
        if written_from:
            _log_rewritten(node, written_from, m.entries)
        send_append_response(node, m.src, reject=False, index=last_new)
        return
    last = log.last_index()
    if m.prev_index > last:
        hint_index, hint_term = last, 0
    else:
        hint_index, hint_term = log.find_conflict_by_term(m.prev_index, m.prev_term)
    send_append_response(
        node, m.src, reject=True, index=m.prev_index, hint_index=hint_index, hint_term=hint_term
    )


def _log_rewritten(node: RaftMember, first: int, entries: tuple[Entry, ...]) -> None:
    """Our log holds ``entries`` from index ``first`` on: follow the configurations in them."""
    history = node._conf_history
    changed = history.latest_index >= first and history.truncate(first)
    conf = history.latest
    for entry in entries[first - entries[0].index :]:
        if entry.kind is EntryKind.CONF_CHANGE:
            new = conf_after_entry(conf, entry)
            if new is not None:
                history.push(entry.index, new)
                conf = new
                changed = True
    if changed:
        node._apply_conf(conf)


def send_append_response(
    node: RaftMember,
    to: NodeId,
    *,
    reject: bool,
    index: int,
    hint_index: int = 0,
    hint_term: int = 0,
) -> None:
    node._send(
        AppendEntriesResponse(
            group=node._group,
            term=node._term,
            src=node._id,
            dst=to,
            reject=reject,
            index=index,
            hint_index=hint_index,
            hint_term=hint_term,
        )
    )


def _on_heartbeat(node: RaftMember, m: Heartbeat) -> None:
    # The leader sends min(commit, our match), which we are known to hold.
    node._log.commit_to(m.commit)
    node._send(
        HeartbeatResponse(group=node._group, term=node._term, src=node._id, dst=m.src, ctx=m.ctx)
    )


def _on_install_snapshot(node: RaftMember, m: InstallSnapshot) -> None:
    log = node._log
    meta = m.meta
    end = m.offset + len(m.data)
    if meta.index <= log.committed:
        # Already covered (a retransmission after we installed it): report done.
        node._snap_receipt = None
        _send_snapshot_response(node, m.src, log.committed, end)
        return
    receipt = node._snap_receipt
    same = (
        receipt is not None
        and receipt.src == m.src
        and receipt.term == m.term
        and receipt.meta == meta
    )
    if m.offset == 0:
        if receipt is not None and same and receipt.size > 0:
            _send_snapshot_response(node, m.src, meta.index, receipt.size)
            return
        receipt = node._snap_receipt = SnapshotReceipt(m.src, m.term, meta, [])
    elif receipt is None or not same or m.offset > receipt.size:
        node._snap_receipt = None
        _send_snapshot_response(node, m.src, meta.index, 0, reject=True)
        return
    elif m.offset < receipt.size:
        _send_snapshot_response(node, m.src, meta.index, receipt.size)
        return
    receipt.chunks.append(m.data)
    receipt.size = end
    if not m.done:
        _send_snapshot_response(node, m.src, meta.index, end)
        return
    node._snap_receipt = None
    if log.match_term(meta.index, meta.term):
        # Our log already holds the snapshot's last entry: just fast-forward the commit.
        log.commit_to(meta.index)
    else:
        committed = log.committed
        log.restore(Snapshot(meta, b"".join(receipt.chunks)))
        history = node._conf_history
        conf = meta.conf if meta.conf.voters else history.latest
        # Keep the committed part: the runtime may still be applying (and taking
        # snapshots of) committed entries handed out before this snapshot.
        history.truncate(committed + 1)
        history.push(meta.index, conf)
        node._apply_conf(conf)
    _send_snapshot_response(node, m.src, meta.index, end)


def _send_snapshot_response(
    node: RaftMember, to: NodeId, index: int, next_offset: int, reject: bool = False
) -> None:
    node._send(
        InstallSnapshotResponse(
            group=node._group,
            term=node._term,
            src=node._id,
            dst=to,
            index=index,
            next_offset=next_offset,
            reject=reject,
        )
    )


def answer_stale_term(node: RaftMember, msg: Message) -> None:
    """A message from an older term. Answer only where that helps its sender catch up."""
    if isinstance(msg, AppendEntries):
        # Figure 2: reply false, with our term, so a deposed leader steps down. Under
        # check-quorum it may never see a higher-term vote (we refuse those in lease).
        send_append_response(node, msg.src, reject=True, index=msg.prev_index)
    elif isinstance(msg, Heartbeat | InstallSnapshot):
        node._send(HeartbeatResponse(group=node._group, term=node._term, src=node._id, dst=msg.src))
    elif isinstance(msg, VoteRequest) and msg.pre_vote:
        node._send(
            VoteResponse(
                group=node._group,
                term=node._term,
                src=node._id,
                dst=msg.src,
                granted=False,
                pre_vote=True,
            )
        )
