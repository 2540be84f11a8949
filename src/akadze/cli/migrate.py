"""``akadze migrate``: bring the schema up to date, or check that it is."""

from __future__ import annotations

import click

from ..database import connect
from ..migrate import migrate_connection, pending_connection
from .options import database_url_option, resolve


@click.command("migrate")
@click.option("--check", is_flag=True, help="Only list pending migrations; exit 1 if any.")
@database_url_option
def command(check: bool, database_url: str | None) -> None:
    """Apply pending schema migrations (safe to run concurrently)."""
    with connect(resolve(database_url)) as conn:
        if check:
            pending = pending_connection(conn)
            if pending:
                for m in pending:
                    click.echo(f"pending: {m.version:04d}_{m.name}")
                raise click.exceptions.Exit(1)
            click.echo("schema is up to date")
            return
        applied = migrate_connection(conn)
    if applied:
        for m in applied:
            click.echo(f"applied: {m.version:04d}_{m.name}")
    else:
        click.echo("schema is up to date; nothing to apply")
