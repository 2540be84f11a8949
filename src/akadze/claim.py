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
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, overload

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from . import planner, queries
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
    rows = yield Statement(queries.get("claim_cancel_due"), request.params(now))
    return [_job(r) for r in rows]


def take(
    request: Request, now: datetime, ids: Sequence[int]
) -> Generator[Step, Any, list[ClaimedJob]]:
    """Take the planned rows (those still free); returned in the order of ``ids``."""
    params = {**request.params(now), "ids": list(ids), "worker_id": request.worker_id}
    rows = yield Statement(queries.get("claim_take"), params)
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
    rows = yield Statement(queries.get("claim_oracle_lock"), request.params(now), prepare=False)
    locked = [r[0] for r in rows]
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
    cancelled = yield from cancel_due(request, now)
    return (yield from finish(cancelled, claimed))


# -- the windowed claim -----------------------------------------------------------------

# Above every smallint priority: "after" this position is the head of the queue.
_HEAD_PRIORITY = 32768
# The skip scan that lists a queue's groups stops after this many keys; below
# it, the claim reads per group instead of filtering the queue.
GROUP_SCAN_BOUND = 64
# ... and it is tried only when the rows read so far show at most this many keys
# (a queue that shows many keys in its head rarely has few in total).
GROUP_SCAN_TRY = 16

Position = tuple[int, datetime, int]


@dataclass
class _Reading:
    """Where a windowed read has got to (reset when a short take restarts it)."""

    rows: list[planner.Row]
    after: Position | None = None
    complete: bool = False
    window: int = 0
    excluded: frozenset[str | None] = frozenset()
    universe: frozenset[str | None] | None = None
    scanned_groups: bool = False


@dataclass
class _Known:
    """What the claim learnt about keys and groups."""

    locked: set[str]
    held: set[str]
    unlimited: set[str]
    room: dict[str, int]
    busy: dict[str | None, int]


def _after_params(after: Position | None, now: datetime) -> dict[str, object]:
    if after is None:
        return {"after_priority": _HEAD_PRIORITY, "after_run_at": now, "after_id": 0}
    neg_priority, run_at, id_ = after
    return {"after_priority": -neg_priority, "after_run_at": run_at, "after_id": id_}


def _entries(rows: list[Row]) -> list[tuple[planner.Row, bool]]:
    return [(planner.Row(r[0], r[1], r[2], r[3]), bool(r[4])) for r in rows]


def _read_window(
    request: Request, now: datetime, reading: _Reading, window: int,
    exclude: frozenset[str | None],
) -> Steps0:
    params = {
        **request.params(now), **_after_params(reading.after, now), "window": window,
        "skip_keys": sorted(k for k in exclude if k is not None), "skip_null": None in exclude,
    }
    rows = yield Statement(queries.get("claim_window"), params)
    entries = _entries(rows)
    reading.complete = len(entries) < window
    _advance(reading, entries)


def _read_groups(
    request: Request, now: datetime, reading: _Reading, window: int,
    exclude: frozenset[str | None],
) -> Steps0:
    assert reading.universe is not None
    groups = reading.universe - exclude
    keys = sorted(k for k in groups if k is not None)
    per_group = max(request.slots, -(-window // max(1, len(groups))))
    params = {
        **request.params(now), **_after_params(reading.after, now),
        "keys": keys, "null_group": None in groups, "per_group": per_group,
    }
    rows = yield Statement(queries.get("claim_group_rows"), params)
    entries = _entries(rows)
    # Each group returned at most per_group entries. Up to the earliest last
    # entry of a group that returned per_group of them, nothing was left unread
    # (of the groups read); past it, that group may have more rows.
    counts: Counter[str | None] = Counter(e.key for e, _ in entries)
    last: dict[str | None, Position] = {}
    for entry, _ in entries:
        last[entry.key] = entry.position
    full = [last[g] for g, n in counts.items() if n >= per_group]
    if full:
        edge = min(full)
        entries = [(e, ready) for e, ready in entries if e.position <= edge]
    else:
        reading.complete = True
    _advance(reading, entries)


def _advance(reading: _Reading, entries: list[tuple[planner.Row, bool]]) -> None:
    if entries:
        reading.after = entries[-1][0].position
    reading.rows.extend(e for e, ready in entries if ready)


def _scan_groups(request: Request, now: datetime, reading: _Reading) -> Steps0:
    """Try to list every group of the queue (bounded skip scan)."""
    reading.scanned_groups = True
    params = {"queue": request.queue, "bound": GROUP_SCAN_BOUND}
    rows = yield Statement(queries.get("claim_groups"), params)
    keys, has_null = rows[0]
    if len(keys) < GROUP_SCAN_BOUND:
        groups: set[str | None] = set(keys)
        if has_null:
            groups.add(None)
        reading.universe = frozenset(groups)


def _load_state(
    request: Request, now: datetime, known: _Known, need: planner.NeedState
) -> Steps0:
    new = [k for k in need.keys
           if k not in known.locked and k not in known.held and k not in known.unlimited]
    if new:
        rows = yield Statement(queries.get("claim_lock"), {"keys": new})
        limited = {key: bool(locked) for key, locked in rows}
        held_before = bool(known.locked)
        if not held_before and limited and not any(limited.values()):
            # Every limited key we met is held by another claim and we hold no
            # limits row (and no job) yet: this is the one lock of the claim
            # that may wait, on the first such key in queue order.
            first = next(k for k in new if k in limited)
            got = yield Statement(queries.get("claim_lock_first"), {"keys": [first]})
            if got:
                limited[first] = True
        for key, locked in limited.items():
            (known.locked if locked else known.held).add(key)
        known.unlimited.update(k for k in new if k not in limited)
    for key in need.keys:
        if key in known.held:
            known.room[key] = 0  # another claim has it: left for the next claim
    to_count = [k for k in need.keys if k in known.locked]
    groups = [g for g in need.groups if g is not None]
    null_group = None in need.groups
    if not to_count and not groups and not null_group:
        return
    # A new statement after the locks: it sees every commit made before they were granted.
    params = {"keys": to_count, "groups": groups, "null_group": null_group,
              "queue": request.queue, "now": now}
    rows = yield Statement(queries.get("claim_counts"), params)
    for kind, key, max_running, running, max_starts, starts in rows:
        if kind == "limit":
            known.room[key] = planner.headroom(
                planner.Limit(max_running, running, max_starts, starts or 0))
        else:
            known.busy[key] = running


def windowed_steps(request: Request) -> Steps:
    """The windowed claim (seed-claim): read the queue in windows until the
    planner proves that nothing unread can change the result."""
    now, paused = yield from begin(request)
    if paused:
        return []
    known = _Known(set(), set(), set(), {}, {})
    claimed: list[ClaimedJob] = []
    skip: set[int] = set()
    while len(claimed) < request.slots:
        slots = request.slots - len(claimed)
        reading = _Reading(rows=[])
        decision: planner.Decision
        while True:
            view = planner.View(
                slots=slots, fair=request.fair, rows=reading.rows,
                boundary=-reading.after[0] if reading.after else None,
                complete=reading.complete, window=reading.window,
                excluded=reading.excluded, headroom=known.room,
                unlimited=known.unlimited, busy=known.busy, universe=reading.universe,
                skip=skip,
            )
            decision = planner.plan(view)
            if isinstance(decision, planner.Settled):
                break
            if isinstance(decision, planner.NeedState):
                yield from _load_state(request, now, known, decision)
                continue
            if (reading.universe is None and not reading.scanned_groups and reading.window
                    and len({r.key for r in reading.rows}) <= GROUP_SCAN_TRY):
                yield from _scan_groups(request, now, reading)
                if reading.universe is not None:
                    continue  # plan again: fair groups may need their busy counts
            reading.window = decision.window
            reading.excluded = decision.exclude
            reading.rows = planner.prune(reading.rows, known.room, reading.excluded)
            if reading.universe is not None:
                yield from _read_groups(request, now, reading, decision.window, decision.exclude)
            else:
                yield from _read_window(request, now, reading, decision.window, decision.exclude)
        planned = decision.take
        if not planned:
            break
        got = yield from take(request, now, planned)
        claimed.extend(got)
        if len(got) == len(planned):
            break
        # Rows another claim holds: plan the remaining slots again from the head,
        # with fresh counts (the rows just taken now run, and count).
        taken = {job.id for job in got}
        skip.update(i for i in planned if i not in taken)
        known.room.clear()
        known.busy.clear()
    cancelled = yield from cancel_due(request, now)
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
