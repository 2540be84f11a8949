"""The listener lends its LISTEN connection (to heartbeats) without losing a
notification: those that arrive while it is lent are kept and handled after."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg

from akadze.worker._listener import JOBS_CHANNEL, Listener
from akadze.worker._trouble import Trouble


async def test_no_notification_is_lost_while_the_connection_is_lent(
    database_url: str,
) -> None:
    received: list[str] = []
    connected = asyncio.Event()
    all_in = asyncio.Event()
    sent = 300

    def on_queue(payload: str) -> None:
        received.append(payload)
        if len(received) >= sent:
            all_in.set()

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(database_url, autocommit=True)

    listener = Listener(connect, on_queue=on_queue, on_cancel=lambda job_id: None,
                        on_connected=connected.set,
                        trouble=Trouble(logging.getLogger("test")))
    listening = asyncio.ensure_future(listener.run())
    try:
        await asyncio.wait_for(connected.wait(), 10)

        async def borrow() -> int:
            statements = 0
            while not all_in.is_set():
                async with listener.lent() as lent:
                    assert lent is not None
                    await lent.execute("SELECT pg_sleep(0.001)")
                    statements += 1
                await asyncio.sleep(0)
            return statements

        async def notify() -> None:
            async with await psycopg.AsyncConnection.connect(
                    database_url, autocommit=True) as sender:
                for i in range(sent):
                    await sender.execute("SELECT pg_notify(%s, %s)", (JOBS_CHANNEL, f"q{i}"))

        borrowing = asyncio.ensure_future(borrow())
        await notify()
        await asyncio.wait_for(all_in.wait(), 20)
        statements = await borrowing
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
    assert received == [f"q{i}" for i in range(sent)]  # each once, in order
    assert statements > 10 and listener.lent_count == statements


async def test_a_listener_that_is_not_listening_lends_nothing() -> None:
    async def connect() -> psycopg.AsyncConnection[Any]:
        raise AssertionError("not called")

    listener = Listener(connect, on_queue=lambda q: None, on_cancel=lambda j: None,
                        on_connected=lambda: None,
                        trouble=Trouble(logging.getLogger("test")))
    async with listener.lent() as lent:
        assert lent is None
