"""Real members in network namespaces, and the network failures an operator's cables make.

``python -m tests.chaos.netns [--cut S] [--drop S] [--json FILE]`` (root, Linux): runs the
cases below against a 3-member cluster whose members each live in a network
namespace of their own, joined by a bridge, and prints how long each recovery took.
`make chaos` runs it; tests/chaos/test_netns.py runs the same cases with their bounds.

A fault is a policy-routing rule in the *receiving* namespace that black-holes
what comes from one address (``ip rule ... blackhole``, ordered before the
local table): the sender's kernel sees silence, not an error, so its TCP
connection backs off exactly as it does behind a dead switch port. One rule is
one-way loss; a rule on each side is a cut.

The cases (issue 20, item 5):

* ``cut_then_heal``: a follower cut off from its peers for ``cut`` seconds
  (long enough for TCP's retransmission back-off to reach seconds), then
  healed; measured: from the heal until the follower has applied an entry the
  leader committed after it.
* the same with one-way loss: only what the follower sends is lost.
* ``kill_other_follower``: 2 s after that heal, the other follower is killed;
  measured: from the kill until a write succeeds (2 of 3 members up, the
  network whole).
* ``leader_outbound_dropped``: everything the leader sends (to its peers and
  to the clients) is lost for ``drop`` seconds; measured: from the start of the
  loss until a write succeeds.
* ``lossy_links``: every member loses ``loss`` % of every packet it sends, to its
  peers and to the clients, for ``lossy`` seconds; measured: from the start of the
  loss until a write succeeds, how many writes succeed, and how many terms pass.
  netem is absent here, so the loss is a classic-BPF filter on each member's own
  link (``ld rand``: the kernel's random number; drop when it is above the kept
  share), the same at every packet as netem's ``loss``.

The members listen on addresses of a bridge of the lab's own, inside their
namespaces (the one place where tests bind beyond 127.0.0.1; the addresses
are private to this host). Every namespace, link and process a lab creates it
also removes, by name and PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.cluster.harness import Cluster, NodeProc

PORT = 7700
SETTLE_TIMEOUT_S = 30.0
RECOVERY_CAP_S = 90.0
"""How long a measurement waits before it gives up (and reports the cap)."""


def available() -> str | None:
    """Why network namespaces cannot be used here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"dlmprobe{os.getpid()}"
    made = subprocess.run(
        ["ip", "netns", "add", probe], check=False, capture_output=True, text=True
    )
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    bridge = subprocess.run(
        ["ip", "link", "add", probe[:15], "type", "bridge"],
        check=False,
        capture_output=True,
        text=True,
    )
    if bridge.returncode != 0:
        return f"cannot create a bridge: {bridge.stderr.strip()}"
    subprocess.run(["ip", "link", "del", probe[:15]], check=False, capture_output=True)
    return None


def loss_available() -> str | None:
    """Why random packet loss cannot be put on a link here, or None if it can."""
    why = available()
    if why is not None:
        return why
    if shutil.which("tc") is None:
        return "iproute2's `tc` is not installed"
    probe = f"dlmloss{os.getpid()}"
    subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True)
    try:
        for command in (["tc", "qdisc", "add", "dev", "lo", "clsact"], _loss_filter("lo", 30)):
            done = subprocess.run(
                ["ip", "netns", "exec", probe, *command],
                check=False,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                return f"cannot filter a link's packets at random: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


def _loss_filter(device: str, percent: int) -> list[str]:
    """A `tc` command whose filter drops ``percent`` % of what ``device`` sends: a
    classic-BPF program run as the action itself (direct-action) that loads a random
    32-bit number (the ``ld rand`` extension), and returns TC_ACT_SHOT (2) when it is
    at or above the kept share of 2**32, TC_ACT_OK (0) otherwise."""
    kept = (2**32 * (100 - percent)) // 100
    load_random = "32 0 0 4294963256"  # BPF_LD|BPF_W|BPF_ABS, SKF_AD_OFF + SKF_AD_RANDOM
    at_or_above = f"53 0 1 {kept}"  # BPF_JMP|BPF_JGE|BPF_K: next if A >= kept, else skip one
    program = f"4,{load_random},{at_or_above},6 0 0 2,6 0 0 0"  # BPF_RET|BPF_K
    return ["tc", "filter", "add", "dev", device, "egress", "bpf", "da", "bytecode", program]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class NetnsNode(NodeProc):
    """A member started inside its namespace (``ip netns exec`` execs: same PID)."""

    def __init__(self, cluster: Cluster, node_id: str, namespace: str, ip: str) -> None:
        super().__init__(cluster, node_id, PORT)
        self.namespace = namespace
        self.ip = ip

    @property
    def address(self) -> str:
        return f"{self.ip}:{PORT}"

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *super().command()]


class Lab:
    """Three namespaces on a bridge, a cluster in them, and the faults between them."""

    def __init__(self, base: Path, size: int = 3) -> None:
        tag = os.getpid() % 100_000
        # Two runs at once (other test sessions) get different subnets and names.
        self.subnet = f"10.{200 + tag // 250 % 50}.{tag % 250}"
        self.bridge = f"dlb{tag}"
        self.base = base
        self.namespaces = {f"n{i}": f"dlm{tag}n{i}" for i in range(1, size + 1)}
        self.ips = {node: f"{self.subnet}.{i}" for i, node in enumerate(self.namespaces, 1)}
        self._rules: set[tuple[str, str]] = set()
        """(receiving node, sending node) pairs whose traffic is black-holed."""
        self._client_rules: set[str] = set()
        """Nodes whose traffic to the clients is black-holed."""
        # Private addresses on a bridge of our own: no peer secret needed to be safe.
        self.cluster = Cluster(base, size=size, node_args=lambda _: ["--insecure"])
        self.cluster.nodes = {
            node: NetnsNode(self.cluster, node, ns, self.ips[node])
            for node, ns in self.namespaces.items()
        }
        self.cluster.peers_flag = ",".join(
            f"{n.node_id}={n.address}" for n in self.cluster.nodes.values()
        )

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (node, ns) in enumerate(self.namespaces.items(), 1):
            host, inner = f"{self.bridge}h{i}", f"{self.bridge}i{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", host, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", host, "master", self.bridge)
            _ip("link", "set", host, "up")
            _ip("-n", ns, "addr", "add", f"{self.ips[node]}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            # The local table after the fault rules, so that a rule can drop what arrives.
            _ip("-n", ns, "rule", "add", "pref", "100", "lookup", "local")
            _ip("-n", ns, "rule", "del", "pref", "0")

    def down(self) -> None:
        with suppress(Exception):
            self.cluster.stop_all()
        # The host ends first: a namespace's veths go with it only when the kernel gets
        # round to it, and the next lab of this process reuses the names.
        for i in range(1, len(self.namespaces) + 1):
            subprocess.run(
                ["ip", "link", "del", f"{self.bridge}h{i}"], check=False, capture_output=True
            )
        for ns in self.namespaces.values():
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)

    # -- faults ----------------------------------------------------------------------------

    def drop(self, sender: str, receiver: str) -> None:
        """Everything ``sender`` sends ``receiver`` is lost, silently."""
        _ip("-n", self.namespaces[receiver], "rule", "add", "pref", "10", "from",
            self.ips[sender], "blackhole")  # fmt: skip
        self._rules.add((receiver, sender))

    def undrop(self, sender: str, receiver: str) -> None:
        _ip("-n", self.namespaces[receiver], "rule", "del", "pref", "10", "from",
            self.ips[sender], "blackhole")  # fmt: skip
        self._rules.discard((receiver, sender))

    def drop_to_clients(self, sender: str) -> None:
        """Everything ``sender`` sends the clients (the host, on the bridge) is lost: a
        rule on the sending side, since the host's own rules are not ours to reorder."""
        _ip("-n", self.namespaces[sender], "rule", "add", "pref", "10", "to",
            f"{self.subnet}.254", "blackhole")  # fmt: skip
        self._client_rules.add(sender)

    def lossy(self, percent: int) -> None:
        """Every member loses ``percent`` % of every packet it sends, at random."""
        for i, ns in enumerate(self.namespaces.values(), 1):
            inner = f"{self.bridge}i{i}"
            _ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "clsact")
            _ip("netns", "exec", ns, *_loss_filter(inner, percent))

    def lossless(self) -> None:
        for i, ns in enumerate(self.namespaces.values(), 1):
            _ip("netns", "exec", ns, "tc", "qdisc", "del", "dev", f"{self.bridge}i{i}", "clsact")

    def term(self) -> int:
        """The highest term any member reports (0 if none answers)."""
        views = [self.cluster.nodes[node].status(timeout=2.0) for node in self.namespaces]
        return max((int(view["term"]) for view in views if view is not None), default=0)

    def cut(self, node: str, others: list[str]) -> None:
        for other in others:
            self.drop(node, other)
            self.drop(other, node)

    def heal(self) -> None:
        for receiver, sender in sorted(self._rules):
            self.undrop(sender, receiver)
        for sender in sorted(self._client_rules):
            _ip("-n", self.namespaces[sender], "rule", "del", "pref", "10", "to",
                f"{self.subnet}.254", "blackhole")  # fmt: skip
        self._client_rules.clear()

    # -- what the measurements look at -------------------------------------------------------

    def status(self, node: str) -> dict[str, Any] | None:
        return self.cluster.nodes[node].status(timeout=0.5)

    def write(self, timeout: float) -> bool:
        """One write (opening a lease) through the client library; did it succeed?"""
        from dlm.client.errors import DlmError

        try:
            with self.cluster.client(timeout=timeout, attempt_timeout=0.5) as client:
                client.open_lease(5000)
        except (DlmError, OSError):
            return False
        return True


@contextmanager
def lab(base: Path, *, release: Path | None = None) -> Iterator[Lab]:
    """``release``: the members run that checkout's ``dlm`` (a parent commit, to measure
    what a fix changed); the clients are always this one's."""
    base.mkdir(parents=True, exist_ok=True)
    made = Lab(base)
    for node in made.cluster.nodes.values():
        node.release = release
    try:
        made.up()
        made.cluster.start_all()
        made.cluster.wait_for_leader(timeout=SETTLE_TIMEOUT_S)
        yield made
    finally:
        made.down()


def _until(condition: Callable[[], bool], cap: float = RECOVERY_CAP_S) -> float:
    """Seconds until ``condition`` holds (polled every 50 ms); ``cap`` if it never does."""
    started = time.monotonic()
    while time.monotonic() - started < cap:
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    return cap


@dataclass
class Recovery:
    cut_then_heal_s: float
    """From the heal until the follower applied an entry committed after it."""
    kill_other_follower_s: float
    """From killing the other follower (2 s after the heal) until a write succeeded."""


def cut_then_heal(the_lab: Lab, cut_s: float, *, one_way: bool = False) -> Recovery:
    """``one_way``: only what the follower sends is lost (it still hears the leader, and
    answers it on a connection that backs off)."""
    cluster = the_lab.cluster
    leader = cluster.wait_for_leader(timeout=SETTLE_TIMEOUT_S).node_id
    follower, other = (n for n in cluster.nodes if n != leader)
    if one_way:
        the_lab.drop(follower, leader)
        the_lab.drop(follower, other)
    else:
        the_lab.cut(follower, [leader, other])
    # The fault's duration, long enough for TCP's back-off to reach seconds.
    time.sleep(cut_s)
    the_lab.heal()
    healed = time.monotonic()
    assert the_lab.write(timeout=10.0), "no write succeeded right after the heal"
    view = the_lab.status(leader)
    target = int(view["commit"]) if view else 0

    def caught_up() -> bool:
        seen = the_lab.status(follower)
        return seen is not None and int(seen["applied"]) >= target

    # 2 s after the heal the other follower dies, whether the first caught up or not.
    caught: float | None = None
    killed: float | None = None
    served: float | None = None
    while caught is None or served is None:
        now = time.monotonic()
        if now - healed > RECOVERY_CAP_S:
            break
        if caught is None and caught_up():
            caught = time.monotonic() - healed
        if killed is None and now - healed >= 2.0:
            cluster.nodes[other].kill()
            killed = time.monotonic()
        if killed is not None and served is None and the_lab.write(timeout=0.5):
            served = time.monotonic() - killed
        time.sleep(0.05)
    caught = RECOVERY_CAP_S if caught is None else caught
    served = RECOVERY_CAP_S if served is None else served
    return Recovery(round(caught, 2), round(served, 2))


def leader_outbound_dropped(the_lab: Lab, drop_s: float) -> float:
    """Seconds from the start of the loss until a write succeeds."""
    cluster = the_lab.cluster
    leader = cluster.wait_for_leader(timeout=SETTLE_TIMEOUT_S).node_id
    for other in cluster.nodes:
        if other != leader:
            the_lab.drop(leader, other)
    the_lab.drop_to_clients(leader)
    started = time.monotonic()
    served = _until(lambda: the_lab.write(timeout=1.0), cap=drop_s)
    if served >= drop_s:
        the_lab.heal()
        served = time.monotonic() - started
        served += _until(lambda: the_lab.write(timeout=1.0))
    else:
        the_lab.heal()
    return round(served, 2)


@dataclass
class Lossy:
    first_write_s: float
    """From the start of the loss until the first write succeeded."""
    writes_ok: int
    writes_tried: int
    """Writes tried one after another (each given up to 2 s) while the loss lasted."""
    terms: int
    """How many terms passed while the loss lasted (0: the leader stayed)."""


def lossy_links(the_lab: Lab, percent: int, lossy_s: float) -> Lossy:
    the_lab.cluster.wait_for_leader(timeout=SETTLE_TIMEOUT_S)
    term_before = the_lab.term()
    the_lab.lossy(percent)
    started = time.monotonic()
    first: float | None = None
    tried = succeeded = 0
    try:
        while time.monotonic() - started < lossy_s:
            tried += 1
            if the_lab.write(timeout=2.0):
                succeeded += 1
                if first is None:
                    first = time.monotonic() - started
        # Read while the loss lasts: the terms it cost, not the ones a heal might add.
        term_after = the_lab.term()
    finally:
        the_lab.lossless()
    return Lossy(
        round(lossy_s if first is None else first, 2),
        succeeded,
        tried,
        max(0, term_after - term_before),
    )


CASES = ("cut", "one-way", "leader-outbound", "lossy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.netns")
    parser.add_argument("--cut", type=float, default=30.0, help="seconds the follower is cut")
    parser.add_argument("--drop", type=float, default=15.0, help="seconds of leader loss")
    parser.add_argument("--loss", type=int, default=30, help="percent of packets lost")
    parser.add_argument("--lossy", type=float, default=20.0, help="seconds of lossy links")
    parser.add_argument("--cases", default=",".join(CASES), help="which, comma-separated")
    parser.add_argument(
        "--release", type=Path, help="run the members from this checkout (a parent commit)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    cases = set(args.cases.split(","))
    if not cases <= set(CASES):
        parser.error(f"--cases: choose from {', '.join(CASES)}")
    why = available() if "lossy" not in cases else loss_available()
    if why is not None:
        print(f"netns cases skipped: {why}")
        return 0
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="dlm-netns-") as tmp:

        def one_lab(name: str) -> AbstractContextManager[Lab]:
            return lab(Path(tmp) / name, release=args.release)

        if "cut" in cases:
            with one_lab("cut") as cut:
                figures.update(asdict(cut_then_heal(cut, args.cut)))
        if "one-way" in cases:
            with one_lab("one-way") as one_way_lab:
                one_way = asdict(cut_then_heal(one_way_lab, args.cut, one_way=True))
            figures.update({f"one_way_{name}": value for name, value in one_way.items()})
        if "leader-outbound" in cases:
            with one_lab("leader-outbound") as outbound:
                figures["leader_outbound_dropped_s"] = leader_outbound_dropped(outbound, args.drop)
        if "lossy" in cases:
            with one_lab("lossy") as lossy:
                measured = asdict(lossy_links(lossy, args.loss, args.lossy))
            figures.update({f"lossy_{name}": value for name, value in measured.items()})
    for name, value in figures.items():
        print(f"{name}: {value:.2f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
