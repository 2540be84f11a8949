"""Smoke test of ``akadze bench enqueue`` at tiny sizes (speed is for the benchmark)."""

from __future__ import annotations

from pathlib import Path

from akadze.cli import main


def test_bench_enqueue_runs_and_writes_a_report(server_url: str, tmp_path: Path) -> None:
    report = tmp_path / "enqueue.md"
    code = main([
        "bench", "enqueue", "--jobs", "300", "--repeat", "2", "--single", "5",
        "--report", str(report), "--database-url", server_url,
    ])
    assert code == 0
    text = report.read_text()
    for expected in ("jobs/s", "PostgreSQL", "cores", "RAM", "Python", "index maintenance",
                     "enqueue_sync + commit", "await enqueue"):
        assert expected in text
