"""The options every subcommand shares and the client they make.

--cluster, --timeout, --dial-timeout, --json, --secret-file, --tls-ca,
--tls-cert and --tls-key may each be given before the subcommand (``dlm
--json status``) or after it (``dlm status --json``); the later, more
specific one wins, then the environment (``DLM_CLUSTER``, ``DLM_SECRET_FILE``,
``DLM_TLS_CA``, ``DLM_TLS_CERT``, ``DLM_TLS_KEY``), then the default.

The secret and the TLS files are read when the client is made, and only
then are dlm.auth (hashlib) and ssl imported: a plain run pays for neither. A
file that cannot be used exits 78 (exits.CONFIG) naming it.

Two budgets, as etcdctl has: --dial-timeout bounds how long a command waits
for any member to answer at all (a wrong address, a cluster that is down),
and --timeout how long it keeps trying to reach a quorum once members answer
(an election, a lost majority).
"""

from __future__ import annotations

import os

from dlm.cli.exits import usage_error
from dlm.durations import DurationError, parse_duration

# typing stays off the CLI's import path (milliseconds per run); mypy reads TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from dlm.client.sync import Client

DEFAULT_CLUSTER = "127.0.0.1:7700"
DEFAULT_TIMEOUT = "10s"
DEFAULT_DIAL_TIMEOUT = "2s"
CLUSTER_ENV = "DLM_CLUSTER"
SECRET_ENV = "DLM_SECRET_FILE"
TLS_CA_ENV = "DLM_TLS_CA"
TLS_CERT_ENV = "DLM_TLS_CERT"
TLS_KEY_ENV = "DLM_TLS_KEY"

# Defaults of the subcommands, shared by the typer app and the fast path.
# None: the lease gets the cluster's default-ttl (30s unless `dlm config set` changed it).
ACQUIRE_TTL: str | None = None
ACQUIRE_FORMAT = "text"
EXEC_TTL: str | None = None
EXEC_KILL_GRACE: str | None = None  # min(5s, TTL/4): dlm.cli.guard.default_grace
EXEC_CONFLICT_EXIT_CODE = 75


class Credentials:
    """The files a client authenticates with (paths; None: not given)."""

    __slots__ = ("secret_file", "tls_ca", "tls_cert", "tls_key")

    def __init__(
        self,
        secret_file: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        self.secret_file = secret_file
        self.tls_ca = tls_ca
        self.tls_cert = tls_cert
        self.tls_key = tls_key

    def _fields(self) -> tuple[str | None, ...]:
        return (self.secret_file, self.tls_ca, self.tls_cert, self.tls_key)

    def __repr__(self) -> str:
        return "Credentials({})".format(", ".join(f"{f!r}" for f in self._fields()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Credentials):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return any(self._fields())

    def load(self) -> tuple[bytes | None, Any]:
        """(secret, ssl.SSLContext or None); CliError (exit 78) naming the file."""
        from dlm.cli.exits import CONFIG, CliError

        secret = None
        if self.secret_file:
            from dlm import auth

            try:
                secret = auth.load_secret(self.secret_file)
            except auth.SecretFileError as exc:
                raise CliError("CONFIG", f"--secret-file/{SECRET_ENV}: {exc}", CONFIG) from None
        context = None
        if self.tls_cert or self.tls_key or self.tls_ca:
            if not self.tls_ca:
                raise CliError(
                    "CONFIG",
                    f"a TLS client certificate needs --tls-ca/{TLS_CA_ENV}: "
                    "the CA that signed the members' certificates",
                    CONFIG,
                )
            from dlm import tls

            try:
                context = tls.client_context(self.tls_ca, self.tls_cert, self.tls_key)
            except tls.TlsConfigError as exc:
                raise CliError(
                    "CONFIG",
                    f"{exc} (set by --tls-ca/{TLS_CA_ENV}, --tls-cert/{TLS_CERT_ENV} or "
                    f"--tls-key/{TLS_KEY_ENV})",
                    CONFIG,
                ) from None
        return secret, context


class Settings:
    """Where to find the cluster, how long to try, how to answer, and with what credentials."""

    __slots__ = ("credentials", "dial_timeout", "json", "members", "timeout")

    def __init__(
        self,
        members: tuple[str, ...],
        timeout: float,
        json: bool,
        dial_timeout: float = 2.0,
        credentials: Credentials | None = None,
    ) -> None:
        self.members = members
        self.timeout = timeout
        self.json = json
        self.dial_timeout = dial_timeout
        self.credentials = credentials or Credentials()

    def __repr__(self) -> str:
        return (
            f"Settings(members={self.members!r}, timeout={self.timeout!r}, json={self.json!r}, "
            f"dial_timeout={self.dial_timeout!r}, credentials={self.credentials!r})"
        )

    def _fields(self) -> tuple[object, ...]:
        return (self.members, self.timeout, self.json, self.dial_timeout, self.credentials)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def connect(self, traced_as: str | None = None) -> Client:
        """A client of the cluster. ``traced_as``: the command's span name (``dlm.acquire``):
        its lock and lease requests carry the TRACEPARENT the command was given, or, with
        tracing on (dlm/tracing.py), the command's own span, child of it, which ends and
        is sent as the command exits."""
        from dlm.client.sync import Client

        trace = self._command_trace(traced_as) if traced_as is not None else None
        secret, tls = self.credentials.load() if self.credentials else (None, None)
        client = Client(
            list(self.members),
            timeout=self.timeout,
            dial_timeout=self.dial_timeout,
            secret=secret,
            tls=tls,
        )
        client.trace = trace
        return client

    @staticmethod
    def _command_trace(name: str) -> str | None:
        from dlm import tracing

        try:
            span = tracing.CommandSpan(name)
        except ValueError as exc:
            raise usage_error(str(exc)) from None
        if span.span is not None:
            # Whatever way the command ends (an exit code, an error line), its span is sent.
            tracing.end_with_command(span)
        return span.traceparent


class GlobalOptions:
    """What the root callback saw before the subcommand."""

    __slots__ = ("cluster", "dial_timeout", "json", "secret_file", "timeout", "tls")

    def __init__(
        self,
        cluster: str | None = None,
        timeout: str | None = None,
        json: bool = False,
        dial_timeout: str | None = None,
        *,
        secret_file: str | None = None,
        tls: tuple[str | None, str | None, str | None] = (None, None, None),
    ) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.json = json
        self.dial_timeout = dial_timeout
        self.secret_file = secret_file
        self.tls = tls
        """(--tls-ca, --tls-cert, --tls-key)"""


def parse_members(text: str, source: str = "--cluster") -> tuple[str, ...]:
    """The member addresses; a usage error naming ``source`` (the option or variable)."""
    from dlm.client.core import parse_members as parse

    if "://" in text:
        # http://host:port parses as host "http" and a bad port: say what is wrong instead.
        raise usage_error(f"{source} takes HOST:PORT[,HOST:PORT...], not a URL (got {text!r})")
    try:
        return tuple(parse(text))
    except ValueError as exc:
        raise usage_error(f"bad {source} {text!r}: {exc}") from None


def parse_timeout(text: str, option: str = "--timeout") -> float:
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise usage_error(f"bad {option}: {exc}") from None
    if seconds <= 0:
        raise usage_error(f"{option} must be more than 0")
    return seconds


def resolve(
    root: Any,
    cluster: str | None,
    timeout: str | None,
    json_out: bool,
    dial_timeout: str | None = None,
    *,
    secret_file: str | None = None,
    tls: tuple[str | None, str | None, str | None] = (None, None, None),
) -> Settings:
    """Merges the subcommand's own options over the root's, the environment and defaults.
    ``tls`` is (--tls-ca, --tls-cert, --tls-key)."""
    top = root if isinstance(root, GlobalOptions) else GlobalOptions()
    cluster_text = cluster or top.cluster
    source = "--cluster"
    if not cluster_text and os.environ.get(CLUSTER_ENV):
        cluster_text, source = os.environ[CLUSTER_ENV], CLUSTER_ENV
    timeout_text = timeout or top.timeout or DEFAULT_TIMEOUT
    dial_text = dial_timeout or top.dial_timeout or DEFAULT_DIAL_TIMEOUT
    environ = os.environ
    ca, cert, key = (
        mine or theirs or environ.get(variable) or None
        for mine, theirs, variable in zip(
            tls, top.tls, (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV), strict=True
        )
    )
    return Settings(
        members=parse_members(cluster_text or DEFAULT_CLUSTER, source),
        timeout=parse_timeout(timeout_text),
        json=json_out or top.json,
        dial_timeout=parse_timeout(dial_text, "--dial-timeout"),
        credentials=Credentials(
            secret_file or top.secret_file or environ.get(SECRET_ENV) or None, ca, cert, key
        ),
    )
