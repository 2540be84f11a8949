"""The claim's entry points (``claim``, ``claim_oracle``) and the drivers that run it.

What a claim must return is pinned down in ``docs/explanation/claim.md`` (after
claim-semantics). This module is the I/O shell: the decisions are made by the
pure :mod:`akadze.claim._planner`, the statements live in ``sql/queries/claim*.sql``.

Each claim is written once, as a generator of steps (:mod:`akadze.claim._steps`): the
windowed claim in :mod:`akadze.claim._windows`, the full-ranking reference in
:mod:`akadze.claim._ranking`. This module holds the public entry points and the two small
drivers, sync and async, that run the steps on a psycopg ``Connection`` or
``AsyncConnection`` inside the claim's transaction (one, or two when a take
that commits comes back short: :mod:`akadze.claim._takes`). So the sync and async entry points each
do their own I/O and share everything else, with no bridge between the two.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, overload

import psycopg
from psycopg.pq import TransactionStatus

from ..database import (
    BEGIN_READ_COMMITTED,
    COMMIT,
    roll_back_failed,
    roll_back_failed_async,
)
from ..errors import ConfigurationError
from ..jobs import ClaimedJob

if TYPE_CHECKING:
    from ..app import Akadze

from ._hints import memory
from ._ranking import oracle_steps
from ._steps import Batch, Request, Statement, Steps
from ._windows import windowed_steps

__all__ = ["claim", "claim_oracle"]

# -- drivers --------------------------------------------------------------------------


def _check_idle(status: TransactionStatus) -> None:
    if status != TransactionStatus.IDLE:
        raise ConfigurationError(
            "claim needs a connection that is not inside a transaction "
            "(an autocommit connection): it runs its own transaction"
        )


def _run_sync(conn: psycopg.Connection[Any], steps: Steps, app: Akadze | None) -> list[ClaimedJob]:
    _check_idle(conn.info.transaction_status)
    # Pipeline mode: statements are sent as they come and a round trip happens
    # only when a result is needed, so BEGIN travels with the first statement,
    # a Batch costs one round trip and COMMIT one more (none when the Batch
    # commits: its COMMIT travels with it). BEGIN and COMMIT are sent as
    # statements: psycopg's transaction() inside a pipeline nests two more
    # pipelines, whose exits cost two extra round trips per claim.
    try:
        with conn.pipeline():
            result = _steps_sync(conn, steps, app)
    except BaseException:
        roll_back_failed(conn, "claim")
        raise
    return result


def _steps_sync(conn: psycopg.Connection[Any], steps: Steps, app: Akadze | None
                ) -> list[ClaimedJob]:
    reply: Any = None
    open_ = False  # whether the claim's transaction is open
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as done:
            if open_:
                conn.execute(COMMIT, prepare=False)
            result: list[ClaimedJob] = done.value
            return result
        reply = None
        if isinstance(step, Statement):
            if not open_:
                conn.execute(BEGIN_READ_COMMITTED, prepare=False)
                open_ = True
            with conn.cursor(row_factory=step.rows) as cur:
                cur.execute(step.query, step.params, prepare=step.prepare)
                reply = (cur.fetchall()) if step.fetch else None
        elif isinstance(step, Batch):
            if not open_:
                conn.execute(BEGIN_READ_COMMITTED, prepare=False)
                open_ = True
            cursors = [conn.cursor(row_factory=st.rows) for st in step.statements]
            for cur, st in zip(cursors, step.statements, strict=True):
                cur.execute(st.query, st.params, prepare=st.prepare)
            if step.commit:
                conn.execute(COMMIT, prepare=False)
                open_ = False
            reply = [cur.fetchall() for cur in cursors]
            for cur in cursors:
                cur.close()
        elif app is not None:
            for job, old, new in step.changes:
                for hook in app.on_transition_hooks:
                    outcome = hook(conn, job, old, new)
                    if inspect.isawaitable(outcome):
                        _refuse_async_hook(hook, outcome)


def _refuse_async_hook(hook: Callable[..., Any], outcome: Awaitable[Any]) -> None:
    close = getattr(outcome, "close", None)
    if callable(close):
        close()
    raise ConfigurationError(
        f"transition hook {getattr(hook, '__name__', hook)!r} is async, but the claim runs on a "
        "sync connection; use an AsyncConnection or a plain hook"
    )


async def _run_async(
    conn: psycopg.AsyncConnection[Any], steps: Steps, app: Akadze | None
) -> list[ClaimedJob]:
    _check_idle(conn.info.transaction_status)
    # As _run_sync.
    try:
        async with conn.pipeline():
            result = await _steps_async(conn, steps, app)
    except BaseException:
        await roll_back_failed_async(conn, "claim")
        raise
    return result


async def _steps_async(
    conn: psycopg.AsyncConnection[Any], steps: Steps, app: Akadze | None
) -> list[ClaimedJob]:
    # As _steps_sync.
    reply: Any = None
    open_ = False
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as done:
            if open_:
                await conn.execute(COMMIT, prepare=False)
            result: list[ClaimedJob] = done.value
            return result
        reply = None
        if isinstance(step, Statement):
            if not open_:
                await conn.execute(BEGIN_READ_COMMITTED, prepare=False)
                open_ = True
            async with conn.cursor(row_factory=step.rows) as cur:
                await cur.execute(step.query, step.params, prepare=step.prepare)
                reply = (await cur.fetchall()) if step.fetch else None
        elif isinstance(step, Batch):
            if not open_:
                await conn.execute(BEGIN_READ_COMMITTED, prepare=False)
                open_ = True
            cursors = [conn.cursor(row_factory=st.rows) for st in step.statements]
            for cur, st in zip(cursors, step.statements, strict=True):
                await cur.execute(st.query, st.params, prepare=st.prepare)
            if step.commit:
                await conn.execute(COMMIT, prepare=False)
                open_ = False
            reply = [await cur.fetchall() for cur in cursors]
            for cur in cursors:
                await cur.close()
        elif app is not None:
            for job, old, new in step.changes:
                for hook in app.on_transition_hooks:
                    outcome = hook(conn, job, old, new)
                    if inspect.isawaitable(outcome):
                        await outcome


# -- public API -------------------------------------------------------------------------


def _request(
    queue: str, slots: int, fair: bool, worker_id: str | None,
    tasks: Collection[str] | None, now: datetime | None, durable: bool | None = None,
    not_before: datetime | None = None,
) -> Request:
    if not isinstance(queue, str) or not queue:
        raise ConfigurationError(f"queue must be a non-empty string, got {queue!r}")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
        raise ConfigurationError(f"slots must be a non-negative integer, got {slots!r}")
    if isinstance(tasks, str):
        raise ConfigurationError("tasks must be a collection of task names, not one string")
    if now is not None and now.tzinfo is None:
        raise ConfigurationError("now must be a timezone-aware datetime")
    if durable is not None and not isinstance(durable, bool):
        raise ConfigurationError(f"durable must be True, False or None, got {durable!r}")
    if not_before is not None:
        if not isinstance(not_before, datetime) or not_before.tzinfo is None:
            raise ConfigurationError(
                f"not_before must be a timezone-aware datetime, got {not_before!r}")
        if now is not None:
            raise ConfigurationError(
                "not_before waits for the server's clock; it cannot go with an injected now")
    names = sorted(set(tasks)) if tasks is not None else None
    synchronous_commit = None if durable is None else "on" if durable else "off"
    return Request(queue, slots, bool(fair), worker_id, names, now, synchronous_commit,
                   not_before)


def _dispatch(
    conn: Any, request: Request, app: Akadze | None, steps: Callable[[Request], Steps]
) -> Any:
    request = replace(request, hooks=bool(app is not None and app.on_transition_hooks))
    if isinstance(conn, psycopg.AsyncConnection):
        if request.slots == 0:
            return _nothing()
        return _run_async(conn, steps(request), app)
    if isinstance(conn, psycopg.Connection):
        if request.slots == 0:
            return []
        return _run_sync(conn, steps(request), app)
    raise ConfigurationError(
        f"claim needs a psycopg Connection or AsyncConnection, got {type(conn).__name__}"
    )


async def _nothing() -> list[ClaimedJob]:
    return []


@overload
def claim(
    conn: psycopg.AsyncConnection[Any], *, queue: str, slots: int, fair: bool = False,
    worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None, durable: bool | None = None,
    not_before: datetime | None = None,
) -> Awaitable[list[ClaimedJob]]: ...


@overload
def claim(
    conn: psycopg.Connection[Any], *, queue: str, slots: int, fair: bool = False,
    worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None, durable: bool | None = None,
    not_before: datetime | None = None,
) -> list[ClaimedJob]: ...


def claim(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], *, queue: str, slots: int,
    fair: bool = False, worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None, durable: bool | None = None,
    not_before: datetime | None = None,
) -> list[ClaimedJob] | Awaitable[list[ClaimedJob]]:
    """Claim up to ``slots`` ready jobs of ``queue`` for ``worker_id``.

    ``conn`` is an autocommit psycopg connection, not inside a transaction; the
    claim runs its own. With an ``AsyncConnection`` the result is an awaitable.
    ``fair``: within a priority, slots go to the ``limit_key`` group with the
    fewest running jobs in the queue. ``tasks``: claim only these task names.
    ``app``: its transition hooks run in the claim transaction. ``now``: the
    database time to use (tests); by default the database clock. ``durable``:
    whether the claim's commit waits for the WAL flush (``synchronous_commit`` set
    for its transaction only, so it works through a pooler in transaction mode);
    None keeps the session's setting. ``not_before``: a moment of the server's
    clock the claim's own clock must not come before (the opening of a
    start-rate window the caller waits for): sent a little early, the claim
    waits for it on the server (5 ms at most) before it takes the queue's turn,
    so its starts count from that moment when the turn is free; not with ``now``.
    Returns the claimed jobs in claim order.

    Reuse the connection for the next claims: the claim's statements are
    prepared on it, and it remembers the shape of ``queue`` its last claim saw
    (keys at their limit, how much it read, the queue's groups): hints for the
    next claim, checked before they are used, never a change to its result.
    """
    request = _request(queue, slots, fair, worker_id, tasks, now, durable, not_before)
    # What this connection's last claim of the queue learnt about its shape
    # (akadze.claim._hints): hints that spare finding it out again.
    request = replace(
        request, hints=memory.get(conn, queue),
        on_done=functools.partial(memory.put, conn, queue))
    result: list[ClaimedJob] | Awaitable[list[ClaimedJob]] = _dispatch(
        conn, request, app, windowed_steps
    )
    return result


@overload
def claim_oracle(
    conn: psycopg.AsyncConnection[Any], *, queue: str, slots: int, fair: bool = False,
    worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None,
) -> Awaitable[list[ClaimedJob]]: ...


@overload
def claim_oracle(
    conn: psycopg.Connection[Any], *, queue: str, slots: int, fair: bool = False,
    worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None,
) -> list[ClaimedJob]: ...


def claim_oracle(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], *, queue: str, slots: int,
    fair: bool = False, worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None,
) -> list[ClaimedJob] | Awaitable[list[ClaimedJob]]:
    """The reference claim: same arguments, effects and result as :func:`claim`,
    computed by ranking the whole ready set of the queue in one statement.

    Linear in the queue length; for tests and ``akadze bench claims`` only.
    """
    request = _request(queue, slots, fair, worker_id, tasks, now)
    result: list[ClaimedJob] | Awaitable[list[ClaimedJob]] = _dispatch(
        conn, request, app, oracle_steps
    )
    return result
