"""A stranger on the simulated network: frames before, and instead of, a proof.

The members of the whole-node simulator (nodesim.py) hold a peer secret. The
stranger does not. It records what it can see of real handshakes between
members (their hellos, welcomes, ``auth`` frames, a sealed refusal) and then,
at random moments from its own seeded generator, against a random member:

* ``spoofed_refusal``: answers the member's dial to a peer (a live one, a
  crashed one, a removed one) with "member X was removed from this cluster",
  before any proof;
* ``spoofed_welcome``: answers a dial with a welcome naming the peer, with a
  made-up proof or one replayed from a recorded handshake;
* ``spoofed_hello``: dials the member with a peer hello claiming a real id (a
  member, a removed member, the next member to join) at the stranger's address,
  asking for the handshake, then sends a made-up proof, a replayed ``auth``
  frame, or nothing;
* ``replayed_handshake``: replays a recorded hello and its ``auth`` frame;
* ``injected_refusal``: sits on the path of a real, completed link and injects
  a sealed refusal recorded from another connection;
* ``spoofed_client``: dials the member as a client asking for the handshake,
  and sends a request (open a lease, take a lock) where its proof belongs.

Each act runs through the same pure admission objects the runtime drives
(dlm/node/admission.py: ``Acceptance``, ``Dialing``), and whatever they let
through goes to the member's machine exactly as the adapter would pass it
(``accept_peer`` after an ``Ask``; ``peer_refused`` for an authenticated
``Refused``). The checker: the member's state (address book, unlisted peers,
removed ids, whether it stopped, the versions and links it knows, its term and
leader) is the same after the act as before; otherwise ``unauthenticated``.
With the real objects nothing ever reaches a machine, so the stranger does not
change the rest of the run (it draws only from its own generator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dlm import auth
from dlm.node.admission import Acceptance, Admit, Ask, Connected, Dialing, Refuse, Refused, Send
from dlm.node.machine import REMOVED, NodeMachine
from dlm.wire import ErrorCode, FrameDecoder, Hello, HelloRole, ProtocolError, encode_frame, error
from dlm.wire import welcome as welcome_frame

from .checkers import Violation

if TYPE_CHECKING:
    from .nodesim import NodeSimulation, SimMember

PEER_SECRET = b"the-simulated-cluster-peer-secret"
CLIENT_SECRET = b"the-simulated-cluster-client-secret"
CLUSTER = "sim"
ACTS = (
    "spoofed_refusal",
    "spoofed_welcome",
    "spoofed_hello",
    "replayed_handshake",
    "injected_refusal",
    "spoofed_client",
)
GAP_US = (20_000, 300_000)
"""Between two acts of the stranger (simulated µs)."""
AFTER_WELCOME_LIMIT = 4096


def fingerprint(machine: NodeMachine) -> tuple[Any, ...]:
    """What an unauthenticated frame must never change in a member."""
    raft = machine.raft
    return (
        sorted(machine.membership.addresses.items()),
        list(machine.membership.unlisted.items()),
        sorted(machine.membership.removed),
        machine._stopped,
        sorted(machine.health.versions.items()),
        sorted(machine.health.links_down),
        sorted(machine.clients.conns),
        raft.term,
        raft.leader,
        raft.role,
    )


class _Recording:
    """Frames the stranger saw on the wire between two members."""

    def __init__(self, hello: dict[str, Any], welcome: dict[str, Any], proof: Any, sealed: bytes):
        self.hello = hello
        self.welcome = welcome
        self.proof = proof
        self.sealed_refusal = sealed


class Stranger:
    def __init__(self, sim: NodeSimulation) -> None:
        self.sim = sim
        self.rng = sim.rng_for("stranger")
        self.recordings: list[_Recording] = []

    # -- the objects the runtime uses, as the adapter builds them ---------------------

    def _nonce(self) -> bytes:
        return self.rng.randbytes(auth.NONCE_BYTES)

    def _acceptance(self, node_id: str, real: bool = False) -> Acceptance:
        """The accepting side's object (``real``: the release's own, not a mutant's)."""

        def responder_for(role: HelloRole) -> Any:
            secret = PEER_SECRET if role is HelloRole.PEER else CLIENT_SECRET
            return auth.Responder(secret, self._nonce(), node=node_id)

        cls = Acceptance if real else self.sim.options.acceptance_class
        return cls(node_id=node_id, cluster=CLUSTER, responder_for=responder_for)

    def _dialing(self, local: str, peer: str, real: bool = False) -> Dialing:
        """The dialling side's object (``real``: the release's own, not a mutant's)."""
        initiator = auth.Initiator(
            PEER_SECRET, self._nonce(), role="peer", cluster=CLUSTER, node=local
        )
        hello = Hello(HelloRole.PEER, cluster=CLUSTER, node=local, addr=f"{local}:7700").to_wire()
        cls = Dialing if real else self.sim.options.dialing_class
        return cls(peer_id=peer, hello=hello, initiator=initiator)

    # -- scheduling ---------------------------------------------------------------------

    def start(self) -> None:
        self.sim.world.after(self.rng.randint(*GAP_US), self._act)

    def _act(self) -> None:
        sim = self.sim
        if sim.world.now >= sim.options.duration_us - GAP_US[1]:
            return
        sim.world.after(self.rng.randint(*GAP_US), self._act)
        live = [m for m in sim.members.values() if m.up and not m.removed]
        if len(live) >= 2 and (not self.recordings or self.rng.random() < 0.1):
            self._record(*self.rng.sample(live, 2))
        if not live:
            return
        member = self.rng.choice(live)
        act = self.rng.choice(ACTS)
        sim.stats[f"stranger_{act}"] += 1
        sim.trace(f"S{sim.world.now}{member.id}{act}")
        getattr(self, f"_{act}")(member)

    def _unproved(self, member: SimMember, act: Callable[[NodeMachine], None]) -> None:
        """Runs ``act`` on the member (held while it is paused) and checks it changed nothing."""

        def checked(machine: NodeMachine) -> None:
            before = fingerprint(machine)
            act(machine)
            if fingerprint(machine) != before:
                raise Violation(
                    "unauthenticated",
                    f"a frame from the stranger, who proved nothing, changed {member.id}: "
                    f"{before} -> {fingerprint(machine)}",
                )

        self.sim.on_member(member, checked)

    # -- recording a real handshake ----------------------------------------------------

    def _record(self, dialer: SimMember, acceptor: SimMember) -> None:
        # What went over the wire between two members (a mutant's objects would not
        # complete a handshake: they exist to be caught with the stranger).
        dial = self._dialing(dialer.id, acceptor.id, real=True)
        accept = self._acceptance(acceptor.id, real=True)
        sent = accept.hello(dial.hello)
        assert isinstance(sent, Send), sent
        connected = dial.reply(sent.frame)
        assert isinstance(connected, Connected), connected
        assert isinstance(accept.proof(connected.auth_frame), Ask)
        text = f"member {dialer.id} {REMOVED}: remove its data directory"
        refusal = accept.verdict(error(None, ErrorCode.BAD_REQUEST, text))
        assert isinstance(refusal, Refuse)
        sealed = encode_frame(refusal.frame, refusal.sealer)
        self.recordings.append(_Recording(dial.hello, sent.frame, connected.auth_frame, sealed))
        del self.recordings[:-8]

    # -- the dialling side: the stranger answers a member's dial -----------------------

    def _peer_for(self, member: SimMember) -> str:
        others = [n for n in self.sim.members if n != member.id]
        return self.rng.choice(others) if others else member.id

    def _answer_dial(self, member: SimMember, peer: str, answer: Any) -> None:
        def dial_answered(machine: NodeMachine) -> None:
            dial = self._dialing(member.id, peer)
            outcome = dial.reply(answer)
            # What peers.py does with it: only a proved refusal reaches the machine.
            if isinstance(outcome, Refused) and outcome.authenticated:
                machine.peer_refused(peer, outcome.message)

        self._unproved(member, dial_answered)

    def _spoofed_refusal(self, member: SimMember) -> None:
        text = f"member {member.id} {REMOVED}: remove its data directory and join it again"
        self._answer_dial(member, self._peer_for(member), error(None, ErrorCode.BAD_REQUEST, text))

    def _spoofed_welcome(self, member: SimMember) -> None:
        peer = self._peer_for(member)
        if self.recordings and self.rng.random() < 0.5:
            answer = dict(self.rng.choice(self.recordings).welcome)
        else:
            answer = {
                **welcome_frame(peer, CLUSTER),
                "auth_nonce": self._nonce(),
                "auth_proof": self.rng.randbytes(32),
            }
        self._answer_dial(member, peer, answer)

    def _injected_refusal(self, member: SimMember) -> None:
        """A real link from ``member`` completes its handshake; the stranger, on the path,
        injects a sealed refusal recorded from another connection."""
        if not self.recordings:
            return
        peer = self._peer_for(member)
        injected = self.rng.choice(self.recordings).sealed_refusal

        def injected_frame(machine: NodeMachine) -> None:
            dial = self._dialing(member.id, peer)
            accept = self._acceptance(peer, real=True)
            sent = accept.hello(dial.hello)
            assert isinstance(sent, Send)
            connected = dial.reply(sent.frame)
            assert isinstance(connected, Connected)
            decoder = FrameDecoder(AFTER_WELCOME_LIMIT, connected.opener)
            decoder.feed(injected)
            try:
                frames = list(decoder.frames())
            except ProtocolError:
                return  # peers.py drops the link
            for frame in frames:
                refusal = dial.later(frame)
                if refusal is not None and refusal.authenticated:
                    machine.peer_refused(peer, refusal.message)

        self._unproved(member, injected_frame)

    # -- the accepting side: the stranger dials a member -------------------------------

    def _claimed_id(self, member: SimMember) -> str:
        sim = self.sim
        choices = [n for n in sim.members if n != member.id]
        from .nodesim import SPARE_NAMES

        spare = next((n for n in SPARE_NAMES if n not in sim.members), None)
        if spare is not None:
            choices += [spare, spare]  # an id the member's log does not name yet
        return self.rng.choice(choices) if choices else "n99"

    def _hello_then(self, member: SimMember, hello: dict[str, Any], proof: Any) -> None:
        def dialled(machine: NodeMachine) -> None:
            accept = self._acceptance(member.id)
            outcome: Any = accept.hello(hello)
            if isinstance(outcome, Send):
                if proof is None:
                    return  # the stranger hangs up; the hello timer closes the connection
                outcome = accept.proof(proof)
            if isinstance(outcome, Ask):
                # What server.peer_verdict does once the admission asks.
                node = outcome.hello
                problem = machine.accept_peer(node.node, node.speaks, node.addr)
                refusal = None if problem is None else error(None, ErrorCode.BAD_REQUEST, problem)
                accept.verdict(refusal)

        self._unproved(member, dialled)

    def _spoofed_hello(self, member: SimMember) -> None:
        claimed = self._claimed_id(member)
        hello = {
            **Hello(HelloRole.PEER, cluster=CLUSTER, node=claimed, addr="stranger:7700").to_wire(),
            "auth": auth.METHOD,
            "auth_nonce": self._nonce(),
        }
        roll = self.rng.random()
        if roll < 0.3:
            proof = None
        elif roll < 0.6 or not self.recordings:
            proof = {"t": "auth", "proof": self.rng.randbytes(32)}
        else:
            proof = self.rng.choice(self.recordings).proof
        self._hello_then(member, hello, proof)

    def _replayed_handshake(self, member: SimMember) -> None:
        if not self.recordings:
            return
        recording = self.rng.choice(self.recordings)
        self._hello_then(member, dict(recording.hello), recording.proof)

    def _spoofed_client(self, member: SimMember) -> None:
        hello = {
            **Hello(HelloRole.CLIENT, cluster=CLUSTER).to_wire(),
            "auth": auth.METHOD,
            "auth_nonce": self._nonce(),
        }
        request = self.rng.choice(
            (
                {"t": "open", "id": 1, "lease": "stranger", "ttl_ms": 60_000, "seq": 1},
                {"t": "acquire", "id": 1, "lease": "stranger", "key": "k0", "seq": 2},
            )
        )

        def dialled(machine: NodeMachine) -> None:
            accept = self._acceptance(member.id)
            outcome: Any = accept.hello(hello)
            if isinstance(outcome, Send):
                outcome = accept.proof(request)  # the request where the proof belongs
            if isinstance(outcome, Ask):
                # What accepting.py does for an admitted client: register it, then its
                # frames go to the machine.
                decision = accept.verdict(None)
                if isinstance(decision, Admit):
                    number = -1 - self.rng.randrange(1 << 30)  # never one of the sim's own
                    machine.client_connected(number, "stranger")
                    machine.client_frame(number, request, self.sim._now(member))

        self._unproved(member, dialled)
