"""The open route (ready_window_open, migration 0018): when some key is at its limit
by its limits row's count and few are not, a claim's first window reads the limited
part of the queue for the keys with room only, and the claim gives every other key
with a limits row no room until it ends, wherever it meets one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from claim_support import claim_as_reference, watch_steps

from akadze.claim import claim, memory
from akadze.claim._steps import Batch, Statement

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Conn = psycopg.Connection[tuple[Any, ...]]


def _limit(conn: Conn, key: str, running: int = 1, max_running: int = 1) -> None:
    """A limits row, and ``running`` flagged runs of the key in another queue (the
    row counts them: migration 0017)."""
    conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES (%s, %s)",
                 (key, max_running))
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, state, limited) "
                 "SELECT 'elsewhere', 't', %s, 'running', true FROM generate_series(1, %s)",
                 (key, running))


def _queue(conn: Conn, rows: list[tuple[str | None, str, bool]]) -> list[int]:
    """Queued jobs of queue q in this order: (limit_key, task, flagged limited)."""
    got = conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, limited, run_at) "
        "SELECT 'q', t, k, f, %s - make_interval(secs => 10000 - n) "
        "FROM unnest(%s::text[], %s::text[], %s::bool[]) WITH ORDINALITY AS r(k, t, f, n) "
        "RETURNING id",
        (NOW, [k for k, _, _ in rows], [t for _, t, _ in rows], [f for _, _, f in rows]))
    return [r[0] for r in got.fetchall()]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The steps of each claim that send statements, as sent."""
    claims: list[list[Any]] = []
    watch_steps(monkeypatch, on_claim=lambda: claims.append([]),
                on_step=lambda step, names: claims[-1].append((step, names)))
    return claims


def _known_open(step: Batch | Statement) -> list[Any]:
    statements = step.statements if isinstance(step, Batch) else (step,)
    return [st.params.get("known_open") for st in statements
            if isinstance(st.params, dict) and "known_open" in st.params]


@pytest.mark.parametrize("fair", [False, True])
def test_keys_at_their_limit_cost_nothing_to_pass(
        conn: Conn, sent: list[list[Any]], fair: bool) -> None:
    """A thousand keys at their limit, then free jobs: each claim is the reference
    claim's in one window and a take, and no claim meets or remembers the keys."""
    blocked = [f"b{i:04d}" for i in range(1000)]
    conn.execute("INSERT INTO akadze.limits (key, max_running) "
                 "SELECT k, 1 FROM unnest(%s::text[]) k", (blocked,))
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, state, limited) "
                 "SELECT 'elsewhere', 't', k, 'running', true FROM unnest(%s::text[]) k",
                 (blocked,))
    # two keys with room, whose jobs are among the blocked ones
    _limit(conn, "open1", running=0, max_running=2)
    _limit(conn, "open2", running=1, max_running=3)
    rows: list[tuple[str | None, str, bool]] = [(blocked[i % 1000], "t", True)
                                                 for i in range(3000)]
    rows[500] = rows[900] = rows[1300] = ("open1", "t", True)
    rows[700] = ("open2", "t", True)
    _queue(conn, [*rows, *((f"f{i}", "t", False) for i in range(100))])
    for _ in range(3):
        assert len(claim_as_reference(conn, queue="q", slots=20, fair=fair, now=NOW)) == 20
        assert not set(memory.get(conn, "q").blocked) & set(blocked)
    assert len(sent) == 3
    for claim_steps in sent:  # the windowed claims (the reference claim is not windowed)
        names = [name for _, names in claim_steps for name in names]
        # one round trip with one window, then the take
        assert names.count("claim_window") + names.count("claim_window_whole") == 1, names
        assert names[-1] == "claim_take"


def test_a_key_left_without_room_stays_so_for_the_claim(
        conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key at its limit when the first window took the open route gets no room in
    that claim even if its run ends before the next window: that window does not read
    its flagged jobs, so taking its later (unflagged) job would pass them over."""
    _limit(conn, "k")
    for i in range(100):  # groups enough that the claim reads windows, not per group
        _limit(conn, f"b{i:02d}")
    ids = _queue(conn, [
        *(("k", "t", True) for _ in range(5)),
        *((f"b{i % 100:02d}", "t", True) for i in range(200)),
        # the first window (80 entries of the free part) holds none of these
        *((None, "other", False) for _ in range(85)),
        ("k", "t", False),  # queued before k had its limit
        *((None, "t", False) for _ in range(30)),
    ])
    unflagged = ids[5 + 200 + 85]
    ended = []
    steps: list[Batch | Statement] = []

    def end_k_run(step: Batch | Statement, names: list[str]) -> None:
        # before the claim's second window: k's run ends (k has room again)
        if steps and "claim_window" in names and not ended:
            with psycopg.connect(conn.info.dsn, autocommit=True) as other:
                other.execute("UPDATE akadze.jobs SET state = 'succeeded' "
                              "WHERE queue = 'elsewhere' AND limit_key = 'k'")
            ended.append(True)
        steps.append(step)

    watch_steps(monkeypatch, on_claim=lambda: None, on_step=end_k_run)
    got = claim(conn, queue="q", slots=20, tasks=["t"], now=NOW)
    assert ended, "the claim read a second window"
    assert _known_open(steps[0]) == [None]  # the first window looked for the route
    later = [opened for step in steps[1:] for opened in _known_open(step)]
    # the later windows read the same (empty) open set
    assert later and all(opened is not None and opened.obj == [] for opened in later)
    assert unflagged not in {j.id for j in got}
    assert len(got) == 20 and all(j.limit_key is None for j in got)


def test_too_many_keys_with_room_keep_the_judged_window(
        conn: Conn, sent: list[list[Any]]) -> None:
    """With more keys with room than a window splits over (SPLIT_MAX), the first
    window reads the limited part in order as before: the claim is still exact."""
    for i in range(40):
        _limit(conn, f"b{i:02d}")
    for i in range(40):
        _limit(conn, f"o{i:02d}", running=0)
    _queue(conn, [*((f"b{i % 40:02d}", "t", True) for i in range(400)),
                  *((f"o{i % 40:02d}", "t", True) for i in range(40))])
    assert len(claim_as_reference(conn, queue="q", slots=20, now=NOW)) == 20
    windows = [opened for step, _ in sent[-1] for opened in _known_open(step)]
    assert windows and all(opened is None for opened in windows)

