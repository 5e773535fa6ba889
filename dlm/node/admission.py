"""Admission: what a connection must prove before the member listens to it, decided without IO.

Both ends of a connection between dlm processes run one of these pure objects
(no sockets, no clock, no randomness: the handshake's nonces come in through
the injected ``dlm.auth`` objects). The adapter (accepting.py and server.py
for the accepting side, peers.py for the dialling side) and the whole-node
simulator (tests/sim/nodesim.py) drive the same objects, so the rule below is
the rule the simulator checks (ARCHITECTURE.md, invariant 9).

The rule: with a secret for the connection's role (or TLS for peers), nothing
that arrives before the other side's proof is verified reaches the member.

* ``Acceptance`` (the accepting side) turns a hello into a welcome carrying
  our proof and waits for the initiator's ``auth`` frame; only then does it
  ``Ask`` the adapter to consult the member (``NodeMachine.accept_peer``, the
  client cap), and the member's refusal goes back sealed, so the dialler can
  trust it. Without a secret there is nothing to wait for: TLS has already
  verified the peer's certificate (names checked here through the injected
  ``peer_identity``), or nothing authenticates the connection at all.
* ``Dialing`` (the initiator, a member's outbound peer link) reads the reply
  to its hello. An ``error`` frame before the welcome is a refusal that only
  TLS can vouch for; with a peer secret it could come from anyone on the path
  (or on a dead member's port), so it is ``Refused(authenticated=False)``: the
  dial failed, and nothing else. A refusal that arrives sealed after the
  handshake is authenticated; it may tell the member it was removed.
  Without any authentication no refusal is authenticated, so a member of an
  insecure cluster never stops because a peer said it was removed; it keeps
  being refused, harmlessly, until its operator stops it.

A client's identity (``Acceptance.identity``) comes from what its hello proves: a
credential's proof (``auth: scram-sha256``) makes it that credential's identity, the
cluster's client secret the built-in admin. Only a hello that proves no secret at all
may be named by its TLS client certificate (``certificate_identity``: the subject's CN,
then its subjectAltName DNS names, the first that names an identity in the table; the
CA the member was given verified the certificate): it is then that identity, with or
without a client secret configured. A certificate that names no identity is refused in
one line when the cluster has identities and nothing else proves who the client is
(without a client secret it would otherwise be the admin); with no identities at all,
the cluster admits it as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlm.node.locks.identities import ADMIN
from dlm.wire import (
    PROTOCOL_VERSION,
    ErrorCode,
    Hello,
    HelloRole,
    ProtocolError,
    as_map,
    error,
    incarnation_mismatch,
    partitions_mismatch,
    welcome,
)

IDENTITY_METHOD = "scram-sha256"
"""dlm.auth.IDENTITY_METHOD (this pure room does not import dlm.auth, which loads OpenSSL)."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``frame`` (the welcome with our proof) and wait for the initiator's proof."""

    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ask:
    """The other side is authenticated (or nothing could authenticate it): ask the member
    whether it takes ``hello``, and give its answer to ``Acceptance.verdict``."""

    hello: Hello


@dataclass(frozen=True, slots=True)
class Refuse:
    """Send ``frame`` (sealed by ``sealer`` when there is one) and close.

    ``why``: "hello" (not a usable hello), "auth" (a proof or certificate failed),
    "cluster" (another cluster), "incarnation" (another incarnation of this cluster:
    restored or recovered; sealed once the peer proved itself), "partitions" (a peer
    created with another partition count), "member" (the member
    refused it)."""

    frame: dict[str, Any]
    why: str
    sealer: Any = None

    @property
    def reason(self) -> str:
        return str(self.frame.get("message", ""))


@dataclass(frozen=True, slots=True)
class Admit:
    """The connection is admitted: send ``greeting`` first if it is not None (no handshake
    sent it), then open its frames with ``opener`` and seal ours with ``sealer``."""

    hello: Hello
    greeting: dict[str, Any] | None
    sealer: Any
    opener: Any
    identity: str = ""
    """Who a client proved it is (identities.py): the credential's name, ``admin`` for the
    cluster's client secret or a cluster without one; "" for a peer."""


def certificate_identity(names: tuple[str, ...], known: Callable[[str], bool]) -> str | None:
    """The identity a verified TLS client certificate names: the first of ``names`` (its
    subject's CN, then its subjectAltName DNS names) that ``known`` (the identity table)
    has; the built-in admin is never one (it is the cluster's client secret)."""
    for name in names:
        if name != ADMIN and known(name):
            return name
    return None


def unknown_certificate(names: tuple[str, ...]) -> str:
    """The one line that refuses a client whose certificate names no identity."""
    shown = ", ".join(repr(n) for n in names[:4]) or "no name"
    return (
        f"the TLS client certificate names {shown}, and this cluster has no such identity: "
        "add it (dlm auth add NAME), or connect with a credential (--secret-file)"
    )


def hello_problem(exc: ProtocolError) -> str:
    message = str(exc)
    if exc.code is ErrorCode.TOO_LARGE:
        return f"{message}: this port speaks the dlm protocol"
    return message


class Acceptance:
    """The accepting side of one connection: hello, then (with a secret) the proof, then
    the member's verdict. Each step returns what the adapter must do next.

    ``responder_for(role)``: a fresh ``dlm.auth.Responder`` when that role must prove a
    secret, else None. ``peer_identity(node)``: with TLS, why the peer's certificate
    does not name ``node`` (None: it does); None without TLS.
    ``identity_responder()``: a fresh ``dlm.auth.IdentityResponder`` for a client hello
    that offers a credential (``auth: scram-sha256``), checked against the replicated
    identity table whether or not the cluster has a client secret.
    ``client_certificate()``: with TLS, the names of the client's verified certificate
    (subject CN first, then subjectAltName DNS names; empty without one) and whether the
    identity table has any identity; ``known(name)``: whether the table has ``name``.
    """

    __slots__ = (
        "_certificate_identity",
        "_client_certificate",
        "_cluster",
        "_greeted",
        "_hello",
        "_identity_responder",
        "_incarnation",
        "_known",
        "_node_id",
        "_opener",
        "_partition",
        "_partitions",
        "_peer_identity",
        "_responder",
        "_responder_for",
        "_sealer",
        "_state",
    )

    def __init__(
        self,
        *,
        node_id: str,
        cluster: str,
        responder_for: Callable[[HelloRole], Any],
        peer_identity: Callable[[str], str | None] | None = None,
        incarnation: int = 0,
        partition: int = 0,
        partitions: int = 1,
        identity_responder: Callable[[], Any] | None = None,
        client_certificate: Callable[[], tuple[tuple[str, ...], bool]] | None = None,
        known: Callable[[str], bool] | None = None,
    ) -> None:
        self._node_id = node_id
        self._identity_responder = identity_responder
        self._client_certificate = client_certificate
        self._known = known
        self._certificate_identity: str | None = None
        self._cluster = cluster
        self._incarnation = incarnation
        self._partition = partition
        self._partitions = partitions
        self._responder_for = responder_for
        self._peer_identity = peer_identity
        self._responder: Any = None
        self._hello: Hello | None = None
        self._sealer: Any = None
        self._opener: Any = None
        self._greeted = False
        self._state = "hello"

    @property
    def hello_seen(self) -> Hello | None:
        """The hello, once it parsed (for logs: nothing in it is proved yet)."""
        return self._hello

    def hello(self, raw: Any) -> Send | Ask | Refuse:
        """The connection's first frame (decoded)."""
        if self._state != "hello":
            raise RuntimeError("hello() twice")
        self._state = "closed"
        try:
            hello = Hello.from_wire(raw)
        except ProtocolError as exc:
            return Refuse(error(None, exc.code, hello_problem(exc)), "hello")
        self._hello = hello
        if hello.version > PROTOCOL_VERSION:
            message = (
                f"protocol version {hello.version} is not supported "
                f"(this member speaks 1 to {PROTOCOL_VERSION}): upgrade this member"
            )
            return Refuse(error(None, ErrorCode.BAD_REQUEST, message), "hello")
        cluster = self._cluster
        if hello.role is HelloRole.PEER:
            if hello.cluster != cluster:
                message = (
                    f"cluster id mismatch: this member {self._node_id} is in cluster "
                    f"{cluster!r}, the peer says {hello.cluster!r}"
                )
                return Refuse(error(None, ErrorCode.BAD_REQUEST, message), "cluster")
            if self._peer_identity is not None:
                problem = self._peer_identity(hello.node)
                if problem is not None:
                    return Refuse(error(None, ErrorCode.AUTH_FAILED, problem), "auth")
        elif hello.cluster and hello.cluster != cluster:
            message = (
                f"this member is in cluster {cluster!r}, not {hello.cluster!r}: check DLM_CLUSTER"
            )
            return Refuse(error(None, ErrorCode.BAD_REQUEST, message), "cluster")
        offers = raw.get("auth") if isinstance(raw, dict) else None
        if (
            hello.role is HelloRole.CLIENT
            and self._identity_responder is not None
            and offers == IDENTITY_METHOD
        ):
            responder = self._identity_responder()
        elif hello.role is HelloRole.CLIENT and offers is None and self._client_certificate:
            # Proves no secret: its certificate may say who it is (see the module's text).
            named = self._by_certificate(self._client_certificate())
            if isinstance(named, Refuse):
                return named
            responder = None if named else self._responder_for(hello.role)
        else:
            responder = self._responder_for(hello.role)
        if responder is None:
            other = self._other_incarnation(hello) or self._other_partitions(hello)
            if other is not None:
                return other
            self._state = "verdict"
            return Ask(hello)
        greeting = self._welcome(hello)
        try:
            greeting.update(responder.welcome_fields(raw))
        except ValueError as exc:  # dlm.auth.AuthError
            return Refuse(error(None, ErrorCode.AUTH_FAILED, str(exc)), "auth")
        self._responder = responder
        self._greeted = True
        self._state = "proof"
        return Send(greeting)

    def _by_certificate(self, seen: tuple[tuple[str, ...], bool]) -> bool | Refuse:
        """Whether the client's certificate names an identity (it is that identity then), or
        the refusal of one that names none in a cluster with identities and no secret."""
        names, has_identities = seen
        if not names or self._known is None:
            return False
        self._certificate_identity = certificate_identity(names, self._known)
        if self._certificate_identity is not None:
            return True
        if has_identities and self._responder_for(HelloRole.CLIENT) is None:
            return Refuse(error(None, ErrorCode.AUTH_FAILED, unknown_certificate(names)), "auth")
        return False

    def proof(self, raw: Any) -> Ask | Refuse:
        """The initiator's ``auth`` frame (decoded): checked before anything else counts."""
        if self._state != "proof":
            raise RuntimeError("proof() when no proof is awaited")
        self._state = "closed"
        try:
            self._sealer, self._opener = self._responder.check_auth(as_map(raw))
        except (ProtocolError, ValueError) as exc:  # ValueError: dlm.auth.AuthError
            return Refuse(error(None, ErrorCode.AUTH_FAILED, str(exc)), "auth")
        assert self._hello is not None
        # After the proof, so the refusal is sealed: the peer may believe it (and a member
        # of the old incarnation stops: NodeMachine.peer_refused).
        other = self._other_incarnation(self._hello) or self._other_partitions(self._hello)
        if other is not None:
            return other
        self._state = "verdict"
        return Ask(self._hello)

    def _other_incarnation(self, hello: Hello) -> Refuse | None:
        if hello.role is not HelloRole.PEER or hello.incarnation == self._incarnation:
            return None
        message = incarnation_mismatch(
            self._node_id, self._incarnation, hello.node, hello.incarnation
        )
        return Refuse(error(None, ErrorCode.BAD_REQUEST, message), "incarnation", self._sealer)

    def _other_partitions(self, hello: Hello) -> Refuse | None:
        """The refusal of a peer created with another partition count: its partition i
        is not our partition i, and the two would mix keys of different groups."""
        if hello.role is not HelloRole.PEER or hello.partitions == self._partitions:
            return None
        message = partitions_mismatch(self._node_id, self._partitions, hello.node, hello.partitions)
        return Refuse(error(None, ErrorCode.BAD_REQUEST, message), "partitions", self._sealer)

    def _welcome(self, hello: Hello) -> dict[str, Any]:
        return welcome(
            self._node_id,
            self._cluster,
            min(hello.speaks, PROTOCOL_VERSION),
            self._incarnation if hello.role is HelloRole.PEER else 0,
            partitions=self._partitions,
            partition=self._partition,
        )

    def verdict(self, refusal: dict[str, Any] | None) -> Admit | Refuse:
        """The member's answer to ``Ask``: the error frame that refuses the connection, or
        None to admit it."""
        if self._state != "verdict":
            raise RuntimeError("verdict() before the member was asked")
        self._state = "closed"
        if refusal is not None:
            return Refuse(refusal, "member", self._sealer)
        hello = self._hello
        assert hello is not None
        greeting = None
        if not self._greeted:
            greeting = self._welcome(hello)
        return Admit(hello, greeting, self._sealer, self._opener, self.identity)

    @property
    def identity(self) -> str:
        """Who a client proved to be (its credential's name, or the built-in admin for the
        cluster's client secret or none); "" for a peer or before the hello."""
        hello = self._hello
        if hello is None or hello.role is not HelloRole.CLIENT:
            return ""
        if self._certificate_identity is not None:
            return self._certificate_identity
        return getattr(self._responder, "identity", ADMIN) if self._responder else ADMIN


@dataclass(frozen=True, slots=True)
class Connected:
    """The peer proved itself (or nothing could be proved): send ``auth_frame`` if it is not
    None, then seal every frame with ``sealer`` and open the peer's with ``opener``."""

    auth_frame: dict[str, Any] | None
    sealer: Any
    opener: Any
    version: int | None


@dataclass(frozen=True, slots=True)
class Failed:
    """The dial failed: log ``problem`` under ``event``; nothing about the member changes."""

    event: str
    problem: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The peer refused the link with ``message``. Only an ``authenticated`` refusal may
    reach the member (NodeMachine.peer_refused); any other is a failed dial."""

    message: str
    authenticated: bool


class Dialing:
    """The dialling side of one outbound peer link: its hello, the reply, and what follows.

    ``initiator``: a fresh ``dlm.auth.Initiator`` with the peer secret (None: no secret);
    ``tls``: the connection runs over TLS that verified the peer's certificate.
    """

    __slots__ = ("_incarnation", "_initiator", "_peer_id", "_tls", "_welcomed", "hello")

    def __init__(
        self,
        *,
        peer_id: str,
        hello: dict[str, Any],
        initiator: Any = None,
        tls: bool = False,
        incarnation: int = 0,
    ) -> None:
        self._peer_id = peer_id
        self._incarnation = incarnation
        self._initiator = initiator
        self._tls = tls
        self._welcomed = False
        self.hello = hello if initiator is None else {**hello, **initiator.hello_fields()}
        """The hello to send."""

    @property
    def authenticates(self) -> bool:
        """Something on this link proves who the peer is (a secret or TLS)."""
        return self._initiator is not None or self._tls

    def reply(self, raw: Any) -> Connected | Failed | Refused:
        """The first frame the peer sent (decoded)."""
        if self._welcomed:
            raise RuntimeError("reply() twice")
        if not isinstance(raw, dict) or raw.get("t") != "welcome":
            message = raw.get("message") if isinstance(raw, dict) else None
            if isinstance(raw, dict) and raw.get("t") == "error" and isinstance(message, str):
                # Before a proof, only TLS says who wrote this.
                return Refused(message, authenticated=self._tls)
            return Failed("peer_refused", f"the peer answered {str(message)[:200]!r}")
        if raw.get("node") != self._peer_id:
            # --peers names the wrong address for it: its messages would all be dropped.
            return Failed("peer_refused", f"the member there says it is {raw.get('node')!r}")
        theirs = raw.get("incarnation", 0)
        theirs = theirs if isinstance(theirs, int) and not isinstance(theirs, bool) else -1
        if theirs < self._incarnation:
            # An older incarnation welcomed us (a member of an earlier release, which does
            # not check). When theirs is newer we go on: that member refuses us after our
            # proof, sealed, which tells this member, believably, that it is the old one.
            local = str(self.hello.get("node", ""))
            return Failed(
                "peer_refused",
                incarnation_mismatch(local, self._incarnation, self._peer_id, theirs),
            )
        auth_frame = sealer = opener = None
        if self._initiator is not None:
            try:
                auth_frame = self._initiator.check_welcome(raw)
            except ValueError as exc:  # dlm.auth.AuthError
                return Failed("peer_auth_failed", str(exc))
            sealer, opener = self._initiator.keys()
        self._welcomed = True
        version = raw.get("version")
        speaks = version if isinstance(version, int) and not isinstance(version, bool) else None
        return Connected(auth_frame, sealer, opener, speaks)

    def later(self, raw: Any) -> Refused | None:
        """A frame after the welcome (decoded; opened by the ``opener``, so with a secret
        it is authenticated). An error is the member refusing us after the handshake."""
        if not self._welcomed:
            raise RuntimeError("later() before the welcome")
        if isinstance(raw, dict) and raw.get("t") == "error":
            message = raw.get("message")
            if isinstance(message, str):
                return Refused(message, authenticated=self.authenticates)
        return None
