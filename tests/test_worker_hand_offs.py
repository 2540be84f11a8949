"""Hand-offs: a run of a key with max_running that ends starts the key's next job in
the transaction that writes its outcome (akadze.worker._handoffs, handoff.sql).

Observed through the worker's events (``claimed`` with ``detail="hand_off"``) and
the database. Every worker polls once a minute and does not listen: nothing but
the worker's own outcome write can start the next job in time."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from test_claim_plans import AUTO_EXPLAIN, explained, faults
from test_poison_outcomes import NO_POISON
from worker_support import Events, eventually, insert_job

from akadze import Akadze, Worker, current, queries
from akadze.bench import claim_scenarios as cs
from akadze.limits import set_limit_sync

POLL = 60.0


def _handed(events: Events) -> list[int]:
    return [job_id for event in events.seen
            if event.kind == "claimed" and event.detail == "hand_off"
            for job_id in event.job_ids]


async def test_a_run_that_ends_hands_its_slot_to_the_keys_next_job(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    set_limit_sync(conn, "k", max_running=1)
    started: list[int] = []

    @app.task("t")
    async def t() -> None:
        started.append(current().id)

    ids = [insert_job(conn, "t", limit_key="k", limited=True) for _ in range(4)]
    events = Events()
    async with Worker(app, slots=4, poll_interval=POLL, listen=False,
                      on_event=events) as worker:
        await eventually(lambda: worker.counts["succeeded"] == 4, what="four runs",
                         within=10)
    assert started == ids
    assert _handed(events) == ids[1:]  # the first by a claim, each next by a hand-off
    rows = conn.execute(
        "SELECT run_count, attempt, claim_token IS NOT NULL, worker_id = %s, state::text "
        "FROM akadze.jobs ORDER BY id", (worker.worker_id,)).fetchall()
    assert rows == [(1, 1, True, True, "succeeded")] * 4


async def test_a_refused_outcome_fails_alone_and_still_hands_off(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    """The database refuses the first run's result (a constraint of the user's): that
    write, hand-off included, rolls back; the run is failed instead, and that write
    hands the slot to the next job."""
    conn.execute(NO_POISON)
    set_limit_sync(conn, "k", max_running=1)

    @app.task("t")
    async def t(poison: bool) -> dict[str, bool]:
        return {"poison": poison}

    ids = [insert_job(conn, "t", {"poison": n == 0}, limit_key="k", limited=True)
           for n in range(3)]
    events = Events()
    async with Worker(app, slots=2, poll_interval=POLL, listen=False,
                      on_event=events) as worker:
        await eventually(lambda: worker.counts["failed"] + worker.counts["succeeded"] == 3,
                         what="three runs", within=10)
    states = [str(row[0]) for row in conn.execute(
        "SELECT state::text FROM akadze.jobs ORDER BY id")]
    assert states == ["failed", "succeeded", "succeeded"]
    assert _handed(events) == ids[1:]


@pytest.mark.parametrize("earlier", ["no key", "another key with room", "higher priority"])
async def test_a_hand_off_steps_aside_for_an_earlier_job(
    app: Akadze, conn: psycopg.Connection[Any], earlier: str
) -> None:
    """One slot: the slot a's first run leaves goes to the job the next claim would
    take, not to a's next job, when another job comes first in queue order."""
    set_limit_sync(conn, "a", max_running=1)
    set_limit_sync(conn, "b", max_running=1)
    started: list[str] = []
    running = asyncio.Event()
    go_on = asyncio.Event()

    @app.task("t")
    async def t(name: str) -> None:
        started.append(name)
        if name == "a1":
            running.set()
            await go_on.wait()

    insert_job(conn, "t", {"name": "a1"}, limit_key="a", limited=True)
    if earlier == "no key":
        insert_job(conn, "t", {"name": "x"})
    elif earlier == "another key with room":
        insert_job(conn, "t", {"name": "x"}, limit_key="b", limited=True)
    insert_job(conn, "t", {"name": "a2"}, limit_key="a", limited=True)
    events = Events()
    async with Worker(app, slots=1, poll_interval=POLL, listen=False,
                      on_event=events) as worker:
        await asyncio.wait_for(running.wait(), 10)
        if earlier == "higher priority":  # queued while a1 runs, after a2
            insert_job(conn, "t", {"name": "x"}, priority=5)
        go_on.set()
        await eventually(lambda: worker.counts["succeeded"] == 3, what="three runs",
                         within=10)
    assert started == ["a1", "x", "a2"]
    assert _handed(events) == []


@pytest.mark.parametrize("idle_keys", (0, 40))
@pytest.mark.parametrize("also_ended", (False, True))
def test_a_hand_off_passes_jobs_of_keys_without_room_only(
    conn: psycopg.Connection[Any], also_ended: bool, idle_keys: int
) -> None:
    """The look at the head of the queue passes a job of a key at its limit (b: its
    one run is elsewhere), and stops at a job of a key with room, counted with what
    the hand-off's own transaction changed: c's run ends in the same transaction
    (deferred: its limits row still says 1) without being handed off, so c2 could
    start and a2, behind it, is left to the next claim. The same whichever route
    the look takes: the open one (at most 32 limits rows with room) or, with 40
    idle keys beside, the read of the queue's head entry by entry."""
    for key in "abc":
        set_limit_sync(conn, key, max_running=1)
    for i in range(idle_keys):
        set_limit_sync(conn, f"idle-{i}", max_running=1)
    running = {key: insert_job(conn, "t", limit_key=key, limited=True, state="running",
                               started_at="now", worker_id="w")
               for key in "abc"}
    for name in ("b2", "c2", "a2"):
        insert_job(conn, "t", {"name": name}, limit_key=name[0], limited=True)
    with conn.transaction():
        conn.execute(queries.get("defer_running"))
        ended = [running["a"], running["c"]] if also_ended else [running["a"]]
        conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()"
                     " WHERE id = ANY (%s)", (ended,))
        conn.execute(queries.get("hand_off_lock"), {"keys": ["a"]})
        started = conn.execute(queries.get("hand_off_take"), {
            "queues": ["default"], "keys": ["a"], "slots": [1], "carried": [], "now": None,
            "worker_id": "w", "tasks": None, "excluded": Jsonb(["a"])}).fetchall()
        conn.execute(queries.get("apply_running"))
    names = conn.execute(
        "SELECT args ->> 'name' FROM akadze.jobs WHERE id = ANY (%s)",
        ([row[0] for row in started],)).fetchall()
    assert [n for (n,) in names] == ([] if also_ended else ["a2"])
    counts = dict(conn.execute("SELECT key, running FROM akadze.limits"
                               " WHERE key NOT LIKE 'idle-%%'").fetchall())
    assert counts == {"a": 0 if also_ended else 1, "b": 1, "c": 0 if also_ended else 1}


async def test_no_hand_off_when_turned_off_or_in_fair_order(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    set_limit_sync(conn, "k", max_running=1)

    @app.task("t")
    async def t() -> None:
        return None

    for options in ({"hand_off": False}, {"fair": True}):
        for _ in range(3):
            insert_job(conn, "t", limit_key="k", limited=True)
        events = Events()
        async with Worker(app, slots=4, poll_interval=0.05, listen=False,
                          on_event=events, **options) as worker:
            await eventually(lambda w=worker: w.counts["succeeded"] == 3,
                             what="three runs", within=10)
        assert _handed(events) == [], options


async def test_limits_hold_under_hand_offs_of_two_workers(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    """Two workers of 6 slots, 4 keys of max_running 2, 80 jobs: no key ever runs
    more than 2 (counted by the runs themselves), and most runs were handed off."""
    keys = [f"k{n}" for n in range(4)]
    for key in keys:
        set_limit_sync(conn, key, max_running=2)
    now: Counter[str] = Counter()
    most: Counter[str] = Counter()

    @app.task("t")
    async def t(key: str) -> None:
        now[key] += 1
        most[key] = max(most[key], now[key])
        await asyncio.sleep(0.01)
        now[key] -= 1

    for number in range(80):
        key = keys[number % 4]
        insert_job(conn, "t", {"key": key}, limit_key=key, limited=True)
    first, second = Events(), Events()
    async with (Worker(app, slots=6, poll_interval=0.2, on_event=first) as one,
                Worker(app, slots=6, poll_interval=0.2, on_event=second) as two):
        await eventually(lambda: one.counts["succeeded"] + two.counts["succeeded"] == 80,
                         what="80 runs", within=30)
    assert max(most.values()) == 2
    assert len(_handed(first)) + len(_handed(second)) >= 40


@pytest.mark.parametrize("ended", (50, 20))
def test_hand_off_plans_on_stale_statistics(database_url: str, ended: int) -> None:
    """hand_off_lock and hand_off_take on a table analyzed while empty, then filled:
    index paths only, and a bounded read (the look at the queue's first entries,
    plus a few entries per key handed off), however long the queue. With at most
    32 limits rows with room (20 keys ended a run here; the others are at their
    limit) the look takes the open route: it reads no entry of a key at its limit,
    so not even the first 1 024 entries of the limited part. The keys are those
    whose next jobs are furthest back in the queue, behind every other key's."""
    scenario = next(s for s in cs.SCENARIOS if s.name == "at-limit-then-free")
    with psycopg.connect(database_url, autocommit=True) as conn:
        cs.stale_tables(conn)
        cs.build(conn, scenario, 10_000, stale=True)
        keys = [str(row[0]) for row in conn.execute(
            "SELECT l.key FROM akadze.limits l WHERE l.max_running IS NOT NULL "
            "AND l.max_starts IS NULL AND EXISTS (SELECT 1 FROM akadze.jobs j "
            "WHERE j.limit_key = l.key AND j.state = 'queued') ORDER BY (SELECT min(q.id) "
            "FROM akadze.jobs q WHERE q.limit_key = l.key AND q.state = 'queued') DESC, l.key "
            "LIMIT %s",
            (ended,))]
        assert len(keys) == ended
        assert conn.execute("SELECT count(*) FROM akadze.limits WHERE running < max_running"
                            ).fetchone() == (0,)
        for statement in AUTO_EXPLAIN:
            conn.execute(statement)
        with explained(conn) as plans, conn.transaction():
            # A run of each key ends (so that each has room), then the hand-off.
            conn.execute(
                "UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                "WHERE id IN (SELECT min(id) FROM akadze.jobs WHERE state = 'running' "
                "AND limit_key = ANY (%s) GROUP BY limit_key)", (keys,))
            conn.execute(queries.get("hand_off_lock"), {"keys": keys})
            taken = conn.execute(queries.get("hand_off_take"), {
                "queues": [cs.QUEUE] * len(keys), "keys": keys, "slots": [1] * len(keys),
                "carried": [], "now": None, "worker_id": "w", "tasks": None,
                "excluded": Jsonb(keys)}).fetchall()
        assert plans, "auto_explain reported nothing"
        hand_off = [p for p in plans if "akadze.hand_off_locked" in p["Query Text"]]
        assert len(hand_off) == 2
        bad = [(p["Query Text"][:80], f) for p in hand_off
               if (f := faults(p, 64 + (1024 if ended > 32 else 0) + 40 * len(keys),
                               bitmap_pkey=True))]
        assert not bad, bad
        # One job per key asked for: what comes before their next jobs is of keys at
        # their limit (counted, though not left out by the worker's hint); and, as
        # far as the look reads (on the open route: the keys' own entries), the
        # next one of each key reserved, to follow it.
        started = Counter(str(row[6]) for row in taken if row[-1] == "running")
        assert started == Counter(keys)
        reserved = Counter(str(row[6]) for row in taken if row[-1] == "reserved")
        assert reserved == Counter(keys) if ended <= 32 else reserved <= Counter(keys)
