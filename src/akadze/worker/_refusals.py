"""Outcomes the database refuses: one bad row fails alone.

The flusher writes many outcomes per statement, so one row the database will not
store would fail the whole batch, again at every retry, while the jobs of the batch
stay ``running`` (their worker's heartbeat keeps the lease, so nobody rescues them).
What runs decide is made storable beforehand (:mod:`akadze.storable`, the result
checks of :mod:`akadze.outcomes`); this is the net under it, for what only the
database can find (a constraint of yours, a limit of jsonb, a value from another
version).

:func:`write_splitting` tells two kinds of failure apart. Trouble of the database or
the connection (a lost connection, a timeout, a conflict, anything else) fails the
batch as before: the flusher retries all of it after a backoff. A refusal of what a
row holds (SQLSTATE class 22 data exception, 23 integrity constraint violation, 54
program limit exceeded, or a value the driver could not send) splits the batch in
halves, each written on its own, down to the rows refused alone: each of those is
written as ``failed`` instead (:func:`akadze.outcomes.unstorable`), naming what the
database said. One bad row among n costs about 2 log2(n) statements more, once. When
even that failure is refused, the problem is not the row's data: the error goes up
and the batch is retried as a whole, as for trouble.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

import psycopg

from .. import outcomes
from ..outcomes import Finish

#: SQLSTATE classes that refuse what a row holds: 22 data exception, 23 integrity
#: constraint violation, 54 program limit exceeded (a jsonb too large or too deep).
REFUSING_CLASSES = frozenset({"22", "23", "54"})

Write = Callable[[Sequence[Finish]], Awaitable[set[int]]]
#: A refused finish and what was written instead.
Replacement = tuple[Finish, Finish]


def refused_row(exc: BaseException) -> bool:
    """Whether ``exc`` refuses the data of a row (rather than being trouble)."""
    if isinstance(exc, UnicodeEncodeError):
        return True  # psycopg could not encode a parameter
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate is None:
            # Refused by psycopg before sending (a NUL in a text parameter).
            return isinstance(exc, psycopg.DataError)
        return exc.sqlstate[:2] in REFUSING_CLASSES
    return False


def refusal_text(exc: BaseException) -> str:
    """What the database said, in one line: the SQLSTATE, the message and, for a data
    exception, its detail (never the context, nor the detail of a constraint
    violation: they quote the data, the whole row for a CHECK)."""
    if isinstance(exc, psycopg.Error):
        diag = exc.diag
        primary = diag.message_primary or str(exc).strip().splitlines()[0]
        quoting = (exc.sqlstate or "").startswith("23")
        detail = (f" ({diag.message_detail})"
                  if diag.message_detail and not quoting else "")
        code = f"{exc.sqlstate} " if exc.sqlstate else ""
        return f"PostgreSQL refused it: {code}{primary}{detail}"
    return f"{type(exc).__name__}: {exc}"


async def write_splitting(write: Write, batch: Sequence[Finish], at: datetime
                          ) -> tuple[set[int], list[Replacement]]:
    """Write ``batch`` with ``write``; the ids accepted (as ``write`` returns them), and
    the finishes refused alone with what was written instead. Raises what is not a
    refusal of a row's data, or a refusal of even a failure."""
    try:
        return await write(batch), []
    except Exception as exc:
        if not refused_row(exc):
            raise
        if len(batch) == 1:
            refused = batch[0]
            instead = outcomes.unstorable(refused, at, refusal_text(exc))
            return await write([instead]), [(refused, instead)]
    middle = len(batch) // 2
    first, first_replaced = await write_splitting(write, batch[:middle], at)
    second, second_replaced = await write_splitting(write, batch[middle:], at)
    return first | second, first_replaced + second_replaced
