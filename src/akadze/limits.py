"""Cluster-wide limits of limit keys: set, clear and list them.

A job opts in with ``limit_key``; a key may then carry a concurrency limit
(``max_running``: at most that many of its jobs run at once, across every
queue and worker) and a start-rate limit (``max_starts`` starts per sliding
``window``). The claim enforces them; this module only edits and reports them.

The first half of the module is a pure core (checking and merging a limit
setting); the second half is the I/O: each operation written once as a dialog
(akadze.dialog), run by an async function and its ``_sync`` twin.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import psycopg

from . import dialog, names, queries
from .dialog import Dialog
from .errors import LimitError
from .sessions import Session, SyncSession

MAX_KEY_BYTES: Final = names.KEY_MAX_BYTES  # the same bound as a job's limit_key
MAX_COUNT: Final = 2**31 - 1  # the columns are PostgreSQL integers


class _Keep(enum.Enum):
    KEEP = "keep"

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep.KEEP
"""The default of every policy argument of :func:`set_limit`: keep the stored value."""


@dataclass(frozen=True)
class LimitSummary:
    """One limit key: its policies and how much of them is in use right now.

    ``running`` counts the key's running jobs in every queue; ``starts_in_window``
    the starts recorded within the last ``window`` (0 without a rate limit).
    """

    key: str
    max_running: int | None
    max_starts: int | None
    window: timedelta | None
    running: int = 0
    starts_in_window: int = 0


@dataclass(frozen=True)
class LimitPolicy:
    """The three policy fields of a limits row."""

    max_running: int | None
    max_starts: int | None
    window: timedelta | None


# -- pure core -------------------------------------------------------------------------


def check_key(key: object) -> str:
    """The key itself, or LimitError when it cannot name a limit.

    Accepts exactly the keys a job can carry (see ``akadze.jobspec``): a non-empty
    string without NUL, at most KEY_MAX_BYTES in UTF-8.
    """
    wrong = names.problem(key, "key")
    if wrong is not None:
        raise LimitError(wrong)
    assert isinstance(key, str)
    return key


def _check_count(field: str, value: object, minimum: int) -> int | _Keep | None:
    if value is KEEP or value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(f"{field} must be an integer or None, not {type(value).__name__}")
    if value < minimum:
        raise LimitError(f"{field} must be >= {minimum}, got {value}")
    if value > MAX_COUNT:
        raise LimitError(f"{field} must be <= {MAX_COUNT}, got {value}")
    return value


#: The longest start-rate window: counting starts over a longer one reaches back past
#: the first year PostgreSQL's timestamps can hold (a window of 6 700 years was
#: stored, and every claim and listing of the key then failed).
MAX_WINDOW = timedelta(days=3_660)


def check_window(value: object) -> timedelta | _Keep | None:
    """A window as a timedelta: given as a timedelta or a number of seconds."""
    if value is KEEP or value is None:
        return value
    if isinstance(value, timedelta):
        window = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise LimitError(f"window must be a finite number of seconds, got {value}")
        try:
            window = timedelta(seconds=value)
        except OverflowError:
            raise LimitError(f"window of {value} seconds is too long") from None
    else:
        raise LimitError(
            f"window must be a timedelta or a number of seconds, not {type(value).__name__}"
        )
    if window <= timedelta(0):
        raise LimitError(f"window must be positive, got {window}")
    if window > MAX_WINDOW:
        raise LimitError(f"window must be at most {MAX_WINDOW.days} days, got {window}")
    return window


def merge_policy(
    current: LimitPolicy | None,
    *,
    max_running: object = KEEP,
    max_starts: object = KEEP,
    window: object = KEEP,
) -> LimitPolicy:
    """The policy that results from applying the given fields to ``current``.

    Omitted fields (``KEEP``) keep their current value (none, for a new key);
    ``None`` clears a field. Raises LimitError, naming the field, when a value
    is malformed or the result breaks a rule of the limits table.
    """
    running = _check_count("max_running", max_running, 0)
    starts = _check_count("max_starts", max_starts, 1)
    span = check_window(window)
    base = current or LimitPolicy(None, None, None)
    merged = LimitPolicy(
        max_running=base.max_running if running is KEEP else running,
        max_starts=base.max_starts if starts is KEEP else starts,
        window=base.window if span is KEEP else span,
    )
    if merged.max_starts is not None and merged.window is None:
        raise LimitError("max_starts needs a window (the span in which starts are counted)")
    if merged.window is not None and merged.max_starts is None:
        if starts is None:
            raise LimitError(
                "window must be cleared together with max_starts (pass window=None)"
            )
        raise LimitError("window needs max_starts (how many starts the window allows)")
    if merged.max_running is None and merged.max_starts is None:
        if current is None:
            raise LimitError("a limit needs max_running or max_starts (with a window)")
        raise LimitError(
            "this would leave the limit without max_running or max_starts; "
            "use clear_limit to remove it"
        )
    return merged


def _policy_params(
    key: str, merged: LimitPolicy, max_running: object, max_starts: object, window: object
) -> dict[str, Any]:
    return {
        "key": key,
        "max_running": merged.max_running,
        "max_starts": merged.max_starts,
        "window": merged.window,
        "set_max_running": max_running is not KEEP,
        "set_max_starts": max_starts is not KEEP,
        "set_window": window is not KEEP,
    }


def _summary(row: tuple[Any, ...]) -> LimitSummary:
    key, max_running, max_starts, window, *usage = row
    running, starts = (int(usage[0]), int(usage[1])) if usage else (0, 0)
    return LimitSummary(key, max_running, max_starts, window, running, starts)


def _refused(exc: psycopg.Error) -> LimitError:
    detail = (exc.diag.constraint_name or str(exc).splitlines()[0]) if exc.diag else str(exc)
    return LimitError(f"the limits table refused the setting ({detail})")


# -- the operations, written once (akadze.dialog) ---------------------------------------


def _set(key: object, max_running: object, max_starts: object, window: object
         ) -> Dialog[LimitSummary]:
    checked = check_key(key)
    _check_inputs(max_running, max_starts, window)
    row = yield from dialog.one(queries.get("limit_lock"), {"key": checked})
    current = LimitPolicy(*row) if row else None
    merged = merge_policy(current, max_running=max_running, max_starts=max_starts, window=window)
    params = _policy_params(checked, merged, max_running, max_starts, window)
    try:
        stored = yield from dialog.transaction(dialog.one(queries.get("limit_upsert"), params))
    except (psycopg.errors.CheckViolation, psycopg.errors.NotNullViolation) as exc:
        raise _refused(exc) from None
    assert stored is not None
    return _summary(stored)


def _clear(key: object) -> Dialog[bool]:
    checked = check_key(key)
    _check_isolation((yield from dialog.one(queries.get("limit_isolation"))))
    existed = (yield from dialog.one(queries.get("limit_delete"), {"key": checked})) is not None
    yield from dialog.execute(queries.get("limit_delete_marks"), {"key": checked})
    return existed


def read_limits(now: datetime | None) -> Dialog[list[LimitSummary]]:
    """Every limit with its use (the dialog of :func:`list_limits`; also metrics')."""
    return [_summary(row) for row in (yield from dialog.rows(queries.get("limit_list"),
                                                             {"now": now}))]


# -- async, and the sync twins ----------------------------------------------------------


async def set_limit(
    session: Session,
    key: str,
    *,
    max_running: int | _Keep | None = KEEP,
    max_starts: int | _Keep | None = KEEP,
    window: timedelta | float | _Keep | None = KEEP,
) -> LimitSummary:
    """Create or change the limit of ``key``; omitted policies keep their values.

    ``None`` clears a policy (``max_starts`` and ``window`` go together). Runs in
    the caller's transaction when ``session`` has one open, else in its own.
    Returns the stored policies (usage counts are not read here: see list_limits).
    """
    return await dialog.write(session, _set(key, max_running, max_starts, window))


def set_limit_sync(
    session: SyncSession,
    key: str,
    *,
    max_running: int | _Keep | None = KEEP,
    max_starts: int | _Keep | None = KEEP,
    window: timedelta | float | _Keep | None = KEEP,
) -> LimitSummary:
    """The sync twin of :func:`set_limit`."""
    return dialog.write_sync(session, _set(key, max_running, max_starts, window))


async def clear_limit(session: Session, key: str) -> bool:
    """Remove the limit of ``key`` and its recorded starts. True when there was one."""
    return await dialog.write(session, _clear(key))


def clear_limit_sync(session: SyncSession, key: str) -> bool:
    """The sync twin of :func:`clear_limit`."""
    return dialog.write_sync(session, _clear(key))


async def list_limits(source: Session, *, now: datetime | None = None) -> list[LimitSummary]:
    """Every limit, ordered by key, with its running jobs and starts in the window.

    ``source``: an app, an AsyncEngine, a psycopg AsyncConnection or pool, or a URL.
    """
    return await dialog.read(source, read_limits(now))


def list_limits_sync(source: SyncSession, *, now: datetime | None = None) -> list[LimitSummary]:
    """The sync twin of :func:`list_limits`."""
    return dialog.read_sync(source, read_limits(now))


def _check_isolation(row: tuple[Any, ...] | None) -> None:
    """clear_limit must see the jobs queued by the transactions its delete waited for."""
    level = row[0] if row else None
    if level != "read committed":
        raise LimitError(
            f"clear_limit needs a READ COMMITTED transaction, not {level!r}: at a stricter "
            "isolation level it cannot see the jobs of the key queued while it waited"
        )


def _check_inputs(max_running: object, max_starts: object, window: object) -> None:
    """Malformed values are refused before any statement runs."""
    _check_count("max_running", max_running, 0)
    _check_count("max_starts", max_starts, 1)
    check_window(window)
