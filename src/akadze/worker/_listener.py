"""The listener: LISTEN on a dedicated connection, which it also lends for short work.

Migration 0003 makes every statement that leaves jobs ``queued`` send
``NOTIFY akadze_jobs, '<queue>'`` (delivered at commit); ``request_cancel`` sends
``NOTIFY akadze_cancel, '<job id>'``. The :class:`Listener` turns them into calls
of the worker's callbacks. It reconnects by itself; whenever it (re)connects it
calls ``on_connected`` so the worker looks at every queue once, since
notifications sent while nobody listened are lost.

A notification is a hint, never an order: any role may ``NOTIFY`` on any channel.
A queue's notification makes its claim loop claim (which takes only what the
database holds as ready); a cancel notification makes the cancel watcher read the
database's ``cancel_requested`` marks (:mod:`._cancellation`).

The connection is idle between notifications, so the listener lends it
(:meth:`Listener.lent`) to the lease keeper: a heartbeat then never waits behind
the general pool's other uses (outcome writes, ``complete_tx`` bodies), and a
listening worker needs one connection fewer there. While it is lent, the wait for
notifications is interrupted; what arrives meanwhile is kept by psycopg (since
3.2.4, notifications received outside ``notifies()`` go to a backlog that the
next ``notifies()`` yields first), so nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from .. import backoff
from ._trouble import Trouble

JOBS_CHANNEL = "akadze_jobs"
CANCEL_CHANNEL = "akadze_cancel"

#: How long the listener waits for a notification before checking its connection.
PROBE_EVERY = 30.0

logger = logging.getLogger("akadze.worker")

Conn = psycopg.AsyncConnection[Any]


class Listener:
    """LISTEN on a dedicated connection (``connect`` makes it), until cancelled."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Conn]],
        *,
        on_queue: Callable[[str], None],
        on_cancel: Callable[[int], None],
        on_connected: Callable[[], None],
        trouble: Trouble,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self._connect = connect
        self._on_queue = on_queue
        self._on_cancel = on_cancel
        self._on_connected = on_connected
        self._on_lost = on_lost
        self._trouble = trouble
        self.listening = False
        #: Set after the first attempt to listen, whether it worked or not.
        self.tried = asyncio.Event()
        self.conn: Conn | None = None
        #: Clear while the connection is lent: the listener does not wait on it then.
        self._free = asyncio.Event()
        self._free.set()
        self._lending = asyncio.Lock()
        #: The running wait for notifications (a task, so a lender can interrupt it).
        self._receiving: asyncio.Task[None] | None = None
        #: How many times the connection was lent (public state, for tests).
        self.lent_count = 0

    async def run(self) -> None:
        """Listen until cancelled."""
        where = "listening for notifications"
        while True:
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._lost()
                delay = backoff.reconnect_delay(self._trouble.failures(where) + 1,
                                                random.random())
                self._trouble.failed(where, exc, delay)
                self.tried.set()
                await asyncio.sleep(delay)
            finally:
                self._lost()
                self.conn = None

    @asynccontextmanager
    async def lent(self) -> AsyncIterator[Conn | None]:
        """The LISTEN connection, for a few short statements in autocommit; None when
        not listening (the caller uses a pool then). One borrower at a time; the wait
        for notifications resumes when the borrower is done."""
        async with self._lending:
            conn = self.conn
            if conn is None or not self.listening or conn.closed:
                yield None
                return
            self._free.clear()
            try:
                receiving = self._receiving
                if receiving is not None:
                    receiving.cancel()
                    await asyncio.wait({receiving})
                self.lent_count += 1
                yield conn
            finally:
                self._free.set()

    def _lost(self) -> None:
        """Not listening any more: notifications may be missed from now on."""
        if self.listening:
            self.listening = False
            self._on_lost()

    async def _listen_once(self) -> None:
        conn = await self._connect()
        async with conn:
            self.conn = conn
            await conn.execute(f"LISTEN {JOBS_CHANNEL}")
            await conn.execute(f"LISTEN {CANCEL_CHANNEL}")
            self.listening = True
            self._trouble.recovered("listening for notifications")
            self.tried.set()
            self._on_connected()
            while True:
                # Checked again after each wait: a lender may have taken the
                # connection between the event being set and this task resuming.
                while not self._free.is_set():
                    await self._free.wait()
                receiving = self._receiving = asyncio.ensure_future(self._receive(conn))
                try:
                    await asyncio.wait({receiving})
                except asyncio.CancelledError:
                    receiving.cancel()
                    raise
                finally:
                    self._receiving = None
                if receiving.cancelled():
                    # Lent: the borrower's statements were the probe. What they read
                    # from the socket waits in psycopg's backlog; hand it on now (a
                    # zero timeout yields the backlog, then polls once), so that lends
                    # in quick succession cannot keep it waiting.
                    async for note in conn.notifies(timeout=0):
                        self._dispatch(note.channel, note.payload)
                    continue
                receiving.result()  # a lost connection raises here
                # No notification for a while: make sure the connection is alive
                # (a silently dropped connection would otherwise never notify).
                await conn.execute("SELECT 1")

    async def _receive(self, conn: Conn) -> None:
        async for note in conn.notifies(timeout=PROBE_EVERY):
            self._dispatch(note.channel, note.payload)

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
