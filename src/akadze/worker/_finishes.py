"""Writing finishes: many run outcomes per statement, each row fenced.

The I/O half of :mod:`akadze.outcomes` (which decides what to write).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import psycopg

from .. import queries
from ..database import BEGIN_READ_COMMITTED, COMMIT, roll_back_failed_async
from ..hooks import call_transition_hooks
from ..jobs import JobState
from ..outcomes import GIVE_BACKS_PER_ATTEMPT, GIVEN_BACK, Finish

logger = logging.getLogger("akadze.worker")


def _int_array(values: Sequence[int]) -> str:
    """A PostgreSQL array literal of integers (much cheaper to send than a list that
    psycopg dumps element by element)."""
    return "{" + ",".join(map(str, values)) + "}"


def token_array(values: Sequence[int | None]) -> str:
    """Claim tokens as an array literal (NULL: a run claimed before migration 0007)."""
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


def fence_params(batch: Sequence[Finish]) -> dict[str, str]:
    """The parameters of ``run_fence`` (worker.sql) for ``batch``: which run each is."""
    return {
        "ids": _int_array([f.job.id for f in batch]),
        "tokens": token_array([f.job.claim_token for f in batch]),
        "run_counts": _int_array([f.job.run_count for f in batch]),
    }


def _float_array(values: Sequence[float | None]) -> str:
    return "{" + ",".join("NULL" if v is None else repr(float(v)) for v in values) + "}"


def _text_array(values: Sequence[str | None]) -> list[str | None]:
    # unnest() pads shorter arrays with NULLs: an all-NULL column is sent empty.
    # Sent in binary (worker.sql, finish_jobs): no quoting of each element.
    return list(values) if any(v is not None for v in values) else []


def finish_params(batch: Sequence[Finish], now: datetime | None) -> dict[str, Any]:
    """The array parameters of ``finish_jobs`` for ``batch``."""
    return {
        **fence_params(batch),
        # state names are fixed identifiers: safe in a literal
        "states": "{" + ",".join(f.state.value for f in batch) + "}",
        "attempt_deltas": _int_array([f.attempt_delta for f in batch]),
        "delays": _float_array([f.delay for f in batch]),
        "results": _text_array([f.result for f in batch]),
        "errors": _text_array([f.error for f in batch]),
        "now": now,
    }


async def _send_finish(
    conn: psycopg.AsyncConnection[Any], batch: Sequence[Finish], now: datetime | None
) -> psycopg.AsyncCursor[Any] | None:
    """Send the statement that writes ``batch`` (its rows are read later: in a
    pipeline, with what follows it)."""
    # Never prepared: a generic plan cannot see how many rows unnest() yields and
    # was measured at 130 ms instead of 8 ms for 1 000 rows among 100 000 (custom
    # plans cost ~0.3 ms of planning).
    if not batch:
        return None
    if all(f.state is JobState.SUCCEEDED for f in batch):
        params: dict[str, Any] = {
            **fence_params(batch),
            "results": _text_array([f.result for f in batch]),
            "now": now,
        }
        return await conn.execute(queries.get("finish_succeeded"), params, prepare=False)
    return await conn.execute(
        queries.get("finish_jobs"), finish_params(batch, now), prepare=False)


async def _accepted(cur: psycopg.AsyncCursor[Any] | None) -> set[int]:
    return set() if cur is None else {int(str(row[0])) for row in await cur.fetchall()}


async def _execute_finish(
    conn: psycopg.AsyncConnection[Any], batch: Sequence[Finish], now: datetime | None
) -> set[int]:
    return await _accepted(await _send_finish(conn, batch, now))


def _recorded_give_back(finish: Finish) -> bool:
    return finish.kind == GIVEN_BACK and finish.error is not None


async def _send_give_back(
    conn: psycopg.AsyncConnection[Any], batch: Sequence[Finish], now: datetime | None
) -> psycopg.AsyncCursor[Any] | None:
    """Send the statement that writes recorded give-backs (``give_back_jobs``)."""
    if not batch:
        return None
    return await conn.execute(queries.get("give_back_jobs"), {
        **fence_params(batch),
        "errors": [f.error for f in batch],
        "cap": GIVE_BACKS_PER_ATTEMPT,
        "now": now,
    }, prepare=False)


async def _given_back(cur: psycopg.AsyncCursor[Any] | None) -> dict[int, JobState]:
    """The new state of each give-back accepted (queued, or failed when its
    give-backs spent its last attempt)."""
    if cur is None:
        return {}
    return {int(str(row[0])): JobState(row[1]) for row in await cur.fetchall()}


async def _lock_keys(conn: psycopg.AsyncConnection[Any], batch: Sequence[Finish],
                     more: Sequence[str] = ()) -> None:
    """Lock the limits rows of ``batch``'s keys (and ``more``) in key order
    (lock_outcome_keys)."""
    keys = sorted({f.job.limit_key for f in batch if f.job.limit_key is not None} | set(more))
    if keys:
        await conn.execute(queries.get("lock_outcome_keys"), {"keys": keys})


#: Reads what ``then`` sent, once its statements ran (see :func:`write`).
Reader = Callable[[], Awaitable[None]]
Then = Callable[[psycopg.AsyncConnection[Any]], Awaitable[Reader]]
Before = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


async def write(
    conn: psycopg.AsyncConnection[Any],
    batch: Sequence[Finish],
    *,
    hooks: Sequence[Callable[..., Any]] = (),
    now: datetime | None = None,
    then: Then | None = None,
    before: Before | None = None,
    before_keys: Sequence[str] = (),
) -> set[int]:
    """Write ``batch``; return the ids whose fence held (the others were no longer
    this run's and changed nothing).

    One statement per kind of finish (succeeded, other, recorded give-back), in one
    transaction. With on_transition hooks, the statements and the hooks share it;
    each hook runs in a savepoint: a hook that raises is logged and its own writes
    are rolled back, and the change itself still happens (a job must not stay
    running because a hook fails). ``then`` sends more statements in the same
    transaction, last (the hand-offs: :mod:`._handoffs`), and returns what reads
    their rows; what they raise rolls the whole write back. ``before`` sends
    statements first, once the limits rows of the batch's keys and ``before_keys``
    are locked in key order (the reserved jobs begun in the slots of these runs:
    started before the finishes, as a finish of such a job may be in the batch).
    """
    if not batch:
        return set()
    given = [f for f in batch if _recorded_give_back(f)]
    plain = [f for f in batch if f.state is JobState.SUCCEEDED]
    other = [f for f in batch if f.state is not JobState.SUCCEEDED and not _recorded_give_back(f)]
    statements = sum(1 for part in (plain, other, given) if part)
    # More than one statement that changes running jobs in one transaction: their
    # keys' limits rows are locked first, in one order (lock_outcome_keys).
    lock_first = statements > 1 or before is not None
    if not hooks and then is None and before is None and statements == 1:
        # One statement in its own (autocommit) transaction.
        if given:
            return set(await _given_back(await _send_give_back(conn, given, now)))
        return await _execute_finish(conn, plain or other, now)
    if not hooks and conn.autocommit:
        # One pipeline and one Sync: the statements run in one transaction, in one
        # round trip. The limits rows their count triggers lock (migration 0017)
        # are held only while the server runs them: a COMMIT sent after reading
        # the rows would hold them over a round trip and the client's turn to
        # read, while other workers' writes of the same keys wait. An explicit
        # BEGIN and COMMIT, not the Sync's implicit transaction: leaving the
        # pipeline sends the Sync even when the block raised (a cancellation, an
        # error of ours between two statements), which would commit what was
        # sent so far; without the COMMIT it ends in an open block, rolled back
        # here. A statement's error rolls back the whole write in either case.
        #
        # A write that hands slots off (``then``) ends runs of keys and starts the
        # same keys' next jobs: the count triggers keep the changes to the keys'
        # running counts and the last statement writes each key's net change,
        # instead of writing each key's limits row twice (migration 0021).
        try:
            async with conn.pipeline():
                await conn.execute(BEGIN_READ_COMMITTED, prepare=False)
                if then is not None:
                    await conn.execute(queries.get("defer_running"), prepare=True)
                if lock_first:
                    await _lock_keys(conn, batch, before_keys)
                if before is not None:
                    await before(conn)
                sent = [await _send_finish(conn, plain, now),
                        await _send_finish(conn, other, now)]
                sent_given = await _send_give_back(conn, given, now)
                read = None
                if then is not None:
                    read = await then(conn)
                    await conn.execute(queries.get("apply_running"), prepare=True)
                await conn.execute(COMMIT, prepare=False)
        except BaseException:
            await roll_back_failed_async(conn, "outcome write")
            raise
        accepted = (set(await _given_back(sent_given)) | await _accepted(sent[0])
                    | await _accepted(sent[1]))
        if read is not None:
            await read()
        return accepted
    async with conn.transaction():
        if lock_first:
            await _lock_keys(conn, batch, before_keys)
        if before is not None:
            await before(conn)
        accepted = await _execute_finish(conn, plain, now)
        accepted |= await _execute_finish(conn, other, now)
        gave_back = await _given_back(await _send_give_back(conn, given, now))
        accepted |= set(gave_back)
        for finish in batch:
            if finish.job.id not in accepted:
                continue
            to_state = gave_back.get(finish.job.id, finish.state).value
            for hook in hooks:
                try:
                    async with conn.transaction():
                        await call_transition_hooks(
                            [hook], conn, finish.job, "running", to_state
                        )
                except psycopg.OperationalError:
                    raise
                except Exception as exc:
                    logger.error(
                        "on_transition hook %s failed for job %d (running -> %s): %s",
                        getattr(hook, "__name__", hook), finish.job.id, to_state,
                        exc, extra={"job_id": finish.job.id}, exc_info=exc,
                    )
        if then is not None:
            await (await then(conn))()
    return accepted
