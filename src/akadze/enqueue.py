"""Enqueue: jobs are inserted in the caller's transaction, one at a time or in bulk.

``task.using(session=..., **options)`` returns an :class:`Enqueuer`:

- ``await enqueue(**kwargs)`` / ``enqueue_sync(**kwargs)`` insert one job and return its id;
- ``await enqueue_many(items)`` / ``enqueue_many_sync(items)`` insert many with COPY and
  return their ids in item order. An item is a mapping of arguments or a :class:`Job`
  (arguments plus options of its own).

Everything is validated before the first statement (a bad option or argument raises
:class:`~akadze.errors.EnqueueError` naming it, and nothing is inserted). The pure
checks and the COPY formatting live in :mod:`akadze.jobspec`; this module does the I/O,
once for psycopg's sync API and once for its async API.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq, sql
from psycopg.types.json import Jsonb

from . import queries, sessions
from .errors import ConfigurationError, DuplicateJob, EnqueueError, UnknownTask
from .jobspec import (
    Batch,
    Job,
    Options,
    Pending,
    build_batch,
    build_options,
    build_pending,
    check_bulk,
)

if TYPE_CHECKING:
    from .tasks import Task

__all__ = ["Enqueuer", "Job"]

UNIQUE_INDEX = "jobs_active_unique_idx"

Hook = Callable[..., Any]


class Enqueuer:
    """A task with enqueue options, ready to insert jobs. Made by ``task.using(...)``.

    ``session`` is the caller's psycopg connection or SQLAlchemy connection/session
    (the job joins its transaction), or ``None`` for the app's own database in a
    transaction of its own, committed before the call returns.
    """

    def __init__(
        self,
        task: Task[Any],
        *,
        session: Any = None,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        limit_key: str | None = None,
        expires_at: datetime | None = None,
        meta: Mapping[str, Any] | None = None,
        queue: str | None = None,
    ) -> None:
        self.task = task
        self.session = session
        self.options: Options = build_options(
            task,
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            unique_key=unique_key,
            limit_key=limit_key,
            expires_at=expires_at,
            meta=meta,
            queue=queue,
        )

    # -- async ------------------------------------------------------------------------

    async def enqueue(self, /, **kwargs: Any) -> int:
        """Insert one job; return its id. Raises EnqueueError (nothing inserted), or
        DuplicateJob when an active job holds the ``unique_key`` (the caller's
        transaction stays usable)."""
        pending = self._pending(kwargs)
        hooks = _hooks(self.task, sync=False)
        if sessions.is_source(self.session):
            async with sessions.writing(self._source()) as conn:
                return await _insert_one(conn, pending, hooks, guard=False)
        conn = await self._joined_async("enqueue")
        guard = pending.options.unique_key is not None or bool(hooks)
        return await _insert_one(conn, pending, hooks, guard=guard)

    async def enqueue_many(self, items: Iterable[Mapping[str, Any] | Job], /) -> list[int]:
        """Insert one job per item with COPY; return the ids in item order. Every item
        is validated first: one bad item raises EnqueueError and nothing is inserted."""
        listed = self._items(items)
        if not listed:
            return []
        hooks = _hooks(self.task, sync=False)
        if sessions.is_source(self.session):
            async with sessions.writing(self._source()) as conn:
                return await _insert_many(conn, self, listed, hooks, guard=False)
        conn = await self._joined_async("enqueue_many")
        return await _insert_many(conn, self, listed, hooks, guard=True)

    # -- sync -------------------------------------------------------------------------

    def enqueue_sync(self, /, **kwargs: Any) -> int:
        """The sync twin of :meth:`enqueue` (psycopg ``Connection``, SQLAlchemy
        ``Connection``/``Session``): for Django, Flask and scripts."""
        pending = self._pending(kwargs)
        hooks = _hooks(self.task, sync=True)
        if sessions.is_source(self.session):
            with sessions.writing_sync(self._source()) as conn:
                return _insert_one_sync(conn, pending, hooks, guard=False)
        conn = self._joined_sync("enqueue_sync")
        guard = pending.options.unique_key is not None or bool(hooks)
        return _insert_one_sync(conn, pending, hooks, guard=guard)

    def enqueue_many_sync(self, items: Iterable[Mapping[str, Any] | Job], /) -> list[int]:
        """The sync twin of :meth:`enqueue_many`."""
        listed = self._items(items)
        if not listed:
            return []
        hooks = _hooks(self.task, sync=True)
        if sessions.is_source(self.session):
            with sessions.writing_sync(self._source()) as conn:
                return _insert_many_sync(conn, self, listed, hooks, guard=False)
        conn = self._joined_sync("enqueue_many_sync")
        return _insert_many_sync(conn, self, listed, hooks, guard=True)

    # -- shared -----------------------------------------------------------------------

    def _pending(self, kwargs: dict[str, Any]) -> Pending:
        _check_registered(self.task)
        return build_pending(self.task, self.options, kwargs)

    def _items(self, items: Iterable[Mapping[str, Any] | Job]) -> list[Mapping[str, Any] | Job]:
        _check_registered(self.task)
        check_bulk(self.options, items)
        return items if isinstance(items, list) else list(items)

    def _batch(self, items: list[Mapping[str, Any] | Job]) -> Batch:
        return build_batch(self.task, self.options, items)

    def _source(self) -> Any:
        return self.task.app if self.session is None else self.session

    async def _joined_async(self, method: str) -> psycopg.AsyncConnection[Any]:
        if sessions.is_sync_session(self.session):
            raise ConfigurationError(
                f"{sessions.type_name(self.session)} is a synchronous session: call "
                f"{method}_sync(...) instead of await {method}(...)"
            )
        conn = await sessions.async_connection(self.session)
        _check_transaction(conn)
        return conn

    def _joined_sync(self, method: str) -> psycopg.Connection[Any]:
        if sessions.is_async_session(self.session):
            async_name = method.removesuffix("_sync")
            raise ConfigurationError(
                f"{sessions.type_name(self.session)} is an asynchronous session: "
                f"await {async_name}(...) instead of calling {method}(...)"
            )
        conn = sessions.sync_connection(self.session)
        _check_transaction(conn)
        return conn

    def __repr__(self) -> str:
        return f"<Enqueuer task={self.task.name!r} queue={self.options.queue!r}>"


def _check_registered(task: Task[Any]) -> None:
    if task.app.tasks.get(task.name) is not task:
        raise UnknownTask(
            f"task {task.name!r} is not registered on its app; register it with "
            "@app.task(...) or app.register(...)",
            field="task",
        )


def _check_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    status = conn.info.transaction_status
    if status == pq.TransactionStatus.INERROR:
        raise EnqueueError(
            "the session's transaction is aborted (an earlier statement failed); "
            "roll it back before enqueueing",
            field="session",
        )
    if conn.autocommit and status == pq.TransactionStatus.IDLE:
        raise EnqueueError(
            "enqueue joins the caller's transaction, but this connection is in autocommit "
            "mode with no transaction open: enqueue inside `with conn.transaction():`, "
            "or pass session=None to enqueue in a transaction of its own",
            field="session",
        )


# -- hooks ------------------------------------------------------------------------------


def _is_async_callable(hook: Hook) -> bool:
    return inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004 - an object with async __call__
    )


def _hooks(task: Task[Any], *, sync: bool) -> list[Hook]:
    hooks = list(task.app.on_enqueue_hooks)
    if sync:
        for hook in hooks:
            if _is_async_callable(hook):
                raise ConfigurationError(
                    f"on_enqueue hook {getattr(hook, '__qualname__', hook)!r} is async and "
                    "cannot run in a sync enqueue; use await enqueue(...) with an async "
                    "session, or make the hook a plain function"
                )
    return hooks


def _async_result_in_sync(hook: Hook, result: Any) -> ConfigurationError:
    if inspect.iscoroutine(result):
        result.close()  # never awaited: close it so that no warning is printed
    return ConfigurationError(
        f"on_enqueue hook {getattr(hook, '__qualname__', hook)!r} returned an awaitable "
        "in a sync enqueue; sync enqueues run plain hooks only"
    )


# -- one job ----------------------------------------------------------------------------


def _params(pending: Pending) -> dict[str, Any]:
    options = pending.options
    return {
        "queue": options.queue,
        "task": pending.task,
        "args": pending.args_json,
        "priority": options.priority,
        "run_at": options.run_at,
        "delay": options.delay,
        "max_attempts": options.max_attempts,
        "limit_key": options.limit_key,
        "unique_key": options.unique_key,
        "expires_at": options.expires_at,
        "meta": options.meta_json,
    }


def _duplicate(exc: psycopg.errors.UniqueViolation, pending: Pending) -> DuplicateJob | None:
    if exc.diag.constraint_name == UNIQUE_INDEX and pending.options.unique_key is not None:
        return DuplicateJob(pending.options.unique_key)
    return None


async def _insert_one(
    conn: psycopg.AsyncConnection[Any], pending: Pending, hooks: list[Hook], *, guard: bool
) -> int:
    if guard:
        await conn.execute(queries.get("savepoint_enqueue"))
    try:
        cur = await conn.execute(queries.get("enqueue_job"), _params(pending))
        row = await cur.fetchone()
        assert row is not None
        job_id, run_at = row
        if hooks:
            job = pending.enqueued(job_id, run_at)
            for hook in hooks:
                result = hook(conn, job)
                if inspect.isawaitable(result):
                    await result
    except psycopg.errors.UniqueViolation as exc:
        if guard:
            await conn.execute(queries.get("rollback_to_savepoint_enqueue"))
        raise _duplicate(exc, pending) or exc from None
    except BaseException:
        if guard:
            await _rollback_quietly(conn)
        raise
    if guard:
        await conn.execute(queries.get("release_savepoint_enqueue"))
    return int(job_id)


def _insert_one_sync(
    conn: psycopg.Connection[Any], pending: Pending, hooks: list[Hook], *, guard: bool
) -> int:
    if guard:
        conn.execute(queries.get("savepoint_enqueue"))
    try:
        row = conn.execute(queries.get("enqueue_job"), _params(pending)).fetchone()
        assert row is not None
        job_id, run_at = row
        if hooks:
            job = pending.enqueued(job_id, run_at)
            for hook in hooks:
                result = hook(conn, job)
                if inspect.isawaitable(result):
                    raise _async_result_in_sync(hook, result)
    except psycopg.errors.UniqueViolation as exc:
        if guard:
            conn.execute(queries.get("rollback_to_savepoint_enqueue"))
        raise _duplicate(exc, pending) or exc from None
    except BaseException:
        if guard:
            _rollback_quietly_sync(conn)
        raise
    if guard:
        conn.execute(queries.get("release_savepoint_enqueue"))
    return int(job_id)


async def _rollback_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    # The original error is what the caller needs to see; a failure to roll back
    # (a broken connection) leaves the transaction to the caller's own rollback.
    with contextlib.suppress(psycopg.Error):
        await conn.execute(queries.get("rollback_to_savepoint_enqueue"))


def _rollback_quietly_sync(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.execute(queries.get("rollback_to_savepoint_enqueue"))


# -- many jobs ----------------------------------------------------------------------------


def _copy_statement(batch: Batch) -> sql.Composed:
    return queries.get("copy_jobs").format(
        columns=sql.SQL(", ").join(sql.Identifier(column) for column in batch.columns)
    )


def _ids(first: int, listed: Sequence[int] | None, count: int) -> list[int]:
    ids = list(range(first, first + count)) if listed is None else list(listed)
    if len(ids) != count:  # pragma: no cover - the query returns exactly count ids
        raise RuntimeError(f"reserved {len(ids)} job ids for {count} jobs")
    return ids


# The savepoint and the id reservation are sent (pipelined) before the items are
# validated, so that the server draws the ids while Python checks the items; a refused
# batch rolls back to the savepoint and only leaves a gap in the id sequence. Each
# COPY chunk is serialized and formatted while the server ingests the previous one.


async def _insert_many(
    conn: psycopg.AsyncConnection[Any],
    enqueuer: Enqueuer,
    items: list[Mapping[str, Any] | Job],
    hooks: list[Hook],
    *,
    guard: bool,
) -> list[int]:
    sent = False
    try:
        async with conn.pipeline():
            if guard:
                await conn.execute(queries.get("savepoint_enqueue"))
            sent = True
            cur = await conn.execute(queries.get("reserve_job_ids"), {"count": len(items)})
            batch = enqueuer._batch(items)
            keys = batch.keys()
            if keys:
                limited = await conn.execute(queries.get("limited_keys"), {"keys": Jsonb(keys)})
            row = await cur.fetchone()
            if keys:
                batch.limited_keys = frozenset(r[0] for r in await limited.fetchall())
        assert row is not None
        now, first, listed = row
        ids = _ids(first, listed, batch.size)
        async with conn.cursor().copy(_copy_statement(batch)) as copy:
            for chunk in batch.copy_chunks(ids, now):
                await copy.write(chunk)
        if hooks:
            for job in batch.enqueued(ids, now):
                for hook in hooks:
                    result = hook(conn, job)
                    if inspect.isawaitable(result):
                        await result
    except BaseException:
        if guard and sent:
            await _rollback_quietly(conn)
        raise
    if guard:
        await conn.execute(queries.get("release_savepoint_enqueue"))
    return ids


def _insert_many_sync(
    conn: psycopg.Connection[Any],
    enqueuer: Enqueuer,
    items: list[Mapping[str, Any] | Job],
    hooks: list[Hook],
    *,
    guard: bool,
) -> list[int]:
    sent = False
    try:
        with conn.pipeline():
            if guard:
                conn.execute(queries.get("savepoint_enqueue"))
            sent = True
            cur = conn.execute(queries.get("reserve_job_ids"), {"count": len(items)})
            batch = enqueuer._batch(items)
            keys = batch.keys()
            if keys:
                limited = conn.execute(queries.get("limited_keys"), {"keys": Jsonb(keys)})
            row = cur.fetchone()
            if keys:
                batch.limited_keys = frozenset(r[0] for r in limited.fetchall())
        assert row is not None
        now, first, listed = row
        ids = _ids(first, listed, batch.size)
        with conn.cursor().copy(_copy_statement(batch)) as copy:
            for chunk in batch.copy_chunks(ids, now):
                copy.write(chunk)
        if hooks:
            for job in batch.enqueued(ids, now):
                for hook in hooks:
                    result = hook(conn, job)
                    if inspect.isawaitable(result):
                        raise _async_result_in_sync(hook, result)
    except BaseException:
        if guard and sent:
            _rollback_quietly_sync(conn)
        raise
    if guard:
        conn.execute(queries.get("release_savepoint_enqueue"))
    return ids
