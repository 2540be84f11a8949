"""The akadze error hierarchy: every error akadze raises derives from AkadzeError."""

from __future__ import annotations


class AkadzeError(Exception):
    """Base class of every error raised by akadze."""


class ConfigurationError(AkadzeError):
    """Invalid settings: a bad database URL, an unknown option, a duplicate task name."""


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
    """An active (queued or running) job already holds this ``unique_key``.

    The caller's transaction stays usable: the failed insert is rolled back to a
    savepoint.
    """

    def __init__(self, unique_key: str) -> None:
        super().__init__(f"an active job already has unique_key {unique_key!r}", field="unique_key")
        self.unique_key = unique_key


class UnknownTask(EnqueueError):
    """No task of that name is registered on the app."""


class LimitError(AkadzeError):
    """A limit setting was refused; nothing was written."""


class ScheduleError(AkadzeError):
    """A periodic schedule was refused (bad cron, interval, zone or task)."""


class JobNotFound(AkadzeError):
    """No job with that id."""

    exit_code = 1  # the CLI exits 1 (a failure), not 2 (bad usage)


class InvalidJobState(AkadzeError):
    """The job is not in a state that allows the requested operation."""

    exit_code = 1  # the CLI exits 1 (a refused operation), not 2 (bad usage)


class EmbeddedServerError(AkadzeError):
    """The embedded PostgreSQL server could not be started, stopped or found."""


class WorkerError(AkadzeError):
    """The worker was misconfigured or could not run."""


class JobLost(AkadzeError):
    """A run lost its job: it was cancelled, timed out, given back or rescued after a lost
    lease, so the run's fencing token (``run_count``) no longer matches and its writes
    were discarded."""
