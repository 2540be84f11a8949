"""Options shared by every CLI command, and the two printers of what commands read
(``print_table``, ``print_json``: akadze.cli._render's, here for the harness too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from .. import database
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
    """The URL to use; raises ConfigurationError (one line, exit 2) when there is none."""
    return database.resolve_url(url)
