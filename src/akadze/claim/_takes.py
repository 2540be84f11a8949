"""The take of the windowed claim: the planned rows become running.

Two ways. A claim without transition hooks ends with :func:`take_committing`:
the locks of the limited keys it takes from, the take guarded by a recount of
those keys, and COMMIT, in one round trip. A claim with hooks (or the rest of a
claim whose committed take came back short) locks and counts first
(:func:`akadze.claim._keystate.lock_taken`), then takes (:func:`take`), and
stays in its transaction. The rules: ``docs/explanation/claim.md`` ("Locks").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from ..jobs import ClaimedJob, job_rows
from . import _planner as planner
from ._keystate import KeyState
from ._steps import Batch, Request, Step, prepared

__all__ = ["count_taken", "take", "take_committing"]


def take(request: Request, ids: Sequence[int]) -> Generator[Step, Any, list[ClaimedJob]]:
    """Take the planned rows (those still free); returned in the order of ``ids``."""
    params = {**request.params(), "ids": list(ids), "worker_id": request.worker_id,
              "need": Jsonb({})}
    jobs: list[ClaimedJob] = yield prepared("claim_take", params, rows=job_rows)
    by_id = {job.id: job for job in jobs}
    return [by_id[i] for i in ids if i in by_id]


def count_taken(request: Request, known: KeyState, got: list[ClaimedJob]) -> None:
    """The rows just taken now run, and count: every limited key taken from is
    locked by us, so its headroom is exact after taking one per row; each taken
    row adds one to its group's busy."""
    for job in got:
        key = job.limit_key
        if key is not None and key in known.room:
            known.room[key] = max(0, known.room[key] - 1)
        if request.fair:
            known.busy[key] = known.busy.get(key, 0) + 1


def take_committing(request: Request, known: KeyState, rows: Sequence[planner.Row],
                     planned: Sequence[int]) -> Generator[Step, Any, list[ClaimedJob]]:
    """The last round trip of a claim without transition hooks: the locks of the
    limited keys it takes from (claim_lock), the take, guarded (claim_take with
    `need`: it takes nothing unless every such key was locked and still has
    room for its planned rows, counted in the take's own snapshot, taken after
    the locks), and COMMIT. Returns what was taken (all planned, or nothing when
    the guard refused, or fewer when rows were held); the transaction is over."""
    want = set(planned)
    need = Counter(r.key for r in rows
                   if r.id in want and r.key is not None and r.key in known.room)
    params = {**request.params(), "ids": list(planned), "worker_id": request.worker_id,
              "need": Jsonb(dict(need))}
    take = prepared("claim_take", params, rows=job_rows)
    if not need:
        (jobs,) = yield Batch((take,), commit=True)
    else:
        _, jobs = yield Batch((prepared("claim_lock", {"keys": list(need)}), take),
                              commit=True)
    by_id = {job.id: job for job in jobs}
    return [by_id[i] for i in planned if i in by_id]
