"""Reservations: the transaction of a hand-off also reserves, for each run of a key
with max_running it starts, the key's next job (state ``reserved``); when a run of
the key ends, the reserved job starts at once, before any write, and the write
that records the end starts it in the database (akadze.worker._handoffs,
handoff.sql: hand_off_take, start_reserved).

Observed through the worker's events, its tasks and the database. The workers poll
once a minute and do not listen: only their own writes start the next jobs in time."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from worker_support import Events, eventually, insert_job

from akadze import Akadze, Worker, current, queries, request_cancel_sync
from akadze.limits import set_limit_sync
from akadze.worker import WorkerEvent, _handoffs

POLL = 60.0


def _row(conn: psycopg.Connection[Any], job_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT state::text, worker_id, claim_token IS NOT NULL, run_count, attempt "
        "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return tuple(row)


def _second_waits(app: Akadze, conn: psycopg.Connection[Any]
                  ) -> tuple[list[int], asyncio.Event, asyncio.Event]:
    """Three jobs of one key with max_running 1; the second runs until ``go_on``
    (``second`` says it began): the write that started it reserved the third."""
    set_limit_sync(conn, "k", max_running=1)
    second, go_on = asyncio.Event(), asyncio.Event()
    ids: list[int] = []

    @app.task("t")
    async def t() -> None:
        if current().id == ids[1]:
            second.set()
            await go_on.wait()

    ids.extend(insert_job(conn, "t", limit_key="k", limited=True) for _ in range(3))
    return ids, second, go_on


async def test_a_reserved_job_starts_before_the_write_of_the_run_it_follows(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    set_limit_sync(conn, "k", max_running=1)
    seen: list[tuple[str, Any]] = []
    began = {n: asyncio.Event() for n in range(4)}
    go_on = {n: asyncio.Event() for n in range(4)}

    @app.task("t")
    async def t() -> None:
        seen.append(("start", current().id))
        n = ids.index(current().id)
        began[n].set()
        if n in (1, 2):
            await go_on[n].wait()

    ids = [insert_job(conn, "t", limit_key="k", limited=True) for _ in range(4)]
    events = Events()

    def on_event(event: WorkerEvent) -> None:
        events(event)
        if event.kind == "outcomes_written":
            seen.append(("written", tuple(event.job_ids)))

    async with Worker(app, slots=4, poll_interval=POLL, listen=False,
                      on_event=on_event) as worker:
        await asyncio.wait_for(began[1].wait(), 10)
        # the write that started the second job reserved the third for this worker
        assert _row(conn, ids[2]) == ("reserved", worker.worker_id, True, 0, 0)
        assert _row(conn, ids[3])[0] == "queued"
        go_on[1].set()
        await asyncio.wait_for(began[2].wait(), 10)
        # the write of the second's outcome started the third, and reserved the fourth:
        # once the worker has read its reply (it says so with outcomes_written)
        await eventually(lambda: any(kind == "written" and ids[1] in done
                                     for kind, done in seen),
                         what="the second's outcome written", within=10)
        assert _row(conn, ids[3])[0] == "reserved"
        assert _row(conn, ids[2]) == ("running", worker.worker_id, True, 1, 1)
        go_on[2].set()
        await eventually(lambda: worker.counts["succeeded"] == 4, what="four runs",
                         within=10)
    starts = [job_id for kind, job_id in seen if kind == "start"]
    assert starts == ids

    def at(entry: tuple[str, Any]) -> int:
        return seen.index(entry)

    def written(job_id: int) -> int:
        return next(n for n, (kind, ids_) in enumerate(seen)
                    if kind == "written" and job_id in ids_)

    # the third and fourth began before the outcome of the run they follow was written
    assert at(("start", ids[2])) < written(ids[1])
    assert at(("start", ids[3])) < written(ids[2])
    rows = conn.execute(
        "SELECT run_count, attempt, claim_token IS NOT NULL, worker_id = %s, state::text "
        "FROM akadze.jobs ORDER BY id", (worker.worker_id,)).fetchall()
    assert rows == [(1, 1, True, True, "succeeded")] * 4
    # no reservation outlives the drain, none is left for a worker that stopped
    assert conn.execute(
        "SELECT count(*) FROM akadze.jobs WHERE state = 'reserved'").fetchone() == (0,)


async def test_a_stop_gives_the_reservations_back(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    ids, second, go_on = _second_waits(app, conn)
    worker = Worker(app, slots=2, poll_interval=POLL, listen=False)
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(second.wait(), 10)
    assert _row(conn, ids[2])[:2] == ("reserved", worker.worker_id)
    worker.stop()  # the second run ends during the stop: its successor stays put
    go_on.set()
    await asyncio.wait_for(running, 10)
    assert worker.counts["succeeded"] == 2
    assert _row(conn, ids[2]) == ("queued", None, False, 0, 0)


async def test_a_cancelled_reservation_stops_the_run_begun_for_it(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    """Cancelled while reserved: the worker begins it when the run before it ends
    (it cannot know yet), the write finds it no longer reserved, and the run stops
    as lost; the job stays cancelled and the key's next job runs."""
    set_limit_sync(conn, "k", max_running=1)
    second = asyncio.Event()
    go_on = asyncio.Event()
    third_began = asyncio.Event()
    third_stopped = asyncio.Event()

    @app.task("t")
    async def t() -> None:
        if current().id == ids[1]:
            second.set()
            await go_on.wait()
        elif current().id == ids[2]:
            third_began.set()
            try:
                await asyncio.Event().wait()
            finally:
                third_stopped.set()

    ids = [insert_job(conn, "t", limit_key="k", limited=True) for _ in range(4)]
    events = Events()
    async with Worker(app, slots=2, poll_interval=POLL, listen=False,
                      on_event=events) as worker:
        await asyncio.wait_for(second.wait(), 10)
        assert _row(conn, ids[2])[0] == "reserved"
        assert request_cancel_sync(conn, ids[2]) is True
        go_on.set()
        await asyncio.wait_for(third_began.wait(), 10)
        await asyncio.wait_for(third_stopped.wait(), 10)
        await eventually(lambda: worker.counts["succeeded"] == 3, what="three runs",
                         within=10)
    assert _row(conn, ids[2])[0] == "cancelled"
    assert [list(e.job_ids) for e in events.seen if e.kind == "lost"] == [[ids[2]]]
    assert _row(conn, ids[3])[0] == "succeeded"


def test_the_rescue_gives_back_the_reservations_of_a_worker_that_is_gone(
    conn: psycopg.Connection[Any]
) -> None:
    conn.execute("INSERT INTO akadze.workers (id, host, pid) VALUES ('here', 'h', 1)")
    gone = insert_job(conn, "t", limit_key="k")
    kept = insert_job(conn, "t", limit_key="k")
    for job_id, worker_id in ((gone, "gone"), (kept, "here")):
        conn.execute("UPDATE akadze.jobs SET state = 'reserved', worker_id = %s, "
                     "claim_token = 7 WHERE id = %s", (worker_id, job_id))
    given = conn.execute(queries.get("rescue_reserved")).fetchall()
    assert given == [(gone,)]
    assert _row(conn, gone) == ("queued", None, False, 0, 0)
    assert _row(conn, kept) == ("reserved", "here", True, 0, 0)


async def test_a_reservation_behind_a_long_run_goes_back(
    app: Akadze, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reservation is held for HOLD at most: behind a run that goes on, it goes
    back to the queue (where another worker's free slot of the key can take it)."""
    monkeypatch.setattr(_handoffs, "HOLD", 0.2)
    ids, second, go_on = _second_waits(app, conn)
    async with Worker(app, slots=2, poll_interval=POLL, listen=False) as worker:
        await asyncio.wait_for(second.wait(), 10)
        await eventually(lambda: _row(conn, ids[2]) == ("queued", None, False, 0, 0),
                         what="the reservation given back", within=10)
        assert _row(conn, ids[1])[0] == "running"
        go_on.set()
        await eventually(lambda: worker.counts["succeeded"] == 3, what="three runs",
                         within=10)
