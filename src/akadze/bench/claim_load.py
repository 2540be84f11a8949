"""The load test of ``akadze bench claims``: concurrent claimer processes under limits.

20 000 jobs (by default), half over 20 keys with max_running = 5, half without a
key. Each claimer is a process with its own connection: claim up to 20, hold
them ~10 ms (side by side, like a worker's slots), complete them with a fenced
UPDATE, until every job is done or its time is up. Meanwhile another connection
samples the running counts continuously (one snapshot per sample), and a
deferred constraint trigger checks every claim commit (the shared watch:
``watch_install`` in ``bench/sql/watch.sql`` explains why it sees every moment a
key could be over).
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from dataclasses import dataclass, field
from typing import Any

import click
import psycopg

from ..claim import claim
from ..database import connect
from . import queries
from .claim_scenarios import BASE, SLOTS

Conn = psycopg.Connection[Any]

LOAD_QUEUE = "load"


# -- load test --------------------------------------------------------------------------


@dataclass
class LoadResult:
    order: str
    jobs: int
    claimers: int
    seconds: float
    claimed: int = 0
    completed: int = 0
    claimed_twice: int = 0
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    samples: int = 0
    sampled_over: int = 0
    trigger_over: int = 0
    max_over: int = 0
    completed_in_db: int = 0


def build_load(conn: Conn, jobs: int) -> None:
    """Half the jobs over 20 keys with max_running = 5, half without a key, alternating."""
    conn.execute(queries.get("bench_reset"))
    # Limits first, as an application sets them: the keyed jobs are then flagged
    # limited, as enqueue flags them (migration 0005).
    conn.execute(queries.get("bench_insert_limits"),
                 {"prefix": "k", "keys": 20, "max_running": 5})
    conn.execute(queries.get("bench_insert_load"),
                 {"queue": LOAD_QUEUE, "base": BASE, "jobs": jobs, "keys": 20})
    conn.execute("VACUUM (ANALYZE) akadze.jobs, akadze.limits")


def load_claimer(url: str, number: int, fair: bool, seconds: float, hold: float,
                 events: tuple[Any, Any], ready: Any, out: Any, pooled: bool = False) -> None:
    """One claimer process: claim up to 20, hold them, complete; until stopped.
    ``pooled``: ``url`` is a pooler's in transaction mode (no prepared statements)."""
    go, stop = events
    claimed = completed = 0
    errors: list[str] = []
    extra: dict[str, Any] = {"prepare_threshold": None} if pooled else {}
    conn: Conn | None = psycopg.connect(url, autocommit=True, **extra)
    ready.put(number)
    go.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(url, autocommit=True, **extra)
            got = claim(conn, queue=LOAD_QUEUE, slots=SLOTS, fair=fair,
                        worker_id=f"load-{number}")
            if not got:
                stop.wait(0.005)  # nothing claimable right now: poll again shortly
                continue
            claimed += len(got)
            time.sleep(hold)  # the jobs "run" side by side, as in a worker's slots
            cur = conn.execute(queries.get("bench_load_complete"), {
                "ids": [j.id for j in got], "run_counts": [j.run_count for j in got]})
            completed += cur.rowcount
        except psycopg.Error as exc:
            errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
            if conn is not None and conn.broken:
                conn = None
    if conn is not None:
        conn.close()
    out.put((claimed, completed, errors))


# How long a claimer process may take to start (spawn, import, connect) or to
# report: generous, for a shared machine where a spawn takes tens of seconds.
CLAIMER_PATIENCE = 300.0


def _get(channel: Any, what: str) -> Any:
    try:
        return channel.get(timeout=CLAIMER_PATIENCE)
    except queue.Empty:
        raise click.ClickException(
            f"load test: a claimer process did not {what} within "
            f"{CLAIMER_PATIENCE:.0f} s") from None


def run_load(url: str, order: str, *, jobs: int, claimers: int, seconds: float,
             hold: float = 0.010, claimers_url: str | None = None) -> LoadResult:
    """Run the load test in the (scratch) database at ``url``; it is emptied first.
    ``claimers_url``: the claimers' way to it, a pooler in transaction mode (the
    sampler and the checks stay on ``url``)."""
    result = LoadResult(order, jobs, claimers, seconds)
    with connect(url) as conn:
        build_load(conn, jobs)
        conn.execute(queries.get("watch_install"))
    ctx = multiprocessing.get_context("spawn")
    go, stop, ready, out = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=load_claimer, daemon=True,
                         args=(claimers_url or url, i, order == "fair", seconds, hold,
                               (go, stop), ready, out, claimers_url is not None))
             for i in range(claimers)]
    try:
        with connect(url) as sampler:
            for proc in procs:
                proc.start()
            for _ in procs:
                _get(ready, "start")
            go.set()
            started = time.monotonic()
            _sample(sampler, result, started, stop, jobs)
            stop.set()
            for _ in procs:
                claimed, completed, errors = _get(out, "report")
                result.claimed += claimed
                result.completed += completed
                result.errors.extend(errors)
            _verify(sampler, result)
    finally:
        stop.set()
        go.set()
        for proc in procs:
            proc.join(timeout=30)
    return result


def _sample(sampler: Conn, result: LoadResult, started: float, stop: Any, jobs: int) -> None:
    """Sample over-limit keys until every job is done or the claimers' time is up."""
    deadline = started + result.seconds
    while time.monotonic() < deadline:
        over = sampler.execute(queries.get("bench_load_over_limit")).fetchall()
        result.samples += 1
        if over:
            result.sampled_over += 1
            result.max_over = max(result.max_over, *(int(r[1]) - int(r[2]) for r in over))
        if result.samples % 10 == 0:
            row = sampler.execute(queries.get("bench_load_progress"),
                                  {"queue": LOAD_QUEUE}).fetchone()
            if row is not None and int(row[0]) >= jobs:
                result.elapsed = time.monotonic() - started
                return
    result.elapsed = time.monotonic() - started


def _verify(sampler: Conn, result: LoadResult) -> None:
    """What the database says once the claimers are done: double claims, violations."""
    row = sampler.execute(queries.get("bench_load_progress"), {"queue": LOAD_QUEUE}).fetchone()
    assert row is not None
    result.completed_in_db = int(row[0])
    result.claimed_twice = int(row[2])
    trig = sampler.execute(queries.get("watch_violations")).fetchone()
    assert trig is not None
    result.trigger_over = int(trig[0])
    result.max_over = max(result.max_over, int(trig[2]))
    sampler.execute(queries.get("watch_remove"))
