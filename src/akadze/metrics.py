"""Prometheus metrics: the state of the cluster in the text exposition format.

Everything is read from the database at scrape time, so any process (the ``akadze
metrics`` command, a web app) reports the whole cluster, not just itself:

==========================================  =======  ======================================
metric                                      type     labels
==========================================  =======  ======================================
``akadze_jobs``                             gauge    queue, state
``akadze_queue_ready_jobs``                 gauge    queue (queued, run_at reached)
``akadze_queue_scheduled_jobs``             gauge    queue (queued, waiting for run_at)
``akadze_queue_oldest_ready_lag_seconds``   gauge    queue
``akadze_queue_paused``                     gauge    queue (1 paused, 0 not)
``akadze_queue_unserved_ready_jobs``        gauge    queue, task (no live worker runs it)
``akadze_jobs_finished_recent``             gauge    queue, state (last ``window`` seconds)
``akadze_limit_running_jobs``               gauge    key
``akadze_limit_max_running``                gauge    key (keys with a concurrency limit)
``akadze_limit_starts_in_window``           gauge    key (keys with a start-rate limit)
``akadze_limit_max_starts``                 gauge    key (starts allowed per window)
``akadze_limit_window_seconds``             gauge    key (the window of ``max_starts``)
``akadze_job_progress``                     gauge    job_id, queue, task (running, reported)
``akadze_workers``                          gauge    alive ("true"/"false")
``akadze_worker_running_jobs``              gauge    worker, host
==========================================  =======  ======================================

Throughput is a gauge over a sliding window (``window``, 60 s by default) rather than a
counter: finished jobs are pruned by retention, so a count derived from the table
would go down. ``rate()`` is not needed: divide by the window.

:class:`CachedExposition` is what a server of the text uses (``akadze metrics
--serve``): one connection kept open, the text read at most once a second however
many scrapes ask.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from . import database, dialog, queries
from .clock import SYSTEM_CLOCK, Clock
from .dialog import Dialog
from .errors import AkadzeError, DatabaseUnavailable
from .jobs import JobState
from .limits import LimitSummary, read_limits
from .overview import QueueSnapshot, WorkerSummary, read_snapshots, read_workers
from .sessions import Session, SyncSession

__all__ = ["CONTENT_TYPE", "DEFAULT_WINDOW", "CachedExposition", "exposition", "render",
           "render_sync"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_WINDOW = 60
#: How long a read exposition is served again (seconds): scrapes more often than this,
#: from any number of Prometheus servers, cost the database nothing more.
DEFAULT_MAX_AGE = 1.0
CONNECT_TIMEOUT = 5  # seconds to reach the server before a scrape is answered 503


@dataclass(frozen=True)
class KeyUsage:
    key: str
    running: int
    max_running: int | None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items())
    return "{" + inner + "}"


def _number(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]],
               kind: str = "gauge") -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def exposition(
    snapshots: Sequence[QueueSnapshot],
    finished: Sequence[tuple[str, str, int]],
    keys: Sequence[KeyUsage],
    workers: Sequence[WorkerSummary],
    *,
    window: int = DEFAULT_WINDOW,
    limits: Sequence[LimitSummary] = (),
    progress: Sequence[tuple[int, str, str, float]] = (),
) -> str:
    """The exposition text of already-read data (pure)."""
    out = _Writer()
    out.family(
        "akadze_jobs", "Jobs by queue and state.",
        ((({"queue": s.queue, "state": state.value}), s.count(state))
         for s in snapshots for state in JobState),
    )
    out.family("akadze_queue_ready_jobs", "Queued jobs whose run_at has come.",
               (({"queue": s.queue}, s.ready) for s in snapshots))
    out.family("akadze_queue_scheduled_jobs", "Queued jobs waiting for their run_at.",
               (({"queue": s.queue}, s.scheduled) for s in snapshots))
    out.family(
        "akadze_queue_oldest_ready_lag_seconds",
        "How long the oldest ready job has waited past its run_at (0 when none is ready).",
        (({"queue": s.queue}, s.lag.total_seconds() if s.lag else 0) for s in snapshots),
    )
    out.family("akadze_queue_paused", "1 when the queue is paused cluster-wide.",
               (({"queue": s.queue}, 1 if s.paused else 0) for s in snapshots))
    out.family(
        "akadze_queue_unserved_ready_jobs",
        "Ready jobs of a task that no live worker of the queue runs (they wait for one).",
        (({"queue": s.queue, "task": task}, count)
         for s in snapshots for task, count in s.unserved),
    )
    finished_by = {(queue, state): count for queue, state, count in finished}
    queues = sorted({s.queue for s in snapshots} | {q for q, _ in finished_by})
    out.family(
        "akadze_jobs_finished_recent",
        f"Jobs that finished in the last {window} seconds, by queue and final state.",
        (({"queue": q, "state": state.value}, finished_by.get((q, state.value), 0))
         for q in queues for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)),
    )
    out.family("akadze_limit_running_jobs", "Running jobs per limit key.",
               (({"key": k.key}, k.running) for k in keys))
    out.family("akadze_limit_max_running", "The concurrency limit of a limit key.",
               (({"key": k.key}, k.max_running) for k in keys if k.max_running is not None))
    rated = [limit for limit in limits if limit.max_starts is not None and limit.window]
    out.family("akadze_limit_starts_in_window",
               "Starts recorded within the sliding window of a key's start-rate limit.",
               (({"key": r.key}, r.starts_in_window) for r in rated))
    out.family("akadze_limit_max_starts", "The starts a key's start-rate limit allows per window.",
               (({"key": r.key}, r.max_starts or 0) for r in rated))
    out.family("akadze_limit_window_seconds", "The window of a key's start-rate limit.",
               (({"key": r.key}, r.window.total_seconds() if r.window else 0) for r in rated))
    out.family("akadze_job_progress",
               "The progress a running job last reported (current().progress), 0 to 1.",
               (({"job_id": str(job_id), "queue": queue, "task": task}, fraction)
                for job_id, queue, task, fraction in progress))
    alive = sum(1 for w in workers if w.alive)
    out.family("akadze_workers", "Registered workers, by whether their lease holds.",
               [({"alive": "true"}, alive), ({"alive": "false"}, len(workers) - alive)])
    out.family("akadze_worker_running_jobs", "Jobs running on each worker.",
               (({"worker": w.id, "host": w.host}, w.running) for w in workers))
    return out.text()


def _keys(rows: Sequence[Sequence[Any]]) -> list[KeyUsage]:
    return [KeyUsage(str(r[0]), int(r[1]), None if r[2] is None else int(r[2])) for r in rows]


def _finished(rows: Sequence[Sequence[Any]]) -> list[tuple[str, str, int]]:
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


def _render(now: datetime | None, window: int) -> Dialog[str]:
    """Read the cluster's state and make the exposition text: one dialog for both APIs."""
    params = {"now": now, "window": window}
    snapshots = yield from read_snapshots(None, now)
    finished = _finished((yield from dialog.rows(queries.get("metrics_finished_recent"), params)))
    keys = _keys((yield from dialog.rows(queries.get("metrics_running_by_key"), params)))
    workers = yield from read_workers(now)
    limits = yield from read_limits(now)
    progress = [(int(r[0]), str(r[1]), str(r[2]), float(r[3]))
                for r in (yield from dialog.rows(queries.get("metrics_progress")))]
    return exposition(snapshots, finished, keys, workers, window=window, limits=limits,
                      progress=progress)


async def render(source: Session, *, now: datetime | None = None,
                 window: int = DEFAULT_WINDOW) -> str:
    """Read the cluster's state from ``source`` and return the exposition text."""
    return await dialog.read(source, _render(now, window))


def render_sync(source: SyncSession, *, now: datetime | None = None,
                window: int = DEFAULT_WINDOW) -> str:
    """The sync twin of :func:`render`."""
    return dialog.read_sync(source, _render(now, window))


class CachedExposition:
    """The exposition text of the database at ``url``, read over one connection kept
    open (opened again after a failure) at most once per ``max_age`` seconds: the
    scrapes in between get the same text, and concurrent scrapes wait for one read.

    A failure is kept as long as a text, so a database that is down is tried once
    per ``max_age``, not once per scrape. :meth:`text` raises it as an AkadzeError
    whose message is masked and one line (DatabaseUnavailable when the server could
    not be reached or the connection broke).
    """

    def __init__(self, url: str, *, window: int = DEFAULT_WINDOW,
                 max_age: float = DEFAULT_MAX_AGE, clock: Clock = SYSTEM_CLOCK) -> None:
        self.url = url
        self.window = window
        self.max_age = max_age
        self.clock = clock
        self.reads = 0  # how many times the database was read (or tried)
        self._lock = asyncio.Lock()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._at: float | None = None
        self._text = ""
        self._failure: AkadzeError | None = None

    async def text(self) -> str:
        """The text, read now when the last one is older than ``max_age``."""
        async with self._lock:
            if self._at is None or self.clock.monotonic() - self._at >= self.max_age:
                await self._read()
            if self._failure is not None:
                raise type(self._failure)(str(self._failure))
            return self._text

    async def _read(self) -> None:
        self.reads += 1
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await database.connect_async(self.url,
                                                          connect_timeout=CONNECT_TIMEOUT)
                await self._conn.execute(queries.get("metrics_session"))
            self._text = await render(self._conn, window=self.window)
            self._failure = None
        except (AkadzeError, psycopg.Error) as exc:
            await self.close()
            self._failure = _failure(exc)
        self._at = self.clock.monotonic()

    async def close(self) -> None:
        """Close the connection (the next read opens another)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def _failure(exc: Exception) -> AkadzeError:
    if isinstance(exc, AkadzeError):
        return exc
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    message = database.mask_password(f"reading the metrics failed: {first}")
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(message)
    return AkadzeError(message)
