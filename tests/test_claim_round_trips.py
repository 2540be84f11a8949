"""How many round trips a worker's repeated claims make: what the connection
remembers (akadze.claim.memory) must spare the reads it promises. The property tests
prove that the hints never change a claim's result; these fail if a hint stops
saving the round trip it is there for.

A round trip here is a step of the windowed claim that waits for rows (a
statement or a batch); COMMIT, sent by the driver, is not counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from claim_support import watch_steps

from akadze.claim import Hints, claim, memory
from akadze.claim._steps import Batch, Statement

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Conn = psycopg.Connection[tuple[Any, ...]]


SENT: list[list[str]] = []  # the statements of each claim, by name
ASKED: list[int] = []  # the rows each read per group asked of each group (per_group)


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The round trips of each claim, one entry per claim (and in SENT, the
    names of the statements each claim sent)."""
    counts: list[int] = []
    SENT.clear()
    ASKED.clear()

    def claim_began() -> None:
        counts.append(0)
        SENT.append([])

    def step_seen(step: Batch | Statement, names: list[str]) -> None:
        if isinstance(step, Batch) or step.fetch:
            counts[-1] += 1
        SENT[-1].extend(names)
        for statement in step.statements if isinstance(step, Batch) else (step,):
            params = statement.params
            if isinstance(params, dict) and "per_group" in params:
                ASKED.append(int(params["per_group"]))

    watch_steps(monkeypatch, on_claim=claim_began, on_step=step_seen)
    yield counts


def fill(conn: Conn, rows: list[tuple[str | None, int]]) -> None:
    """Queued jobs of queue q: (limit_key, seconds before NOW), in one statement."""
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, run_at) "
        "SELECT 'q', 't', k, %s - make_interval(secs => a) "
        "FROM unnest(%s::text[], %s::int[]) AS r(k, a)",
        (NOW, [k for k, _ in rows], [a for _, a in rows]))


def block(conn: Conn, *keys: str) -> None:
    """Each key: max_running = 1 and one job running in another queue (flagged
    limited, as a claim starts the run of a key with a limits row: the row counts
    it, migration 0017)."""
    for key in keys:
        conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES (%s, 1)", (key,))
        conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, state, limited) "
                     "VALUES ('elsewhere', 't', %s, 'running', true)", (key,))


def test_a_queue_held_by_a_key_at_its_limit_costs_one_round_trip(
    conn: Conn, trips: list[int]
) -> None:
    block(conn, "hot")
    fill(conn, [("hot", 1000 - i) for i in range(500)])
    assert claim(conn, queue="q", slots=20, now=NOW) == []
    assert claim(conn, queue="q", slots=20, now=NOW) == []
    # the second claim: its opening, the key's state, the skip scan: nothing to read
    assert trips[1] == 1
    assert memory.get(conn, "q").groups == frozenset({"hot"})


def test_a_key_at_its_limit_ahead_of_unkeyed_jobs_costs_a_read_and_a_take(
    conn: Conn, trips: list[int]
) -> None:
    block(conn, "hot")
    fill(conn, [("hot", 1000 - i) for i in range(300)] + [(None, 500 - i) for i in range(60)])
    for fair in (False, True, False):
        assert len(claim(conn, queue="q", slots=20, fair=fair, now=NOW)) == 20
    assert trips[1:] == [2, 2]


def test_a_fair_queue_that_needed_two_windows_needs_one_the_next_time(
    conn: Conn, trips: list[int]
) -> None:
    # 5 jobs per key: the 20th turn-1 row is row 96, past the first window of 80
    fill(conn, [(f"k{i // 5:03d}", 2000 - i) for i in range(1000)])
    first = claim(conn, queue="q", slots=20, fair=True, now=NOW)
    assert len({job.limit_key for job in first}) == 20
    assert memory.get(conn, "q").read == 96
    # the same queue again (as a worker meets a queue whose shape holds)
    conn.execute("UPDATE akadze.jobs SET state = 'queued', run_count = 0, attempt = 0, "
                 "worker_id = NULL, started_at = NULL WHERE id = ANY(%s)",
                 ([job.id for job in first],))
    again = claim(conn, queue="q", slots=20, fair=True, now=NOW)
    # the same jobs, each with a claim token of its own (random per claim)
    assert all(a.claim_token != f.claim_token for a, f in zip(again, first, strict=True))
    assert [dataclasses.replace(a, claim_token=None) for a in again] == [
        dataclasses.replace(f, claim_token=None) for f in first]
    assert trips == [3, 2]
    # The first claim's guard let the skip scan run (its first window shows 16
    # groups), which stopped at its bound: the second claim does not try again.
    assert "claim_groups" in SENT[0] and "claim_groups" not in SENT[1]


def test_many_blocked_keys_are_counted_in_the_round_trip_of_the_first_window(
    conn: Conn, trips: list[int]
) -> None:
    blocked = [f"b{i:02d}" for i in range(30)]
    block(conn, *blocked)
    fill(conn, [(blocked[i % 30], 3000 - i) for i in range(600)]
         + [(None, 1000 - i) for i in range(100)])
    for _ in range(3):
        assert len(claim(conn, queue="q", slots=20, now=NOW)) == 20
    assert set(memory.get(conn, "q").blocked) == set(blocked)
    assert trips[1:] == [2, 2]


def test_a_stale_hint_costs_reads_not_the_result(conn: Conn, trips: list[int]) -> None:
    block(conn, "hot")
    fill(conn, [("hot", 1000 - i) for i in range(100)] + [(None, 500 - i) for i in range(10)])
    assert len(claim(conn, queue="q", slots=5, now=NOW)) == 5
    # the key gets room again, and a new group appears ahead of the queue
    conn.execute("DELETE FROM akadze.jobs WHERE queue = 'elsewhere'")
    fill(conn, [("new", 2000)])
    got = claim(conn, queue="q", slots=3, now=NOW + timedelta(seconds=1))
    assert [job.limit_key for job in got] == ["new", "hot", None]
    assert trips[1] > 2  # the speculative read was dropped and read again


def test_a_group_holding_the_head_costs_a_read_and_a_take(conn: Conn, trips: list[int]) -> None:
    # "50 keys, one with a deep backlog": the first 900 jobs are one key's, then
    # 49 keys take turns. Once the groups are remembered, a fair claim reads
    # each group's head at once, as its skip scan finds it (the deep group's rows
    # do not cut the others' short), and takes: two round trips.
    fill(conn, [("deep", 3000 - i) for i in range(900)]
         + [(f"k{i % 49:02d}", 1000 - i) for i in range(100)])
    for _ in range(3):
        got = claim(conn, queue="q", slots=20, fair=True, now=NOW)
        assert len({job.limit_key for job in got}) == 20
        conn.execute("UPDATE akadze.jobs SET state = 'queued', run_count = 0, attempt = 0, "
                     "worker_id = NULL, started_at = NULL WHERE id = ANY(%s)",
                     ([job.id for job in got],))
    assert memory.get(conn, "q").groups is not None
    assert trips[1:] == [2, 2]
    # one statement lists the groups and reads their heads
    assert SENT[1] == ["claim_start", "claim_sweep", "claim_group_heads", "claim_take"]
    # a row of each: nothing runs, so the last claim's worst planned row had
    # turn 1 and a group's second row (turn 2) cannot place (not 80 / 50 = 2)
    assert memory.get(conn, "q").busy_turn == 1
    assert ASKED[-2:] == [1, 1]


def test_a_group_read_to_its_end_is_not_read_again(conn: Conn) -> None:
    # Read per group from the first round trip: the null group's one job ends it
    # in the first read, k's first entries are of a task this worker does not
    # run, so k is read again, the null group not.
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, run_at) "
        "SELECT 'q', CASE WHEN i <= 10 THEN 'other' ELSE 't' END, 'k', "
        "%s - make_interval(secs => 100 - i) FROM generate_series(1, 15) i", (NOW,))
    fill(conn, [(None, 10)])
    memory.put(conn, "q", Hints(groups=frozenset({None, "k"})))
    got = claim(conn, queue="q", slots=2, fair=True, now=NOW, tasks=["t"])
    assert [job.limit_key for job in got] == ["k", None]
