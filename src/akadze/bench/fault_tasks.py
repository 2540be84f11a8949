"""The app that the worker processes of ``akadze bench faults`` and ``soak`` run.

``akadze worker akadze.bench.fault_tasks:app`` (the database URL comes from the
command line). One task, ``fault.work``: it sleeps ``ms`` milliseconds (the work),
fails its first attempt when ``fail`` is set (an injected failure, to mix retries
into the load), then either returns a result naming its run, or, with ``tx``, writes
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
TASK = "fault.work"

app = Akadze()


@app.task(TASK, queue=QUEUE, max_attempts=25)
async def work(n: int, ms: int = 10, fail: bool = False, tx: bool = False,
               pad: str = "") -> dict[str, object] | None:
    run = current()
    if ms:
        await asyncio.sleep(ms / 1000)
    if fail and run.attempt == 1:
        raise RuntimeError("injected failure (first attempt)")
    result = {"rc": run.run_count, "w": run.worker_id, "pid": os.getpid()}
    if not tx:
        return result
    async with run.complete_tx(result) as conn:
        await conn.execute(queries.get("fault_record_effect"), {
            "job_id": run.id, "run_count": run.run_count, "worker": run.worker_id or "?"})
    return None
