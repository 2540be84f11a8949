"""``akadze db start|stop|status|url`` and commands without a URL using the embedded server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from embedded_support import run_cli, temporary_home

from akadze import embedded


@pytest.fixture
def home() -> Iterator[Path]:
    with temporary_home("akadze-cli-") as path:
        yield path


def test_db_lifecycle(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--dir", str(home)]
    code, out, _ = run_cli(capsys, "db", "status", *d)
    assert code == 1 and out.startswith("not initialised")  # not running: exit 1

    code, out, _ = run_cli(capsys, "db", "start", *d)
    assert code == 0 and "running (pid" in out and f"host={home}/data" in out

    code, out, _ = run_cli(capsys, "db", "status", "--json", *d)
    state = json.loads(out)
    assert code == 0 and state["running"] is True and state["data_dir"] == str(home / "data")

    code, out, _ = run_cli(capsys, "db", "url", *d)
    socket_url = out.strip()
    with psycopg.connect(socket_url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("akadze",)

    password = (home / "password").read_text().strip()
    code, out, _ = run_cli(capsys, "db", "url", "--tcp", *d)
    assert code == 0 and password not in out and ":***@127.0.0.1:" in out

    code, out, _ = run_cli(capsys, "db", "url", "--tcp", "--show-password", "--admin", *d)
    assert out.strip().endswith("/postgres") and f":{password}@" in out
    with psycopg.connect(out.strip()) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("postgres",)

    code, _, err = run_cli(capsys, "db", "url", "--show-password", *d)
    assert code == 2 and "--tcp" in err

    assert run_cli(capsys, "db", "stop", *d)[:2] == (0, "stopped\n")
    assert run_cli(capsys, "db", "stop", *d)[:2] == (0, "not running\n")
    code, out, _ = run_cli(capsys, "db", "status", *d)
    assert code == 1 and out.startswith("stopped")
    code, out, _ = run_cli(capsys, "db", "status", "--json", *d)
    assert code == 1 and json.loads(out)["running"] is False


def test_migrate_without_a_url_uses_the_embedded_server(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(embedded.ENV_DIR, str(home))
    code, out, err = run_cli(capsys, "migrate")
    assert code == 0, err
    assert "applied: 0001_initial" in out
    with psycopg.connect(embedded.default_url()) as conn:
        assert conn.execute("SELECT to_regclass('akadze.jobs')::text").fetchone() == (
            "akadze.jobs",)


def test_refusals_are_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "data").mkdir(parents=True)
    (home / "data" / "PG_VERSION").write_text("17\n")
    code, _, err = run_cli(capsys, "db", "start", "--dir", str(home))
    assert code != 0 and "created by PostgreSQL 17" in err and len(err.splitlines()) == 1

    monkeypatch.setattr(embedded.binaries, "WHEEL", "akadze_no_such_wheel")
    code, _, err = run_cli(capsys, "migrate")
    assert code == 2 and "akadze[embedded]" in err and "Traceback" not in err
