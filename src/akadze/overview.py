"""Reading the state of the cluster: jobs, queues and workers.

Every function takes a *source* (see :mod:`akadze.sessions`): the app, a SQLAlchemy
``AsyncEngine`` such as ``app.engine`` (what akadze 0.5 accepted), a psycopg
connection or pool, a URL, or a session. The async functions have ``_sync`` twins
for sync sources (``Engine``, ``Connection``, ``ConnectionPool``, the app, a URL);
each pair is two thin calls of one dialog (akadze.dialog).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, overload

from psycopg.rows import dict_row

from . import dialog, names, queries
from .dialog import Dialog
from .errors import EnqueueError, FilterError, JobNotFound
from .jobs import JobState, stored_json, stored_object
from .jobspec import check_meta
from .sessions import Session, SyncSession

__all__ = [
    "JobSummary",
    "QueueSnapshot",
    "StateCount",
    "WorkerSummary",
    "get_job",
    "get_job_sync",
    "list_jobs",
    "list_jobs_sync",
    "list_workers",
    "list_workers_sync",
    "queue_snapshot",
    "queue_snapshot_sync",
]

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


@dataclass(frozen=True)
class JobSummary:
    """A job as stored: its identity, state, options, timings and history.

    :func:`get_job` reads all of it. :func:`list_jobs` leaves out the three columns
    that can be large (``detailed`` is False): ``args`` is ``{}``, ``errors`` ``[]``
    and ``result`` None there. Both read ``error_count`` and ``last_error`` (from a
    list, without its traceback).
    """

    id: int
    queue: str
    task: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_count: int
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    limit_key: str | None
    unique_key: str | None
    meta: dict[str, Any]
    args: dict[str, Any]
    errors: list[dict[str, Any]]
    result: Any
    worker_id: str | None
    cancel_requested: bool
    expires_at: datetime | None
    last_error: dict[str, Any] | None = None
    error_count: int = 0
    detailed: bool = True
    #: The workflow around the job: the ids of its parents and children (at most
    #: 1 000 of each, oldest first) and how many there are; how many parents a
    #: waiting job still waits for.
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()
    parent_count: int = 0
    child_count: int = 0
    waiting_for: int = 0
    #: What the running task last reported with ``current().progress(...)``.
    progress: float | None = None
    progress_message: str | None = None
    progress_at: datetime | None = None
    #: Why some stored JSON of the job could not be read (nested past Python's
    #: recursion limit, as a row written by another tool can be): those fields are
    #: empty here (``{}``, ``[]`` or None) and this names them; None when all was read.
    unreadable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (datetimes as ISO 8601 strings); a listed job's without
        ``args``, ``errors`` and ``result``, which were not read."""
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if key == "detailed" or (not self.detailed and key in _DETAIL_FIELDS):
                continue
            if isinstance(value, datetime):
                out[key] = value.isoformat()
            elif isinstance(value, JobState):
                out[key] = value.value
            elif isinstance(value, tuple):
                out[key] = list(value)
            else:
                out[key] = value
        return out


# What list_jobs does not read (get_job adds them: job_details_columns).
_DETAIL_FIELDS = frozenset({"args", "errors", "result"})


@dataclass(frozen=True)
class StateCount:
    """How many jobs of a queue are in one state."""

    state: JobState
    count: int


@dataclass(frozen=True)
class QueueSnapshot:
    """One queue at one moment.

    ``ready``: queued jobs whose run_at has come; ``scheduled``: queued jobs waiting
    for their run_at (a delay or a retry backoff); ``lag``: how long the oldest
    ready job has waited past its run_at (None when nothing is ready); ``busy``:
    running jobs; ``unserved``: ``(task, ready jobs)`` of the tasks that no live
    worker of the queue runs, while some live worker serves it (those jobs wait
    until a worker whose app registers the task comes).
    """

    queue: str
    counts: tuple[StateCount, ...] = ()
    ready: int = 0
    scheduled: int = 0
    lag: timedelta | None = None
    paused: bool = False
    paused_at: datetime | None = None
    unserved: tuple[tuple[str, int], ...] = ()

    def count(self, state: JobState | str) -> int:
        wanted = JobState(state)
        return sum(c.count for c in self.counts if c.state == wanted)

    @property
    def busy(self) -> int:
        return self.count(JobState.RUNNING)

    @property
    def total(self) -> int:
        return sum(c.count for c in self.counts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "counts": {s.value: self.count(s) for s in JobState},
            "ready": self.ready,
            "scheduled": self.scheduled,
            "lag_seconds": None if self.lag is None else self.lag.total_seconds(),
            "paused": self.paused,
            "paused_at": None if self.paused_at is None else self.paused_at.isoformat(),
            "unserved_tasks": dict(self.unserved),
        }


@dataclass(frozen=True)
class WorkerSummary:
    """A registered worker: where it runs, what it serves, whether its lease holds."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    started_at: datetime
    heartbeat_at: datetime
    lease: timedelta
    alive: bool
    running: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "started_at": self.started_at.isoformat(),
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "lease_seconds": self.lease.total_seconds(),
            "alive": self.alive,
            "running": self.running,
        }


# -- pure helpers -----------------------------------------------------------------------


def _job(row: Mapping[str, Any]) -> JobSummary:
    """A JobSummary from a row of the job_summary_columns fragment (sql/queries/jobs.sql),
    with job_details_columns (get_job) or job_errors_summary (``detailed=False``, the
    lists), read by name (``dict_row``)."""
    detailed = "args" in row
    problems: list[str] = []

    def read(column: str, value: Any, *, whole: bool = False) -> Any:
        loaded, why = stored_object(value) if whole else stored_json(value)
        if why is not None:
            problems.append(f"{column}: {why}")
        return loaded

    meta = read("meta", row["meta"], whole=True)
    args = read("args", row["args"], whole=True) if detailed else {}
    stored_errors = read("errors", row["errors"]) if detailed else None
    errors = list(stored_errors) if isinstance(stored_errors, list) else []
    result = read("result", row["result"]) if detailed else None
    last_error = (errors[-1] if errors and isinstance(errors[-1], dict) else None) \
        if detailed else read("last error", row["last_error"])
    return JobSummary(
        id=int(row["id"]), queue=row["queue"], task=row["task"], state=JobState(row["state"]),
        priority=row["priority"], attempt=row["attempt"], max_attempts=row["max_attempts"],
        run_count=row["run_count"], run_at=row["run_at"], created_at=row["created_at"],
        started_at=row["started_at"], finished_at=row["finished_at"],
        limit_key=row["limit_key"], unique_key=row["unique_key"], meta=meta,
        args=args, errors=errors, result=result,
        worker_id=row["worker_id"], cancel_requested=bool(row["cancel_requested"]),
        expires_at=row["expires_at"],
        last_error=last_error if isinstance(last_error, dict) else None,
        error_count=len(errors) if detailed else int(row["error_count"]),
        detailed=detailed,
        parents=tuple(int(i) for i in row["parents"] or ()),
        children=tuple(int(i) for i in row["children"] or ()),
        parent_count=int(row["parent_count"]), child_count=int(row["child_count"]),
        waiting_for=int(row["waiting_for"]),
        progress=None if row["progress"] is None else float(row["progress"]),
        progress_message=row["progress_message"], progress_at=row["progress_at"],
        unreadable="; ".join(problems) or None,
    )


def _states(state: JobState | str | Sequence[JobState | str] | None) -> list[str] | None:
    if state is None:
        return None
    items = [state] if isinstance(state, str) else list(state)
    out = []
    for item in items:
        try:
            out.append(JobState(item).value)
        except ValueError:
            known = ", ".join(s.value for s in JobState)
            raise FilterError(f"unknown job state {item!r} (known: {known})") from None
    return out


def _filter(value: str | None, field: str, *, max_bytes: int | None = names.KEY_MAX_BYTES
            ) -> str | None:
    """A name filter: None, or a name that a job could carry (akadze.names)."""
    if value is None:
        return None
    wrong = names.problem(value, field, max_bytes=max_bytes)
    if wrong is not None:
        raise FilterError(wrong)
    return value


def _list_params(
    queue: str | None,
    state: JobState | str | Sequence[JobState | str] | None,
    task: str | None,
    meta: Mapping[str, Any] | None,
    limit: int,
) -> tuple[str, dict[str, Any]]:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise FilterError(f"limit must be between 1 and {MAX_LIMIT}, got {limit!r}")
    params = {"queue": _filter(queue, "queue"), "states": _states(state),
              "task": _filter(task, "task", max_bytes=None), "limit": limit}
    if meta is not None and not isinstance(meta, Mapping):
        raise FilterError(f"meta must be a mapping, got {type(meta).__name__}")
    if meta:
        try:  # the checks of an enqueue's meta: what no job can carry matches nothing
            params["meta"] = check_meta(meta)[1]
        except EnqueueError as exc:
            raise FilterError(f"meta filter: {exc}") from None
        return "jobs_list_meta", params
    return "jobs_list", params


def _check_id(job_id: object) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise FilterError(f"job id must be a positive integer, got {job_id!r}")
    return job_id


def _snapshots(
    counts: Sequence[Sequence[Any]],
    ready: Sequence[Sequence[Any]],
    pauses: Sequence[Sequence[Any]],
    only: str | None,
    unserved: Sequence[Sequence[Any]] = (),
) -> list[QueueSnapshot]:
    per_queue: dict[str, list[StateCount]] = {}
    unserved_by: dict[str, list[tuple[str, int]]] = {}
    for queue, task, count in unserved:
        unserved_by.setdefault(queue, []).append((str(task), int(count)))
    for queue, state, count in counts:
        per_queue.setdefault(queue, []).append(StateCount(JobState(state), int(count)))
    ready_by = {row[0]: (int(row[1]), int(row[2]), row[3]) for row in ready}
    paused = {row[0]: row[1] for row in pauses}
    queues = sorted(set(per_queue) | set(paused) | ({only} if only else set()))
    return [
        QueueSnapshot(
            queue=name,
            counts=tuple(per_queue.get(name, ())),
            ready=ready_by.get(name, (0, 0, None))[0],
            scheduled=ready_by.get(name, (0, 0, None))[1],
            lag=ready_by.get(name, (0, 0, None))[2],
            paused=name in paused,
            paused_at=paused.get(name),
            unserved=tuple(unserved_by.get(name, ())),
        )
        for name in queues
    ]


def _worker(row: Sequence[Any]) -> WorkerSummary:
    return WorkerSummary(
        id=row[0], host=row[1], pid=int(row[2]), queues=tuple(row[3] or ()),
        started_at=row[4], heartbeat_at=row[5], lease=timedelta(seconds=float(row[6])),
        alive=bool(row[7]), running=int(row[8]),
    )


# -- the reads, written once (akadze.dialog) --------------------------------------------


def _list_jobs(
    queue: str | None,
    state: JobState | str | Sequence[JobState | str] | None,
    task: str | None,
    meta: Mapping[str, Any] | None,
    limit: int,
) -> Dialog[list[JobSummary]]:
    name, params = _list_params(queue, state, task, meta, limit)
    rows = yield from dialog.rows(queries.get(name), params, row_factory=dict_row)
    return [_job(row) for row in rows]


def get_job_dialog(job_id: object) -> Dialog[JobSummary]:
    """get_job's dialog (also wait_for's last read)."""
    return _get_job(job_id)


def _get_job(job_id: object) -> Dialog[JobSummary]:
    checked = _check_id(job_id)
    row = yield from dialog.one(queries.get("job_get"), {"id": checked}, row_factory=dict_row)
    if row is None:
        raise JobNotFound(f"no job with id {checked}")
    return _job(row)


def read_snapshots(queue: str | None, now: datetime | None) -> Dialog[list[QueueSnapshot]]:
    """The snapshots of every queue, or of ``queue`` (a list of one); also metrics'."""
    params = {"queue": _filter(queue, "queue"), "now": now}
    counts = yield from dialog.rows(queries.get("queue_state_counts"), params)
    ready = yield from dialog.rows(queries.get("queue_ready"), params)
    pauses = yield from dialog.rows(queries.get("queue_pauses_list"), params)
    unserved = yield from dialog.rows(queries.get("queue_unserved_tasks"), params)
    return _snapshots(counts, ready, pauses, queue, unserved)


def read_workers(now: datetime | None) -> Dialog[list[WorkerSummary]]:
    """The registered workers; also metrics'."""
    rows = yield from dialog.rows(queries.get("workers_list"), {"now": now})
    return [_worker(row) for row in rows]


# -- async, and the sync twins ----------------------------------------------------------


async def list_jobs(
    source: Session,
    *,
    queue: str | None = None,
    state: JobState | str | Sequence[JobState | str] | None = None,
    task: str | None = None,
    meta: Mapping[str, Any] | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[JobSummary]:
    """Jobs matching every given filter, newest first. ``meta`` matches jobs whose meta
    contains it (``{"tenant": "acme"}``), on the GIN index. The jobs come without their
    arguments, result and errors (``detailed=False``; :func:`get_job` reads them), so
    that a list costs the same whatever the jobs carry. A bad filter raises
    FilterError naming it, before any statement."""
    return await dialog.read(source, _list_jobs(queue, state, task, meta, limit))


def list_jobs_sync(
    source: SyncSession,
    *,
    queue: str | None = None,
    state: JobState | str | Sequence[JobState | str] | None = None,
    task: str | None = None,
    meta: Mapping[str, Any] | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[JobSummary]:
    """The sync twin of :func:`list_jobs`."""
    return dialog.read_sync(source, _list_jobs(queue, state, task, meta, limit))


async def get_job(source: Session, job_id: int) -> JobSummary:
    """The job ``job_id`` with its arguments, errors and timings; JobNotFound if none."""
    return await dialog.read(source, _get_job(job_id))


def get_job_sync(source: SyncSession, job_id: int) -> JobSummary:
    """The sync twin of :func:`get_job`."""
    return dialog.read_sync(source, _get_job(job_id))


@overload
async def queue_snapshot(source: Session, queue: None = None, *,
                         now: datetime | None = None) -> list[QueueSnapshot]: ...
@overload
async def queue_snapshot(source: Session, queue: str, *,
                         now: datetime | None = None) -> QueueSnapshot: ...


async def queue_snapshot(
    source: Session, queue: str | None = None, *, now: datetime | None = None
) -> list[QueueSnapshot] | QueueSnapshot:
    """Counts per state, ready/scheduled, oldest-ready lag and paused flag: of every
    queue (a list, by name), or of ``queue`` (one snapshot, empty if it has no jobs)."""
    snapshots = await dialog.read(source, read_snapshots(queue, now))
    return snapshots if queue is None else snapshots[0]


@overload
def queue_snapshot_sync(source: SyncSession, queue: None = None, *,
                        now: datetime | None = None) -> list[QueueSnapshot]: ...
@overload
def queue_snapshot_sync(source: SyncSession, queue: str, *,
                        now: datetime | None = None) -> QueueSnapshot: ...


def queue_snapshot_sync(
    source: SyncSession, queue: str | None = None, *, now: datetime | None = None
) -> list[QueueSnapshot] | QueueSnapshot:
    """The sync twin of :func:`queue_snapshot`."""
    snapshots = dialog.read_sync(source, read_snapshots(queue, now))
    return snapshots if queue is None else snapshots[0]


async def list_workers(source: Session, *, now: datetime | None = None) -> list[WorkerSummary]:
    """Registered workers with their running jobs; ``alive`` is False for a worker whose
    heartbeat is older than its lease (its jobs will be rescued)."""
    return await dialog.read(source, read_workers(now))


def list_workers_sync(source: SyncSession, *, now: datetime | None = None
                      ) -> list[WorkerSummary]:
    """The sync twin of :func:`list_workers`."""
    return dialog.read_sync(source, read_workers(now))
