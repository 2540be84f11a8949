"""Awaiting a job's outcome: ``await wait_for(source, job_id, timeout=...)`` and
``wait_for_sync``, which return the job's summary once it has succeeded, failed or been
cancelled, and raise ``TimeoutError`` when the timeout passes first.

The waiter marks the job ``awaited`` (one row update) and LISTENs on ``akadze_done``;
the job's terminal write notifies that channel in its own transaction, through the
trigger of migration 0012, only because the mark is set: jobs nobody waits for notify
nothing and cost their outcome writes nothing more. The waiter re-reads the state at
each notification of its job and, as a fallback (a lost notification, a connection that
cannot LISTEN), every ``poll_interval`` seconds.

``source`` is what the operations take (the app, a URL, a psycopg connection or pool,
a SQLAlchemy engine or connection). For the app or a URL, the waits of a process share
one connection per database (akadze.waiters): a thousand waiters hold one connection,
their marks and polls are one statement each. A connection given in autocommit mode
outside a transaction listens itself; any other (a transaction of the caller's, an
engine's or a pool's connection, not in autocommit mode) is polled, without the mark,
so that no lock of the caller's transaction holds the job's outcome back. For those,
the pair is two thin calls of one dialog (akadze.dialog); for the shared connection,
of one waiter (akadze.waiters).
"""

from __future__ import annotations

import math
import time
from datetime import timedelta

from . import dialog, queries, waiters
from .dialog import Dialog
from .errors import ConfigurationError, JobNotFound
from .jobs import check_job_id
from .overview import JobSummary, get_job_dialog
from .sessions import Session, SyncSession, url_source

__all__ = ["wait_for", "wait_for_sync"]

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
DEFAULT_POLL = 1.0


def _seconds(value: object, name: str, *, none: bool) -> float | None:
    if value is None and none:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds or a "
                                 f"timedelta{' (or None)' if none else ''}, got {value!r}")
    return float(value)


def _checked(job_id: object, timeout: object, poll_interval: object
             ) -> tuple[int, float | None, float]:
    checked = check_job_id(job_id)
    limit = _seconds(timeout, "timeout", none=True)
    poll = _seconds(poll_interval, "poll_interval", none=False)
    assert poll is not None
    return checked, limit, poll


def _wait(job_id: object, timeout: object, poll_interval: object) -> Dialog[JobSummary]:
    checked, limit, poll = _checked(job_id, timeout, poll_interval)
    deadline = None if limit is None else time.monotonic() + limit
    listening = yield from dialog.idle()
    if listening:
        yield from dialog.execute(queries.get("wait_listen"))
    try:
        row = yield from dialog.one(queries.get("wait_mark" if listening else "wait_state"),
                                    {"id": checked})
        if row is None:
            raise JobNotFound(f"no job with id {checked}")
        state = str(row[0])
        while state not in TERMINAL:
            remaining = poll if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"job {checked} is still {state} after {limit:g} s")
            payloads = yield from dialog.wait(min(poll, remaining), listening=listening)
            if listening and payloads and str(checked) not in payloads:
                continue  # another awaited job finished
            row = yield from dialog.one(queries.get("wait_state"), {"id": checked})
            if row is None:
                raise JobNotFound(f"job {checked} was deleted while awaited")
            state = str(row[0])
    finally:
        if listening and (yield from dialog.usable()):
            yield from dialog.execute(queries.get("wait_unlisten"))
    return (yield from get_job_dialog(checked))


async def wait_for(source: Session, job_id: int, *,
                   timeout: float | timedelta | None = None,  # noqa: ASYNC109 - the API's name
                   poll_interval: float | timedelta = DEFAULT_POLL) -> JobSummary:
    """The summary of job ``job_id`` once it has succeeded, failed or been cancelled.
    Raises TimeoutError when ``timeout`` (seconds or a timedelta; None: no limit)
    passes first, JobNotFound for an unknown id."""
    url = url_source(source)
    if url is not None:
        return await waiters.wait(url, *_checked(job_id, timeout, poll_interval))
    return await dialog.read(source, _wait(job_id, timeout, poll_interval))


def wait_for_sync(source: SyncSession, job_id: int, *,
                  timeout: float | timedelta | None = None,
                  poll_interval: float | timedelta = DEFAULT_POLL) -> JobSummary:
    """The sync twin of :func:`wait_for`."""
    url = url_source(source)
    if url is not None:
        return waiters.wait_sync(url, *_checked(job_id, timeout, poll_interval))
    return dialog.read_sync(source, _wait(job_id, timeout, poll_interval))
