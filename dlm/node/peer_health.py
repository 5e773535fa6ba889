"""Peer health: what this member knows of the other members' links and liveness.

When each member was last heard from, which links dropped since, which members the
leader has said are silent, the protocol version each speaks, and when each batch of
appended entries left (for the append round-trip figure). From it: whether a member
answers (which decides whether a removal keeps a quorum), its last contact for the
views, and the leader's ``peer_silent`` / ``peer_regained`` events. Pure: part of the
node machine (machine.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from dlm.node.outbox import Instant, SendMessages
from dlm.node.raft.types import AppendEntries, Message
from dlm.node.stats import Stats
from dlm.records import NodeId

APPEND_TIMES_KEPT = 256
"""Batches per peer whose departure is remembered for the round-trip figure."""


class PeerHealth:
    """Last contact, dropped links, silence and spoken versions of the other members."""

    def __init__(self, me: NodeId, election_timeout_s: float, now: Instant) -> None:
        self._me = me
        self._election_timeout_s = election_timeout_s
        self.versions: dict[NodeId, int] = {}
        self.heard: dict[NodeId, float] = {}
        self.links_down: set[NodeId] = set()
        """Members whose link dropped and that have not been heard from since."""
        self.silent: set[NodeId] = set()
        self._leading_since = now.mono
        self._append_sent: dict[NodeId, dict[int, float]] = {}

    def took_office(self, now: Instant) -> None:
        self._leading_since = now.mono

    def heard_from(self, peer: NodeId, now: Instant) -> float | None:
        """A message from ``peer`` arrived: how long it was silent, if the leader had said
        it was (it is back), else None."""
        heard_before = self.heard.get(peer, self._leading_since)
        self.heard[peer] = now.mono
        self.links_down.discard(peer)
        if peer not in self.silent:
            return None
        self.silent.discard(peer)
        return now.mono - max(heard_before, self._leading_since)

    def batches(self, messages: Iterable[Message], now: Instant) -> list[SendMessages]:
        """``messages`` grouped by the peer they go to, noting when appends leave."""
        by_peer: dict[NodeId, list[Message]] = {}
        for msg in messages:
            by_peer.setdefault(msg.dst, []).append(msg)
            if type(msg) is AppendEntries and msg.entries:
                # For the append round-trip figure: when each batch left.
                sent = self._append_sent.setdefault(msg.dst, {})
                if len(sent) < APPEND_TIMES_KEPT:
                    sent.setdefault(msg.entries[-1].index, now.mono)
        return [SendMessages(peer, tuple(batch)) for peer, batch in by_peer.items()]

    def acknowledged(self, peer: NodeId, index: int, now: Instant, stats: Stats) -> None:
        """``peer`` has our log up to ``index``: the round trips of the batches it answers."""
        sent = self._append_sent.get(peer)
        if not sent:
            return
        done = [i for i in sent if i <= index]
        if done:
            rtt = stats.rtt(peer)
            for i in done:
                rtt.observe(now.mono - sent.pop(i))

    def newly_silent(
        self, members: Iterable[NodeId], leading: bool, now: Instant
    ) -> list[tuple[NodeId, float]]:
        """The leader's members that have not answered for an election timeout, and since
        when, each said once (until it is heard again)."""
        if not leading:
            if self.silent:
                self.silent.clear()
            return []
        found = []
        for member in members:
            if member == self._me or member in self.silent:
                continue
            heard = self.heard.get(member, self._leading_since)
            silent_for = now.mono - max(heard, self._leading_since)
            if silent_for > self._election_timeout_s:
                self.silent.add(member)
                self._append_sent.pop(member, None)
                found.append((member, silent_for))
        return found

    def answers(self, member: NodeId, now: Instant) -> bool:
        """Whether ``member`` is this one, or was heard from within the longest election
        timeout and its link has not dropped since.

        Not the core's ``recent_active``: the leader clears that at every check-quorum
        round, so a live member would look silent until it next answers. The link matters
        because this decides whether a removal is safe: a member killed a moment ago must
        not count, and its connection tells at once.
        """
        if member == self._me:
            return True
        if member in self.links_down:
            return False
        heard = self.heard.get(member)
        return heard is not None and now.mono - heard <= 2 * self._election_timeout_s

    def proved(self, member: NodeId) -> bool:
        """Whether ``member`` completed a link with this member: it passed admission
        (admission.py: with a peer secret or TLS, it proved it holds them) in either
        direction, or its messages arrived over such a link. A member that never did must
        not vote: a stranger at its address would only lower the cluster's tolerance."""
        return member == self._me or member in self.versions or member in self.heard

    def last_contact_ms(self, member: NodeId, now: Instant) -> int | None:
        if member == self._me:
            return 0
        heard = self.heard.get(member)
        return None if heard is None else max(0, int((now.mono - heard) * 1000))
