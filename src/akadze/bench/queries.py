"""The named queries of the harness (benchmarks, fault scenarios, the demo, the watch),
loaded from the ``.sql`` files in ``akadze/bench/sql`` by the runtime's loader
(:class:`akadze.queries.Queries`) over this folder.

They may include the runtime's fragments (the job row), but they are not runtime
queries: the runtime's ``akadze.queries`` never sees them, and they run only in
the harness's scratch databases and the test suite's.
"""

from __future__ import annotations

from .. import queries as runtime_queries

harness = runtime_queries.Queries("akadze.bench", "sql", base=runtime_queries.runtime)

# As the runtime's akadze.queries: get(name) (a psycopg sql.SQL), text(name), names().
get = harness.get
text = harness.text
names = harness.names
