"""Plans that cannot go wrong: on tables whose statistics are stale, every statement
of the claim, the outcome writes, the sweep and the rescue reach the rows they are
meant to reach through the index paths they were written for.

The plans are the ones the server really runs: auto_explain (at NOTICE level, with
ANALYZE) reports every statement the public calls send, with their parameters and
their generic or custom plans, and each plan is checked:

- no sequential or bitmap heap scan of ``akadze.jobs`` (an outcome write may use a
  bitmap of the primary key: that reads the ids given and nothing else);
- no statement of a claim reads more rows of ``akadze.jobs`` (index entries
  returned or filtered out, heap rows fetched) than the same statement of the same
  claim on the same tables analyzed (a quarter more, and a few rows), nor
  half the queue: the windows and the rows named, never the index or the
  table behind them; the outcome writes and the rescue read a bounded few rows
  per job they change, however many jobs there are.

"Stale" is each of: analyzed while empty, then the burst; analyzed at 1 % of the
burst; analyzed full, then most of the queue finished (a mass completion: the
statistics describe a queue that is gone, and the table is mostly dead); analyzed
once a drain ended (as autovacuum does: every job finished, none running), then
the next burst.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from akadze import Akadze, outcomes, queries
from akadze.bench import claim_scenarios as cs
from akadze.claim import claim
from akadze.jobs import ClaimedJob, JobState
from akadze.worker._finishes import write
from akadze.worker._maintenance import rescue_expired

READY = 10_000
STALE = ("empty", "small", "finished")

Conn = psycopg.Connection[Any]
Plan = dict[str, Any]


@contextmanager
def explained(conn: Conn | psycopg.AsyncConnection[Any]) -> Iterator[list[Plan]]:
    """Collect the plan (with actual rows) of every top-level statement run on
    ``conn`` meanwhile."""
    plans: list[Plan] = []

    def noticed(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if text.startswith("duration:") and "{" in text:
            plans.append(json.loads(text[text.index("{"):]))

    conn.add_notice_handler(noticed)
    try:
        yield plans
    finally:
        conn.remove_notice_handler(noticed)


AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_timing = off",
    "SET auto_explain.log_format = json",
    "SET auto_explain.log_level = notice",
)


def _nodes(node: Plan) -> Iterator[Plan]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _read(node: Plan) -> float:
    loops = node.get("Actual Loops", 1)
    return loops * (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                    + node.get("Rows Removed by Index Recheck", 0))


def reads(plan: Plan) -> float:
    """Rows of akadze.jobs the statement read: index entries returned or filtered
    out, heap rows fetched (a bitmap heap scan's rows are its index scan's)."""
    return sum(_read(node) for node in _nodes(plan["Plan"])
               if (node.get("Relation Name") == "jobs"
                   or node.get("Index Name", "").startswith("jobs_"))
               and node["Node Type"] not in ("Bitmap Heap Scan", "ModifyTable"))


def faults(plan: Plan, bound: float, *, bitmap_pkey: bool = False) -> list[str]:
    """What is wrong with one statement's plan (nothing: an empty list)."""
    found = []
    for node in _nodes(plan["Plan"]):
        kind, index = node["Node Type"], node.get("Index Name", "")
        if node.get("Relation Name") != "jobs" and not index.startswith("jobs_"):
            continue
        if kind == "Seq Scan" or kind.startswith("Tid"):
            found.append(f"{kind} on jobs")
        if kind == "Bitmap Index Scan" and not (bitmap_pkey and index == "jobs_pkey"):
            found.append(f"bitmap scan of {index}")
    if (read := reads(plan)) > bound:
        found.append(f"reads {read:.0f} rows of jobs (bound {bound:.0f})")
    return found


def _check(plans: list[Plan], bounds: list[float], **how: bool) -> None:
    bad = [(plan, fault) for plan, bound in zip(plans, bounds, strict=True)
           if (fault := faults(plan, bound, **how))]
    assert not bad, "\n\n".join(f"{plan['Query Text'][:300]}\n  -> {fault}\n{_debug(plan)}"
                                 for plan, fault in bad)


def _make_stale(conn: Conn, stale: str, scenario: cs.Scenario) -> None:
    """Build ``scenario`` at READY jobs with statistics that do not describe it."""
    cs.stale_tables(conn)
    if stale == "empty":
        cs.build(conn, scenario, READY, stale=True)
    elif stale == "small":
        cs.build(conn, scenario, READY // 100)  # analyzed at 200 jobs
        # the READY jobs again, due after those, without ANALYZE (the limits and
        # running rows of the small build stay)
        cs.insert_ready(conn, scenario, READY, base=datetime(2026, 1, 2, tzinfo=UTC))
    elif stale == "drained":
        # Analyzed (as autovacuum does) once a drain ended: nothing queued, nothing
        # running; then the next burst, and runs again.
        cs.build(conn, scenario, READY, drained=True)
    else:
        cs.build(conn, scenario, READY * 2)  # analyzed with every job queued
        # A mass completion: the first half of the queue (in queue order) ends.
        conn.execute("""
            UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()
            WHERE state = 'queued' AND id IN (
                SELECT id FROM akadze.jobs WHERE state = 'queued'
                ORDER BY priority DESC, run_at, id LIMIT %(n)s)""", {"n": READY})


def _claims(conn: Conn, order: str, times: int) -> list[ClaimedJob]:
    got: list[ClaimedJob] = []
    for _ in range(times):
        got += claim(conn, queue=cs.QUEUE, slots=cs.SLOTS, fair=order == "fair",
                     worker_id="plans")
    return got


def _claim_plans(database_url: str, scenario: cs.Scenario, stale: str,
                 fresh: bool) -> list[list[Plan]]:
    """Build the scenario with stale statistics (or, ``fresh``, the same tables
    analyzed), then claim on a new connection, as a worker starts: its first
    claim makes the generic plans. The plans of each order's claims."""
    found = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        _make_stale(conn, stale, scenario)
        # due cancel-requested and expired jobs for the sweep to meet
        conn.execute("""
            UPDATE akadze.jobs SET cancel_requested = true
            WHERE id IN (SELECT id FROM akadze.jobs WHERE state = 'queued'
                         ORDER BY id DESC LIMIT 5)""")
        conn.execute("""
            UPDATE akadze.jobs SET expires_at = now() - interval '1 minute'
            WHERE id IN (SELECT id FROM akadze.jobs WHERE state = 'queued'
                         AND NOT cancel_requested ORDER BY id DESC LIMIT 5)""")
        if fresh:
            conn.execute("VACUUM (ANALYZE) akadze.jobs, akadze.limits")
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in AUTO_EXPLAIN:
            conn.execute(statement)
        for order in scenario.orders:
            with explained(conn) as plans:
                _claims(conn, order, 3)
            found.append(plans)
        swept = conn.execute(
            "SELECT count(*) FROM akadze.jobs WHERE state = 'cancelled'").fetchone()
        assert swept is not None and swept[0] == 10, "the sweep ran"
    return found


# "1 000 keys at their limit" with 20 more keys that have room, their jobs among
# those of the keys at their limit: the first window takes the open route
# (migration 0018) and reads the limited part per key with room.
SOME_ROOM = cs.Scenario(
    "at-limit-some-room", "1 000 keys at their limit and 20 with room, then free ones",
    ("fair", "default"),
    lambda n: (cs.Segment(0.2, keys=1020, prefix="b"), cs.Segment(0.8, keys=8000, prefix="f")),
    running=(cs.Running("b", 1000),), limited=(cs.Limited("b", 1020),))

CASES = [(scenario, stale) for scenario in (*cs.SCENARIOS, SOME_ROOM)
         for stale in ("empty", "drained")] + [
    (scenario, stale) for scenario in cs.SCENARIOS for stale in ("small", "finished")
    if scenario.name in ("at-limit-then-free", "busy-groups", "half-one-key")]


@pytest.mark.parametrize(("scenario", "stale"), CASES,
                         ids=[f"{sc.name}-{stale}" for sc, stale in CASES])
def test_claim_plans_on_stale_statistics(
    database_url: str, scenario: cs.Scenario, stale: str
) -> None:
    """Every statement of the claim on stale statistics reads no more of the queue
    than the same statement on fresh ones: the window and the rows it names, not
    the index or the table behind them."""
    fresh = _claim_plans(database_url, scenario, stale, fresh=True)
    stale_plans = _claim_plans(database_url, scenario, stale, fresh=False)
    for good, plans in zip(fresh, stale_plans, strict=True):
        assert [p["Query Text"] for p in plans] == [p["Query Text"] for p in good]
        # the same statements in the same order (same queue, same decisions)
        assert any("FOR UPDATE SKIP LOCKED" in p["Query Text"] for p in plans)
        if scenario.name == "at-limit-then-free":
            # the first windows look for the open route (migration 0018) through
            # limits_full_idx, on stale statistics too
            assert any("limits_full_idx" in json.dumps(p["Plan"]) for p in plans)
        if scenario.name == "busy-groups" and plans is stale_plans[0]:
            # the later fair claims judge the busy groups their connection
            # remembers (claim_presume_busy) and leave them out of their first
            # window (claim_window_presumed): both planned here too
            texts = [p["Query Text"] for p in plans]
            assert any("akadze.claim_presumed" in t and "jsonb_agg" in t for t in texts)
            assert any("akadze.claim_presumed" in t and "ready_window_open" in t
                       for t in texts)
        _check(plans, [min(READY / 2, 1.25 * reads(p) + 64) for p in good])


def _running_elsewhere(conn: Conn) -> None:
    """Many running jobs of live workers (what rescue and the counts of a key's
    running jobs must not read), and some of a worker whose lease expired (what
    rescue must take back)."""
    conn.execute("""
        INSERT INTO akadze.workers (id, host, pid, queues, lease, started_at,
                                    heartbeat_at)
        SELECT 'live' || w, 'h', w, '{bench}'::text[], interval '1 hour', now(), now()
        FROM generate_series(0, 9) w
        UNION ALL
        SELECT 'bench-busy', 'h', 98, '{bench}', interval '1 hour', now(), now()
        UNION ALL
        SELECT 'dead', 'h', 99, '{bench}', interval '1 second',
               now() - interval '1 hour', now() - interval '1 hour'""")
    conn.execute("""
        INSERT INTO akadze.jobs (queue, task, state, run_count, attempt, worker_id,
                                 started_at, run_at)
        SELECT 'bench', 'bench', 'running', 1, 1,
               CASE WHEN g <= 30 THEN 'dead' ELSE 'live' || (g % 10) END,
               now(), now()
        FROM generate_series(1, 3000) g""")


@pytest.mark.parametrize("stale", ("empty", "finished", "drained"))
async def test_outcome_and_rescue_plans_on_stale_statistics(
    database_url: str, stale: str
) -> None:
    scenario = next(s for s in cs.SCENARIOS if s.name == "at-limit-then-free")
    with psycopg.connect(database_url, autocommit=True) as conn:
        _make_stale(conn, stale, scenario)
        _running_elsewhere(conn)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
        for statement in AUTO_EXPLAIN:
            await aconn.execute(statement)
        jobs = await claim(aconn, queue=cs.QUEUE, slots=60, worker_id="live0")
        assert len(jobs) == 60
        now = datetime.now(UTC)
        succeeded = [outcomes.Finish(j, outcomes.SUCCEEDED, JobState.SUCCEEDED, result="1")
                     for j in jobs[:20]]
        mixed = [outcomes.Finish(j, outcomes.RETRIED, JobState.QUEUED, delay=60.0,
                                 error=json.dumps({"error": "E", "attempt": 1}))
                 for j in jobs[20:30]]
        mixed += [outcomes.Finish(j, outcomes.SUCCEEDED, JobState.SUCCEEDED, result="2")
                  for j in jobs[30:40]]
        given = [outcomes.given_back(j, now, "shutdown") for j in jobs[40:60]]
        with explained(aconn) as plans:
            assert await write(aconn, succeeded) == {j.id for j in jobs[:20]}
            assert await write(aconn, mixed) == {j.id for j in jobs[20:40]}
            assert await write(aconn, given) == {j.id for j in jobs[40:60]}
        assert len(plans) >= 3
        _check(plans, [3 * 20 + 16] * len(plans), bitmap_pkey=True)
        with explained(aconn) as plans:
            rescued = await rescue_expired(aconn, None, orphan_grace=3600)
        assert len(rescued) == 30
        # 4 000 running jobs: the rescue reads a probe per worker (12) and the
        # dead worker's 30 jobs three times (found, locked, updated)
        _check(plans, [4 * 30 + 40] * len(plans), bitmap_pkey=True)


@pytest.mark.parametrize("stale", ("empty", "finished", "drained"))
async def test_hand_off_plans_on_stale_statistics(database_url: str, stale: str) -> None:
    """A hand-off (hand_off_lock and hand_off_take, in the transaction that ends
    runs of the keys) reads each key's running jobs through the key's own entries
    and the head of the queue, never every running job of the cluster per key: 20
    keys handed off among 4 000 running jobs."""
    scenario = next(s for s in cs.SCENARIOS if s.name == "at-limit-then-free")
    with psycopg.connect(database_url, autocommit=True) as conn:
        _make_stale(conn, stale, scenario)
        _running_elsewhere(conn)
        ended = conn.execute(
            "SELECT id, limit_key FROM akadze.jobs WHERE state = 'running'"
            " AND limit_key LIKE 'b%%' ORDER BY limit_key LIMIT 20").fetchall()
        keys = sorted(str(key) for _, key in ended)
        assert len(keys) == 20
        row = conn.execute(
            "SELECT count(DISTINCT limit_key) FROM akadze.jobs WHERE state = 'queued'"
            " AND limit_key = ANY (%s)", (keys,)).fetchone()
        ready = int(row[0]) if row else 0
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
        for statement in AUTO_EXPLAIN:
            await aconn.execute(statement)
        async with aconn.transaction():
            await aconn.execute(
                "UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()"
                " WHERE id = ANY (%s)", ([int(i) for i, _ in ended],))
            with explained(aconn) as plans:
                await aconn.execute(queries.get("hand_off_lock"), {"keys": keys})
                cur = await aconn.execute(queries.get("hand_off_take"), {
                    "queues": [cs.QUEUE] * len(keys), "keys": keys, "slots": [1] * len(keys),
                    "carried": [], "now": None, "worker_id": "live0", "tasks": None,
                    "excluded": Jsonb(keys)})
                # the next job of each key started, and the one after it reserved
                started = [row for row in await cur.fetchall() if row[-1] == "running"]
    # each key had room again: the hand-off started the next job of those with one
    # (after a mass completion of the queue's first half, none has)
    assert len(started) == ready
    assert ready == (0 if stale == "finished" else len(keys))
    assert len(plans) == 2
    # the look at the head of the queue (at most 64 + 1 024 entries) and, per key,
    # a few entries of its own: its ready jobs, its running jobs (none or one)
    _check(plans, [64 + 1024 + 40 * len(keys)] * len(plans), bitmap_pkey=True)


def _debug(plan: Plan) -> str:
    return "\n".join(f"{n['Node Type']} {n.get('Index Name', n.get('Relation Name', ''))} "
                     f"read={_read(n):.0f} loops={n.get('Actual Loops')}"
                     for n in _nodes(plan["Plan"]) if n.get("Relation Name") or n.get("Index Name"))


def test_claim_settings_are_the_callers_again_in_hooks(app: Akadze, database_url: str) -> None:
    """The claim's plan settings (generic plans, no JIT, no sequential or bitmap
    scans) live in its own transaction only and are the caller's again before a
    transition hook runs in that transaction; after it, the session's are."""
    seen: list[tuple[str, ...]] = []

    @app.on_transition
    def look(conn: Conn, job: ClaimedJob, from_state: str, to_state: str) -> None:
        row = conn.execute(
            "SELECT current_setting('enable_seqscan'), current_setting('enable_bitmapscan'),"
            " current_setting('plan_cache_mode'), current_setting('jit')").fetchone()
        assert row is not None
        seen.append(tuple(row))

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO akadze.jobs (queue, task) VALUES ('q', 't'), ('q', 't')")
        conn.execute("SET plan_cache_mode = force_custom_plan")
        conn.execute("SET enable_bitmapscan = off")
        got = claim(conn, queue="q", slots=2, worker_id="w", app=app)
        assert len(got) == 2
        after = conn.execute(
            "SELECT current_setting('enable_seqscan'), current_setting('enable_bitmapscan'),"
            " current_setting('plan_cache_mode'), current_setting('jit')").fetchone()
    assert seen == [("on", "off", "force_custom_plan", "on")] * 2
    assert after == ("on", "off", "force_custom_plan", "on")


def test_the_open_route_reads_each_key_with_room_through_its_own_entries(
    database_url: str,
) -> None:
    """At 100 000 ready jobs on statistics taken while the queue was empty, the open
    route's read of each key with room (migration 0018) probes that key's entries in
    jobs_ready_key_idx; read through jobs_ready_limited_idx, filtering by key, each of
    the 20 keys cost a scan of the whole limited part (400 000 entries, 60 ms)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        cs.stale_tables(conn)
        cs.build(conn, SOME_ROOM, 100_000, stale=True)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in AUTO_EXPLAIN:
            conn.execute(statement)
        for order in SOME_ROOM.orders:
            with explained(conn) as plans:
                got = _claims(conn, order, 3)
            assert len(got) == 3 * cs.SLOTS
            # the windows and the 20 keys' own entries: a few hundred rows each
            _check(plans, [2000.0] * len(plans))
