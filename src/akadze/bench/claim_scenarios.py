"""The queue shapes of ``akadze bench claims`` and how one claim is timed on them.

Each scenario is built at N ready jobs in one queue, in queue order, with
INSERT ... SELECT generate_series and then VACUUM ANALYZE. A claim is timed
through the public calls (``claim_oracle``: the full ranking in one statement;
``claim``: the windowed claim); each commits like a worker's claim and is then
undone, untimed (rows back to queued with their counters, start marks removed),
so every claim sees the same queue. Beside them, the floor: a plain SKIP LOCKED
claim of 20 with no limits and no fairness, committed and undone the same way.

The seed's bench rolls each claim back instead. Here that would measure
something no worker sees: psycopg forgets its prepared statements at every
ROLLBACK, so each claim would be planned from scratch (about 4 ms more per
claim on this host), where a worker's claims reuse their plans.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from ..claim import claim, claim_oracle
from . import queries

Conn = psycopg.Connection[Any]
ClaimFn = Callable[..., Any]

QUEUE = "bench"
SLOTS = 20
BASE = datetime(2026, 1, 1, tzinfo=UTC)


# -- scenarios --------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """``share`` of the ready jobs, placed after the previous segment in run_at order.

    Keys ``prefix0 .. prefix(keys-1)`` take turns in runs of ``block`` rows
    (``keys=0``: no limit_key). ``priority`` of every row of the segment.
    """

    share: float
    keys: int = 0
    prefix: str = "k"
    block: int = 1
    priority: int = 0


@dataclass(frozen=True)
class Running:
    """``per_key`` running jobs in the bench queue for each key prefix0.. ."""

    prefix: str
    keys: int
    per_key: int = 1


@dataclass(frozen=True)
class Limited:
    """max_running on the keys prefix0 .. prefix(keys-1)."""

    prefix: str
    keys: int
    max_running: int = 1


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str  # the row name in the seed's speed table
    orders: tuple[str, ...]
    segments: Callable[[int], tuple[Segment, ...]]
    running: tuple[Running, ...] = ()
    limited: tuple[Limited, ...] = ()
    description: str = ""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "keys-x5", "N/5 keys x 5 jobs", ("fair",),
        lambda n: (Segment(1.0, keys=max(1, n // 5), prefix="k", block=5),),
        description="every key has 5 consecutive jobs; no limits, nothing running",
    ),
    Scenario(
        "busy-groups", "200 of 400 groups busy", ("fair",),
        lambda n: (Segment(1.0, keys=400, prefix="g"),),
        running=(Running("g", 200, per_key=5),),
        description="400 groups take turns row by row; groups g0..g199 have 5 running "
        "jobs each in the queue; no limits",
    ),
    Scenario(
        "urgent", "5% urgent jobs over the rest", ("fair",),
        lambda n: (Segment(0.95, keys=1000, prefix="t"),
                   Segment(0.05, keys=50, prefix="u", priority=10)),
        description="95% of the jobs at priority 0 over 1 000 keys, then (latest run_at) "
        "5% at priority 10 over 50 keys; no limits",
    ),
    Scenario(
        "at-limit-then-free", "1 000 keys at their limit, then free ones", ("fair", "default"),
        lambda n: (Segment(0.2, keys=1000, prefix="b"), Segment(0.8, keys=8000, prefix="f")),
        running=(Running("b", 1000),), limited=(Limited("b", 1000),),
        description="the first 20% of the queue: 1 000 keys with max_running = 1 and one "
        "running job each; then 80% over 8 000 keys without limits",
    ),
    Scenario(
        "deep-backlog", "50 keys, one with a deep backlog", ("fair",),
        lambda n: (Segment(0.9, keys=1, prefix="deep"), Segment(0.1, keys=49, prefix="k")),
        description="the first 90% of the queue belongs to one key, then 10% over 49 keys "
        "taking turns; no limits",
    ),
    Scenario(
        "half-one-key", "first half: one key at its limit", ("default", "fair"),
        lambda n: (Segment(0.5, keys=1, prefix="hot"), Segment(0.5)),
        running=(Running("hot", 1),), limited=(Limited("hot", 1),),
        description="the first 50% of the queue: one key with max_running = 1 and one "
        "running job; then 50% without a key",
    ),
    Scenario(
        "no-keys", "no keys, one group", ("fair",),
        lambda n: (Segment(1.0),),
        description="no job has a key (one fair group); nothing running",
    ),
    Scenario(
        "whole-one-key", "whole queue: one key at its limit", ("default", "fair"),
        lambda n: (Segment(1.0, keys=1, prefix="hot"),),
        running=(Running("hot", 1),), limited=(Limited("hot", 1),),
        description="every job has one key with max_running = 1 and one running job: "
        "the claim returns nothing",
    ),
)
SCENARIO_NAMES = tuple(s.name for s in SCENARIOS)


def build(conn: Conn, scenario: Scenario, jobs: int, stale: bool = False,
          drained: bool = False) -> None:
    """Empty the akadze tables and build ``scenario`` at ``jobs`` ready jobs.

    ``stale``: as a burst into a quiet queue meets them, the tables' statistics
    are taken while they are empty and not again (no ANALYZE after the jobs
    arrive; the caller keeps autovacuum off the tables meanwhile, see
    ``stale_tables``). ``drained`` (stale statistics of another kind, so it implies
    ``stale``): they are those autovacuum takes once a drain has ended: the
    scenario built, every job of it finished (none queued or running), the tables
    analyzed; then the same burst again, whose jobs those statistics do not
    describe (the finished ones stay, as retention keeps them). Otherwise the
    tables are vacuumed and analyzed at the end.
    """
    stale = stale or drained
    conn.execute(queries.get("bench_reset"))
    if stale and not drained:
        conn.execute("ANALYZE akadze.jobs, akadze.limits, akadze.start_marks")
    # Limits first, as an application sets them before it enqueues: the jobs of
    # a limited key are then flagged as such (jobs.limited, migration 0005).
    for lim in scenario.limited:
        conn.execute(queries.get("bench_insert_limits"), {
            "prefix": lim.prefix, "keys": lim.keys, "max_running": lim.max_running})
    if drained:
        _insert_jobs(conn, scenario, jobs)
        conn.execute(queries.get("bench_drain_all"))
        conn.execute("VACUUM (ANALYZE) akadze.jobs, akadze.limits, akadze.start_marks")
    _insert_jobs(conn, scenario, jobs)
    if not stale:
        conn.execute("VACUUM (ANALYZE) akadze.jobs, akadze.limits")


def insert_ready(conn: Conn, scenario: Scenario, jobs: int,
                 base: datetime = BASE) -> None:
    """The scenario's ``jobs`` ready jobs, segment by segment, due from ``base``."""
    start = 0
    segments = scenario.segments(jobs)
    for number, seg in enumerate(segments):
        stop = jobs if number == len(segments) - 1 else start + round(seg.share * jobs)
        conn.execute(queries.get("bench_insert_ready"), {
            "queue": QUEUE, "priority": seg.priority, "base": base, "keys": seg.keys,
            "prefix": seg.prefix, "block": seg.block, "start": start, "stop": stop,
        })
        start = stop


def _insert_jobs(conn: Conn, scenario: Scenario, jobs: int) -> None:
    """The scenario's ready jobs and its running ones."""
    insert_ready(conn, scenario, jobs)
    for run in scenario.running:
        conn.execute(queries.get("bench_insert_running"), {
            "queue": QUEUE, "prefix": run.prefix, "keys": run.keys, "per_key": run.per_key,
            "base": BASE})


def stale_tables(conn: Conn) -> None:
    """Keep autovacuum off the queue's tables in this (scratch) database, so that
    statistics taken on purpose stay as they are for the whole run (autovacuum
    would analyze a table after its first 50 new rows plus 10 %). Only ever run
    on the bench's own scratch database, or one given with --in-place."""
    conn.execute(queries.get("bench_stale_tables"))


# -- timing -----------------------------------------------------------------------------


@dataclass
class Timing:
    scenario: Scenario
    order: str
    jobs: int
    oracle_ms: list[float] = field(default_factory=list)
    claim_ms: list[float] = field(default_factory=list)
    plain_ms: list[float] = field(default_factory=list)
    claimed: int = 0
    same: bool = True
    ids: list[int] = field(default_factory=list)  # the windowed claim's answer

    @property
    def oracle(self) -> float:
        """Median of the full ranking; NaN when it was not run (budget 0)."""
        return statistics.median(self.oracle_ms) if self.oracle_ms else float("nan")

    @property
    def windowed(self) -> float:
        return statistics.median(self.claim_ms)

    @property
    def plain(self) -> float:
        """Median of the plain SKIP LOCKED claim (the floor); NaN when not run."""
        return statistics.median(self.plain_ms) if self.plain_ms else float("nan")

    @property
    def ratio(self) -> float:
        return self.oracle / self.windowed if self.windowed else float("nan")


def _timed(conn: Conn, fn: ClaimFn, fair: bool) -> tuple[float, list[int]]:
    started = time.perf_counter()
    got = fn(conn, queue=QUEUE, slots=SLOTS, fair=fair, worker_id="bench")
    elapsed = (time.perf_counter() - started) * 1000
    ids = [job.id for job in got]
    _undo(conn, ids)
    return elapsed, ids


def _timed_plain(conn: Conn) -> float:
    """The floor: one plain SKIP LOCKED claim statement in its own transaction."""
    started = time.perf_counter()
    with conn.transaction():
        ids = [r[0] for r in conn.execute(queries.get("bench_plain_claim"),
                                          {"queue": QUEUE, "slots": SLOTS})]
    elapsed = (time.perf_counter() - started) * 1000
    _undo(conn, ids)
    return elapsed


def _undo(conn: Conn, ids: list[int]) -> None:
    # No VACUUM here: it rewrites the table's statistics in pg_class, which
    # invalidates every prepared plan on the table, and the next claim would be
    # planned from scratch (~4 ms), as a worker's claim is only once after each
    # autovacuum. The dead row versions the undo leaves are few (2 per claimed
    # row) and cleaned by the index scans that meet them.
    conn.execute(queries.get("bench_restore"), {"ids": ids})


def measure(conn: Conn, scenario: Scenario, order: str, jobs: int, repeat: int,
            oracle_budget: float = float("inf"), plain: bool = True) -> Timing:
    """``repeat`` claims of each kind: the full ranking's first, in a pass of their
    own, which stops repeating once it has spent ``oracle_budget`` seconds (it can
    take seconds per claim); then the windowed claims, interleaved with the plain
    ones. Not the three interleaved: each full ranking reads the whole table, and
    a windowed claim timed right after one ran on caches it had emptied (up to a
    quarter slower at 100 000 jobs than the same claim after another claim, as a
    worker's claims come). ``plain``: time the plain SKIP LOCKED floor too (not on
    stale statistics: its one statement has no guard against them, and on a
    drained table's it reads the whole table, seconds a claim at 1 000 000 jobs)."""
    fair = order == "fair"
    timing = Timing(scenario, order, jobs)
    expected: list[int] | None = None
    spent = 0.0
    if oracle_budget > 0:
        _timed(conn, claim_oracle, fair)  # warm-up, untimed
    for _ in range(repeat):
        if spent >= oracle_budget:
            break
        ms, ids = _timed(conn, claim_oracle, fair)
        timing.oracle_ms.append(ms)
        spent += ms / 1000
        if expected is None:
            expected = ids
            timing.claimed = len(ids)
        elif ids != expected:  # the queue is restored each time: same answer
            timing.same = False
    # warm-up, untimed
    _timed(conn, claim, fair)
    if plain:
        _timed_plain(conn)
    for _ in range(repeat):
        ms, ids = _timed(conn, claim, fair)
        timing.claim_ms.append(ms)
        timing.ids = ids
        if expected is None:
            timing.claimed = len(ids)
        elif ids != expected:
            timing.same = False
        if plain:
            timing.plain_ms.append(_timed_plain(conn))
    return timing
