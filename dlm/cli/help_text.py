"""`dlm --help` without loading typer: the text typer renders, kept here verbatim.

Typer and click are most of `dlm --help`'s start-up time, and the top-level
help is the same text on every terminal at least 80 columns wide (click caps
help at 80 columns), so main.py prints this instead; narrower terminals get
typer's own rendering. tests/unit/cli/test_help_text.py fails when the CLI
changes and this copy does not; regenerate it with
``python -m dlm.cli.help_text --write``.
"""

from __future__ import annotations

import os
import sys

MIN_COLUMNS = 80
"""At this width or wider click renders the same text (it wraps help at 78 columns)."""

TOP_LEVEL_HELP = (
    'Usage: dlm [OPTIONS] COMMAND [ARGS]...\n'
    '\n'
    '  dlm: distributed locks with fencing tokens, for cron jobs, CI and operators.\n'
    '\n'
    '  Examples:\n'
    '    dlm exec --lock nightly-backup -- /usr/local/bin/backup.sh\n'
    '    eval "$(dlm acquire deploy --ttl 5m --format env)"\n'
    '    dlm release deploy --lease "$DLM_LEASE_ID"\n'
    '    dlm status\n'
    '\n'
    '  Options --cluster, --timeout, --dial-timeout, --json, --secret-file and\n'
    '  --tls-* may be given before or after the subcommand. The cluster defaults to\n'
    '  $DLM_CLUSTER, else 127.0.0.1:7700. Shell completion: dlm --install-\n'
    '  completion (bash, zsh, fish).\n'
    '\n'
    '  Exit codes:\n'
    '\n'
    '    0   success (for exec: CMD exited 0)\n'
    '    1   status --check: the cluster is degraded (runs --check: no run ended\n'
    '        within --max-age; store inspect: damaged data; snapshot inspect, node\n'
    '        restore: not an intact backup)\n'
    '    2   usage error (members: an id or address in use, an unknown id, the last\n'
    '        voter, a removal that would leave no quorum of answering voters; node\n'
    '        recover without --force)\n'
    '    69  cluster unavailable: no member answered within --dial-timeout, or no\n'
    '        quorum within --timeout (watch, observe: no member served the watch\n'
    '        for --timeout)\n'
    '    70  internal error (a bug in dlm: please report it)\n'
    '    73  snapshot save: FILE cannot be written (no permission, disk full)\n'
    '    75  lock held by someone else and not obtained (immediately, or within --wait);\n'
    '        members: another membership change is still pending (retry)\n'
    '    77  lease lost, or not the holder (renew or release of an expired lease,\n'
    '        release of a grant the lease no longer holds, revoke of a lease that is\n'
    "        gone; exec's lock lost while CMD ran); or not permitted: the identity of\n"
    '        --secret-file may not do this (PERMISSION_DENIED), or is at one of its\n'
    '        quotas (QUOTA_EXCEEDED)\n'
    '    78  authentication or TLS failed, or their files cannot be used: set\n'
    '        --secret-file/DLM_SECRET_FILE or --tls-ca/DLM_TLS_CA as the message says\n'
    "    N   exec only: CMD's own exit code; 128+N when CMD was killed by signal N\n"
    '\n'
    'Options:\n'
    '  --cluster ADDR[,ADDR...]  Cluster members to ask. [env: DLM_CLUSTER;\n'
    '                            default: 127.0.0.1:7700]\n'
    '  --timeout DURATION        How long to try to reach a quorum before giving up\n'
    '                            (exit 69). [default: 10s]\n'
    '  --dial-timeout DURATION   Give up (exit 69) when no member has answered at\n'
    '                            all within this. [default: 2s]\n'
    '  --json                    Print exactly one JSON object on stdout, errors\n'
    '                            too.\n'
    "  --secret-file PATH        The cluster's client secret (a file made by `dlm\n"
    '                            secret new`, mode 600), when its members require\n'
    '                            one. [env: DLM_SECRET_FILE]\n'
    '  --tls-ca PATH             Connect with TLS, trusting the CA in PATH (PEM)\n'
    "                            for the members' certificates. [env: DLM_TLS_CA]\n"
    '  --tls-cert PATH           A client certificate to present (PEM; with --tls-\n'
    '                            key). [env: DLM_TLS_CERT]\n'
    '  --tls-key PATH            The unencrypted key of --tls-cert (PEM). [env:\n'
    '                            DLM_TLS_KEY]\n'
    '  --version                 Print the version.\n'
    '  --install-completion      Install completion for the current shell.\n'
    '  --show-completion         Show completion for the current shell, to copy it\n'
    '                            or customize the installation.\n'
    '  -h, --help                Show this message and exit.\n'
    '\n'
    'Commands:\n'
    '  acquire   Take a lock and print its key, fencing token, lease id and TTL.\n'
    '  renew     Renew a lease once, or keep it alive (--keep-alive).\n'
    '  release   Give a lock back.\n'
    '  exec      Run CMD (no shell) only while holding the lock; exit with...\n'
    '  elect     Campaign for NAME (FIFO), then lead: print the election and...\n'
    "  proclaim  Change NAME's value without a new election (same token); exit...\n"
    '  leader    Print the current leader of NAME once (value null with --json...\n'
    '  status    Show the cluster: members, roles, lag, last contact, and the...\n'
    '  watch     Print every change of a lock (or of the locks under a prefix)...\n'
    '  observe   Print the current leader of election NAME (the holder of lock...\n'
    '  locks     List the held locks, one line each.\n'
    '  runs      The run ledger: recent `dlm exec` runs of KEY, or check that...\n'
    '  gateway   Run a stateless gateway that relays clients to the cluster.\n'
    '  node      Run a cluster member.\n'
    "  members   Look at and change the cluster's members, one at a time.\n"
    "  store     Look into a member's data directory.\n"
    "  lease     Look at and end leases (an operator's tools).\n"
    '  secret    Make the shared secret members and clients authenticate with.\n'
    "  snapshot  Back up the cluster's replicated state to a file, and look...\n"
    "  auth      Manage the cluster's client identities: who may lock which...\n"
    '  config    Cluster-wide settings, changed through the log: default-ttl,...\n'
)  # fmt: skip


def columns() -> int:
    """The terminal width as click sees it (shutil.get_terminal_size, without importing shutil)."""
    try:
        width = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        width = 0
    if width > 0:
        return width
    try:
        width = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        width = 0
    return width if width > 0 else MIN_COLUMNS


def literal(text: str) -> str:
    """``text`` as Python source: one string literal a line, within the line limit."""
    lines = "".join(f"    {line!r}\n" for line in text.splitlines(keepends=True))
    return f"(\n{lines})  # fmt: skip"


def rendered() -> str:
    """What typer prints for `dlm --help` at 80 columns (loads typer)."""
    import io
    from contextlib import redirect_stdout

    import typer

    from dlm.cli.app import app

    command = typer.main.get_command(app)
    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(MIN_COLUMNS)
    try:
        with redirect_stdout(out):
            command.main(args=["--help"], prog_name="dlm", standalone_mode=False)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return out.getvalue()


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    with open(__file__) as f:
        source = f.read()
    start = source.index("TOP_LEVEL_HELP = ")
    end = source.index("\n\n\ndef columns")
    with open(__file__, "w") as f:
        f.write(source[:start] + f"TOP_LEVEL_HELP = {literal(rendered())}" + source[end:])
