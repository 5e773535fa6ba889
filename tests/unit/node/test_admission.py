"""admission.py without sockets: nothing before the proof reaches the member (invariant 9)."""

from __future__ import annotations

from typing import Any

from dlm import auth
from dlm.node.admission import (
    Acceptance,
    Admit,
    Ask,
    Connected,
    Dialing,
    Failed,
    Refuse,
    Refused,
    Send,
)
from dlm.wire import ErrorCode, Hello, HelloRole, error, welcome

SECRET = b"s" * 32
OTHER = b"o" * 32
REMOVED_TEXT = "member n2 was removed from this cluster: remove its data directory"


def nonce(byte: int) -> bytes:
    return bytes([byte]) * auth.NONCE_BYTES


def acceptance(secret: bytes | None = SECRET, node: str = "n1") -> Acceptance:
    def responder_for(role: HelloRole) -> Any:
        return None if secret is None else auth.Responder(secret, nonce(7), node=node)

    return Acceptance(node_id=node, cluster="c", responder_for=responder_for)


def peer_hello(node: str = "n2", **fields: Any) -> dict[str, Any]:
    return {
        **Hello(HelloRole.PEER, cluster="c", node=node, addr="10.0.0.9:7700").to_wire(),
        **fields,
    }


def dialing(secret: bytes | None = SECRET, tls: bool = False) -> Dialing:
    initiator = None
    if secret is not None:
        initiator = auth.Initiator(secret, nonce(3), role="peer", cluster="c", node="n2")
    return Dialing(peer_id="n1", hello=peer_hello(), initiator=initiator, tls=tls)


# ---------------------------------------------------------------------------
# Accepting
# ---------------------------------------------------------------------------


def test_with_a_secret_the_member_is_asked_only_after_the_proof() -> None:
    dial = dialing()
    accept = acceptance()
    sent = accept.hello(dial.hello)
    assert isinstance(sent, Send)  # our welcome and proof; the member knows nothing yet
    connected = dial.reply(sent.frame)
    assert isinstance(connected, Connected) and connected.auth_frame is not None
    asked = accept.proof(connected.auth_frame)
    assert isinstance(asked, Ask) and asked.hello.node == "n2"
    admitted = accept.verdict(None)
    assert isinstance(admitted, Admit) and admitted.greeting is None  # the welcome went out
    assert admitted.sealer is not None and admitted.opener is not None


def test_a_wrong_or_replayed_proof_is_refused_without_asking_the_member() -> None:
    # A proof made for another connection (another responder nonce): a replay.
    recorded_dial = dialing()
    other = auth.Responder(SECRET, nonce(9), node="n1")
    recorded_welcome = {**welcome("n1", "c"), **other.welcome_fields(recorded_dial.hello)}
    recorded = recorded_dial.reply(recorded_welcome)
    assert isinstance(recorded, Connected)
    accept = acceptance()
    assert isinstance(accept.hello(recorded_dial.hello), Send)
    refused = accept.proof(recorded.auth_frame)
    assert isinstance(refused, Refuse) and refused.why == "auth"
    assert refused.frame["code"] == "AUTH_FAILED"
    # And a proof from a holder of another secret.
    dial = dialing(OTHER)
    accept = acceptance()
    sent = accept.hello(dial.hello)
    assert isinstance(sent, Send)
    assert isinstance(dial.reply(sent.frame), Failed)  # it cannot check our proof either


def test_a_hello_without_the_handshake_is_refused_when_a_secret_is_set() -> None:
    refused = acceptance().hello(peer_hello())
    assert isinstance(refused, Refuse) and refused.why == "auth"


def test_without_a_secret_the_member_is_asked_at_the_hello_and_the_welcome_follows() -> None:
    accept = acceptance(None)
    asked = accept.hello(peer_hello())
    assert isinstance(asked, Ask)
    admitted = accept.verdict(None)
    assert isinstance(admitted, Admit) and admitted.greeting is not None


def test_the_members_refusal_after_the_proof_is_sealed() -> None:
    dial = dialing()
    accept = acceptance()
    sent = accept.hello(dial.hello)
    assert isinstance(sent, Send)
    connected = dial.reply(sent.frame)
    assert isinstance(connected, Connected)
    assert isinstance(accept.proof(connected.auth_frame), Ask)
    refused = accept.verdict(error(None, ErrorCode.BAD_REQUEST, REMOVED_TEXT))
    assert isinstance(refused, Refuse) and refused.sealer is not None and refused.why == "member"
    assert dial.later(refused.frame) == Refused(REMOVED_TEXT, authenticated=True)


def test_a_peer_of_another_cluster_is_refused_before_anything_else() -> None:
    refused = acceptance().hello(peer_hello(cluster="other"))
    assert isinstance(refused, Refuse) and refused.why == "cluster"


# ---------------------------------------------------------------------------
# Dialling
# ---------------------------------------------------------------------------


def test_a_refusal_before_the_proof_is_authenticated_only_by_tls() -> None:
    spoofed = error(None, ErrorCode.BAD_REQUEST, REMOVED_TEXT)
    assert dialing().reply(spoofed) == Refused(REMOVED_TEXT, authenticated=False)
    assert dialing(None).reply(spoofed) == Refused(REMOVED_TEXT, authenticated=False)
    assert dialing(None, tls=True).reply(spoofed) == Refused(REMOVED_TEXT, authenticated=True)


def test_a_welcome_without_a_valid_proof_fails_the_dial() -> None:
    assert isinstance(dialing().reply(welcome("n1", "c")), Failed)
    forged = {**welcome("n1", "c"), "auth_nonce": nonce(1), "auth_proof": b"\0" * 32}
    assert isinstance(dialing().reply(forged), Failed)
    assert isinstance(dialing().reply(welcome("n3", "c")), Failed)  # not the member we dialled
    assert isinstance(dialing().reply("nonsense"), Failed)


def test_without_any_authentication_no_refusal_is_authenticated() -> None:
    dial = dialing(None)
    connected = dial.reply(welcome("n1", "c"))
    assert isinstance(connected, Connected) and connected.auth_frame is None
    later = dial.later(error(None, ErrorCode.BAD_REQUEST, REMOVED_TEXT))
    assert later == Refused(REMOVED_TEXT, authenticated=False)


def test_a_client_with_a_secret_reaches_the_member_only_after_its_proof() -> None:
    initiator = auth.Initiator(SECRET, nonce(4), role="client", cluster="", node="")
    hello = {**Hello(HelloRole.CLIENT).to_wire(), **initiator.hello_fields()}
    accept = acceptance()
    sent = accept.hello(hello)
    assert isinstance(sent, Send)  # not Ask: the client cap and the machine wait
    asked = accept.proof(initiator.check_welcome(sent.frame))
    assert isinstance(asked, Ask) and asked.hello.role is HelloRole.CLIENT
    # A client that sends something else where its proof belongs is refused.
    accept = acceptance()
    assert isinstance(accept.hello(hello), Send)
    refused = accept.proof({"t": "acquire", "id": 1, "lease": "L", "key": "k"})
    assert isinstance(refused, Refuse) and refused.why == "auth"


def test_with_tls_a_peer_whose_certificate_names_another_member_is_refused_at_once() -> None:
    accept = Acceptance(
        node_id="n1",
        cluster="c",
        responder_for=lambda role: None,
        peer_identity=lambda node: None if node == "n2" else f"the certificate is not {node}'s",
    )
    refused = accept.hello(peer_hello("n3"))
    assert isinstance(refused, Refuse) and refused.why == "auth"
    accept = Acceptance(
        node_id="n1", cluster="c", responder_for=lambda role: None, peer_identity=lambda node: None
    )
    assert isinstance(accept.hello(peer_hello("n2")), Ask)  # TLS proved it: ask at once


# ---------------------------------------------------------------------------
# Cluster incarnations (issue 24): a restored or recovered cluster and its old members
# ---------------------------------------------------------------------------


def incarnated(incarnation: int, secret: bytes | None = SECRET) -> Acceptance:
    def responder_for(role: HelloRole) -> Any:
        return None if secret is None else auth.Responder(secret, nonce(7), node="n1")

    return Acceptance(
        node_id="n1", cluster="c", responder_for=responder_for, incarnation=incarnation
    )


def test_without_a_secret_a_peer_of_another_incarnation_is_refused_at_its_hello() -> None:
    refused = incarnated(4_294_967_338, None).hello(peer_hello())
    assert isinstance(refused, Refuse) and refused.why == "incarnation"
    assert "\n" not in refused.reason
    assert refused.reason.startswith("cluster incarnation mismatch: member n1 is in ")
    assert "so n2 belongs to the old cluster: stop it" in refused.reason


def test_with_a_secret_the_refusal_comes_after_the_proof_and_is_sealed() -> None:
    old = Dialing(
        peer_id="n1",
        hello=peer_hello(),
        initiator=auth.Initiator(SECRET, nonce(3), role="peer", cluster="c", node="n2"),
    )
    accept = incarnated(77)
    sent = accept.hello(old.hello)
    assert isinstance(sent, Send) and sent.frame["incarnation"] == 77
    connected = old.reply(sent.frame)  # a newer incarnation: go on, to be refused with proof
    assert isinstance(connected, Connected) and connected.auth_frame is not None
    refused = accept.proof(connected.auth_frame)
    assert isinstance(refused, Refuse) and refused.why == "incarnation"
    assert refused.sealer is not None


def test_a_member_of_the_same_incarnation_is_asked_as_before() -> None:
    hello = peer_hello(incarnation=77)
    assert isinstance(incarnated(77, None).hello(hello), Ask)
    assert isinstance(incarnated(0, None).hello(peer_hello()), Ask)


def test_the_dialer_of_a_newer_incarnation_gives_up_on_an_older_welcome() -> None:
    new = Dialing(peer_id="n1", hello=peer_hello(incarnation=77), incarnation=77)
    failed = new.reply(welcome("n1", "c"))
    assert isinstance(failed, Failed) and "so n1 belongs to the old cluster" in failed.problem


# ---------------------------------------------------------------------------
# A TLS client certificate's name as the client's identity (issue 23 item 1)
# ---------------------------------------------------------------------------

TABLE = {"ci", "ops"}


def by_certificate(
    names: tuple[str, ...], secret: bytes | None = SECRET, table: set[str] = TABLE
) -> Acceptance:
    def responder_for(role: HelloRole) -> Any:
        return None if secret is None else auth.Responder(secret, nonce(7), node="n1")

    return Acceptance(
        node_id="n1",
        cluster="c",
        responder_for=responder_for,
        client_certificate=lambda: (names, bool(table)),
        known=lambda name: name in table,
    )


def client_hello() -> dict[str, Any]:
    return Hello(HelloRole.CLIENT).to_wire()


def test_a_certificate_naming_an_identity_makes_the_client_it_without_a_secret() -> None:
    for secret in (SECRET, None):
        # CN first, then the subjectAltName DNS names: the first the table has.
        accept = by_certificate(("runner-7", "ci", "ops"), secret)
        asked = accept.hello(client_hello())
        assert isinstance(asked, Ask), asked  # no proof asked for: TLS verified the name
        admitted = accept.verdict(None)
        assert isinstance(admitted, Admit) and admitted.identity == "ci"
        assert admitted.greeting is not None and "auth_proof" not in admitted.greeting


def test_a_certificate_never_makes_the_built_in_admin() -> None:
    accept = by_certificate(("admin",), None)
    refused = accept.hello(client_hello())
    assert isinstance(refused, Refuse) and refused.why == "auth"


def test_a_certificate_naming_no_identity_is_refused_in_one_line_where_identities_exist() -> None:
    accept = by_certificate(("mallory", "mallory.example.net"), None)
    refused = accept.hello(client_hello())
    assert isinstance(refused, Refuse) and refused.frame["code"] == "AUTH_FAILED"
    message = refused.frame["message"]
    assert "\n" not in message
    assert message.startswith("the TLS client certificate names 'mallory', ")
    assert "dlm auth add" in message
    # With a client secret the hello without proof is refused as before (it must prove it).
    accept = by_certificate(("mallory",), SECRET)
    refused = accept.hello(client_hello())
    assert isinstance(refused, Refuse) and "requires authentication" in refused.frame["message"]
    # A cluster without identities admits it as the admin, as before.
    accept = by_certificate(("mallory",), None, table=set())
    assert isinstance(accept.hello(client_hello()), Ask)
    admitted = accept.verdict(None)
    assert isinstance(admitted, Admit) and admitted.identity == "admin"


def test_a_proof_in_the_hello_takes_precedence_over_the_certificate() -> None:
    initiator = auth.Initiator(SECRET, nonce(4), role="client", cluster="", node="")
    hello = {**client_hello(), **initiator.hello_fields()}
    accept = by_certificate(("ci",), SECRET)
    sent = accept.hello(hello)
    assert isinstance(sent, Send)
    assert isinstance(accept.proof(initiator.check_welcome(sent.frame)), Ask)
    admitted = accept.verdict(None)
    assert isinstance(admitted, Admit) and admitted.identity == "admin"  # the client secret's


def test_without_a_certificate_nothing_changes() -> None:
    accept = by_certificate((), None)
    assert isinstance(accept.hello(client_hello()), Ask)
    admitted = accept.verdict(None)
    assert isinstance(admitted, Admit) and admitted.identity == "admin"


# ---------------------------------------------------------------------------
# Partitions
# ---------------------------------------------------------------------------


def partitioned(partition: int, partitions: int, secret: bytes | None = None) -> Acceptance:
    def responder_for(role: HelloRole) -> Any:
        return None if secret is None else auth.Responder(secret, nonce(7), node="n1")

    return Acceptance(
        node_id="n1",
        cluster="c",
        responder_for=responder_for,
        partition=partition,
        partitions=partitions,
    )


def test_the_welcome_names_the_partition_count_and_the_partition_reached() -> None:
    accept = partitioned(2, 4)
    assert isinstance(accept.hello({"t": "hello", "role": "client", "version": 1}), Ask)
    admitted = accept.verdict(None)
    assert isinstance(admitted, Admit) and admitted.greeting is not None
    assert admitted.greeting["partitions"] == 4 and admitted.greeting["partition"] == 2
    accept = partitioned(0, 4)
    accept.hello({"t": "hello", "role": "client", "version": 1})
    greeting = accept.verdict(None)
    assert isinstance(greeting, Admit) and greeting.greeting is not None
    assert greeting.greeting["partitions"] == 4 and "partition" not in greeting.greeting


def test_a_peer_with_another_partition_count_is_refused_naming_both() -> None:
    hello = Hello(HelloRole.PEER, cluster="c", node="n2", partitions=2).to_wire()
    refused = partitioned(0, 4).hello(hello)
    assert isinstance(refused, Refuse) and refused.why == "partitions"
    assert "n1 has --partitions 4" in refused.reason and "n2 --partitions 2" in refused.reason
    # A peer of one partition (it says nothing) and a member of four.
    refused = partitioned(1, 4).hello(peer_hello())
    assert isinstance(refused, Refuse) and refused.why == "partitions"
    # The same count is admitted; so is a client, which never says a count.
    same = Hello(HelloRole.PEER, cluster="c", node="n2", partitions=4).to_wire()
    assert isinstance(partitioned(3, 4).hello(same), Ask)


def test_with_a_secret_the_partition_refusal_waits_for_the_proof_and_is_sealed() -> None:
    initiator = auth.Initiator(SECRET, nonce(3), role="peer", cluster="c", node="n2")
    hello = {
        **Hello(HelloRole.PEER, cluster="c", node="n2", partitions=2).to_wire(),
        **initiator.hello_fields(),
    }
    dial = Dialing(peer_id="n1", hello=hello, initiator=initiator, tls=False)
    accept = partitioned(0, 4, SECRET)
    sent = accept.hello(dial.hello)
    assert isinstance(sent, Send)
    connected = dial.reply(sent.frame)
    assert isinstance(connected, Connected)
    refused = accept.proof(connected.auth_frame)
    assert isinstance(refused, Refuse) and refused.why == "partitions"
    assert refused.sealer is not None


def test_a_member_of_one_partition_welcomes_as_before() -> None:
    accept = acceptance(None)
    accept.hello(peer_hello())
    admitted = accept.verdict(None)
    assert isinstance(admitted, Admit) and admitted.greeting is not None
    assert admitted.greeting == welcome("n1", "c", admitted.greeting["version"])
    assert "partitions" not in Hello(HelloRole.PEER, cluster="c", node="n2").to_wire()
