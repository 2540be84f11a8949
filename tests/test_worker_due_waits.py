"""A listening worker waits for notifications and due times, not for polls.

The look (``worker_queue_ready``) returns, when nothing is ready, the seconds until
the queue's next queued job becomes due; a listening claim loop that found nothing
waits for that moment (or a notification, or its long safety poll), not for
``poll_interval``. These workers poll every 60 s (``poll_interval=60``, so the safety
poll is 60 s too): a job picked up within seconds was picked up at its due time. A
worker without LISTEN polls as before.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta
from typing import Any

import psycopg
from worker_support import Events, insert_job, insert_peers, wait_state

from akadze import Akadze, Worker, pause_queue_sync, queries, set_limit_sync
from akadze.worker._wakeup import Wakeup

WITHIN = 12.0  # far below the 60 s polls, far above the jobs' 1.5 s


def noop_app(app: Akadze) -> Akadze:
    @app.task("t")
    async def t() -> None:
        return None

    return app


def _later(conn: psycopg.Connection[Any], by: str) -> datetime:
    row = conn.execute("SELECT now() + %s::interval", (by,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _started_after_due(conn: psycopg.Connection[Any], job_id: int) -> bool:
    row = conn.execute("SELECT started_at >= run_at FROM akadze.jobs WHERE id = %s",
                       (job_id,)).fetchone()
    return row == (True,)


async def test_a_job_queued_before_the_worker_started_is_run_at_its_due_time(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    # Queued (and notified) before the worker listened: the worker's first look,
    # after its first claim took nothing, tells it when the job is due. Nothing
    # notifies at that moment.
    job_id = insert_job(conn, "t", run_at=_later(conn, "1.5 seconds"))
    async with Worker(noop_app(app), poll_interval=60):
        await wait_state(conn, job_id, "succeeded", within=WITHIN)
    assert _started_after_due(conn, job_id)


async def test_a_scheduled_enqueue_tells_an_idle_worker_when_its_job_is_due(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    events = Events()
    async with Worker(noop_app(app), poll_interval=60, on_event=events):
        listening = await events.next("listening")
        after = await events.next("idle", after=listening)
        job_id = insert_job(conn, "t", run_at=_later(conn, "1.5 seconds"))
        await events.next("idle", after=after)  # the notification, served: not due yet
        assert _state(conn, job_id) == "queued"
        await wait_state(conn, job_id, "succeeded", within=WITHIN)
    assert _started_after_due(conn, job_id)


async def test_beside_peers_a_due_time_is_looked_at_and_claimed(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    # Beside live peers the due time learnt by a look wakes the loop like a
    # notification (spread, looked at first): the job still runs at its due time.
    insert_peers(conn, 20)
    events = Events()
    async with Worker(noop_app(app), poll_interval=60, on_event=events):
        listening = await events.next("listening")
        await events.next("idle", after=listening)
        job_id = insert_job(conn, "t", run_at=_later(conn, "1.5 seconds"))
        await wait_state(conn, job_id, "succeeded", within=WITHIN)
    assert _started_after_due(conn, job_id)


async def test_a_listening_worker_polls_less_often_than_a_polling_one(
    app: Akadze
) -> None:
    # Side by side on two empty queues, one loop each: the polling worker's idle
    # passes (each a poll answered by a look) are the clock. The listening one,
    # after its first passes, waits for its safety poll (10 x poll_interval).
    listening, polling = Events(), Events()
    noop_app(app)
    async with Worker(app, queues=["heard"], poll_interval=0.05, on_event=listening), \
            Worker(app, queues=["polled"], poll_interval=0.05, listen=False,
                   on_event=polling):
        began = await listening.next("listening")
        await listening.next("idle", queue="heard", after=began)
        start = len(polling.seen)
        after = start - 1
        for _ in range(20):  # about a second of polls (0.04-0.06 s each)
            after = await polling.next("idle", queue="polled", after=after)
        heard = sum(1 for event in listening.seen[began:]
                    if event.kind == "idle" and event.queue == "heard")
    # The first passes (a claim, the look after it) and at most a few safety polls
    # of 0.4-0.6 s; the polling worker made 20 in the same time.
    assert heard <= 6, heard


def test_the_look_says_when_the_next_job_is_due(conn: psycopg.Connection[Any]) -> None:
    # Heads of two priority levels in both ready indexes, none due: due_in is the
    # least run_at of all of them, from the `now` given (the server's when none).
    now = _later(conn, "0 seconds")
    set_limit_sync(conn, "k", max_running=1)
    insert_job(conn, "t", priority=9, run_at=now + timedelta(seconds=50))
    insert_job(conn, "t", priority=1, run_at=now + timedelta(seconds=7))
    insert_job(conn, "t", priority=5, run_at=now + timedelta(seconds=3), limit_key="k",
               limited=True)
    insert_job(conn, "t", priority=0, run_at=now + timedelta(seconds=4))
    assert _look(conn, now) == (False, 3.0)
    assert _look(conn, now + timedelta(seconds=1)) == (False, 2.0)
    assert _look(conn, now + timedelta(seconds=3))[0] is True
    assert _look(conn, None)[0] is False  # the server's now: 3 s before the first
    assert pause_queue_sync(conn, "default")
    assert _look(conn, now) == (False, None)  # paused: resume notifies
    assert _look(conn, now, queue="empty") == (False, None)


def _look(conn: psycopg.Connection[Any], now: datetime | None,
          queue: str = "default") -> tuple[bool, float | None]:
    row = conn.execute(queries.get("worker_queue_ready"),
                       {"queue": queue, "now": now, "peers": False}).fetchone()
    assert row is not None
    return bool(row[0]), row[2]


def _state(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


async def test_a_quiet_wait_polls_again_when_the_listener_is_lost() -> None:
    # The Wakeup alone: a quiet loop (its look found nothing) waits for its safety
    # poll (an hour here) while listening; when the listener's connection is lost
    # (retime_all), the same wait is timed again by poll_interval and ends.
    heard = [True]
    wakeup = Wakeup(["q"], poll_interval=0.05, rand=random.Random(1), quiet_poll=3600,
                    listening=lambda: heard[0])
    wakeup.looked("q", False, None)
    waiting = asyncio.ensure_future(wakeup.wait("q", lambda: False))
    done, _ = await asyncio.wait({waiting}, timeout=0.5)
    assert not done  # ten polls' time: still waiting for the hour
    heard[0] = False
    wakeup.retime_all()
    await asyncio.wait_for(waiting, timeout=5)
    assert not wakeup.notified("q") and not wakeup.woke_at_due_time("q")


async def test_a_looked_due_time_wakes_like_a_notification() -> None:
    wakeup = Wakeup(["q"], poll_interval=3600, rand=random.Random(1), quiet_poll=3600,
                    listening=lambda: True)
    wakeup.looked("q", False, 0.01)
    await asyncio.wait_for(wakeup.wait("q", lambda: False), timeout=5)
    # Every worker of the queue learnt it: looked at and spread, not claimed blind.
    assert wakeup.notified("q") and not wakeup.woke_at_due_time("q")
    wakeup.looked("q", True, None)  # ready: no due time to wait for, a plain poll
    wakeup.consume("q")
    waiting = asyncio.ensure_future(wakeup.wait("q", lambda: False))
    done, _ = await asyncio.wait({waiting}, timeout=0.2)
    assert not done
    waiting.cancel()


async def test_a_known_due_time_wakes_no_earlier_than_due() -> None:
    loop = asyncio.get_running_loop()
    wakeup = Wakeup(["q"], poll_interval=3600, rand=random.Random(1))
    when = loop.time() + 0.05
    wakeup.due_at("q", when)
    await asyncio.wait_for(wakeup.wait("q", lambda: False), timeout=5)
    assert wakeup.woke_at_due_time("q") and loop.time() >= when
