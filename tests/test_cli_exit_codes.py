"""The command line's exit code comes from the error's class: failure 1, bad usage 2,
as the table in docs/reference/cli.md says."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import psycopg
import pytest

from akadze import errors
from akadze.cli import EXIT_CODES, exit_code, main

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
ROW = re.compile(r"^\| `(\w+)` \| (\d) \|", re.MULTILINE)


def _documented() -> dict[str, int]:
    section = DOCS.read_text(encoding="utf-8").split("## Exit codes", 1)[1]
    return {name: int(code) for name, code in ROW.findall(section)}


def test_the_documented_table_is_the_cli_table() -> None:
    assert _documented() == {kind.__name__: code for kind, code in EXIT_CODES.items()}


ERROR_CLASSES = [
    kind for _, kind in inspect.getmembers(errors, inspect.isclass)
    if issubclass(kind, errors.AkadzeError)
]


@pytest.mark.parametrize("kind", ERROR_CLASSES, ids=lambda kind: kind.__name__)
def test_every_error_class_has_a_code_and_no_exit_code_of_its_own(kind: type) -> None:
    assert not hasattr(kind, "exit_code")  # the CLI decides, not the library
    error = kind.__new__(kind)
    assert exit_code(error) in (1, 2)
    assert kind in EXIT_CODES, f"place {kind.__name__} in EXIT_CODES and in docs/reference/cli.md"


@pytest.mark.parametrize(("kind", "code"), [
    (errors.ConfigurationError, 2), (errors.AsyncHookError, 2), (errors.EnqueueError, 2),
    (errors.UnknownTask, 2), (errors.LimitError, 2), (errors.ScheduleError, 2),
    (errors.FilterError, 2), (errors.DatabaseUnavailable, 1), (errors.DuplicateJob, 1),
    (errors.MigrationError, 1), (errors.JobNotFound, 1), (errors.InvalidJobState, 1),
    (errors.WorkerError, 1), (errors.EmbeddedServerError, 1), (errors.JobLost, 1),
])
def test_failures_exit_1_and_bad_usage_exits_2(kind: type[errors.AkadzeError], code: int) -> None:
    assert exit_code(kind.__new__(kind)) == code


def test_a_database_ahead_of_this_akadze_exits_1(
    empty_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--database-url", empty_database_url]) == 0
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO akadze.migrations (version, name) VALUES (9999, 'future')")
    capsys.readouterr()
    assert main(["migrate", "--database-url", empty_database_url]) == 1
    err = capsys.readouterr().err
    assert "does not know: [9999]" in err and len(err.strip().splitlines()) == 1


def test_a_worker_that_cannot_run_exits_1(
    empty_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "exit_code_app.py").write_text(textwrap.dedent("""
        from akadze import Akadze

        app = Akadze()

        @app.task("noop")
        def noop() -> None:
            return None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["worker", "exit_code_app:app", "--database-url", empty_database_url])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "no akadze schema" in err and err.strip().splitlines()[-1].startswith("akadze: ")
