"""An interpreter for node machine scenario files (``testdata/*.txt``), over machine_driver.

A scenario drives whole members (``NodeMachine``) through the event API the
runtime uses (client frames in, timers, peer messages, disk completions) and
prints what leaves them: the frames each client receives, the connections a
member closes, the log events it emits and the role changes. Frames print as
the bytes on the wire decode (``wire.encode_frame``), so a change of how the
machine builds its replies that keeps the wire identical keeps the output.

Nothing moves unless a command says so: ``send`` only hands the frame to the
member (which settles: proposes, persists, queues messages); peer messages
wait until ``deliver``; time moves only in ``advance``.

Commands (``[..]`` is optional)::

    cluster n1 n2 n3 [seed=7] [tick-ms=50] [election=6] [heartbeat=1] [timeout-ms=5000]
        [links=any|follow]      follow: a message arrives only over a link the runtime
                                would keep (the sender's PeersChanged, the hello accepted)
    join n4                     boot n4 as `dlm node start --join` does, once added
    elect n1                    tick n1 alone until it leads, then let time pass up to
                                2 s after the start (whatever the random timeout was)
    connect c1 n1               open client connection c1 to member n1
    send c1 TYPE [k=v ...]      a request on c1 (id, client and seq filled in as a
                                client does); v is an int or true/false if it reads as one
    send-raw c1 VALUE           any frame (a Python literal) on c1
    disconnect c1               the client hangs up
    deliver                     carry peer messages until the network is quiet
    advance 250ms | 2s          let time pass (timers fire, messages are carried)
    partition n1 [n2 ...]       cut these members off from the others; heal
    restart n2                  a new machine on n2's storage
    status [n1 ...]             role, term, leader, commit of each member
    frames c1                   every frame c1 received so far
"""

from __future__ import annotations

import ast
from typing import Any

import cbor2

from dlm.node.machine import Timing
from dlm.node.raft.types import Message
from dlm.records import NodeId
from dlm.wire import encode_frame
from tests.unit.node.machine_driver import (
    CHANGES,
    MONO_START,
    Client,
    Cluster,
    Member,
    address,
)

FRAME_HEADER_BYTES = 4
"""The length prefix of an unsealed frame."""
ELECTED_BY_S = 2.0
"""``elect`` leaves the clock this long after the cluster started (well after any first
election at the scenarios' timings)."""


def show_value(value: Any) -> str:
    """A frame's value in a compact, stable notation (dict keys in the order sent)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bytes):
        return f"0x{value.hex()}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def on_the_wire(frame: Any) -> Any:
    """What a client decodes from the frame the runtime would write for ``frame``."""
    return cbor2.loads(encode_frame(frame)[FRAME_HEADER_BYTES:])


def parse_seconds(text: str) -> float:
    if text.endswith("ms"):
        return int(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    raise ValueError(f"a duration ends in ms or s: {text!r}")


def parse_field(text: str) -> tuple[str, Any]:
    key, _, raw = text.partition("=")
    if raw in ("true", "false"):
        return key, raw == "true"
    try:
        return key, int(raw)
    except ValueError:
        return key, raw


class MachineTrace:
    """Runs one scenario's commands against a machine_driver Cluster."""

    def __init__(self, seed: int | None = None) -> None:
        self._cluster: Cluster | None = None
        self._seed = seed
        """Overrides the seed of every scenario that does not name its own."""
        self.clients: dict[str, Client] = {}
        self.seen_frames: dict[str, int] = {}
        self.seen_closed: dict[str, bool] = {}
        self.seen_events: dict[NodeId, int] = {}
        self.seen_stops: dict[NodeId, int] = {}
        self.seen_roles: dict[NodeId, tuple[str, int]] = {}
        self.cut: set[NodeId] = set()
        self.request_ids: dict[str, int] = {}
        self.seqs: dict[str, int] = {}

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise ValueError("start with: cluster n1 [n2 n3] [options]")
        return self._cluster

    def execute(self, command: str) -> str:
        name, _, rest = command.partition(" ")
        handler = getattr(self, "cmd_" + name.replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown command {name!r}")
        lines: list[str] = handler(rest.split() if name != "send-raw" else [rest])
        if self._cluster is not None and name not in ("frames", "status"):
            lines.extend(self.news())
        return "\n".join(lines)

    # -- what happened since the last command -------------------------------

    def news(self) -> list[str]:
        out: list[str] = []
        for node, member in self.cluster.members.items():
            role = (str(member.role), member.machine.raft.term)
            if self.seen_roles.get(node) != role:
                self.seen_roles[node] = role
                out.append(f"{node} is {role[0]} at term {role[1]}")
            for event in member.events[self.seen_events.get(node, 0) :]:
                fields = " ".join(f"{k}={show_value(v)}" for k, v in event.fields.items())
                out.append(f"{node} log {event.level} {event.event} {fields}".rstrip())
            self.seen_events[node] = len(member.events)
            for stop in member.stops[self.seen_stops.get(node, 0) :]:
                out.append(f"{node} stops (exit {stop.code}): {stop.reason}")
            self.seen_stops[node] = len(member.stops)
        for name, client in self.clients.items():
            frames = client.frames
            for frame in frames[self.seen_frames.get(name, 0) :]:
                out.append(f"{name} <- {show_value(on_the_wire(frame))}")
            self.seen_frames[name] = len(frames)
            if client.closed and not self.seen_closed.get(name):
                self.seen_closed[name] = True
                out.append(
                    f"{name} closed by {client.member.id}: {client.member.closed[client.conn]}"
                )
        return out

    # -- commands -----------------------------------------------------------

    def cmd_cluster(self, args: list[str]) -> list[str]:
        ids = [a for a in args if "=" not in a]
        options = dict(a.split("=", 1) for a in args if "=" in a)
        if ids != ["n1", "n2", "n3"][: len(ids)] or not ids:
            raise ValueError("the members are n1, or n1 n2 n3")
        timing = Timing(
            tick_s=int(options.pop("tick-ms", "50")) / 1000,
            election_ticks=int(options.pop("election", "6")),
            heartbeat_ticks=int(options.pop("heartbeat", "1")),
            request_timeout_s=int(options.pop("timeout-ms", "5000")) / 1000,
        )
        # A scenario whose output depends on the random draws says so by naming its seed.
        seed = int(options.pop("seed", "7" if self._seed is None else self._seed))
        links = options.pop("links", "any")
        if links not in ("any", "follow"):
            raise ValueError("links=any (every message arrives) or links=follow (only over links)")
        if options:
            raise ValueError(f"unknown options {sorted(options)}")
        self._cluster = Cluster(
            len(ids), timing=timing, seed=seed, links_follow_peers=links == "follow"
        )
        self._cluster.blocked = self.blocked
        return [
            f"members={' '.join(ids)} tick={round(timing.tick_s * 1000)}ms"
            f" election={timing.election_ticks} heartbeat={timing.heartbeat_ticks}"
            f" request-timeout={round(timing.request_timeout_s * 1000)}ms"
        ]

    def blocked(self, msg: Message) -> bool:
        return (msg.src in self.cut) != (msg.dst in self.cut)

    def member(self, node: str) -> Member:
        if node not in self.cluster.members:
            raise ValueError(f"no member {node}")
        return self.cluster.members[node]

    def client(self, name: str) -> Client:
        if name not in self.clients:
            raise ValueError(f"no client {name}: connect it first")
        return self.clients[name]

    def cmd_elect(self, args: list[str]) -> list[str]:
        cluster = self.cluster
        cluster.elect(self.member(args[0]).id)
        # The election took a random number of ticks: go on to a fixed instant, so that
        # what follows (timestamps, deadlines) does not depend on the draw.
        settled_at = MONO_START + ELECTED_BY_S
        if cluster.mono > settled_at:
            raise ValueError(f"the election took longer than {ELECTED_BY_S}s")
        cluster.advance(settled_at - cluster.mono)
        return [f"clock: {ELECTED_BY_S}s after start"]

    def cmd_join(self, args: list[str]) -> list[str]:
        node = args[0]
        if node in self.cluster.members:
            raise ValueError(f"{node} is running already")
        told = {m: address(m) for m in self.cluster.ids}
        self.cluster.join(node, told)
        return [f"{node} boots with --join, told of {' '.join(told)}"]

    def cmd_connect(self, args: list[str]) -> list[str]:
        name, node = args
        self.clients[name] = self.cluster.connect(self.member(node).id)
        return [f"{name} connected to {node}"]

    def cmd_send(self, args: list[str]) -> list[str]:
        name, kind = args[0], args[1]
        client = self.client(name)
        # As a client builds it: a fresh id, and for a change its client id and a fresh seq.
        self.request_ids[name] = rid = self.request_ids.get(name, 0) + 1
        frame: dict[str, Any] = {"t": kind, "id": rid}
        fields = dict(parse_field(a) for a in args[2:])
        if kind in CHANGES:
            frame["client"] = client.client_id
            self.seqs[name] = self.seqs.get(name, 0) + 1
            frame["seq"] = self.seqs[name]
            frame["acked"] = 0
        frame.update(fields)
        client.send_raw(frame)
        return [f"{name} -> {show_value(frame)}"]

    def cmd_send_raw(self, args: list[str]) -> list[str]:
        name, _, literal = args[0].partition(" ")
        client = self.client(name)
        frame = ast.literal_eval(literal)
        client.send_raw(frame)
        return [f"{name} -> {show_value(frame)}"]

    def cmd_disconnect(self, args: list[str]) -> list[str]:
        client = self.client(args[0])
        client.member.machine.client_closed(client.conn)
        self.cluster.settle(client.member)
        return [f"{args[0]} hung up"]

    def cmd_deliver(self, args: list[str]) -> list[str]:
        self.cluster.deliver()
        return []

    def cmd_advance(self, args: list[str]) -> list[str]:
        self.cluster.advance(parse_seconds(args[0]))
        return []

    def cmd_partition(self, args: list[str]) -> list[str]:
        self.cut = {self.member(a).id for a in args}
        return [f"({' '.join(sorted(self.cut))}) cut off"]

    def cmd_heal(self, args: list[str]) -> list[str]:
        self.cut = set()
        return ["every link restored"]

    def cmd_restart(self, args: list[str]) -> list[str]:
        node = self.member(args[0]).id
        self.cluster.restart(node)
        self.seen_events[node] = 0
        self.seen_stops[node] = 0
        return [f"{node} restarted on its storage"]

    def cmd_status(self, args: list[str]) -> list[str]:
        out = []
        for node in args or sorted(self.cluster.members):
            raft = self.member(node).machine.raft
            out.append(
                f"{node}: {raft.role} term={raft.term} leader={raft.leader or '-'}"
                f" commit={raft.commit_index} applied={raft.applied_index}"
            )
        return out

    def cmd_frames(self, args: list[str]) -> list[str]:
        client = self.client(args[0])
        return [f"{args[0]} <- {show_value(on_the_wire(f))}" for f in client.frames]
