"""A small cluster for the dashboard tests (API and browser) and the screenshots: three
queues, two limited tenants (one at its limit), succeeded and failed jobs (with a
traceback), a waiting backlog, a worker and a schedule. Built through akadze's public
API and a real worker run (``drain``); the states no API can produce on demand (a job
that is running right now, a registered worker) are written as a worker would write
them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import psycopg

from akadze import Akadze, set_limit
from akadze.testing import drain


@dataclass(frozen=True)
class Filled:
    failed_id: int
    succeeded_id: int
    running_id: int
    queued_ids: list[int]


def tasks(app: Akadze) -> None:
    @app.task("send_email", queue="emails")
    def send_email(to: str) -> str:
        return f"sent to {to}"

    @app.task("charge_card", queue="billing", max_attempts=1)
    def charge_card(account: int) -> None:
        raise ConnectionError(f"the payment gateway refused account {account}")

    @app.task("sync_account", queue="accounts")
    def sync_account(account: int) -> None:  # pragma: no cover - left queued
        pass

    @app.task("build_report", queue="reports")
    def build_report(n: int) -> int:
        return n * n

    app.add_schedule("nightly_report", task="send_email", cron="0 3 * * *",
                     args={"to": "ops@example.com"})


async def fill(app: Akadze, *, backlog: int = 30) -> Filled:
    emails = [await app.tasks["send_email"].using(meta={"tenant": "acme"}).enqueue(
        to=f"user{i}@example.com") for i in range(6)]
    failed = await app.tasks["charge_card"].using().enqueue(account=42)
    await drain(app, queues=["emails", "billing"])
    async with await psycopg.AsyncConnection.connect(app.database_url) as conn:
        await set_limit(conn, "tenant:acme", max_running=1)
        await set_limit(conn, "tenant:globex", max_running=5, max_starts=100,
                        window=timedelta(minutes=1))
        await conn.commit()
    sync = app.tasks["sync_account"]
    queued = [await sync.using(limit_key="tenant:acme" if i % 3 else "tenant:globex",
                               meta={"tenant": "acme" if i % 3 else "globex"}).enqueue(account=i)
              for i in range(backlog)]
    running = queued.pop(1)  # a job of tenant:acme: its one slot is taken, at its limit
    async with await psycopg.AsyncConnection.connect(app.database_url, autocommit=True) as conn:
        # What a worker's claim writes for a job it runs, and its registration.
        await conn.execute(
            "INSERT INTO akadze.workers (id, host, pid, queues) "
            "VALUES ('web-1:4242', 'web-1', 4242, ARRAY['accounts', 'emails', 'billing'])")
        await conn.execute(
            "UPDATE akadze.jobs SET state = 'running', started_at = now(), attempt = 1, "
            "run_count = run_count + 1, worker_id = 'web-1:4242' WHERE id = %s", (running,))
        await conn.execute(
            "INSERT INTO akadze.periodic_fires (schedule, fire_at, job_id) "
            "VALUES ('nightly_report', date_trunc('day', now()) + interval '3 hours', %s)",
            (emails[0],))
    return Filled(failed, emails[1], running, queued)


async def history(app: Akadze) -> None:
    """Finished runs of several tenants in a queue of their own ('reports'), so that the
    fairness page has shares of starts to show."""
    report = app.tasks["build_report"]
    for key, count in (("tenant:acme", 12), ("tenant:globex", 8), ("tenant:initech", 5),
                       (None, 3)):
        await report.using(limit_key=key).enqueue_many([{"n": i} for i in range(count)])
    await drain(app, queues=["reports"])


def state_of(database_url: str, job_id: int) -> str:
    """A job's state as stored."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s",
                           (job_id,)).fetchone()
    assert row is not None
    return str(row[0])
