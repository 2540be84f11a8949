"""Watching a claim's steps: which statements each round trip sends; and a claim
checked against the reference claim on the same queue, then undone.

``watch_steps`` wraps the windowed claim's step generator so that a test sees every
step the claim yields (a :class:`Batch` or a :class:`Statement`) with the names of its
statements, before the step is sent; the claim itself is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from akadze import queries
from akadze.bench import queries as bench_queries
from akadze.claim import _drivers, _windows, claim, claim_oracle
from akadze.claim._steps import Batch, Request, Statement, Steps

#: The name of every named query, by the identity of its text.
NAMES = {id(queries.get(name)): name for name in queries.names()}

Seen = Callable[[Batch | Statement, list[str]], None]


def watch_steps(monkeypatch: pytest.MonkeyPatch, *, on_claim: Callable[[], None],
                on_step: Seen) -> None:
    """Call ``on_claim()`` as each claim begins and ``on_step(step, names)`` for each
    of its steps that sends statements, just before it is sent."""

    def watched(request: Request) -> Steps:
        steps = _windows.windowed_steps(request)
        on_claim()
        reply: Any = None
        while True:
            try:
                step = steps.send(reply)
            except StopIteration as done:
                result: Any = done.value
                return result
            if isinstance(step, (Batch, Statement)):
                sent = step.statements if isinstance(step, Batch) else (step,)
                on_step(step, [NAMES[id(st.query)] for st in sent])
            reply = yield step

    monkeypatch.setattr(_drivers, "windowed_steps", watched)


def unclaim(conn: Any, ids: list[int]) -> None:
    """Undo a claim exactly (the bench's restore), so the next claim meets the same queue."""
    conn.execute(bench_queries.get("bench_restore"), {"ids": ids})


def claim_as_reference(conn: Any, **how: Any) -> list[int]:
    """The windowed claim's ids, after checking them against the reference claim's on
    the same queue (both undone: the queue is left as it was)."""
    expected = [job.id for job in claim_oracle(conn, **how)]
    unclaim(conn, expected)
    got = [job.id for job in claim(conn, **how)]
    unclaim(conn, got)
    assert got == expected
    return got
