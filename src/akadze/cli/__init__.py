"""The ``akadze`` command line.

Conventions for every command: readable tables for people, ``--json`` for
scripts; exit 0 on success, 1 on failure, 2 on bad usage; a bad argument or a
refused operation is one clear line on stderr, never a traceback; the database
URL comes from ``--database-url`` or ``AKADZE_DATABASE_URL`` and is never
printed with its password.

The exit code of an error is chosen here, from its class (:data:`EXIT_CODES`):
library errors say what went wrong, not how a program reports it.

Each command group lives in its own module here, named after the command, and is
imported only when that command runs (:class:`_Commands`): ``akadze worker`` does not
load the benchmarks, and a module of the harness may import ``akadze.cli.options``
without importing the commands that import it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib import metadata

import click
import psycopg

from ..dialog import schema_missing
from ..errors import (
    AkadzeError,
    AsyncHookError,
    ConfigurationError,
    DatabaseUnavailable,
    DuplicateJob,
    EmbeddedServerError,
    EnqueueError,
    FilterError,
    InvalidJobState,
    JobLost,
    JobNotFound,
    LimitError,
    MigrationError,
    ScheduleError,
    UnknownTask,
    UnstorableResult,
    WorkerError,
)
from ._render import shown

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

#: The exit code of every error class akadze defines (akadze.errors). An error takes
#: the code of the first of its classes (its own, then its bases, in method resolution
#: order) listed here: bad input or settings are bad usage (2); everything else that
#: stops a command, from an unreachable server to a failed migration or a crashed
#: worker, is a failure (1). Every class is listed, so that a new one must be placed;
#: the table is documented in docs/reference/cli.md (and tested against it).
EXIT_CODES: dict[type[AkadzeError], int] = {
    AkadzeError: EXIT_FAILURE,
    ConfigurationError: EXIT_USAGE,
    DatabaseUnavailable: EXIT_FAILURE,
    AsyncHookError: EXIT_USAGE,
    MigrationError: EXIT_FAILURE,
    EnqueueError: EXIT_USAGE,
    DuplicateJob: EXIT_FAILURE,
    UnknownTask: EXIT_USAGE,
    LimitError: EXIT_USAGE,
    ScheduleError: EXIT_USAGE,
    FilterError: EXIT_USAGE,
    JobNotFound: EXIT_FAILURE,
    InvalidJobState: EXIT_FAILURE,
    EmbeddedServerError: EXIT_FAILURE,
    WorkerError: EXIT_FAILURE,
    JobLost: EXIT_FAILURE,
    UnstorableResult: EXIT_FAILURE,
}


def documentation_url() -> str | None:
    """The documentation link of the installed package's metadata (project.urls)."""
    try:
        entries = metadata.metadata("akadze").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
        return None
    for entry in entries:
        label, _, url = str(entry).partition(",")
        if label.strip().lower() == "documentation":
            return str(url).strip()
    return None


#: The commands, each the ``command`` of the module of this package of the same name.
COMMANDS = ("bench", "dashboard", "db", "demo", "jobs", "limits", "metrics", "migrate",
            "queues", "schedules", "worker", "workers")


class _Commands(click.Group):
    """The top-level group: a command's module is imported when it is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        found = importlib.import_module(f"{__name__}.{cmd_name}").command
        assert isinstance(found, click.Command)
        return found


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=f"Documentation: {documentation_url() or 'the docs/ folder of the source'}"
                    " (akadze COMMAND -h for a command's options).")
@click.version_option(package_name="akadze", prog_name="akadze")
def cli() -> None:
    """akadze: a PostgreSQL job queue with exact limits and fair scheduling."""


def _one_line(message: str) -> str:
    """An error on one line, masked, with no control character (akadze.cli._render)."""
    return shown(" ".join(message.split()))


def exit_code(error: AkadzeError) -> int:
    """The exit code of ``error``, from :data:`EXIT_CODES`."""
    for kind in type(error).__mro__:
        code = EXIT_CODES.get(kind)
        if code is not None:
            return code
    return EXIT_FAILURE  # pragma: no cover - AkadzeError is in the table


def _database_error(error: psycopg.Error) -> str:
    """One line for a database problem no command turned into an akadze error."""
    missing = schema_missing(error)
    if missing is not None:
        return str(missing)
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return f"database error: {first}"


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
        code = exit_code(exc)
    except psycopg.Error as exc:  # the database refused or lost a statement
        click.echo(f"akadze: {_one_line(_database_error(exc))}", err=True)
        code = EXIT_FAILURE
    except KeyboardInterrupt:
        code = 130
    if code is None:
        code = EXIT_OK
    if argv is None:
        sys.exit(code)
    return int(code)
