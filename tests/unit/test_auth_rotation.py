"""A secret's rotation with an overlap (dlm/auth.py ``previous``; SIGHUP, reload.py): a
member given a new secret still accepts the one it replaced until its next reload, and
a member dialling with the new one still reaches a peer that holds only the old."""

from __future__ import annotations

from typing import Any

import pytest

from dlm import auth, wire
from tests.unit.test_auth import NI, NR, peer_hello, through_the_wire

OLD = b"o" * 40
NEW = b"n" * 40
THIRD = b"t" * 40


def _connect(
    initiator_secret: bytes,
    responder_secret: bytes,
    *,
    initiator_previous: bytes | None = None,
    responder_previous: bytes | None = None,
) -> None:
    """A whole handshake, then one sealed frame each way; AuthError if it fails."""
    initiator = auth.Initiator(
        initiator_secret, NI, role="peer", cluster="c1", node="n2", previous=initiator_previous
    )
    responder = auth.Responder(responder_secret, NR, node="n1", previous=responder_previous)
    hello = peer_hello(initiator)
    welcome: dict[str, Any] = through_the_wire(
        {**wire.welcome("n1", "c1"), **responder.welcome_fields(hello)}
    )
    auth_frame = through_the_wire(initiator.check_welcome(welcome))
    r_sealer, r_opener = responder.check_auth(auth_frame)
    i_sealer, i_opener = initiator.keys()
    to_responder = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT, r_opener)
    to_responder.feed(wire.encode_frame({"t": "ping"}, i_sealer))
    assert [f["t"] for f in to_responder.frames()] == ["ping"]
    to_initiator = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT, i_opener)
    to_initiator.feed(wire.encode_frame({"t": "pong"}, r_sealer))
    assert [f["t"] for f in to_initiator.frames()] == ["pong"]


def test_a_rotating_member_accepts_the_old_secret_and_the_new() -> None:
    _connect(OLD, NEW, responder_previous=OLD)  # a client not given the new one yet
    _connect(NEW, NEW, responder_previous=OLD)  # one given it already


def test_a_rotating_member_reaches_a_peer_that_holds_only_the_old_secret() -> None:
    _connect(NEW, OLD, initiator_previous=OLD)
    _connect(NEW, NEW, initiator_previous=OLD, responder_previous=OLD)


def test_once_the_overlap_ends_the_old_secret_is_refused() -> None:
    with pytest.raises(auth.AuthError):
        _connect(OLD, NEW)
    with pytest.raises(auth.AuthError):
        _connect(NEW, OLD)
    with pytest.raises(auth.AuthError):
        _connect(THIRD, NEW, responder_previous=OLD)  # neither secret


def test_a_welcome_of_a_rotating_member_leads_with_the_old_proof() -> None:
    # Initiators of the previous release check ``auth_proof`` alone: during a rotation
    # most of them still hold the old secret.
    initiator = auth.Initiator(OLD, NI, role="peer", cluster="c1", node="n2")
    responder = auth.Responder(NEW, NR, node="n1", previous=OLD)
    welcome = responder.welcome_fields(peer_hello(initiator))
    assert len(welcome["auth_proofs"]) == 1
    plain = auth.Responder(OLD, NR, node="n1").welcome_fields(peer_hello(initiator))
    assert welcome["auth_proof"] == plain["auth_proof"]
