"""``akadze jobs list|show|cancel|requeue|retry`` against a real database."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze import Akadze
from akadze.cli import main

AKADZE = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "akadze")


@pytest.fixture
def seeded(app: Akadze, conn: psycopg.Connection[Any]) -> dict[str, int]:
    @app.task("send", queue="mail")
    def send_fn(to: str, copies: int = 1) -> None:
        return None

    @app.task("bill", queue="billing")
    def bill_fn(amount: int) -> None:
        return None

    send = app.tasks["send"]
    ids = {
        "a": send.using(meta={"tenant": "acme", "n": 5}).enqueue_sync(to="a@x"),
        "b": send.using(meta={"tenant": "globex"}).enqueue_sync(to="b@x", copies=2),
        "c": app.tasks["bill"].using(meta={"tenant": "acme"}).enqueue_sync(amount=3),
        "later": send.using(delay=timedelta(hours=1)).enqueue_sync(to="later@x"),
    }
    conn.execute(
        """UPDATE akadze.jobs SET state = 'failed', attempt = 3, run_count = 3,
               started_at = now() - interval '2 seconds', finished_at = now(),
               errors = '[{"attempt": 1, "at": "2026-01-01T00:00:00+00:00",
                           "error": "ValueError", "message": "bad amount",
                           "traceback": "Traceback (most recent call last):\\n  boom"},
                          {"attempt": 3, "at": "2026-01-01T00:01:00+00:00",
                           "error": "TimeoutError", "message": "too slow"}]'
           WHERE id = %s""",
        (ids["c"],),
    )
    return ids


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_filters_and_json(seeded: dict[str, int], database_url: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    url = ["--database-url", database_url]
    code, out, _ = run(capsys, "jobs", "list", "--json", *url)
    assert code == 0
    assert [j["id"] for j in json.loads(out)] == sorted(seeded.values(), reverse=True)
    code, out, _ = run(capsys, "jobs", "list", "--meta", "tenant=acme", "--json", *url)
    assert [j["id"] for j in json.loads(out)] == [seeded["c"], seeded["a"]]
    code, out, _ = run(capsys, "jobs", "list", "-m", "tenant=acme", "-m", "n:=5", "--json", *url)
    assert [j["id"] for j in json.loads(out)] == [seeded["a"]]
    code, out, _ = run(capsys, "jobs", "list", "--meta", "n=5", "--json", *url)
    assert json.loads(out) == []  # "5" the string is not 5 the number
    code, out, _ = run(capsys, "jobs", "list", "--queue", "mail", "--state", "queued",
                       "--task", "send", "--limit", "2", "--json", *url)
    assert [j["id"] for j in json.loads(out)] == [seeded["later"], seeded["b"]]
    code, out, _ = run(capsys, "jobs", "list", "--state", "failed", *url)
    assert code == 0 and "too slow" in out and "bill" in out
    code, out, _ = run(capsys, "jobs", "list", "--task", "nothing", *url)
    assert code == 0 and "no jobs match" in out


def test_list_bad_arguments_are_one_line_exit_2(database_url: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--state", "done"], ["--meta", "novalue"], ["--limit", "0"],
                 ["--meta", "k:=notjson"]):
        code, _, err = run(capsys, "jobs", "list", *argv, "--database-url", database_url)
        assert code == 2, argv
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_show(seeded: dict[str, int], database_url: str,
              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "jobs", "show", str(seeded["c"]), "--database-url", database_url)
    assert code == 0
    assert f"job {seeded['c']}: bill on queue billing" in out
    assert "attempt     3 of 3" in out
    assert "amount      3" in out
    assert "attempt 1: ValueError: bad amount" in out
    assert "attempt 3: TimeoutError: too slow" in out
    assert "Traceback (most recent call last):" in out
    assert "ran for" in out and "failed" in out
    code, out, _ = run(capsys, "jobs", "show", str(seeded["b"]), "--json",
                       "--database-url", database_url)
    shown = json.loads(out)
    assert shown["args"] == {"to": "b@x", "copies": 2} and shown["state"] == "queued"
    code, out, err = run(capsys, "jobs", "show", "999999", "--database-url", database_url)
    assert code == 1 and "no job with id 999999" in err and out == ""


def test_cancel_requeue_retry(seeded: dict[str, int], database_url: str,
                              conn: psycopg.Connection[Any],
                              capsys: pytest.CaptureFixture[str]) -> None:
    url = ["--database-url", database_url]

    def state(job_id: int) -> str:
        row = conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s",
                           (job_id,)).fetchone()
        assert row
        return str(row[0])

    code, out, _ = run(capsys, "jobs", "cancel", str(seeded["a"]), *url)
    assert code == 0 and "cancel requested" in out and state(seeded["a"]) == "cancelled"
    code, _, err = run(capsys, "jobs", "cancel", str(seeded["a"]), *url)
    assert code == 1 and "finished already" in err
    code, out, _ = run(capsys, "jobs", "requeue", str(seeded["a"]), *url)
    assert code == 0 and state(seeded["a"]) == "queued"
    code, out, _ = run(capsys, "jobs", "requeue", str(seeded["c"]), *url)
    assert code == 0 and "requeued" in out and state(seeded["c"]) == "queued"
    code, _, err = run(capsys, "jobs", "requeue", str(seeded["b"]), *url)
    assert code == 1 and "only failed or cancelled" in err
    code, out, _ = run(capsys, "jobs", "retry", str(seeded["later"]), *url)
    assert code == 0 and "ready now" in out
    code, out, _ = run(capsys, "jobs", "retry", str(seeded["later"]), *url)
    assert code == 0 and "ready already" in out
    code, _, err = run(capsys, "jobs", "cancel", "999999", *url)
    assert code == 1 and "no job with id 999999" in err


def test_subprocess_end_to_end_with_env_url(seeded: dict[str, int], database_url: str) -> None:
    env = {**os.environ, "AKADZE_DATABASE_URL": database_url}
    result = subprocess.run([AKADZE, "jobs", "list", "--state", "failed", "--json"],
                            capture_output=True, text=True, env=env, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [j["id"] for j in json.loads(result.stdout)] == [seeded["c"]]
    result = subprocess.run([AKADZE, "jobs", "show", "424242"],
                            capture_output=True, text=True, env=env, check=False, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == "akadze: no job with id 424242"


def test_password_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "jobs", "list", "--database-url",
                         "postgresql://u:topsecret@127.0.0.1:1/d")
    assert code == 1  # an unreachable server is a failure, not bad usage
    assert "topsecret" not in out + err and len(err.strip().splitlines()) == 1
