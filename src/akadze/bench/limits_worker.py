"""The worker side of ``akadze bench limits-busy``: the bench's task and a worker
that runs until the scenario's jobs are done, in this process or in a spawned one
(this module imports nothing of the CLI, so that a spawned process can import it)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click
import psycopg

from ..app import Akadze
from ..worker import Worker
from . import queries
from .hostcpu import own_seconds

TASK = "bench.sleep"


def app(url: str) -> Akadze:
    app = Akadze(url)

    @app.task(TASK)
    async def sleep(seconds: float) -> dict[str, float]:
        began = time.time()
        if seconds > 0:
            await asyncio.sleep(seconds)
        return {"s": began, "e": time.time()}

    return app


def one(conn: Any, name: str) -> tuple[Any, ...]:
    row = conn.execute(queries.get(name)).fetchone()
    assert row is not None
    return tuple(row)


async def run_until_done(url: str, slots: int, poll: float, total: int,
                         hand_off: bool = True) -> float:
    """A worker in this process until the scenario's jobs (``total``) are done.
    Whether they are is read on an async connection, every 0.1 s: a blocking read in
    the worker's own event loop would stall the worker being measured. Returns the
    CPU seconds the process spent from the moment the worker had started (its
    connections open, its row registered) to its last outcome: what running the jobs
    cost, without building the app and starting the worker, which a long-lived worker
    does once."""
    async with Worker(app(url), slots=slots, poll_interval=poll, lease=60,
                      hand_off=hand_off) as worker:
        began = own_seconds()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + max(60.0, total / 10)
            while True:
                cur = await conn.execute(queries.get("limits_busy_done"))
                row = await cur.fetchone()
                if row is not None and row[0]:
                    break
                if time.monotonic() > deadline:
                    raise click.ClickException(f"{total} jobs did not finish in time")
                await asyncio.sleep(0.1)
        await worker.wait_idle()
        return own_seconds() - began



def child(url: str, slots: int, poll: float, total: int, hand_off: bool = True,
          cpu: Any = None) -> None:
    """A worker process of the many-keys scenario. ``cpu``: a multiprocessing queue
    that gets the CPU seconds the process spent running the jobs (see
    :func:`run_until_done`)."""
    spent = asyncio.run(run_until_done(url, slots, poll, total, hand_off))
    if cpu is not None:
        cpu.put(spent)
