"""A fair claim presumes hopeless the groups its connection's last claim found
busy (Hints.busy): its first window leaves out those still busy enough, and the
plan stands only if none of their rows could rank before its worst planned row.

Each test builds a fair queue whose head belongs to busy groups, lets one claim
learn them, changes the queue the way a stale hint would meet it, and checks the
next claim against the reference claim (claim_support.claim_as_reference), and
which statements it sent.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from claim_support import claim_as_reference, watch_steps

from akadze.claim import memory
from akadze.claim._steps import Batch, Statement

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Conn = psycopg.Connection[tuple[Any, ...]]
HOW = {"queue": "q", "slots": 10, "fair": True, "worker_id": "w", "now": NOW}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The statements each claim sent, by name, one list per claim."""
    claims: list[list[str]] = []

    def began() -> None:
        claims.append([])

    def step(_step: Batch | Statement, names: list[str]) -> None:
        claims[-1].extend(names)

    watch_steps(monkeypatch, on_claim=began, on_step=step)
    return claims


def queue_with_busy_head(conn: Conn, busy: int = 30, idle: int = 30, running: int = 2) -> None:
    """Groups b0..b{busy-1} hold the head of queue q, row by row, ten rows each,
    with `running` jobs running each; behind them, groups i0.. with nothing
    running, ten rows each."""
    keys = [f"b{n}" for n in range(busy)] * 10 + [f"i{n}" for n in range(idle)] * 10
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, run_at) "
        "SELECT 'q', 't', k, %s - make_interval(secs => 10000 - o) "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS r(k, o)", (NOW, keys))
    for n in range(busy):
        for _ in range(running):
            run(conn, f"b{n}")


def run(conn: Conn, key: str) -> None:
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, state, started_at) "
                 "VALUES ('q', 't', %s, 'running', %s)", (key, NOW))


def finish_runs(conn: Conn, key: str) -> None:
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = %s "
                 "WHERE limit_key = %s AND state = 'running'", (NOW, key))


def learn(conn: Conn) -> None:
    """One claim, undone, that leaves the busy groups in the connection's hints."""
    claim_as_reference(conn, **HOW)
    hints = memory.get(conn, "q")
    assert hints.busy_turn == 1
    assert set(hints.busy) == {f"b{n}" for n in range(30)}


def test_the_busy_groups_are_left_out_of_the_next_claims_first_window(
    conn: Conn, sent: list[list[str]]
) -> None:
    queue_with_busy_head(conn)
    learn(conn)
    got = claim_as_reference(conn, **HOW)
    assert len(got) == 10
    assert "claim_presume_busy" in sent[-1] and "claim_window_presumed" in sent[-1]
    # one window and the take: nothing read again from the head
    assert sent[-1].count("claim_window_presumed") == 1
    assert not {"claim_window", "claim_window_whole"} & set(sent[-1])
    # and the groups stay remembered
    assert len(memory.get(conn, "q").busy) == 30


def test_a_group_no_longer_busy_is_read_and_claimed(conn: Conn, sent: list[list[str]]) -> None:
    queue_with_busy_head(conn)
    learn(conn)
    # b3's runs end: its first row (at the head of the queue) now has turn 1
    finish_runs(conn, "b3")
    got = claim_as_reference(conn, **HOW)
    keys = dict(conn.execute("SELECT id, limit_key FROM akadze.jobs WHERE id = ANY (%s)",
                             (got,)).fetchall())
    assert "b3" in keys.values()
    assert "claim_window_presumed" in sent[-1]


def test_a_worst_turn_above_the_presumed_one_reads_again_without_it(
    conn: Conn, sent: list[list[str]]
) -> None:
    queue_with_busy_head(conn, running=1)
    learn(conn)
    # every idle group gets a run: the best turn is now 2, and the groups
    # presumed hopeless at turn 1 compete again
    for n in range(30):
        run(conn, f"i{n}")
    got = claim_as_reference(conn, **HOW)
    assert len(got) == 10
    names = sent[-1]
    assert names.index("claim_window_presumed") < names.index("claim_window_whole")


def test_a_higher_priority_row_of_a_presumed_group_is_claimed_first(
    conn: Conn, sent: list[list[str]]
) -> None:
    queue_with_busy_head(conn)
    learn(conn)
    (urgent,) = conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, priority, run_at) "
        "VALUES ('q', 't', 'b7', 5, %s) RETURNING id", (NOW - timedelta(seconds=1),)).fetchone()
    got = claim_as_reference(conn, **HOW)
    assert got[0] == urgent
    assert "claim_window_presumed" in sent[-1]


def test_few_busy_groups_presume_nothing(conn: Conn, sent: list[list[str]]) -> None:
    queue_with_busy_head(conn, busy=5)
    claim_as_reference(conn, **HOW)
    assert len(memory.get(conn, "q").busy) == 5  # fewer than PRESUME_FROM
    claim_as_reference(conn, **HOW)
    assert "claim_presume_busy" not in sent[-1]


def test_default_order_presumes_nothing(conn: Conn, sent: list[list[str]]) -> None:
    queue_with_busy_head(conn)
    how = {**HOW, "fair": False}
    claim_as_reference(conn, **how)
    assert memory.get(conn, "q").busy == ()
    claim_as_reference(conn, **how)
    assert "claim_presume_busy" not in sent[-1]


def test_a_backlog_of_busy_groups_piled_at_the_head_is_read_around(
    conn: Conn, sent: list[list[str]]
) -> None:
    # The busy groups get no turn while the idle ones have jobs, so their
    # backlog piles up at the head of the queue (here 30 x 200 jobs). A window
    # that leaves them out filters that pile entry by entry: it is found
    # dominated, the queue's groups are listed, and from then on the claim
    # judges the busy groups and reads the others' heads, leaving the pile alone.
    keys = [f"b{n}" for n in range(30)] * 200 + [f"i{n}" for n in range(30)] * 10
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, run_at) "
        "SELECT 'q', 't', k, %s - make_interval(secs => 10000 - o) "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS r(k, o)", (NOW, keys))
    for n in range(30):
        run(conn, f"b{n}")
    for _ in range(3):
        got = claim_as_reference(conn, **HOW)
        assert len(got) == 10
    assert memory.get(conn, "q").groups is not None
    assert sent[-1] == ["claim_start", "claim_sweep", "claim_presume_busy",
                        "claim_group_heads", "claim_take"]
    # and a busy group whose run ends is read again, and claimed
    finish_runs(conn, "b0")
    got = claim_as_reference(conn, **HOW)
    keys_got = {r[0] for r in conn.execute(
        "SELECT limit_key FROM akadze.jobs WHERE id = ANY (%s)", (got,)).fetchall()}
    assert "b0" in keys_got
