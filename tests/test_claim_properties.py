"""The windowed claim against the reference claim, on random queues in a real database.

Each case is built twice on identical state (same ids): once for the reference
(full-ranking) claim, once for the windowed claim. Both must claim the same jobs
in the same order, and leave the same rows, start marks and hook calls behind.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akadze import Akadze
from akadze.claim import Hints, claim, claim_oracle, memory

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(seconds=60)
# The windowed claim's module: the tests switch its group-scan bounds.
claim_module = importlib.import_module("akadze.claim._windows")
KEYS = [None, "a", "b", "c", "d", "e", "f", "g"]
Conn = psycopg.Connection[tuple[Any, ...]]


@dataclass(frozen=True)
class Case:
    jobs: list[tuple[Any, ...]]
    limits: list[tuple[str, int | None, int | None, timedelta | None]]
    marks: list[tuple[str, datetime]]
    paused: bool
    slots: int
    fair: bool
    tasks: list[str] | None
    # how the windowed claim reads: default thresholds, no group scan, a scan
    # bound too small to list every group, or reads per group after windows
    # found to be dominated (DOMINATED_RATIO)
    scan: str
    # what the windowed claim remembers from a previous claim on the connection
    # (hints: any blocked keys, limited or not, existing or not, any groups,
    # fewer or more than the queue has, any read size, must give the same claim)
    remembered: tuple[str, ...] = ()
    groups: frozenset[str | None] | None = None
    read: int = 0
    many_groups: bool = False
    # remembered keys said to have been met in the free part (any keys: a hint)
    unflagged: frozenset[str] = frozenset()
    # jobs.limited (migration 0005): "flagged": the queued jobs of limited keys
    # flagged, as enqueue flags them; "stale": every flag false (jobs inserted by
    # hand, or queued before their key got a limit); "mixed": flagged, then some
    # flags cleared. Each is a legal state.
    flags: str = "flagged"
    unflag: frozenset[int] = frozenset()
    # windows.SPLIT_MAX: how many limited keys a split window may probe
    split_max: int = 32
    # groups said to have had at least busy_turn jobs running in the queue (any
    # groups, busy or not, limited or not: a hint), presumed hopeless however few
    busy: tuple[str, ...] = ()
    busy_turn: int = 0


JOB_COLUMNS = ("id", "queue", "task", "state", "priority", "run_at", "limit_key",
               "cancel_requested", "expires_at", "attempt", "run_count")


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(0, 140))
    skewed = draw(st.booleans())
    hot = draw(st.sampled_from(KEYS))
    spread = draw(st.integers(0, 7))
    rows = draw(st.lists(st.tuples(
        st.integers(0, 99),                      # kind of row
        st.integers(0, 7),                       # key index
        st.sampled_from([0, 0, 0, 0, 1, 3, -1]),  # priority
        st.integers(-8, 2),                      # run_at offset (s); > 0: not due
        st.integers(0, 9),                       # key bias
    ), min_size=n, max_size=n))
    jobs = []
    for i, (kind, key_index, priority, offset, bias) in enumerate(rows):
        key = hot if skewed and bias < 6 else KEYS[key_index % (spread + 1)]
        queue, state, cancel, expires, task = "q", "queued", False, None, "a"
        if kind < 8:
            state = "running"
        elif kind < 11:
            queue, state = "other", "running"
        elif kind < 13:
            queue = "other"
        elif kind < 15:
            cancel = True
        elif kind < 17:
            expires = NOW - timedelta(seconds=kind - 15)
        elif kind < 19:
            expires = NOW + timedelta(seconds=1)
        elif kind < 24:
            task = "b"
        elif kind < 26:
            state = "succeeded"
        jobs.append((i + 1, queue, task, state, priority, NOW + timedelta(seconds=offset), key,
                     cancel, expires, 0, 0))
    limited = draw(st.lists(st.sampled_from(KEYS[1:]), unique=True, max_size=6))
    limits = []
    marks = []
    for key in limited:
        max_running = draw(st.one_of(st.none(), st.integers(0, 4)))
        max_starts = draw(st.integers(1, 4)) if max_running is None else draw(
            st.one_of(st.none(), st.integers(1, 4)))
        limits.append((key, max_running, max_starts, WINDOW if max_starts else None))
        if max_starts:
            for age in draw(st.lists(st.integers(0, 120), max_size=5)):
                marks.append((key, NOW - timedelta(seconds=age)))
    return Case(
        jobs=jobs, limits=limits, marks=marks,
        paused=draw(st.integers(0, 19)) == 0,
        slots=draw(st.sampled_from([1, 3, 20])),
        fair=draw(st.booleans()),
        tasks=draw(st.sampled_from([None, None, ["a"], ["a", "b"]])),
        scan=draw(st.sampled_from(["default", "off", "small", "wide"])),
        # limited keys twice as likely: a remembered key near its limit is the
        # case a wrong "still without room" would get wrong
        remembered=tuple(draw(st.lists(st.sampled_from([*limited, *limited, *KEYS[1:], "gone"]),
                                       unique=True, max_size=4))),
        unflagged=frozenset(draw(st.sets(st.sampled_from([*KEYS, "gone"]), max_size=3))),
        # the queue's groups, as a previous claim may have listed them: mostly
        # those of the jobs here (a few more or fewer), sometimes none at all
        groups=draw(st.one_of(
            st.none(),
            st.builds(lambda extra, drop: frozenset(
                {j[6] for j in jobs if j[1] == "q" and j[3] == "queued"} | set(extra)) - set(drop),
                st.sets(st.sampled_from([*KEYS, "gone"]), max_size=2),
                st.sets(st.sampled_from(KEYS), max_size=1)),
            st.frozensets(st.sampled_from([*KEYS, "gone"]), max_size=5))),
        read=draw(st.sampled_from([0, 0, 7, 100, 5000])),
        many_groups=draw(st.booleans()),
        flags=draw(st.sampled_from(["flagged", "stale", "mixed"])),
        unflag=draw(st.frozensets(st.integers(1, max(n, 1)), max_size=20)),
        split_max=draw(st.sampled_from([32, 32, 1, 0, -1])),
        busy=tuple(draw(st.lists(st.sampled_from([*KEYS[1:], "gone"]), unique=True,
                                 max_size=6))),
        busy_turn=draw(st.sampled_from([0, 1, 1, 2, 3])),
    )


def load(conn: Conn, case: Case) -> None:
    with conn.transaction():
        conn.execute("DELETE FROM akadze.jobs; DELETE FROM akadze.limits; "
                     "DELETE FROM akadze.start_marks; DELETE FROM akadze.queue_pauses")
        with conn.cursor() as cur:
            with cur.copy(f"COPY akadze.jobs ({', '.join(JOB_COLUMNS)}) FROM STDIN") as copy:
                for job in case.jobs:
                    copy.write_row(job)
            if case.limits:
                cur.executemany(
                    'INSERT INTO akadze.limits (key, max_running, max_starts, "window") '
                    "VALUES (%s, %s, %s, %s)", case.limits)
            if case.flags != "stale":
                cur.execute("UPDATE akadze.jobs SET limited = true WHERE state = 'queued' "
                            "AND limit_key IN (SELECT key FROM akadze.limits)")
                # and the runs, as a claim starts them under the limit: the limits
                # rows count them (migration 0017), so a key at its limit shows
                # full there and a first window may take the open route (0018)
                cur.execute("UPDATE akadze.jobs SET limited = true WHERE state = 'running' "
                            "AND limit_key IN (SELECT key FROM akadze.limits)")
            if case.flags == "mixed":
                cur.execute("UPDATE akadze.jobs SET limited = false WHERE id = ANY (%s)",
                            [sorted(case.unflag)])
            if case.marks:
                cur.executemany(
                    "INSERT INTO akadze.start_marks (key, started_at, job_id) VALUES (%s, %s, 0)",
                    case.marks)
            if case.paused:
                cur.execute("INSERT INTO akadze.queue_pauses (queue) VALUES ('q')")


def effects(conn: Conn) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    jobs = conn.execute(
        "SELECT id, state::text, run_count, attempt, worker_id, started_at, finished_at "
        "FROM akadze.jobs ORDER BY id").fetchall()
    marks = conn.execute(
        "SELECT key, started_at, job_id FROM akadze.start_marks ORDER BY 1, 2, 3").fetchall()
    return jobs, marks


@pytest.fixture
def scan_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    def set_mode(mode: str, split_max: int = claim_module.SPLIT_MAX) -> None:
        # Outside the default mode the remembered keys are used however few.
        if mode == "off":
            monkeypatch.setattr(claim_module, "GROUP_SCAN_TRY", -1)
            monkeypatch.setattr(claim_module, "MEMORY_FROM", 1)
        elif mode == "small":
            monkeypatch.setattr(claim_module, "GROUP_SCAN_TRY", 100)
            monkeypatch.setattr(claim_module, "GROUP_SCAN_BOUND", 3)
            monkeypatch.setattr(claim_module, "MEMORY_FROM", 1)
        elif mode == "wide":
            # every window that leaves keys out of the free part counts as
            # dominated: the claim turns from windows to reads per group midway
            # (the ordinary skip scan too small to list the groups first)
            monkeypatch.setattr(claim_module, "GROUP_SCAN_BOUND", 2)
            monkeypatch.setattr(claim_module, "DOMINATED_FROM", 0)
            monkeypatch.setattr(claim_module, "DOMINATED_RATIO", 0)
            monkeypatch.setattr(claim_module, "WIDE_GROUP_SCAN", 100)
        else:
            monkeypatch.undo()
        monkeypatch.setattr(claim_module, "SPLIT_MAX", split_max)
        monkeypatch.setattr(claim_module, "PRESUME_FROM", 1)
    yield set_mode


def run(conn: Conn, case: Case, claim_fn: Callable[..., Any]) -> tuple[Any, ...]:
    load(conn, case)
    calls: list[tuple[int, str, str]] = []
    app = Akadze("postgresql://x@localhost/x")
    app.on_transition(lambda c, job, old, new: calls.append((job.id, old, new)))
    got = claim_fn(conn, queue="q", slots=case.slots, fair=case.fair, worker_id="w",
                   tasks=case.tasks, app=app, now=NOW)
    # Each claim draws its own random claim tokens: every claimed job gets one, the
    # token on the row is the one returned, and the rest of the records must agree.
    tokens = dict(conn.execute(
        "SELECT id, claim_token FROM akadze.jobs WHERE state = 'running'").fetchall())
    assert all(job.claim_token is not None and tokens[job.id] == job.claim_token
               for job in got)
    got = [dataclasses.replace(job, claim_token=None) for job in got]
    return [job.id for job in got], effects(conn), sorted(calls), got


def check(conn: Conn, case: Case, scan_mode: Callable[..., None]) -> None:
    expected = run(conn, case, claim_oracle)
    scan_mode(case.scan, case.split_max)
    # "wide" reads windows from the head (no remembered groups or read size), so
    # that a claim meets the windows it watches
    wide = case.scan == "wide"
    memory.put(conn, "q", Hints(case.remembered, 0 if wide else case.read,
                                None if wide else case.groups, case.many_groups,
                                case.unflagged, dominated=wide, busy=case.busy,
                                busy_turn=case.busy_turn))
    got = run(conn, case, claim)
    assert got[0] == expected[0], "claimed jobs differ"
    assert got[1] == expected[1], "effects differ"
    assert got[2] == expected[2], "hook calls differ"
    assert got[3] == expected[3], "returned records differ"


SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                              HealthCheck.data_too_large],
}


# A fixed amount of work (examples), not a duration: on a busy machine 300 examples
# took over two minutes (the suite's per-test timeout, which is there to catch hangs).
# The fast suite samples 100; the slow run below checks 4 000.
@pytest.mark.timeout(600)
@settings(max_examples=100, **SETTINGS)  # type: ignore[arg-type]
@given(case=cases())
def test_windowed_claim_equals_the_reference(
    conn: Conn, scan_mode: Callable[..., None], case: Case
) -> None:
    check(conn, case, scan_mode)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=4000, **SETTINGS)  # type: ignore[arg-type]
@given(case=cases())
def test_windowed_claim_equals_the_reference_many(
    conn: Conn, scan_mode: Callable[..., None], case: Case
) -> None:
    check(conn, case, scan_mode)
