from __future__ import annotations

import subprocess
import sys

import pytest

from akadze.cli import main


def test_check_reports_pending_then_current(
    empty_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--check", "--database-url", empty_database_url]) == 1
    assert "pending: 0001_initial" in capsys.readouterr().out
    assert main(["migrate", "--database-url", empty_database_url]) == 0
    assert "applied: 0001_initial" in capsys.readouterr().out
    assert main(["migrate", "--check", "--database-url", empty_database_url]) == 0
    assert main(["migrate", "--database-url", empty_database_url]) == 0
    assert "nothing to apply" in capsys.readouterr().out


def test_bad_url_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "akadze", "migrate", "--database-url", "mysql://u:topsecret@h/d"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "topsecret" not in result.stderr
    assert "not a PostgreSQL URL" in lines[0]


def test_unreachable_server_is_one_line_without_password_and_exit_1() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "akadze", "migrate", "--database-url",
         "postgresql://u:topsecret@127.0.0.1:1/d"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1  # a failure, not bad usage
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "topsecret" not in result.stderr
    assert "cannot connect" in result.stderr


def test_unknown_option_is_usage_error() -> None:
    assert main(["migrate", "--nope"]) == 2
