"""Graceful and forced shutdown, in code and through the CLI with signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from test_worker_support import Events, eventually, insert_job, job, wait_event

from akadze import Akadze, Worker
from akadze.worker._state import wait_for


async def test_a_graceful_stop_lets_running_jobs_finish(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    started = asyncio.Event()
    proceed = asyncio.Event()

    @app.task("t")
    async def t() -> str:
        started.set()
        await proceed.wait()
        return "finished"

    job_id = insert_job(conn, "t")
    worker = Worker(app, poll_interval=0.05, shutdown_timeout=10)
    runner = asyncio.create_task(worker.run())
    await wait_event(started)
    worker.stop()
    waiting = insert_job(conn, "t")  # must not be claimed any more
    await asyncio.sleep(0.1)
    assert not runner.done()
    proceed.set()
    await asyncio.wait_for(runner, 10)
    assert job(conn, job_id)["state"] == "succeeded"
    assert job(conn, waiting)["state"] == "queued"
    assert conn.execute("SELECT count(*) FROM akadze.workers").fetchone() == (0,)


async def test_jobs_still_running_after_the_timeout_are_given_back(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    started = asyncio.Event()
    release = threading.Event()

    @app.task("async_long")
    async def async_long() -> None:
        started.set()
        await asyncio.sleep(60)

    @app.task("plain_long")
    def plain_long() -> str:
        release.wait(30)
        return "dropped"

    first = insert_job(conn, "async_long")
    second = insert_job(conn, "plain_long")
    async with Worker(app, poll_interval=0.05, shutdown_timeout=0.2) as worker:
        await wait_event(started)
        await eventually(lambda: worker.running == 2)
    release.set()
    for job_id in (first, second):
        row = job(conn, job_id)
        assert (row["state"], row["attempt"], row["run_count"]) == ("queued", 0, 1)
        assert row["worker_id"] is None
        # the give-back is in the job's history, and spent nothing
        [entry] = row["errors"]
        assert (entry["error"], entry["attempt"], entry["spent"]) == ("GivenBack", 1, False)
        assert entry["message"] == f"given back unfinished: worker {worker.worker_id} was stopped"
    assert worker.counts["given_back"] == 2


async def test_a_second_stop_does_not_wait(app: Akadze, conn: psycopg.Connection[Any]) -> None:
    started = asyncio.Event()

    @app.task("t")
    async def t() -> None:
        started.set()
        await asyncio.sleep(60)

    job_id = insert_job(conn, "t")
    worker = Worker(app, poll_interval=0.05, shutdown_timeout=60)
    runner = asyncio.create_task(worker.run())
    await wait_event(started)
    began = time.monotonic()
    worker.stop()
    worker.stop()
    await asyncio.wait_for(runner, 10)
    assert time.monotonic() - began < 5
    assert job(conn, job_id)["state"] == "queued"


APP_MODULE = """
import asyncio
import os
from akadze import Akadze

app = Akadze(os.environ["TEST_URL"])

@app.task("wait")
async def wait(seconds: float) -> str:
    print("started", flush=True)
    await asyncio.sleep(seconds)
    return "done"
"""


def _worker_process(tmp_path: Path, url: str, *extra: str) -> subprocess.Popen[str]:
    (tmp_path / "cliapp.py").write_text(textwrap.dedent(APP_MODULE))
    env = {**os.environ, "TEST_URL": url, "PYTHONPATH": str(tmp_path)}
    return subprocess.Popen(
        [sys.executable, "-m", "akadze", "worker", "cliapp:app", "--poll-interval", "0.05",
         *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _wait_started(process: subprocess.Popen[str]) -> list[str]:
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if line.startswith("started"):
            return lines
    raise AssertionError("worker never started the job:\n" + "".join(lines))


def test_the_cli_worker_stops_gracefully_on_sigterm(
    tmp_path: Path, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job_id = insert_job(conn, "wait", {"seconds": 0.5})
    process = _worker_process(tmp_path, database_url, "--shutdown-timeout", "20")
    try:
        _wait_started(process)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert job(conn, job_id)["state"] == "succeeded"
    assert "Traceback" not in output


def test_the_cli_worker_gives_jobs_back_on_a_second_signal(
    tmp_path: Path, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job_id = insert_job(conn, "wait", {"seconds": 60})
    process = _worker_process(tmp_path, database_url, "--shutdown-timeout", "60")
    try:
        _wait_started(process)
        process.send_signal(signal.SIGINT)
        time.sleep(0.2)  # let the first signal land before the second (not a sync point)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    row = job(conn, job_id)
    assert (row["state"], row["attempt"]) == ("queued", 0), output
    assert "Traceback" not in output


def test_the_cli_refuses_a_bad_app_reference_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "akadze", "worker", "no_such_module:app"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "no_such_module" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


async def test_run_installs_signal_handlers_when_asked(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    events = Events()
    worker = Worker(app, poll_interval=0.05, on_event=events)
    runner = asyncio.create_task(worker.run(install_signal_handlers=True))
    await events.next("ready")
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(runner, 10)
    assert current_loop_has_no_handler()


def current_loop_has_no_handler() -> bool:
    loop = asyncio.get_running_loop()
    return not loop.remove_signal_handler(signal.SIGTERM)


async def test_a_background_wait_ends_when_cancelled_as_its_event_fires() -> None:
    # The worker's background loops wait on events with a timeout (the worker
    # package's own wait_for) and are ended by cancellation. On Python 3.11,
    # asyncio.wait_for lost a cancellation that came as the awaited event fired
    # (CPython gh-86296): the loop went on and the worker's shutdown waited for it
    # forever (seen as a rare hang of a worker refusing a database without the
    # schema). Here the event fires and the cancellation comes in the same turn of
    # the event loop.
    event = asyncio.Event()
    rounds = 0

    async def background_loop() -> None:
        nonlocal rounds
        while True:
            await wait_for(event, 10.0)
            event.clear()
            rounds += 1

    loop_task = asyncio.create_task(background_loop())
    await asyncio.sleep(0)  # the loop is now waiting on the event
    event.set()
    loop_task.cancel()
    done, _ = await asyncio.wait({loop_task}, timeout=5.0)
    assert done == {loop_task} and loop_task.cancelled()
