"""The step language claims are written in, and the steps both claims share.

A claim is a generator of steps: a :class:`Statement` to run (its rows are sent
back), a :class:`Batch` of statements for one round trip, or the
:class:`Transitions` whose hooks to call. The drivers in :mod:`akadze.claim._drivers` run
the steps on a sync or an async psycopg connection; the windowed claim
(:mod:`akadze.claim._windows`) and the full ranking (:mod:`akadze.claim._ranking`) are written
once in this language.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.rows import BaseRowFactory, tuple_row
from psycopg.types.json import Jsonb

from .. import queries
from ..jobs import ClaimedJob, job_rows
from ._hints import Hints

# -- steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """Run this statement; the step receives its rows (a list of tuples, or of what
    ``rows`` makes of each: ``job_rows`` for the statements that return jobs)."""

    query: sql.SQL | sql.Composed
    params: Mapping[str, object] | None = None
    # None: psycopg decides (it prepares a query after a few runs). Statements
    # that carry array filters pass False: a generic plan cannot hash an array
    # parameter and searches it linearly for every row.
    prepare: bool | None = None
    # False: nobody needs the rows; in the pipeline the statement then travels
    # with the next round trip instead of causing one.
    fetch: bool = True
    # The psycopg row factory the driver reads the rows with.
    rows: BaseRowFactory[Any] = tuple_row


@dataclass(frozen=True)
class Transitions:
    """Call the app's transition hooks for these (job, from_state, to_state)."""

    changes: tuple[tuple[ClaimedJob, str, str], ...]


@dataclass(frozen=True)
class Batch:
    """Run these statements in one round trip (a pipeline); the step receives
    their rows, one list per statement. Each still runs as its own statement, in
    order, with its own READ COMMITTED snapshot."""

    statements: tuple[Statement, ...]
    # True: the driver sends COMMIT right after these statements, in the same
    # round trip, and the claim's transaction ends with them (a claim without
    # transition hooks, at its last take). A statement the claim yields after it
    # opens a new transaction (BEGIN travels with it).
    commit: bool = False


Step = Statement | Batch | Transitions
Steps = Generator[Step, Any, list[ClaimedJob]]
Steps0 = Generator[Step, Any, None]
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
    # synchronous_commit for the claim's own transaction ("off", "on"), or None to
    # keep the session's: set in claim_start with set_config(..., true), never as a
    # startup option (a pooler in transaction mode refuses those).
    synchronous_commit: str | None = None
    # A moment of the server's clock the claim's clock must not come before (the
    # opening of a start-rate window): the server waits for it in claim_start_at,
    # 5 ms at most. None: no wait (claim_start).
    not_before: datetime | None = None
    # Whether transition hooks run in the claim's transaction after it.
    hooks: bool = True
    # What the previous claim of this queue on this connection learnt (hints,
    # checked before they are relied on), and where the windowed claim reports
    # what it learnt for the next one.
    hints: Hints = field(default_factory=Hints)
    on_done: Callable[[Hints], None] | None = field(default=None, compare=False)

    def params(self, now: datetime | None = None) -> dict[str, object]:
        """``now``: the claim's resolved clock (the oracle); by default the
        injected one, or NULL, which the statements read as the transaction's
        ``now()``."""
        return {"queue": self.queue, "now": now if now is not None else self.now,
                "tasks": self.tasks}


def prepared(name: str, params: Mapping[str, object] | None = None,
             fetch: bool = True, rows: BaseRowFactory[Any] = tuple_row) -> Statement:
    """A statement of the windowed claim, prepared from its first run: the claim
    runs it with generic plans (claim_start), so preparing it at once spares
    planning it at every claim until psycopg's prepare threshold; a worker's
    second claim is already as fast as its hundredth."""
    return Statement(queries.get(name), params, prepare=True, fetch=fetch, rows=rows)


def key_list(keys: Iterable[str]) -> Jsonb:
    """Keys for a statement that may receive a thousand of them (skip_keys,
    claim_limit_counts' keys): a jsonb array, one json.dumps call, where a
    text[] is dumped element by element in Python (claim.sql, claim_window)."""
    return Jsonb(list(keys))


# -- steps both claims share ------------------------------------------------------------


def begin(request: Request) -> Generator[Step, Any, tuple[datetime, bool]]:
    """The claim's time and whether the queue is paused."""
    rows = yield Statement(queries.get("claim_begin"), {"now": request.now, "queue": request.queue})
    now, paused = rows[0]
    return now, paused


def cancel_due(request: Request, now: datetime) -> Generator[Step, Any, list[ClaimedJob]]:
    jobs: list[ClaimedJob] = yield Statement(
        queries.get("claim_cancel_due"), request.params(now), rows=job_rows)
    return jobs


def take(
    request: Request, now: datetime, ids: Sequence[int]
) -> Generator[Step, Any, list[ClaimedJob]]:
    """Take the planned rows (those still free); returned in the order of ``ids``."""
    params = {**request.params(now), "ids": list(ids), "worker_id": request.worker_id,
              "need": Jsonb({})}
    jobs: list[ClaimedJob] = yield Statement(queries.get("claim_take"), params, rows=job_rows)
    by_id = {job.id: job for job in jobs}
    return [by_id[i] for i in ids if i in by_id]


def finish(cancelled: list[ClaimedJob], claimed: list[ClaimedJob]) -> Steps:
    """Run the transition hooks once the claimed set is final; return the claim."""
    changes = tuple((job, "queued", "cancelled") for job in cancelled) + tuple(
        (job, "queued", "running") for job in claimed
    )
    if changes:
        yield Transitions(changes)
    return claimed
