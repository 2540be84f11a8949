"""Enqueue: jobs are inserted in the caller's transaction, one at a time or in bulk.

``task.using(session=..., **options)`` returns an :class:`Enqueuer`:

- ``await enqueue(**kwargs)`` / ``enqueue_sync(**kwargs)`` insert one job and return its id;
- ``await enqueue_many(items)`` / ``enqueue_many_sync(items)`` insert many with COPY and
  return their ids in item order. An item is a mapping of arguments or a :class:`Job`
  (arguments plus options of its own).

``app.enqueue_many(items, session=...)`` (:func:`enqueue_graph` and its ``_sync`` twin)
inserts jobs of several tasks in one call, each item a :class:`Job` naming its task
(``task.job(args, ...)``): a fan-out of one task with a fan-in of another is one COPY
in one transaction.

Everything is validated before the first statement (a bad option or argument raises
:class:`~akadze.errors.EnqueueError` naming it, and nothing is inserted). The pure
checks and the COPY formatting live in :mod:`akadze.jobspec` (arguments in
:mod:`akadze.arguments`); this module does the I/O, each insert written once as a dialog
(:mod:`akadze.dialog`) that the async methods and their ``_sync`` twins run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg.types.json import Jsonb

from . import dialog, hooks, queries, sessions, uniqueness, workflows
from .batches import Batch, build_batch, build_graph_batch, check_bulk
from .clock import Clock
from .dialog import Dialog
from .errors import ConfigurationError, DuplicateJob, EnqueueError, UnknownTask
from .hooks import Hook
from .jobspec import Job, Options, Pending, TaskSpec, build_pending
from .sessions import Session, SyncSession

__all__ = ["Enqueuer", "Job", "enqueue_graph", "enqueue_graph_sync"]

T = TypeVar("T")


class EnqueueApp(Protocol):
    """The app as enqueueing sees it (akadze.Akadze is one)."""

    @property
    def database_url(self) -> str: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def tasks(self) -> Mapping[str, object]: ...

    @property
    def on_enqueue_hooks(self) -> Sequence[Hook]: ...

    @property
    def max_args_bytes(self) -> int: ...


class EnqueueTask(TaskSpec, Protocol):
    """A task as enqueueing sees it (akadze.Task is one)."""

    @property
    def app(self) -> EnqueueApp: ...


class Enqueuer:
    """A task with checked enqueue options, ready to insert jobs. Made by
    ``task.using(...)``.

    ``session`` is the caller's psycopg connection or SQLAlchemy connection/session
    (the job joins its transaction), or ``None`` for the app's own database in a
    transaction of its own, committed before the call returns.
    """

    def __init__(self, task: EnqueueTask, *, session: Session | SyncSession = None,
                 options: Options) -> None:
        self.task = task
        self.session = session
        self.options = options

    # -- async, and the sync twins: thin calls of the dialogs below ---------------------

    async def enqueue(self, /, **kwargs: Any) -> int:
        """Insert one job; return its id. Raises EnqueueError (nothing inserted), or
        DuplicateJob when another job holds the ``unique_key`` and ``on_duplicate`` is
        "raise" (the caller's transaction stays usable); with "ignore" or "replace" the
        id returned is the holder's (akadze.uniqueness)."""
        pending = self._pending(kwargs)
        return await self._run("enqueue", lambda joined: self._one(pending, joined))

    def enqueue_sync(self, /, **kwargs: Any) -> int:
        """The sync twin of :meth:`enqueue` (psycopg ``Connection``, SQLAlchemy
        ``Connection``/``Session``): for Django, Flask and scripts."""
        pending = self._pending(kwargs)
        hooks.check_plain(self.task.app.on_enqueue_hooks, "on_enqueue", "enqueue_sync")
        return self._run_sync("enqueue_sync", lambda joined: self._one(pending, joined))

    async def enqueue_many(self, items: Iterable[Mapping[str, Any] | Job], /) -> list[int]:
        """Insert one job per item with COPY; return the ids in item order. Every item
        is validated first: one bad item raises EnqueueError and nothing is inserted.
        An item whose ``unique_key`` is held is answered by the holder's id (or the
        whole call refused with DuplicateJob, for "raise")."""
        listed = self._items(items)
        if not listed:
            return []
        return await self._run("enqueue_many", lambda joined: self._many(listed, joined))

    def enqueue_many_sync(self, items: Iterable[Mapping[str, Any] | Job], /) -> list[int]:
        """The sync twin of :meth:`enqueue_many`."""
        listed = self._items(items)
        if not listed:
            return []
        hooks.check_plain(self.task.app.on_enqueue_hooks, "on_enqueue", "enqueue_many_sync")
        return self._run_sync("enqueue_many_sync", lambda joined: self._many(listed, joined))

    # -- shared -------------------------------------------------------------------------

    def _pending(self, kwargs: dict[str, Any]) -> Pending:
        _check_registered(self.task)
        workflows.check_single(self.options)
        return build_pending(self.task, self.options, kwargs)

    def _items(self, items: Iterable[Mapping[str, Any] | Job]) -> list[Mapping[str, Any] | Job]:
        _check_registered(self.task)
        check_bulk(items)
        return items if isinstance(items, list) else list(items)

    def _one(self, pending: Pending, joined: bool) -> Dialog[int]:
        # A savepoint only where a failure must leave the caller's transaction usable.
        hooks = list(self.task.app.on_enqueue_hooks)
        guard = joined and (pending.options.unique_key is not None or bool(hooks))
        if pending.options.after:
            guard = joined
        return insert_one(pending, hooks, guard=guard)

    def _many(self, items: list[Mapping[str, Any] | Job], joined: bool) -> Dialog[list[int]]:
        return insert_many(lambda: build_batch(self.task, self.options, items), len(items),
                           list(self.task.app.on_enqueue_hooks), guard=joined)

    async def _run(self, method: str, make: Callable[[bool], Dialog[T]]) -> T:
        return await _run(self.task.app, self.session, method, make)

    def _run_sync(self, method: str, make: Callable[[bool], Dialog[T]]) -> T:
        return _run_sync(self.task.app, self.session, method, make)

    def __repr__(self) -> str:
        return f"<Enqueuer task={self.task.name!r} queue={self.options.queue!r}>"


async def _run(app: EnqueueApp, session: Any, method: str,
               make: Callable[[bool], Dialog[T]]) -> T:
    """Run the dialog ``make(joined)`` on the session (of either flavour: checked here):
    joined to its transaction, or in a connection and transaction of its own for a
    source (``None``: the app's)."""
    if sessions.is_source(session):
        return await dialog.write(app.database_url if session is None else session,
                                  make(False))
    if sessions.is_sync_session(session):
        raise ConfigurationError(
            f"{sessions.type_name(session)} is a synchronous session: call "
            f"{method}_sync(...) instead of await {method}(...)"
        )
    conn = await sessions.async_connection(session)
    _check_transaction(conn)
    return await dialog.run_async(conn, make(True))


def _run_sync(app: EnqueueApp, session: Any, method: str,
              make: Callable[[bool], Dialog[T]]) -> T:
    """The sync twin of :func:`_run`."""
    if sessions.is_source(session):
        return dialog.write_sync(app.database_url if session is None else session,
                                 make(False))
    if sessions.is_async_session(session):
        raise ConfigurationError(
            f"{sessions.type_name(session)} is an asynchronous session: "
            f"await {method.removesuffix('_sync')}(...) instead of calling {method}(...)"
        )
    conn = sessions.sync_connection(session)
    _check_transaction(conn)
    return dialog.run_sync(conn, make(True))


# -- a graph of several tasks: app.enqueue_many ---------------------------------------------


def _graph_items(app: EnqueueApp, items: Iterable[Job]) -> tuple[list[Job], list[Any]]:
    """The items of ``app.enqueue_many`` and the task of each (registered on ``app``)."""
    check_bulk(items)
    listed = items if isinstance(items, list) else list(items)
    tasks: list[Any] = []
    for index, item in enumerate(listed):
        if not isinstance(item, Job):
            raise EnqueueError(
                f"item {index}: app.enqueue_many takes akadze.Job items that name their "
                f"task (task.job(args, ...)), got {type(item).__name__}", field="items")
        named = item.task
        if named is None:
            raise EnqueueError(
                f"item {index}: the Job names no task: make it with task.job(args, ...) or "
                "Job(args, task=...)", field="task")
        task = app.tasks.get(named if isinstance(named, str) else named.name)
        if task is None or not (isinstance(named, str) or task is named):
            shown = named if isinstance(named, str) else named.name
            raise UnknownTask(f"item {index}: task {shown!r} is not registered on this app",
                              field="task")
        tasks.append(task)
    return listed, tasks


def _graph_dialog(app: EnqueueApp, listed: list[Job], tasks: list[Any], joined: bool
                  ) -> Dialog[list[int]]:
    return insert_many(lambda: build_graph_batch(tasks, listed), len(listed),
                       list(app.on_enqueue_hooks), guard=joined)


async def enqueue_graph(app: EnqueueApp, items: Iterable[Job], /, *,
                        session: Session = None) -> list[int]:
    """Insert one job per item, each a :class:`Job` of its own task, in one COPY and
    one transaction (the session's, or one of its own); return the ids in item order.
    ``after`` may name other items, of any task: a whole graph is one call. Refused
    (EnqueueError, nothing inserted) as ``enqueue_many`` refuses."""
    listed, tasks = _graph_items(app, items)
    if not listed:
        return []
    return await _run(app, session, "enqueue_many",
                      lambda joined: _graph_dialog(app, listed, tasks, joined))


def enqueue_graph_sync(app: EnqueueApp, items: Iterable[Job], /, *,
                       session: SyncSession = None) -> list[int]:
    """The sync twin of :func:`enqueue_graph`."""
    listed, tasks = _graph_items(app, items)
    if not listed:
        return []
    hooks.check_plain(app.on_enqueue_hooks, "on_enqueue", "enqueue_many_sync")
    return _run_sync(app, session, "enqueue_many_sync",
                     lambda joined: _graph_dialog(app, listed, tasks, joined))


def _check_registered(task: EnqueueTask) -> None:
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
        "state": "queued",
    }


# -- uniqueness over time (akadze.uniqueness decides, these dialogs read and write) ----------


def _claim(options: Options) -> uniqueness.Claim | None:
    if options.unique_key is None:
        return None
    return uniqueness.Claim(options.unique_key, options.on_duplicate, options.unique_for,
                            options.keep_run_at)


def lock_keys(keys: list[str]) -> Dialog[None]:
    """Lock the sorted ``keys`` until the transaction ends; refuse a transaction whose
    snapshot would hide a concurrent enqueue of them."""
    row = yield from dialog.one(queries.get("unique_lock"), {"keys": keys})
    assert row is not None
    if row[0] != "read committed":
        raise EnqueueError(
            f"unique_key needs a READ COMMITTED transaction (this one is {row[0]}): a "
            "stricter snapshot cannot see a duplicate enqueued concurrently",
            field="unique_key",
        )


def read_holders(keys: list[str], claims: list[uniqueness.Claim | None]
                 ) -> Dialog[tuple[dict[str, list[uniqueness.Holder]], Any]]:
    """The jobs holding ``keys`` and the database time (None when none holds any)."""
    periods = [c.period.total_seconds() for c in claims if c is not None and c.period]
    found = yield from dialog.rows(queries.get("unique_holders"),
                                   {"keys": keys, "period": max(periods, default=None)})
    holders: dict[str, list[uniqueness.Holder]] = {}
    for key, job_id, state, finished_at, _ in found:
        holders.setdefault(key, []).append(uniqueness.Holder(int(job_id), state, finished_at))
    return holders, found[0][4] if found else None


def refused(plan: uniqueness.Plan) -> DuplicateJob | None:
    if plan.duplicate is None:
        return None
    _, key, holder = plan.duplicate
    return DuplicateJob(key, None if holder < 0 else holder)


def replace_holders(updates: dict[int, tuple[Options, str]]) -> Dialog[set[int]]:
    """Give the holders ``updates`` (job id -> the options and argument text of the
    item replacing it) their new arguments; return the ids replaced."""
    if not updates:
        return set()
    ids = list(updates)
    params = {
        "ids": ids,
        "args": [updates[i][1] for i in ids],
        "keep": [updates[i][0].keep_run_at for i in ids],
        "run_ats": [updates[i][0].run_at for i in ids],
        "delays": [updates[i][0].delay.total_seconds() for i in ids],
    }
    rows = yield from dialog.rows(queries.get("unique_replace"), params)
    return {int(row[0]) for row in rows}


def _decide_one(pending: Pending) -> Dialog[int | None]:
    """The id of the job that answers ``pending`` when another holds its key (after a
    replace or for "ignore"), else None: it is to be inserted."""
    claim = _claim(pending.options)
    assert claim is not None
    yield from lock_keys([claim.key])
    holders, now = yield from read_holders([claim.key], [claim])
    while holders:
        plan = uniqueness.plan([claim], holders, now)
        duplicate = refused(plan)
        if duplicate is not None:
            raise duplicate
        kind, answer = plan.answers[0]
        if kind == "row":
            return None
        if not plan.updates:
            return answer
        if pending.options.after:  # a replace keeps the holder's parents
            yield from workflows.check_replaced(
                {answer: {p for p in pending.options.after if isinstance(p, int)}})
        replaced = yield from replace_holders({answer: (pending.options, pending.args_json)})
        if answer in replaced:
            return answer
        holders = uniqueness.started(holders, {answer})  # claimed meanwhile
    return None


def _rollback_quietly() -> Dialog[None]:
    # The original error is what the caller needs to see; a failure to roll back
    # (a broken connection) leaves the transaction to the caller's own rollback.
    with contextlib.suppress(psycopg.Error):
        yield from dialog.execute(queries.get("rollback_to_savepoint_enqueue"))


def insert_one(pending: Pending, on_enqueue: Sequence[Hook], *, guard: bool) -> Dialog[int]:
    """Insert one checked job and run the on_enqueue hooks; return its id. ``guard``:
    inside a savepoint, so that a DuplicateJob or a failing hook leaves the caller's
    transaction usable (also the fires of schedules, akadze.schedules)."""
    if guard:
        yield from dialog.execute(queries.get("savepoint_enqueue"))
    try:
        existing = None
        if pending.options.unique_key is not None:
            existing = yield from _decide_one(pending)
        if existing is not None:
            job_id = existing
        else:
            params = _params(pending)
            if pending.options.after:
                begun, states = yield from workflows.plan_one(pending.options)
                params["state"] = begun.state
            row = yield from dialog.one(queries.get("enqueue_job"), params)
            assert row is not None
            job_id, run_at = row
            if pending.options.after:
                yield from workflows.write_one(job_id, pending.options, begun, states)
            yield from dialog.call_hooks(on_enqueue, pending.enqueued(job_id, run_at),
                                         kind="on_enqueue", where="a sync enqueue")
    except GeneratorExit:
        raise
    except BaseException:
        if guard:
            yield from _rollback_quietly()
        raise
    if guard:
        yield from dialog.execute(queries.get("release_savepoint_enqueue"))
    return int(job_id)


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


def insert_many(
    make_batch: Callable[[], Batch], count: int, on_enqueue: Sequence[Hook], *, guard: bool
) -> Dialog[list[int]]:
    """Insert ``count`` jobs with COPY; ``make_batch`` checks them (while the server
    reserves their ids). Returns the ids in item order."""
    sent = False

    def reserve() -> Dialog[tuple[Batch, Any]]:
        nonlocal sent
        if guard:
            yield from dialog.execute(queries.get("savepoint_enqueue"))
        sent = True
        reserved = yield from dialog.send(queries.get("reserve_job_ids"), {"count": count})
        batch = make_batch()
        keys = batch.keys()
        if keys:
            limited = yield from dialog.send(queries.get("limited_keys"), {"keys": Jsonb(keys)})
        row = yield from dialog.fetch_one(reserved)
        if keys:
            batch.limited_keys = frozenset(r[0] for r in (yield from dialog.fetch_all(limited)))
        return batch, row

    try:
        batch, row = yield from dialog.pipeline(reserve())
        assert row is not None
        now, first, listed = row
        ids = reserved = _ids(first, listed, batch.size)
        answers = None
        if batch.unique_keys():
            answers = yield from _unique_batch(batch, now)
            ids = [reserved[i] for i in batch.inserted]
        if batch.item_parents or batch.job_parents:
            yield from workflows.plan_batch(batch, answers)
        if ids:
            yield from dialog.copy_in(_copy_statement(batch), batch.copy_chunks(ids, now))
        if batch.edges:
            yield from workflows.write_batch(batch, {i: reserved[i] for i in batch.inserted})
        if on_enqueue:
            for job in batch.enqueued(ids, now):
                yield from dialog.call_hooks(on_enqueue, job, kind="on_enqueue",
                                             where="a sync enqueue_many")
    except GeneratorExit:
        raise
    except BaseException:
        if guard and sent:
            yield from _rollback_quietly()
        raise
    if guard:
        yield from dialog.execute(queries.get("release_savepoint_enqueue"))
    if answers is None:
        return ids
    return [reserved[j] if kind == "row" else j for kind, j in answers]


def _unique_batch(batch: Batch, now: Any) -> Dialog[list[tuple[str, int]]]:
    """Decide the items of ``batch`` that carry a unique_key (akadze.uniqueness): set the
    rows it inserts, replace the holders to replace; return each item's answer."""
    keys = batch.unique_keys()
    claims = [_claim(batch.options_of(i)) for i in range(batch.size)]
    yield from lock_keys(keys)
    holders, _ = yield from read_holders(keys, claims)
    while True:
        plan = uniqueness.plan(claims, holders, now)
        duplicate = refused(plan)
        if duplicate is not None:
            raise duplicate
        targets = list(plan.updates)
        yield from workflows.check_replaced({  # a replace keeps the holder's parents
            t: workflows.wanted_parents(batch, plan.answers, item)
            for t, (item, _) in plan.updates.items()
            if batch.item_parents.get(item) or batch.job_parents.get(item)})
        texts = batch.serialize([plan.updates[t][0] for t in targets])
        replaced = yield from replace_holders({
            t: (batch.options_of(plan.updates[t][0]), text)
            for t, text in zip(targets, texts, strict=True)})
        missed = set(targets) - replaced
        if not missed:
            break
        holders = uniqueness.started(holders, missed)  # claimed meanwhile: insert instead
    batch.rows = plan.rows
    for later, earlier in plan.keep.items():
        kept = batch.options_of(earlier)
        batch.row_options[later] = dataclasses.replace(
            batch.options_of(later), run_at=kept.run_at, delay=kept.delay)
    return plan.answers
