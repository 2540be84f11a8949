"""The pipelined worker: a claim is in flight while the jobs run, jobs claimed ahead
wait in a small buffer, and they are given back or cancelled like running jobs."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from worker_support import Events, eventually

from akadze import Akadze, Worker, current, request_cancel
from akadze.worker import WorkerEvent

SLOTS = 20


def _insert(conn: psycopg.Connection[Any], task: str, count: int, **columns: Any) -> list[int]:
    key = columns.get("limit_key")
    return [int(row[0]) for row in conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key) "
        "SELECT 'default', %s, %s FROM generate_series(1, %s) RETURNING id",
        (task, key, count))]


def _claimed_here(conn: psycopg.Connection[Any], worker_id: str) -> int:
    row = conn.execute("SELECT count(*) FROM akadze.jobs WHERE state = 'running' "
                       "AND worker_id = %s", (worker_id,)).fetchone()
    return int(row[0]) if row else 0


class _Gated:
    """Tasks of the test: ``quick`` returns at once; ``gated`` runs until the gate
    opens. Counts what runs, and notes at each ``claimed`` event how many gated
    runs were going on."""

    def __init__(self, app: Akadze) -> None:
        self.gate = asyncio.Event()
        self.running = 0
        self.started: set[int] = set()
        self.most = 0
        self.claimed_while_running: list[int] = []

        @app.task("quick")
        async def quick() -> None:
            return None

        @app.task("gated")
        async def gated() -> None:
            self.running += 1
            self.started.add(current().id)
            self.most = max(self.most, self.running)
            try:
                await self.gate.wait()
            finally:
                self.running -= 1

    def __call__(self, event: WorkerEvent) -> None:
        if event.kind == "claimed":
            self.claimed_while_running.append(self.running)


async def _claimed_ahead(tasks: _Gated) -> None:
    """Wait for a claim that returned while every slot ran (call it with the slots
    all running)."""
    tasks.claimed_while_running.clear()
    await eventually(lambda: SLOTS in tasks.claimed_while_running, what="jobs claimed ahead")


async def _warm_up(conn: psycopg.Connection[Any], worker: Worker) -> None:
    """Quick runs first: the worker learns that its runs are short against a claim."""
    _insert(conn, "quick", 3 * SLOTS)
    await eventually(lambda: worker.counts["succeeded"] == 3 * SLOTS, what="the warm-up")
    await worker.wait_idle()


async def test_a_claim_is_in_flight_while_every_slot_runs(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    tasks = _Gated(app)
    async with Worker(app, slots=SLOTS, poll_interval=60, on_event=tasks) as worker:
        await _warm_up(conn, worker)
        _insert(conn, "gated", SLOTS)
        await eventually(lambda: tasks.running == SLOTS, what="every slot running")
        tasks.claimed_while_running.clear()
        _insert(conn, "gated", 2 * SLOTS)
        # Its signals say it: a claim returned while all 20 slots were running
        # (none can end: the gate is closed).
        await eventually(lambda: tasks.claimed_while_running, what="a claim while running")
        assert tasks.claimed_while_running[0] == SLOTS
        # And the database: more jobs are claimed by this worker than it has slots,
        # while its 20 runs go on.
        assert _claimed_here(conn, worker.worker_id) > SLOTS
        assert tasks.running == SLOTS and worker.running == SLOTS
        tasks.gate.set()
        await eventually(lambda: worker.counts["succeeded"] == 6 * SLOTS, what="the rest")
    assert tasks.most == SLOTS  # never more runs at once than slots
    row = conn.execute("SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*) "
                       "FROM akadze.jobs").fetchone()
    assert row == (6 * SLOTS, 6 * SLOTS)


async def test_jobs_claimed_ahead_are_given_back_untouched_on_stop(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    tasks = _Gated(app)
    async with Worker(app, slots=SLOTS, poll_interval=60, shutdown_timeout=0.2,
                      on_event=tasks) as worker:
        await _warm_up(conn, worker)
        _insert(conn, "gated", SLOTS)
        await eventually(lambda: tasks.running == SLOTS, what="every slot running")
        ahead = set(_insert(conn, "gated", SLOTS))
        await _claimed_ahead(tasks)
        buffered = {int(r[0]) for r in conn.execute(
            "SELECT id FROM akadze.jobs WHERE state = 'running' AND task = 'gated'")
        } - tasks.started
    assert buffered and buffered <= ahead
    rows = {int(r[0]): (str(r[1]), int(r[2]), r[3]) for r in conn.execute(
        "SELECT id, state::text, attempt, errors FROM akadze.jobs WHERE task = 'gated'")}
    assert {state for state, _, _ in rows.values()} == {"queued"}
    for job_id in buffered:  # never started: no trace, no attempt spent
        _, attempt, errors = rows[job_id]
        assert attempt == 0 and not errors, (job_id, rows[job_id])
    started = [job_id for job_id in rows if job_id not in buffered]
    assert set(started) == tasks.started and len(started) == SLOTS
    given_back = [job_id for job_id in started
                  if any(e.get("error") == "GivenBack" for e in (rows[job_id][2] or []))]
    assert len(given_back) == SLOTS  # the runs that had started leave their trace


async def test_a_job_claimed_ahead_and_cancelled_never_runs(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    tasks = _Gated(app)
    async with Worker(app, slots=SLOTS, poll_interval=60, on_event=tasks) as worker:
        await _warm_up(conn, worker)
        _insert(conn, "gated", SLOTS)
        await eventually(lambda: tasks.running == SLOTS, what="every slot running")
        _insert(conn, "gated", SLOTS)
        await _claimed_ahead(tasks)
        waiting = sorted({int(r[0]) for r in conn.execute(
            "SELECT id FROM akadze.jobs WHERE state = 'running' AND task = 'gated'")}
            - tasks.started)
        assert waiting
        assert await request_cancel(app, waiting[0]) is True
        await eventually(lambda: worker.counts["cancelled"] == 1, what="the cancellation")
        tasks.gate.set()
        await eventually(lambda: worker.counts["succeeded"] == 5 * SLOTS - 1, what="the rest")
    row = conn.execute("SELECT state::text, errors -> -1 ->> 'message' FROM akadze.jobs "
                       "WHERE id = %s", (waiting[0],)).fetchone()
    assert row == ("cancelled", "cancellation was requested before it started")


async def test_jobs_claimed_ahead_are_given_back_untouched_when_fenced(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str
) -> None:
    tasks = _Gated(app)
    events = Events()
    blocker = psycopg.connect(database_url)
    try:
        async with Worker(app, slots=SLOTS, poll_interval=60, lease=1.0,
                          on_event=lambda e: (events(e), tasks(e))) as worker:
            await _warm_up(conn, worker)
            _insert(conn, "gated", SLOTS)
            await eventually(lambda: tasks.running == SLOTS, what="every slot running")
            _insert(conn, "gated", SLOTS)
            await _claimed_ahead(tasks)
            claimed = {int(r[0]) for r in conn.execute(
                "SELECT id FROM akadze.jobs WHERE state = 'running' AND task = 'gated'")}
            buffered = claimed - tasks.started
            assert buffered
            # The worker's heartbeats now block until the lock is released.
            blocker.execute("LOCK TABLE akadze.workers IN ACCESS EXCLUSIVE MODE")
            fenced = events.seen[await events.next("fenced", within=10)]
            assert set(fenced.job_ids) == claimed  # the runs and the buffered jobs
            await eventually(lambda: _claimed_here(conn, worker.worker_id) == 0,
                             what="every job given back")
            rows = {int(r[0]): (int(r[1]), r[2]) for r in conn.execute(
                "SELECT id, attempt, errors FROM akadze.jobs WHERE id = ANY(%s)",
                (sorted(buffered),))}
            assert all(attempt == 0 and not errors for attempt, errors in rows.values())
            blocker.rollback()
            tasks.gate.set()
            await eventually(lambda: worker.counts["succeeded"] == 5 * SLOTS,
                             what="the rest", within=20)
    finally:
        blocker.close()


class _Sizes:
    """The job ids of each ``claimed`` and ``cut_back`` event, in order."""

    def __init__(self) -> None:
        self.claimed: list[tuple[int, ...]] = []
        self.cut_back: list[tuple[int, ...]] = []

    def __call__(self, event: WorkerEvent) -> None:
        if event.kind == "claimed":
            self.claimed.append(event.job_ids)
        elif event.kind == "cut_back":
            self.cut_back.append(event.job_ids)


async def test_short_runs_are_claimed_far_ahead_of_few_slots(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    tasks, sizes = _Gated(app), _Sizes()
    async with Worker(app, slots=SLOTS, poll_interval=60,
                      on_event=lambda e: (tasks(e), sizes(e))) as worker:
        await _warm_up(conn, worker)
        sizes.claimed.clear()
        _insert(conn, "quick", 25 * SLOTS)
        await eventually(lambda: worker.counts["succeeded"] == 28 * SLOTS, what="the backlog")
    # Runs far shorter than a claim: one claim took more than twice the slots
    # (the jobs beyond them waited claimed ahead), and no job was claimed twice
    # except after a cut-back gave it back untouched. (On a loaded machine a stall
    # can make a no-op run look long for a moment; its cut-back is then the
    # worker's answer, not a fault.)
    assert max(len(ids) for ids in sizes.claimed) > 2 * SLOTS
    claimed = [i for ids in sizes.claimed for i in ids]
    given_back = [i for ids in sizes.cut_back for i in ids]
    assert len(set(claimed)) == 25 * SLOTS
    assert len(claimed) == 25 * SLOTS + len(given_back)
    assert set(given_back) <= set(claimed)
    assert len(given_back) <= 25 * SLOTS // 2  # the exception, not the rule


async def test_jobs_claimed_far_ahead_are_given_back_untouched_when_runs_turn_long(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    slots = 2
    tasks, sizes = _Gated(app), _Sizes()
    runs: dict[int, int] = {}
    ran_when_cut: list[set[int]] = []  # the jobs that had run, at each cut_back

    @app.task("counted")
    async def counted() -> None:
        runs[current().id] = runs.get(current().id, 0) + 1

    @app.task("long")
    async def long() -> None:
        # Runs that turn long: past the gate, half a second each (the workload,
        # not a synchronisation), far longer than a claim.
        await tasks.gate.wait()
        await asyncio.sleep(0.5)

    def on_event(event: WorkerEvent) -> None:
        tasks(event)
        sizes(event)
        if event.kind == "cut_back":
            ran_when_cut.append(set(runs))

    async with Worker(app, slots=slots, poll_interval=60, on_event=on_event) as worker:
        _insert(conn, "quick", 10 * slots)  # runs much shorter than a claim
        await eventually(lambda: worker.counts["succeeded"] == 10 * slots, what="the warm-up")
        await worker.wait_idle()
        gated = set(_insert(conn, "long", slots))
        await eventually(lambda: worker.running == slots, what="every slot running")
        sizes.claimed.clear()
        behind = set(_insert(conn, "counted", 400))
        # A claim while both slots run: the jobs wait claimed ahead, far more than
        # the slots, as the last runs were short.
        await eventually(lambda: sum(len(ids) for ids in sizes.claimed) > 4 * slots,
                         what="jobs claimed ahead")
        assert _claimed_here(conn, worker.worker_id) > 4 * slots
        # The long runs end: at their pace the buffer's last jobs would wait
        # for minutes, and the tail is given back untouched.
        tasks.gate.set()
        await eventually(lambda: sizes.cut_back, what="the buffer cut back")
        given = set(sizes.cut_back[0])
        assert given and given <= behind and not given & ran_when_cut[0]
        await eventually(lambda: worker.counts["succeeded"] == 10 * slots + slots + 400,
                         what="the rest", within=30)
    assert set(runs) == behind and set(runs.values()) == {1}  # each ran once
    rows = conn.execute("SELECT state::text, attempt, errors FROM akadze.jobs "
                        "WHERE id = ANY(%s)", (sorted(given),)).fetchall()
    # Given back without a trace: the run that finished them is their first.
    assert {(state, attempt) for state, attempt, _ in rows} == {("succeeded", 1)}
    assert all(not errors for _, _, errors in rows)
    assert gated <= {int(r[0]) for r in conn.execute(
        "SELECT id FROM akadze.jobs WHERE state = 'succeeded'")}
