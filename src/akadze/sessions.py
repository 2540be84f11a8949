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

import abc
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

import psycopg
from psycopg import pq

from . import database
from .errors import ConfigurationError

if TYPE_CHECKING:  # for the type aliases only: SQLAlchemy is never imported at run time
    import psycopg_pool
    from sqlalchemy import engine as sa_engine
    from sqlalchemy import orm as sa_orm
    from sqlalchemy.ext import asyncio as sa_asyncio

SyncConnection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]

__all__ = [
    "DatabaseSource",
    "Session",
    "Source",
    "SyncSession",
    "async_connection",
    "reading",
    "reading_sync",
    "sync_connection",
    "url_source",
    "writing",
    "writing_sync",
]


class DatabaseSource(abc.ABC):
    """Something akadze opens connections of its own from, by URL: the
    :class:`~akadze.Akadze` app is one."""

    @property
    @abc.abstractmethod
    def database_url(self) -> str:
        """The URL of the database."""


#: A source for either API: the app, a database URL, or ``None`` (the default URL).
Source: TypeAlias = "DatabaseSource | str | None"

#: What the async API accepts: an async session, joined (a psycopg ``AsyncConnection``;
#: a SQLAlchemy ``AsyncConnection``, ``AsyncSession`` or ``async_scoped_session``), or a
#: source that gets a connection of its own (``AsyncEngine``, ``AsyncConnectionPool``,
#: the app, a URL, ``None``).
Session: TypeAlias = (
    "psycopg.AsyncConnection[Any] | sa_asyncio.AsyncConnection | sa_asyncio.AsyncSession"
    " | sa_asyncio.async_scoped_session[Any] | sa_asyncio.AsyncEngine"
    " | psycopg_pool.AsyncConnectionPool[Any] | Source"
)

#: What the ``_sync`` API accepts: a sync session (a psycopg ``Connection``; a SQLAlchemy
#: ``Connection``, ``Session`` or ``scoped_session``), or a source (``Engine``,
#: ``ConnectionPool``, the app, a URL, ``None``).
SyncSession: TypeAlias = (
    "psycopg.Connection[Any] | sa_engine.Connection | sa_orm.Session"
    " | sa_orm.scoped_session[Any] | sa_engine.Engine | psycopg_pool.ConnectionPool[Any]"
    " | Source"
)


def type_name(obj: object) -> str:
    """``module.Class`` of ``obj``, for error messages."""
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


# -- classification: one core for both flavours -----------------------------------------

Flavour = Literal["sync", "async"]

# What _kind returns, and the flavour of each kind that has one.
_FLAVOUR: dict[str, Flavour] = {
    "psycopg": "sync", "connection": "sync", "session": "sync", "scoped_session": "sync",
    "engine": "sync", "pool": "sync",
    "async_psycopg": "async", "async_connection": "async", "async_session": "async",
    "async_scoped_session": "async", "async_engine": "async", "async_pool": "async",
}
_SOURCES = frozenset({"engine", "async_engine", "pool", "async_pool", "url"})


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


def _pool_kind(obj: object) -> str | None:
    if "psycopg_pool" not in sys.modules:
        return None
    import psycopg_pool

    if isinstance(obj, psycopg_pool.ConnectionPool):
        return "pool"
    if isinstance(obj, psycopg_pool.AsyncConnectionPool):
        return "async_pool"
    return None


def _kind(obj: object) -> str | None:
    """The kind of a session or source (a key of _FLAVOUR, or ``"url"`` for what is
    opened by URL: the app, a URL string, None), None for anything else."""
    if isinstance(obj, psycopg.Connection):
        return "psycopg"
    if isinstance(obj, psycopg.AsyncConnection):
        return "async_psycopg"
    if obj is None or isinstance(obj, str | DatabaseSource):
        return "url"
    return _sqlalchemy_kind(obj) or _pool_kind(obj)


def _checked(obj: object, wanted: Flavour, what: str, *, sources: bool) -> str:
    """The kind of ``obj``, refused when it is unknown (or a source, unless ``sources``)
    or of the other flavour."""
    kind = _kind(obj)
    if kind is None or (kind in _SOURCES and not sources):
        raise ConfigurationError(
            f"unsupported {what} {type_name(obj)}: expected a psycopg connection, a "
            "SQLAlchemy connection or session (postgresql+psycopg), an engine, a "
            "psycopg_pool pool, the Akadze app or a database URL"
        )
    if _FLAVOUR.get(kind, wanted) != wanted:
        if wanted == "async":
            raise ConfigurationError(
                f"{type_name(obj)} is a synchronous session; use the _sync function "
                "(for example enqueue_sync) with it, or pass an async session"
            )
        raise ConfigurationError(
            f"{type_name(obj)} is an asynchronous session; await the async function "
            "(for example enqueue) with it, or pass a sync session"
        )
    return kind


def _check_driver(obj: Any) -> None:
    dialect = obj.dialect
    name = getattr(dialect, "name", "?")
    driver = getattr(dialect, "driver", "?")
    if name != "postgresql" or driver != "psycopg":
        raise ConfigurationError(
            f"{type_name(obj)} uses the {name}+{driver} driver; akadze works through "
            "psycopg 3: create the engine with a postgresql+psycopg:// URL"
        )


def is_source(obj: object) -> bool:
    """Objects akadze opens a connection of its own from."""
    return _kind(obj) in _SOURCES


def is_sqlalchemy(obj: object) -> bool:
    """Whether ``obj`` is a SQLAlchemy connection, session or engine."""
    return _sqlalchemy_kind(obj) is not None


def is_async_session(obj: object) -> bool:
    """Whether ``obj`` is a session for the async API (psycopg or SQLAlchemy)."""
    kind = _kind(obj)
    return kind not in _SOURCES and _FLAVOUR.get(kind or "") == "async"


def is_sync_session(obj: object) -> bool:
    """Whether ``obj`` is a session for the ``_sync`` API (psycopg or SQLAlchemy)."""
    kind = _kind(obj)
    return kind not in _SOURCES and _FLAVOUR.get(kind or "") == "sync"


def url_source(obj: object) -> str | None:
    """The database URL of a source akadze opens by URL (the app, a URL, ``None`` for
    the default), None for anything else (a connection, an engine, a pool)."""
    return _url_of(obj) if _kind(obj) == "url" else None


def _url_of(source: object) -> str:
    if isinstance(source, DatabaseSource):
        return source.database_url
    if source is None:
        return database.resolve_url(None)
    return database.normalize_url(cast(str, source))


# -- raw connections of sessions ----------------------------------------------------


def sync_connection(session: Any) -> SyncConnection:
    """The psycopg ``Connection`` of a sync session.

    A SQLAlchemy connection or session gets its transaction begun if it had none
    (SQLAlchemy's autobegin), so that what akadze writes is committed or rolled back
    with it.
    """
    kind = _checked(session, "sync", "sync session", sources=False)
    if kind == "psycopg":
        return cast(SyncConnection, session)
    if kind == "connection":
        _check_driver(session)
        if not session.in_transaction():
            session.begin()
        return cast(SyncConnection, session.connection.driver_connection)
    if kind == "session":
        return sync_connection(session.connection())
    return sync_connection(session())  # a scoped_session


async def async_connection(session: Any) -> AsyncConnection:
    """The psycopg ``AsyncConnection`` of an async session (see :func:`sync_connection`)."""
    kind = _checked(session, "async", "async session", sources=False)
    if kind == "async_psycopg":
        return cast(AsyncConnection, session)
    if kind == "async_connection":
        _check_driver(session)
        if not session.in_transaction():
            await session.begin()
        fairy = await session.get_raw_connection()
        return cast(AsyncConnection, fairy.driver_connection)
    if kind == "async_session":
        return await async_connection(await session.connection())
    return await async_connection(session())  # an async_scoped_session


# -- opening connections from sources ---------------------------------------------------


@contextmanager
def _open_sync(source: Any) -> Iterator[SyncConnection]:
    """A connection of akadze's own from a source, in autocommit mode or in a
    SQLAlchemy transaction that is committed on a clean exit."""
    kind = _checked(source, "sync", "source", sources=True)
    if kind == "engine":
        _check_driver(source)
        with source.begin() as sa_connection:
            yield sync_connection(sa_connection)
    elif kind == "pool":
        with source.connection() as conn:
            yield conn
    else:
        with database.connect(_url_of(source), autocommit=True) as conn:
            yield conn


@asynccontextmanager
async def _open_async(source: Any) -> AsyncIterator[AsyncConnection]:
    kind = _checked(source, "async", "source", sources=True)
    if kind == "async_engine":
        _check_driver(source)
        async with source.begin() as sa_connection:
            yield await async_connection(sa_connection)
    elif kind == "async_pool":
        async with source.connection() as conn:
            yield conn
    else:
        async with await database.connect_async(_url_of(source), autocommit=True) as conn:
            yield conn


# -- writing ----------------------------------------------------------------------------


@contextmanager
def writing_sync(session: SyncSession) -> Iterator[SyncConnection]:
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
async def writing(session: Session) -> AsyncIterator[AsyncConnection]:
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
def reading_sync(source: SyncSession) -> Iterator[SyncConnection]:
    """A psycopg connection to read with: the session's own connection, or a connection
    opened from a source (app, URL, ``Engine``, ``ConnectionPool``) and closed (returned)
    on exit."""
    if is_source(source):
        with _open_sync(source) as conn:
            yield conn
        return
    yield sync_connection(source)


@asynccontextmanager
async def reading(source: Session) -> AsyncIterator[AsyncConnection]:
    """The async twin of :func:`reading_sync` (``AsyncEngine``, ``AsyncConnectionPool``)."""
    if is_source(source):
        async with _open_async(source) as conn:
            yield conn
        return
    yield await async_connection(source)
