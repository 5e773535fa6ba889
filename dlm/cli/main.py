"""Entry point of the `dlm` command: builds the typer app and maps outcomes to exit codes."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

app = typer.Typer(
    name="dlm",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
    help="dlm: distributed locks with fencing tokens, from the shell.",
)
node_app = typer.Typer(
    add_completion=False, rich_markup_mode=None, no_args_is_help=True, help="Run a cluster member."
)
store_app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Look at a member's data directory.",
)
app.add_typer(node_app, name="node")
app.add_typer(store_app, name="store")


@node_app.command("start")
def node_start(
    node_id: Annotated[str | None, typer.Option("--id", help="This member's id.")] = None,
    listen: Annotated[str | None, typer.Option("--listen", help="HOST:PORT to serve on.")] = None,
    peers: Annotated[str | None, typer.Option("--peers", help="ID=HOST:PORT,...")] = None,
    data: Annotated[str | None, typer.Option("--data", help="Data directory.")] = None,
    cluster_id: Annotated[str | None, typer.Option("--cluster-id", help="Cluster id.")] = None,
) -> None:
    """Start a cluster member in the foreground."""
    from dlm.node.main import start_node

    code = start_node(node_id=node_id, listen=listen, peers=peers, data=data, cluster=cluster_id)
    raise typer.Exit(code)


@store_app.command("inspect")
def store_inspect(
    directory: Annotated[str, typer.Argument(help="A member's data directory.")],
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Report on a data directory without changing it."""
    import json

    from dlm.store import StoreError
    from dlm.store.inspect import inspect_store, inspect_store_json

    try:
        if json_out:
            print(json.dumps(inspect_store_json(directory)))
        else:
            print(inspect_store(directory))
    except (StoreError, OSError) as exc:
        if json_out:
            print(json.dumps({"error": {"code": "STORE", "message": str(exc)}}))
        else:
            print(f"dlm: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


def main() -> None:
    try:
        app()
    except Exception as exc:  # a traceback never reaches a user
        print(f"dlm: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
