"""The dashboard over HTTP (in process, through its ASGI interface) on a real database:
every page and its JSON, bounded counts, the jobs list's filters and keyset paging,
actions (off by default, CSRF-checked), basic auth, no password anywhere, and no plan
of any page that reads the whole jobs table."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from dashboard_data import Filled, fill, state_of, tasks
from psycopg import sql
from starlette.applications import Starlette
from starlette.routing import Mount

from akadze import Akadze, queries
from akadze.cli import main
from akadze.cli.dashboard import exposure_warning
from akadze.dashboard import Credentials, create_app, credentials_from_env
from akadze.errors import ConfigurationError
from akadze.testing import drain

PAGES = ["/", "/limits", "/fairness", "/jobs", "/schedules"]
APIS = ["/api/overview", "/api/limits", "/api/fairness", "/api/jobs", "/api/schedules"]


@pytest.fixture
def dash_app(app: Akadze) -> Akadze:
    tasks(app)
    return app


@pytest.fixture
async def filled(dash_app: Akadze) -> Filled:
    return await fill(dash_app)


def client(asgi: Any, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                             base_url="http://127.0.0.1", **kwargs)


@pytest.fixture
async def readonly(dash_app: Akadze) -> AsyncIterator[httpx.AsyncClient]:
    asgi = create_app(dash_app.database_url, app=dash_app)
    async with client(asgi) as c:
        yield c
    await asgi.state.dashboard.close()


@pytest.fixture
async def acting(dash_app: Akadze) -> AsyncIterator[httpx.AsyncClient]:
    asgi = create_app(dash_app.database_url, allow_actions=True, app=dash_app)
    async with client(asgi) as c:
        yield c
    await asgi.state.dashboard.close()


async def token(c: httpx.AsyncClient) -> str:
    return str((await c.get("/api/session")).json()["csrf_token"])


async def test_every_page_and_its_json(filled: Filled, readonly: httpx.AsyncClient) -> None:
    for path in PAGES:
        page = await readonly.get(path)
        assert page.status_code == 200, path
        assert page.headers["content-type"].startswith("text/html")
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    overview = (await readonly.get("/api/overview")).json()
    queues = {q["queue"]: q for q in overview["queues"]}
    assert queues["accounts"]["ready"] == {"count": 29, "exact": True}
    assert queues["accounts"]["running"] == 1
    assert queues["emails"]["throughput"]["finished"] == {"succeeded": 6}
    assert queues["billing"]["throughput"]["finished"] == {"failed": 1}
    assert [w["id"] for w in overview["workers"]] == ["web-1:4242"]
    limits = (await readonly.get("/api/limits")).json()["limits"]
    assert [(r["key"], r["at_limit"], r["running"]) for r in limits] == [
        ("tenant:acme", True, 1), ("tenant:globex", False, 0)]
    assert limits[0]["waiting"] == {"count": 19, "exact": True}
    fairness = (await readonly.get("/api/fairness")).json()
    accounts = next(q for q in fairness["queues"] if q["queue"] == "accounts")
    assert accounts["running"] == 1 and accounts["total_starts"] == 1
    assert accounts["groups"][0]["key"] == "tenant:acme"
    assert accounts["groups"][0]["share"] == 1.0
    schedules = (await readonly.get("/api/schedules")).json()
    [nightly] = schedules["schedules"]
    assert nightly["name"] == "nightly_report" and nightly["next_fire"].endswith("03:00:00+00:00")
    assert nightly["last_job_state"] == "succeeded"
    job = (await readonly.get(f"/api/jobs/{filled.failed_id}")).json()
    assert job["job"]["state"] == "failed" and job["actions"] == ["requeue"]
    error = job["job"]["errors"][-1]
    assert error["error"] == "ConnectionError" and "Traceback" in error["traceback"]
    page = (await readonly.get(f"/jobs/{filled.failed_id}")).text
    assert "the payment gateway refused account 42" in page and "Traceback" in page
    assert (await readonly.get("/api/jobs/999999")).status_code == 404
    assert "no job with id 999999" in (await readonly.get("/jobs/999999")).text


async def test_a_refresh_asks_for_the_content_alone(
    filled: Filled, readonly: httpx.AsyncClient
) -> None:
    full = (await readonly.get("/limits")).text
    part = (await readonly.get("/limits", headers={"X-Akadze-Partial": "1"})).text
    assert full.startswith("<!doctype html>") and "<nav>" in full
    assert "<nav>" not in part and "tenant:acme" in part and "<h1>Limits</h1>" in part


async def test_queued_counts_stop_at_their_bound(dash_app: Akadze) -> None:
    await dash_app.tasks["send_email"].using(queue="bulk").enqueue_many(
        [{"to": f"u{i}@example.com"} for i in range(10_001)])
    asgi = create_app(dash_app.database_url)
    async with client(asgi) as c:
        overview = (await c.get("/api/overview")).json()
        page = (await c.get("/")).text
    await asgi.state.dashboard.close()
    [bulk] = [q for q in overview["queues"] if q["queue"] == "bulk"]
    assert bulk["ready"] == {"count": 10_000, "exact": False}
    assert "10 000+" in page


async def test_jobs_filters_and_keyset_paging(
    filled: Filled, dash_app: Akadze, readonly: httpx.AsyncClient
) -> None:
    await dash_app.tasks["send_email"].using(queue="paged").enqueue_many(
        [{"to": f"p{i}@example.com"} for i in range(120)])
    seen: list[int] = []
    query: dict[str, str] = {"queue": "paged"}
    for _ in range(4):
        answer = (await readonly.get("/api/jobs", params=query)).json()
        seen += [j["id"] for j in answer["jobs"]]
        if answer["next_before"] is None:
            break
        query["before"] = str(answer["next_before"])
    assert len(seen) == 120 and seen == sorted(seen, reverse=True) and len(set(seen)) == 120
    assert answer["complete"] is True

    async def ids(**params: str) -> list[int]:
        found = (await readonly.get("/api/jobs", params=params)).json()
        return [j["id"] for j in found["jobs"]]

    assert await ids(state="failed") == [filled.failed_id]
    assert await ids(state="running") == [filled.running_id]
    assert await ids(task="charge_card") == [filled.failed_id]
    assert len(await ids(limit_key="tenant:acme", state="queued")) == 19
    assert len(await ids(meta="tenant=globex")) == 10
    assert len(await ids(meta='{"tenant": "acme"}', queue="emails")) == 6
    assert await ids(id=str(filled.failed_id)) == [filled.failed_id]
    assert await ids(id=str(filled.failed_id), state="queued") == []
    bad = await readonly.get("/api/jobs", params={"state": "lost"})
    assert bad.status_code == 400 and "unknown state 'lost'" in bad.json()["error"]
    page = await readonly.get("/jobs", params={"meta": "no-equals"})
    assert page.status_code == 400 and "is not key=value" in page.text


async def test_actions_are_off_by_default(filled: Filled, readonly: httpx.AsyncClient,
                                          database_url: str) -> None:
    refused = await readonly.post(f"/api/jobs/{filled.failed_id}/requeue",
                                  headers={"X-CSRF-Token": await token(readonly)})
    assert refused.status_code == 403
    assert "actions are off" in refused.json()["error"]
    assert state_of(database_url, filled.failed_id) == "failed"
    assert "Requeue" not in (await readonly.get(f"/jobs/{filled.failed_id}")).text


async def test_actions_need_the_csrf_token(filled: Filled, acting: httpx.AsyncClient,
                                           database_url: str) -> None:
    path = f"/api/jobs/{filled.failed_id}/requeue"
    for headers in ({}, {"X-CSRF-Token": "forged"},
                    {"X-CSRF-Token": await token(acting), "Sec-Fetch-Site": "cross-site"}):
        answer = await acting.post(path, headers=headers)
        assert answer.status_code == 403, headers
    assert "CSRF token" in (await acting.post(path)).json()["error"]
    assert state_of(database_url, filled.failed_id) == "failed"
    assert (await acting.get(path)).status_code == 405  # actions are POST only


async def test_each_action(filled: Filled, acting: httpx.AsyncClient, dash_app: Akadze,
                           database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    csrf = {"X-CSRF-Token": await token(acting)}
    caplog.set_level(logging.INFO, "akadze.dashboard")

    async def post(path: str, **data: str) -> httpx.Response:
        return await acting.post(path, data=data, headers=csrf)

    done = await post(f"/api/jobs/{filled.failed_id}/requeue")
    assert done.json() == {"ok": True, "message": f"job {filled.failed_id} requeued: it is "
                           "queued again, ready now, with a fresh set of attempts"}
    assert state_of(database_url, filled.failed_id) == "queued"
    again = await post(f"/api/jobs/{filled.failed_id}/requeue")
    assert again.status_code == 409 and "only failed or cancelled" in again.json()["error"]
    assert f"requeue from 127.0.0.1: job {filled.failed_id} requeued" in caplog.text

    later = await dash_app.tasks["send_email"].using(delay=3600).enqueue(to="later@x")
    assert (await post(f"/api/jobs/{later}/retry")).json()["message"] == f"job {later} is ready now"
    assert (await post(f"/api/jobs/{later}/retry")).json()["message"] == (
        f"job {later} was ready already")
    assert (await post(f"/api/jobs/{later}/cancel")).json()["message"] == f"job {later} cancelled"
    assert state_of(database_url, later) == "cancelled"
    running = (await post(f"/api/jobs/{filled.running_id}/cancel")).json()["message"]
    assert "its worker is told" in running
    done_job = (await post(f"/api/jobs/{filled.succeeded_id}/cancel")).json()["message"]
    assert "had finished already" in done_job
    assert (await post("/api/jobs/999999/retry")).status_code == 404

    assert "paused" in (await post("/api/queues/pause", queue="accounts")).json()["message"]
    assert "was paused already" in (await post("/api/queues/pause", queue="accounts")).json()[
        "message"]
    overview = (await acting.get("/api/overview")).json()
    assert next(q for q in overview["queues"] if q["queue"] == "accounts")["paused"] is True
    assert "resumed" in (await post("/api/queues/resume", queue="accounts")).json()["message"]
    assert (await post("/api/queues/pause")).status_code == 400
    # A browser's form post without script gets a page with the message.
    page = await acting.post("/api/queues/resume", data={"queue": "accounts", "back": "/"},
                             headers={**csrf, "Accept": "text/html"})
    assert page.status_code == 200 and "was not paused" in page.text and 'href="/"' in page.text


async def test_bulk_requeue_takes_the_failed_jobs_of_the_filter(
    dash_app: Akadze, acting: httpx.AsyncClient, database_url: str
) -> None:
    charge = dash_app.tasks["charge_card"]
    mine = [await charge.using(meta={"tenant": "acme"}).enqueue(account=i) for i in range(3)]
    other = await charge.using(meta={"tenant": "globex"}).enqueue(account=9)
    await drain(dash_app, queues=["billing"])
    answer = await acting.post("/api/jobs/requeue-failed", data={"meta": "tenant=acme"},
                               headers={"X-CSRF-Token": await token(acting)})
    assert answer.json()["message"] == 'requeued 3 failed jobs (meta={"tenant": "acme"})'
    assert [state_of(database_url, i) for i in mine] == ["queued"] * 3
    assert state_of(database_url, other) == "failed"


async def test_basic_auth(dash_app: Akadze) -> None:
    asgi = create_app(dash_app.database_url, basic_auth=("ops", "s3cret:pass"))

    def header(user: str, password: str) -> dict[str, str]:
        raw = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {raw}"}

    async with client(asgi) as c:
        for headers in ({}, header("ops", "wrong"), header("nobody", "s3cret:pass"),
                        {"Authorization": "Basic !!notbase64"}, {"Authorization": "Bearer x"}):
            refused = await c.get("/api/overview", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.headers["www-authenticate"].startswith("Basic")
        allowed = await c.get("/api/overview", headers=header("ops", "s3cret:pass"))
        assert allowed.status_code == 200
    await asgi.state.dashboard.close()
    assert credentials_from_env({}) is None
    found = credentials_from_env({"AKADZE_DASHBOARD_USER": "ops",
                                  "AKADZE_DASHBOARD_PASSWORD": "pw"})
    assert found is not None and found.user == "ops" and "pw" not in repr(found)
    with pytest.raises(ConfigurationError, match="AKADZE_DASHBOARD_PASSWORD is unset"):
        credentials_from_env({"AKADZE_DASHBOARD_USER": "ops"})


async def test_no_password_in_any_page_json_or_log(
    filled: Filled, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The test server trusts local connections: the password is never checked, only
    # carried in the URL, and must never be shown.
    secret_url = database_url.replace("postgres@", "postgres:hunter2@", 1)
    assert "hunter2" in secret_url
    caplog.set_level(logging.DEBUG)
    asgi = create_app(secret_url, allow_actions=True)
    async with client(asgi) as c:
        bodies = [(await c.get(p)).text for p in [*PAGES, *APIS, f"/jobs/{filled.failed_id}"]]
        bodies.append((await c.post("/api/queues/pause", data={"queue": "q"},
                                    headers={"X-CSRF-Token": await token(c)})).text)
    await asgi.state.dashboard.close()
    assert "postgres:***@" in bodies[0]  # the page says which database, masked
    for body in bodies:
        assert "hunter2" not in body
    assert "hunter2" not in caplog.text
    # A database that cannot be reached: one masked line on the page, and in the log.
    gone = create_app("postgresql://postgres:hunter2@127.0.0.1:1/none", database_timeout=0.3)
    async with client(gone) as c:
        page = await c.get("/")
        api = await c.get("/api/overview")
    await gone.state.dashboard.close()
    assert page.status_code == 503 and api.status_code == 503
    assert "did not answer" in api.json()["error"]
    assert "hunter2" not in page.text + api.text + caplog.text


async def test_mounted_under_a_path_of_an_application(
    filled: Filled, dash_app: Akadze
) -> None:
    dashboard = create_app(dash_app.database_url)
    parent = Starlette(routes=[Mount("/ops/queues", app=dashboard)])
    async with client(parent) as c:
        page = await c.get("/ops/queues/limits")
        assert page.status_code == 200
        assert 'href="/ops/queues/static/dashboard.css"' in page.text
        assert 'href="/ops/queues/jobs?limit_key=tenant%3Aacme"' in page.text
        assert (await c.get("/ops/queues/static/dashboard.js")).status_code == 200
        assert (await c.get("/ops/queues/api/limits")).json()["total"] == 2
    await dashboard.state.dashboard.close()


def test_no_read_of_the_dashboard_scans_the_jobs_table(database_url: str) -> None:
    """With sequential scans disabled, a plan that still has one on akadze.jobs has no
    index to read instead: it reads the whole table."""
    names = [n for n in queries.names() if n.startswith("dashboard_")]
    params = {"now": None, "since": None, "cap": 10, "queues": ["q"], "bucket": 60,
              "top": 5, "prefix": None, "after_key": None, "after_at_limit": None,
              "page": 10, "keys": ["k"], "queue": "q", "states": None, "task": None,
              "limit_key": None, "meta": None, "before": 10, "scan": 10, "limit": 10,
              "names": ["n"], "ids": [1]}
    with psycopg.connect(database_url) as conn:
        conn.execute("SET enable_seqscan = off")
        for name in names:
            plan = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + queries.get(name),
                                params).fetchone()
            assert plan is not None
            text = json.dumps(plan[0])
            scans = re.findall(r'"Node Type": "Seq Scan", [^{}]*"Relation Name": "jobs"', text)
            assert not scans, name


def test_the_cli_warns_when_exposed_and_fails_in_one_line(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exposure_warning("127.0.0.1", None, False) is None
    assert exposure_warning("0.0.0.0", Credentials("u", "p"), True) is None
    warning = exposure_warning("0.0.0.0", None, True)
    assert warning is not None and "without authentication" in warning
    assert "can act on them" in warning
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        code = main(["dashboard", "--database-url", database_url, "--port", str(port)])
    finally:
        taken.close()
    err = capsys.readouterr().err
    # Like akadze metrics --serve: an address that cannot be listened on is bad usage.
    assert code == 2 and err.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err
    code = main(["dashboard", "--database-url", database_url, "--port", "70000"])
    assert code == 2


def test_only_one_of_the_auth_variables_is_refused(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AKADZE_DASHBOARD_USER", "ops")
    monkeypatch.delenv("AKADZE_DASHBOARD_PASSWORD", raising=False)
    code = main(["dashboard", "--database-url", database_url, "--port", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "AKADZE_DASHBOARD_PASSWORD is unset" in err and "Traceback" not in err



def test_create_app_refuses_bad_settings(database_url: str) -> None:
    with pytest.raises(ConfigurationError, match="allow_actions must be True or False"):
        create_app(database_url, allow_actions="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="refresh_seconds must be between"):
        create_app(database_url, refresh_seconds=0)
    with pytest.raises(ConfigurationError, match="not a PostgreSQL URL"):
        create_app("mysql://u:hunter2@h/db")


def test_the_cli_serves_the_dashboard_and_hides_the_password(database_url: str) -> None:
    import subprocess
    import sys
    import urllib.request

    secret_url = database_url.replace("postgres@", "postgres:hunter2@", 1)
    process = subprocess.Popen(
        [sys.executable, "-m", "akadze", "dashboard", "--port", "0", "--database-url",
         secret_url], stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # printed once the socket listens
        found = re.search(r"on (http://127\.0\.0\.1:\d+/) \(read-only\)", line)
        assert found, line
        assert "postgres:***@" in line and "hunter2" not in line
        with urllib.request.urlopen(found.group(1) + "api/session", timeout=30) as answer:
            assert json.load(answer)["allow_actions"] is False
    finally:
        process.terminate()
        _, rest = process.communicate(timeout=30)
    assert "hunter2" not in rest and "Traceback" not in rest


async def test_a_local_dashboard_answers_local_names_only(database_url: str) -> None:
    asgi = create_app(database_url, allowed_hosts=["127.0.0.1", "localhost"])
    async with client(asgi) as c:
        assert (await c.get("/api/session")).status_code == 200
        rebound = await c.get("/api/session", headers={"Host": "attacker.example:8484"})
        assert rebound.status_code == 400 and "csrf_token" not in rebound.text
    await asgi.state.dashboard.close()


async def test_the_job_page_shows_the_workflow_and_progress(
        dash_app: Akadze, readonly: httpx.AsyncClient) -> None:
    task = dash_app.tasks["send_email"]
    parent = task.using(delay=3600).enqueue_sync(to="a")
    child = task.using(after=[parent]).enqueue_sync(to="b")
    with psycopg.connect(dash_app.database_url, autocommit=True) as conn:
        conn.execute("UPDATE akadze.jobs SET progress = 0.25, progress_message = '<b>a</b>', "
                     "progress_at = now() WHERE id = %s", (parent,))
    data = (await readonly.get(f"/api/jobs/{parent}")).json()
    assert data["children"] == [{"id": child, "task": task.name, "state": "waiting"}]
    assert data["progress"]["fraction"] == 0.25 and data["job"]["progress"] == 0.25
    page = (await readonly.get(f"/jobs/{parent}")).text
    assert "Workflow" in page and f'href="/jobs/{child}"' in page and "25%" in page
    assert "<b>a</b>" not in page and "&lt;b&gt;a&lt;/b&gt;" in page
    child_data = (await readonly.get(f"/api/jobs/{child}")).json()
    assert child_data["parents"][0]["id"] == parent and "cancel" in child_data["actions"]
    assert "waiting for 1" in (await readonly.get(f"/jobs/{child}")).text
