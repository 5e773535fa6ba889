"""The connection options, declared once, and the decorators that put them on a command.

--cluster, --timeout, --dial-timeout, --json, --secret-file and --tls-* are
taken by the root callback and by every command that talks to the cluster
(dlm.cli.settings says how the two merge). Rather than repeat eight
parameters on each, a command is written with only its own options and a
keyword-only ``settings: Settings``; ``@with_settings`` appends the eight to
the signature typer reads and hands the body the resolved Settings. The root
callback, which only records what it saw, uses ``@remembers_options``.

Typer builds the command line from ``inspect.signature`` of the callback, so
the wrappers carry a ``__signature__`` (and matching ``__annotations__``);
their names and docstrings, hence the command names and help, are the body's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from dlm.cli.settings import (
    DEFAULT_CLUSTER,
    DEFAULT_DIAL_TIMEOUT,
    DEFAULT_TIMEOUT,
    GlobalOptions,
    resolve,
)

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print exactly one JSON object on stdout, errors too.")
]
ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        metavar="ADDR[,ADDR...]",
        help=f"Cluster members to ask. [env: DLM_CLUSTER; default: {DEFAULT_CLUSTER}]",
        show_default=False,
    ),
]
TimeoutOpt = Annotated[
    str | None,
    typer.Option(
        "--timeout",
        metavar="DURATION",
        help=(
            "How long to try to reach a quorum before giving up (exit 69). "
            f"[default: {DEFAULT_TIMEOUT}]"
        ),
        show_default=False,
    ),
]
DialTimeoutOpt = Annotated[
    str | None,
    typer.Option(
        "--dial-timeout",
        metavar="DURATION",
        help=(
            "Give up (exit 69) when no member has answered at all within this. "
            f"[default: {DEFAULT_DIAL_TIMEOUT}]"
        ),
        show_default=False,
    ),
]
SecretFileOpt = Annotated[
    str | None,
    typer.Option(
        "--secret-file",
        metavar="PATH",
        help="The cluster's client secret (a file made by `dlm secret new`, mode 600), when "
        "its members require one. [env: DLM_SECRET_FILE]",
        show_default=False,
    ),
]
TlsCaOpt = Annotated[
    str | None,
    typer.Option(
        "--tls-ca",
        metavar="PATH",
        help="Connect with TLS, trusting the CA in PATH (PEM) for the members' certificates. "
        "[env: DLM_TLS_CA]",
        show_default=False,
    ),
]
TlsCertOpt = Annotated[
    str | None,
    typer.Option(
        "--tls-cert",
        metavar="PATH",
        help="A client certificate to present (PEM; with --tls-key). [env: DLM_TLS_CERT]",
        show_default=False,
    ),
]
TlsKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--tls-key",
        metavar="PATH",
        help="The unencrypted key of --tls-cert (PEM). [env: DLM_TLS_KEY]",
        show_default=False,
    ),
]


def _keyword(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


# In the order --help lists them. The names are the fast path's too (fastpath.GLOBAL_OPTIONS).
CONNECTION_PARAMETERS = (
    _keyword("cluster", ClusterOpt, None),
    _keyword("timeout", TimeoutOpt, None),
    _keyword("dial_timeout", DialTimeoutOpt, None),
    _keyword("json", JsonOpt, False),
    _keyword("secret_file", SecretFileOpt, None),
    _keyword("tls_ca", TlsCaOpt, None),
    _keyword("tls_cert", TlsCertOpt, None),
    _keyword("tls_key", TlsKeyOpt, None),
)
_CONTEXT = inspect.Parameter(
    "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context
)


def _take_connection_options(values: dict[str, Any]) -> GlobalOptions:
    """Removes the eight connection values from ``values``; what the user gave, unmerged."""
    return GlobalOptions(
        cluster=values.pop("cluster"),
        timeout=values.pop("timeout"),
        json=values.pop("json"),
        dial_timeout=values.pop("dial_timeout"),
        secret_file=values.pop("secret_file"),
        tls=(values.pop("tls_ca"), values.pop("tls_cert"), values.pop("tls_key")),
    )


def _extend(
    body: Callable[..., None],
    deliver: Callable[[typer.Context, GlobalOptions], dict[str, Any]],
    *,
    without: str | None,
    connection_first: bool,
) -> Callable[..., None]:
    """A typer callback: ``ctx``, then the body's parameters (less ``without``) and the
    connection options, either after them or before. It calls the body with its own
    values and whatever ``deliver`` makes of the connection options."""
    declared = inspect.signature(body, eval_str=True).parameters
    if without is not None and without not in declared:
        raise TypeError(f"{body.__name__}: declare the keyword-only parameter {without!r}")
    own = [parameter for name, parameter in declared.items() if name != without]
    if any(parameter.kind is not inspect.Parameter.KEYWORD_ONLY for parameter in own):
        # typer would bind a positional one by position, after ctx: say so at import time.
        raise TypeError(f"{body.__name__}: declare its parameters keyword-only (after *)")
    parameters = (
        [_CONTEXT, *CONNECTION_PARAMETERS, *own]
        if connection_first
        else [_CONTEXT, *own, *CONNECTION_PARAMETERS]
    )

    @functools.wraps(body)
    def callback(ctx: typer.Context, **values: Any) -> None:
        given = _take_connection_options(values)
        body(**values, **deliver(ctx, given))

    callback.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        parameters, return_annotation=None
    )
    callback.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return callback


def _resolved(ctx: typer.Context, given: GlobalOptions) -> dict[str, Any]:
    # ctx.obj is the root's GlobalOptions (a subgroup's context inherits it).
    settings = resolve(
        ctx.obj,
        given.cluster,
        given.timeout,
        given.json,
        given.dial_timeout,
        secret_file=given.secret_file,
        tls=given.tls,
    )
    return {"settings": settings}


def _remembered(ctx: typer.Context, given: GlobalOptions) -> dict[str, Any]:
    ctx.obj = given
    return {}


def with_settings(body: Callable[..., None]) -> Callable[..., None]:
    """For a command that talks to the cluster: its --help lists its own options, then the
    connection options; the body gets ``settings``, resolved before it runs (so a bad
    --cluster is reported before any of the command's own checks, as it always was)."""
    return _extend(body, _resolved, without="settings", connection_first=False)


def remembers_options(body: Callable[..., None]) -> Callable[..., None]:
    """For the root callback: the connection options first in its --help, and what was
    given before the subcommand kept in ``ctx.obj`` for ``with_settings`` to merge."""
    return _extend(body, _remembered, without=None, connection_first=True)
