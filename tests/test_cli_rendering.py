"""Stored strings cannot spoof the terminal (issue 21, finding 7): rich markup, escape
sequences and other control characters written into the schema by anyone reach every
CLI view (tables, ``jobs show``, ``limits set``, JSON, error lines) as literal text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze import Akadze
from akadze.cli import main
from akadze.cli._render import print_table, shown

AKADZE = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "akadze")

BOGUS = "[/bogus]"
LINK = "[link=https://evil.example]q1[/link]"
TITLE = "\x1b]0;PWNED\x07"  # OSC 0: sets the terminal's title
OSC8 = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"  # an OSC 8 hyperlink
RED = "\x1b[31mred\x1b[0m"
SPOOF = "ok\rFAILED\u202etxt.exe\x9b2J"  # carriage return, RTL override, 8-bit CSI
HOSTILE = [BOGUS, LINK, TITLE, OSC8, RED, SPOOF, "[bold]b[/bold]", ":smile:"]
# Whatever reaches the terminal must hold none of these.
CONTROLS = ["\x1b", "\x07", "\r", "\u202e", "\x9b"]


@pytest.fixture
def hostile(app: Akadze, conn: psycopg.Connection[Any],
            monkeypatch: pytest.MonkeyPatch) -> list[int]:
    monkeypatch.setenv("COLUMNS", "400")  # tables wide enough not to wrap a cell
    ids = []
    for n, text in enumerate(HOSTILE):
        row = conn.execute(
            "INSERT INTO akadze.jobs (queue, task, args, limit_key, meta, state, errors, "
            "result, worker_id) VALUES (%s, %s, %s, %s, %s, 'failed', %s, %s, %s) RETURNING id",
            (text, text, json.dumps({text: text}), f"{text}-{n}", json.dumps({"m": text}),
             json.dumps([{"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": text,
                          "message": text, "traceback": f"Traceback\n  {text}\n"}]),
             json.dumps({"r": text}), text),
        ).fetchone()
        assert row is not None
        ids.append(int(row[0]))
        conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES (%s, 1)", (text,))
        conn.execute("INSERT INTO akadze.queue_pauses (queue) VALUES (%s)", (text,))
        conn.execute("INSERT INTO akadze.workers (id, host, pid, queues) VALUES (%s, %s, %s, %s)",
                     (f"w{n}{text}", text, 100 + n, [text, "plain"]))
    return ids


def _safe(out: str) -> None:
    for control in CONTROLS:
        assert control not in out, (control, out)


def _view(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    _safe(out)
    return out


@pytest.mark.parametrize("argv", [["jobs", "list"], ["jobs", "list", "--state", "failed"],
                                  ["queues", "list"], ["limits", "list"], ["workers", "list"]])
def test_every_list_shows_markup_literally_and_no_control_character(
        hostile: list[int], database_url: str, capsys: pytest.CaptureFixture[str],
        argv: list[str]) -> None:
    out = _view(capsys, *argv, "--database-url", database_url)
    # shown as written: no crash on "[/bogus]", no link, no bold, no emoji
    assert BOGUS in out and LINK in out and "[bold]b[/bold]" in out and ":smile:" in out
    assert "\\x1b]0;PWNED\\x07" in out  # the escape, visible as text
    assert "\\u202e" in out


def test_json_views_are_ascii_escaped(hostile: list[int], database_url: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["jobs", "list"], ["queues", "list"], ["limits", "list"], ["workers", "list"],
                 ["jobs", "show", str(hostile[2])]):
        out = _view(capsys, *argv, "--json", "--database-url", database_url)
        assert "\\u001b]0;PWNED\\u0007" in out


def test_jobs_show_writes_every_stored_string_literally(
        hostile: list[int], database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for job_id, text in zip(hostile, HOSTILE, strict=True):
        out = _view(capsys, "jobs", "show", str(job_id), "--database-url", database_url)
        assert shown(text) in out  # task, queue, key, worker, error, traceback lines
        assert out.count(shown(text)) >= 6
    out = _view(capsys, "jobs", "show", str(hostile[3]), "--database-url", database_url)
    assert "\\x1b]8;;https://evil.example" in out


def test_limits_set_echoes_the_key_safely(database_url: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = _view(capsys, "limits", "set", "[/x]" + RED, "--max-running", "2",
                "--database-url", database_url)
    assert out.startswith("limit [/x]\\x1b[31mred\\x1b[0m: max running 2")
    out = _view(capsys, "limits", "list", "--database-url", database_url)
    assert "[/x]" in out


def test_an_error_line_holds_no_control_character(capsys: pytest.CaptureFixture[str]) -> None:
    # The URL is echoed in the error, as given (its password masked)
    code = main(["jobs", "list", "--database-url", f"postgresql://u:pw@127.0.0.1:1/d{TITLE}"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("akadze: cannot connect to postgresql://u:***@127.0.0.1:1/"
                          "d\\x1b]0;PWNED\\x07: ")
    _safe(err)


def test_print_table_never_parses_markup(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(BOGUS, [LINK, "b"], [[BOGUS, TITLE], [None, 3]])
    out = capsys.readouterr().out
    _safe(out)
    assert BOGUS in out and LINK in out


def test_a_real_terminal_gets_no_escape_either(hostile: list[int], database_url: str) -> None:
    # As a subprocess: rich writes colour and style codes of its own to a terminal, but
    # with a pipe it writes none, so every ESC in the output would be a stored one.
    for argv in (["queues", "list"], ["jobs", "show", str(hostile[3])]):
        result = subprocess.run([AKADZE, *argv, "--database-url", database_url],
                                capture_output=True, text=True, check=False, timeout=60,
                                env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"})
        assert result.returncode == 0, result.stderr
        _safe(result.stdout)
        assert "\\x1b]8;;https://evil.example" in result.stdout
