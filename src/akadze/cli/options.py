"""Options and output shared by every CLI command."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from .. import database

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


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str, sort_keys=False))


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    Console(soft_wrap=True).print(table)
