"""Shutdown: graceful (running jobs get ``shutdown_timeout`` to finish) or forced.

The sequence, once a stop is requested and the claim loops stopped claiming:

1. wait up to ``shutdown_timeout`` for the running jobs (not at all after a second
   stop: ``state.force``);
2. give back every run still going (an async one is interrupted; a plain one's
   thread goes on, its result dropped);
3. write every pending outcome, then delete the worker's row, within a bounded
   time (what cannot be written is rescued when the lease expires).
"""

from __future__ import annotations

import asyncio
import logging

from ._flusher import OutcomeFlusher
from ._leases import LeaseKeeper
from ._runner import Runner
from ._state import WorkerState
from ._trouble import first_line

logger = logging.getLogger("akadze.worker")

#: Seconds a graceful stop spends writing the last outcomes (2 s after a forced one).
FINAL_FLUSH_TIMEOUT = 5.0
FORCED_FLUSH_TIMEOUT = 2.0


async def shut_down(
    state: WorkerState, runner: Runner, flusher: OutcomeFlusher, leases: LeaseKeeper
) -> None:
    settings = state.settings
    loop = asyncio.get_running_loop()
    if state.running and not state.force.is_set():
        deadline = loop.time() + settings.shutdown_timeout
        logger.info("worker %s: waiting up to %g s for %d running job%s",
                    settings.worker_id, settings.shutdown_timeout, len(state.running),
                    "" if len(state.running) == 1 else "s")
        while state.running and not state.force.is_set():
            left = deadline - loop.time()
            if left <= 0:
                break
            force = asyncio.ensure_future(state.force.wait())
            await asyncio.wait({*runner.tasks(), force}, timeout=left,
                               return_when=asyncio.FIRST_COMPLETED)
            force.cancel()
    unfinished = [run.job.id for run in state.running.values() if not run.recorded]
    if unfinished:
        logger.warning("worker %s: giving back %d unfinished job%s: %s", settings.worker_id,
                       len(unfinished), "" if len(unfinished) == 1 else "s",
                       ", ".join(map(str, unfinished)))
    runner.give_back_unfinished()
    interrupted = runner.interrupted_tasks()
    if interrupted:
        await asyncio.wait(interrupted, timeout=1.0)
    timeout = FORCED_FLUSH_TIMEOUT if state.force.is_set() else FINAL_FLUSH_TIMEOUT
    try:
        async with asyncio.timeout(timeout):
            while flusher.pending:
                await flusher.flush_all(raise_errors=False)
                if flusher.pending:
                    await asyncio.sleep(0.1)
            if state.registered.is_set():
                await leases.unregister()
    except Exception as exc:
        if flusher.pending:
            reason = "timed out" if isinstance(exc, TimeoutError) else first_line(exc)
            logger.error(
                "worker %s: could not write %d outcome%s before stopping (%s); those "
                "jobs will be rescued when the lease expires", settings.worker_id,
                flusher.pending, "" if flusher.pending == 1 else "s", reason)
        else:
            logger.warning("worker %s: could not unregister: %s", settings.worker_id,
                           first_line(exc))
