"""A known due time (a retry, a snooze, a start-rate window) wakes an idle claim loop
even when it came while the loop was busy, unless a claim began after it."""

from __future__ import annotations

import asyncio
import random

import pytest

from akadze.worker._wakeup import Wakeup


def _past(moment: float) -> None:
    """Until the loop's clock has passed ``moment`` (a few microseconds)."""
    loop = asyncio.get_running_loop()
    while loop.time() <= moment:
        pass


async def test_a_due_time_that_came_during_a_claim_still_wakes_the_loop() -> None:
    wakeup = Wakeup(["q"], poll_interval=60.0, rand=random.Random(1))
    loop = asyncio.get_running_loop()
    wakeup.claiming("q")  # a claim begins; the job is not due yet
    due = loop.time() + 1e-6
    wakeup.due_at("q", due, margin=0.0)
    _past(due)  # the claim is still running when the job becomes due
    async with asyncio.timeout(10):  # the poll would be a minute away
        await wakeup.wait("q", lambda: False)
    assert wakeup.woke_at_due_time("q")


async def test_a_due_time_a_claim_began_after_is_served() -> None:
    wakeup = Wakeup(["q"], poll_interval=60.0, rand=random.Random(1))
    loop = asyncio.get_running_loop()
    due = loop.time() + 1e-6
    wakeup.due_at("q", due, margin=0.0)
    _past(due)
    wakeup.claiming("q")  # a claim after the job was due took it
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):  # nothing left to wake for but the poll
            await wakeup.wait("q", lambda: False)
    assert not wakeup.woke_at_due_time("q")
