"""Shared-secret authentication for dlm connections: the handshake, and a MAC on every frame.

Both the client and the node use this module, so it imports only hmac, hashlib
and os (no cbor2, no wire, no event loop). Import it only when a secret is
configured: hashlib loads OpenSSL, a few milliseconds of every start-up.
Everything here is a pure object: no sockets, no clock; nonces are passed in
(``new_nonce()`` draws one), so tests replay exactly.

The handshake (three frames, see docs/PROTOCOL.md, "Authentication")
-------------------------------------------------------------------
1. The initiator's ``hello`` carries ``auth: "hmac-sha256"`` and its fresh
   32-byte nonce ``auth_nonce`` (``Initiator.hello_fields()``).
2. The responder's ``welcome`` carries its own fresh nonce and its proof
   (``Responder.welcome_fields(hello)``): HMAC-SHA256 under the secret of the
   transcript, which binds both nonces, the role, the version, the cluster and
   both member ids. The initiator checks it (``Initiator.check_welcome``): it has
   reached a holder of the secret, now, for this connection.
3. The initiator sends one ``auth`` frame with its own proof over the same
   transcript; the responder checks it (``Responder.check_auth``). A recorded
   hello and auth frame are worthless: the next responder nonce differs.

The secret never crosses the wire. Each side then holds two session keys, one
per direction, derived from the secret and the transcript, and seals every
later frame (``FrameSealer``) or opens it (``FrameOpener``): the frame's CBOR
body is followed by a 16-byte tag, HMAC-SHA256 under that direction's key of
the frame's number in that direction (u64, big-endian, from 0) and the body.
The opener expects the numbers in order, so a frame cannot be injected,
replayed or reordered within the connection, nor moved from one connection or
direction to another.

Typical use, by a connecting client (``send``/``receive`` are the adapter's)::

    initiator = Initiator(secret, new_nonce(), role="client", cluster="", node="")
    send({**Hello(Role.CLIENT).to_wire(), **initiator.hello_fields()})
    send(initiator.check_welcome(receive()))      # the auth frame; raises AuthError
    sealer, opener = initiator.keys()             # then: sealer.seal(body) / opener.open(payload)

and by the accepting member::

    responder = Responder(secret, new_nonce(), node=my_id)
    send({**welcome(my_id, cluster), **responder.welcome_fields(hello)})   # AuthError: refuse
    sealer, opener = responder.check_auth(receive())                     # AuthError: refuse

Secret files: ``load_secret(path)`` reads one (refusing a file that group or
others may read, and a secret shorter than 32 bytes); ``new_secret()`` makes
one; ``write_secret_file(path)`` creates one with mode 0600.
"""

from __future__ import annotations

import hashlib
import hmac
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

METHOD = "hmac-sha256"
NONCE_BYTES = 32
TAG_BYTES = 16
MIN_SECRET_BYTES = 32
_COUNTER_LIMIT = 1 << 64
_LABEL = b"dlm-auth-1"


class AuthError(ValueError):
    """The other side failed to authenticate (or sent a malformed handshake field).

    The message is safe to log and to send back (it never holds key material).
    """


class SecretFileError(Exception):
    """A secret file cannot be used; the message is one line saying what to do."""


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


# ---------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------


class FrameSealer:
    """Seals the frames one side sends: ``seal(body)`` gives the whole frame to write.

    Layout: ``u32 length (big-endian) | body | tag``, where length counts the body
    and the 16-byte tag together.
    """

    __slots__ = ("_base", "_counter")

    def __init__(self, key: bytes) -> None:
        self._base = hmac.new(key, digestmod=hashlib.sha256)
        self._counter = 0

    def seal(self, body: bytes) -> bytes:
        mac = self._base.copy()
        mac.update(self._counter.to_bytes(8, "big"))
        mac.update(body)
        self._counter += 1
        if self._counter >= _COUNTER_LIMIT:  # pragma: no cover - 2**64 frames
            raise AuthError("frame counter exhausted: reconnect")
        length = (len(body) + TAG_BYTES).to_bytes(4, "big")
        return b"".join((length, body, mac.digest()[:TAG_BYTES]))


class FrameOpener:
    """Opens the frames one side receives: ``open(payload)`` checks the tag of what
    followed the length prefix and returns the body; AuthError if it is not the next
    frame the other side sealed. After a failure the connection must be closed."""

    __slots__ = ("_base", "_counter", "overhead")

    def __init__(self, key: bytes) -> None:
        self._base = hmac.new(key, digestmod=hashlib.sha256)
        self._counter = 0
        self.overhead = TAG_BYTES
        """Bytes a sealed payload has beyond its body."""

    def open(self, payload: bytes) -> bytes:
        if len(payload) < TAG_BYTES:
            raise AuthError("frame too short to carry its authentication tag")
        body = payload[:-TAG_BYTES]
        mac = self._base.copy()
        mac.update(self._counter.to_bytes(8, "big"))
        mac.update(body)
        if not hmac.compare_digest(mac.digest()[:TAG_BYTES], payload[-TAG_BYTES:]):
            raise AuthError(
                f"frame {self._counter} fails its authentication tag "
                "(forged, replayed, reordered or damaged)"
            )
        self._counter += 1
        return body


# ---------------------------------------------------------------------------
# The handshake
# ---------------------------------------------------------------------------


def _transcript(*parts: str | bytes) -> bytes:
    """SHA-256 of the handshake's values, in a fixed order (role, version, cluster,
    initiator id, responder id, initiator nonce, responder nonce), each
    length-prefixed so that none can bleed into the next."""
    digest = hashlib.sha256(_LABEL)
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
    return digest.digest()


def _prf(secret: bytes, label: bytes, transcript: bytes) -> bytes:
    return hmac.digest(secret, label + b"\x00" + transcript, "sha256")


_RESPONDER_PROOF = b"responder proof"
_INITIATOR_PROOF = b"initiator proof"
_KEY_I2R = b"key initiator to responder"
_KEY_R2I = b"key responder to initiator"


def _bytes_field(msg: Mapping[str, Any], name: str, size: int) -> bytes:
    value = msg.get(name)
    if not isinstance(value, bytes) or len(value) != size:
        raise AuthError(f"field {name!r} must be {size} bytes")
    return value


def _text_field(msg: Mapping[str, Any], name: str) -> str:
    value = msg.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AuthError(f"field {name!r} must be text")
    return value


MAX_EXTRA_PROOFS = 4
"""At most this many proofs in a welcome's ``auth_proofs`` are looked at."""


def _more_proofs(welcome: Mapping[str, Any]) -> list[bytes]:
    """A rotating responder's proofs with its other secrets (``auth_proofs``: a list of
    32-byte strings, protocol version 5); anything else there is ignored."""
    more = welcome.get("auth_proofs")
    if not isinstance(more, list):
        return []
    return [p for p in more[:MAX_EXTRA_PROOFS] if isinstance(p, bytes) and len(p) == 32]


class Initiator:
    """The connecting side: a client, or a member dialling a peer.

    ``role``, ``cluster`` and ``node`` are what its hello says (a client: role
    "client", its cluster or "", node ""); ``nonce`` must be fresh
    (``new_nonce()``) for every connection.
    """

    def __init__(
        self,
        secret: bytes,
        nonce: bytes,
        *,
        role: str,
        cluster: str,
        node: str,
        version: int = 1,
        previous: bytes | None = None,
    ) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
        self._secret = secret
        self._previous = previous
        """The secret before a rotation (a member's, until its next reload): a responder
        that does not hold the new one yet is still proved with it."""
        self._nonce = nonce
        self._role = role
        self._cluster = cluster
        self._node = node
        self._version = version
        self._transcript: bytes | None = None

    def hello_fields(self) -> dict[str, Any]:
        """The fields to add to the hello."""
        return {"auth": METHOD, "auth_nonce": self._nonce}

    def check_welcome(self, welcome: Mapping[str, Any]) -> dict[str, Any]:
        """Checks the responder's proof; returns the ``auth`` frame to send next.

        Raises AuthError if the welcome carries no proof (a member without a secret,
        or older than authentication) or a wrong one (not the cluster's secret, or
        an answer recorded from another connection).
        """
        if "auth_proof" not in welcome:
            raise AuthError(
                "the member did not prove it holds the cluster secret (it has no secret "
                "configured, or predates authentication)"
            )
        nonce = _bytes_field(welcome, "auth_nonce", NONCE_BYTES)
        proofs = [_bytes_field(welcome, "auth_proof", 32), *_more_proofs(welcome)]
        transcript = _transcript(
            self._role,
            str(self._version),
            self._cluster,
            self._node,
            _text_field(welcome, "node"),
            self._nonce,
            nonce,
        )
        held = [self._secret] if self._previous is None else [self._secret, self._previous]
        proved = next(
            (
                secret
                for secret in held
                if any(
                    hmac.compare_digest(proof, _prf(secret, _RESPONDER_PROOF, transcript))
                    for proof in proofs
                )
            ),
            None,
        )
        if proved is None:
            raise AuthError("the member's proof is wrong: it does not hold this secret")
        self._secret = proved
        self._transcript = transcript
        return {"t": "auth", "proof": _prf(self._secret, _INITIATOR_PROOF, transcript)}

    def keys(self) -> tuple[FrameSealer, FrameOpener]:
        """(sealer for frames sent, opener for frames received), after check_welcome."""
        if self._transcript is None:
            raise RuntimeError("keys() before check_welcome() succeeded")
        return (
            FrameSealer(_prf(self._secret, _KEY_I2R, self._transcript)),
            FrameOpener(_prf(self._secret, _KEY_R2I, self._transcript)),
        )


class Responder:
    """The accepting side: a member. ``node`` is its own id; ``nonce`` fresh per connection.

    A client that proves the cluster's client secret is the built-in ``admin`` identity."""

    identity = "admin"

    def __init__(
        self, secret: bytes, nonce: bytes, *, node: str, previous: bytes | None = None
    ) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
        self._secret = secret
        self._previous = previous
        """The secret before a rotation, still accepted until the member's next reload
        (dlm/node/runtime/reload.py): its proof goes first in the welcome, since every
        initiator not yet given the new secret checks that one alone; ``auth_proofs``
        adds the new one's."""
        self._nonce = nonce
        self._node = node
        self._transcript: bytes | None = None

    def welcome_fields(self, hello: Mapping[str, Any]) -> dict[str, Any]:
        """The fields to add to the welcome, from the raw hello map (already checked by
        ``Hello.from_wire``); AuthError if the hello does not ask for authentication."""
        method = hello.get("auth")
        if method != METHOD:
            raise AuthError(
                "this cluster requires authentication: configure its secret"
                if method is None
                else f"unknown authentication method {method!r} (this member speaks {METHOD})"
            )
        version = hello.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise AuthError("field 'version' must be an integer")
        self._transcript = _transcript(
            _text_field(hello, "role"),
            str(version),
            _text_field(hello, "cluster"),
            _text_field(hello, "node"),
            self._node,
            _bytes_field(hello, "auth_nonce", NONCE_BYTES),
            self._nonce,
        )
        proof = _prf(self._secret, _RESPONDER_PROOF, self._transcript)
        if self._previous is None:
            return {"auth_nonce": self._nonce, "auth_proof": proof}
        old = _prf(self._previous, _RESPONDER_PROOF, self._transcript)
        return {"auth_nonce": self._nonce, "auth_proof": old, "auth_proofs": [proof]}

    def check_auth(self, frame: Mapping[str, Any]) -> tuple[FrameSealer, FrameOpener]:
        """Checks the initiator's ``auth`` frame; returns (sealer for frames sent, opener
        for frames received). AuthError if the proof is missing or wrong."""
        if self._transcript is None:
            raise RuntimeError("check_auth() before welcome_fields()")
        if frame.get("t") != "auth":
            raise AuthError("expected the auth frame")
        proof = _bytes_field(frame, "proof", 32)
        held = [self._secret] if self._previous is None else [self._secret, self._previous]
        proved = next(
            (
                secret
                for secret in held
                if hmac.compare_digest(proof, _prf(secret, _INITIATOR_PROOF, self._transcript))
            ),
            None,
        )
        if proved is None:
            raise AuthError("authentication failed: wrong secret, or a replayed handshake")
        self._secret = proved
        return (
            FrameSealer(_prf(self._secret, _KEY_R2I, self._transcript)),
            FrameOpener(_prf(self._secret, _KEY_I2R, self._transcript)),
        )


# ---------------------------------------------------------------------------
# Secret files
# ---------------------------------------------------------------------------


def new_secret() -> str:
    """A fresh secret: 256 random bits as 64 hex digits."""
    return os.urandom(32).hex()


def load_secret(path: str) -> bytes:
    """The secret in ``path``: its bytes without surrounding whitespace.

    Refuses (SecretFileError, one line) a file that is missing or not a regular
    file, one that group or others may access, and a secret shorter than
    MIN_SECRET_BYTES.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SecretFileError(
            f"secret file {path} does not exist (make one with: dlm secret new --out {path})"
        ) from None
    except OSError as exc:
        raise SecretFileError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if (info.st_mode & 0o170000) != 0o100000:
            raise SecretFileError(f"secret file {path} is not a regular file")
        if info.st_mode & 0o077:
            raise SecretFileError(
                f"secret file {path} is open to group or others (mode "
                f"{info.st_mode & 0o777:o}): chmod 600 {path}"
            )
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
            if sum(len(c) for c in chunks) > 65536:
                raise SecretFileError(f"secret file {path} is over 64 KB: not a secret")
    finally:
        os.close(fd)
    secret = b"".join(chunks).strip()
    if len(secret) < MIN_SECRET_BYTES:
        what = "empty" if not secret else f"only {len(secret)} bytes"
        raise SecretFileError(
            f"secret in {path} is {what}; at least {MIN_SECRET_BYTES} are needed "
            f"(make one with: dlm secret new --out {path})"
        )
    return secret


def write_secret_file(path: str) -> None:
    """Creates ``path`` (which must not exist) holding a new secret, mode 0600."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise SecretFileError(
            f"{path} already exists: remove it first, or choose another path"
        ) from None
    except OSError as exc:
        raise SecretFileError(f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, (new_secret() + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# Identities: a credential that names who it is, checked against a verifier
# ---------------------------------------------------------------------------
# In the manner of SCRAM (RFC 5802), in our own terms. A credential file holds an
# identity's name and its secret; the cluster keeps only a verifier made from them:
#
#   salted     = HMAC(secret, "dlm identity salt" | name)   (the secret is 256 random
#                 bits, so no iterated hash is needed against guessing)
#   client_key = HMAC(salted, "client key");  stored_key = SHA-256(client_key)
#   server_key = HMAC(salted, "server key");  key_id = SHA-256("dlm key id" | stored_key)[:8]
#
# The member proves itself with HMAC(server_key, transcript) in its welcome; the client
# answers with client_key XOR HMAC(stored_key, transcript), from which the member
# recovers client_key and checks SHA-256(client_key) == stored_key. So the verifier
# checks a proof but cannot make one: a stolen snapshot or backup logs nobody in. (As
# with SCRAM, someone holding a verifier who also records a handshake can recover that
# client_key; rotate an identity whose verifier may have leaked.) Session keys come
# from client_key and the transcript, which both sides then know.

IDENTITY_METHOD = "scram-sha256"
CREDENTIAL_TAG = b"dlm-identity"
"""A credential file's first word: ``dlm-identity NAME SECRET``."""
_CLIENT_KEY = b"client key"
_SERVER_KEY = b"server key"
_SERVER_PROOF = b"server signature"
_CLIENT_SIGNATURE = b"client signature"
_SESSION_I2R = b"identity key client to member"
_SESSION_R2I = b"identity key member to client"


def parse_credential(content: bytes) -> tuple[str, bytes] | None:
    """(name, secret) of a credential file's content, or None for a plain secret."""
    words = content.split()
    if len(words) != 3 or words[0] != CREDENTIAL_TAG:
        return None
    try:
        name = words[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    return name, words[2]


def derive_verifier(name: str, secret: bytes) -> tuple[bytes, bytes, bytes]:
    """(key_id, stored_key, server_key) of an identity's secret: what the cluster keeps."""
    _, stored_key, server_key = _identity_keys(name, secret)
    return _key_id(stored_key), stored_key, server_key


def _identity_keys(name: str, secret: bytes) -> tuple[bytes, bytes, bytes]:
    salted = hmac.digest(secret, b"dlm identity salt\x00" + name.encode(), "sha256")
    client_key = hmac.digest(salted, _CLIENT_KEY, "sha256")
    server_key = hmac.digest(salted, _SERVER_KEY, "sha256")
    return client_key, hashlib.sha256(client_key).digest(), server_key


def _key_id(stored_key: bytes) -> bytes:
    return hashlib.sha256(b"dlm key id\x00" + stored_key).digest()[:8]


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def new_credential(name: str) -> tuple[bytes, tuple[bytes, bytes, bytes]]:
    """A fresh credential file's content for ``name``, and its verifier."""
    secret = new_secret().encode()
    content = CREDENTIAL_TAG + b" " + name.encode() + b" " + secret + b"\n"
    return content, derive_verifier(name, secret)


def write_credential_file(path: str, content: bytes) -> None:
    """Creates ``path`` (which must not exist) holding ``content``, mode 0600."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise SecretFileError(
            f"{path} already exists: remove it first, or choose another path"
        ) from None
    except OSError as exc:
        raise SecretFileError(f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)


class IdentityInitiator:
    """A client proving an identity (a credential file's name and secret) to a member;
    the same calls as ``Initiator``."""

    identity: str

    def __init__(
        self, name: str, secret: bytes, nonce: bytes, *, role: str = "client", version: int = 1
    ) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
        self.identity = name
        self._client_key, self._stored_key, self._server_key = _identity_keys(name, secret)
        self._key_id = _key_id(self._stored_key)
        self._nonce = nonce
        self._role = role
        self._version = version
        self._transcript: bytes | None = None

    def hello_fields(self) -> dict[str, Any]:
        return {
            "auth": IDENTITY_METHOD,
            "auth_nonce": self._nonce,
            "auth_identity": self.identity,
            "auth_key": self._key_id,
        }

    def check_welcome(self, welcome: Mapping[str, Any]) -> dict[str, Any]:
        if "auth_proof" not in welcome:
            raise AuthError(
                "the member did not prove it knows this identity (it predates identities, "
                "or refused the credential)"
            )
        nonce = _bytes_field(welcome, "auth_nonce", NONCE_BYTES)
        proof = _bytes_field(welcome, "auth_proof", 32)
        transcript = _transcript(
            IDENTITY_METHOD,
            self._role,
            str(self._version),
            _text_field(welcome, "node"),
            self.identity,
            self._key_id,
            self._nonce,
            nonce,
        )
        if not hmac.compare_digest(proof, hmac.digest(self._server_key, transcript, "sha256")):
            raise AuthError("the member's proof is wrong: it does not hold this identity's key")
        self._transcript = transcript
        signature = hmac.digest(self._stored_key, _CLIENT_SIGNATURE + transcript, "sha256")
        return {"t": "auth", "proof": _xor(self._client_key, signature)}

    def keys(self) -> tuple[FrameSealer, FrameOpener]:
        if self._transcript is None:
            raise RuntimeError("keys() before check_welcome() succeeded")
        return (
            FrameSealer(_prf(self._client_key, _SESSION_I2R, self._transcript)),
            FrameOpener(_prf(self._client_key, _SESSION_R2I, self._transcript)),
        )


class IdentityResponder:
    """A member checking an identity's proof. ``verifier(name, key_id)`` gives the
    (stored_key, server_key) the replicated table keeps for that key, or None."""

    identity: str

    def __init__(
        self,
        verifier: Callable[[str, bytes], tuple[bytes, bytes] | None],
        nonce: bytes,
        *,
        node: str,
    ) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
        self._verifier = verifier
        self._nonce = nonce
        self._node = node
        self.identity = ""
        self._stored_key = b""
        self._transcript: bytes | None = None

    def welcome_fields(self, hello: Mapping[str, Any]) -> dict[str, Any]:
        if hello.get("auth") != IDENTITY_METHOD:
            raise AuthError(f"expected authentication method {IDENTITY_METHOD!r}")
        version = hello.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise AuthError("field 'version' must be an integer")
        name = _text_field(hello, "auth_identity")
        if not 1 <= len(name) <= 64:
            raise AuthError("field 'auth_identity' must name an identity")
        key_id = _bytes_field(hello, "auth_key", 8)
        keys = self._verifier(name, key_id)
        if keys is None:
            raise AuthError(
                f"identity {name!r} is not known with this key (removed, or its key was "
                "rotated and the old one has run out): ask an admin for a credential"
            )
        self._stored_key, server_key = keys
        self._transcript = _transcript(
            IDENTITY_METHOD,
            _text_field(hello, "role"),
            str(version),
            self._node,
            name,
            key_id,
            _bytes_field(hello, "auth_nonce", NONCE_BYTES),
            self._nonce,
        )
        self.identity = name
        proof = hmac.digest(server_key, self._transcript, "sha256")
        return {"auth_nonce": self._nonce, "auth_proof": proof}

    def check_auth(self, frame: Mapping[str, Any]) -> tuple[FrameSealer, FrameOpener]:
        if self._transcript is None:
            raise RuntimeError("check_auth() before welcome_fields()")
        if frame.get("t") != "auth":
            raise AuthError("expected the auth frame")
        proof = _bytes_field(frame, "proof", 32)
        signature = hmac.digest(self._stored_key, _CLIENT_SIGNATURE + self._transcript, "sha256")
        client_key = _xor(proof, signature)
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self._stored_key):
            raise AuthError(
                f"authentication of identity {self.identity!r} failed: wrong secret, or a "
                "replayed handshake"
            )
        return (
            FrameSealer(_prf(client_key, _SESSION_R2I, self._transcript)),
            FrameOpener(_prf(client_key, _SESSION_I2R, self._transcript)),
        )


def client_initiator(secret: bytes, nonce: bytes) -> Initiator | IdentityInitiator:
    """The client's side of the handshake for what its secret file held: a credential
    (``dlm auth add``) proves its identity; a plain secret, the cluster's client secret."""
    credential = parse_credential(secret)
    if credential is not None:
        return IdentityInitiator(credential[0], credential[1], nonce)
    return Initiator(secret, nonce, role="client", cluster="", node="")
