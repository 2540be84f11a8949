"""The akadze error hierarchy: every error akadze raises derives from AkadzeError.

Every error class akadze defines lives here. An error says what went wrong, not how a
program reports it: the command line chooses its exit code from the class (see
``akadze.cli`` and ``docs/reference/cli.md``).
"""

from __future__ import annotations


class AkadzeError(Exception):
    """Base class of every error raised by akadze."""


class ConfigurationError(AkadzeError):
    """Invalid settings: a bad database URL, an unknown option, a duplicate task name."""


class DatabaseUnavailable(ConfigurationError):
    """The database server could not be reached with the given URL: it is down, the
    host or port is wrong, or it refused the login. A ConfigurationError too (the URL
    may be what is wrong), but a failure rather than bad usage for the command line."""


class AsyncHookError(ConfigurationError):
    """An async hook (``async def``, or a hook returning an awaitable) met a sync path:
    a ``_sync`` function, a sync claim, a plain task's own transaction. Nothing it
    would have written is kept."""


class MigrationError(AkadzeError):
    """The schema could not be migrated, or is not at the version this code expects."""


class EnqueueError(AkadzeError):
    """A job was refused at enqueue; nothing was inserted.

    ``field`` names the offending argument or option when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class DuplicateJob(EnqueueError):
    """Another job holds this ``unique_key``: one not finished, or one finished within
    the enqueue's ``unique_for`` (``job_id``: that job, None when it is an earlier item
    of the same ``enqueue_many``).

    The caller's transaction stays usable: the refused enqueue is rolled back to a
    savepoint.
    """

    def __init__(self, unique_key: str, job_id: int | None = None) -> None:
        held = "an earlier item of this call" if job_id is None else f"job {job_id}"
        super().__init__(f"unique_key {unique_key!r} is held by {held}", field="unique_key")
        self.unique_key = unique_key
        self.job_id = job_id


class UnknownTask(EnqueueError):
    """No task of that name is registered on the app."""


class LimitError(AkadzeError):
    """A limit setting was refused; nothing was written."""


class ScheduleError(AkadzeError):
    """A periodic schedule was refused (bad cron, interval, zone or task)."""


class FilterError(AkadzeError):
    """A filter of ``list_jobs`` (or a job id of ``get_job``) was refused."""


class JobNotFound(AkadzeError):
    """No job with that id."""


class InvalidJobState(AkadzeError):
    """The job is not in a state that allows the requested operation."""


class EmbeddedServerError(AkadzeError):
    """The embedded PostgreSQL server could not be started, stopped or found."""


class WorkerError(AkadzeError):
    """The worker was misconfigured or could not run."""


class UnstorableResult(AkadzeError, ValueError):
    """A task's result is JSON that PostgreSQL cannot store (a NUL character, a lone
    surrogate) or is over the app's ``max_result_bytes``; the message says which. A
    ValueError too, as json.dumps's own refusals of what is not JSON."""


class JobLost(AkadzeError):
    """A run lost its job: it was cancelled, timed out, given back or rescued after a lost
    lease, so the run's fencing token (``run_count``) no longer matches and its writes
    were discarded."""
