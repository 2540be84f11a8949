"""``akadze queues|workers|schedules|metrics`` against a real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from akadze import Akadze
from akadze.cli import main

AKADZE = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "akadze")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def jobs(app: Akadze, conn: psycopg.Connection[Any]) -> None:
    @app.task("t", queue="alpha")
    def t() -> None:
        return None

    for _ in range(3):
        app.tasks["t"].using().enqueue_sync()
    conn.execute("UPDATE akadze.jobs SET state = 'running', worker_id = 'w1' "
                 "WHERE id = (SELECT min(id) FROM akadze.jobs)")
    conn.execute("INSERT INTO akadze.workers (id, host, pid, queues) "
                 "VALUES ('w1', 'box-1', 4242, '{alpha,beta}')")


def test_queues_list_pause_resume(jobs: None, database_url: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    url = ["--database-url", database_url]
    code, out, _ = run(capsys, "queues", "pause", "alpha", *url)
    assert code == 0 and out.strip() == "queue alpha paused"
    code, out, _ = run(capsys, "queues", "pause", "alpha", *url)
    assert "paused already" in out
    code, out, _ = run(capsys, "queues", "list", "--json", *url)
    [alpha] = json.loads(out)
    assert alpha["queue"] == "alpha" and alpha["paused"] is True
    assert alpha["counts"]["queued"] == 2 and alpha["counts"]["running"] == 1
    assert alpha["ready"] == 2 and alpha["lag_seconds"] is not None
    code, out, _ = run(capsys, "queues", "list", *url)
    assert code == 0 and "alpha" in out and "yes" in out
    code, out, _ = run(capsys, "queues", "resume", "alpha", *url)
    assert out.strip() == "queue alpha resumed"
    code, out, _ = run(capsys, "queues", "resume", "alpha", *url)
    assert "was not paused" in out
    code, out, _ = run(capsys, "queues", "list", "--json", *url)
    assert json.loads(out)[0]["paused"] is False


def test_queues_empty_and_usage(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "queues", "list", "--database-url", database_url)
    assert code == 0 and "no queues" in out
    code, _, err = run(capsys, "queues", "pause", "--database-url", database_url)
    assert code == 2 and "Missing argument" in err


def test_workers_list(jobs: None, database_url: str,
                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "workers", "list", "--json", "--database-url", database_url)
    [worker] = json.loads(out)
    assert worker["host"] == "box-1" and worker["pid"] == 4242
    assert worker["queues"] == ["alpha", "beta"] and worker["running"] == 1
    assert worker["alive"] is True
    code, out, _ = run(capsys, "workers", "list", "--database-url", database_url)
    assert code == 0 and "box-1" in out and "4242" in out


def test_workers_list_empty(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "workers", "list", "--database-url", database_url)
    assert code == 0 and "no workers" in out


APP_MODULE = """
from datetime import timedelta
from akadze import Akadze

app = Akadze(database_url="postgresql://nobody@127.0.0.1:1/none")

@app.periodic("nightly", cron="30 2 * * *", timezone="Europe/Berlin", overlap=False)
def nightly() -> None:
    return None

@app.periodic("often", every=timedelta(minutes=5))
def often() -> None:
    return None

not_an_app = 42
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"sched_app_{os.getpid()}_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_schedules_list(app_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schedules", "list", f"{app_module}:app", "--json")
    assert code == 0
    listed = {s["name"]: s for s in json.loads(out)}
    assert listed["nightly"]["cron"] == "30 2 * * *"
    assert listed["nightly"]["timezone"] == "Europe/Berlin"
    assert listed["nightly"]["overlap"] is False
    assert listed["often"]["every_seconds"] == 300
    assert listed["often"]["next_fire"].endswith(("0:00+00:00", "5:00+00:00"))
    code, out, _ = run(capsys, "schedules", "list", f"{app_module}:app")
    assert code == 0 and "nightly" in out and "every 5m" in out
    code, _, err = run(capsys, "schedules", "list", f"{app_module}:not_an_app")
    assert code == 2 and "not an Akadze app" in err
    code, _, err = run(capsys, "schedules", "list", "no_such_module_xyz:app")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_metrics_prints_parseable_text(jobs: None, database_url: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "metrics", "--database-url", database_url)
    assert code == 0
    families = {f.name: f for f in text_string_to_metric_families(out)}
    queued = [s for s in families["akadze_jobs"].samples
              if s.labels == {"queue": "alpha", "state": "queued"}]
    assert queued[0].value == 2


def test_metrics_serve_subprocess(jobs: None, database_url: str) -> None:
    env = {**os.environ, "AKADZE_DATABASE_URL": database_url}
    # Port 0: the server picks a free port and says which once it is listening.
    process = subprocess.Popen([AKADZE, "metrics", "--serve", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        assert process.stderr is not None
        announced = process.stderr.readline()
        assert announced.startswith("serving metrics of "), announced
        address = announced.strip().rsplit(" on ", 1)[1]
        assert address.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(address, timeout=10) as reply:
            body = reply.read().decode()
        names = {f.name for f in text_string_to_metric_families(body)}
        assert {"akadze_jobs", "akadze_queue_paused", "akadze_workers"} <= names
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_subprocess_queues_pause(jobs: None, database_url: str,
                                 conn: psycopg.Connection[Any]) -> None:
    result = subprocess.run([AKADZE, "queues", "pause", "alpha", "--database-url", database_url],
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0 and "paused" in result.stdout
    assert conn.execute("SELECT queue FROM akadze.queue_pauses").fetchall() == [("alpha",)]


def test_bad_usage_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "metrics", "--port", "99999")
    assert code == 2 and "Traceback" not in err
    result = subprocess.run([sys.executable, "-m", "akadze", "jobs", "show", "abc"],
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["jobs", "list"], ["jobs", "show", "1"], ["queues", "list"],
                                  ["queues", "pause", "q"], ["workers", "list"], ["metrics"]])
def test_database_without_schema_is_one_line_exit_1(
    argv: list[str], empty_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv, "--database-url", empty_database_url)
    assert code == 1 and out == ""
    assert err.startswith("akadze: the database has no akadze schema (or an older one: ")
    assert err.strip().endswith("does not exist): run akadze migrate")
    assert len(err.strip().splitlines()) == 1
