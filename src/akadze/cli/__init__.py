"""The ``akadze`` command line.

Conventions for every command: readable tables for people, ``--json`` for
scripts; exit 0 on success, 1 on failure, 2 on bad usage; a bad argument or a
refused operation is one clear line on stderr, never a traceback; the database
URL comes from ``--database-url`` or ``AKADZE_DATABASE_URL`` and is never
printed with its password.

Each command group lives in its own module here and is registered below.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click
import psycopg

from ..database import mask_password
from ..errors import AkadzeError
from . import bench, db, demo, jobs, limits, metrics, migrate, queues, schedules, worker, workers
from .dashboard import command as dashboard_command

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="akadze", prog_name="akadze")
def cli() -> None:
    """akadze: a PostgreSQL job queue with exact limits and fair scheduling."""


for module in (migrate, worker, jobs, queues, limits, workers, schedules, metrics, db, demo, bench):
    cli.add_command(module.command)
cli.add_command(dashboard_command)


def _one_line(message: str) -> str:
    return " ".join(mask_password(message).split())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``akadze`` script. Returns (and exits with) the exit code."""
    try:
        code = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        code = EXIT_USAGE
    except click.UsageError as exc:
        click.echo(f"akadze: {_one_line(exc.format_message())}", err=True)
        code = EXIT_USAGE
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.Abort:
        click.echo("akadze: aborted", err=True)
        code = EXIT_FAILURE
    except AkadzeError as exc:
        click.echo(f"akadze: {_one_line(str(exc))}", err=True)
        code = getattr(exc, "exit_code", EXIT_USAGE)
    except psycopg.Error as exc:  # a database problem no command turned into its own error
        missing = isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName)
        hint = " (no akadze schema there? run `akadze migrate`)" if missing else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        click.echo(f"akadze: database error: {_one_line(first)}{hint}", err=True)
        code = EXIT_FAILURE
    except KeyboardInterrupt:
        code = 130
    if code is None:
        code = EXIT_OK
    if argv is None:
        sys.exit(code)
    return int(code)
