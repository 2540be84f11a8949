"""``akadze limits list|set|clear``."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from akadze.cli import main
from akadze.cli.limits import format_duration, parse_duration

Conn = psycopg.Connection[tuple[Any, ...]]


def _rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        'SELECT key, max_running, max_starts, "window" FROM akadze.limits ORDER BY key'
    ).fetchall()


def test_set_list_clear(database_url: str, conn: Conn, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--database-url", database_url]
    assert main(["limits", "list", *db]) == 0
    assert "no limits" in capsys.readouterr().out
    assert main(["limits", "set", "acme", "--max-running", "3", *db]) == 0
    assert "limit acme" in capsys.readouterr().out
    assert main(["limits", "set", "acme", "--max-starts", "10", "--window", "5m", *db]) == 0
    assert main(["limits", "set", "zeta", "--max-starts", "2", "--window", "1.5", *db]) == 0
    assert _rows(conn) == [
        ("acme", 3, 10, timedelta(minutes=5)),
        ("zeta", None, 2, timedelta(seconds=1.5)),
    ]
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, state)"
                 " VALUES ('q', 't', 'acme', 'running')")
    capsys.readouterr()
    assert main(["limits", "list", "--json", *db]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == [
        {"key": "acme", "max_running": 3, "max_starts": 10, "window_seconds": 300.0,
         "running": 1, "starts_in_window": 0},
        {"key": "zeta", "max_running": None, "max_starts": 2, "window_seconds": 1.5,
         "running": 0, "starts_in_window": 0},
    ]
    assert main(["limits", "list", *db]) == 0
    table = capsys.readouterr().out
    assert "acme" in table and "5m" in table and "1.5s" in table
    assert main(["limits", "set", "acme", "--max-starts", "none", "--window", "none", *db]) == 0
    assert _rows(conn)[0] == ("acme", 3, None, None)
    assert main(["limits", "clear", "acme", *db]) == 0
    assert "cleared" in capsys.readouterr().out
    assert main(["limits", "clear", "acme", *db]) == 0
    assert "nothing to clear" in capsys.readouterr().out
    assert [r[0] for r in _rows(conn)] == ["zeta"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-running", "three"], "whole number"),
        (["--max-running", "-1"], "max_running"),
        (["--max-starts", "5"], "window"),
        (["--max-starts", "5", "--window", "soon"], "duration"),
        (["--max-starts", "5", "--window", "0s"], "window"),
        ([], "at least one"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(
    database_url: str, conn: Conn, capsys: pytest.CaptureFixture[str],
    args: list[str], expected: str,
) -> None:
    code = main(["limits", "set", "acme", *args, "--database-url", database_url])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert expected in lines[0]
    assert _rows(conn) == []


def test_bad_key_is_refused(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["limits", "set", "", "--max-running", "1", "--database-url", database_url]) == 2
    assert "key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10), ("5m", 300), ("1h", 3600), ("2d", 172800), ("250ms", 0.25), ("42", 42)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


def test_duration_format() -> None:
    assert format_duration(timedelta(minutes=5)) == "5m"
    assert format_duration(timedelta(hours=2)) == "2h"
    assert format_duration(timedelta(seconds=90)) == "90s"
    assert format_duration(None) == "-"
