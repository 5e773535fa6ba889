"""Scripted fault schedules for bugs that random schedules almost never reach.

``figure8`` stages figure 8 of the Raft paper on five nodes. An entry X of
term T1 reaches two nodes; a leader of a later term T2 writes its own entry
at X's index but shares it with nobody; a leader of term T3 then copies X to
a majority while the network strips its own term-T3 entry from two of those
copies. Counting replicas would now commit X, although the T2 leader can
still win an election (its last term T2 beats the T1 of the majority's last
entry) and overwrite it. A correct core leaves X uncommitted, so the
overwrite is harmless; a core that commits previous-term entries by counting
has X applied and then replaced, which the checkers report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from dlm.node.raft.core import RaftNode
from dlm.node.raft.types import AppendEntries, Message, NodeId, Role

from .checkers import Violation
from .harness import SimNode, SimOptions, Simulation
from .network import LinkConditions


@dataclass
class Figure8Outcome:
    old_entry_committed: bool
    """Whether the term-T3 leader committed X while its own entry was not on a majority."""
    violation: Violation | None
    reached_last_phase: bool


class _ScriptError(AssertionError):
    pass


def _run_until(sim: Simulation, done: Callable[[], bool], limit: int, what: str) -> bool:
    for _ in range(limit):
        if done():
            return True
        sim.step()
    if done():
        return True
    raise _ScriptError(f"seed {sim.seed}: {what} did not happen within {limit} ticks")


def _isolate(sim: Simulation, node: NodeId) -> list[tuple[NodeId, NodeId]]:
    links = [(node, o) for o in sim.ids if o != node] + [(o, node) for o in sim.ids if o != node]
    sim.net.cut(links)
    return links


def figure8(seed: int, node_class: type[RaftNode] = RaftNode) -> Figure8Outcome:
    options = SimOptions(
        nodes=5,
        schedule=[],
        propose_rate=0.0,
        read_rate=0.0,
        transfer_rate=0.0,
        check_liveness=False,
        snapshot_every=0,
        node_class=node_class,
    )
    sim = Simulation(seed, options)
    sim.net.base = LinkConditions(drop=0.0, duplicate=0.0, min_delay=1, max_delay=1)
    nodes = sim.nodes

    def raft(node: SimNode) -> RaftNode:
        assert node.raft is not None
        return node.raft

    # Phase 0: a stable leader with everything committed everywhere.
    def settled() -> bool:
        leader = sim.leader()
        if leader is None:
            return False
        last = leader.storage.last_index()
        return all(raft(n).commit_index == last for n in nodes.values())

    _run_until(sim, settled, 300, "a first settled leader")
    leader1 = sim.leader()
    assert leader1 is not None
    term1 = raft(leader1).term
    others = [i for i in sim.ids if i != leader1.id]
    follower, rest = others[0], others[1:]

    # Phase 1: X reaches only {leader1, follower}; the other side elects a leader
    # whose own entries never leave it.
    side = [leader1.id, follower]
    split = [(a, b) for a in side for b in rest] + [(b, a) for a in side for b in rest]
    sim.net.cut(split)

    def mute_rest(message: Message) -> Message | None:
        if type(message) is AppendEntries and message.src in rest and message.entries:
            return None
        return message

    sim.net.filter = mute_rest
    index_x = sim.propose(leader1, b"X")
    assert index_x is not None

    def leader2_ready() -> bool:
        if nodes[follower].storage.last_index() < index_x:
            return False
        return any(
            raft(nodes[i]).role is Role.LEADER
            and raft(nodes[i]).term > term1
            and nodes[i].storage.last_index() >= index_x
            for i in rest
        )

    _run_until(sim, leader2_ready, 400, "a second leader on the majority side")
    leader2 = next(nodes[i] for i in rest if raft(nodes[i]).role is Role.LEADER)
    term2 = leader2.storage.term(index_x)
    if term2 == term1:
        raise _ScriptError(f"seed {seed}: the second leader's entry at {index_x} is X")
    lows = [i for i in rest if i != leader2.id]

    # Phase 2: leader2 drops off the network; X spreads to the two low nodes, but
    # whatever lies above X is stripped from what they receive.
    sim.net.mend(split)
    cut2 = _isolate(sim, leader2.id)

    def strip_above_x(message: Message) -> Message | None:
        if type(message) is AppendEntries and message.dst in lows and message.entries:
            kept = tuple(e for e in message.entries if e.index <= index_x)
            return dataclasses.replace(message, entries=kept)
        return message

    sim.net.filter = strip_above_x
    candidates = [leader1.id, follower]

    def leader3_commits_x() -> bool:
        return any(
            raft(nodes[i]).role is Role.LEADER and raft(nodes[i]).commit_index >= index_x
            for i in candidates
        )

    committed = True
    try:
        _run_until(sim, leader3_commits_x, 200, "X committed by counting")
    except _ScriptError:
        committed = False
    leader3 = next(
        (nodes[i] for i in candidates if raft(nodes[i]).role is Role.LEADER),
        None,
    )
    if leader3 is None:
        raise _ScriptError(f"seed {seed}: no third leader among {candidates}")

    # Phase 3: leader3 and its follower vanish; leader2 comes back to the low nodes,
    # whose last entry (X, term T1) is older than its own (term T2).
    sim.net.filter = None
    sim.net.mend(cut2)
    _isolate(sim, leader1.id)
    _isolate(sim, follower)
    violation: Violation | None = None
    try:
        _run_until(
            sim,
            lambda: raft(leader2).role is Role.LEADER and raft(leader2).commit_index >= index_x,
            600,
            "leader2 elected again and committing",
        )
        for _ in range(50):
            sim.step()
    except Violation as found:
        violation = found
    return Figure8Outcome(committed, violation, reached_last_phase=True)
