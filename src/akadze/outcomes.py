"""Outcomes of a run: what a task may raise, and how a run's end becomes a row change.

A task ends in one of these ways:

- it returns: the job ``succeeded`` and a JSON-serialisable return value is stored
  in ``result``;
- it raises :class:`Retry`: an attempt is spent and the job runs again after
  ``delay`` (default: the backoff), or ``failed`` when attempts are used up;
- it raises :class:`Snooze`: the job runs again after ``delay`` and no attempt is
  spent;
- it raises :class:`Fail`: straight to ``failed``;
- it raises :class:`Cancel`: straight to ``cancelled``;
- anything else (another exception, a timeout, a result that is not JSON) is an
  error: like ``Retry()`` with the error recorded.

:func:`decide` turns one run's end into a :class:`Finish`, the change to write.
Nothing here does I/O (plain data in, plain data out): the worker writes many
finishes per statement (``akadze.worker._finishes``, ``worker.sql``).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from . import backoff
from .database import mask_password
from .errors import AkadzeError
from .jobs import ClaimedJob, JobState

#: How much of a message and of a traceback is kept in the job's ``errors``.
MESSAGE_LIMIT = 2_000
TRACEBACK_LIMIT = 8_000


class TaskOutcome(AkadzeError):
    """Base class of the outcomes a task may raise to end its run."""


class Retry(TaskOutcome):
    """Run the job again, spending an attempt; after ``delay`` (a timedelta or
    seconds), or the task's backoff when ``delay`` is None. When no attempts are
    left the job ends ``failed``."""

    def __init__(self, delay: timedelta | float | None = None, reason: str = "") -> None:
        super().__init__(reason or "retry requested")
        if delay is not None:
            backoff.to_seconds(delay)  # TypeError now, not in the worker
        self.delay = delay
        self.reason = reason


class Snooze(TaskOutcome):
    """Run the job again after ``delay`` without spending an attempt."""

    def __init__(self, delay: timedelta | float) -> None:
        super().__init__(f"snoozed for {delay}")
        backoff.to_seconds(delay)
        self.delay = delay


class Fail(TaskOutcome):
    """End the job ``failed`` now, whatever attempts are left."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "failed by the task")
        self.reason = reason


class Cancel(TaskOutcome):
    """End the job ``cancelled`` now."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "cancelled by the task")
        self.reason = reason


#: Kinds of finish, as counted by the worker and ``testing.drain``.
SUCCEEDED, RETRIED, SNOOZED, FAILED, CANCELLED, GIVEN_BACK = (
    "succeeded",
    "retried",
    "snoozed",
    "failed",
    "cancelled",
    "given_back",
)


@dataclass(slots=True)
class Finish:
    """One row change ending a run, fenced by the run's claim token.

    ``delay`` (seconds from now) sets a new ``run_at``; None keeps the old one (a
    give-back keeps the job's place). ``attempt_delta`` is -1 when the run does not
    count (snooze, give-back). ``result`` and ``error`` are JSON texts.
    """

    job: ClaimedJob
    kind: str
    state: JobState
    attempt_delta: int = 0
    delay: float | None = None
    result: str | None = None
    error: str | None = None

    @property
    def from_state(self) -> JobState:
        return JobState.RUNNING


def error_entry(
    job: ClaimedJob,
    at: datetime,
    kind: str,
    message: str,
    exc: BaseException | None = None,
) -> str:
    """The JSON text of one entry of a job's ``errors``, with secrets masked."""
    entry: dict[str, Any] = {
        "attempt": job.attempt,
        "at": at.isoformat(),
        "error": kind,
        "message": mask_password(message)[:MESSAGE_LIMIT],
    }
    if exc is not None and exc.__traceback__ is not None:
        text = "".join(traceback.format_exception(exc))
        entry["traceback"] = mask_password(text)[-TRACEBACK_LIMIT:]
    return json.dumps(entry, default=str)


def to_json(result: object) -> str | None:
    """The JSON text of a task's return value (None for None).

    Raises TypeError or ValueError for a value that is not JSON (including NaN and
    the infinities, which PostgreSQL's jsonb refuses).
    """
    if result is None:
        return None
    text = json.dumps(result, allow_nan=False, separators=(",", ":"))
    if "\\u0000" in text:
        raise ValueError("a JSON result cannot contain the NUL character")
    return text


def describe(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


def retry_delay(
    job: ClaimedJob,
    custom: Callable[[int], timedelta] | None,
    draw: float,
) -> tuple[float, str | None]:
    """Seconds before the next run after run ``job.attempt`` failed; with a warning
    when the task's own backoff function misbehaved (the default is used then)."""
    if custom is None:
        return backoff.default_delay(job.attempt, draw), None
    try:
        return backoff.to_seconds(custom(job.attempt)), None
    except Exception as exc:
        problem = f"backoff of task {job.task!r} failed ({type(exc).__name__}: {exc}); "
        return backoff.default_delay(job.attempt, draw), problem + "used the default"


def _retry_or_fail(
    job: ClaimedJob, delay: float, error: str
) -> Finish:
    if job.attempt >= job.max_attempts:
        return Finish(job, FAILED, JobState.FAILED, error=error)
    return Finish(job, RETRIED, JobState.QUEUED, delay=delay, error=error)


def succeeded(job: ClaimedJob, result: object, at: datetime) -> Finish | None:
    """The finish of a run that returned ``result``; None when it is not JSON (the
    caller then treats it as an error)."""
    try:
        text = to_json(result)
    except (TypeError, ValueError, RecursionError):
        return None
    return Finish(job, SUCCEEDED, JobState.SUCCEEDED, result=text)


def decide(
    job: ClaimedJob,
    exc: BaseException | None,
    result: object,
    *,
    at: datetime,
    draw: float,
    custom_backoff: Callable[[int], timedelta] | None = None,
    timeout: float | None = None,
) -> tuple[Finish, str | None]:
    """The finish of one run that raised ``exc`` (or returned ``result`` when
    ``exc`` is None), and a warning to log when something was off.

    ``timeout`` is set when the run was stopped for running over the task's timeout.
    """
    warning: str | None = None
    if timeout is not None:
        delay, warning = retry_delay(job, custom_backoff, draw)
        message = f"task {job.task!r} ran longer than its timeout of {timeout:g} s"
        error = error_entry(job, at, "TimeoutError", message)
        return _retry_or_fail(job, delay, error), warning
    if exc is None:
        finish = succeeded(job, result, at)
        if finish is not None:
            return finish, None
        delay, warning = retry_delay(job, custom_backoff, draw)
        message = (
            f"task {job.task!r} returned a value that is not JSON "
            f"({type(result).__name__}); return JSON data (dict, list, str, number, bool, None)"
        )
        return _retry_or_fail(job, delay, error_entry(job, at, "TypeError", message)), warning
    if isinstance(exc, Snooze):
        return Finish(
            job, SNOOZED, JobState.QUEUED, attempt_delta=-1, delay=backoff.to_seconds(exc.delay)
        ), None
    if isinstance(exc, Fail):
        return Finish(
            job, FAILED, JobState.FAILED, error=error_entry(job, at, "Fail", describe(exc))
        ), None
    if isinstance(exc, Cancel):
        return Finish(
            job, CANCELLED, JobState.CANCELLED, error=error_entry(job, at, "Cancel", describe(exc))
        ), None
    if isinstance(exc, Retry):
        if exc.delay is not None:
            delay = backoff.to_seconds(exc.delay)
        else:
            delay, warning = retry_delay(job, custom_backoff, draw)
        return _retry_or_fail(job, delay, error_entry(job, at, "Retry", describe(exc))), warning
    delay, warning = retry_delay(job, custom_backoff, draw)
    error = error_entry(job, at, type(exc).__name__, describe(exc), exc)
    return _retry_or_fail(job, delay, error), warning


def invalid_args(job: ClaimedJob, at: datetime, message: str) -> Finish:
    """Stored arguments that no longer validate: retrying cannot help."""
    return Finish(
        job, FAILED, JobState.FAILED, error=error_entry(job, at, "InvalidArguments", message)
    )


def cancelled(job: ClaimedJob, at: datetime, message: str) -> Finish:
    """A run stopped because cancellation was requested."""
    return Finish(
        job, CANCELLED, JobState.CANCELLED, error=error_entry(job, at, "Cancelled", message)
    )


#: How often a job may be given back at one attempt without spending it. A job that
#: runs longer than the workers' shutdown timeout is given back at every restart: the
#: next give-back spends the attempt (and fails the job on its last one).
GIVE_BACKS_PER_ATTEMPT = 3


def given_back(job: ClaimedJob, at: datetime | None = None, reason: str | None = None) -> Finish:
    """A run handed back unfinished: queued again, keeping its place (run_at) and its
    attempt. A run that had started (``at`` and ``reason`` given: shutdown, self-fencing)
    is recorded in the job's errors as ``GivenBack`` and counts toward
    GIVE_BACKS_PER_ATTEMPT; a claimed job that never started (None) leaves no trace."""
    if at is None or reason is None:
        return Finish(job, GIVEN_BACK, JobState.QUEUED, attempt_delta=-1)
    return Finish(job, GIVEN_BACK, JobState.QUEUED, attempt_delta=-1,
                  error=error_entry(job, at, "GivenBack", f"given back unfinished: {reason}"))
