"""What the worker's collaborators share, in one explicit object.

Each collaborator gets the :class:`WorkerState` and changes only its own part of
it (named on each field); everything else it learns through the callbacks it was
given. Every field is touched from the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ..jobs import ClaimedJob
from ..tasks import Task
from ._events import Events
from ._runs import RunContext
from ._settings import Settings
from ._trouble import Trouble

logger = logging.getLogger("akadze.worker")


@dataclass(slots=True, eq=False)
class Run:
    """One run of one job in this worker, from its start to its release."""

    job: ClaimedJob
    task: Task[Any]
    ctx: RunContext
    queue: str
    started: float  # loop time
    aio: asyncio.Task[None] | None = None
    body_done: bool = False  # the task's function returned or raised
    recorded: bool = False  # its outcome was decided (written later by the flusher)


class QueueSlots:
    """How many of a queue's slots are taken, and a signal when that may have
    changed (or anything else that blocked claiming did). ``reserved``: slots of
    ended runs kept for a hand-off until their outcome write is over (the hand-off
    keeper's, :mod:`._handoffs`); the claim loop does not claim for them."""

    __slots__ = ("busy", "freed", "name", "reserved")

    def __init__(self, name: str) -> None:
        self.name = name
        self.busy = 0
        self.reserved = 0
        self.freed = asyncio.Event()


class WorkerState:
    """The state the collaborators of one worker share."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.events = Events(settings.worker_id, settings.on_event)
        self.trouble = Trouble(logger)
        self.random = random.Random()
        #: Finished runs by kind, plus "lost" (the runner's and the flusher's).
        self.counts: Counter[str] = Counter()
        #: The runs in progress by job id (the runner's).
        self.running: dict[int, Run] = {}
        #: Slot use per queue (the runner's).
        self.slots = {name: QueueSlots(name) for name in settings.queues}
        #: Set once the worker's row exists (the lease keeper's).
        self.registered = asyncio.Event()
        #: The lease ran out without a renewal: no claims (the lease keeper's).
        self.fenced = False
        #: Loop time until which the lease holds at the earliest, as others see it
        #: (the lease keeper's; 0 before the first renewal).
        self.lease_until = 0.0
        #: A stop was asked for; ``force``: the second one (the worker's).
        self.stop_requested = asyncio.Event()
        self.force = asyncio.Event()
        self.stopping = False
        #: Set whenever a run ends or outcomes were written (for wait_idle).
        self.settled = asyncio.Event()

    def lease_held(self) -> bool:
        """Whether this worker's lease holds now (renewed, not run out)."""
        return not self.fenced and asyncio.get_running_loop().time() < self.lease_until

    def unblock(self) -> None:
        """Something that held claiming back changed: let every claim loop look."""
        for slots in self.slots.values():
            slots.freed.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep, but wake up when a stop is requested."""
        await wait_for(self.stop_requested, seconds)


async def wait_for(event: asyncio.Event, seconds: float) -> None:
    """Wait for ``event``, at most ``seconds``.

    asyncio.timeout, not asyncio.wait_for: on Python 3.11, wait_for loses a
    cancellation that arrives as the awaited event fires or as the timeout
    expires (it returns, or raises TimeoutError, instead: CPython gh-86296);
    a background loop then never ends, and the worker's shutdown waited for
    it forever."""
    if event.is_set():
        return
    with suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


#: Seconds a stop waits for a cancelled background task before cancelling it again.
CANCEL_AGAIN_AFTER = 0.5


async def cancel_until_done(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again those
    that go on. A cancellation can be lost on the way: on Python 3.11,
    ``asyncio.wait_for`` (which psycopg_pool uses to wait for a connection) returns
    or raises TimeoutError instead of CancelledError when the cancellation arrives
    as its wait ends (CPython gh-86296). The background loop that waited then went
    round again, and the worker's stop waited for it forever."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_AFTER)
    for task in tasks:  # retrieved, so that asyncio does not log them as never retrieved
        if not task.cancelled():
            task.exception()
