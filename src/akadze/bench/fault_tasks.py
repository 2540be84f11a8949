"""The app that the worker processes of ``akadze bench faults`` and ``soak`` run.

``akadze worker akadze.bench.fault_tasks:app`` (the database URL comes from the
command line). One task, ``fault.work``: it sleeps ``ms`` milliseconds (the work),
fails its first attempt when ``fail`` is set (an injected failure, to mix retries
into the load), then either returns a result naming its run (its claim token), or,
with ``tx``, writes
one row into ``akadze_fault.effects`` inside ``complete_tx()``: the row commits
together with the move to ``succeeded``, so there must be exactly one per job
whatever the faults did.
"""

from __future__ import annotations

import asyncio
import os

from ..app import Akadze
from ..worker import current
from . import queries

QUEUE = "faults"
#: A file to which each run appends "job run_count claim_token" as it starts (optional).
STARTS = os.environ.get("AKADZE_FAULT_STARTS", "")
TASK = "fault.work"

app = Akadze()
_starts_fd: list[int] = []


def _log_start(line: str) -> None:
    """Append ``line`` to the start log (one write of a few bytes: atomic, O_APPEND)."""
    if not _starts_fd:
        _starts_fd.append(os.open(STARTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    os.write(_starts_fd[0], line.encode())


@app.task(TASK, queue=QUEUE, max_attempts=25)
async def work(n: int, ms: int = 10, fail: bool = False, tx: bool = False,
               pad: str = "") -> dict[str, object] | None:
    run = current()
    if STARTS:
        # The start of each run, as in the report of issue 15: a (job, run_count) started
        # twice is a claim that a crash undid and the next claim made again.
        _log_start(f"{run.id} {run.run_count} {run.job.claim_token}\n")
    if ms:
        await asyncio.sleep(ms / 1000)
    if fail and run.attempt == 1:
        raise RuntimeError("injected failure (first attempt)")
    # the run, by its claim token (as text: a 64-bit integer does not survive JSON readers)
    token = run.job.claim_token
    result = {"rc": run.run_count, "tok": None if token is None else str(token),
              "w": run.worker_id, "pid": os.getpid()}
    if not tx:
        return result
    async with run.complete_tx(result) as conn:
        await conn.execute(queries.get("fault_record_effect"), {
            "job_id": run.id, "run_count": run.run_count, "worker": run.worker_id or "?",
            "claim_token": token})
    return None
