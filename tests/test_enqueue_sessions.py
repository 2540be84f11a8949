"""Enqueue joins the caller's transaction, for every kind of session."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from akadze import Akadze, ConfigurationError, EnqueueError


@pytest.fixture
def hello(app: Akadze) -> Any:
    @app.task("hello")
    def hello(name: str) -> str:
        return f"hello {name}"

    return hello


def names(conn: psycopg.Connection[Any]) -> list[str]:
    return [row[0] for row in conn.execute("SELECT args->>'name' FROM akadze.jobs ORDER BY id")]


def test_psycopg_sync_commit_and_rollback(database_url: str, conn: Any, hello: Any) -> None:
    with psycopg.connect(database_url) as mine:
        hello.using(session=mine).enqueue_sync(name="rolled back")
        hello.using(session=mine).enqueue_many_sync([{"name": "rolled back too"}])
        mine.rollback()
        job_id = hello.using(session=mine).enqueue_sync(name="kept")
        assert names(conn) == []  # not visible before the caller commits
        mine.commit()
    assert names(conn) == ["kept"]
    assert conn.execute("SELECT id FROM akadze.jobs").fetchone() == (job_id,)


def test_psycopg_autocommit_needs_a_transaction_block(
    database_url: str, conn: Any, hello: Any
) -> None:
    with psycopg.connect(database_url, autocommit=True) as mine:
        with pytest.raises(EnqueueError, match="transaction") as refused:
            hello.using(session=mine).enqueue_sync(name="nowhere")
        assert refused.value.field == "session"
        with pytest.raises(EnqueueError, match="transaction"):
            hello.using(session=mine).enqueue_many_sync([{"name": "nowhere"}])
        with mine.transaction():
            hello.using(session=mine).enqueue_sync(name="in block")
        with mine.transaction(force_rollback=True):
            hello.using(session=mine).enqueue_sync(name="rolled back")
    assert names(conn) == ["in block"]


def test_aborted_transaction_is_refused(database_url: str, hello: Any) -> None:
    with psycopg.connect(database_url) as mine:
        with pytest.raises(psycopg.errors.DivisionByZero):
            mine.execute("SELECT 1/0")
        with pytest.raises(EnqueueError, match="aborted"):
            hello.using(session=mine).enqueue_sync(name="x")


async def test_psycopg_async_commit_and_rollback(
    database_url: str, conn: Any, hello: Any
) -> None:
    mine = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    async with mine:
        with pytest.raises(EnqueueError, match="transaction"):
            await hello.using(session=mine).enqueue(name="nowhere")
        async with mine.transaction(force_rollback=True):
            await hello.using(session=mine).enqueue(name="rolled back")
            await hello.using(session=mine).enqueue_many([{"name": "rolled back"}])
        async with mine.transaction():
            await hello.using(session=mine).enqueue(name="kept")
            await hello.using(session=mine).enqueue_many([{"name": "kept too"}])
    assert names(conn) == ["kept", "kept too"]


def test_sqlalchemy_connection(engine: sa.Engine, conn: Any, hello: Any) -> None:
    with engine.connect() as sa_conn:
        hello.using(session=sa_conn).enqueue_sync(name="rolled back")
        sa_conn.rollback()
        hello.using(session=sa_conn).enqueue_sync(name="kept")
        hello.using(session=sa_conn).enqueue_many_sync([{"name": "many"}])
        sa_conn.execute(sa.text("SELECT 1"))  # the transaction is still SQLAlchemy's
        sa_conn.commit()
    with engine.begin() as sa_conn:
        hello.using(session=sa_conn).enqueue_sync(name="begin block")
    assert names(conn) == ["kept", "many", "begin block"]


def test_sqlalchemy_session(engine: sa.Engine, conn: Any, hello: Any) -> None:
    with Session(engine) as session:
        hello.using(session=session).enqueue_sync(name="rolled back")
        session.rollback()
        hello.using(session=session).enqueue_sync(name="kept")
        session.commit()
    with Session(engine) as session, session.begin():
        hello.using(session=session).enqueue_many_sync([{"name": "a"}, {"name": "b"}])
    assert names(conn) == ["kept", "a", "b"]


async def test_sqlalchemy_async_connection(async_engine: Any, conn: Any, hello: Any) -> None:
    async with async_engine.connect() as sa_conn:
        await hello.using(session=sa_conn).enqueue(name="rolled back")
        await sa_conn.rollback()
        await hello.using(session=sa_conn).enqueue(name="kept")
        await sa_conn.commit()
    assert names(conn) == ["kept"]


async def test_sqlalchemy_async_session(async_engine: Any, conn: Any, hello: Any) -> None:
    async with AsyncSession(async_engine) as session:
        await hello.using(session=session).enqueue(name="rolled back")
        await session.rollback()
        await hello.using(session=session).enqueue(name="kept")
        await hello.using(session=session).enqueue_many([{"name": "many"}])
        await session.commit()
    assert names(conn) == ["kept", "many"]


async def test_akadze_05_program_runs_unchanged(app: Akadze, conn: Any, hello: Any) -> None:
    async with app.engine.begin() as connection:
        await hello.using(session=connection).enqueue(name="ada")
    await app.engine.dispose()
    assert names(conn) == ["ada"]


async def test_session_none_commits_on_its_own(app: Akadze, conn: Any, hello: Any) -> None:
    first = hello.using().enqueue_sync(name="sync")
    second = await hello.using().enqueue(name="async")
    more = hello.using().enqueue_many_sync([{"name": "m1"}, {"name": "m2"}])
    assert more == [second + 1, second + 2]
    assert first < second
    assert names(conn) == ["sync", "async", "m1", "m2"]


async def test_wrong_flavour_points_to_the_other_method(
    database_url: str, engine: sa.Engine, async_engine: Any, hello: Any
) -> None:
    with psycopg.connect(database_url) as mine:
        with pytest.raises(ConfigurationError, match=r"enqueue_sync\(\.\.\.\)"):
            await hello.using(session=mine).enqueue(name="x")
        with pytest.raises(ConfigurationError, match=r"enqueue_many_sync"):
            await hello.using(session=mine).enqueue_many([{"name": "x"}])
    with Session(engine) as session, pytest.raises(ConfigurationError, match="enqueue_sync"):
        await hello.using(session=session).enqueue(name="x")
    async with AsyncSession(async_engine) as session:
        with pytest.raises(ConfigurationError, match=r"await enqueue\(\.\.\.\)"):
            hello.using(session=session).enqueue_sync(name="x")


def test_other_sqlalchemy_driver_is_refused(hello: Any) -> None:
    engine = sa.create_engine("sqlite://")
    with engine.connect() as sa_conn, pytest.raises(ConfigurationError, match=r"\+psycopg"):
        hello.using(session=sa_conn).enqueue_sync(name="x")
