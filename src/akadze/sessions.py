"""Sessions: the database handles akadze accepts, reduced to a raw psycopg connection.

A *session* is something the caller already holds a transaction on:

- a psycopg ``Connection`` or ``AsyncConnection``;
- a SQLAlchemy ``Connection``/``Session`` or ``AsyncConnection``/``AsyncSession``
  (also ``scoped_session``/``async_scoped_session``), on the ``postgresql+psycopg``
  driver only, since akadze talks to the psycopg connection underneath.

A *source* is something akadze may open a connection from: the :class:`~akadze.Akadze`
app (its ``database_url``), a URL string, a SQLAlchemy ``Engine``/``AsyncEngine``, a
``psycopg_pool`` pool. Sources are accepted wherever a session is, and get a
connection and a transaction of their own.

SQLAlchemy transactions follow SQLAlchemy's rules: handing a SQLAlchemy connection or
session to akadze begins its transaction if it has none yet (SQLAlchemy's
"autobegin"), and the caller commits or rolls back through SQLAlchemy as usual.
SQLAlchemy is optional: nothing here imports it unless the caller already has.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg import pq

from . import database
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .app import Akadze

SyncConnection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]

__all__ = [
    "async_connection",
    "reading",
    "reading_sync",
    "sync_connection",
    "writing",
    "writing_sync",
]


def type_name(obj: object) -> str:
    """``module.Class`` of ``obj``, for error messages."""
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


# -- classification ---------------------------------------------------------------

# SQLAlchemy kinds, as returned by _sqlalchemy_kind.
_SA_SYNC = frozenset({"connection", "session", "scoped_session"})
_SA_ASYNC = frozenset({"async_connection", "async_session", "async_scoped_session"})


def _sqlalchemy_kind(obj: object) -> str | None:
    """What kind of SQLAlchemy object ``obj`` is, without importing SQLAlchemy: an
    object of a module that was never imported cannot be an instance of its classes."""
    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy.engine import Connection, Engine

    if isinstance(obj, Connection):
        return "connection"
    if isinstance(obj, Engine):
        return "engine"
    if "sqlalchemy.orm" in sys.modules:
        from sqlalchemy.orm import Session, scoped_session

        if isinstance(obj, Session):
            return "session"
        if isinstance(obj, scoped_session):
            return "scoped_session"
    if "sqlalchemy.ext.asyncio" in sys.modules:
        from sqlalchemy.ext.asyncio import (
            AsyncConnection as SAAsyncConnection,
        )
        from sqlalchemy.ext.asyncio import (
            AsyncEngine,
            AsyncSession,
            async_scoped_session,
        )

        if isinstance(obj, SAAsyncConnection):
            return "async_connection"
        if isinstance(obj, AsyncSession):
            return "async_session"
        if isinstance(obj, async_scoped_session):
            return "async_scoped_session"
        if isinstance(obj, AsyncEngine):
            return "async_engine"
    return None


def _is_app(obj: object) -> bool:
    from .app import Akadze  # late: app.py must stay free to import anything

    return isinstance(obj, Akadze)


def is_sqlalchemy(obj: object) -> bool:
    """Whether ``obj`` is a SQLAlchemy connection, session or engine."""
    return _sqlalchemy_kind(obj) is not None


def is_async_session(obj: object) -> bool:
    """Whether ``obj`` is a session for the async API (psycopg or SQLAlchemy)."""
    return isinstance(obj, psycopg.AsyncConnection) or _sqlalchemy_kind(obj) in _SA_ASYNC


def is_sync_session(obj: object) -> bool:
    """Whether ``obj`` is a session for the ``_sync`` API (psycopg or SQLAlchemy)."""
    return isinstance(obj, psycopg.Connection) or _sqlalchemy_kind(obj) in _SA_SYNC


def _check_driver(dialect: Any, obj: object) -> None:
    name = getattr(dialect, "name", "?")
    driver = getattr(dialect, "driver", "?")
    if name != "postgresql" or driver != "psycopg":
        raise ConfigurationError(
            f"{type_name(obj)} uses the {name}+{driver} driver; akadze works through "
            "psycopg 3: create the engine with a postgresql+psycopg:// URL"
        )


def _wrong_flavour(obj: object, *, wanted_async: bool) -> ConfigurationError:
    if wanted_async:
        return ConfigurationError(
            f"{type_name(obj)} is a synchronous session; use the _sync function "
            "(for example enqueue_sync) with it, or pass an async session"
        )
    return ConfigurationError(
        f"{type_name(obj)} is an asynchronous session; await the async function "
        "(for example enqueue) with it, or pass a sync session"
    )


def _unsupported(obj: object, what: str) -> ConfigurationError:
    return ConfigurationError(
        f"unsupported {what} {type_name(obj)}: expected a psycopg connection, a SQLAlchemy "
        "connection or session (postgresql+psycopg), an engine, a psycopg_pool pool, "
        "the Akadze app or a database URL"
    )


# -- raw connections of sessions ----------------------------------------------------


def sync_connection(session: Any) -> SyncConnection:
    """The psycopg ``Connection`` of a sync session.

    A SQLAlchemy connection or session gets its transaction begun if it had none
    (SQLAlchemy's autobegin), so that what akadze writes is committed or rolled back
    with it.
    """
    if isinstance(session, psycopg.Connection):
        return session
    if isinstance(session, psycopg.AsyncConnection):
        raise _wrong_flavour(session, wanted_async=False)
    kind = _sqlalchemy_kind(session)
    if kind == "connection":
        _check_driver(session.dialect, session)
        if not session.in_transaction():
            session.begin()
        raw = session.connection.driver_connection
        return cast(SyncConnection, raw)
    if kind == "session":
        return sync_connection(session.connection())
    if kind == "scoped_session":
        return sync_connection(session())
    if kind in _SA_ASYNC:
        raise _wrong_flavour(session, wanted_async=False)
    raise _unsupported(session, "sync session")


async def async_connection(session: Any) -> AsyncConnection:
    """The psycopg ``AsyncConnection`` of an async session (see :func:`sync_connection`)."""
    if isinstance(session, psycopg.AsyncConnection):
        return session
    if isinstance(session, psycopg.Connection):
        raise _wrong_flavour(session, wanted_async=True)
    kind = _sqlalchemy_kind(session)
    if kind == "async_connection":
        _check_driver(session.dialect, session)
        if not session.in_transaction():
            await session.begin()
        fairy = await session.get_raw_connection()
        return cast(AsyncConnection, fairy.driver_connection)
    if kind == "async_session":
        return await async_connection(await session.connection())
    if kind == "async_scoped_session":
        return await async_connection(session())
    if kind in _SA_SYNC:
        raise _wrong_flavour(session, wanted_async=True)
    raise _unsupported(session, "async session")


def is_source(obj: object) -> bool:
    """Objects akadze opens a connection of its own from."""
    if obj is None or isinstance(obj, str) or _is_app(obj):
        return True
    if _sqlalchemy_kind(obj) in ("engine", "async_engine"):
        return True
    return _pool_kind(obj) is not None


def _pool_kind(obj: object) -> str | None:
    if "psycopg_pool" not in sys.modules:
        return None
    import psycopg_pool

    if isinstance(obj, psycopg_pool.ConnectionPool):
        return "pool"
    if isinstance(obj, psycopg_pool.AsyncConnectionPool):
        return "async_pool"
    return None


def _url_of(source: object) -> str:
    if source is None:
        return database.resolve_url(None)
    if isinstance(source, str):
        return database.normalize_url(source)
    return cast("Akadze", source).database_url


# -- opening connections from sources ---------------------------------------------------


@contextmanager
def _open_sync(source: Any) -> Iterator[SyncConnection]:
    """A connection of akadze's own from a source, in autocommit mode or in a
    SQLAlchemy transaction that is committed on a clean exit."""
    kind = _sqlalchemy_kind(source)
    if kind == "engine":
        _check_driver(source.dialect, source)
        with source.begin() as sa_connection:
            yield sync_connection(sa_connection)
        return
    if kind == "async_engine":
        raise _wrong_flavour(source, wanted_async=False)
    pool = _pool_kind(source)
    if pool == "pool":
        with source.connection() as conn:
            yield conn
        return
    if pool == "async_pool":
        raise _wrong_flavour(source, wanted_async=False)
    conn = database.connect(_url_of(source), autocommit=True)
    with conn:
        yield conn


@asynccontextmanager
async def _open_async(source: Any) -> AsyncIterator[AsyncConnection]:
    kind = _sqlalchemy_kind(source)
    if kind == "async_engine":
        _check_driver(source.dialect, source)
        async with source.begin() as sa_connection:
            yield await async_connection(sa_connection)
        return
    if kind == "engine":
        raise _wrong_flavour(source, wanted_async=True)
    pool = _pool_kind(source)
    if pool == "async_pool":
        async with source.connection() as conn:
            yield conn
        return
    if pool == "pool":
        raise _wrong_flavour(source, wanted_async=True)
    conn = await database.connect_async(_url_of(source), autocommit=True)
    async with conn:
        yield conn


# -- writing ----------------------------------------------------------------------------


@contextmanager
def writing_sync(session: Any) -> Iterator[SyncConnection]:
    """A psycopg connection to write with, in a transaction.

    - a SQLAlchemy connection/session: its transaction (begun if needed); the caller
      commits;
    - a psycopg connection inside a transaction: that transaction (the caller commits);
    - a psycopg connection with no transaction open (autocommit, or idle): a transaction
      of its own, committed on a clean exit, rolled back on an exception;
    - a source (app, URL, engine, pool, ``None`` for the default URL): a connection and
      transaction of its own, committed on a clean exit.
    """
    if is_source(session):
        with _open_sync(session) as conn, _own_transaction_sync(conn):
            yield conn
        return
    conn = sync_connection(session)
    with _own_transaction_sync(conn):
        yield conn


@asynccontextmanager
async def writing(session: Any) -> AsyncIterator[AsyncConnection]:
    """The async twin of :func:`writing_sync`."""
    if is_source(session):
        async with _open_async(session) as conn, _own_transaction(conn):
            yield conn
        return
    conn = await async_connection(session)
    async with _own_transaction(conn):
        yield conn


def in_transaction(conn: SyncConnection | AsyncConnection) -> bool:
    """Whether statements on ``conn`` run inside a transaction someone else commits:
    an open transaction, or a non-autocommit connection (whose first statement begins
    one, psycopg's and SQLAlchemy's rule)."""
    status = conn.info.transaction_status
    if status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
        return True
    return status == pq.TransactionStatus.IDLE and not conn.autocommit


@contextmanager
def _own_transaction_sync(conn: SyncConnection) -> Iterator[None]:
    # Only an autocommit connection outside any transaction needs one of its own; a
    # non-autocommit connection (SQLAlchemy's, or psycopg's default) begins its own
    # at the first statement and belongs to the caller.
    if conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        with conn.transaction():
            yield
    else:
        yield


@asynccontextmanager
async def _own_transaction(conn: AsyncConnection) -> AsyncIterator[None]:
    if conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        async with conn.transaction():
            yield
    else:
        yield


# -- reading ------------------------------------------------------------------------


@contextmanager
def reading_sync(source: Any) -> Iterator[SyncConnection]:
    """A psycopg connection to read with: the session's own connection, or a connection
    opened from a source (app, URL, ``Engine``, ``ConnectionPool``) and closed (returned)
    on exit."""
    if is_source(source):
        with _open_sync(source) as conn:
            yield conn
        return
    yield sync_connection(source)


@asynccontextmanager
async def reading(source: Any) -> AsyncIterator[AsyncConnection]:
    """The async twin of :func:`reading_sync` (``AsyncEngine``, ``AsyncConnectionPool``)."""
    if is_source(source):
        async with _open_async(source) as conn:
            yield conn
        return
    yield await async_connection(source)
