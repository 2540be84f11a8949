"""Every command with a wrong argument, a missing schema and a stopped server: the
documented exit code (docs/reference/cli.md, "By command") and one ``akadze:`` line.

In-process (``akadze.cli.main``), so that the sweep stays fast; a traceback would be an
exception here and fail the test. The subprocess form of the same promises is in
test_cli_first_hour.py, and the wrong password in test_newcomer_path.py.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from akadze.cli import main

STOPPED = "postgresql://postgres@127.0.0.1:1/nothing"

# Commands that read or write the database (``APP`` is replaced by the sweep's app).
DATABASE_COMMANDS = [
    ["jobs", "list"], ["jobs", "list", "--json"], ["jobs", "show", "1"], ["jobs", "cancel", "1"],
    ["jobs", "requeue", "1"], ["jobs", "retry", "1"],
    ["queues", "list"], ["queues", "pause", "q", "--force"], ["queues", "pause", "q"],
    ["queues", "resume", "q"],
    ["limits", "list"], ["limits", "set", "k", "--max-running", "1"], ["limits", "clear", "k"],
    ["workers", "list"], ["metrics"], ["migrate", "--check"], ["migrate"], ["worker", "APP"],
    ["demo", "--jobs", "100"], ["bench", "enqueue", "--jobs", "10"],
]

# (arguments, exit code, what the line says)
WRONG_ARGUMENTS = [
    (["frob"], 2, "No such command 'frob'"),
    (["migrate", "--bogus"], 2, "No such option '--bogus'"),
    (["worker"], 2, "Missing argument"),
    (["worker", "APP", "--slots", "0"], 2, "0 is not in the range x>=1"),
    (["worker", "APP", "--queue", ""], 2, "queues must be a non-empty list of queue names"),
    (["worker", "sweep_app"], 2, "did you mean sweep_app:app?"),
    (["jobs", "show", "abc"], 2, "'abc' is not a job id"),
    (["jobs", "list", "-s", "bogus"], 2, "'bogus' is not one of"),
    (["jobs", "list", "-n", "0"], 2, "0 is not in the range 1<=x<=10000"),
    (["jobs", "list", "-m", "x"], 2, "'x' is not key=value"),
    (["jobs", "list", "--database-url", "mysql://u@h/d"], 2, "is not a PostgreSQL URL"),
    (["jobs", "list", "--database-url", ""], 2, "database URL is empty"),
    (["queues", "pause"], 2, "Missing argument 'QUEUE'"),
    (["limits", "set", "k"], 2, "give at least one of --max-running, --max-starts, --window"),
    (["limits", "set", "k", "--max-running", "x"], 2, "'x' is not a whole number"),
    (["limits", "set", "k", "--max-running", "-1"], 2, "max_running must be >= 0"),
    (["limits", "set", "k", "--max-starts", "5"], 2, "max_starts needs a window"),
    (["limits", "set", "k", "--window", "5x"], 2, "'5x' is not a duration"),
    (["schedules", "list"], 2, "Missing argument"),
    (["schedules", "list", "nosuch:app"], 2, "no module named 'nosuch'"),
    (["metrics", "--port", "99999"], 2, "99999 is not in the range"),
    (["metrics", "--window", "0"], 2, "0 is not in the range"),
    (["db", "frob"], 2, "No such command 'frob'"),
    (["db", "url", "--show-password"], 2, "--show-password goes with --tcp"),
    (["demo", "--jobs", "5"], 2, "5 is not in the range 100<=x<=1000000"),
    (["demo", "--seconds", "1e8"], 2, "is not in the range 5.0<=x<=3600.0"),
    (["demo", "--slots", "2"], 2, "2 is not in the range 4<=x<=64"),
    (["dashboard", "--port", "-1"], 2, "-1 is not in the range"),
    (["bench", "frob"], 2, "No such command 'frob'"),
]


@pytest.fixture
def app_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "sweep_app.py").write_text(textwrap.dedent("""
        from akadze import Akadze

        app = Akadze()

        @app.task("greet")
        def greet() -> None:
            return None
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield "./sweep_app.py:app"
    sys.modules.pop("sweep_app", None)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str], app: str) -> tuple[int, str, str]:
    code = main([app if arg == "APP" else arg for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("akadze: ")
    return lines[0]


@pytest.mark.parametrize(("argv", "code", "says"), WRONG_ARGUMENTS,
                         ids=[" ".join(a) or "-" for a, _, _ in WRONG_ARGUMENTS])
def test_a_wrong_argument(argv: list[str], code: int, says: str, app_reference: str,
                          capsys: pytest.CaptureFixture[str], database_url: str) -> None:
    if "--database-url" not in argv and argv[0] not in ("db", "schedules", "frob", "bench"):
        argv = [*argv, "--database-url", database_url]
    got, _, err = _run(capsys, argv, app_reference)
    assert got == code, err
    assert says in _line(err)


@pytest.mark.parametrize("argv", DATABASE_COMMANDS, ids=[" ".join(a) for a in DATABASE_COMMANDS])
def test_a_stopped_server(argv: list[str], app_reference: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, [*argv, "--database-url", STOPPED], app_reference)
    assert code == 1, out + err
    assert _line(err) == ("akadze: cannot connect to postgresql://postgres@127.0.0.1:1/nothing: "
                          "Connection refused (is the server running?)")


SCHEMA_COMMANDS = [a for a in DATABASE_COMMANDS
                   if a[0] not in ("migrate", "demo", "bench")]  # those migrate, or scratch


@pytest.mark.parametrize("argv", SCHEMA_COMMANDS, ids=[" ".join(a) for a in SCHEMA_COMMANDS])
def test_a_database_without_the_schema(argv: list[str], app_reference: str,
                                       capsys: pytest.CaptureFixture[str],
                                       empty_database_url: str) -> None:
    code, out, err = _run(capsys, [*argv, "--database-url", empty_database_url], app_reference)
    line = _line(err)
    assert code == 1, out + err
    assert "has no akadze schema" in line and line.endswith("run akadze migrate"), line


def test_migrate_check_lists_every_migration_of_an_empty_database(
    capsys: pytest.CaptureFixture[str], empty_database_url: str
) -> None:
    assert main(["migrate", "--check", "--database-url", empty_database_url]) == 1
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("pending: 0001_initial")
