"""The claim: hand a worker the next jobs of one queue, respecting limits and fair turns.

What a claim must return is pinned down in ``docs/explanation/claim.md`` (after
claim-semantics). This module is the I/O shell: the decisions are made by the
pure :mod:`akadze.planner`, the statements live in ``sql/queries/claim*.sql``.

Each claim is written once, as a generator of steps (a statement to run, or the
transition hooks to call); a small sync driver and a small async driver run the
steps on a psycopg ``Connection`` or ``AsyncConnection`` inside one transaction.
So the sync and async entry points each do their own I/O and share everything
else, with no bridge between the two.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, overload

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from . import queries
from .errors import ConfigurationError
from .jobs import ClaimedJob

if TYPE_CHECKING:
    from .app import Akadze

__all__ = ["claim", "claim_oracle"]


# -- steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """Run this statement; the step receives its rows (a list of tuples)."""

    query: sql.SQL | sql.Composed
    params: Mapping[str, object] | None = None
    # None: psycopg decides (it prepares a query after a few runs). Statements
    # that carry array filters pass False: a generic plan cannot hash an array
    # parameter and searches it linearly for every row.
    prepare: bool | None = None


@dataclass(frozen=True)
class Transitions:
    """Call the app's transition hooks for these (job, from_state, to_state)."""

    changes: tuple[tuple[ClaimedJob, str, str], ...]


Step = Statement | Transitions
Steps = Generator[Step, Any, list[ClaimedJob]]
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Request:
    """One claim's arguments, checked."""

    queue: str
    slots: int
    fair: bool
    worker_id: str | None
    tasks: list[str] | None
    now: datetime | None

    def params(self, now: datetime) -> dict[str, object]:
        return {"queue": self.queue, "now": now, "tasks": self.tasks}


def _job(row: Row) -> ClaimedJob:
    (id_, queue, task, args, priority, run_at, limit_key, run_count, attempt, max_attempts,
     meta, unique_key, expires_at, worker_id, started_at) = row
    return ClaimedJob(
        id=id_, queue=queue, task=task, args=args, priority=priority, run_at=run_at,
        limit_key=limit_key, run_count=run_count, attempt=attempt, max_attempts=max_attempts,
        meta=meta, unique_key=unique_key, expires_at=expires_at, worker_id=worker_id,
        started_at=started_at,
    )


# -- steps both claims share ------------------------------------------------------------


def begin(request: Request) -> Generator[Step, Any, tuple[datetime, bool]]:
    """The claim's time and whether the queue is paused."""
    rows = yield Statement(queries.get("claim_begin"), {"now": request.now, "queue": request.queue})
    now, paused = rows[0]
    return now, paused


def cancel_due(request: Request, now: datetime) -> Generator[Step, Any, list[ClaimedJob]]:
    rows = yield Statement(queries.get("claim_cancel_due"), request.params(now), prepare=False)
    return [_job(r) for r in rows]


def prune_marks(keys: Sequence[str], now: datetime) -> Generator[Step, Any, None]:
    if keys:
        yield Statement(queries.get("claim_prune_marks"), {"keys": list(keys), "now": now},
                        prepare=False)


def take(
    request: Request, now: datetime, ids: Sequence[int]
) -> Generator[Step, Any, list[ClaimedJob]]:
    """Take the planned rows (those still free); returned in the order of ``ids``."""
    params = {**request.params(now), "ids": list(ids), "worker_id": request.worker_id}
    rows = yield Statement(queries.get("claim_take"), params, prepare=False)
    by_id = {job.id: job for job in map(_job, rows)}
    return [by_id[i] for i in ids if i in by_id]


def finish(cancelled: list[ClaimedJob], claimed: list[ClaimedJob]) -> Steps:
    """Run the transition hooks once the claimed set is final; return the claim."""
    changes = tuple((job, "queued", "cancelled") for job in cancelled) + tuple(
        (job, "queued", "running") for job in claimed
    )
    if changes:
        yield Transitions(changes)
    return claimed


# -- the reference claim ----------------------------------------------------------------


def oracle_steps(request: Request) -> Steps:
    """claim-semantics.md as one ranking statement over the whole ready set."""
    now, paused = yield from begin(request)
    if paused:
        return []
    cancelled = yield from cancel_due(request, now)
    rows = yield Statement(queries.get("claim_oracle_lock"), request.params(now), prepare=False)
    locked = [r[0] for r in rows]
    yield from prune_marks(locked, now)
    claimed: list[ClaimedJob] = []
    skip_ids: list[int] = []
    while len(claimed) < request.slots:
        params = {
            **request.params(now),
            "locked": locked,
            "skip_ids": skip_ids,
            "fair": request.fair,
            "slots": request.slots - len(claimed),
        }
        rows = yield Statement(queries.get("claim_oracle_rank"), params, prepare=False)
        planned = [r[0] for r in rows]
        if not planned:
            break
        got = yield from take(request, now, planned)
        claimed.extend(got)
        if len(got) < len(planned):
            # Someone else holds (or just changed) the missing rows: plan again
            # without them. skip_ids only grows, so this ends.
            taken = {job.id for job in got}
            skip_ids.extend(i for i in planned if i not in taken)
    return (yield from finish(cancelled, claimed))


# -- drivers --------------------------------------------------------------------------


def _check_idle(status: TransactionStatus) -> None:
    if status != TransactionStatus.IDLE:
        raise ConfigurationError(
            "claim needs a connection that is not inside a transaction "
            "(an autocommit connection): it runs its own transaction"
        )


def _run_sync(conn: psycopg.Connection[Any], steps: Steps, app: Akadze | None) -> list[ClaimedJob]:
    _check_idle(conn.info.transaction_status)
    with conn.transaction():
        reply: Any = None
        while True:
            try:
                step = steps.send(reply)
            except StopIteration as done:
                result: list[ClaimedJob] = done.value
                return result
            reply = None
            if isinstance(step, Statement):
                with conn.cursor(row_factory=tuple_row) as cur:
                    cur.execute(step.query, step.params, prepare=step.prepare)
                    reply = cur.fetchall() if cur.description else []
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
    async with conn.transaction():
        reply: Any = None
        while True:
            try:
                step = steps.send(reply)
            except StopIteration as done:
                result: list[ClaimedJob] = done.value
                return result
            reply = None
            if isinstance(step, Statement):
                async with conn.cursor(row_factory=tuple_row) as cur:
                    await cur.execute(step.query, step.params, prepare=step.prepare)
                    reply = await cur.fetchall() if cur.description else []
            elif app is not None:
                for job, old, new in step.changes:
                    for hook in app.on_transition_hooks:
                        outcome = hook(conn, job, old, new)
                        if inspect.isawaitable(outcome):
                            await outcome


# -- public API -------------------------------------------------------------------------


def _request(
    queue: str, slots: int, fair: bool, worker_id: str | None,
    tasks: Collection[str] | None, now: datetime | None,
) -> Request:
    if not isinstance(queue, str) or not queue:
        raise ConfigurationError(f"queue must be a non-empty string, got {queue!r}")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
        raise ConfigurationError(f"slots must be a non-negative integer, got {slots!r}")
    if isinstance(tasks, str):
        raise ConfigurationError("tasks must be a collection of task names, not one string")
    if now is not None and now.tzinfo is None:
        raise ConfigurationError("now must be a timezone-aware datetime")
    names = sorted(set(tasks)) if tasks is not None else None
    return Request(queue, slots, bool(fair), worker_id, names, now)


def _dispatch(
    conn: Any, request: Request, app: Akadze | None, steps: Callable[[Request], Steps]
) -> Any:
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
    app: Akadze | None = None, now: datetime | None = None,
) -> Awaitable[list[ClaimedJob]]: ...


@overload
def claim(
    conn: psycopg.Connection[Any], *, queue: str, slots: int, fair: bool = False,
    worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None,
) -> list[ClaimedJob]: ...


def claim(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], *, queue: str, slots: int,
    fair: bool = False, worker_id: str | None = None, tasks: Collection[str] | None = None,
    app: Akadze | None = None, now: datetime | None = None,
) -> list[ClaimedJob] | Awaitable[list[ClaimedJob]]:
    """Claim up to ``slots`` ready jobs of ``queue`` for ``worker_id``.

    ``conn`` is an autocommit psycopg connection, not inside a transaction; the
    claim runs its own. With an ``AsyncConnection`` the result is an awaitable.
    ``fair``: within a priority, slots go to the ``limit_key`` group with the
    fewest running jobs in the queue. ``tasks``: claim only these task names.
    ``app``: its transition hooks run in the claim transaction. ``now``: the
    database time to use (tests); by default the database clock.
    Returns the claimed jobs in claim order.
    """
    request = _request(queue, slots, fair, worker_id, tasks, now)
    result: list[ClaimedJob] | Awaitable[list[ClaimedJob]] = _dispatch(
        conn, request, app, oracle_steps
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
