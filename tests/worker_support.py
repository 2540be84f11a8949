"""Shared helpers of the worker tests (no tests here).

Jobs are inserted with plain SQL so that these tests depend only on the schema,
and the state of the database is polled with a deadline instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from akadze.worker import EventKind, WorkerEvent

DEADLINE = 15.0


def insert_job(
    conn: psycopg.Connection[Any],
    task: str,
    args: dict[str, Any] | None = None,
    *,
    queue: str = "default",
    **columns: Any,
) -> int:
    """Insert one queued job; extra columns as keyword arguments (meta as a dict)."""
    values: dict[str, Any] = {"queue": queue, "task": task, "args": Jsonb(args or {})}
    for name, value in columns.items():
        values[name] = Jsonb(value) if isinstance(value, dict | list) else value
    names = ", ".join(values)
    marks = ", ".join(f"%({name})s" for name in values)
    row = conn.execute(
        f"INSERT INTO akadze.jobs ({names}) VALUES ({marks}) RETURNING id", values
    ).fetchone()
    assert row is not None
    return int(row[0])


def insert_peers(conn: psycopg.Connection[Any], count: int, queue: str = "default") -> None:
    """``count`` other live workers of ``queue`` (rows only, leases of an hour)."""
    conn.execute(
        "INSERT INTO akadze.workers (id, host, pid, queues, lease) "
        "SELECT 'peer-' || n, 'h', n, ARRAY[%s], interval '1 hour' "
        "FROM generate_series(1, %s) AS n", (queue, count))


def job(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"no job {job_id}"
    return row


def states(conn: psycopg.Connection[Any]) -> dict[int, str]:
    return {int(r[0]): str(r[1]) for r in conn.execute(
        "SELECT id, state::text FROM akadze.jobs ORDER BY id")}


async def eventually(
    check: Callable[[], Any], *, within: float = DEADLINE, what: str = "condition"
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if isinstance(last, Awaitable):
            last = await last
        if last:
            return last
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what} (last value {last!r})")


async def wait_state(
    conn: psycopg.Connection[Any], job_id: int, *wanted: str, within: float = DEADLINE
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        row = job(conn, job_id)
        return row if row["state"] in wanted else None

    result: dict[str, Any] = await eventually(
        check, within=within, what=f"job {job_id} to be {'/'.join(wanted)}"
    )
    return result


async def wait_event(event: asyncio.Event | Any, within: float = DEADLINE) -> None:
    """Wait for an asyncio.Event or a threading.Event."""
    if isinstance(event, asyncio.Event):
        await asyncio.wait_for(event.wait(), within)
        return
    ok = await asyncio.to_thread(event.wait, within)
    assert ok, "timed out waiting for an event"


class Events:
    """A worker's events, recorded: pass ``on_event=events`` to the Worker, then
    ``await events.next("idle", queue="default")``."""

    def __init__(self) -> None:
        self.seen: list[WorkerEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: WorkerEvent) -> None:
        self.seen.append(event)
        self._changed.set()

    def kinds(self) -> list[str]:
        return [event.kind for event in self.seen]

    def find(self, kind: EventKind, *, queue: str | None = None, after: int = -1) -> int | None:
        """The index of the first such event after index ``after``, if any."""
        for index in range(after + 1, len(self.seen)):
            event = self.seen[index]
            if event.kind == kind and (queue is None or event.queue == queue):
                return index
        return None

    async def next(self, kind: EventKind, *, queue: str | None = None, after: int = -1,
                   within: float = DEADLINE) -> int:
        """Wait for an event of ``kind`` (of ``queue``) after index ``after``; its index."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while (found := self.find(kind, queue=queue, after=after)) is None:
            self._changed.clear()
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    await self._changed.wait()
            except TimeoutError:
                raise AssertionError(
                    f"timed out waiting for a {kind!r} event; seen {self.kinds()}") from None
        return found
