"""Scripted fault schedules for bugs that random schedules almost never reach.

``membership_erratum`` stages the counter-example of the 2015 erratum to
single-server membership changes (Ongaro, raft-dev), with learners: four
voters and a learner L. Leader A of term T1 promotes L, but the change reaches
only L. In term T2 the other three elect B, whose no-op reaches only C; if B
may change the configuration before committing an entry of its own term, it
removes D, and {A, B, C} lets B and C commit that change and the no-op. A, L
and D are a majority of A's configuration (five voters, with L), so A or L
is elected in term T3 without the entries B committed, and would overwrite
them. A correct core refuses B's change (no entry of T2 is committed), and
that later election is harmless.

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
from dlm.node.raft.types import AppendEntries, Heartbeat, Message, Role
from dlm.records import ConfChange, ConfChangeKind, NodeId

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
    ids = sim.member_ids()
    links = [(node, o) for o in ids if o != node] + [(o, node) for o in ids if o != node]
    sim.net.cut(links)
    return links


def _scripted_options(nodes: int, node_class: type[RaftNode]) -> SimOptions:
    """No random faults, workload, disk delays or membership changes: the script does it all."""
    return SimOptions(
        nodes=nodes,
        schedule=[],
        propose_rate=0.0,
        read_rate=0.0,
        transfer_rate=0.0,
        check_liveness=False,
        snapshot_every=0,
        node_class=node_class,
        member_rate=0.0,
        disk_delay_rate=0.0,
        stop_removed=False,
    )


def figure8(seed: int, node_class: type[RaftNode] = RaftNode) -> Figure8Outcome:
    options = _scripted_options(5, node_class)
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


@dataclass
class ErratumOutcome:
    change_refused: bool
    """Whether the term-T2 leader refused to remove D before committing an entry of T2."""
    violation: Violation | None
    reached_last_phase: bool


def membership_erratum(seed: int, node_class: type[RaftNode] = RaftNode) -> ErratumOutcome:
    sim = Simulation(seed, _scripted_options(4, node_class))
    sim.net.base = LinkConditions(drop=0.0, duplicate=0.0, min_delay=1, max_delay=1)
    nodes = sim.nodes

    def raft(node_id: NodeId) -> RaftNode:
        node = nodes[node_id]
        assert node.raft is not None
        return node.raft

    # Phase 0: a settled leader A, and L added as a learner that has caught up.
    def settled() -> bool:
        leader = sim.leader()
        return leader is not None and all(
            raft(n).commit_index == raft(leader.id).last_index for n in sim.member_ids()
        )

    _run_until(sim, settled, 300, "a first settled leader")
    a_node = sim.leader()
    assert a_node is not None
    a = a_node.id
    learner = "n5"
    added = sim.propose_conf_change(a_node, ConfChange(ConfChangeKind.ADD_LEARNER, learner))
    if not isinstance(added, int):
        raise _ScriptError(f"seed {seed}: {a} would not add {learner}: {added}")
    _run_until(
        sim,
        lambda: learner in nodes and nodes[learner].raft is not None and settled(),
        200,
        "the learner caught up",
    )
    term1 = raft(a).term
    trio = [n for n in sim.ids if n != a]

    # Phase 1: A promotes L, and only L hears of it; then both drop off the network.
    cut_a = [(a, n) for n in trio] + [(n, a) for n in trio]
    sim.net.cut(cut_a)
    promoted = sim.propose_conf_change(a_node, ConfChange(ConfChangeKind.PROMOTE, learner))
    if not isinstance(promoted, int):
        raise _ScriptError(f"seed {seed}: {a} would not promote {learner}: {promoted}")
    _run_until(sim, lambda: raft(learner).last_index >= promoted, 50, "the promotion reached L")
    sim.net.mend(cut_a)
    away = _isolate(sim, a) + _isolate(sim, learner)

    # Phase 2: the trio elects B; whatever B sends to "its" D is lost, so only C acknowledges.
    def victim(leader: NodeId) -> NodeId:
        return next(n for n in trio if n != leader)

    def starve_d(message: Message) -> Message | None:
        if (
            type(message) in (AppendEntries, Heartbeat)
            and message.term > term1
            and message.dst == victim(message.src)
        ):
            return None
        return message

    sim.net.filter = starve_d

    def b_elected() -> bool:
        return any(raft(n).role is Role.LEADER and raft(n).term > term1 for n in trio)

    _run_until(sim, b_elected, 400, "a leader among the other three")
    b = next(n for n in trio if raft(n).role is Role.LEADER)
    d = victim(b)
    c = next(n for n in trio if n not in (b, d))
    removal = sim.propose_conf_change(nodes[b], ConfChange(ConfChangeKind.REMOVE, d))
    refused = not isinstance(removal, int)
    if isinstance(removal, int):
        _run_until(sim, lambda: raft(b).commit_index >= removal, 100, "B committed the removal")

    # Phase 3: B and C vanish; A, L and D meet again, and A can win term T3.
    sim.net.filter = None
    sim.net.mend(away)
    _isolate(sim, b)
    _isolate(sim, c)
    violation: Violation | None = None
    try:
        _run_until(
            sim,
            lambda: any(
                raft(x).role is Role.LEADER and raft(x).term > raft(b).term for x in (a, learner)
            ),
            600,
            "A or L elected",
        )
        for _ in range(50):
            sim.step()
    except Violation as found:
        violation = found
    return ErratumOutcome(refused, violation, reached_last_phase=True)
