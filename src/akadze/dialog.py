"""Dialogs: an operation on the database written once, run on a sync or an async connection.

A *dialog* is a generator that yields steps and receives their results:

- :class:`Execute`: run a statement; the dialog receives its rows, its first row, its
  row count, nothing, or (in a pipeline) the cursor whose rows it asks for later with
  :class:`Fetch`, after doing Python work while the server runs the statement;
- :class:`Block`: run a nested dialog in a transaction block (a savepoint inside a
  transaction) or in a pipeline;
- :class:`CopyIn`: feed a ``COPY ... FROM STDIN`` from an iterator of text chunks;
- :class:`CallHooks`: call hooks with the connection and arguments;
- :class:`Usable`: whether the connection is still open and not broken;
- :class:`Idle` and :class:`Wait`: whether the connection can LISTEN, and waiting for
  notifications or time (``wait_for``).

Two small drivers carry the steps out, :func:`run_sync` on a psycopg ``Connection`` and
:func:`run_async` on an ``AsyncConnection``. An exception a step raises is thrown into
the dialog at its ``yield``, so that a dialog handles it with a plain ``try``/``except``
around the step (a unique violation turned into DuplicateJob, a failing fire logged and
skipped). The operations with a ``_sync`` twin are written this way: the async function
and its twin are both thin calls of one dialog, so they cannot drift apart. (The claim
is written the same way, in a step language of its own: akadze.claim.)

:func:`write`/:func:`write_sync` and :func:`read`/:func:`read_sync` run a dialog on a
session or source (akadze.sessions). The dialog runs up to its first step *before* a
connection is opened or joined: the checks of its arguments come first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar, cast

import psycopg
from psycopg import sql

from . import hooks as hook_calls
from . import sessions
from .errors import MigrationError
from .hooks import Hook

T = TypeVar("T")
Row: TypeAlias = tuple[Any, ...]
Query: TypeAlias = "sql.SQL | sql.Composed | str"
Params: TypeAlias = "Mapping[str, Any] | Sequence[Any] | None"
Reply = Literal["all", "one", "rowcount", "none", "cursor"]

# -- steps ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Execute:
    """Run ``query``; the dialog receives what ``reply`` asks for: ``"all"`` rows (a
    list of tuples), the first row (``"one"``, None without one), the ``"rowcount"``,
    nothing (``"none"``: in a pipeline the statement then travels with the next round
    trip), or the ``"cursor"`` to :class:`Fetch` the rows from later."""

    query: Query
    params: Params = None
    reply: Reply = "all"
    # A psycopg row factory for the rows (psycopg.rows); None: tuples.
    row_factory: Any = None


@dataclass(frozen=True, slots=True)
class Fetch:
    """The rows of a statement sent before with ``reply="cursor"``."""

    cursor: Any
    reply: Literal["all", "one"] = "all"


@dataclass(frozen=True, slots=True)
class Block:
    """Run ``body`` in a transaction block (a savepoint when a transaction is open; an
    exception rolls it back) or in a pipeline; the dialog receives what ``body``
    returns."""

    body: Dialog[Any]
    kind: Literal["transaction", "pipeline"]


@dataclass(frozen=True, slots=True)
class CopyIn:
    """``COPY ... FROM STDIN``, fed chunk by chunk (each chunk is made while the server
    ingests the previous one)."""

    statement: Query
    chunks: Iterable[str]


@dataclass(frozen=True, slots=True)
class CallHooks:
    """Call each hook as ``hook(conn, *args)``. The async driver awaits what a hook
    returns; the sync driver refuses async hooks (akadze.hooks): ``kind`` and ``where``
    name them in the error."""

    hooks: tuple[Hook, ...]
    args: tuple[Any, ...]
    kind: str
    where: str


@dataclass(frozen=True, slots=True)
class Usable:
    """Whether the connection is open and not broken (worth a clean-up statement)."""


@dataclass(frozen=True, slots=True)
class Idle:
    """Whether the connection is in autocommit mode outside any transaction: a
    LISTEN there takes effect at once, and notifications reach it."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait up to ``timeout`` seconds: for notifications (``listening``; the dialog
    receives their payloads, an empty list when none came), else simply the time (the
    dialog receives an empty list)."""

    timeout: float
    listening: bool


Step: TypeAlias = "Execute | Fetch | Block | CopyIn | CallHooks | Usable | Idle | Wait"
Dialog: TypeAlias = Generator[Step, Any, T]

# -- steps as sub-dialogs (``x = yield from rows(...)``), typed -------------------------


def rows(query: Query, params: Params = None, *, row_factory: Any = None) -> Dialog[list[Any]]:
    """All rows of ``query`` (tuples, or what ``row_factory`` makes)."""
    return cast(list[Any], (yield Execute(query, params, "all", row_factory)))


def one(query: Query, params: Params = None, *, row_factory: Any = None) -> Dialog[Any]:
    """The first row of ``query``, None without one."""
    return (yield Execute(query, params, "one", row_factory))


def rowcount(query: Query, params: Params = None) -> Dialog[int]:
    return cast(int, (yield Execute(query, params, "rowcount")))


def execute(query: Query, params: Params = None) -> Dialog[None]:
    yield Execute(query, params, "none")


def send(query: Query, params: Params = None) -> Dialog[Any]:
    """Send ``query`` in a pipeline without waiting; returns what :func:`fetch_all` and
    :func:`fetch_one` take."""
    return (yield Execute(query, params, "cursor"))


def fetch_all(sent: Any) -> Dialog[list[Row]]:
    return cast(list[Row], (yield Fetch(sent, "all")))


def fetch_one(sent: Any) -> Dialog[Row | None]:
    return cast("Row | None", (yield Fetch(sent, "one")))


def transaction(body: Dialog[T]) -> Dialog[T]:
    return cast(T, (yield Block(body, "transaction")))


def pipeline(body: Dialog[T]) -> Dialog[T]:
    return cast(T, (yield Block(body, "pipeline")))


def copy_in(statement: Query, chunks: Iterable[str]) -> Dialog[None]:
    yield CopyIn(statement, chunks)


def call_hooks(hooks: Sequence[Hook], *args: Any, kind: str, where: str) -> Dialog[None]:
    if hooks:
        yield CallHooks(tuple(hooks), args, kind, where)


def idle() -> Dialog[bool]:
    return cast(bool, (yield Idle()))


def wait(timeout: float, *, listening: bool) -> Dialog[list[str]]:
    return cast(list[str], (yield Wait(timeout, listening)))


def usable() -> Dialog[bool]:
    return cast(bool, (yield Usable()))


# -- a missing schema ---------------------------------------------------------------------

#: What akadze says wherever a statement finds no akadze schema (or an older one).
NO_SCHEMA = "the database has no akadze schema (or an older one): run akadze migrate"

# The errors of a statement that names akadze objects the database does not have.
_NO_SCHEMA_ERRORS = (
    psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedObject, psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedColumn,
)


def schema_missing(error: BaseException) -> MigrationError | None:
    """The MigrationError to raise instead of ``error`` when an akadze statement failed
    because the schema is missing or older than this code (None otherwise). Its message
    names what was missing, its cause is ``error``."""
    if not isinstance(error, _NO_SCHEMA_ERRORS):
        return None
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    missing = MigrationError(NO_SCHEMA.replace("):", f": {detail}):", 1))
    missing.__cause__ = error
    return missing


def _outcome(step: Step, error: BaseException) -> BaseException:
    """What the dialog receives for a step that raised: akadze's own statements that
    meet no schema become a MigrationError; hooks are the caller's code, their errors
    pass as they are."""
    if isinstance(step, CallHooks):
        return error
    return schema_missing(error) or error


# -- drivers ------------------------------------------------------------------------------


def _idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _advance(dialog: Dialog[T], reply: Any = None,
             error: BaseException | None = None) -> tuple[bool, Any]:
    """(True, result) when the dialog has ended, else (False, its next step)."""
    try:
        return False, dialog.send(reply) if error is None else dialog.throw(error)
    except StopIteration as done:
        return True, done.value


def run_sync(conn: psycopg.Connection[Any], dialog: Dialog[T]) -> T:
    """Run ``dialog`` on a sync connection; return what it returns."""
    finished, value = _advance(dialog)
    return cast(T, value) if finished else _continue_sync(conn, dialog, value)


def _continue_sync(conn: psycopg.Connection[Any], dialog: Dialog[T], step: Step) -> T:
    while True:
        try:
            reply = _step_sync(conn, step)
        except BaseException as exc:  # the dialog's to handle, or to let through
            finished, value = _advance(dialog, error=_outcome(step, exc))
        else:
            finished, value = _advance(dialog, reply)
        if finished:
            return cast(T, value)
        step = value


def _step_sync(conn: psycopg.Connection[Any], step: Step) -> Any:
    if isinstance(step, Execute):
        if step.row_factory is None:
            cur = conn.execute(step.query, step.params)
        else:
            cur = conn.cursor(row_factory=step.row_factory).execute(step.query, step.params)
        if step.reply == "all":
            return cur.fetchall()
        if step.reply == "one":
            return cur.fetchone()
        if step.reply == "rowcount":
            return cur.rowcount
        return cur if step.reply == "cursor" else None
    if isinstance(step, Fetch):
        return step.cursor.fetchall() if step.reply == "all" else step.cursor.fetchone()
    if isinstance(step, Block):
        if step.kind == "transaction":
            with conn.transaction():
                return run_sync(conn, step.body)
        with conn.pipeline():
            return run_sync(conn, step.body)
    if isinstance(step, CopyIn):
        with conn.cursor().copy(step.statement) as copy:
            for chunk in step.chunks:
                copy.write(chunk)
        return None
    if isinstance(step, CallHooks):
        hook_calls.call_sync(step.hooks, (conn, *step.args), step.kind, step.where)
        return None
    if isinstance(step, Idle):
        return _idle(conn)
    if isinstance(step, Wait):
        if not step.listening:
            time.sleep(step.timeout)
            return []
        return [n.payload for n in conn.notifies(timeout=step.timeout, stop_after=1)]
    return not conn.closed and not conn.broken  # Usable


async def run_async(conn: psycopg.AsyncConnection[Any], dialog: Dialog[T]) -> T:
    """Run ``dialog`` on an async connection; return what it returns."""
    finished, value = _advance(dialog)
    return cast(T, value) if finished else await _continue_async(conn, dialog, value)


async def _continue_async(conn: psycopg.AsyncConnection[Any], dialog: Dialog[T],
                          step: Step) -> T:
    while True:
        try:
            reply = await _step_async(conn, step)
        except BaseException as exc:  # as _continue_sync
            finished, value = _advance(dialog, error=_outcome(step, exc))
        else:
            finished, value = _advance(dialog, reply)
        if finished:
            return cast(T, value)
        step = value


async def _step_async(conn: psycopg.AsyncConnection[Any], step: Step) -> Any:
    if isinstance(step, Execute):
        if step.row_factory is None:
            cur = await conn.execute(step.query, step.params)
        else:
            cur = await conn.cursor(row_factory=step.row_factory).execute(
                step.query, step.params)
        if step.reply == "all":
            return await cur.fetchall()
        if step.reply == "one":
            return await cur.fetchone()
        if step.reply == "rowcount":
            return cur.rowcount
        return cur if step.reply == "cursor" else None
    if isinstance(step, Fetch):
        if step.reply == "all":
            return await step.cursor.fetchall()
        return await step.cursor.fetchone()
    if isinstance(step, Block):
        if step.kind == "transaction":
            async with conn.transaction():
                return await run_async(conn, step.body)
        async with conn.pipeline():
            return await run_async(conn, step.body)
    if isinstance(step, CopyIn):
        async with conn.cursor().copy(step.statement) as copy:
            for chunk in step.chunks:
                await copy.write(chunk)
        return None
    if isinstance(step, CallHooks):
        await hook_calls.call_async(step.hooks, (conn, *step.args))
        return None
    if isinstance(step, Idle):
        return _idle(conn)
    if isinstance(step, Wait):
        if not step.listening:
            await asyncio.sleep(step.timeout)
            return []
        return [n.payload async for n in conn.notifies(timeout=step.timeout, stop_after=1)]
    return not conn.closed and not conn.broken  # Usable


# -- on sessions --------------------------------------------------------------------------


def _on_sync(open_: Callable[[Any], AbstractContextManager[psycopg.Connection[Any]]],
             session: Any, dialog: Dialog[T]) -> T:
    finished, step = _advance(dialog)  # the dialog's checks, before any connection
    if finished:
        return cast(T, step)
    with open_(session) as conn:
        return _continue_sync(conn, dialog, step)


async def _on_async(
    open_: Callable[[Any], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]],
    session: Any, dialog: Dialog[T],
) -> T:
    finished, step = _advance(dialog)
    if finished:
        return cast(T, step)
    async with open_(session) as conn:
        return await _continue_async(conn, dialog, step)


def write_sync(session: sessions.SyncSession, dialog: Dialog[T]) -> T:
    """Run ``dialog`` to write: in the session's transaction, or in a connection and
    transaction of its own for a source (see :func:`akadze.sessions.writing_sync`)."""
    return _on_sync(sessions.writing_sync, session, dialog)


async def write(session: sessions.Session, dialog: Dialog[T]) -> T:
    """The async twin of :func:`write_sync`."""
    return await _on_async(sessions.writing, session, dialog)


def read_sync(source: sessions.SyncSession, dialog: Dialog[T]) -> T:
    """Run ``dialog`` to read: on the session's connection, or on one opened from a
    source (see :func:`akadze.sessions.reading_sync`)."""
    return _on_sync(sessions.reading_sync, source, dialog)


async def read(source: sessions.Session, dialog: Dialog[T]) -> T:
    """The async twin of :func:`read_sync`."""
    return await _on_async(sessions.reading, source, dialog)
