"""Entry point of the `dlm` command: runs the typer app and turns every outcome into an exit code.

Nothing a user sees is left to chance here: usage errors are one line (or one
JSON object with --json) and exit 2; errors from the cluster keep the exit
code of the table in exits.py; anything unexpected is one line naming it and
exit 70 (EX_SOFTWARE), never a traceback (set DLM_DEBUG=1 to see one).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from dlm.cli import exits
from dlm.cli.exits import CliError, Interrupted


def wants_json(args: Sequence[str]) -> bool:
    """Whether the user asked for JSON, judged from the raw arguments (a usage error
    may come before the parser got to --json). Words after ``--`` belong to CMD."""
    for i, arg in enumerate(args):
        if arg == "--":
            return False
        if arg == "--json":
            return True
        if arg == "--format=json" or (arg == "--format" and args[i + 1 : i + 2] == ["json"]):
            return True
    return False


def report(error: CliError, as_json: bool) -> int:
    from dlm.cli.output import complain, emit_json

    if error.reported:
        return error.exit_code
    if as_json:
        emit_json(error.to_json())
    else:
        complain(error.message)
    return error.exit_code


def _usage_message(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    command_path = getattr(ctx, "command_path", "") or "dlm"
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    message = " ".join(str(message).split())
    return f"{message} (see '{command_path} --help')"


def run(args: Sequence[str]) -> int:
    """Runs one command line and returns the exit code; prints everything the user sees."""
    as_json = wants_json(args)
    try:
        global _fast_exit
        if list(args) in (["--help"], ["-h"]) and not os.environ.get("DLM_NO_FASTPATH"):
            from dlm.cli import help_text

            if help_text.columns() >= help_text.MIN_COLUMNS:
                _fast_exit = True
                sys.stdout.write(help_text.TOP_LEVEL_HELP)
                return 0
        from dlm.cli import fastpath

        parsed = None if os.environ.get("DLM_NO_FASTPATH") else fastpath.parse(args)
        if parsed is not None:
            _fast_exit = True
            return fastpath.run(parsed)
        return _run_typer(args, as_json)
    except CliError as exc:
        return report(exc, as_json)
    except Interrupted as exc:
        return _interrupted(exc.signum, as_json)
    except KeyboardInterrupt:
        return _interrupted(2, as_json)
    except BrokenPipeError:
        # The reader went away (`dlm locks | head`): nothing more to say to it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exits.BROKEN_PIPE
    except Exception as exc:
        client_error = _client_error(exc)
        if client_error is not None:
            return report(client_error, as_json)
        if os.environ.get("DLM_DEBUG"):
            raise
        message = (
            f"internal error: {type(exc).__name__}: {exc}. This is a bug in dlm: please report "
            "it with the command you ran (DLM_DEBUG=1 shows the traceback)"
        )
        return report(CliError("INTERNAL", " ".join(message.split()), exits.INTERNAL), as_json)


def _interrupted(signum: int, as_json: bool) -> int:
    """Quiet, as shells are about Ctrl-C, except that --json still gets its one object."""
    code = 128 + signum
    if as_json:
        import signal

        name = signal.Signals(signum).name
        report(CliError("INTERRUPTED", f"interrupted by {name}", code), True)
    return code


def _run_typer(args: Sequence[str], as_json: bool) -> int:
    """The full command line: help, every subcommand, and every usage error."""
    try:
        import typer  # most of a plain run's import time, hence not on the fast path
        from typer._click import exceptions as click_exc
    except ImportError as exc:  # a broken install or zipapp: say what is missing
        raise CliError("INTERNAL", f"cannot load the CLI library: {exc}", exits.INTERNAL) from None

    from dlm.cli.app import app

    command = typer.main.get_command(app)
    try:
        result = command.main(args=list(args), prog_name="dlm", standalone_mode=False)
    except click_exc.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None and not as_json:
            sys.stderr.write(exc.ctx.get_help() + "\n")
            return exits.USAGE
        raise exits.usage_error(_usage_message(exc)) from None
    except click_exc.ClickException as exc:
        raise CliError("USAGE", exc.format_message(), exc.exit_code) from None
    except typer.Abort:
        raise CliError("INTERRUPTED", "interrupted", 130) from None
    return result if isinstance(result, int) else 0


def _client_error(exc: Exception) -> CliError | None:
    errors = sys.modules.get("dlm.client.errors")
    if errors is not None and isinstance(exc, errors.DlmError):
        return exits.from_client_error(exc)
    return None


_fast_exit = False
"""Set by ``run`` when a hot command (or the top-level help) ran without typer."""


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    code = run(args)
    tracing = sys.modules.get("dlm.tracing")  # loaded only by a command that may trace
    if tracing is not None:
        tracing.end_commands()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    if _fast_exit:
        # A cron job pays for the interpreter's teardown on every run (about a fifth
        # of a hot command's CPU): the hot paths leave nothing behind that needs it
        # (their helper threads are daemons, the guard is reaped, output is flushed).
        os._exit(code)
    sys.exit(code)
