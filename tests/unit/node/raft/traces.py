"""An interpreter for Raft scenario files (``testdata/*.txt``), over the test network.

Each command drives the members of a ``harness.Net`` through RaftNode's public
API only (``tick``, ``step``, ``propose``, ``propose_conf_change``,
``read_index``, ``transfer_leadership``, ``report_unreachable``, ``ready``/
``advance`` and ``status``), so a rewrite of the core's insides that changes no
behaviour leaves every scenario's output unchanged, message for message.

Nothing moves unless a command says so: messages wait in the network's queue
until ``deliver-msgs``, Readys wait in the member until ``process-ready``.
Timing is explicit: ``new`` sets the election and heartbeat ticks, and a
scenario ticks members itself. No output may depend on the random election
timeouts (a test reruns every scenario with other seeds): ``campaign`` ticks
one member until its timer fires, however many ticks that takes, and does not
print the number; a member that has just campaigned fires exactly once more
within ``2 * election - 1`` ticks (a timeout lies in [election, 2 * election)).

Commands (a member is ``n1`` or just ``1``; ``[..]`` is optional)::

    new n1 n2 n3 [learners=n4,n5] [election=10] [heartbeat=1] [pre-vote=on|off]
        [check-quorum=on|off] [inflight=64] [max-bytes=N] [chunk=N] [seed=1]
    campaign n1                 tick n1 (a follower or candidate) until its timer fires
    tick n1 [n2 ...] [xN]       tick each N times (default 1); says who changed role
    process-ready [n1 ...]      persist, send and apply every Ready (default: all)
    deliver-msgs [n1 ...]       step the queued messages to these members (default: all);
                                ``n1->n2`` selects only what n1 sent n2, and
                                ``type=AppendEntries`` only messages of that type
    drop-msgs [n1 ...]          lose the queued messages to these members (or links)
    stabilize [n1 ...]          process-ready + deliver-msgs until nothing moves
    propose n1 data             a command proposed at n1
    add-learner n1 n4 / promote n1 n4 / remove n1 n2
                                a configuration change proposed at n1
    transfer-leader n1 n2       n1 hands leadership to n2
    read-index n1 ctx           a linearizable read point asked at n1
    report-unreachable n1 n2 [gone]
    partition n1 [n2 ...]       cut these members off from the others
    heal                        restore every link; what is queued across a cut is lost
    add-node n4                 start a new, empty member (bootstrap configuration)
    remove-node n2              stop a member for good
    restart n2                  lose what n2 did not persist, start it again
    snapshot n1 [index]         n1's runtime snapshots at index (default: applied) and
                                compacts its log to it
    status n1                   role, term, vote, commit, log bounds, membership, progress
    log n1                      what n1 persisted: snapshot, hard state, entries; and applied

Output: every message as ``src->dst Type term=T ...`` with its indexes; every
Ready as the state it persists, the messages it sends (before or after
persisting), the entries it applies; role changes as ``n2 becomes ...``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from dlm.node.raft.core import RaftNode
from dlm.node.raft.types import (
    AppendEntries,
    AppendEntriesResponse,
    ConfChangeRefused,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    NotLeader,
    ReadIndexRequest,
    ReadIndexResponse,
    Ready,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dlm.records import (
    ConfChange,
    ConfChangeDecodeError,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    NodeId,
    SnapshotMeta,
    decode_conf_change,
)
from tests.unit.node.raft.harness import Net, RaftOptions

MAX_STABILIZE_ROUNDS = 1000
"""A scenario that does not settle within this many rounds is a bug (a livelock)."""


# ---------------------------------------------------------------------------
# How things print.
# ---------------------------------------------------------------------------


def show_bytes(data: bytes) -> str:
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return f"0x{data.hex()}"
    return f'"{text}"' if text.isprintable() else f"0x{data.hex()}"


def show_ids(ids: Iterable[NodeId]) -> str:
    return "(" + " ".join(ids) + ")"


def show_entry(e: Entry) -> str:
    if e.kind is EntryKind.CONF_CHANGE:
        try:
            change = decode_conf_change(e.data)
        except ConfChangeDecodeError:
            return f"{e.index}/{e.term} conf {show_bytes(e.data)}"
        kind = change.kind.name.lower().replace("_", "-")
        return f"{e.index}/{e.term} conf {kind} {change.node}"
    if not e.data:
        return f"{e.index}/{e.term} noop"
    return f"{e.index}/{e.term} {show_bytes(e.data)}"


def show_entries(entries: Sequence[Entry]) -> str:
    return "[" + ", ".join(show_entry(e) for e in entries) + "]"


def show_meta(meta: SnapshotMeta) -> str:
    learners = f" learners={show_ids(meta.conf.learners)}" if meta.conf.learners else ""
    return f"{meta.index}/{meta.term} voters={show_ids(meta.conf.voters)}{learners}"


def show_message(m: Message) -> str:
    head = f"{m.src}->{m.dst} {type(m).__name__} term={m.term}"
    match m:
        case VoteRequest():
            kind = " pre-vote" if m.pre_vote else ""
            transfer = " transfer" if m.transfer else ""
            return f"{head}{kind}{transfer} last={m.last_log_index}/{m.last_log_term}"
        case VoteResponse():
            kind = " pre-vote" if m.pre_vote else ""
            return f"{head}{kind} {'granted' if m.granted else 'rejected'}"
        case AppendEntries():
            entries = f" entries={show_entries(m.entries)}" if m.entries else ""
            return f"{head} prev={m.prev_index}/{m.prev_term} commit={m.commit}{entries}"
        case AppendEntriesResponse():
            if m.reject:
                return f"{head} reject index={m.index} hint={m.hint_index}/{m.hint_term}"
            return f"{head} index={m.index}"
        case Heartbeat():
            ctx = f" ctx={show_bytes(m.ctx)}" if m.ctx else ""
            return f"{head} commit={m.commit}{ctx}"
        case HeartbeatResponse():
            return f"{head} ctx={show_bytes(m.ctx)}" if m.ctx else head
        case InstallSnapshot():
            done = " done" if m.done else ""
            return (
                f"{head} snapshot={show_meta(m.meta)} offset={m.offset} bytes={len(m.data)}{done}"
            )
        case InstallSnapshotResponse():
            reject = " reject" if m.reject else ""
            return f"{head} index={m.index} next-offset={m.next_offset}{reject}"
        case TimeoutNow():
            return head
        case ReadIndexRequest():
            return f"{head} ctx={show_bytes(m.ctx)}"
        case ReadIndexResponse():
            return f"{head} ctx={show_bytes(m.ctx)} index={m.index}"
    raise AssertionError(f"no format for {m!r}")  # pragma: no cover - every type is above


def show_ready(n: NodeId, rd: Ready) -> list[str]:
    out = [f"> {n} ready"]
    if rd.soft_state is not None:
        soft = rd.soft_state
        out.append(f"  role: {soft.role} term={soft.term} leader={soft.leader or '-'}")
    if rd.hard_state is not None:
        hard = rd.hard_state
        out.append(
            f"  persist state: term={hard.term} vote={hard.vote or '-'} commit={hard.commit}"
        )
    if rd.snapshot is not None:
        snap = rd.snapshot
        out.append(f"  persist snapshot: {show_meta(snap.meta)} image={show_bytes(snap.data)}")
    if rd.entries:
        out.append(f"  persist entries: {show_entries(rd.entries)}")
    out.extend(f"  send now: {show_message(m)}" for m in rd.messages_now)
    out.extend(f"  send after persisting: {show_message(m)}" for m in rd.messages)
    out.extend(f"  apply: {show_entry(e)}" for e in rd.committed)
    out.extend(f"  read ready: ctx={show_bytes(r.ctx)} index={r.index}" for r in rd.read_states)
    return out


# ---------------------------------------------------------------------------
# The interpreter.
# ---------------------------------------------------------------------------


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError(f"expected on or off, got {value!r}")
    return value == "on"


class RaftTrace:
    """Runs one scenario's commands, one ``execute`` call per command."""

    def __init__(self, seed: int | None = None) -> None:
        self._net: Net | None = None
        self._seed = seed
        """Overrides every scenario's seed: the outputs must not depend on it."""
        self._leaders: dict[int, NodeId] = {}
        """The leader seen in each term, to check election safety after every command."""

    @property
    def net(self) -> Net:
        if self._net is None:
            raise ValueError("start with: new n1 n2 n3 [options]")
        return self._net

    def execute(self, command: str) -> str:
        words = command.split()
        name, args = words[0], words[1:]
        handler = getattr(self, "cmd_" + name.replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown command {name!r}")
        lines: list[str] = handler(args)
        self.check_election_safety()
        return "\n".join(lines)

    def check_election_safety(self) -> None:
        if self._net is None:
            return
        for n, node in self._net.nodes.items():
            if node.role is Role.LEADER:
                seen = self._leaders.setdefault(node.term, n)
                if seen != n:
                    raise AssertionError(f"two leaders in term {node.term}: {seen} and {n}")

    # -- helpers -----------------------------------------------------------

    def node_id(self, word: str) -> NodeId:
        return word if word.startswith("n") else f"n{word}"

    def member(self, word: str) -> RaftNode:
        n = self.node_id(word)
        if n not in self.net.nodes:
            raise ValueError(f"{n} is not running")
        return self.net.nodes[n]

    def targets(self, args: Sequence[str]) -> list[NodeId]:
        nodes = [self.node_id(a) for a in args if "=" not in a and "->" not in a]
        return nodes or sorted(self.net.nodes)

    def roles(self) -> dict[NodeId, tuple[Role, int]]:
        return {n: (node.role, node.term) for n, node in self.net.nodes.items()}

    def role_changes(self, before: dict[NodeId, tuple[Role, int]]) -> list[str]:
        out = []
        for n, node in sorted(self.net.nodes.items()):
            if before.get(n) != (node.role, node.term):
                out.append(f"{n} becomes {node.role} at term {node.term}")
        return out

    def process(self, nodes: Sequence[NodeId]) -> list[str]:
        out: list[str] = []
        for n in nodes:
            if n not in self.net.nodes:
                continue
            for rd in self.net.persist(n):
                out.extend(show_ready(n, rd))
        return out

    def select(self, args: Sequence[str]) -> list[Message]:
        """Take the queued messages ``args`` name out of the queue, in queue order.

        ``n2`` names what is queued for n2, ``n1->n2`` only what n1 sent n2,
        ``type=VoteResponse`` only messages of that type; no argument names everything.
        """
        links: set[tuple[NodeId | None, NodeId]] = set()
        kinds: set[str] = set()
        for word in args:
            if word.startswith("type="):
                kinds.add(word.removeprefix("type="))
                continue
            src, arrow, dst = word.partition("->")
            if arrow:
                links.add((self.node_id(src), self.node_id(dst)))
            else:
                links.add((None, self.node_id(word)))

        def wanted(m: Message) -> bool:
            if kinds and type(m).__name__ not in kinds:
                return False
            return not links or (None, m.dst) in links or (m.src, m.dst) in links

        net = self.net
        taken = [m for m in net.queue if wanted(m)]
        net.queue = deque(m for m in net.queue if not wanted(m))
        return taken

    def deliver(self, msgs: Sequence[Message]) -> list[str]:
        net = self.net
        out: list[str] = []
        for m in msgs:
            if (m.src, m.dst) in net.cut:
                out.append(f"{show_message(m)}  (lost: partition)")
                continue
            if m.dst not in net.nodes:
                out.append(f"{show_message(m)}  (lost: {m.dst} is down)")
                continue
            before = self.roles()
            net.nodes[m.dst].step(m)
            out.append(show_message(m))
            out.extend(f"  {line}" for line in self.role_changes(before))
        return out

    # -- commands ----------------------------------------------------------

    def cmd_new(self, args: list[str]) -> list[str]:
        voters = [self.node_id(a) for a in args if "=" not in a]
        options = dict(a.split("=", 1) for a in args if "=" in a)
        learners = tuple(self.node_id(n) for n in options.pop("learners", "").split(",") if n)
        seed = int(options.pop("seed", "1"))
        if self._seed is not None:
            seed = self._seed
        cfg: RaftOptions = {
            "election_ticks": int(options.pop("election", "10")),
            "heartbeat_ticks": int(options.pop("heartbeat", "1")),
            "pre_vote": _on_off(options.pop("pre-vote", "on")),
            "check_quorum": _on_off(options.pop("check-quorum", "on")),
        }
        if "inflight" in options:
            cfg["max_inflight"] = int(options.pop("inflight"))
        if "max-bytes" in options:
            cfg["max_entries_bytes"] = int(options.pop("max-bytes"))
        if "chunk" in options:
            cfg["snapshot_chunk_bytes"] = int(options.pop("chunk"))
        if options:
            raise ValueError(f"unknown options {sorted(options)}")
        self._net = Net(voters, learners=learners, seed=seed, **cfg)
        return [
            f"voters={show_ids(voters)} learners={show_ids(learners)}",
            f"election={cfg['election_ticks']} heartbeat={cfg['heartbeat_ticks']}"
            f" pre-vote={'on' if cfg['pre_vote'] else 'off'}"
            f" check-quorum={'on' if cfg['check_quorum'] else 'off'}",
        ]

    def cmd_campaign(self, args: list[str]) -> list[str]:
        node = self.member(args[0])
        if node.role in (Role.LEADER, Role.PRE_CANDIDATE):
            raise ValueError(f"{node.id} is {node.role}: tick it instead")
        before = self.roles()
        # A random timeout lies within two election timeouts; allow a lease on top.
        for _ in range(4 * self.net.cfg.get("election_ticks", 10)):
            node.tick()
            if (node.role, node.term) != before[node.id]:
                break
        changes = self.role_changes(before)
        return changes or [f"{node.id} did not campaign"]

    def cmd_tick(self, args: list[str]) -> list[str]:
        times = 1
        if args and args[-1].startswith("x"):
            times = int(args.pop()[1:])
        before = self.roles()
        for word in args:
            node = self.member(word)
            for _ in range(times):
                node.tick()
        return self.role_changes(before)

    def cmd_process_ready(self, args: list[str]) -> list[str]:
        return self.process(self.targets(args))

    def cmd_deliver_msgs(self, args: list[str]) -> list[str]:
        return self.deliver(self.select(args))

    def cmd_drop_msgs(self, args: list[str]) -> list[str]:
        return [f"{show_message(m)}  (dropped)" for m in self.select(args)]

    def cmd_stabilize(self, args: list[str]) -> list[str]:
        out: list[str] = []
        for _ in range(MAX_STABILIZE_ROUNDS):
            moved = self.process(self.targets(args))
            moved.extend(self.deliver(self.select(args)))
            if not moved:
                return out
            out.extend(moved)
        raise AssertionError(f"not stable after {MAX_STABILIZE_ROUNDS} rounds")

    def cmd_propose(self, args: list[str]) -> list[str]:
        node = self.member(args[0])
        result = node.propose(" ".join(args[1:]).encode())
        if isinstance(result, NotLeader):
            return [f"refused: not leader (leader {result.leader or 'unknown'})"]
        return [f"index {result}"]

    def conf_change(self, kind: ConfChangeKind, args: list[str]) -> list[str]:
        node = self.member(args[0])
        result = node.propose_conf_change(ConfChange(kind, self.node_id(args[1])))
        if isinstance(result, NotLeader):
            return [f"refused: not leader (leader {result.leader or 'unknown'})"]
        if isinstance(result, ConfChangeRefused):
            return [f"refused: {result.reason}"]
        return [f"index {result}", f"{node.id} now has {self.show_conf(node)}"]

    def show_conf(self, node: RaftNode) -> str:
        return f"voters={show_ids(node.voters)} learners={show_ids(node.learners)}"

    def cmd_add_learner(self, args: list[str]) -> list[str]:
        return self.conf_change(ConfChangeKind.ADD_LEARNER, args)

    def cmd_promote(self, args: list[str]) -> list[str]:
        return self.conf_change(ConfChangeKind.PROMOTE, args)

    def cmd_remove(self, args: list[str]) -> list[str]:
        return self.conf_change(ConfChangeKind.REMOVE, args)

    def cmd_transfer_leader(self, args: list[str]) -> list[str]:
        result = self.member(args[0]).transfer_leadership(self.node_id(args[1]))
        if isinstance(result, NotLeader):
            return [f"refused: not leader (leader {result.leader or 'unknown'})"]
        return []

    def cmd_read_index(self, args: list[str]) -> list[str]:
        result = self.member(args[0]).read_index(args[1].encode())
        if isinstance(result, NotLeader):
            return [f"refused: not leader (leader {result.leader or 'unknown'})"]
        return []

    def cmd_report_unreachable(self, args: list[str]) -> list[str]:
        gone = args[2:] == ["gone"]
        self.member(args[0]).report_unreachable(self.node_id(args[1]), gone=gone)
        return []

    def cmd_partition(self, args: list[str]) -> list[str]:
        side = {self.node_id(a) for a in args}
        net = self.net
        others = set(net.nodes) - side
        for a in side:
            for b in others:
                net.cut.update({(a, b), (b, a)})
        return [f"{show_ids(sorted(side))} | {show_ids(sorted(others))}"]

    def cmd_heal(self, args: list[str]) -> list[str]:
        net = self.net
        self.process(sorted(net.nodes))  # what was sent before the heal crossed a cut link
        lost = [m for m in net.queue if (m.src, m.dst) in net.cut]
        net.queue = deque(m for m in net.queue if (m.src, m.dst) not in net.cut)
        net.heal()
        out = [f"{show_message(m)}  (lost: partition)" for m in lost]
        return [*out, "every link restored"]

    def cmd_add_node(self, args: list[str]) -> list[str]:
        node = self.net.add(self.node_id(args[0]))
        return [f"{node.id} starts with {self.show_conf(node)}"]

    def cmd_remove_node(self, args: list[str]) -> list[str]:
        node = self.member(args[0])
        self.net.stop(node.id)
        return [f"{node.id} stopped"]

    def cmd_restart(self, args: list[str]) -> list[str]:
        n = self.node_id(args[0])
        self.member(n)
        node = self.net.restart(n)
        return self.show_status(node)

    def cmd_snapshot(self, args: list[str]) -> list[str]:
        node = self.member(args[0])
        index = int(args[1]) if len(args) > 1 else node.applied_index
        storage = self.net.storages[node.id]
        conf: ConfState = node.conf_state_at(index)
        snap = storage.create_snapshot(index, conf, f"image@{index}".encode())
        storage.compact(index)
        first, last = storage.first_index(), storage.last_index()
        kept = f"entries {first}..{last}" if last >= first else f"no entry after {index}"
        return [
            f"{node.id} snapshot {show_meta(snap.meta)} image={show_bytes(snap.data)}",
            f"{node.id} log keeps {kept}",
        ]

    def show_status(self, node: RaftNode) -> list[str]:
        st = node.status()
        removed = " removed" if st.removed else ""
        out = [
            f"{st.id}: {st.role} term={st.term} vote={st.vote or '-'} leader={st.leader or '-'}"
            f" commit={st.commit} applied={st.applied} log={st.first_index}..{st.last_index}"
            f"{removed}",
            f"  voters={show_ids(st.voters)} learners={show_ids(st.learners)}",
        ]
        for peer, pr in sorted(st.progress.items()):
            flags = "".join(
                (
                    " active" if pr.recent_active else "",
                    " snapshot" if pr.snapshot_pending else "",
                    " learner" if pr.is_learner else "",
                )
            )
            out.append(f"  progress {peer}: match={pr.match} next={pr.next}{flags}")
        return out

    def cmd_status(self, args: list[str]) -> list[str]:
        out = []
        for n in self.targets(args):
            out.extend(self.show_status(self.member(n)))
        return out

    def cmd_log(self, args: list[str]) -> list[str]:
        n = self.node_id(args[0])
        storage = self.net.storages[n]
        out = []
        snap = storage.snapshot()
        if snap is not None:
            out.append(f"snapshot: {show_meta(snap.meta)} image={show_bytes(snap.data)}")
        hard = storage.hard_state
        out.append(f"state: term={hard.term} vote={hard.vote or '-'} commit={hard.commit}")
        first, last = storage.first_index(), storage.last_index()
        entries = storage.entries(first, last + 1) if last >= first else []
        out.append(f"entries: {show_entries(entries)}")
        applied = self.net.applied.get(n, [])
        out.append(f"applied: {show_entries(applied)}")
        return out
