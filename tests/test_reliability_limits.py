"""Start-rate limits when claims commit out of their clock's order.

A claim takes its clock (``now``) when it begins and waits for the limits row
lock afterwards, so two claims of one key can commit in the opposite order of
their clocks. The window of max_starts is defined on that clock. Found by the
soak (start-rate windows over max_starts by the claims' clock); reproduced here
deterministically with the claim's injectable clock. Fixed in the claim by keeping
start marks for a margin past the window (commit 9e75792).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from akadze.bench.fault_harness import audit, install
from akadze.claim import claim
from akadze.limits import set_limit_sync


def test_a_claim_with_an_earlier_clock_committing_later_keeps_the_rate(
    conn: psycopg.Connection[Any],
) -> None:
    install(conn)
    set_limit_sync(conn, "r", max_starts=2, window=timedelta(seconds=1))
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key) "
                 "SELECT 'q', 't', 'r' FROM generate_series(1, 10)")
    t0 = datetime.now(UTC) + timedelta(hours=1)
    assert len(claim(conn, queue="q", slots=10, now=t0)) == 2  # marks at t0
    # Claim B (clock t0 + 1.5 s, one free slot) gets the lock first: the t0 marks are
    # out of its window, it prunes them and starts one job.
    assert len(claim(conn, queue="q", slots=1, now=t0 + timedelta(seconds=1.5))) == 1
    # Claim A began earlier (clock t0 + 0.9 s) and gets the lock after B. Its window
    # (t0 - 0.1 s, t0 + 0.9 s] already holds the 2 starts at t0: it may start none.
    late = claim(conn, queue="q", slots=10, now=t0 + timedelta(seconds=0.9))
    found = audit(conn)
    assert (len(late), found.rate_violations) == (0, 0)
