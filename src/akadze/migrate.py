"""Forward-only schema migrations, applied under an advisory lock.

Each migration is a file ``sql/migrations/NNNN_name.sql``; applied versions are
recorded in ``akadze.migrations``. Two ``akadze migrate`` runs at once are safe:
the second waits on the advisory lock, then finds nothing left to apply.

The pending migrations run in one transaction. A migration may end with a part after
the line ``-- akadze: after commit``: statements that must not run under the locks of
that transaction (``VALIDATE CONSTRAINT`` of a constraint added ``NOT VALID``, which
scans a large table while writes go on). They must be idempotent: every ``migrate``
runs the after-commit parts of all migrations once the transaction has committed (a
validated constraint is validated again in no time), so a part that failed, or was
cut short, is done by the next run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import psycopg

from . import database, dialog, queries
from .dialog import Dialog
from .errors import MigrationError

# Advisory lock key for migrations: a fixed 64-bit number ("akadzemg" in ASCII).
MIGRATION_LOCK = 0x616B61647A656D67

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_AFTER_COMMIT = re.compile(r"^-- akadze: after commit$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def in_transaction(self) -> str:
        """The statements run in the migrations' transaction."""
        return _AFTER_COMMIT.split(self.sql, maxsplit=1)[0]

    @property
    def after_commit(self) -> str:
        """The statements run after that transaction has committed ("" for none)."""
        parts = _AFTER_COMMIT.split(self.sql, maxsplit=1)
        return parts[1].strip() if len(parts) > 1 else ""


@cache
def available() -> tuple[Migration, ...]:
    """Every migration shipped with this version of akadze, in order."""
    folder = resources.files("akadze").joinpath("sql", "migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match is None:
            continue
        found.append(
            Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8"))
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a version number")
    return tuple(found)


def latest_version() -> int:
    return available()[-1].version


def pending_after(applied: set[int]) -> list[Migration]:
    """The shipped migrations not yet applied, in order. Refuses a database that is
    ahead of this code (it was migrated by a newer akadze)."""
    known = {m.version for m in available()}
    unknown = sorted(applied - known)
    if unknown:
        raise MigrationError(
            f"the database has migrations this version of akadze does not know: {unknown}; "
            "upgrade akadze"
        )
    return [m for m in available() if m.version not in applied]


# -- the dialogs (akadze.dialog), run on a sync or an async connection ---------------------


def _applied() -> Dialog[set[int]]:
    return {int(str(row[0])) for row in (yield from dialog.rows(queries.get("migrate_applied")))}


def _migrate_in_transaction() -> Dialog[list[Migration]]:
    yield from dialog.execute(queries.get("migrate_lock"), {"key": MIGRATION_LOCK})
    yield from dialog.execute(queries.get("migrate_bootstrap"))
    applied_now: list[Migration] = []
    for migration in pending_after((yield from _applied())):
        try:
            yield from dialog.execute(migration.in_transaction)
        except psycopg.Error as exc:
            raise MigrationError(
                f"migration {migration.version:04d}_{migration.name} failed: {exc}"
            ) from exc
        yield from dialog.execute(queries.get("migrate_record"),
                                  {"version": migration.version, "name": migration.name})
        applied_now.append(migration)
    return applied_now


def _after_commit() -> Dialog[None]:
    """The after-commit parts of every migration, each in a transaction of its own
    (the connection is in autocommit mode): all migrations are applied by now."""
    for migration in available():
        if not migration.after_commit:
            continue
        try:
            yield from dialog.execute(migration.after_commit)
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise MigrationError(
                f"migration {migration.version:04d}_{migration.name} is applied, but its "
                f"after-commit step failed: {first}; see the comment at the top of the "
                "migration, then run akadze migrate again"
            ) from exc


def _migrate() -> Dialog[list[Migration]]:
    applied = yield from dialog.transaction(_migrate_in_transaction())
    yield from _after_commit()
    return applied


def _pending() -> Dialog[list[Migration]]:
    exists = yield from dialog.one(queries.get("migrate_has_table"))
    if not exists or not exists[0]:
        return list(available())
    return pending_after((yield from _applied()))


def _applied_versions() -> Dialog[list[str]]:
    exists = yield from dialog.one(queries.get("migrate_has_table"))
    if not exists or not exists[0]:
        return []
    return [f"{version:04d}" for version in sorted((yield from _applied()))]


def applied_versions(database_url: str | None = None) -> list[str]:
    """The versions of the migrations applied to the database at ``database_url`` (the
    app's URL; None: ``AKADZE_DATABASE_URL`` or the embedded server), as their
    four-digit numbers (``"0001"``), in order: an empty list when the schema is absent.
    Reads only: nothing is created."""
    with database.connect(database.resolve_url(database_url)) as conn:
        return dialog.run_sync(conn, _applied_versions())


def migrate_connection(conn: psycopg.Connection[Any]) -> list[Migration]:
    """Apply pending migrations over an open autocommit connection; return those applied."""
    return dialog.run_sync(conn, _migrate())


async def migrate_connection_async(conn: psycopg.AsyncConnection[Any]) -> list[Migration]:
    """The async twin of :func:`migrate_connection`."""
    return await dialog.run_async(conn, _migrate())


def pending_connection(conn: psycopg.Connection[Any]) -> list[Migration]:
    """Migrations not yet applied (all of them on a fresh database); writes nothing."""
    return dialog.run_sync(conn, _pending())


def migrate_sync(url: str | None = None) -> list[Migration]:
    """Bring the database at ``url`` to the latest schema; returns what was applied."""
    with database.connect(database.resolve_url(url)) as conn:
        return migrate_connection(conn)


async def migrate(url: str | None = None) -> list[Migration]:
    """Async form of :func:`migrate_sync`."""
    async with await database.connect_async(database.resolve_url(url)) as conn:
        return await migrate_connection_async(conn)


def pending_sync(url: str | None = None) -> list[Migration]:
    with database.connect(database.resolve_url(url)) as conn:
        return pending_connection(conn)


_SCHEMA_PARTS = (
    ("type", "schema_types"),
    ("column", "schema_columns"),
    ("constraint", "schema_constraints"),
    ("index", "schema_indexes"),
    ("trigger", "schema_triggers"),
    ("function", "schema_functions"),
)


def describe_schema(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    """A stable, line-per-object text description of the ``akadze`` schema."""
    lines: list[str] = []
    for kind, query in _SCHEMA_PARTS:
        for row in conn.execute(queries.get(query)):
            lines.append(kind + " " + " | ".join("" if v is None else str(v) for v in row))
    return "\n".join(lines) + "\n"
