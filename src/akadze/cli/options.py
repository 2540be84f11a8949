"""Options shared by every CLI command, and the two printers of what commands read
(``print_table``, ``print_json``: akadze.cli._render's, here for the harness too)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .. import database
from ..errors import ConfigurationError
from ._render import print_json, print_table

__all__ = ["database_url_option", "json_option", "print_json", "print_table", "resolve"]

F = TypeVar("F", bound=Callable[..., Any])


def database_url_option(fn: F) -> F:
    """``--database-url`` (default: AKADZE_DATABASE_URL, else the embedded server)."""
    return click.option(
        "--database-url",
        "database_url",
        default=None,
        metavar="URL",
        help="PostgreSQL URL (default: $AKADZE_DATABASE_URL, else the embedded server).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def resolve(url: str | None) -> str:
    """The URL to use; raises ConfigurationError (one line, exit 2) when there is none.

    When that is the embedded server and it was not running (after ``akadze db stop``,
    say), starting it is not silent: one line on stderr says so."""
    if url is not None or os.environ.get(database.ENV_URL):
        return database.resolve_url(url)
    from .. import embedded

    try:
        was_running = embedded.server().status().running
    except ConfigurationError:  # no extra: resolve_url says what to do
        was_running = True
    found = database.resolve_url(url)
    if not was_running:
        status = embedded.server().status()
        click.echo(f"akadze: started the embedded PostgreSQL server (pid {status.pid}, port "
                   f"{status.port}); akadze db stop stops it", err=True)
    return found
