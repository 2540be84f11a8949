"""akadze.sessions against the real database: every kind of session and source."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from akadze import Akadze, ConfigurationError
from akadze.sessions import (
    async_connection,
    reading,
    reading_sync,
    sync_connection,
    writing,
    writing_sync,
)


@pytest.fixture
def table(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE marks (x int)")
    return conn


def marks(conn: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in conn.execute("SELECT x FROM marks ORDER BY x")]


# -- psycopg ---------------------------------------------------------------------------


def test_psycopg_autocommit_gets_its_own_transaction(database_url: str, table: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as mine:
        with writing_sync(mine) as raw:
            assert raw is mine
            raw.execute("INSERT INTO marks VALUES (1)")
            assert marks(table) == []  # not committed yet: a transaction of its own
        assert marks(table) == [1]
        with pytest.raises(RuntimeError), writing_sync(mine) as raw:
            raw.execute("INSERT INTO marks VALUES (2)")
            raise RuntimeError("boom")
    assert marks(table) == [1]


def test_psycopg_joins_the_callers_transaction(database_url: str, table: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as mine:
        with mine.transaction(force_rollback=True):
            with writing_sync(mine) as raw:
                raw.execute("INSERT INTO marks VALUES (1)")
            assert marks(table) == []
        assert marks(table) == []
    # A non-autocommit connection belongs to the caller: nothing is committed for it.
    with psycopg.connect(database_url) as mine:
        with writing_sync(mine) as raw:
            raw.execute("INSERT INTO marks VALUES (3)")
        assert marks(table) == []
        mine.commit()
    assert marks(table) == [3]


async def test_psycopg_async(database_url: str, table: Any) -> None:
    mine = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    async with mine:
        assert await async_connection(mine) is mine
        async with writing(mine) as raw:
            await raw.execute("INSERT INTO marks VALUES (1)")
        async with mine.transaction(force_rollback=True), writing(mine) as raw:
            await raw.execute("INSERT INTO marks VALUES (2)")
        async with reading(mine) as raw:
            cur = await raw.execute("SELECT count(*) FROM marks")
            assert await cur.fetchone() == (1,)
    assert marks(table) == [1]


# -- SQLAlchemy ------------------------------------------------------------------------


def test_sqlalchemy_connection(engine: sa.Engine, table: Any) -> None:
    with engine.connect() as sa_conn:
        raw = sync_connection(sa_conn)
        assert isinstance(raw, psycopg.Connection)
        assert sa_conn.in_transaction()  # autobegun, as SQLAlchemy would
        with writing_sync(sa_conn) as raw:
            raw.execute("INSERT INTO marks VALUES (1)")
        sa_conn.rollback()
        assert marks(table) == []
        with writing_sync(sa_conn) as raw:
            raw.execute("INSERT INTO marks VALUES (2)")
        assert marks(table) == []  # the caller commits
        sa_conn.commit()
    assert marks(table) == [2]


def test_sqlalchemy_session_and_scoped_session(engine: sa.Engine, table: Any) -> None:
    with Session(engine) as session:
        with writing_sync(session) as raw:
            raw.execute("INSERT INTO marks VALUES (1)")
        session.rollback()
        with writing_sync(session) as raw:
            raw.execute("INSERT INTO marks VALUES (2)")
        session.commit()
    scoped = scoped_session(sessionmaker(engine))
    with writing_sync(scoped) as raw:
        raw.execute("INSERT INTO marks VALUES (3)")
    scoped.commit()
    scoped.remove()
    assert marks(table) == [2, 3]


def test_sqlalchemy_autocommit_connection_gets_its_own_transaction(
    engine: sa.Engine, table: Any
) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as sa_conn:
        with writing_sync(sa_conn) as raw:
            assert raw.autocommit
            raw.execute("INSERT INTO marks VALUES (1)")
        sa_conn.rollback()  # nothing to roll back: it was committed on exit
    assert marks(table) == [1]


async def test_sqlalchemy_async_connection(async_engine: Any, table: Any) -> None:
    async with async_engine.connect() as sa_conn:
        async with writing(sa_conn) as raw:
            assert isinstance(raw, psycopg.AsyncConnection)
            await raw.execute("INSERT INTO marks VALUES (1)")
        await sa_conn.rollback()
        async with writing(sa_conn) as raw:
            await raw.execute("INSERT INTO marks VALUES (2)")
        await sa_conn.commit()
    assert marks(table) == [2]


async def test_sqlalchemy_async_session(async_engine: Any, table: Any) -> None:
    async with AsyncSession(async_engine) as session:
        async with writing(session) as raw:
            await raw.execute("INSERT INTO marks VALUES (1)")
        await session.rollback()
        async with writing(session) as raw:
            await raw.execute("INSERT INTO marks VALUES (2)")
        await session.commit()
    assert marks(table) == [2]


def test_sqlalchemy_other_driver_is_refused() -> None:
    engine = sa.create_engine("sqlite://")
    other_driver = r"postgresql\+psycopg"
    with engine.connect() as sa_conn, pytest.raises(ConfigurationError, match=other_driver):
        sync_connection(sa_conn)
    with pytest.raises(ConfigurationError, match=r"postgresql\+psycopg"), writing_sync(engine):
        pass


# -- sources ---------------------------------------------------------------------------


def test_sources_sync(database_url: str, engine: sa.Engine, table: Any) -> None:
    app = Akadze(database_url=database_url)
    with psycopg_pool.ConnectionPool(database_url, min_size=1, open=True) as pool:
        for n, source in enumerate([app, database_url, engine, pool], start=1):
            with writing_sync(source) as raw:
                raw.execute("INSERT INTO marks VALUES (%s)", (n,))
            with pytest.raises(RuntimeError), writing_sync(source) as raw:
                raw.execute("INSERT INTO marks VALUES (100)")
                raise RuntimeError("rolled back")
            with reading_sync(source) as raw:
                assert raw.execute("SELECT max(x) FROM marks").fetchone() == (n,)
    assert marks(table) == [1, 2, 3, 4]


async def test_sources_async(database_url: str, async_engine: Any, table: Any) -> None:
    app = Akadze(database_url=database_url)
    async with psycopg_pool.AsyncConnectionPool(database_url, min_size=1, open=False) as pool:
        for n, source in enumerate([app, database_url, async_engine, pool], start=1):
            async with writing(source) as raw:
                await raw.execute("INSERT INTO marks VALUES (%s)", (n,))
            with pytest.raises(RuntimeError):
                async with writing(source) as raw:
                    await raw.execute("INSERT INTO marks VALUES (100)")
                    raise RuntimeError("rolled back")
            async with reading(source) as raw:
                cur = await raw.execute("SELECT max(x) FROM marks")
                assert await cur.fetchone() == (n,)
    assert marks(table) == [1, 2, 3, 4]


def test_app_engine_is_usable_as_a_source(database_url: str) -> None:
    app = Akadze(database_url=database_url)
    assert app.engine.dialect.driver == "psycopg"


# -- refusals ----------------------------------------------------------------------------


async def test_wrong_flavour_is_refused_with_a_pointer(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], engine: sa.Engine
) -> None:
    with pytest.raises(ConfigurationError, match="_sync"):
        await async_connection(conn)
    with engine.connect() as sa_conn, pytest.raises(ConfigurationError, match="_sync"):
        await async_connection(sa_conn)
    with pytest.raises(ConfigurationError, match="asynchronous"):
        sync_connection(aconn)
    with pytest.raises(ConfigurationError, match="asynchronous"), reading_sync(aconn):
        pass


def test_unsupported_objects_name_their_type() -> None:
    with pytest.raises(ConfigurationError, match=r"builtins\.dict"):
        sync_connection({})
    with pytest.raises(ConfigurationError, match=r"builtins\.int"), writing_sync(42):
        pass
    url = "mysql://root:hunter2@db/x"
    with pytest.raises(ConfigurationError, match="not a PostgreSQL") as refused, writing_sync(url):
        pass
    assert "hunter2" not in str(refused.value)
