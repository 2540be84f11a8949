"""What each page reads: the dashboard's queries (``sql/queries/dashboard.sql``) run on
one connection, turned into plain page data by the pure core (:mod:`._model`).

Every function takes the page's ``now`` (read once from the database clock, so that
every statement of a page agrees) and returns a dataclass with ``to_dict()`` for the
JSON API. Nothing here counts the whole jobs table: see the SQL file's preamble.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from .. import JobSummary, Schedule, WorkerSummary, get_job, list_workers, queries
from . import _model
from ._model import Count, JobFilter, Shares, Throughput

if TYPE_CHECKING:
    from ..app import Akadze

Conn = psycopg.AsyncConnection[Any]

COUNT_CAP = 10_000  # counts of queued jobs stop here ("10 000+")
WAITING_CAP = 1_000  # ready jobs behind one key on the limits and fairness pages
SAMPLE_CAP = 20_000  # finishes read for throughput and shares of starts
SPAN_BUCKETS = 15  # the throughput chart: 15 buckets ...
BUCKET_SECONDS = 60  # ... of a minute
GROUPS_CAP = 100  # waiting groups enumerated per queue on the fairness page
GROUP_ROWS = 20  # groups listed per queue on the fairness page
LIMITS_PAGE = 100
JOBS_PAGE = 50
JOBS_SCAN = 10_000  # jobs walked per page of the jobs list at most


async def _rows(conn: Conn, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    cur = await conn.execute(queries.get(name), params)
    return await cur.fetchall()


async def clock(conn: Conn, now: datetime | None = None) -> datetime:
    rows = await _rows(conn, "dashboard_clock", {"now": now})
    value: datetime = rows[0][0]
    return value


# -- overview ----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    queue: str
    ready: Count
    scheduled: Count
    running: int
    lag: timedelta | None
    paused: bool
    throughput: Throughput

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "ready": self.ready.to_dict(),
            "scheduled": self.scheduled.to_dict(),
            "running": self.running,
            "lag_seconds": None if self.lag is None else self.lag.total_seconds(),
            "paused": self.paused,
            "throughput": self.throughput.to_dict(),
        }


@dataclass(frozen=True)
class Estimate:
    """The planner's estimate of the jobs table's rows per state (None: never analysed)."""

    rows: int | None
    states: dict[str, int]
    analysed_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "states": self.states,
                "analysed_at": None if self.analysed_at is None else self.analysed_at.isoformat()}


@dataclass(frozen=True)
class Overview:
    now: datetime
    queues: tuple[QueueRow, ...]
    workers: tuple[WorkerSummary, ...]
    estimate: Estimate
    paused: dict[str, datetime] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "queues": [q.to_dict() for q in self.queues],
            "workers": [
                {**w.to_dict(), "heartbeat_age_seconds":
                 (self.now - w.heartbeat_at).total_seconds()}
                for w in self.workers
            ],
            "estimate": self.estimate.to_dict(),
            "counts": {"ready": f"exact up to {COUNT_CAP}, then a lower bound",
                       "scheduled": f"exact up to {COUNT_CAP}, then a lower bound",
                       "running": "exact",
                       "finished": f"a sample of the latest {SAMPLE_CAP} finishes",
                       "estimate": "the planner's statistics as of the last ANALYZE"},
        }


def _estimate(rows: Sequence[tuple[Any, ...]]) -> Estimate:
    if not rows or rows[0][0] is None or rows[0][0] < 0:
        return Estimate(None, {}, None)
    total, values, freqs, analysed = rows[0]
    states = {
        str(v): round(total * f) for v, f in zip(values or (), freqs or (), strict=False)
    }
    return Estimate(round(total), states, analysed)


async def overview(conn: Conn, now: datetime) -> Overview:
    names = [str(r[0]) for r in await _rows(conn, "dashboard_queue_names", {})]
    queued = await _rows(conn, "dashboard_queued",
                         {"queues": names, "now": now, "cap": COUNT_CAP})
    running = await _rows(conn, "dashboard_running", {"since": now})
    finished = await _rows(conn, "dashboard_finished", {
        "now": now, "since": now - timedelta(seconds=SPAN_BUCKETS * BUCKET_SECONDS),
        "cap": SAMPLE_CAP, "bucket": BUCKET_SECONDS})
    workers = await list_workers(conn, now=now)
    estimate = _estimate(await _rows(conn, "dashboard_estimates", {}))
    pauses = {str(q): at for q, at in await _rows(conn, "dashboard_pauses", {})}
    series = _model.throughput(finished, now, buckets=SPAN_BUCKETS,
                               bucket_seconds=BUCKET_SECONDS, cap=SAMPLE_CAP)
    per_queue_running: dict[str, int] = {}
    for queue, _key, count, _started in running:
        per_queue_running[queue] = per_queue_running.get(queue, 0) + int(count)
    rows = []
    for name in sorted(set(names) | set(series)):
        parts = [r for r in queued if r[0] == name]
        firsts = [r[4] for r in parts if r[4] is not None and r[4] <= now]
        rows.append(QueueRow(
            queue=name,
            ready=_model.bounded_sum((int(r[2]) for r in parts), COUNT_CAP),
            scheduled=_model.bounded_sum((int(r[3]) for r in parts), COUNT_CAP),
            running=per_queue_running.get(name, 0),
            lag=(now - min(firsts)) if firsts else None,
            paused=name in pauses,
            throughput=series.get(name)
            or _model.empty_throughput(SPAN_BUCKETS, BUCKET_SECONDS),
        ))
    return Overview(now, tuple(rows), tuple(workers), estimate, pauses)



# -- limits ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitRow:
    key: str
    max_running: int | None
    max_starts: int | None
    window: timedelta | None
    running: int
    starts: int
    at_limit: bool
    waiting: Count

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "max_running": self.max_running,
            "running": self.running,
            "max_starts": self.max_starts,
            "window_seconds": None if self.window is None else self.window.total_seconds(),
            "starts_in_window": self.starts,
            "at_limit": self.at_limit,
            "waiting": self.waiting.to_dict(),
        }


@dataclass(frozen=True)
class LimitsPage:
    now: datetime
    rows: tuple[LimitRow, ...]
    total: int
    prefix: str | None
    next_after: tuple[bool, str] | None  # the keyset cursor of the next page

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "limits": [r.to_dict() for r in self.rows],
            "total": self.total,
            "prefix": self.prefix,
            "next": None if self.next_after is None else
            {"after_at_limit": self.next_after[0], "after_key": self.next_after[1]},
        }


async def waiting(conn: Conn, now: datetime,
                  pairs: Sequence[tuple[str, str | None]]) -> dict[tuple[str, str | None], Count]:
    """Ready jobs per (queue, key) pair (key None: the jobs without a key), each stopped
    at WAITING_CAP."""
    if not pairs:
        return {}
    rows = await _rows(conn, "dashboard_waiting", {
        "queues": [q for q, _ in pairs], "keys": ["" if k is None else k for _, k in pairs],
        "now": now, "cap": WAITING_CAP})
    found = {(str(q), k or None): int(n) for q, k, n in rows}
    return {pair: Count(found.get(pair, 0), found.get(pair, 0) < WAITING_CAP)
            for pair in pairs}


async def waiting_queues(conn: Conn) -> list[str]:
    return [str(r[0]) for r in await _rows(conn, "dashboard_waiting_queues", {})]


async def limits(conn: Conn, now: datetime, *, prefix: str | None = None,
                 after: tuple[bool, str] | None = None) -> LimitsPage:
    params = {"now": now, "prefix": prefix, "page": LIMITS_PAGE + 1,
              "after_at_limit": None if after is None else after[0],
              "after_key": None if after is None else after[1]}
    found = await _rows(conn, "dashboard_limits", params)
    more = len(found) > LIMITS_PAGE
    found = found[:LIMITS_PAGE]
    queues = await waiting_queues(conn)
    counts = await waiting(conn, now, [(q, str(r[0])) for r in found for q in queues])
    behind = {str(r[0]): _model.bounded_sum(
        (counts[(q, str(r[0]))].value for q in queues), WAITING_CAP) for r in found}
    total = (await _rows(conn, "dashboard_limits_total", {"prefix": prefix}))[0][0]
    rows = tuple(
        LimitRow(str(key), max_running, max_starts, window, int(running), int(starts),
                 bool(at_limit), behind.get(str(key), Count(0)))
        for key, max_running, max_starts, window, running, starts, at_limit in found
    )
    next_after = (rows[-1].at_limit, rows[-1].key) if more and rows else None
    return LimitsPage(now, rows, int(total), prefix, next_after)


# -- fairness ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FairnessPage:
    now: datetime
    queues: tuple[Shares, ...]
    span: timedelta
    sampled: int
    covered: timedelta

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "span_seconds": self.span.total_seconds(),
            "covered_seconds": self.covered.total_seconds(),
            "sample": {"finishes": self.sampled, "cap": SAMPLE_CAP},
            "queues": [q.to_dict() for q in self.queues],
        }


async def fairness(conn: Conn, now: datetime) -> FairnessPage:
    span = timedelta(seconds=SPAN_BUCKETS * BUCKET_SECONDS)
    since = now - span
    starts = await _rows(conn, "dashboard_starts", {
        "now": now, "since": since, "cap": SAMPLE_CAP, "top": GROUP_ROWS})
    running_rows = await _rows(conn, "dashboard_running", {"since": since})
    queues = await waiting_queues(conn)
    sampled = int(starts[0][5]) if starts else 0
    oldest = starts[0][6] if starts else None
    covered = span if sampled < SAMPLE_CAP or oldest is None else min(span, now - oldest)
    running: dict[str, dict[str | None, int]] = {}
    for queue, key, count, _started in running_rows:
        running.setdefault(queue, {})[key] = int(count)
    top: dict[str, list[tuple[str | None, int]]] = {}
    totals: dict[str, tuple[int, int]] = {}
    for queue, key, count, total, groups, _sampled, _oldest in starts:
        top.setdefault(queue, []).append((key, int(count)))
        totals[queue] = (int(total), int(groups))
    names = sorted(set(queues) | set(running) | set(top))
    waiting_keys: dict[str, list[str | None]] = {}
    for queue, key in await _rows(conn, "dashboard_groups",
                                  {"queues": names, "cap": GROUPS_CAP}):
        waiting_keys.setdefault(queue, []).append(key)
    listed: dict[str, Shares] = {}
    for queue in names:
        total, groups = totals.get(queue, (0, 0))
        listed[queue] = _model.shares(queue, top.get(queue, []), total, groups,
                                      running.get(queue, {}), waiting_keys.get(queue, []),
                                      rows=GROUP_ROWS)
    behind = await waiting(conn, now, [(q, g.key) for q, s in listed.items() for g in s.groups])
    out = []
    for queue, share in listed.items():
        keys = waiting_keys.get(queue, [])
        out.append(Shares(
            queue,
            tuple(_model.Group(g.key, g.running, g.starts, g.share, behind[(queue, g.key)])
                  for g in share.groups),
            share.total_starts, share.total_groups, share.other_starts, share.running,
            Count(len(keys), len([k for k in keys if k is not None]) < GROUPS_CAP)))
    return FairnessPage(now, tuple(out), span, sampled, covered)


# -- jobs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """A row of the jobs list: the columns of the dashboard_job_row fragment."""

    id: int
    queue: str
    task: str
    state: str
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    limit_key: str | None
    error: str | None
    message: str | None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        return out


@dataclass(frozen=True)
class JobsPage:
    """One page of the jobs list. ``next_before`` continues below this page; when the
    page is not full, ``scanned_to`` says where the bounded scan stopped (None: it
    reached the first job, the list is complete)."""

    now: datetime
    filter: JobFilter
    rows: tuple[JobRow, ...]
    next_before: int | None
    searched: int  # jobs walked (a bound, not a count of matches)
    complete: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "filter": self.filter.to_dict(),
            "jobs": [r.to_dict() for r in self.rows],
            "next_before": self.next_before,
            "searched": self.searched,
            "complete": self.complete,
        }


async def jobs(conn: Conn, now: datetime, where: JobFilter) -> JobsPage:
    params = {**where.params(), "page": JOBS_PAGE + 1, "scan": JOBS_SCAN,
              "before": where.before or _model.ID_MAX}
    if where.id is not None:  # the one job, if it matches the other filters
        params.update(before=where.id + 1, scan=1)
    name = "dashboard_jobs_running" if where.states == ("running",) else "dashboard_jobs"
    found = [JobRow(*row) for row in await _rows(conn, name, params)]
    if len(found) > JOBS_PAGE:
        rows = tuple(found[:JOBS_PAGE])
        return JobsPage(now, where, rows, rows[-1].id, 0, False)
    if name == "dashboard_jobs_running" or where.id is not None:
        return JobsPage(now, where, tuple(found), None, 0, True)
    lowest, walked = (await _rows(conn, "dashboard_jobs_scan_end", params))[0]
    complete = lowest is None or int(walked) < JOBS_SCAN
    return JobsPage(now, where, tuple(found), None if complete else int(lowest),
                    int(walked), complete)


async def failed_ids(conn: Conn, where: JobFilter, limit: int) -> list[int]:
    rows = await _rows(conn, "dashboard_failed_ids", {**where.params(), "limit": limit})
    return [int(r[0]) for r in rows]


@dataclass(frozen=True)
class JobPage:
    """A job with everything the job page shows: its fields, its workflow (parents and
    children, each with its task and state) and its progress."""

    now: datetime
    job: JobSummary
    actions: tuple[str, ...]  # the actions that apply to the job in its state
    parents: tuple[JobLink, ...] = ()
    children: tuple[JobLink, ...] = ()

    @property
    def progress(self) -> dict[str, Any] | None:
        job = self.job
        if job.progress is None:
            return None
        return {"fraction": job.progress, "message": job.progress_message,
                "at": None if job.progress_at is None else job.progress_at.isoformat()}

    def to_dict(self) -> dict[str, Any]:
        return {"now": self.now.isoformat(), "job": self.job.to_dict(),
                "actions": list(self.actions),
                "parents": [link.to_dict() for link in self.parents],
                "children": [link.to_dict() for link in self.children],
                "progress": self.progress}


@dataclass(frozen=True)
class JobLink:
    """A parent or child of the job page's job."""

    id: int
    task: str
    state: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "task": self.task, "state": self.state}


def job_actions(job: JobSummary, now: datetime) -> tuple[str, ...]:
    state = job.state.value
    found = []
    if state in ("failed", "cancelled"):
        found.append("requeue")
    if state == "queued" and job.run_at > now:
        found.append("retry")
    if state in ("waiting", "queued", "reserved", "running") and not job.cancel_requested:
        found.append("cancel")
    return tuple(found)


async def job(conn: Conn, now: datetime, job_id: int) -> JobPage:
    found = await get_job(conn, job_id)
    family: dict[int, JobLink] = {}
    if found.parents or found.children:
        rows = await _rows(conn, "dashboard_job_family",
                           {"ids": [*found.parents, *found.children]})
        family = {int(r[0]): JobLink(int(r[0]), str(r[1]), str(r[2])) for r in rows}
    return JobPage(now, found, job_actions(found, now),
                   parents=tuple(family[i] for i in found.parents if i in family),
                   children=tuple(family[i] for i in found.children if i in family))


# -- schedules ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleRow:
    name: str
    task: str | None  # None: known from its recorded fires only (no app given)
    when: str | None
    last_fire: datetime | None
    last_job_id: int | None
    last_job_state: str | None
    next_fire: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "task": self.task, "when": self.when,
            "last_fire": None if self.last_fire is None else self.last_fire.isoformat(),
            "last_job_id": self.last_job_id, "last_job_state": self.last_job_state,
            "next_fire": None if self.next_fire is None else self.next_fire.isoformat(),
        }


@dataclass(frozen=True)
class SchedulesPage:
    now: datetime
    rows: tuple[ScheduleRow, ...]
    from_app: bool

    def to_dict(self) -> dict[str, Any]:
        return {"now": self.now.isoformat(), "from_app": self.from_app,
                "schedules": [r.to_dict() for r in self.rows]}


SCHEDULES_CAP = 500


async def schedules(conn: Conn, now: datetime, app: Akadze | None) -> SchedulesPage:
    known = {} if app is None else {
        s.name: s for s in app.schedules.values() if isinstance(s, Schedule)}
    if app is None:
        names = [str(r[0]) for r in await _rows(conn, "dashboard_schedule_names",
                                                 {"cap": SCHEDULES_CAP})]
    else:
        names = sorted(known)
    fires = {str(r[0]): r[1:] for r in await _rows(conn, "dashboard_schedule_fires",
                                                     {"names": names})}
    rows = []
    for name in names:
        fire_at, job_id, state = fires.get(name, (None, None, None))
        schedule = known.get(name)
        rows.append(ScheduleRow(
            name=name,
            task=None if schedule is None else schedule.task,
            when=None if schedule is None else schedule.when,
            last_fire=fire_at, last_job_id=job_id, last_job_state=state,
            next_fire=None if schedule is None else schedule.next_fire(now),
        ))
    return SchedulesPage(now, tuple(rows), app is not None)
