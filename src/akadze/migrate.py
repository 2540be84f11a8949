"""Forward-only schema migrations, applied under an advisory lock.

Each migration is a file ``sql/migrations/NNNN_name.sql``; applied versions are
recorded in ``akadze.migrations``. Two ``akadze migrate`` runs at once are safe:
the second waits on the advisory lock, then finds nothing left to apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import psycopg

from . import database, queries
from .errors import MigrationError

# Advisory lock key for migrations: a fixed 64-bit number ("akadzemg" in ASCII).
MIGRATION_LOCK = 0x616B61647A656D67

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS akadze;
CREATE TABLE IF NOT EXISTS akadze.migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


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


_APPLIED = "SELECT version FROM akadze.migrations"
_HAS_TABLE = "SELECT to_regclass('akadze.migrations') IS NOT NULL"


def _record(migration: Migration) -> tuple[str, tuple[int, str]]:
    return ("INSERT INTO akadze.migrations (version, name) VALUES (%s, %s)",
            (migration.version, migration.name))


def migrate_connection(conn: psycopg.Connection[tuple[object, ...]]) -> list[Migration]:
    """Apply pending migrations over an open autocommit connection; return those applied."""
    applied_now: list[Migration] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s::bigint)", (MIGRATION_LOCK,))
        conn.execute(_BOOTSTRAP)
        done = {row[0] for row in conn.execute(_APPLIED)}
        for migration in pending_after({int(str(v)) for v in done}):
            try:
                conn.execute(migration.sql)
            except psycopg.Error as exc:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                ) from exc
            conn.execute(*_record(migration))
            applied_now.append(migration)
    return applied_now


async def migrate_connection_async(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
) -> list[Migration]:
    applied_now: list[Migration] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s::bigint)", (MIGRATION_LOCK,))
        await conn.execute(_BOOTSTRAP)
        cur = await conn.execute(_APPLIED)
        done = {int(str(row[0])) for row in await cur.fetchall()}
        for migration in pending_after(done):
            try:
                await conn.execute(migration.sql)
            except psycopg.Error as exc:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                ) from exc
            await conn.execute(*_record(migration))
            applied_now.append(migration)
    return applied_now


def pending_connection(conn: psycopg.Connection[tuple[object, ...]]) -> list[Migration]:
    """Migrations not yet applied (all of them on a fresh database); writes nothing."""
    exists = conn.execute(_HAS_TABLE).fetchone()
    if not exists or not exists[0]:
        return list(available())
    return pending_after({int(str(row[0])) for row in conn.execute(_APPLIED)})


def migrate_sync(url: str | None = None) -> list[Migration]:
    """Bring the database at ``url`` to the latest schema; returns what was applied."""
    with database.connect(database.resolve_url(url)) as conn:
        return migrate_connection(conn)


async def migrate(url: str | None = None) -> list[Migration]:
    """Async form of :func:`migrate_sync`."""
    conn = await database.connect_async(database.resolve_url(url))
    async with conn:
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
