"""``akadze demo`` end to end, as CI runs it: a subprocess on the test database."""

from __future__ import annotations

import signal
import subprocess
import sys

import psycopg
import pytest

LEFT = """SELECT (SELECT count(*) FROM akadze.jobs WHERE queue LIKE 'demo-%%'),
                 (SELECT count(*) FROM akadze.limits),
                 (SELECT count(*) FROM akadze.start_marks)"""


def _demo(database_url: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "akadze", "demo", "--database-url", database_url, *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_demo_passes_its_checks_in_ten_seconds(database_url: str) -> None:
    result = _demo(database_url, "--seconds", "10", "--keep")
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
    assert all(" retrying" in line for line in progress)
    assert any("| urgent batch " in line for line in progress)  # labelled once it arrived
    assert database_url.split("@")[-1] in out  # where it ran (no password in this URL)
    assert "its jobs were kept: akadze jobs list -q demo-" in out

    with psycopg.connect(database_url) as conn:
        states = dict(conn.execute(
            "SELECT state::text, count(*) FROM akadze.jobs WHERE queue LIKE 'demo-%' GROUP BY 1"
        ).fetchall())
        assert set(states) == {"succeeded"} and states["succeeded"] >= 400
        limits = conn.execute("SELECT count(*) FROM akadze.limits").fetchone()
        assert limits == (0,)  # the demo's limits are cleared at the end

    cleaned = _demo(database_url, "--clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip() == f"removed {states['succeeded']} jobs of 1 earlier demo run"
    with psycopg.connect(database_url) as conn:
        assert conn.execute(LEFT).fetchone() == (0, 0, 0)
    again = _demo(database_url, "--clean")
    assert "nothing to clean" in again.stdout


def test_demo_exits_1_when_a_check_fails(database_url: str) -> None:
    # Far more jobs than the budget allows: "all jobs done" must fail.
    result = _demo(database_url, "--seconds", "5", "--jobs", "20000", "--plain")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL all jobs done" in result.stdout
    assert "some checks FAILED" in result.stdout
    with psycopg.connect(database_url) as conn:  # nothing left behind by default
        assert conn.execute(LEFT).fetchone() == (0, 0, 0)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(600)  # a hang guard: a busy machine makes the demo slow
def test_an_interrupted_demo_removes_its_jobs_and_limits(database_url: str) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "akadze", "demo", "--database-url", database_url,
         "--jobs", "2000", "--seconds", "60", "--plain"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Ctrl-C as on a terminal: a suite started in the background by a shell
        # without job control (CI, scripts/load_stability.py) ignores SIGINT, and
        # a child inherits that, so the demo never saw the signal and ran to its end.
        preexec_fn=_default_sigint,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # the first progress line: the worker is at work
            if "jobs/s |" in line:
                break
        with psycopg.connect(database_url) as conn:
            assert conn.execute(LEFT).fetchone()[:2] != (0, 0)
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=300)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130
    assert err.strip() == "akadze: demo interrupted; its jobs and limits were removed"
    with psycopg.connect(database_url) as conn:
        assert conn.execute(LEFT).fetchone() == (0, 0, 0)


def test_clean_leaves_running_demos_and_other_queues_alone(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for queue, task in [("demo-0000000a", "demo.work"), ("demo-0000000b", "demo.flaky"),
                            ("demo-0000000c", "demo.work"), ("demo-0000000a", "mail"),
                            ("demo-orders", "demo.work")]:
            conn.execute("INSERT INTO akadze.jobs (queue, task) VALUES (%s, %s)", (queue, task))
        conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES "
                     "('demo-0000000a:acme', 2), ('demo-0000000c:acme', 2), ('demo-x:y', 1)")
        # a demo running now, elsewhere: its worker is alive
        conn.execute("INSERT INTO akadze.workers (id, host, pid, queues) "
                     "VALUES ('w', 'h', 1, ARRAY['demo-0000000c'])")
    result = _demo(database_url, "--clean")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "removed 2 jobs of 2 earlier demo runs"
    with psycopg.connect(database_url) as conn:
        jobs = conn.execute("SELECT queue, task FROM akadze.jobs ORDER BY 1, 2").fetchall()
        assert jobs == [("demo-0000000a", "mail"), ("demo-0000000c", "demo.work"),
                        ("demo-orders", "demo.work")]
        keys = conn.execute("SELECT key FROM akadze.limits ORDER BY 1").fetchall()
        assert keys == [("demo-0000000c:acme",), ("demo-x:y",)]


@pytest.mark.parametrize("args", [["--jobs", "5"], ["--seconds", "1"], ["--seconds", "1e8"],
                                  ["--jobs", "100000000"]])
def test_demo_refuses_bad_sizes(database_url: str, args: list[str]) -> None:
    result = _demo(database_url, *args, timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
