"""Clean refusals (issue 21, finding 10): input that PostgreSQL or Python cannot take
(a NUL, a lone surrogate, a name too long for an index or a notification, JSON nested
past the recursion limit) is refused with the error of its kind naming the field,
before any statement, and nothing is written."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze import Akadze
from akadze.cli import main
from akadze.control import pause_queue, pause_queue_sync, resume_queue_sync
from akadze.errors import ConfigurationError, EnqueueError, FilterError
from akadze.overview import list_jobs, list_jobs_sync, queue_snapshot_sync

AKADZE = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "akadze")
# Random bytes as hex: a name PostgreSQL cannot compress below its index limit.
LONG_NAME = os.urandom(10_000).hex()
DEEP = "[" * 5000 + "]" * 5000


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("filters", "message"), [
    ({"task": "\x00"}, "task must not contain a NUL character"),
    ({"queue": "\x00"}, "queue must not contain a NUL character"),
    ({"queue": "\udcff"}, "queue is not valid Unicode (a lone surrogate)"),
    ({"queue": LONG_NAME}, "queue is 20000 bytes long in UTF-8; at most 1000"),
    ({"queue": ""}, "queue must not be empty"),
    ({"meta": {"a": "\x00"}}, "meta filter: meta.a contains a NUL character"),
    ({"meta": {"a": _nested(5000)}}, "meta filter: meta.a[0]"),
], ids=["task-nul", "queue-nul", "queue-surrogate", "queue-long", "queue-empty", "meta-nul",
        "meta-deep"])
async def test_list_filters_are_refused_by_name(app: Akadze, filters: dict[str, Any],
                                                message: str) -> None:
    with pytest.raises(FilterError) as info:
        list_jobs_sync(app, **filters)
    assert str(info.value).startswith(message)
    with pytest.raises(FilterError):
        await list_jobs(app, **filters)


def test_a_queue_snapshot_of_a_bad_name_is_refused(app: Akadze) -> None:
    with pytest.raises(FilterError, match=r"^queue must not contain a NUL character$"):
        queue_snapshot_sync(app, "q\x00")


async def test_pause_and_resume_refuse_names_no_job_could_have(
        app: Akadze, conn: psycopg.Connection[Any]) -> None:
    for bad, message in ((LONG_NAME, "queue is 20000 bytes long in UTF-8; at most 1000"),
                         ("\udcff", "queue is not valid Unicode (a lone surrogate)")):
        with pytest.raises(ConfigurationError) as info:
            pause_queue_sync(app, bad)
        assert str(info.value) == message
        with pytest.raises(ConfigurationError):
            await pause_queue(app, bad)
        with pytest.raises(ConfigurationError):
            resume_queue_sync(app, bad)
    assert conn.execute("SELECT count(*) FROM akadze.queue_pauses").fetchone() == (0,)
    assert pause_queue_sync(app, "x" * 1000) is True  # the longest name a job can have
    assert resume_queue_sync(app, "x" * 1000) is True


def test_arguments_nested_too_deeply_name_the_argument(
        app: Akadze, conn: psycopg.Connection[Any]) -> None:
    @app.task("deep")
    def deep(tree: Any = None) -> None:
        return None

    for enqueue in (lambda: deep.using().enqueue_sync(tree=_nested(5000)),
                    lambda: deep.using().enqueue_many_sync([{"tree": _nested(5000)}])):
        with pytest.raises(EnqueueError) as info:
            enqueue()
        assert info.value.field == "tree"
        assert "argument 'tree' is not storable as JSON" in str(info.value)
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)


def _one_clean_line(code: int, err: str, expected_code: int) -> None:
    assert code == expected_code, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_cli_meta_nested_too_deeply(database_url: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["jobs", "list", "--meta", f"a:={DEEP}", "--database-url", database_url])
    err = capsys.readouterr().err
    _one_clean_line(code, err, 2)
    assert "'--meta'" in err and "nested too deeply" in err


def test_cli_refusals_as_a_subprocess(database_url: str) -> None:
    # A name that cannot be decoded arrives as a lone surrogate (surrogateescape).
    for argv, needle in (
        (["queues", "pause", LONG_NAME], "queue is 20000 bytes long"),
        (["jobs", "list", "--queue", os.fsdecode(b"\xff")], "queue is not valid Unicode"),
        (["jobs", "list", "--meta", f"a:={DEEP}"], "nested too deeply"),
    ):
        result = subprocess.run([AKADZE, *argv, "--database-url", database_url],
                                capture_output=True, text=True, check=False, timeout=60)
        _one_clean_line(result.returncode, result.stderr, 2)
        assert needle in result.stderr


async def test_the_dashboard_refuses_a_body_nested_too_deeply(
        app: Akadze, conn: psycopg.Connection[Any]) -> None:
    import httpx

    from akadze.dashboard import create_app

    asgi = create_app(app.database_url, allow_actions=True)
    transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        token = (await client.get("/api/session")).json()["csrf_token"]
        answer = await client.post(
            "/api/queues/pause", content=b'{"queue": ' + b"[" * 30000 + b"]" * 30000 + b"}",
            headers={"X-CSRF-Token": token, "Content-Type": "application/json"})
    await asgi.state.dashboard.close()
    assert answer.status_code == 400
    assert answer.json() == {"ok": False,
                             "error": "the body is not JSON (or is nested too deeply)"}
    assert conn.execute("SELECT count(*) FROM akadze.queue_pauses").fetchone() == (0,)


async def test_a_job_stored_too_deep_to_read_is_shown_marked_unreadable(
        app: Akadze, conn: psycopg.Connection[Any], database_url: str) -> None:
    # Written by SQL, as another tool could: jsonb takes nesting that Python's json
    # cannot read back. Every reader of the job shows it, its unreadable parts left out
    # and named, instead of failing on RecursionError.
    import httpx

    from akadze.dashboard import create_app
    from akadze.overview import get_job, get_job_sync

    deep = '{"a": ' + DEEP + "}"
    error = '[{"error": "E", "message": "m", "attempt": 1, "x": ' + DEEP + "}]"
    row = conn.execute(
        "INSERT INTO akadze.jobs (queue, task, args, meta, result, errors, state)"
        " VALUES ('q', 't', %s::jsonb, %s::jsonb, %s::jsonb, %s::jsonb, 'failed')"
        " RETURNING id", (deep, deep, DEEP, error)).fetchone()
    assert row is not None
    job_id = int(row[0])
    for job in (get_job_sync(app, job_id), await get_job(app, job_id)):
        assert (job.args, job.meta, job.result, job.errors) == ({}, {}, None, [])
        assert job.unreadable == "; ".join(
            f"{column}: nested too deeply to read (past Python's recursion limit)"
            for column in ("meta", "args", "errors", "result"))
    listed = list_jobs_sync(app, queue="q")
    assert [(j.id, j.meta, j.last_error) for j in listed] == [(job_id, {}, None)]
    assert listed[0].unreadable is not None and listed[0].unreadable.startswith("meta: ")
    # The CLI shows it (and its JSON), one clean exit.
    for extra in ([], ["--json"]):
        shown = await asyncio.to_thread(
            subprocess.run, [AKADZE, "jobs", "show", str(job_id), *extra,
                             "--database-url", database_url],
            capture_output=True, text=True, check=False, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "nested too deeply" in shown.stdout and "Traceback" not in shown.stderr
    listed_cli = await asyncio.to_thread(
        subprocess.run, [AKADZE, "jobs", "list", "--database-url", database_url],
        capture_output=True, text=True, check=False, timeout=60)
    assert listed_cli.returncode == 0, listed_cli.stderr
    assert str(job_id) in listed_cli.stdout
    # So does the dashboard: the job's page and its JSON.
    asgi = create_app(app.database_url)
    transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        page = await client.get(f"/jobs/{job_id}")
        api = await client.get(f"/api/jobs/{job_id}")
        jobs_page = await client.get("/jobs?queue=q")
    await asgi.state.dashboard.close()
    assert page.status_code == 200 and "cannot be read here" in page.text
    assert api.status_code == 200 and api.json()["job"]["unreadable"].startswith("meta: ")
    assert jobs_page.status_code == 200 and str(job_id) in jobs_page.text
