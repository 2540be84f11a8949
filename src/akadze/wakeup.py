"""Wake-up: LISTEN/NOTIFY on a dedicated connection, with polling as the fallback.

Migration 0003 makes every statement that leaves jobs ``queued`` send
``NOTIFY akadze_jobs, '<queue>'`` (delivered at commit); ``request_cancel`` sends
``NOTIFY akadze_cancel, '<job id>'``. The :class:`Listener` turns them into calls
of the worker's callbacks. It reconnects by itself; whenever it (re)connects it
calls ``on_connected`` so the worker looks at every queue once, since
notifications sent while nobody listened are lost. Polling (``poll_interval``)
keeps working without it: behind PgBouncer in transaction pooling mode LISTEN
cannot work, and ``listen=False`` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import psycopg

from . import backoff
from .resilience import Trouble

JOBS_CHANNEL = "akadze_jobs"
CANCEL_CHANNEL = "akadze_cancel"

#: How long the listener waits for a notification before checking its connection.
PROBE_EVERY = 30.0

logger = logging.getLogger("akadze.worker")


class Listener:
    def __init__(
        self,
        url: str,
        *,
        on_queue: Callable[[str], None],
        on_cancel: Callable[[int], None],
        on_connected: Callable[[], None],
        trouble: Trouble,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._url = url
        self._on_queue = on_queue
        self._on_cancel = on_cancel
        self._on_connected = on_connected
        self._trouble = trouble
        self._kwargs = connect_kwargs or {}
        self.listening = False
        #: Set after the first attempt to listen, whether it worked or not.
        self.tried = asyncio.Event()
        self.conn: psycopg.AsyncConnection[Any] | None = None

    async def run(self) -> None:
        """Listen until cancelled."""
        where = "listening for notifications"
        while True:
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening = False
                delay = backoff.reconnect_delay(self._trouble.failures(where) + 1,
                                                random.random())
                self._trouble.failed(where, exc, delay)
                self.tried.set()
                await asyncio.sleep(delay)
            finally:
                self.listening = False
                self.conn = None

    async def _listen_once(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, **self._kwargs)
        async with conn:
            self.conn = conn
            await conn.execute(f"LISTEN {JOBS_CHANNEL}")
            await conn.execute(f"LISTEN {CANCEL_CHANNEL}")
            self.listening = True
            self._trouble.recovered("listening for notifications")
            self.tried.set()
            self._on_connected()
            while True:
                async for note in conn.notifies(timeout=PROBE_EVERY):
                    self._dispatch(note.channel, note.payload)
                # No notification for a while: make sure the connection is alive
                # (a silently dropped connection would otherwise never notify).
                await conn.execute("SELECT 1")

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == JOBS_CHANNEL:
            self._on_queue(payload)
        elif channel == CANCEL_CHANNEL:
            try:
                job_id = int(payload)
            except ValueError:
                logger.debug("ignored a malformed cancel notification %r", payload)
                return
            self._on_cancel(job_id)
