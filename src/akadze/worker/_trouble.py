"""Surviving database trouble: which errors are passing, and one log line per problem.

A database restart, a killed backend or a short outage must not end a worker. The
worker retries what failed with :func:`akadze.backoff.reconnect_delay` and reports
each problem once when it starts and once when it is over, instead of a traceback
per attempt.
"""

from __future__ import annotations

import logging

import psycopg
import psycopg_pool

from ..database import mask_password

# SQLSTATE classes of errors worth retrying as they are: connection exceptions (08),
# operator intervention (57: admin shutdown, crash shutdown, cannot connect now),
# insufficient resources (53: too many connections), and transaction rollbacks (40:
# serialization failures and deadlocks).
_TRANSIENT_CLASSES = ("08", "57", "53", "40")
# Single states outside those classes: a lock_timeout that fired (55P03) passes once the
# other transaction lets go of its lock.
_TRANSIENT_STATES = ("55P03",)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a database problem that retrying later can cure."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg_pool.PoolTimeout | OSError | TimeoutError):
        return True
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate or ""
        return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES
    return False


def first_line(exc: BaseException) -> str:
    try:
        text = str(exc).strip()
    except Exception:  # a task's exception whose __str__ raises
        text = "(its message could not be read)"
    line = text.splitlines()[0] if text else ""
    name = type(exc).__name__
    return mask_password(f"{name}: {line}" if line else name)


class Trouble:
    """Failure streaks per activity (``"claim on queue 'mail'"``, ``"heartbeat"``),
    logged once at their start and once at their end."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._streaks: dict[str, int] = {}

    def failed(self, where: str, exc: BaseException, retry_in: float) -> int:
        """Record a failure of ``where``; return how many in a row."""
        count = self._streaks.get(where, 0) + 1
        self._streaks[where] = count
        if count == 1:
            transient = is_transient(exc)
            self._logger.log(
                logging.WARNING if transient else logging.ERROR,
                "%s failed (%s); retrying in %.2f s%s",
                where,
                first_line(exc),
                retry_in,
                "" if transient else " (not a connection problem: check the schema and code)",
                extra={"problem": where},
                exc_info=None if transient else exc,
            )
        else:
            self._logger.debug("%s failed again (%d in a row): %s", where, count,
                               first_line(exc))
        return count

    def recovered(self, where: str) -> None:
        count = self._streaks.pop(where, 0)
        if count:
            self._logger.info("%s works again after %d failed attempt%s", where, count,
                              "" if count == 1 else "s", extra={"problem": where})

    def failures(self, where: str) -> int:
        return self._streaks.get(where, 0)
