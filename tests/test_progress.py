"""current().progress(fraction, message): coalesced to at most one write a second per
job, visible in get_job, akadze jobs show and the metrics; bad values refused."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from worker_support import eventually

from akadze import Akadze, AkadzeError, JobState, Worker, current, get_job_sync
from akadze.metrics import render_sync

COUNT_WRITES = """
CREATE TABLE akadze_test_progress_writes (at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION akadze_test_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO akadze_test_progress_writes DEFAULT VALUES; RETURN NULL; END $$;
CREATE TRIGGER akadze_test_count AFTER UPDATE OF progress ON akadze.jobs
    FOR EACH ROW EXECUTE FUNCTION akadze_test_count();
"""


def test_progress_is_coalesced_and_shown_everywhere(app: Akadze, conn: Any) -> None:
    conn.execute(COUNT_WRITES)
    gate, reported = threading.Event(), threading.Event()
    refused: list[str] = []

    @app.task("long")
    def long() -> None:
        run = current()
        for bad in (1.5, -0.1, float("nan"), True, "0.5"):
            try:
                run.progress(bad)  # type: ignore[arg-type]
            except AkadzeError as exc:
                refused.append(str(exc))
        for i in range(2000):
            run.progress(i / 2000, message=f"row {i}")
        run.progress(0.75, message="three quarters")
        reported.set()
        assert gate.wait(30)

    job_id = long.using().enqueue_sync()

    async def run() -> float:
        async with Worker(app):
            started = time.monotonic()
            await asyncio.to_thread(reported.wait, 30)

            def shown() -> Any:
                job = get_job_sync(app, job_id)
                return job if job.progress == 0.75 else None

            job = await eventually(shown, what="the last progress written")
            assert job.progress_message == "three quarters" and job.progress_at is not None
            assert job.state is JobState.RUNNING
            text = render_sync(app)
            assert f'akadze_job_progress{{job_id="{job_id}",queue="default",task="long"}} 0.75' \
                in text
            elapsed = time.monotonic() - started
            gate.set()
            return elapsed

    elapsed = asyncio.run(run())
    assert len(refused) == 5
    writes = conn.execute("SELECT count(*) FROM akadze_test_progress_writes").fetchone()[0]
    # 2001 reports: one write per second at most (plus the one in flight at the start)
    assert 1 <= writes <= elapsed + 2
    assert get_job_sync(app, job_id).progress == 0.75  # kept once the job is done


def test_jobs_show_prints_progress_and_the_workflow(app: Akadze, conn: Any) -> None:
    from click.testing import CliRunner

    from akadze.cli import cli

    @app.task("t")
    def t() -> None:
        pass

    parent = t.using().enqueue_sync()
    child = t.using(after=[parent]).enqueue_sync()
    conn.execute("UPDATE akadze.jobs SET state = 'running', progress = 0.5, "
                 "progress_message = 'half', progress_at = now() WHERE id = %s", (parent,))
    runner = CliRunner()
    shown = runner.invoke(cli, ["jobs", "show", str(parent), "--database-url",
                                 app.database_url])
    assert shown.exit_code == 0, shown.output
    assert "progress    50% half" in shown.output and f"children    {child}" in shown.output
    shown = runner.invoke(cli, ["jobs", "show", str(child), "--database-url",
                                 app.database_url])
    assert f"parents     {parent} (waiting for 1)" in shown.output
    assert "waiting" in shown.output


def test_outside_a_run_progress_is_refused() -> None:
    with pytest.raises(AkadzeError):
        current().progress(0.5)
