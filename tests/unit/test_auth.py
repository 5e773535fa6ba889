"""Shared-secret authentication: the handshake, sealed frames, and secret files.

The handshake runs through the real wire codec (hello and welcome maps, frames,
FrameDecoder), with fixed nonces so each run is the same.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlm import auth, wire
from tests.unit.fuzz import FUZZ

SECRET = b"k" * 40
OTHER = b"o" * 40
NI = bytes(range(32))
NR = bytes(range(100, 132))


def through_the_wire(
    frame: dict[str, Any], opener: auth.FrameOpener | None = None
) -> dict[str, Any]:
    """``frame`` as the other side decodes it."""
    decoder = wire.FrameDecoder(wire.PEER_FRAME_LIMIT, opener)
    decoder.feed(wire.encode_frame(frame))
    (decoded,) = list(decoder.frames())
    assert isinstance(decoded, dict), decoded
    return decoded


def peer_hello(initiator: auth.Initiator) -> dict[str, Any]:
    hello = wire.Hello(wire.HelloRole.PEER, cluster="c1", node="n2").to_wire()
    return through_the_wire({**hello, **initiator.hello_fields()})


def handshake(
    initiator_secret: bytes = SECRET, responder_secret: bytes = SECRET
) -> tuple[auth.Initiator, auth.Responder, dict[str, Any], dict[str, Any], dict[str, Any]]:
    initiator = auth.Initiator(initiator_secret, NI, role="peer", cluster="c1", node="n2")
    responder = auth.Responder(responder_secret, NR, node="n1")
    hello = peer_hello(initiator)
    assert wire.Hello.from_wire(hello) == wire.Hello(wire.HelloRole.PEER, cluster="c1", node="n2")
    welcome = through_the_wire({**wire.welcome("n1", "c1"), **responder.welcome_fields(hello)})
    auth_frame = through_the_wire(initiator.check_welcome(welcome))
    return initiator, responder, hello, welcome, auth_frame


def test_both_sides_prove_themselves_and_seal_every_frame() -> None:
    initiator, responder, _, _, auth_frame = handshake()
    i_sealer, i_opener = initiator.keys()
    r_sealer, r_opener = responder.check_auth(auth_frame)
    to_responder = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT, r_opener)
    to_initiator = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT, i_opener)
    for n in range(3):
        to_responder.feed(wire.encode_frame({"t": "ping", "n": n}, i_sealer))
        to_initiator.feed(wire.encode_frame({"t": "pong", "n": n}, r_sealer))
    assert [f["n"] for f in to_responder.frames()] == [0, 1, 2]
    assert [f["n"] for f in to_initiator.frames()] == [0, 1, 2]


def test_the_secret_never_crosses_the_wire() -> None:
    _, _, hello, welcome, auth_frame = handshake()
    for frame in (hello, welcome, auth_frame):
        assert SECRET not in wire.encode_frame(frame)


def test_a_responder_without_the_secret_is_found_out_by_the_initiator() -> None:
    initiator = auth.Initiator(SECRET, NI, role="client", cluster="", node="")
    impostor = auth.Responder(OTHER, NR, node="n1")
    client_hello = wire.Hello(wire.HelloRole.CLIENT).to_wire()
    hello = through_the_wire({**client_hello, **initiator.hello_fields()})
    welcome = {**wire.welcome("n1", "c1"), **impostor.welcome_fields(hello)}
    with pytest.raises(auth.AuthError, match="does not hold this secret"):
        initiator.check_welcome(welcome)
    with pytest.raises(RuntimeError):
        initiator.keys()


def test_an_initiator_without_the_secret_is_refused() -> None:
    # An auth frame made with another secret, over the very same nonces and fields.
    _, _, _, _, forged = handshake(initiator_secret=OTHER, responder_secret=OTHER)
    _, responder, _, _, genuine = handshake()
    assert forged["proof"] != genuine["proof"]
    with pytest.raises(auth.AuthError, match="authentication failed"):
        responder.check_auth(forged)
    with pytest.raises(auth.AuthError):
        responder.check_auth({"t": "auth"})


def test_a_recorded_hello_and_auth_frame_cannot_be_replayed() -> None:
    _, _, hello, _, auth_frame = handshake()
    later = auth.Responder(SECRET, bytes(32), node="n1")  # a fresh nonce, as every connection
    later.welcome_fields(hello)
    with pytest.raises(auth.AuthError):
        later.check_auth(auth_frame)


def test_a_recorded_welcome_cannot_be_replayed_to_a_new_initiator() -> None:
    _, _, _, welcome, _ = handshake()
    later = auth.Initiator(SECRET, bytes(32), role="peer", cluster="c1", node="n2")
    with pytest.raises(auth.AuthError):
        later.check_welcome(welcome)


@pytest.mark.parametrize(
    ("field", "value"),
    [("node", "n3"), ("cluster", "c2"), ("role", "client"), ("version", 2), ("auth_nonce", NR)],
)
def test_tampering_with_the_hello_is_found_out(field: str, value: Any) -> None:
    """An attacker in the middle may rewrite the hello (claim another member id, say):
    the responder's proof then covers other values than the initiator's."""
    initiator = auth.Initiator(SECRET, NI, role="peer", cluster="c1", node="n2")
    responder = auth.Responder(SECRET, NR, node="n1")
    hello = {**peer_hello(initiator), field: value}
    welcome = {**wire.welcome("n1", "c1"), **responder.welcome_fields(hello)}
    with pytest.raises(auth.AuthError):
        initiator.check_welcome(welcome)


def test_tampering_with_the_welcome_is_found_out() -> None:
    _, _, _, welcome, _ = handshake()
    for field, value in (("node", "n9"), ("auth_nonce", NI)):
        fresh = auth.Initiator(SECRET, NI, role="peer", cluster="c1", node="n2")
        with pytest.raises(auth.AuthError):
            fresh.check_welcome({**welcome, field: value})


def test_one_sides_proof_is_not_the_others() -> None:
    """A reflected proof (the responder's, sent back as the initiator's) is refused."""
    _, responder, _, welcome, _ = handshake()
    with pytest.raises(auth.AuthError):
        responder.check_auth({"t": "auth", "proof": welcome["auth_proof"]})


def test_plain_hellos_and_welcomes_are_refused_with_a_clear_message() -> None:
    responder = auth.Responder(SECRET, NR, node="n1")
    with pytest.raises(auth.AuthError, match="requires authentication"):
        responder.welcome_fields(wire.Hello(wire.HelloRole.CLIENT).to_wire())
    with pytest.raises(auth.AuthError, match="unknown authentication method"):
        responder.welcome_fields({**wire.Hello(wire.HelloRole.CLIENT).to_wire(), "auth": "none"})
    initiator = auth.Initiator(SECRET, NI, role="client", cluster="", node="")
    with pytest.raises(auth.AuthError, match="no secret configured, or predates"):
        initiator.check_welcome(wire.welcome("n1", "c1"))


def sessions() -> tuple[auth.FrameSealer, auth.FrameOpener, auth.FrameSealer, auth.FrameOpener]:
    initiator, responder, _, _, auth_frame = handshake()
    i_sealer, i_opener = initiator.keys()
    r_sealer, r_opener = responder.check_auth(auth_frame)
    return i_sealer, i_opener, r_sealer, r_opener


def payload(frame: bytes) -> bytes:
    return frame[4:]


def test_sealed_frames_cannot_be_injected_replayed_reordered_dropped_or_redirected() -> None:
    i_sealer, i_opener, _, r_opener = sessions()
    first, second = (payload(i_sealer.seal(b"\xa1\x61n%c" % n)) for n in (0, 1))
    assert r_opener.open(first) == b"\xa1\x61n\x00"
    with pytest.raises(auth.AuthError, match="frame 1"):
        r_opener.open(first)  # replayed
    _, _, _, fresh = sessions()
    with pytest.raises(auth.AuthError):
        fresh.open(second)  # reordered (or the first one dropped)
    _, _, _, fresh = sessions()
    with pytest.raises(auth.AuthError):
        i_opener.open(first)  # sent back the other way
    other_sealer, _, _, _ = sessions()
    other = auth.Initiator(SECRET, bytes(32), role="peer", cluster="c1", node="n2")
    responder = auth.Responder(SECRET, bytes(32), node="n1")
    welcome = {**wire.welcome("n1", "c1"), **responder.welcome_fields(peer_hello(other))}
    _, other_opener = responder.check_auth(other.check_welcome(welcome))
    with pytest.raises(auth.AuthError):
        other_opener.open(payload(other_sealer.seal(b"\xa0")))  # from another connection
    with pytest.raises(auth.AuthError):
        other_opener.open(b"\xa0" + bytes(16))  # injected with a made-up tag
    with pytest.raises(auth.AuthError, match="too short"):
        other_opener.open(b"\x00")


def test_every_bit_of_a_sealed_frame_is_covered() -> None:
    sealer, _, _, _ = sessions()
    frame = payload(sealer.seal(b"\xa1\x61t\x64ping"))
    for bit in range(len(frame) * 8):
        _, _, _, opener = sessions()
        damaged = bytearray(frame)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(auth.AuthError):
            opener.open(bytes(damaged))


def test_a_frame_decoder_stays_closed_after_a_bad_tag() -> None:
    i_sealer, _, _, r_opener = sessions()
    decoder = wire.FrameDecoder(wire.CLIENT_FRAME_LIMIT, r_opener)
    good = i_sealer.seal(wire.encode_frame({"t": "a"})[4:])
    decoder.feed(good + good)
    with pytest.raises(wire.ProtocolError) as info:
        list(decoder.frames())
    assert info.value.code is wire.ErrorCode.AUTH_FAILED
    decoder.feed(i_sealer.seal(wire.encode_frame({"t": "b"})[4:]))
    with pytest.raises(wire.ProtocolError):
        list(decoder.frames())


def test_the_frame_limit_counts_the_body_not_the_tag() -> None:
    i_sealer, _, _, r_opener = sessions()
    body = wire.encode_frame({"t": "x", "pad": "y" * 200})[4:]
    decoder = wire.FrameDecoder(len(body), r_opener)
    decoder.feed(i_sealer.seal(body))
    assert len(list(decoder.frames())) == 1
    decoder = wire.FrameDecoder(len(body) - 1, sessions()[3])
    decoder.feed(sessions()[0].seal(body))
    with pytest.raises(wire.ProtocolError) as info:
        list(decoder.frames())
    assert info.value.code is wire.ErrorCode.TOO_LARGE


_FIELD_VALUES = st.none() | st.integers() | st.binary(max_size=40) | st.text(max_size=5)


@FUZZ
@given(st.dictionaries(st.sampled_from(["t", "auth", "auth_nonce", "auth_proof", "proof",
                                        "node", "role", "version", "cluster"]),
                       _FIELD_VALUES | st.sampled_from([auth.METHOD, "auth"])))  # fmt: skip
def test_fuzz_handshake_fields_only_raise_auth_error(fields: dict[str, Any]) -> None:
    initiator = auth.Initiator(SECRET, NI, role="peer", cluster="c1", node="n2")
    responder = auth.Responder(SECRET, NR, node="n1")
    for step in (
        initiator.check_welcome,
        responder.welcome_fields,
        responder.check_auth,
    ):
        try:
            step(fields)
        except auth.AuthError:
            pass
        except RuntimeError:
            pass  # check_auth before a welcome: a programming error, not input


# ---------------------------------------------------------------------------
# Secret files
# ---------------------------------------------------------------------------


def write(path: Path, text: str, mode: int) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_a_secret_file_is_read_without_its_newline(tmp_path: Path) -> None:
    secret = auth.new_secret()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert auth.load_secret(write(tmp_path / "s", secret + "\n", 0o600)) == secret.encode()
    assert auth.load_secret(write(tmp_path / "r", secret, 0o400)) == secret.encode()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_secret_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = write(tmp_path / "s", auth.new_secret(), mode)
    with pytest.raises(auth.SecretFileError) as info:
        auth.load_secret(path)
    assert str(info.value).endswith(f": chmod 600 {path}")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "what"), [("", "empty"), (" \n", "empty"), ("x" * 31, "31")])
def test_an_empty_or_short_secret_is_refused(tmp_path: Path, text: str, what: str) -> None:
    path = write(tmp_path / "s", text, 0o600)
    with pytest.raises(auth.SecretFileError, match=f"{what}.*at least 32"):
        auth.load_secret(path)


def test_missing_and_odd_secret_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(auth.SecretFileError, match=r"does not exist.*dlm secret new --out"):
        auth.load_secret(str(tmp_path / "none"))
    with pytest.raises(auth.SecretFileError, match="not a regular file"):
        auth.load_secret(str(tmp_path))
    target = write(tmp_path / "real", auth.new_secret(), 0o600)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(auth.SecretFileError, match="cannot read"):
        auth.load_secret(str(tmp_path / "link"))


def test_a_new_secret_file_is_mode_600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        auth.write_secret_file(str(tmp_path / "s"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o600
    assert len(auth.load_secret(str(tmp_path / "s"))) == 64
    with pytest.raises(auth.SecretFileError, match="already exists"):
        auth.write_secret_file(str(tmp_path / "s"))


def test_importing_auth_loads_no_codec_and_no_event_loop() -> None:
    probe = "import dlm.auth, sys; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    heavy = ("cbor2", "dlm.wire", "asyncio", "anyio", "ssl", "typer", "dataclasses", "typing")
    assert [m for m in out if m.split(".")[0] in heavy or m in heavy] == []


# ---------------------------------------------------------------------------
# Identities: a credential checked against a verifier the cluster keeps
# ---------------------------------------------------------------------------


def _identity_pair(
    content: bytes, table: dict[tuple[str, bytes], tuple[bytes, bytes]]
) -> tuple[auth.Initiator | auth.IdentityInitiator, auth.IdentityResponder]:
    initiator = auth.client_initiator(content, NI)
    responder = auth.IdentityResponder(lambda n, k: table.get((n, k)), NR, node="n1")
    return initiator, responder


def _table_for(name: str, verifier: tuple[bytes, bytes, bytes]) -> dict[Any, Any]:
    key_id, stored_key, server_key = verifier
    return {(name, key_id): (stored_key, server_key)}


def test_a_credential_proves_its_identity_and_both_sides_seal_alike() -> None:
    content, verifier = auth.new_credential("ci")
    initiator, responder = _identity_pair(content, _table_for("ci", verifier))
    assert isinstance(initiator, auth.IdentityInitiator)
    hello = {"t": "hello", "role": "client", "version": 1, **initiator.hello_fields()}
    welcome = {"t": "welcome", "node": "n1", **responder.welcome_fields(hello)}
    frame = initiator.check_welcome(welcome)
    sealer_r, opener_r = responder.check_auth(frame)
    assert responder.identity == "ci"
    sealer_i, opener_i = initiator.keys()
    assert opener_r.open(sealer_i.seal(b"body")[4:]) == b"body"
    assert opener_i.open(sealer_r.seal(b"back")[4:]) == b"back"


def test_the_verifier_the_cluster_keeps_cannot_log_in() -> None:
    # Someone who stole a snapshot has (key_id, stored_key, server_key): they can answer
    # the member's welcome, but not make the client's proof, which needs client_key.
    content, verifier = auth.new_credential("ci")
    key_id, stored_key, server_key = verifier
    table = _table_for("ci", verifier)
    assert content.split()[2] not in repr(verifier).encode()
    responder = auth.IdentityResponder(lambda n, k: table.get((n, k)), NR, node="n1")
    hello = {"t": "hello", "role": "client", "version": 1, "auth": auth.IDENTITY_METHOD}
    hello |= {"auth_nonce": NI, "auth_identity": "ci", "auth_key": key_id}
    responder.welcome_fields(hello)
    for guess in (stored_key, server_key, bytes(32)):
        with pytest.raises(auth.AuthError, match="authentication of identity 'ci' failed"):
            responder.check_auth({"t": "auth", "proof": guess})


def test_a_wrong_secret_or_an_unknown_identity_is_refused() -> None:
    content, verifier = auth.new_credential("ci")
    other, _ = auth.new_credential("ci")
    initiator, responder = _identity_pair(other, _table_for("ci", verifier))
    hello = {"t": "hello", "role": "client", "version": 1, **initiator.hello_fields()}
    with pytest.raises(auth.AuthError, match="not known with this key"):
        responder.welcome_fields(hello)
    initiator, responder = _identity_pair(content, {})
    hello = {"t": "hello", "role": "client", "version": 1, **initiator.hello_fields()}
    with pytest.raises(auth.AuthError, match="identity 'ci' is not known"):
        responder.welcome_fields(hello)


def test_a_plain_secret_file_still_uses_the_cluster_secret_handshake() -> None:
    assert isinstance(auth.client_initiator(SECRET, NI), auth.Initiator)
    assert auth.parse_credential(SECRET) is None
    content, _ = auth.new_credential("ci")
    assert auth.parse_credential(content) == ("ci", content.split()[2])
