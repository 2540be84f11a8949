"""Retention: delete finished jobs once they are old enough, in bounded batches.

- ``succeeded`` and ``cancelled`` jobs are deleted ``app.retention`` (default 7 days)
  after they finished; ``failed`` jobs are kept for ``app.failed_retention`` (default
  four times as long), for inspection and ``requeue``.
- Each statement deletes at most ``batch_size`` rows (1 000), oldest first, found on
  the ``jobs_finished_idx`` index, and commits on its own: no long transaction, no
  long lock, and the claim keeps running alongside.
- One pruner at a time across the cluster: an advisory lock taken without waiting;
  whoever does not get it returns 0 at once.
- Records of periodic fires are pruned with the jobs (after the retention, or the
  longest grace of the app's schedules if longer), except those whose job is still
  queued or running.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from . import queries

if TYPE_CHECKING:
    from .app import Akadze

__all__ = ["BATCH_SIZE", "prune", "prune_sync"]

BATCH_SIZE = 1000


def _params(app: Akadze, now: datetime, batch_size: int) -> tuple[dict[str, Any], datetime]:
    if now.tzinfo is None:
        raise ValueError("prune needs a timezone-aware now")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    graces = [getattr(s, "grace", timedelta(0)) for s in app.schedules.values()]
    fires_kept = max([app.retention, timedelta(days=1), *graces])
    params = {
        "cutoff": now - app.retention,
        "failed_cutoff": now - app.failed_retention,
        "batch": batch_size,
    }
    return params, now - fires_kept


async def prune(
    conn: psycopg.AsyncConnection[Any],
    app: Akadze,
    now: datetime,
    *,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
) -> int:
    """Delete the finished jobs past their retention; return how many. ``conn`` is an
    autocommit connection outside any transaction. Returns 0 at once when another
    process is pruning. ``max_batches`` bounds the work of one call."""
    params, fires_cutoff = _params(app, now, batch_size)
    cur = await conn.execute(queries.get("retention_try_lock"))
    row = await cur.fetchone()
    if not row or not row[0]:
        return 0
    deleted = 0
    try:
        batches = 0
        while max_batches is None or batches < max_batches:
            cur = await conn.execute(queries.get("retention_prune_batch"), params)
            deleted += cur.rowcount
            batches += 1
            if cur.rowcount < batch_size:
                break
        while True:
            cur = await conn.execute(
                queries.get("retention_prune_fires"), {"cutoff": fires_cutoff, "batch": batch_size}
            )
            if cur.rowcount < batch_size:
                break
    finally:
        if not conn.closed and not conn.broken:
            await conn.execute(queries.get("retention_unlock"))
    return deleted


def prune_sync(
    conn: psycopg.Connection[Any],
    app: Akadze,
    now: datetime,
    *,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
) -> int:
    """The sync twin of :func:`prune`."""
    params, fires_cutoff = _params(app, now, batch_size)
    row = conn.execute(queries.get("retention_try_lock")).fetchone()
    if not row or not row[0]:
        return 0
    deleted = 0
    try:
        batches = 0
        while max_batches is None or batches < max_batches:
            cur = conn.execute(queries.get("retention_prune_batch"), params)
            deleted += cur.rowcount
            batches += 1
            if cur.rowcount < batch_size:
                break
        while True:
            cur = conn.execute(
                queries.get("retention_prune_fires"), {"cutoff": fires_cutoff, "batch": batch_size}
            )
            if cur.rowcount < batch_size:
                break
    finally:
        if not conn.closed and not conn.broken:
            conn.execute(queries.get("retention_unlock"))
    return deleted
