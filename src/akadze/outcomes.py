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
- anything else (another exception, a timeout, a result that is not JSON or that
  PostgreSQL cannot store or that is over the app's ``max_result_bytes``) is an
  error: like ``Retry()`` with the error recorded.

What is recorded is always storable: messages and tracebacks go through
:func:`akadze.storable.storable_text` (NUL and lone surrogates written as escapes),
so that one odd exception cannot keep its job's outcome, and the others written with
it, from being stored.

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
from .arguments import oversize
from .database import mask_password
from .errors import AkadzeError, UnstorableResult
from .jobs import ClaimedJob, JobState
from .storable import json_text_problem, storable_text

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
    """One row change ending a run, fenced by ``run_count``.

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
    """The JSON text of one entry of a job's ``errors``, with secrets masked and what
    PostgreSQL cannot store escaped (the kind too: a class's name can be anything)."""
    entry: dict[str, Any] = {
        "attempt": job.attempt,
        "at": at.isoformat(),
        "error": storable_text(kind)[:MESSAGE_LIMIT],
        "message": storable_text(mask_password(message))[:MESSAGE_LIMIT],
    }
    if exc is not None and exc.__traceback__ is not None:
        text = "".join(traceback.format_exception(exc))
        entry["traceback"] = storable_text(mask_password(text))[-TRACEBACK_LIMIT:]
    return json.dumps(entry, default=str)


def to_json(result: object, max_bytes: int | None = None) -> str | None:
    """The JSON text of a task's return value (None for None).

    Raises TypeError or ValueError for a value that is not JSON (including NaN and
    the infinities, which PostgreSQL's jsonb refuses, and values nested past the
    recursion limit, RecursionError), and :class:`UnstorableResult` for JSON that
    jsonb refuses (a NUL character, a lone surrogate) or over ``max_bytes``.
    """
    if result is None:
        return None
    text = json.dumps(result, allow_nan=False, separators=(",", ":"))
    problem = json_text_problem(text)
    if problem is not None:
        raise UnstorableResult(f"the result holds {problem}")
    if max_bytes is not None:
        # json.dumps escapes everything but ASCII: characters are bytes.
        too_big = oversize("the result is", len(text), max_bytes, "max_result_bytes")
        if too_big is not None:
            raise UnstorableResult(too_big)
    return text


def describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ raises must still end its run
        return f"{type(exc).__name__} (its message could not be read)"
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


def succeeded(job: ClaimedJob, result: object, at: datetime,
              max_bytes: int | None = None) -> Finish | tuple[str, str]:
    """The finish of a run that returned ``result``; or, when it cannot be stored,
    the kind and message of the error (the caller then treats it as an error)."""
    try:
        text = to_json(result, max_bytes)
    except UnstorableResult as exc:
        return "UnstorableResult", (
            f"task {job.task!r} returned a result that cannot be stored: {exc}")
    except (TypeError, ValueError, RecursionError):
        return "TypeError", (
            f"task {job.task!r} returned a value that is not JSON "
            f"({type(result).__name__}); return JSON data (dict, list, str, number, bool, None)"
        )
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
    max_result_bytes: int | None = None,
) -> tuple[Finish, str | None]:
    """The finish of one run that raised ``exc`` (or returned ``result`` when
    ``exc`` is None), and a warning to log when something was off.

    ``timeout`` is set when the run was stopped for running over the task's timeout;
    ``max_result_bytes``: the most a result may take as JSON (the app's setting).
    """
    warning: str | None = None
    if timeout is not None:
        delay, warning = retry_delay(job, custom_backoff, draw)
        message = f"task {job.task!r} ran longer than its timeout of {timeout:g} s"
        error = error_entry(job, at, "TimeoutError", message)
        return _retry_or_fail(job, delay, error), warning
    if exc is None:
        finish = succeeded(job, result, at, max_result_bytes)
        if isinstance(finish, Finish):
            return finish, None
        kind, message = finish
        delay, warning = retry_delay(job, custom_backoff, draw)
        return _retry_or_fail(job, delay, error_entry(job, at, kind, message)), warning
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


def unstorable(finish: Finish, at: datetime, refusal: str) -> Finish:
    """What to write instead of ``finish`` when the database refused to store it
    (``refusal``: what it said): the job fails, keeping the attempt its run counted,
    with the refusal recorded. Retrying the run could only end the same way, and the
    other outcomes written with it must not wait for it."""
    message = f"the outcome of the run ({finish.kind}) could not be stored: {refusal}"
    return Finish(finish.job, FAILED, JobState.FAILED,
                  error=error_entry(finish.job, at, "UnstorableOutcome", message))


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
