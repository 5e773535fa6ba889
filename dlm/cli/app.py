"""The typer app: every subcommand's options, and nothing else.

A command that talks to the cluster declares only its own options and takes
``settings``: @with_settings (dlm.cli.connection_options) adds --cluster,
--timeout, --dial-timeout, --json, --secret-file and --tls-* after them and
resolves them. Each command then hands over to the module that does the work
(ops, exec_cmd, status_view), importing it only when it runs so that ``dlm
--help`` and ``dlm acquire`` load no more than they need.

Speed notes: typer < 0.29 (0.29 routes every option through pydantic),
``rich_markup_mode=None`` (plain click help: no rich import for ``--help``),
``pretty_exceptions_enable=False``. Shell completion (``--install-completion``)
is typer's, on the root app only: typer imports its completion code anyway,
and the fast path, which never loads typer, is untouched by it. Duration
options are plain strings parsed by dlm.durations, so a bad one gets our
one-line message.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from dlm.cli.config_cmd import config_app
from dlm.cli.connection_options import JsonOpt, remembers_options, with_settings
from dlm.cli.exits import EXIT_CODE_HELP
from dlm.cli.settings import (
    ACQUIRE_FORMAT,
    ACQUIRE_TTL,
    DEFAULT_CLUSTER,
    EXEC_CONFLICT_EXIT_CODE,
    EXEC_KILL_GRACE,
    EXEC_TTL,
    GlobalOptions,
    Settings,
)
from dlm.node.runtime.config.options import ALL_OPTIONS, NodeOption

_ROOT_HELP = f"""\
dlm: distributed locks with fencing tokens, for cron jobs, CI and operators.

\b
Examples:
  dlm exec --lock nightly-backup -- /usr/local/bin/backup.sh
  eval "$(dlm acquire deploy --ttl 5m --format env)"
  dlm release deploy --lease "$DLM_LEASE_ID"
  dlm status

Options --cluster, --timeout, --dial-timeout, --json, --secret-file and --tls-*
may be given before or after the subcommand. The cluster defaults to
$DLM_CLUSTER, else {DEFAULT_CLUSTER}.
Shell completion: dlm --install-completion (bash, zsh, fish).

{EXIT_CODE_HELP}"""

_SETTINGS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="dlm",
    help=_ROOT_HELP,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
    context_settings=_SETTINGS,
)
node_app = typer.Typer(
    help="Run a cluster member.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
store_app = typer.Typer(
    help="Look into a member's data directory.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
lease_app = typer.Typer(
    help="Look at and end leases (an operator's tools).",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
secret_app = typer.Typer(
    help="Make the shared secret members and clients authenticate with.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
members_app = typer.Typer(
    help="Look at and change the cluster's members, one at a time.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
snapshot_app = typer.Typer(
    help="Back up the cluster's replicated state to a file, and look into a backup.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
app.add_typer(node_app, name="node")
app.add_typer(members_app, name="members")
app.add_typer(store_app, name="store")
app.add_typer(lease_app, name="lease")
app.add_typer(secret_app, name="secret")
app.add_typer(snapshot_app, name="snapshot")
auth_app = typer.Typer(
    help="Manage the cluster's client identities: who may lock which keys (admins only).",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
app.add_typer(auth_app, name="auth")
app.add_typer(config_app, name="config")

FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        metavar="table|tsv|json",
        help="Output format. [default: table on a terminal, else tsv]",
        show_default=False,
    ),
]
KeptLeaseTtlOpt = Annotated[
    str | None,
    typer.Option(
        "--ttl",
        metavar="DURATION",
        help="Lease TTL, renewed every TTL/3 [default: the cluster's default-ttl, 30s unless set].",
    ),
]
"""The TTL of a lease the command keeps alive itself while it runs (exec, elect)."""
WaitOpt = Annotated[
    str | None,
    typer.Option(
        "--wait",
        metavar="DURATION",
        help="Queue (FIFO) for up to DURATION if the lock is held. Default: try once.",
        show_default=False,
    ),
]
LockDelayOpt = Annotated[
    str | None,
    typer.Option(
        "--lock-delay",
        metavar="DURATION",
        help="If the lease expires or is revoked while holding the lock, nobody gets it "
        "for DURATION after (0 to 60s; a release hands it over at once). [default: 0]",
        show_default=False,
    ),
]
LimitOpt = Annotated[
    int,
    typer.Option("--limit", metavar="N", min=1, help="Up to N holders at once (a semaphore)."),
]


def _version(value: bool) -> None:
    if value:
        from dlm import __version__

        print(f"dlm {__version__}")
        raise typer.Exit(0)


@app.callback()
@remembers_options
def root(
    *,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Keeps the connection options given before the subcommand (--help shows _ROOT_HELP)."""


@app.command()
@with_settings
def acquire(
    *,
    settings: Settings,
    key: Annotated[
        list[str],
        typer.Argument(
            metavar="KEY...",
            help="The lock's name; several: all of them under one lease, or none.",
        ),
    ],
    ttl: Annotated[
        str | None,
        typer.Option(
            "--ttl",
            metavar="DURATION",
            help="Lifetime of a new lease [default: the cluster's default-ttl, 30s unless set].",
        ),
    ] = ACQUIRE_TTL,
    wait: WaitOpt = None,
    lease: Annotated[
        str | None,
        typer.Option("--lease", metavar="ID", help="Hold it under this existing lease."),
    ] = None,
    limit: LimitOpt = 1,
    meta: Annotated[
        list[str] | None,
        typer.Option("--meta", metavar="K=V", help="Owner metadata; repeat for more."),
    ] = None,
    output_format: Annotated[
        str, typer.Option("--format", metavar="text|env|json", help="Output format.")
    ] = ACQUIRE_FORMAT,
    lock_delay: LockDelayOpt = None,
) -> None:
    """Take a lock and print its key, fencing token, lease id and TTL.

    Creates a lease unless --lease names one. The lease outlives this process
    until it expires or is released: renew it with `dlm renew`, give the lock
    back with `dlm release KEY --lease ID`.

    \b
    eval "$(dlm acquire deploy --ttl 10m --wait 1m --format env)"
    """
    from dlm.cli import ops

    ops.acquire(
        settings,
        key=key[0],
        ttl=ttl,
        wait=wait,
        lease=lease,
        limit=limit,
        meta_pairs=meta or [],
        output_format=output_format,
        lock_delay=lock_delay,
        **({"also": key[1:]} if key[1:] else {}),
    )


@app.command()
@with_settings
def renew(
    *,
    settings: Settings,
    lease: Annotated[str, typer.Argument(metavar="LEASE", help="The lease id.")],
    keep_alive: Annotated[
        bool,
        typer.Option(
            "--keep-alive", help="Keep renewing until killed, or until the lease is lost (77)."
        ),
    ] = False,
) -> None:
    """Renew a lease once, or keep it alive (--keep-alive)."""
    from dlm.cli import ops

    ops.renew(settings, lease, keep_alive)


@app.command()
@with_settings
def release(
    *,
    settings: Settings,
    key: Annotated[str, typer.Argument(metavar="KEY", help="The lock's name.")],
    lease: Annotated[str, typer.Option("--lease", metavar="ID", help="The lease that holds it.")],
    token: Annotated[
        int | None,
        typer.Option(
            "--token",
            metavar="N",
            min=1,
            help="Release only the grant with this fencing token (exit 77 if the lease "
            "holds KEY under another one).",
            show_default=False,
        ),
    ] = None,
    keep_lease: Annotated[
        bool,
        typer.Option(
            "--keep-lease",
            help="Keep a lease opened by `dlm acquire` even when it holds nothing more.",
        ),
    ] = False,
) -> None:
    """Give a lock back. Exits 77, naming the holder, if LEASE does not hold KEY.

    A lease opened by `dlm acquire` ends with the release when it holds and
    waits for nothing else (unless --keep-lease).
    """
    from dlm.cli import ops

    ops.release(settings, key, lease, token=token, keep_lease=keep_lease)


@app.command(
    "exec",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": False},
)
@with_settings
def exec_(
    *,
    settings: Settings,
    command: Annotated[
        list[str], typer.Argument(metavar="[--] CMD [ARGS...]", help="The command to run.")
    ],
    lock: Annotated[
        list[str],
        typer.Option(
            "--lock",
            metavar="KEY",
            help="The lock to hold; repeat to hold several under one lease (all or none).",
        ),
    ],
    ttl: KeptLeaseTtlOpt = EXEC_TTL,
    wait: WaitOpt = None,
    kill_grace: Annotated[
        str | None,
        typer.Option(
            "--kill-grace",
            metavar="DURATION",
            help="CMD gets SIGTERM this long before the lease deadline, SIGKILL just before "
            "it. Less than TTL/2. [default: min(5s, TTL/4)]",
            show_default=False,
        ),
    ] = EXEC_KILL_GRACE,
    conflict_exit_code: Annotated[
        int | None,
        typer.Option(
            "--conflict-exit-code",
            metavar="N",
            min=0,
            max=255,
            help="Exit code when the lock is not obtained; implies --quiet. "
            f"[default: {EXEC_CONFLICT_EXIT_CODE}]",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="Say nothing on stderr when the lock is held (--json still does)."
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Say who holds the lock when it is not obtained, even where that is "
            "silent by default (with --min-hold, -q or --conflict-exit-code).",
        ),
    ] = False,
    limit: LimitOpt = 1,
    min_hold: Annotated[
        str | None,
        typer.Option(
            "--min-hold",
            metavar="DURATION",
            help="Keep the lock taken until at least DURATION after it was granted, "
            "whatever CMD's exit code, so a host whose cron fires later in the same tick "
            "skips; dlm still exits when CMD ends. Under 24h.",
            show_default=False,
        ),
    ] = None,
    on_busy: Annotated[
        str | None,
        typer.Option(
            "--on-busy",
            metavar="skip|wait=D|fail",
            help="When the lock is held: skip (exit 75, saying nothing), wait=D (queue up "
            "to D, as --wait D), fail (exit 75 saying who holds it).",
            show_default=False,
        ),
    ] = None,
    lock_delay: LockDelayOpt = None,
) -> None:
    """Run CMD (no shell) only while holding the lock; exit with CMD's code.

    CMD gets DLM_LOCK_KEY, DLM_FENCING_TOKEN, DLM_LEASE_ID and DLM_LEASE_TTL_MS,
    runs in its own process group, and receives SIGINT, SIGTERM, SIGHUP and
    SIGQUIT sent to dlm. The lease is renewed every TTL/3. If it is not renewed
    in time, CMD and everything it started get SIGTERM --kill-grace before the
    lease deadline and SIGKILL just before it, so none of it runs once the lock
    can go to someone else, even if dlm itself was killed or stopped; dlm exits
    77. If the lock is not obtained, CMD does not run and dlm exits 75 (or
    --conflict-exit-code); it says who holds the lock on stderr, except with
    --min-hold (where skipping is the expected outcome on all hosts but one), -q
    or --conflict-exit-code, unless -v is given.

    \b
    */5 * * * * dlm exec --lock report --wait 1m -- /usr/local/bin/report.sh
    * * * * * dlm exec --lock sweep --min-hold 30s -- /usr/local/bin/sweep.sh
    """
    from dlm.cli import exec_cmd, ops

    for key in lock:
        ops.check_lock_options(key, limit, "--lock")
    code = exec_cmd.run(
        settings,
        key=lock[0],
        also=lock[1:],
        command=command,
        ttl=ttl,
        wait=wait,
        kill_grace=kill_grace,
        conflict_exit_code=conflict_exit_code,
        limit=limit,
        quiet=quiet,
        min_hold=min_hold,
        verbose=verbose,
        on_busy=on_busy,
        lock_delay=lock_delay,
    )
    raise typer.Exit(code)


@app.command(
    "elect",
    # Options may follow NAME; CMD comes after "--", so its own options stay its own.
    context_settings={"allow_interspersed_args": True, "ignore_unknown_options": False},
)
@with_settings
def elect(
    *,
    settings: Settings,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The election (a lock key).")],
    command: Annotated[
        list[str] | None,
        typer.Argument(metavar="[-- CMD [ARGS...]]", help="Run this while leading."),
    ] = None,
    value: Annotated[
        str,
        typer.Option("--value", metavar="V", help="This candidate's value, shown to observers."),
    ] = "",
    ttl: KeptLeaseTtlOpt = EXEC_TTL,
    kill_grace: Annotated[
        str | None,
        typer.Option(
            "--kill-grace",
            metavar="DURATION",
            help="As for dlm exec. [default: min(5s, TTL/4)]",
            show_default=False,
        ),
    ] = EXEC_KILL_GRACE,
    lock_delay: LockDelayOpt = None,
) -> None:
    """Campaign for NAME (FIFO), then lead: print the election and run CMD, or hold it.

    Once elected, prints the value, the token (the leadership epoch) and since
    when. With CMD, runs it under exactly `dlm exec`'s guarantees (CMD is stopped
    before another candidate can be elected) and exits with its code. Without
    CMD, leads until SIGINT or SIGTERM, then resigns (exit 0). Election is not
    fencing: pass $DLM_FENCING_TOKEN to what the leader writes to.

    \b
    dlm elect scheduler --value "$(hostname)" -- ./scheduler
    """
    from dlm.cli import elect as elect_cmd

    code = elect_cmd.elect(
        settings,
        name=name,
        value=value,
        command=command or [],
        ttl=ttl,
        kill_grace=kill_grace,
        lock_delay=lock_delay,
    )
    raise typer.Exit(code)


@app.command("proclaim")
@with_settings
def proclaim(
    *,
    settings: Settings,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The election (a lock key).")],
    value: Annotated[str, typer.Option("--value", metavar="V", help="The new value.")],
    lease: Annotated[str, typer.Option("--lease", metavar="ID", help="The leader's lease.")],
) -> None:
    """Change NAME's value without a new election (same token); exit 77 unless LEASE leads.

    --json prints {"name", "value", "token", "lease"}.
    """
    from dlm.cli import elect as elect_cmd

    elect_cmd.proclaim(settings, name, value, lease)


@app.command("leader")
@with_settings
def leader(
    *,
    settings: Settings,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The election (a lock key).")],
) -> None:
    """Print the current leader of NAME once (value null with --json while nobody leads).

    --json prints {"name", "value", "token", "since", "index", "lease"}.
    """
    from dlm.cli import elect as elect_cmd

    elect_cmd.leader(settings, name)


@app.command()
@with_settings
def status(
    *,
    settings: Settings,
    key: Annotated[
        str | None,
        typer.Argument(metavar="[KEY]", help="Show this lock's holder and waiters instead."),
    ] = None,
    output_format: FormatOpt = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Print one line and exit 0 if healthy, 1 if degraded, 69 without quorum.",
        ),
    ] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Keep showing the cluster until Ctrl-C; with KEY, the lock again after "
            "each change the cluster pushes.",
        ),
    ] = False,
    interval: Annotated[
        str | None,
        typer.Option(
            "--interval",
            metavar="DURATION",
            help="How often --watch looks. [default: 2s]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show the cluster: members, roles, lag, last contact, and the failures it survives;
    or one lock (KEY): holders and waiters.

    --check is for cron, monitoring and CI: one line saying why, and exit 0
    (healthy), 1 (degraded: a voter unreachable, silent for two election
    timeouts or more than 1,000 entries behind) or 69 (no quorum).
    """
    from dlm.cli import status_view
    from dlm.cli.output import choose_format

    every = status_view.check_options(key, check, watch, interval)
    fmt = choose_format(output_format, settings.json)
    if key is not None and watch:
        from dlm.cli import watch_cmd

        raise typer.Exit(watch_cmd.key_watch(settings, key, fmt))
    if key is not None:
        status_view.key_status(settings, key, fmt)
    elif every is not None:
        raise typer.Exit(status_view.watch(settings, fmt, every))
    else:
        raise typer.Exit(status_view.cluster_status(settings, fmt, check=check))


@app.command()
@with_settings
def watch(
    *,
    settings: Settings,
    key: Annotated[
        str | None,
        typer.Argument(metavar="[KEY]", help="The lock to watch."),
    ] = None,
    prefix: Annotated[
        str | None,
        typer.Option("--prefix", metavar="P", help="Watch every key starting with P instead."),
    ] = None,
    after: Annotated[
        int | None,
        typer.Option(
            "--after",
            metavar="INDEX",
            min=0,
            help="Start with the changes after log INDEX (one printed before, a token) "
            "instead of from now.",
        ),
    ] = None,
) -> None:
    """Print every change of a lock (or of the locks under a prefix) as the cluster pushes
    it: granted, released, expired, queued, left_queue, proclaimed, each with its log index.

    With --json, one line per change: {"key", "event", "index", "lease", "token"}, and
    "granted": {"lease", "token"} when a release or an expiry hands the lock to the next
    waiter. Survives a member's or the leader's loss (resumes on another member after
    the last index printed); exits 69 only when no member answers for --timeout.
    """
    from dlm.cli import watch_cmd

    raise typer.Exit(watch_cmd.watch(settings, key, prefix, after))


@app.command()
@with_settings
def observe(
    *,
    settings: Settings,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The election (its lock key).")],
) -> None:
    """Print the current leader of election NAME (the holder of lock key NAME and its
    value), then every change: a new leader, a new value, or nobody leading.

    With --json, one line per change: {"name", "value", "token", "since", "index"},
    value null while nobody leads. Exits 69 only when no member answers for --timeout.
    """
    from dlm.cli import watch_cmd

    raise typer.Exit(watch_cmd.observe(settings, name))


@app.command()
@with_settings
def locks(
    *,
    settings: Settings,
    prefix: Annotated[
        str, typer.Option("--prefix", metavar="P", help="Only keys starting with P.")
    ] = "",
    output_format: FormatOpt = None,
) -> None:
    """List the held locks, one line each."""
    from dlm.cli import status_view
    from dlm.cli.output import choose_format

    status_view.list_locks(settings, prefix, choose_format(output_format, settings.json))


@app.command()
@with_settings
def runs(
    *,
    settings: Settings,
    key: Annotated[
        str | None, typer.Argument(metavar="[KEY]", help="The key whose runs to show.")
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="The last run of every key instead.")
    ] = False,
    output_format: FormatOpt = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Dead-man's switch: exit 0 if a run of KEY ended within --max-age, "
            "else 1, with one line saying what is missing.",
        ),
    ] = False,
    max_age: Annotated[
        str | None,
        typer.Option("--max-age", metavar="DURATION", help="With --check: how recent (e.g. 25h)."),
    ] = None,
    success: Annotated[
        bool,
        typer.Option("--success", help="With --check: only a run that exited 0 counts."),
    ] = False,
) -> None:
    """The run ledger: recent `dlm exec` runs of KEY, or check that one ran.

    Newest first: host, user, command, start and end (the leader's clock, RFC 3339
    UTC), exit code or signal, fencing token, outcome (finished, killed, lock_lost,
    supervisor_gone, running) and how many hosts skipped it; --all: the last run of
    every key. --check is the dead-man's switch: exit 0 if a run (with --success, one
    that exited 0) of KEY ended within --max-age, else 1 with one line saying so.

    \b
    dlm runs nightly-backup --check --max-age 25h --success
    """
    from dlm.cli import runs as runs_view
    from dlm.cli.output import choose_format

    fmt = choose_format(output_format, settings.json)
    raise typer.Exit(
        runs_view.show(
            settings,
            key,
            every=every,
            output_format=fmt,
            check=check,
            max_age=max_age,
            success=success,
        )
    )


@lease_app.command("revoke")
@with_settings
def lease_revoke(
    *,
    settings: Settings,
    lease: Annotated[str, typer.Argument(metavar="ID", help="The lease to end.")],
) -> None:
    """End a lease now: free every lock it holds (the next waiters get them) and leave
    every queue it is in. Exits 77 if there is no such lease (expired or ended)."""
    from dlm.cli import ops

    ops.revoke(settings, lease)


@lease_app.command("list")
@with_settings
def lease_list(*, settings: Settings, output_format: FormatOpt = None) -> None:
    """List the live leases: TTL, time left, the keys each holds and waits for, its owner."""
    from dlm.cli import status_view
    from dlm.cli.output import choose_format

    status_view.list_leases(settings, choose_format(output_format, settings.json))


MemberIdArg = Annotated[str, typer.Argument(metavar="ID", help="The member's id.")]
IdentityArg = Annotated[str, typer.Argument(metavar="NAME", help="The identity's name.")]
CredentialOutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        metavar="FILE",
        help="Create FILE (mode 600) holding the identity's credential, for --secret-file.",
    ),
]


@auth_app.command("add")
@with_settings
def auth_add(
    *,
    settings: Settings,
    name: IdentityArg,
    role: Annotated[
        str,
        typer.Option(
            "--role", metavar="client|admin", help="client: locks keys under its prefixes only."
        ),
    ] = "client",
    prefix: Annotated[
        list[str] | None,
        typer.Option(
            "--prefix",
            metavar="P",
            help="A key prefix the client may lock, wait on and read (repeat for more).",
        ),
    ] = None,
    out: CredentialOutOpt = None,
) -> None:
    """Add an identity and write its credential file. Admins only (exit 77 otherwise)."""
    from dlm.cli import identities

    identities.add(settings, name, role, list(prefix or []), out)


@auth_app.command("list")
@with_settings
def auth_list(*, settings: Settings, output_format: FormatOpt = None) -> None:
    """List the identities: name, role, prefixes, key id, rotation (never a key)."""
    from dlm.cli import identities
    from dlm.cli.output import choose_format

    identities.list_identities(settings, choose_format(output_format, settings.json))


@auth_app.command("remove")
@with_settings
def auth_remove(*, settings: Settings, name: IdentityArg) -> None:
    """Remove an identity: its connections close and its renewals stop, so its leases
    expire at their TTL (each `dlm exec` holder stops its command first)."""
    from dlm.cli import identities

    identities.remove(settings, name)


def _limit_opt(flag: str, what: str) -> Any:
    return typer.Option(
        flag,
        metavar="N|default",
        help=f"At most N {what} (1 to 1000000000); default: back to the members' --identity{flag}.",
    )


@auth_app.command("set")
@with_settings
def auth_set(
    *,
    settings: Settings,
    name: IdentityArg,
    max_leases: Annotated[str | None, _limit_opt("--max-leases", "leases, cluster-wide")] = None,
    max_locks: Annotated[
        str | None, _limit_opt("--max-locks", "held locks plus places in queues, cluster-wide")
    ] = None,
    max_connections: Annotated[
        str | None, _limit_opt("--max-connections", "client connections to each member")
    ] = None,
    max_inflight: Annotated[
        str | None, _limit_opt("--max-inflight", "requests in flight on one connection")
    ] = None,
    clear: Annotated[
        bool,
        typer.Option("--clear", help="Every limit back to the members' --identity-max-* default."),
    ] = False,
) -> None:
    """Set an identity's own quotas; the limits not named keep their setting. Admins only
    (exit 77 otherwise). A lower limit refuses new leases, locks and connections; what the
    identity holds already stays."""
    from dlm.cli import identities

    identities.set_limits(
        settings,
        name,
        {
            "leases": max_leases,
            "locks": max_locks,
            "connections": max_connections,
            "inflight": max_inflight,
        },
        clear=clear,
    )


@auth_app.command("rotate")
@with_settings
def auth_rotate(
    *,
    settings: Settings,
    name: IdentityArg,
    out: CredentialOutOpt = None,
    finish: Annotated[
        bool,
        typer.Option("--finish", help="End the rotation: only the new key is valid from now."),
    ] = False,
) -> None:
    """Give an identity a new credential (--out FILE); the old one stays valid for 24 h or
    until `dlm auth rotate NAME --finish`, so running jobs are not cut off."""
    from dlm.cli import identities

    identities.rotate(settings, name, out, finish)


@members_app.command("list")
@with_settings
def members_list(*, settings: Settings, output_format: FormatOpt = None) -> None:
    """List the members: id, address, role (leader, follower, candidate, learner; unknown
    when it does not answer), whether it answers, and how far behind the leader it is."""
    from dlm.cli import members
    from dlm.cli.output import choose_format

    members.list_members(settings, choose_format(output_format, settings.json))


@members_app.command("add")
@with_settings
def members_add(
    *,
    settings: Settings,
    member: MemberIdArg,
    address: Annotated[
        str, typer.Argument(metavar="ADDR", help="Where the members reach it, as HOST:PORT.")
    ],
    output_format: FormatOpt = None,
) -> None:
    """Add a member as a learner: it gets the log but does not vote until it is promoted
    (by the leader once it has caught up, or with `dlm members promote`). Start it with
    `dlm node start --id ID --join ADDR,...`, which also adds it if it is not yet a member.

    Exits 2 if ID or ADDR is in use, 75 if another change is still pending.
    """
    from dlm.cli import members
    from dlm.cli.output import choose_format

    members.add(settings, member, address, choose_format(output_format, settings.json))


@members_app.command("remove")
@with_settings
def members_remove(
    *,
    settings: Settings,
    member: MemberIdArg,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Remove it even though the voters left would not have a quorum of members "
            "that answer now (the cluster waits for them to come back).",
        ),
    ] = False,
    output_format: FormatOpt = None,
) -> None:
    """Remove a member (the leader too: it hands over first). The removed member's process
    stops by itself (exit 0); its data directory cannot rejoin.

    Exits 2 for an unknown ID, the last voter, or a removal that would leave no quorum of
    answering voters (unless --force); 75 if another change is still pending.
    """
    from dlm.cli import members
    from dlm.cli.output import choose_format

    members.remove(settings, member, force, choose_format(output_format, settings.json))


@members_app.command("promote")
@with_settings
def members_promote(
    *,
    settings: Settings,
    member: MemberIdArg,
    output_format: FormatOpt = None,
) -> None:
    """Make a learner a voter (for members run with --auto-promote off). Promote it once
    it has caught up: `dlm members list` shows its lag.

    Exits 2 if ID is not a learner, 75 if another change is still pending.
    """
    from dlm.cli import members
    from dlm.cli.output import choose_format

    members.promote(settings, member, choose_format(output_format, settings.json))


def node_start(**flags: str | bool | None) -> None:
    """Run a cluster member in the foreground (no flags: a one-node cluster in ./dlm-data).

    Each flag may instead come from the environment variable shown beside it, or
    from the TOML file given with --config (keys as the flags, without the
    dashes); a flag wins over its variable, and a variable over the file.

    Exits 0 after a clean stop (or once it learns it was removed), 2 for flags that
    make no sense, 65 for a data directory of another member or cluster, 74 when its
    disk is full, 78 for secret or TLS files that cannot be used, 1 otherwise.
    """
    # anyio, the runtime and the client: only this command pays.
    from dlm.cli.node_join import join_cluster
    from dlm.node.runtime.main import start_from_options

    # A switch not given is "not set" (None), so its variable or file key still counts.
    given = {
        name: ("true" if value else None) if isinstance(value, bool) else value
        for name, value in flags.items()
    }
    raise typer.Exit(
        start_from_options(given, join=join_cluster, child_module="dlm.cli.node_child")
    )


def _node_flag(option: NodeOption) -> inspect.Parameter:
    if option.is_flag:
        return inspect.Parameter(
            option.param,
            inspect.Parameter.KEYWORD_ONLY,
            default=False,
            annotation=Annotated[
                bool,
                typer.Option(
                    option.flag, help=f"{option.help} [env: {option.env}]", show_default=False
                ),
            ],
        )
    return inspect.Parameter(
        option.param,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option(
                option.flag,
                metavar=option.metavar,
                help=f"{option.help} [env: {option.env}]",
                show_default=False,
            ),
        ],
    )


# Its flags come from one table (dlm.node.runtime.config.options), which also gives each its
# environment variable and config-file key: typer reads this signature.
node_start.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [_node_flag(option) for option in ALL_OPTIONS]
)
node_app.command("start")(node_start)


@app.command("gateway", no_args_is_help=False)
def gateway(
    ctx: typer.Context,
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Where clients connect. [env: DLM_GATEWAY_LISTEN]",
            show_default=False,
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            metavar="ADDR[,ADDR...]",
            help="The members to relay to (their advertised addresses); no other "
            "member is ever dialed. [env: DLM_CLUSTER]",
            show_default=False,
        ),
    ] = None,
    max_clients: Annotated[
        str | None,
        typer.Option(
            "--max-clients",
            metavar="N",
            help="Client connections open at once; one more is closed at once. "
            "[env: DLM_GATEWAY_MAX_CLIENTS; default: 4096]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a stateless gateway that relays clients to the cluster.

    Each client connection goes to its partition's leader (or the member the client
    names, if it is one of --cluster), and its bytes are relayed untouched: the
    member authenticates the client itself, so the gateway needs no secret.

    Exits 0 after SIGTERM or SIGINT (every connection closed), 2 for bad flags,
    1 when it cannot listen.
    """
    from dlm.cli import gateway as gateway_cmd

    top = ctx.obj
    raise typer.Exit(gateway_cmd.run(listen, cluster or getattr(top, "cluster", None), max_clients))


BumpOpt = Annotated[
    str | None,
    typer.Option(
        "--bump",
        metavar="N",
        help="How far the new log starts above the old one, so every new fencing token is "
        "higher than any the old cluster handed out (default 4294967296, 2**32).",
        show_default=False,
    ),
]
QuarantineOpt = Annotated[
    str | None,
    typer.Option(
        "--quarantine",
        metavar="DURATION",
        help="Grant no lock until the first leader has been in office this long (default: "
        "the longest lease TTL the cluster recorded, at least 30s).",
        show_default=False,
    ),
]


@node_app.command("restore")
def node_restore(
    *,
    ctx: typer.Context,
    backup_file: Annotated[
        str, typer.Argument(metavar="FILE", help="A backup made by dlm snapshot save.")
    ],
    data: Annotated[
        str,
        typer.Option(
            "--data",
            metavar="DIR",
            help="The new member's data directory (new).",
            show_default=False,
        ),
    ],
    node_id: Annotated[
        str, typer.Option("--id", metavar="ID", help="This member's id.", show_default=False)
    ],
    peers: Annotated[
        str,
        typer.Option(
            "--peers",
            metavar="ID=HOST:PORT,...",
            help="Every member of the restored cluster (the same on each).",
            show_default=False,
        ),
    ],
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster-id", metavar="NAME", help="Default: the backup's.", show_default=False
        ),
    ] = None,
    bump: BumpOpt = None,
    quarantine: QuarantineOpt = None,
    partitions: Annotated[
        str | None,
        typer.Option(
            "--partitions",
            metavar="P",
            help="Partitions of the restored cluster, 1 to 64 (every key re-hashed to its new "
            "partition). Default: the backup's.",
            show_default=False,
        ),
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Build a member's data directory of a new cluster incarnation from a backup (run once
    per member, from the same file, with every member of the old cluster stopped). With
    --partitions P the restored cluster has P partitions: this is how the partition count
    changes.

    Exits 0 when built, 1 for a file that is not an intact backup, 2 for anything to
    change first (flags, a --data directory that is not empty).
    """
    from dlm.cli import restore

    top = ctx.find_root().obj
    restore.restore(
        backup_file,
        data=data,
        node_id=node_id,
        peers=peers,
        cluster=cluster,
        bump=bump,
        quarantine=quarantine,
        as_json=json or (isinstance(top, GlobalOptions) and top.json),
        partitions=partitions,
    )


@node_app.command("recover")
def node_recover(
    *,
    ctx: typer.Context,
    data: Annotated[
        str,
        typer.Option(
            "--data", metavar="DIR", help="The survivor's data directory.", show_default=False
        ),
    ],
    force: Annotated[
        bool,
        typer.Option("--force", help="Do it: the old cluster's other members must all be stopped."),
    ] = False,
    bump: BumpOpt = None,
    quarantine: QuarantineOpt = None,
    json: JsonOpt = False,
) -> None:
    """Majority lost: turn one stopped survivor into the only voter of a new cluster
    incarnation, from everything its log holds; the others then join it with --join.

    Exits 0 when done, 1 for a damaged data directory, 2 without --force or for anything
    else to change first.
    """
    from dlm.cli import restore

    top = ctx.find_root().obj
    restore.recover(
        data=data,
        force=force,
        bump=bump,
        quarantine=quarantine,
        as_json=json or (isinstance(top, GlobalOptions) and top.json),
    )


@store_app.command("inspect")
def store_inspect(
    ctx: typer.Context,
    directory: Annotated[str, typer.Argument(metavar="DIR", help="A member's data directory.")],
    json: JsonOpt = False,
) -> None:
    """Report on a data directory without changing it."""
    from dlm.cli import ops

    top = ctx.find_root().obj
    ops.store_inspect(directory, json or (isinstance(top, GlobalOptions) and top.json))


@snapshot_app.command("save")
@with_settings
def snapshot_save(
    *,
    settings: Settings,
    file: Annotated[str, typer.Argument(metavar="FILE", help="The backup file to write.")],
) -> None:
    """Save a backup: the leader's image of the lock table at a committed index, written
    to FILE atomically with a checksum (the leader goes on serving meanwhile)."""
    from dlm.cli import snapshot

    snapshot.save(settings, file)


@snapshot_app.command("inspect")
def snapshot_inspect(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(metavar="FILE", help="A backup file.")],
    json: JsonOpt = False,
) -> None:
    """Check a backup file and say what it holds; exits 1 if it is not an intact backup."""
    from dlm.cli import snapshot

    top = ctx.find_root().obj
    snapshot.inspect(file, json or (isinstance(top, GlobalOptions) and top.json))


@secret_app.command("new")
def secret_new(
    out: Annotated[
        str | None,
        typer.Option(
            "--out", metavar="PATH", help="Create PATH (mode 600) holding it, instead of printing."
        ),
    ] = None,
) -> None:
    """Print a new random secret (256 bits), or write it to a new file with --out."""
    from dlm import auth
    from dlm.cli.exits import USAGE, CliError

    if out is None:
        print(auth.new_secret())
        return
    try:
        auth.write_secret_file(out)
    except auth.SecretFileError as exc:
        raise CliError("USAGE", str(exc), USAGE) from None
