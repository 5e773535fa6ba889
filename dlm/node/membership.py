"""Membership: the address book, and the decisions about who is a member.

The address book holds every member's address, from the bootstrap configuration,
the snapshot image and the membership entries (each carries the address of the
member it adds, known from the moment the entry is in our log), plus the ids of
removed members (never reused) and, bounded, the addresses that peers our log does
not name gave in their hellos. From it come the peers to keep links to, whether a
peer's hello is accepted, and the leader's membership decisions: whether an add,
promote or remove request may be made (quorum after a removal, the address in use,
the leader handing over before it goes), which learners are caught up enough to
vote, and which voter should lead next. Pure: part of the node machine (machine.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dlm.node.outbox import Instant, NotLeaderReply, Outbox, PeersChanged
from dlm.node.proposals import Refusal, upgrading
from dlm.node.raft.core import RaftNode
from dlm.node.raft.types import ConfChangeRefused, NotLeader
from dlm.records import (
    ConfChange,
    ConfChangeDecodeError,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    LogStorage,
    NodeId,
    decode_conf_change,
)
from dlm.wire import (
    ErrorCode,
    MemberAdd,
    MemberChange,
    MemberPromote,
    MemberRemove,
    error,
    parse_addr,
)

if TYPE_CHECKING:
    from dlm.node.machine_config import MachineConfig

PROMOTE_LAG = 64
"""A learner this close to the leader's log (in entries) is caught up: it may vote."""
REMOVED = "was removed from this cluster"
"""Words a member uses when it refuses a peer it knows was removed (the peer then stops, if
the refusal is authenticated: admission.py)."""
MAX_UNLISTED_PEERS = 16
"""Peers our log does not name whose addresses we keep (a stranger must not grow it)."""

_EVENTS = {
    ConfChangeKind.ADD_LEARNER: "member_added",
    ConfChangeKind.PROMOTE: "member_promoted",
    ConfChangeKind.REMOVE: "member_removed",
}


class Membership:
    """One member's address book and membership decisions."""

    def __init__(self, config: MachineConfig, out: Outbox, not_leader: NotLeaderReply) -> None:
        self._config = config
        self._me = config.node_id
        self._out = out
        self._not_leader = not_leader
        self.addresses: dict[NodeId, str] = dict(config.peers)
        self.removed: set[NodeId] = set()
        self.unlisted: dict[NodeId, str] = {}
        """Addresses from the hellos of peers our log does not name (see ``refusal``)."""
        self.proposals: dict[int, tuple[int, MemberChange, ConfChange]] = {}
        """Pending membership changes by log index: the connection, the request, the change."""
        self._add_configured_addresses()

    # -- the address book ------------------------------------------------------

    def _add_configured_addresses(self) -> None:
        """Our own address and those we were told of at joining, where nothing newer says."""
        config = self._config
        if config.address:
            self.addresses.setdefault(config.node_id, config.address)
        for member, member_address in config.join_members.items():
            self.addresses.setdefault(member, member_address)

    def restore(self, members: Mapping[Any, Any], removed: object) -> None:
        """The address book of a snapshot image (format 2)."""
        self.addresses = {str(k): str(v) for k, v in members.items()}
        self._add_configured_addresses()
        self.removed = {str(r) for r in removed} if isinstance(removed, list) else set()

    def image_members(self, conf: ConfState) -> dict[NodeId, str]:
        """The members of ``conf`` with the addresses their entries gave (replicated facts
        only, so every member's image at one index is the same bytes)."""
        return {
            m: self.addresses[m]
            for m in sorted((*conf.voters, *conf.learners))
            if m in self.addresses
        }

    def from_log(self, storage: LogStorage, raft: RaftNode) -> None:
        """The addresses of members added by the entries after the snapshot: the snapshot's
        image has the others, and the configuration counts these from start-up on."""
        first, last = storage.first_index(), storage.last_index()
        if last >= first:
            self.note_entries(
                (e for e in storage.entries(first, last + 1) if e.kind is EntryKind.CONF_CHANGE),
                raft,
            )

    def note_entries(self, entries: Iterable[Entry], raft: RaftNode) -> None:
        """Membership entries carry the new member's address; keep it from the moment the
        entry is in our log, since the configuration takes effect then."""
        changed = False
        for entry in entries:
            if entry.kind is not EntryKind.CONF_CHANGE:
                continue
            changed = True
            change = conf_change_of(entry)
            if change is not None and change.kind is ConfChangeKind.ADD_LEARNER:
                address = address_of_change(change)
                if address is not None:
                    self.addresses[change.node] = address
        if changed:
            self.announce(raft)

    def peer_map(self, raft: RaftNode) -> dict[NodeId, str]:
        members = {*raft.voters, *raft.learners}
        me = self._me
        if me not in members:
            # Joined, and our log does not name us yet: the leader may be a member our log
            # does not know either, and its first appends must be answered.
            members.update(self._config.join_members)
        peers = {m: self.addresses[m] for m in sorted(members) if m != me and m in self.addresses}
        leader = raft.leader
        if leader is not None and leader != me and leader not in peers:
            # We follow a leader our log does not name yet (added while we were away):
            # answer it at the address its hello gave, until the log catches up.
            address = self.unlisted.get(leader)
            if address is not None:
                peers[leader] = address
        return peers

    def announce(self, raft: RaftNode) -> None:
        """Tells the runtime the peers to keep links to."""
        self._out.emit(PeersChanged(self.peer_map(raft)))

    # -- peers -----------------------------------------------------------------

    def refusal(
        self, node: NodeId, speaks: int, address: str, raft: RaftNode, version: int
    ) -> str | None:
        """Why a peer's (authenticated) hello is refused, or None to accept it.

        A peer our log does not name, that says where it listens, is accepted: our log may
        be behind (we were down while it was added), and if it leads, its appends are how
        we catch up. Its address serves only to answer it while we follow it; it never
        makes it a member (only the log does)."""
        if node == self._me:
            return f"{node!r} is this member's own id"
        if node in self.removed:
            return (
                f"member {node} {REMOVED}: remove its data directory and join it again, "
                "with a new id"
            )
        if node not in self.addresses and node not in raft.voters:
            if not address:
                return f"{node!r} is not a member of this cluster"
            if len(self.unlisted) >= MAX_UNLISTED_PEERS:
                self.unlisted.pop(next(iter(self.unlisted)))
            self.unlisted[node] = address
        if version >= 2 and speaks < 2:
            return (
                f"member {node} speaks protocol {speaks}, and this cluster already runs "
                "version 2: upgrade it to this release"
            )
        return None

    def knows(self, peer: NodeId) -> bool:
        """A peer whose messages we step: named by our log or its hello, and not removed."""
        return (peer in self.addresses or peer in self.unlisted) and peer not in self.removed

    # -- membership requests (leader) -------------------------------------------

    def request(
        self,
        conn: int,
        req: MemberChange,
        now: Instant,
        *,
        raft: RaftNode,
        version: int,
        answers: Callable[[NodeId, Instant], bool],
        proved: Callable[[NodeId], bool] = lambda member: True,
    ) -> None:
        """The leader proposes the change a client asked for (or says why it will not);
        ``answers``: whether a member was heard from lately, ``proved``: whether it ever
        completed an authenticated link (peer_health.py)."""
        try:
            change = self.change_for(
                req, now, raft=raft, version=version, answers=answers, proved=proved
            )
        except Refusal as refusal:
            self._out.answer(conn, req.TYPE, refusal.reply(req.id))
            return
        if change is None:  # the leader removes itself: it hands over first
            self._not_leader(conn, req, raft.lead_transferee)
            return
        result = raft.propose_conf_change(change)
        if isinstance(result, NotLeader):
            self._not_leader(conn, req, result.leader)
        elif isinstance(result, ConfChangeRefused):
            self._out.answer(conn, req.TYPE, _conf_change_refusal(req.id, result.reason))
        else:
            if isinstance(req, MemberAdd):
                # Known from now on, as the entry is in our log: the change counts it already.
                self.addresses[req.member] = req.address
            self.proposals[result] = (conn, req, change)
            self.announce(raft)
            self._out.log(
                "info", "member_change_proposed", change=change.kind.name, member=change.node
            )

    def change_for(
        self,
        req: MemberChange,
        now: Instant,
        *,
        raft: RaftNode,
        version: int,
        answers: Callable[[NodeId, Instant], bool],
        proved: Callable[[NodeId], bool] = lambda member: True,
    ) -> ConfChange | None:
        """The change ``req`` asks for; None when the leader must first hand over (it is the
        one to go); Refusal with the reason it may not be made."""
        if version < 2:
            raise upgrading("a membership change")
        voters, learners = set(raft.voters), set(raft.learners)
        member = req.member
        if isinstance(req, MemberAdd):
            if member in voters or member in learners:
                raise Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"{member} is already a member: pick an id not in use "
                    "(dlm members list shows them)",
                )
            if member in self.removed:
                raise Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"{member} was a member and was removed: ids are not reused, pick another",
                )
            wanted = parse_addr(req.address)
            for other in voters | learners:
                address = self.addresses.get(other)
                if address is not None and parse_addr(address) == wanted:
                    raise Refusal(
                        ErrorCode.BAD_REQUEST,
                        f"{req.address} is already {other}'s address: give the new member "
                        "an address of its own",
                    )
            return ConfChange(ConfChangeKind.ADD_LEARNER, member, req.address.encode())
        if isinstance(req, MemberPromote):
            if member not in learners:
                what = (
                    "already a voter: nothing to promote"
                    if member in voters
                    else "not a member: add it first, as a learner"
                )
                raise Refusal(ErrorCode.BAD_REQUEST, f"{member} is {what}")
            if not proved(member):
                raise Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"{member} {self.unproved_reason()}: it stays a learner until it does "
                    f"(start it with the cluster's peer secret or certificate, at "
                    f"{self.addresses.get(member, 'its address')})",
                )
            return ConfChange(ConfChangeKind.PROMOTE, member)
        assert isinstance(req, MemberRemove)
        if member not in voters and member not in learners:
            raise Refusal(
                ErrorCode.BAD_REQUEST,
                f"{member} is not a member: nothing to remove (dlm members list shows them)",
            )
        if member in voters:
            if len(voters) == 1:
                raise Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"{member} is the last voter, and a cluster needs one: add another "
                    "member first",
                )
            if not req.force:
                _check_quorum_after_removing(member, raft, now, answers)
        if member == self._me:
            best = self.best_successor(raft)
            if best is None:
                raise Refusal(
                    ErrorCode.UNAVAILABLE,
                    "the leader cannot hand over: no other voter is caught up; retry shortly",
                    retry_after_ms=500,
                )
            self._out.log("info", "transfer_leadership", to=best, reason="leader removal")
            raft.transfer_leadership(best)
            return None
        return ConfChange(ConfChangeKind.REMOVE, member)

    def unproved_reason(self) -> str:
        """Why a learner that never completed a link with the leader is not promoted."""
        if self._config.peers_authenticated:
            return "never proved the peer secret"
        # Without authentication there is nothing to prove: answering at all (a hello
        # naming this cluster and its id) is all a member can show.
        return "never answered (peer authentication is off: nothing to prove)"

    def learner_reason(
        self, member: NodeId, raft: RaftNode, proved: Callable[[NodeId], bool]
    ) -> str:
        """Why ``member``, a learner, is not a voter yet ("" for a voter), as the leader
        sees it (a follower knows no progress, and says only what it knows)."""
        if member not in raft.learners:
            return ""
        if not proved(member):
            return self.unproved_reason()
        if not self._config.auto_promote:
            return f"auto-promotion is off: dlm members promote {member}"
        status = raft.status()
        progress = status.progress.get(member)
        if progress is None:
            return ""
        behind = status.last_index - progress.match
        if not progress.recent_active or behind > PROMOTE_LAG:
            return f"catching up ({behind} entries behind)"
        return "caught up: the leader promotes it next"

    def best_successor(self, raft: RaftNode) -> NodeId | None:
        """The voter to hand leadership to: the most caught-up one recently active."""
        status = raft.status()
        best, best_match = None, -1
        for peer, pr in status.progress.items():
            if (
                peer != self._me
                and peer in raft.voters
                and pr.recent_active
                and pr.match > best_match
            ):
                best, best_match = peer, pr.match
        return best

    def promote_caught_up_learners(
        self, raft: RaftNode, version: int, proved: Callable[[NodeId], bool]
    ) -> None:
        """Leader: a learner within PROMOTE_LAG entries of the log, that has ``proved``
        itself (completed an authenticated link: peer_health.py), becomes a voter."""
        if not self._config.auto_promote or version < 2:
            return
        if not raft.learners:
            return
        status = raft.status()
        for learner in raft.learners:
            pr = status.progress.get(learner)
            if pr is None or not pr.recent_active or status.last_index - pr.match > PROMOTE_LAG:
                continue
            if not proved(learner):
                continue
            result = raft.propose_conf_change(ConfChange(ConfChangeKind.PROMOTE, learner))
            if isinstance(result, int):
                self._out.log("info", "member_change_proposed", change="PROMOTE", member=learner)
            return  # one change at a time

    # -- applying ------------------------------------------------------------------

    def applied(
        self,
        entry: Entry,
        raft: RaftNode,
        answer_with_members: Callable[[int, MemberChange], None],
    ) -> None:
        """A membership change committed: record and say it, answer whoever asked."""
        change = conf_change_of(entry)
        proposal = self.proposals.pop(entry.index, None)
        if proposal is not None and proposal[2] != change:
            # Another leader's entry took the index: ours was lost, and the client re-sends.
            self._not_leader(proposal[0], proposal[1])
            proposal = None
        if change is not None:
            if change.kind is ConfChangeKind.REMOVE:
                self.removed.add(change.node)
            elif change.kind is ConfChangeKind.ADD_LEARNER:
                address = address_of_change(change)
                if address is not None:
                    self.addresses[change.node] = address
            self._out.log(
                "info",
                _EVENTS[change.kind],
                member=change.node,
                address=self.addresses.get(change.node),
                index=entry.index,
            )
        self.announce(raft)
        if proposal is not None:
            answer_with_members(proposal[0], proposal[1])

    def lost(self, index: int) -> None:
        """A client's entry took ``index``: a membership change proposed there was lost."""
        if self.proposals:
            lost = self.proposals.pop(index, None)
            if lost is not None:
                self._not_leader(lost[0], lost[1])

    def fail_proposals(self) -> None:
        """Leadership is lost: the clients of pending changes try the new leader."""
        changes, self.proposals = self.proposals, {}
        for conn, req, _ in changes.values():
            self._not_leader(conn, req)


def _check_quorum_after_removing(
    member: NodeId, raft: RaftNode, now: Instant, answers: Callable[[NodeId, Instant], bool]
) -> None:
    remaining = [v for v in raft.voters if v != member]
    reachable = [v for v in remaining if answers(v, now)]
    if len(reachable) < len(remaining) // 2 + 1:
        down = sorted(set(remaining) - set(reachable))
        raise Refusal(
            ErrorCode.UNSAFE,
            f"removing {member} would leave {len(remaining)} voters of which only "
            f"{len(reachable)} answer ({', '.join(down)} do not): no quorum. Bring them "
            "back first, or insist with --force",
        )


def _conf_change_refusal(rid: int, reason: str) -> dict[str, Any]:
    """The answer to a membership change the Raft core refused, by the rule that refused it."""
    if "leader's term" in reason:
        # Elected a moment ago: its first entry commits within a round trip (the erratum's
        # rule), so this is a short wait for the client to ride out, not a conflict.
        return error(rid, ErrorCode.UNAVAILABLE, reason, retry_after_ms=50)
    if "not committed yet" in reason:
        return error(
            rid,
            ErrorCode.CONFLICT,
            f"{reason}: another membership change is in progress; retry in a moment",
        )
    return error(rid, ErrorCode.BAD_REQUEST, reason)


def conf_change_of(entry: Entry) -> ConfChange | None:
    try:
        return decode_conf_change(entry.data)
    except ConfChangeDecodeError:
        return None


def address_of_change(change: ConfChange) -> str | None:
    try:
        address = change.context.decode("utf-8")
        parse_addr(address)
    except (UnicodeDecodeError, ValueError):
        return None
    return address
