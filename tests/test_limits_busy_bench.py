"""Smoke test of ``akadze bench limits-busy`` with tiny sizes (figures are not checked,
only that each scenario ran to its end and kept its limit)."""

from __future__ import annotations

from pathlib import Path

import psycopg

from akadze.bench import queries as bench_queries
from akadze.cli import main


def test_bench_limits_busy_runs_every_scenario_and_writes_a_report(
    database_url: str, tmp_path: Path
) -> None:
    report = tmp_path / "limits.md"
    code = main(["bench", "limits-busy", "--runs", "1", "--jobs", "4", "--seconds", "0.01",
                 "--keys", "3", "--per-key", "2", "--key-seconds", "0.01", "--processes", "1",
                 "--slots", "6", "--rate-jobs", "12", "--report", str(report),
                 "--database-url", database_url])
    assert code == 0
    text = report.read_text()
    assert "one key: 4 jobs of 0.01 s" in text and "s drain" in text
    assert "many keys: 3 keys x 2 jobs" in text and "mean use" in text
    assert "statistics of a drained table" in text
    assert "start rate: 12 jobs" in text and "starts/s" in text
    assert "PostgreSQL" in text and "cores" in text


def test_drained_statistics_are_those_of_a_table_whose_jobs_all_finished(
    database_url: str,
) -> None:
    """--drained-stats (the default): before the burst, the jobs table's statistics
    say every job finished and none runs, and none of those jobs is left."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(bench_queries.get("limits_busy_drained"), {
            "task": "t", "count": 400, "keys": 4, "prefix": "k", "seconds": 0.0})
        conn.execute(bench_queries.get("limits_busy_analyze"))
        conn.execute(bench_queries.get("limits_busy_prune"))
        row = conn.execute(
            "SELECT most_common_vals::text FROM pg_stats WHERE schemaname = 'akadze'"
            " AND tablename = 'jobs' AND attname = 'state'").fetchone()
        assert row == ("{succeeded}",)
        assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)
