"""The first hour at the command line (issue 20), as subprocesses: each answer is the
documented exit code and one clear line on stderr, never a traceback, except the
user's own traceback for an error inside the user's own module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze.cli import main

SCRIPT = Path(sys.executable).with_name("akadze")  # what `pip install` puts on PATH
STOPPED = "postgresql://postgres@127.0.0.1:1/nothing"

APP = """
from akadze import Akadze

app = Akadze()

@app.task("greet")
def greet(name: str) -> str:
    return "hello " + name
"""


def akadze(*args: str, cwd: Path | None = None, module: bool = False,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "akadze"] if module else [str(SCRIPT)]
    env = {k: v for k, v in os.environ.items() if k not in ("AKADZE_DATABASE_URL", "PYTHONPATH")}
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env, check=False)


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one stderr line of a refusal with exit ``code``."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("akadze: ")
    return lines[0]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "myjobs.py").write_text(textwrap.dedent(APP))
    package = tmp_path / "src" / "proj" / "pkg"
    package.mkdir(parents=True)
    (tmp_path / "src" / "proj" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "names.py").write_text('NAME = "pkg.greet"\n')
    (package / "jobs.py").write_text(textwrap.dedent("""
        from akadze import Akadze
        from .names import NAME

        app = Akadze()

        @app.periodic(NAME, cron="0 * * * *")
        def greet() -> None:
            return None
    """))
    return tmp_path


@pytest.mark.parametrize("reference", [
    "myjobs:app", "./myjobs.py:app", "myjobs.py:app", "{tmp}/myjobs.py:app",
    "src/proj/pkg/jobs.py:app",
])
def test_an_app_loads_from_a_module_or_a_file_path(project: Path, reference: str) -> None:
    result = akadze("schedules", "list", reference.format(tmp=project), cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_a_package_file_keeps_its_relative_imports(project: Path) -> None:
    result = akadze("schedules", "list", "src/proj/pkg/jobs.py:app", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    assert '"task": "pkg.greet"' in result.stdout


@pytest.mark.parametrize(("reference", "says"), [
    ("myjobs", "got 'myjobs'; did you mean myjobs:app?"),
    ("nosuch:app", "no module named 'nosuch' among the installed packages and in the current "
                   "directory"),
    ("nosuch.py:app", "no file 'nosuch.py'"),
    ("./myjobs.py:nope", "is not an Akadze app: myjobs"),
    ("./README.txt:app", "is not a Python file"),
])
def test_a_bad_app_reference_is_one_line_and_exit_2(
    project: Path, reference: str, says: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = one_line(akadze("worker", reference, cwd=project), 2)
    assert says in line, line
    monkeypatch.chdir(project)  # schedules list loads the app the same way (in-process)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "myjobs", raising=False)
    try:
        assert main(["schedules", "list", reference]) == 2
    finally:
        sys.modules.pop("myjobs", None)
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [line]


def _their_frames_only(stderr: str, project: Path) -> None:
    files = [line for line in stderr.splitlines() if line.strip().startswith('File "')]
    assert files and all(f'File "{project}' in line for line in files), stderr
    for foreign in ("click", "importlib", "akadze/cli", "<frozen"):
        assert foreign not in stderr, stderr


def test_an_exception_in_the_users_module_shows_their_traceback_only(project: Path) -> None:
    (project / "broken.py").write_text(textwrap.dedent("""
        from akadze import Akadze

        def make():
            return undefined_name + 1

        app = make()
    """))
    for reference in ("broken:app", "./broken.py:app"):
        result = akadze("worker", reference, cwd=project)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert lines[0] == "Traceback (most recent call last):"
        assert lines[-2] == "NameError: name 'undefined_name' is not defined"
        assert lines[-1] == ("akadze: importing 'broken' failed: NameError: name "
                             "'undefined_name' is not defined")
        _their_frames_only(result.stderr, project)
        assert len(lines) < 12  # two frames of theirs, not twenty of click's


def test_a_syntax_error_in_the_users_module_shows_where(project: Path) -> None:
    (project / "typo.py").write_text("from akadze import Akadze\n\ndef f(:\n    pass\n")
    result = akadze("worker", "typo:app", cwd=project)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f'File "{project}/typo.py", line 3'
    assert lines[-2] == "SyntaxError: invalid syntax"
    assert lines[-1] == ("akadze: importing 'typo' failed: SyntaxError: invalid syntax "
                         "(typo.py, line 3)")
    _their_frames_only(result.stderr, project)


def test_a_missing_dependency_of_the_users_module_is_theirs(project: Path) -> None:
    (project / "needy.py").write_text("import surely_not_installed_anywhere\n")
    result = akadze("worker", "needy:app", cwd=project)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "akadze: importing 'needy' failed: ModuleNotFoundError: No module named "
        "'surely_not_installed_anywhere'")
    _their_frames_only(result.stderr, project)


@pytest.mark.parametrize("module", [False, True], ids=["script", "python -m"])
def test_files_in_the_current_directory_never_shadow_installed_modules(
    project: Path, module: bool
) -> None:
    # a shared directory holding a file named like a standard module the app uses
    (project / "colorsys.py").write_text("raise RuntimeError('shadowed the standard colorsys')\n")
    (project / "uses_colorsys.py").write_text(textwrap.dedent(APP) + "import colorsys\n")
    result = akadze("schedules", "list", "uses_colorsys:app", cwd=project, module=module)
    assert result.returncode == 0, result.stderr


def test_a_module_named_like_an_installed_one_is_explained(project: Path) -> None:
    (project / "colorsys.py").write_text(textwrap.dedent(APP))
    line = one_line(akadze("worker", "colorsys:app", cwd=project), 2)
    assert "has nothing named 'app'; ./colorsys.py is not what was imported: give its path" in line
    line = one_line(akadze("worker", "./colorsys.py:app", cwd=project), 2)
    assert "another module of that name comes first on sys.path" in line
    assert "rename the file" in line


def test_the_worker_checks_the_database_before_it_starts(
    project: Path, empty_database_url: str
) -> None:
    line = one_line(akadze("worker", "myjobs:app", "--database-url", STOPPED, cwd=project), 1)
    assert line == ("akadze: cannot connect to postgresql://postgres@127.0.0.1:1/nothing: "
                    "Connection refused (is the server running?)")
    line = one_line(akadze("worker", "./myjobs.py:app", "--database-url", empty_database_url,
                           cwd=project), 1)
    assert line.endswith("has no akadze schema: run akadze migrate")


def test_job_ids_are_checked_in_words(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line(akadze("jobs", "show", "abc", "--database-url", database_url), 2)
    assert line == ("akadze: Invalid value for 'ID': 'abc' is not a job id (job ids are "
                    "whole numbers from 1)")
    for bad in ("abc", "-1", "0", "1.5", "99999999999999999999"):
        for command in ("show", "cancel", "requeue", "retry"):
            assert main(["jobs", command, bad, "--database-url", database_url]) == 2
            err = capsys.readouterr().err.strip()
            assert f"{bad!r} is not a job id" in err and "\n" not in err


def test_cancelling_a_finished_job_is_one_akadze_line(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    row = conn.execute("INSERT INTO akadze.jobs (queue, task, state, finished_at) VALUES "
                       "('q', 't', 'succeeded', now()) RETURNING id").fetchone()
    assert row is not None
    line = one_line(akadze("jobs", "cancel", str(row[0]), "--database-url", database_url), 1)
    assert line == f"akadze: job {row[0]} has finished already (succeeded); nothing to cancel"


def test_pausing_an_unknown_queue_needs_force(database_url: str) -> None:
    line = one_line(akadze("queues", "pause", "nosuchqueue", "--database-url", database_url), 2)
    assert line == ("akadze: queue 'nosuchqueue' has no jobs and no worker serves it (a typo?); "
                    "pass --force to pause it anyway")
    forced = akadze("queues", "pause", "nosuchqueue", "--force", "--database-url", database_url)
    assert forced.returncode == 0 and forced.stdout.strip() == "queue nosuchqueue paused"
    again = akadze("queues", "pause", "nosuchqueue", "--database-url", database_url)
    assert again.stdout.strip() == "queue nosuchqueue was paused already"  # known now


def test_a_masked_password_keeps_the_separator() -> None:
    url = "postgresql://u@nosuch.invalid/db?password=s3cret"
    line = one_line(akadze("jobs", "list", "--database-url", url), 1)
    assert "s3cret" not in line
    assert line.startswith("akadze: cannot connect to postgresql://u@nosuch.invalid/db"
                           "?password=***: ")


def test_help_links_the_documentation() -> None:
    result = akadze("--help")
    assert result.returncode == 0
    assert "Documentation: https://" in result.stdout
