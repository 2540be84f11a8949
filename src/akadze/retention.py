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
from typing import Any

import psycopg

from . import dialog, queries
from .app import Akadze
from .dialog import Dialog

__all__ = ["BATCH_SIZE", "prune", "prune_sync"]

BATCH_SIZE = 1000


def _params(app: Akadze, now: datetime, batch_size: int) -> tuple[dict[str, Any], datetime]:
    if now.tzinfo is None:
        raise ValueError("prune needs a timezone-aware now")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    graces = [s.grace for s in app.schedules.values()]
    fires_kept = max([app.retention, timedelta(days=1), *graces])
    params = {
        "cutoff": now - app.retention,
        "failed_cutoff": now - app.failed_retention,
        "batch": batch_size,
    }
    return params, now - fires_kept


def _prune(app: Akadze, now: datetime, batch_size: int, max_batches: int | None
           ) -> Dialog[int]:
    """Both prunes, written once (akadze.dialog); every statement commits on its own."""
    params, fires_cutoff = _params(app, now, batch_size)
    # Every batch commits on its own and takes the pruners' lock for itself
    # (retention_prune_batch): a batch that finds another pruner at work deletes
    # nothing, which ends this prune as an empty batch does.
    deleted = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        count = yield from dialog.rowcount(queries.get("retention_prune_batch"), params)
        deleted += count
        batches += 1
        if count < batch_size:
            break
    fires = {"cutoff": fires_cutoff, "batch": batch_size}
    while (yield from dialog.rowcount(queries.get("retention_prune_fires"), fires)
           ) >= batch_size:
        pass
    return deleted


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
    return await dialog.run_async(conn, _prune(app, now, batch_size, max_batches))


def prune_sync(
    conn: psycopg.Connection[Any],
    app: Akadze,
    now: datetime,
    *,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
) -> int:
    """The sync twin of :func:`prune`."""
    return dialog.run_sync(conn, _prune(app, now, batch_size, max_batches))
