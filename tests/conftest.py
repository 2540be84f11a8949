"""Test harness: every test gets its own migrated database, cloned from a template.

The server comes from AKADZE_TEST_DATABASE_URL (an admin URL, for example
postgresql://postgres@127.0.0.1:5432/postgres), defaulting to the local server.
The template is built once per schema version (its name carries a hash of the
migration files), so cloning a fresh database costs a few tens of milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from akadze.app import Akadze
from akadze.migrate import available, migrate_connection

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
TEMPLATE_LOCK = 0x616B61647A657474  # "akadzett": serialises template builds across runs


def _server_url() -> str:
    return os.environ.get("AKADZE_TEST_DATABASE_URL") or fallback_server_url(DEFAULT_SERVER)


def fallback_server_url(default: str, home: str | None = None) -> str:
    """``default`` when a server answers there, else the admin URL of the embedded
    server (started on demand; ``home`` defaults to the user's embedded directory)."""
    from akadze import embedded

    if embedded.answers(default):
        return default
    try:
        return embedded.admin_url(home)
    except Exception as exc:  # no extra, or it cannot start: say why, keep the default
        print(f"no server at {default} and no embedded server: {exc}")
        return default


def _with_dbname(url: str, dbname: str) -> str:
    """The same server URL, naming another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def _schema_hash() -> str:
    digest = hashlib.sha256()
    for migration in available():
        digest.update(f"{migration.version}:{migration.name}\n".encode())
        digest.update(migration.sql.encode())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="session")
def server_url() -> str:
    """Admin URL of the test server."""
    url = _server_url()
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.exit(f"no PostgreSQL server for tests at {url}: {exc}", returncode=3)
    return url


@pytest.fixture(scope="session")
def template_name(server_url: str) -> str:
    name = f"akadze_tmpl_{_schema_hash()}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK,))
        try:
            exists = admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                building = f"{name}_build"
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(building)))
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
                with psycopg.connect(_with_dbname(server_url, building), autocommit=True) as conn:
                    migrate_connection(conn)
                admin.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    sql.Identifier(building), sql.Identifier(name)))
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK,))
    return name


def create_database(server_url: str, template: str | None) -> tuple[str, str]:
    """Create a fresh database (from ``template`` when given); return (name, url)."""
    name = f"akadze_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        if template:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)))
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name, _with_dbname(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


@pytest.fixture
def database_url(server_url: str, template_name: str) -> Iterator[str]:
    """URL of a fresh, migrated database of this test's own."""
    name, url = create_database(server_url, template_name)
    try:
        yield url
    finally:
        drop_database(server_url, name)


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """URL of a fresh database with no akadze schema at all."""
    name, url = create_database(server_url, None)
    try:
        yield url
    finally:
        drop_database(server_url, name)


@pytest.fixture(autouse=True)
def _no_ambient_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never pick up the developer's AKADZE_DATABASE_URL by accident."""
    monkeypatch.delenv("AKADZE_DATABASE_URL", raising=False)


@pytest.fixture
def app(database_url: str) -> Akadze:
    return Akadze(database_url=database_url)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A sync autocommit connection to the test database."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
async def aconn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
    """An async autocommit connection to the test database."""
    connection = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    async with connection:
        yield connection


@pytest.fixture
def engine(database_url: str) -> Iterator[Any]:
    """A SQLAlchemy engine (psycopg driver) on the test database."""
    import sqlalchemy as sa

    from akadze.database import sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(database_url))
    yield engine
    engine.dispose()


@pytest.fixture
async def async_engine(database_url: str) -> AsyncIterator[Any]:
    """A SQLAlchemy async engine (psycopg driver) on the test database."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from akadze.database import sqlalchemy_url

    engine = create_async_engine(sqlalchemy_url(database_url))
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
def pgbouncer(server_url: str) -> Iterator[Any]:
    """A PgBouncer of the tests' own in transaction pooling mode, on a private port in
    front of the test server (akadze.bench.pgbouncer); skipped only when the
    ``pgbouncer`` binary is not installed (CI installs Debian's)."""
    from akadze.bench.pgbouncer import PgBouncer, find_pgbouncer

    if find_pgbouncer() is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    with PgBouncer(server_url, pool_mode="transaction", pool_size=40) as bouncer:
        yield bouncer


@pytest.fixture
def pgbouncer_url(pgbouncer: Any, database_url: str) -> str:
    """This test's database through the tests' PgBouncer (transaction pooling)."""
    return str(pgbouncer.url(database_url))
