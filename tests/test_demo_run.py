"""``akadze demo`` end to end, as CI runs it: a subprocess on the test database."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest


def _demo(database_url: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "akadze", "demo", "--database-url", database_url, *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_demo_passes_its_checks_in_ten_seconds(database_url: str) -> None:
    result = _demo(database_url, "--seconds", "10")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Traceback" not in result.stderr
    assert "all checks passed" in out
    checks = [line for line in out.splitlines() if line.startswith(("PASS", "FAIL"))]
    names = [line.split(":")[0] for line in checks]
    assert names[0] == "PASS fair share"
    assert any(n.startswith("PASS initech max_running") for n in names)
    assert any(n.startswith("PASS umbrella max_starts") for n in names)
    assert "PASS retries resolved" in names and "PASS urgent first" in names
    assert "PASS all jobs done" in names
    assert all(line.startswith("PASS") for line in checks)
    # not a terminal: periodic progress lines instead of a live table
    progress = [line for line in out.splitlines() if " done " in line and "jobs/s |" in line]
    assert len(progress) >= 2
    assert database_url.split("@")[-1] in out  # where it ran (no password in this URL)

    with psycopg.connect(database_url) as conn:
        states = dict(conn.execute(
            "SELECT state::text, count(*) FROM akadze.jobs WHERE queue LIKE 'demo-%' GROUP BY 1"
        ).fetchall())
        assert set(states) == {"succeeded"} and states["succeeded"] >= 400
        limits = conn.execute("SELECT count(*) FROM akadze.limits").fetchone()
        assert limits == (0,)  # the demo's limits are cleared at the end


def test_demo_exits_1_when_a_check_fails(database_url: str) -> None:
    # Far more jobs than the budget allows: "all jobs done" must fail.
    result = _demo(database_url, "--seconds", "5", "--jobs", "20000", "--plain")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL all jobs done" in result.stdout
    assert "some checks FAILED" in result.stdout


@pytest.mark.parametrize("args", [["--jobs", "5"], ["--seconds", "1"]])
def test_demo_refuses_bad_sizes(database_url: str, args: list[str]) -> None:
    result = _demo(database_url, *args, timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
