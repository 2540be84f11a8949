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
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    # False: nobody needs the rows; in the pipeline the statement then travels
    # with the next round trip instead of causing one.
    fetch: bool = True


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

    def params(self, now: datetime | None = None) -> dict[str, object]:
        """``now``: the claim's resolved clock (the oracle); by default the
        injected one, or NULL, which the statements read as the transaction's
        ``now()``."""
        return {"queue": self.queue, "now": now if now is not None else self.now,
                "tasks": self.tasks}


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
# Any time: with _HEAD_PRIORITY the first arm of a window is empty whatever it is.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The skip scan that lists a queue's groups stops after this many keys; below
# it, the claim reads per group instead of filtering the queue.
GROUP_SCAN_BOUND = 64
# ... and it is tried only when the rows read so far show at most this many keys
# (a queue that shows many keys in its head rarely has few in total).
GROUP_SCAN_TRY = 16

Position = tuple[int, datetime, int]


@dataclass
class _Reading:
    """Where a windowed read has got to (reset when a claim plans again)."""

    rows: list[planner.Row]
    after: Position | None = None
    complete: bool = False
    window: int = 0
    excluded: frozenset[str | None] = frozenset()
    universe: frozenset[str | None] | None = None
    scanned_groups: bool = False
    group_reads: int = 0


@dataclass
class _Known:
    """What the claim learnt about keys and groups.

    ``room``: the headroom of limited keys. Read without a lock when a key is
    first met (exact for a single claim); a key the claim takes from is locked
    first and its headroom counted again under the lock (see :func:`_lock_taken`),
    after which it is exact under concurrency too. ``held``: keys another claim
    held when we tried to lock them (no room for this claim).
    """

    fair: bool
    locked: set[str] = field(default_factory=set)
    held: dict[str, None] = field(default_factory=dict)  # in the order met
    unlimited: set[str] = field(default_factory=set)
    room: dict[str, int] = field(default_factory=dict)
    busy: dict[str | None, int] = field(default_factory=dict)
    settings: dict[str, str] | None = None  # as they were before the claim changed them

    def params(self) -> dict[str, object]:
        """The keys whose state a reading statement need not return again."""
        fair, busy = self.fair, self.busy
        known = [k for k in (*self.room, *self.unlimited) if not fair or k in busy]
        return {"known": known, "known_null": not fair or None in busy, "fair": fair}

    def learn(self, key: str | None, limited: bool | None, max_running: int | None,
              running: int | None, max_starts: int | None, starts: int | None,
              busy: int | None) -> None:
        if self.fair and key not in self.busy:
            self.busy[key] = busy or 0
        if key is None or key in self.room or key in self.unlimited:
            return
        if not limited:
            self.unlimited.add(key)
        elif key in self.held:
            self.room[key] = 0  # another claim has it: left for the next claim
        else:
            self.room[key] = planner.headroom(
                planner.Limit(max_running, running or 0, max_starts, starts or 0))


def _after_params(after: Position | None) -> dict[str, object]:
    if after is None:
        return {"after_priority": _HEAD_PRIORITY, "after_run_at": _EPOCH, "after_id": 0}
    neg_priority, run_at, id_ = after
    return {"after_priority": -neg_priority, "after_run_at": run_at, "after_id": id_}


def _entries(rows: list[Row], known: _Known) -> list[tuple[planner.Row, bool]]:
    """The index entries of a reading statement; its key-state rows (id NULL,
    after the entries) go into ``known``."""
    entries: list[tuple[planner.Row, bool]] = []
    make = planner.Row._make
    for r in rows:
        if r[0] is None:
            known.learn(r[3], r[5], r[6], r[7], r[8], r[9], r[10])
        else:
            entries.append((make(r[:4]), r[4]))
    # A key met without a state row has no limits row and (fair) nothing running
    # in the queue. Keys whose state was known before the statement are skipped
    # by learn(); a key the statement left out because it was known stays as is.
    for row, _ in entries:
        key = row.key
        if (key is not None and key not in known.room and key not in known.unlimited) or (
                known.fair and key not in known.busy):
            known.learn(key, False, None, None, None, None, 0)
    return entries


def _read_window(
    request: Request, known: _Known, reading: _Reading, window: int,
    exclude: frozenset[str | None], first: Statement | None = None,
) -> Steps0:
    params = {
        **request.params(), **_after_params(reading.after), **known.params(), "window": window,
        "skip_keys": sorted(k for k in exclude if k is not None), "skip_null": None in exclude,
    }
    statement = Statement(queries.get("claim_window"), params)
    if first is None:
        rows = yield statement
    else:
        first_rows, rows = yield Batch((first, statement))
        known.settings = {"plan_cache_mode": first_rows[0][0], "jit": first_rows[0][1]}
    entries = _entries(rows, known)
    reading.complete = len(entries) < window
    _advance(reading, entries)


def _read_groups(
    request: Request, known: _Known, reading: _Reading, window: int,
    exclude: frozenset[str | None],
) -> Steps0:
    assert reading.universe is not None
    groups = reading.universe - exclude
    keys = sorted(k for k in groups if k is not None)
    # Each group gets a share of the window. No group can place more than
    # `slots` rows in the claim, so the first read asks for at most that many
    # (one group holding the queue: `slots` rows, not the whole window); later
    # reads (rows that were not ready for us) for at least that many.
    share = -(-window // max(1, len(groups)))
    per_group = (max if reading.group_reads else min)(request.slots, share)
    reading.group_reads += 1
    params = {
        **request.params(), **_after_params(reading.after), **known.params(),
        "keys": keys, "null_group": None in groups, "per_group": per_group,
    }
    rows = yield Statement(queries.get("claim_group_rows"), params)
    entries = _entries(rows, known)
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


def _scan_groups(request: Request, reading: _Reading) -> Steps0:
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


def _counts(request: Request, keys: Sequence[str], groups: Sequence[str | None]) -> Statement:
    params = {"keys": list(keys), "groups": [g for g in groups if g is not None],
              "null_group": None in groups, "queue": request.queue, "now": request.now}
    return Statement(queries.get("claim_counts"), params)


def _load_state(request: Request, known: _Known, need: planner.NeedState) -> Steps0:
    """State the reading statements did not bring (groups found by the skip scan,
    keys met before a re-plan): counted without locks, like theirs."""
    keys = [k for k in need.keys if k not in known.room and k not in known.unlimited]
    rows = yield _counts(request, keys, need.groups)
    limited: set[str] = set()
    for kind, key, max_running, running, max_starts, starts in rows:
        if kind == "limit":
            limited.add(key)
            known.learn(key, True, max_running, running, max_starts, starts, None)
        elif key not in known.busy:
            known.busy[key] = running
    known.unlimited.update(k for k in keys if k not in limited)
    for group in need.groups:
        known.busy.setdefault(group, 0)


def _lock_taken(
    request: Request, known: _Known, need: dict[str, int], claimed: bool
) -> Generator[Step, Any, bool]:
    """Lock the limits rows of the keys the claim is about to take from and count
    them again in a new statement (its snapshot sees every commit made before the
    locks were granted). ``need``: how many planned rows each key has. True when
    every key still has room for them (for a single claim the counts are the
    same as the plan's; under concurrency a key may have gained room since,
    which the plan may leave unused, claim-semantics "Under concurrency"); else
    ``known`` now holds the exact figures and the claim plans again. Never
    waits: a key another claim holds gets no room here (see :func:`_wait_first`)."""
    keys = list(need)
    lock, counted = yield Batch((
        Statement(queries.get("claim_lock"), {"keys": keys}), _counts(request, keys, ())))
    got = {key: bool(locked) for key, locked in lock}
    if not known.locked and not claimed and got and not any(got.values()):
        # Every key is held by another claim and we hold no limits row and no
        # job yet: this is the one lock of the claim that may wait, on the
        # first such key in queue order (we hold nothing anyone could wait
        # for: no cycle of waits).
        first = next(k for k in keys if k in got)
        waited, counted = yield Batch((
            Statement(queries.get("claim_lock_first"), {"keys": [first]}),
            _counts(request, keys, ())))
        if waited:
            got[first] = True
    room = {key: planner.headroom(planner.Limit(max_running, running, max_starts, starts or 0))
            for _, key, max_running, running, max_starts, starts in counted}
    same = True
    for key in keys:
        if key not in got:  # its limits row went away meanwhile: unlimited now
            del known.room[key]
            known.unlimited.add(key)
            same = False
            continue
        if got[key]:
            known.locked.add(key)
            now_room = room[key]
        else:
            known.held[key] = None
            now_room = 0
        if now_room < need[key]:
            same = False
        known.room[key] = now_room
    return same


def _wait_first(request: Request, known: _Known) -> Generator[Step, Any, None]:
    """The one lock of a claim that may wait: the claim found nothing to take
    because every limited key it wanted is held by other claims, and it holds no
    limits row and no job yet. It waits for the first such key (in the order it
    met them) and counts it in a new statement; waiting holding nothing, it
    cannot close a cycle of waits. So a claim on a hot key makes progress
    instead of coming back empty, and claims that could take other rows never
    wait at all (they leave the held keys to the next claim)."""
    first = next(iter(known.held))
    waited, counted = yield Batch((
        Statement(queries.get("claim_lock_first"), {"keys": [first]}),
        _counts(request, [first], ())))
    known.held.pop(first)
    if not waited:  # its limits row went away meanwhile: unlimited now
        known.room.pop(first, None)
        known.unlimited.add(first)
        return
    known.locked.add(first)
    for _, _, max_running, running, max_starts, starts in counted:
        known.room[first] = planner.headroom(
            planner.Limit(max_running, running, max_starts, starts or 0))


def _take(
    request: Request, ids: Sequence[int], sweep: bool
) -> Generator[Step, Any, tuple[list[ClaimedJob], list[ClaimedJob]]]:
    """Take the planned rows (those still free), and sweep cancelled/expired rows
    when ``sweep``; returns (taken in the order of ``ids``, cancelled)."""
    params = {**request.params(), "ids": list(ids), "worker_id": request.worker_id,
              "sweep": sweep}
    rows = yield Statement(queries.get("claim_take_sweep"), params)
    by_id: dict[int, ClaimedJob] = {}
    cancelled: list[ClaimedJob] = []
    for row in rows:
        job = _job(row[1:])
        if row[0] == "running":
            by_id[job.id] = job
        else:
            cancelled.append(job)
    return [by_id[i] for i in ids if i in by_id], cancelled


def windowed_steps(request: Request) -> Steps:
    """The windowed claim (seed-claim): read the queue in windows until the
    planner proves that nothing unread can change the result."""
    known = _Known(request.fair)
    claimed: list[ClaimedJob] = []
    cancelled: list[ClaimedJob] = []
    skip: set[int] = set()
    # Claims of one queue take turns (docs/explanation/claim.md, "Claims of one
    # queue take turns"): the first lock of the claim, taken holding nothing;
    # it travels with the first window (no round trip of its own).
    yield Statement(queries.get("claim_queue_turn"), {"queue": request.queue}, fetch=False)
    swept = waited = False
    universe: frozenset[str | None] | None = None
    scanned = False
    while len(claimed) < request.slots:
        slots = request.slots - len(claimed)
        reading = _Reading(rows=[], universe=universe, scanned_groups=scanned)
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
                want = set(decision.take)
                need = Counter(
                    r.key for r in reading.rows
                    if r.id in want and r.key in known.room and r.key not in known.locked)
                if need:
                    if (yield from _lock_taken(request, known, need, bool(claimed))):
                        break
                    # A headroom changed under the lock (another claim started
                    # or finished jobs of the key, or holds it): plan again.
                elif decision.take or claimed or known.locked or not known.held or waited:
                    break
                else:
                    waited = True
                    yield from _wait_first(request, known)
                # From the head; the groups listed by a skip scan stay listed.
                reading = _Reading(rows=[], universe=reading.universe,
                                   scanned_groups=reading.scanned_groups)
                continue
            if isinstance(decision, planner.NeedState):
                yield from _load_state(request, known, decision)
                continue
            if (reading.universe is None and not reading.scanned_groups and reading.window
                    and len({r.key for r in reading.rows}) <= GROUP_SCAN_TRY):
                yield from _scan_groups(request, reading)
                if reading.universe is not None:
                    continue  # plan again: fair groups may need their busy counts
            reading.window = decision.window
            reading.excluded = decision.exclude
            reading.rows = planner.prune(reading.rows, known.room, reading.excluded)
            if reading.universe is not None:
                yield from _read_groups(request, known, reading, decision.window,
                                        decision.exclude)
            else:
                first = None
                if known.settings is None:
                    first = Statement(queries.get("claim_plan_generic"))
                yield from _read_window(request, known, reading, decision.window,
                                        decision.exclude, first)
        planned = decision.take
        if not planned and swept:
            break
        got, gone = yield from _take(request, planned, not swept)
        swept = True
        claimed.extend(got)
        cancelled.extend(gone)
        if len(got) == len(planned):
            break
        # Rows another claim holds: plan the remaining slots again from the head,
        # leaving them out. The rows just taken now run, and count: every
        # limited key taken from is locked by us, so its headroom is exact
        # after taking one per row; each taken row adds one to its group's busy.
        taken = {job.id for job in got}
        skip.update(i for i in planned if i not in taken)
        for job in got:
            key = job.limit_key
            if key is not None and key in known.room:
                known.room[key] = max(0, known.room[key] - 1)
            if request.fair:
                known.busy[key] = known.busy.get(key, 0) + 1
        universe, scanned = reading.universe, reading.scanned_groups
    if not swept:
        _, cancelled = yield from _take(request, (), True)
    cancelled.sort(key=lambda job: job.id)
    if known.settings is not None:
        # The hooks run with the caller's settings (no round trip: this travels
        # with the hooks' first statement, or with COMMIT).
        yield Statement(queries.get("claim_plan_restore"), known.settings, fetch=False)
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
    # Pipeline mode: statements are sent as they come and a round trip happens
    # only when a result is needed, so BEGIN travels with the first statement
    # and a Batch costs one round trip.
    with conn.pipeline(), conn.transaction():
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
                    reply = (cur.fetchall()) if step.fetch else None
            elif isinstance(step, Batch):
                cursors = [conn.cursor(row_factory=tuple_row) for _ in step.statements]
                for cur, st in zip(cursors, step.statements, strict=True):
                    cur.execute(st.query, st.params, prepare=st.prepare)
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
    async with conn.pipeline(), conn.transaction():
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
                    reply = (await cur.fetchall()) if step.fetch else None
            elif isinstance(step, Batch):
                cursors = [conn.cursor(row_factory=tuple_row) for _ in step.statements]
                for cur, st in zip(cursors, step.statements, strict=True):
                    await cur.execute(st.query, st.params, prepare=st.prepare)
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
