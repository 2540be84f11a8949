"""Notifications are hints (issue 21, finding 5): PostgreSQL lets any role NOTIFY on
any channel, so a worker acts only on what the database says.

The outsider is a role created for the test with no privilege on the akadze schema;
its notifications are sent as that role (``SET ROLE``), as a hostile tenant of the
same server would. Ordering, not sleeping, tells when the worker has seen them: a
listener receives notifications in commit order, so once a later, real cancel has
taken effect, the outsider's earlier notifications were delivered too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_worker_support import Events, insert_job, job, wait_event, wait_state

from akadze import Akadze, Worker, request_cancel_sync


@pytest.fixture
def outsider(conn: psycopg.Connection[Any], database_url: str
             ) -> Iterator[psycopg.Connection[Any]]:
    """A connection acting as a role that cannot even see the akadze schema."""
    role = f"akadze_outsider_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            row = other.execute("SELECT has_schema_privilege('akadze', 'USAGE')").fetchone()
            assert row is not None and row[0] is False
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                other.execute("SELECT count(*) FROM akadze.jobs")
            yield other
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def notify(conn: psycopg.Connection[Any], channel: str, payload: str) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def test_a_bare_cancel_notification_from_an_outsider_cancels_nothing(
    app: Akadze, conn: psycopg.Connection[Any], outsider: psycopg.Connection[Any]
) -> None:
    started: dict[str, asyncio.Event] = {"a": asyncio.Event(), "b": asyncio.Event()}
    interrupted: dict[str, asyncio.Event] = {"a": asyncio.Event(), "b": asyncio.Event()}

    @app.task("long")
    async def long(name: str) -> None:
        started[name].set()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            interrupted[name].set()
            raise

    target = insert_job(conn, "long", {"name": "a"})
    witness = insert_job(conn, "long", {"name": "b"})
    events = Events()
    # With LISTEN and poll_interval 30 the cancellation poll runs every 300 s: within
    # the test only a notification can make the worker look.
    async with Worker(app, slots=2, poll_interval=30, on_event=events) as worker:
        await wait_event(started["a"])
        await wait_event(started["b"])
        # The target's id, as a bare NOTIFY and through pg_notify, and junk payloads.
        outsider.execute(sql.SQL("NOTIFY akadze_cancel, {}").format(sql.Literal(str(target))))
        for payload in (str(target), f" {target} ", "-1", "0", "x" * 7000, "9" * 400, ""):
            notify(outsider, "akadze_cancel", payload)
        for payload in ("default", "no-such-queue", "\x01\x7f", "y" * 7000):
            notify(outsider, "akadze_jobs", payload)
        # A real request for the other job, committed after all of the above.
        assert request_cancel_sync(app, witness) is True
        await wait_event(interrupted["b"])
        await wait_state(conn, witness, "cancelled")
        row = job(conn, target)
        assert (row["state"], row["cancel_requested"]) == ("running", False)
        assert not interrupted["a"].is_set()
        # The worker asked the database, which named the witness only.
        checked = [event.job_ids for event in events.seen if event.kind == "cancel_checked"]
        assert (witness,) in checked and all(target not in ids for ids in checked)
        # A real request for the target works as ever, through the same notification.
        assert request_cancel_sync(app, target) is True
        await wait_event(interrupted["a"])
        row = await wait_state(conn, target, "cancelled")
    assert row["errors"][-1]["error"] == "Cancelled"
    assert worker.counts["cancelled"] == 2 and worker.counts["succeeded"] == 0
