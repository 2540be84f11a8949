"""Give-backs leave a trace and are capped: a job longer than the shutdown timeout,
given back at every restart, spends an attempt after GIVE_BACKS_PER_ATTEMPT of them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
from worker_support import insert_job, job, wait_event

from akadze import Akadze, Worker
from akadze.cli import main
from akadze.outcomes import GIVE_BACKS_PER_ATTEMPT


async def _give_back_once(app: Akadze, started: asyncio.Event) -> Worker:
    """Run a worker until the job started, then stop it at once (shutdown timeout 0)."""
    started.clear()
    async with Worker(app, poll_interval=0.05, shutdown_timeout=0) as worker:
        await wait_event(started)
    return worker


async def test_each_give_back_is_recorded_and_the_cap_spends_an_attempt(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str,
    capsys: Any,
) -> None:
    started = asyncio.Event()

    @app.task("long", max_attempts=2)
    async def long() -> None:
        started.set()
        await asyncio.sleep(60)

    job_id = insert_job(conn, "long", max_attempts=2)
    for _ in range(GIVE_BACKS_PER_ATTEMPT):
        await _give_back_once(app, started)
        row = job(conn, job_id)
        assert (row["state"], row["attempt"]) == ("queued", 0)  # refunded
    assert [e["spent"] for e in row["errors"]] == [False] * GIVE_BACKS_PER_ATTEMPT

    await _give_back_once(app, started)  # once more at attempt 1: the attempt is spent
    row = job(conn, job_id)
    assert (row["state"], row["attempt"]) == ("queued", 1)
    last = row["errors"][-1]
    assert (last["error"], last["attempt"], last["spent"]) == ("GivenBack", 1, True)
    assert last["message"].endswith(
        f"given back {GIVE_BACKS_PER_ATTEMPT + 1} times at this attempt: the attempt is spent")

    for _ in range(GIVE_BACKS_PER_ATTEMPT + 1):  # the same at attempt 2, the last: failed
        await _give_back_once(app, started)
    row = job(conn, job_id)
    assert (row["state"], row["attempt"]) == ("failed", 2)
    assert row["finished_at"] is not None and row["run_count"] == 2 * GIVE_BACKS_PER_ATTEMPT + 2

    capsys.readouterr()
    assert main(["jobs", "show", str(job_id), "--database-url", database_url]) == 0
    shown = capsys.readouterr().out
    assert f"runs so far: {row['run_count']}" in shown
    assert f"history ({row['run_count']} events recorded)" in shown
    assert shown.count("GivenBack: given back unfinished: worker ") == row["run_count"]


async def test_a_hook_sees_a_give_back_that_failed_the_job_as_failed(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    started = asyncio.Event()
    seen: list[tuple[str, str]] = []

    @app.on_transition
    def record(conn: Any, job: Any, old: str, new: str) -> None:
        seen.append((old, new))

    @app.task("long", max_attempts=1)
    async def long() -> None:
        started.set()
        await asyncio.sleep(60)

    insert_job(conn, "long", max_attempts=1)
    for _ in range(GIVE_BACKS_PER_ATTEMPT + 1):
        await _give_back_once(app, started)
    ends = [new for old, new in seen if old == "running"]  # claims run it too
    assert ends == ["queued"] * GIVE_BACKS_PER_ATTEMPT + ["failed"]


APP = """
import threading
from akadze import Akadze

app = Akadze()
release = threading.Event()

@app.task("quick")
def quick() -> None:
    return None

@app.task("slow")
def slow() -> None:
    print("slow started", flush=True)
    release.wait(30)
"""


def test_the_exit_line_counts_the_threads_still_running(
    tmp_path: Path, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    (tmp_path / "threads_app.py").write_text(textwrap.dedent(APP))
    for _ in range(3):  # three threads in the pool, two of them idle at the end
        insert_job(conn, "quick")
    worker = subprocess.Popen(
        [sys.executable, "-m", "akadze", "worker", "./threads_app.py:app", "--slots", "3",
         "--poll-interval", "0.05", "--shutdown-timeout", "0", "--database-url", database_url],
        cwd=tmp_path, env={**os.environ, "AKADZE_DATABASE_URL": ""},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert worker.stdout is not None
        lines = []
        for line in worker.stdout:
            lines.append(line)
            if "quick" in line and "succeeded" in line and sum(
                    "succeeded" in seen for seen in lines) == 3:
                insert_job(conn, "slow")
            if line.startswith("slow started"):
                break
        worker.send_signal(signal.SIGINT)
        output, _ = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == 0, output
    assert "exiting with 1 task thread still running (its job was given back)" in output
    assert "Traceback" not in output
