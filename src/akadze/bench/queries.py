"""The named queries of the harness (benchmarks, fault scenarios, the demo, the watch),
loaded from the ``.sql`` files in ``akadze/bench/sql`` by the runtime's loader
(:class:`akadze.queries.Queries`) over this folder.

They may include the runtime's fragments (the job row), but they are not runtime
queries: the runtime's ``akadze.queries`` never sees them, and they run only in
the harness's scratch databases and the test suite's.
"""

from __future__ import annotations

from psycopg import sql

from .. import queries as runtime_queries

harness = runtime_queries.Queries("akadze.bench", "sql", base=runtime_queries.runtime)


def text(name: str) -> str:
    """The SQL text of the named harness query."""
    return harness.text(name)


def get(name: str) -> sql.SQL:
    """The named harness query as a psycopg ``sql.SQL`` object, ready to execute."""
    return harness.get(name)


def names() -> list[str]:
    return harness.names()
